"""A duplicate key names the line of the duplicate, the line where the same key was first written
(not the line where its mapping starts) and the full field path. Line numbers below are counted by
hand in the texts written here (tests/bad_recipes/valid/tiny.yaml for the recipes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.common.errors import InputError
from recipegen.load.document import parse_yaml
from recipegen.load.recipe import load_recipe

TINY = Path(__file__).parent / "bad_recipes" / "valid" / "tiny.yaml"


def _tiny_lines() -> list[str]:
    lines = TINY.read_text().splitlines()
    # the lines the cases below change, as the base has them
    assert lines[15] == "    gpus: {kind: test-gpu, count: 1, hbm: 16 GiB, hbm_bandwidth: 1 TB/s}"  # line 16
    assert lines[16] == "    host_memory: 64 GiB"                                                   # line 17
    assert lines[19] == "  - name: main"                                                            # line 20
    assert lines[22] == "    port: 8000"                                                            # line 23
    assert lines[26] == "    concurrency: {min: 1, max: 4}"                                         # line 27
    return lines


def recipe_error(tmp_path: Path, lines: list[str]) -> InputError:
    """The error loading a recipe of these lines (also used by tests/test_machine_file_load.py)."""
    path = tmp_path / "dup.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as info:
        load_recipe(path, read_maps=False)
    return info.value


def test_a_lane_key_twice_names_its_first_line_and_full_path(tmp_path: Path) -> None:
    lines = _tiny_lines()
    lines.insert(23, "    port: 8001")  # line 24; the first port is line 23, the lane starts on 20
    err = recipe_error(tmp_path, lines)
    assert (err.line, err.field) == (24, "lanes[0].port")
    assert str(err).endswith("dup.yaml:24: field 'lanes[0].port': duplicate key 'port' (first defined on line 23)")


def test_a_nested_key_twice(tmp_path: Path) -> None:
    lines = _tiny_lines()
    # lines 27-30; the mapping starts with `min:` on line 28, the first `max:` is line 29
    lines[26:27] = ["    concurrency:", "      min: 1", "      max: 4", "      max: 8"]
    err = recipe_error(tmp_path, lines)
    assert (err.line, err.field) == (30, "lanes[0].concurrency.max")
    assert "duplicate key 'max' (first defined on line 29)" in str(err)


def test_a_machine_key_twice(tmp_path: Path) -> None:
    lines = _tiny_lines()
    lines.insert(18, "    host_memory: 128 GiB")  # line 19; the first is line 17, the machine's `name:` 15
    err = recipe_error(tmp_path, lines)
    assert (err.line, err.field) == (19, "machines.box.host_memory")
    assert "(first defined on line 17)" in str(err)


def test_a_key_twice_in_one_flow_mapping(tmp_path: Path) -> None:
    lines = _tiny_lines()
    lines[15] = "    gpus: {kind: test-gpu, count: 1, hbm: 16 GiB, hbm_bandwidth: 1 TB/s, count: 2}"
    err = recipe_error(tmp_path, lines)
    assert (err.line, err.field) == (16, "machines.box.gpus.count")
    assert "(first defined on line 16)" in str(err)


def test_the_cli_prints_it_without_a_traceback(tmp_path: Path) -> None:
    lines = _tiny_lines()
    lines.insert(23, "    port: 8001")
    path = tmp_path / "dup.yaml"
    path.write_text("\n".join(lines) + "\n")
    result = invoke("check", "recipe", str(path))
    assert result.code == 2
    assert result.stderr.startswith("error: ") and "Traceback" not in result.output + result.stderr
    assert result.stderr.splitlines()[0].endswith(
        "dup.yaml:24: field 'lanes[0].port': duplicate key 'port' (first defined on line 23)")


@pytest.mark.parametrize(("text", "line", "field", "first"), [
    # a later list item: its mapping starts with `name:` on line 4
    ("lanes:\n  - name: a\n    port: 1\n  - name: b\n    port: 2\n    port: 3\n", 6, "lanes[1].port", 5),
    # top level
    ("version: 1\nname: a\nname: b\n", 3, "name", 2),
    # in an anchored mapping an alias repeats: the path is where the key is written
    ("defaults: &d\n  a: 1\n  b: 2\n  a: 3\nlanes:\n  - *d\n", 4, "defaults.a", 2),
    # two merge keys
    ("x:\n  <<: {a: 1}\n  <<: {b: 2}\n", 3, "x.<<", 2),
    # the same key spelt two ways (YAML reads both as the integer 1)
    ("ids:\n  1: a\n  0x1: b\n", 3, "ids.0x1", 2),
], ids=["second-lane", "top-level", "anchor", "merge-key", "same-integer"])
def test_duplicate_key_lines(text: str, line: int, field: str, first: int) -> None:
    with pytest.raises(InputError) as info:
        parse_yaml(text, "d.yaml")
    err = info.value
    assert (err.line, err.field) == (line, field), str(err)
    assert f"(first defined on line {first})" in str(err)
