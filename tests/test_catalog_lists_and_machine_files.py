"""Machine files and recipe `machines:` entries that start from a catalog machine and give a `gpus`
block; the catalog list lines; the one owner of the routed-expert byte figure.

Expected figures are read from the catalog's own YAML text (recipegen/catalog/machines.yaml) or
computed here from the model's shape, not through the code under test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_support import invoke

from recipegen.catalog import catalog_entry, catalog_names
from recipegen.common.errors import InputError
from recipegen.load.machine_file import load_machine_file
from recipegen.load.recipe import load_recipe
from recipegen.schema import Model

GiB = 2**30
CATALOG = Path(__file__).resolve().parent.parent / "recipegen" / "catalog" / "machines.yaml"


def _raw_h200_pcie() -> dict:
    return yaml.safe_load(CATALOG.read_text(encoding="utf-8"))["h200-pcie"]


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------ the same GPU, in another letter case

@pytest.mark.parametrize("kind", ["h200", "H200", " h200 "])
def test_a_machine_file_naming_the_catalog_gpu_in_any_case_keeps_the_catalog_gpu_figures(
        tmp_path: Path, kind: str) -> None:
    raw = _raw_h200_pcie()["gpus"]
    assert raw["kind"] == "H200" and raw["compute_capability"]["value"] == "9.0"
    assert raw["hbm_bandwidth"]["value"] == "4358 GB/s" and raw["count"]["value"] == 1
    path = _write(tmp_path / "box.yaml", f"catalog: h200-pcie\ngpus:\n  kind: '{kind}'\n  hbm: 100 GiB\n")
    _, machine = load_machine_file(path)
    gpus = machine.gpus
    assert gpus.hbm == 100 * GiB                     # the file's figure
    assert gpus.count == 1 and gpus.compute_capability == "9.0"   # the catalog's, kept
    assert gpus.hbm_bandwidth == 4358 * 10**9
    assert gpus.kind == "H200"                       # the catalog's spelling


def test_a_recipe_machines_entry_naming_the_catalog_gpu_in_lower_case_keeps_its_figures(tmp_path: Path) -> None:
    """The recipe's `machines:` goes through the same resolver as a machine file."""
    result = invoke("new", "qwen3-30b-a3b", "--machine", "h200-pcie", "-o", str(tmp_path / "r.yaml"))
    assert result.code == 0, result.output
    recipe = yaml.safe_load((tmp_path / "r.yaml").read_text())
    [key] = recipe["machines"]
    recipe["machines"][key] = {"catalog": "h200-pcie", "gpus": {"kind": "h200", "count": 2}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    gpus = load_recipe(tmp_path / "r.yaml", read_maps=False).recipe.machines[key].gpus
    assert gpus.count == 2
    assert gpus.compute_capability == "9.0" and gpus.hbm_bandwidth == 4358 * 10**9
    assert gpus.hbm == 143771 * 2**20                # machines.yaml: 143771 MiB


# ------------------------------------------------------------------ another GPU

@pytest.mark.parametrize("kind", ["H100", "NVIDIA H200"])
def test_another_gpu_kind_replaces_the_catalog_block_and_the_error_says_how_to_fix_it(
        tmp_path: Path, kind: str) -> None:
    path = _write(tmp_path / "k.yaml", f"catalog: h200-pcie\ngpus:\n  kind: {kind}\n  hbm: 80 GiB\n")
    with pytest.raises(InputError) as caught:
        load_machine_file(path)
    text = str(caught.value)
    assert "'gpus.count': missing required field" in text, text
    assert (f"to fix it: `gpus.kind` '{kind}' is not the GPU of catalog machine h200-pcie ('H200')"
            in text), text
    assert "leave `kind` out (or write 'H200')" in text and "give the whole block" in text, text


def test_the_cli_prints_the_hint_for_another_gpu_kind(tmp_path: Path) -> None:
    path = _write(tmp_path / "k.yaml", "catalog: h200-pcie\ngpus:\n  kind: H100\n")
    result = invoke("new", "qwen3-30b-a3b", "--machine", str(path), "-o", str(tmp_path / "r.yaml"))
    assert result.code == 2, result.output
    assert "replaces the catalog's whole `gpus` block" in result.output, result.output
    assert not (tmp_path / "r.yaml").exists()


def test_a_whole_gpus_block_of_another_kind_loads_without_the_catalog_gpu_figures(tmp_path: Path) -> None:
    path = _write(tmp_path / "w.yaml", "catalog: h200-pcie\ngpus:\n  kind: H100\n  count: 2\n  hbm: 80 GiB\n"
                  "  hbm_bandwidth: 3350 GB/s\n")
    _, machine = load_machine_file(path)
    assert machine.gpus.kind == "H100" and machine.gpus.count == 2 and machine.gpus.hbm == 80 * GiB
    assert machine.gpus.hbm_bandwidth == 3350 * 10**9
    assert machine.gpus.compute_capability is None   # the catalog's 9.0 went with its block


def test_a_catalog_file_with_another_mistake_gets_no_gpu_hint(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.yaml", "catalog: h200-pcie\ngpus:\n  kind: H200\n  hbmm: 100 GiB\n")
    with pytest.raises(InputError) as caught:
        load_machine_file(path)
    assert "hbmm" in str(caught.value) and "to fix it: `gpus.kind`" not in str(caught.value)


# ------------------------------------------------------------------ the list commands

def _list(group: str, *extra: str) -> str:
    result = invoke(group, "list", *extra)
    assert result.code == 0, result.output
    return result.stdout


def test_machine_list_says_gpu_memory_not_hbm_for_every_card() -> None:
    """An RTX 4090 has GDDR6X: the line says GPU memory. machines.yaml: 24564 MiB = 23.99 GiB."""
    rows = _list("machine").splitlines()
    assert not any("HBM" in row.split(" — ")[0] for row in rows), rows   # descriptions may name it
    [rtx] = [row for row in rows if row.startswith("rtx-4090 ")]
    assert f"1 × RTX 4090, {24564 / 1024:.2f} GiB GPU memory each (CUDA allocates " in rtx, rtx
    assert "GiB), host 64.00 GiB (assumed)" in rtx, rtx


@pytest.mark.parametrize(("group", "kind"), [("model", "models"), ("machine", "machines")])
def test_both_list_commands_print_aligned_columns_and_the_same_json_shape(group: str, kind: str) -> None:
    rows = _list(group).splitlines()
    width = max(len(name) for name in catalog_names(kind))
    assert [row[:width].rstrip() for row in rows] == catalog_names(kind)
    assert all(row[width:width + 2] == "  " and row[width + 2] != " " for row in rows), rows
    items = json.loads(_list(group, "--json"))
    assert [set(item) for item in items] == [{"id", "summary"}] * len(items)
    assert [row[width + 2:] for row in rows] == [item["summary"] for item in items]


# ------------------------------------------------------------------ routed-expert bytes

def test_routed_expert_bytes_is_every_moe_layer_times_every_expert() -> None:
    """Qwen3-30B-A3B: 48 MoE layers × 128 experts × (3 × 768 × 2048 bf16 weights)."""
    m = Model.model_validate(catalog_entry("models", "qwen3-30b-a3b"))
    assert m.routed_expert_bytes == 48 * 128 * 3 * 768 * 2048 * 2 == 54 * GiB
    line = next(row for row in _list("model").splitlines() if row.startswith("qwen3-30b-a3b "))
    assert "routed experts 54.00 GiB" in line, line
