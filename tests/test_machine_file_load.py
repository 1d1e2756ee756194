"""Machine files (`recipegen new MODEL --machine FILE`) read through the recipe loader's error path:
every problem names the file, the line and the field in the recipe's wording. Line numbers are
counted by hand in MACHINE below."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_yaml_duplicate_keys import TINY, recipe_error

from recipegen.catalog.detect import RecordedNvml, detect, to_yaml
from recipegen.common.errors import InputError
from recipegen.load.machine_file import load_machine_file
from recipegen.schema import Machine

MiB = 2**20
MACHINE = """\
# a hand-written machine file
name: box
description: one test GPU
gpus:
  kind: RTX 5090
  count:
    value: 1
    source: "one GPU"
  hbm:
    value: 32607 MiB
    source: "nvidia-smi"
  hbm_bandwidth:
    value: 1792 GB/s
    source: "spec"
host_memory:
  value: 64 GiB
  source: "assumed"
pinned_read_bandwidth:
  value: 64 GB/s
  source: "spec"
"""
NVML = Path(__file__).parent / "fixtures" / "nvml" / "dgx-h100-565.57.01.json"


def _lines() -> list[str]:
    lines = MACHINE.splitlines()
    assert lines[8] == "  hbm:" and lines[9] == "    value: 32607 MiB"    # lines 9 and 10
    assert lines[10] == '    source: "nvidia-smi"'                         # line 11
    return lines


def _error(tmp_path: Path, text: str) -> InputError:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_machine_file(path)
    assert info.value.file is not None and info.value.file.endswith("m.yaml")
    assert "Value error" not in str(info.value) and "Extra inputs" not in str(info.value)
    return info.value


def test_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(MACHINE)
    entry, machine = load_machine_file(path)
    assert machine.name == "box" and machine.gpus.hbm == 32607 * MiB
    assert machine.sources["gpus.hbm"] == "nvidia-smi"
    # the raw entry keeps its sourced figures: it is what the new recipe's `machines:` holds
    assert entry["gpus"]["hbm"] == {"value": "32607 MiB", "source": "nvidia-smi"}


def test_an_unknown_key(tmp_path: Path) -> None:
    lines = _lines()
    lines.insert(3, "colour: red")  # line 4
    err = _error(tmp_path, "\n".join(lines))
    assert (err.line, err.field) == (4, "colour")
    assert str(err).endswith("m.yaml:4: field 'colour': unknown field 'colour'")


def test_a_negative_size(tmp_path: Path) -> None:
    lines = _lines()
    lines[9] = "    value: -32607 MiB"
    err = _error(tmp_path, "\n".join(lines))
    assert (err.line, err.field) == (9, "gpus.hbm")
    assert str(err).endswith("m.yaml:9: field 'gpus.hbm': size must be positive, got '-32607 MiB'")


def test_a_figure_without_its_source(tmp_path: Path) -> None:
    lines = _lines()
    del lines[10]
    err = _error(tmp_path, "\n".join(lines))
    assert (err.line, err.field) == (9, "gpus.hbm")
    assert "'source' is missing: a figure written as a mapping takes exactly 'value' and 'source'" in str(err)
    assert "got dict" not in str(err)


def test_a_misspelt_source(tmp_path: Path) -> None:
    lines = _lines()
    lines[10] = '    sourse: "nvidia-smi"'
    err = _error(tmp_path, "\n".join(lines))
    assert (err.line, err.field) == (9, "gpus.hbm")
    assert "'source' is missing; unknown key 'sourse'" in str(err)


def test_a_stray_source_in_a_section_is_an_unknown_field(tmp_path: Path) -> None:
    lines = _lines()
    lines.insert(5, "  source: hand-written")  # line 6, inside gpus: not a figure
    err = _error(tmp_path, "\n".join(lines))
    assert (err.line, err.field) == (6, "gpus.source")
    assert "unknown field 'source'" in str(err)


def test_a_duplicate_key(tmp_path: Path) -> None:
    lines = _lines()
    lines.insert(14, "  kind: RTX 4090")  # line 15, in gpus; the first `kind:` is line 5
    err = _error(tmp_path, "\n".join(lines))
    assert (err.line, err.field) == (15, "gpus.kind")
    assert "duplicate key 'kind' (first defined on line 5)" in str(err)


def test_a_syntax_error_says_what_it_is(tmp_path: Path) -> None:
    err = _error(tmp_path, "name: box\ngpus: [1, 2\nhost_memory: 64 GiB\n")
    # the flow list opened on line 2 is still open where line 3's `:` comes
    assert err.line == 3
    assert "YAML syntax error: while parsing a flow sequence expected ',' or ']', but got ':'" in str(err)


def test_not_a_mapping(tmp_path: Path) -> None:
    err = _error(tmp_path, "- box\n- gpus\n")
    assert "a machine file is one YAML mapping" in str(err)


def test_a_detected_file_reads_back(tmp_path: Path) -> None:
    found = detect(RecordedNvml(json.loads(NVML.read_text())), "MemTotal:       2113389552 kB\n",
                   host="dgx", date="2024-11-14")
    path = tmp_path / "m.yaml"
    path.write_text(to_yaml(found.entry))
    entry, machine = load_machine_file(path)
    assert entry == found.entry
    assert machine == Machine.model_validate(found.entry)


def _tiny_error(tmp_path: Path, line: int, text: str) -> InputError:
    lines = TINY.read_text().splitlines()
    lines[line - 1] = text
    return recipe_error(tmp_path, lines)


def test_half_a_figure_inline_in_a_recipe(tmp_path: Path) -> None:
    err = _tiny_error(tmp_path, 17, "    host_memory: {value: 64 GiB}")
    assert (err.line, err.field) == (17, "machines.box.host_memory")
    assert "'source' is missing" in str(err)


def test_a_reserve_without_source_keeps_its_own_message(tmp_path: Path) -> None:
    # lanes are not lifted figures: a reserve's source is a field of its own
    err = _tiny_error(tmp_path, 31, "      hbm: {value: 2 GiB, basis: assumed}")
    assert (err.line, err.field) == (31, "lanes[0].reserves.hbm.source")
    assert "missing required field: where the figure comes from" in str(err)


@pytest.mark.parametrize("count, why", [("100000000000", "less than or equal to 64"), ("65", "less than or equal to 64"),
                                        ("0", "greater than or equal to 1")])
def test_a_gpu_count_no_host_holds(tmp_path: Path, count: str, why: str) -> None:
    # A count of 10^11 sized a list of 10^11 GPU ids in `compare` and `new` (MemoryError); a host
    # holds at most 64 GPUs. Line 6: the count's key, as the sizes above are named.
    text = MACHINE.replace("    value: 1\n", f"    value: {count}\n", 1)
    err = _error(tmp_path, text)
    assert (err.line, err.field) == (6, "gpus.count")
    assert str(err).endswith(f"m.yaml:6: field 'gpus.count': Input should be {why} (got {count})")


@pytest.mark.parametrize("extra", ["~: 2", "? [a]\n: 3", "1: 2"])
def test_a_key_that_is_not_a_string_is_refused_at_its_line(tmp_path: Path, extra: str) -> None:
    # MACHINE has 20 lines: the key is on line 21 (a null key and a `? [a]` key were named at line 2,
    # the document's start)
    assert len(MACHINE.splitlines()) == 20
    err = _error(tmp_path, MACHINE + extra + "\n")
    assert err.line == 21 and "Keys should be strings" in err.message
