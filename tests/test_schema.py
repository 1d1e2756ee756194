"""The recipe language: models, catalogs with sources, reference recipes, schema export, write-back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.catalog import catalog_entry, catalog_names, figures_without_source
from recipegen.common.errors import InputError
from recipegen.common.units import GiB, MiB
from recipegen.load.document import parse_yaml, to_plain
from recipegen.load.recipe import load_recipe, set_active_class
from recipegen.schema import Machine, Model, Speculative


def test_every_catalog_figure_has_a_source() -> None:
    assert figures_without_source("models") == []
    assert figures_without_source("machines") == []


@pytest.mark.parametrize("kind, cls", [("models", Model), ("machines", Machine)])
def test_catalog_entries_validate(kind: str, cls: type) -> None:
    for name in catalog_names(kind):
        entry = cls.model_validate(catalog_entry(kind, name))
        assert entry.name == name
        assert entry.sources, "sources are carried into the model"


def test_dsv41_expert_bytes_derived_from_logical_shapes() -> None:
    model = Model.model_validate(catalog_entry("models", "dsv41-flash-mxfp4"))
    values = 4608 * 5120 + 5120 * 2304
    assert model.expert_bytes == values // 2 + values // 32 == 18_800_640
    assert round(model.expert_bytes / MiB, 2) == 17.93
    assert model.moe_layers == list(range(40)) and model.decoder_layers == 40
    assert model.host_table_bytes == pytest.approx(189.2 * GiB, abs=1)
    assert GiB / model.kv_token_bytes == pytest.approx(518_000)
    assert "vllm/models/deepseek_v41" in model.sources["decoder_layers"]


def test_machine_catalog_figures() -> None:
    station = Machine.model_validate(catalog_entry("machines", "gb300-station"))
    assert station.gpus.hbm == round(250.7 * GiB)
    assert station.host_memory == 494 * GiB
    assert station.pinned_read_bandwidth == 340e9
    assert station.nvme is not None and station.nvme.read_bandwidth_max == 12e9
    h200 = Machine.model_validate(catalog_entry("machines", "h200-pcie"))
    assert h200.gpus.hbm == 143771 * MiB and h200.pinned_read_bandwidth == 51e9
    assert h200.host_memory == 131981020 * 1024


@pytest.mark.parametrize("name", ["dsv41-flash-gb300", "dsv41-flash-gb300-off60"])
def test_reference_recipes_load(name: str, repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo_root)
    loaded = load_recipe(name)
    lane = loaded.recipe.lane("agent")
    assert loaded.name == name and loaded.path == repo_root / "recipes" / f"{name}.yaml"
    assert lane.gpu_memory_utilization == 0.97
    assert lane.max_model_len == 2**20
    assert lane.speculative is not None and lane.speculative.method == "dspark"
    assert lane.speculative.k == 5 and lane.speculative.k_at(1) == 5
    if name == "dsv41-flash-gb300":
        assert lane.offload.hot_experts_per_layer == 295
        assert set(lane.classes) == {"agent", "prose", "math"} and lane.active_class == "agent"
        assert {cls for (_, cls) in loaded.rowmaps} == {"agent", "prose", "math"}
        for rowmap in loaded.rowmaps.values():
            assert rowmap.hot_counts() == [295] * 40
    else:
        assert lane.offload.placement == "positional" and lane.offload.load_cpu_offload == 60 * GiB


def test_check_recipe_cli_reports_valid(repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo_root)
    result = invoke("check", "recipe")
    assert result.code == 0, result.output
    assert "ok  recipes/dsv41-flash-gb300.yaml" in result.stdout
    assert "ok  recipes/dsv41-flash-gb300-off60.yaml" in result.stdout


def test_speculative_schedule_follows_vllm() -> None:
    spec = Speculative.model_validate({"method": "dspark", "schedule": [[1, 1, 5], [2, 4, 3], [9, 16, 1]]})
    assert spec.k == 5  # the maximum sizes buffers
    # vLLM fills gaps and the tail with the previous range's k.
    assert [spec.k_at(b) for b in (1, 2, 4, 5, 8, 9, 64)] == [5, 3, 3, 3, 3, 1, 1]
    assert Speculative.model_validate({"method": "mtp", "k": 3}).k_at(100) == 3


def test_catalog_override_keeps_other_sources(tmp_path: Path) -> None:
    src = Path(__file__).parent.parent / "recipes" / "dsv41-flash-gb300-off60.yaml"
    text = src.read_text().replace("    address: 127.0.0.1\n", "    address: 10.1.2.3\n    host_memory: 480 GiB\n")
    (tmp_path / "dsv41-flash-gb300-off60.yaml").write_text(text)
    machine = load_recipe(tmp_path / "dsv41-flash-gb300-off60.yaml").recipe.machines["station"]
    assert machine.address == "10.1.2.3" and machine.host_memory == 480 * GiB
    assert "host_memory" not in machine.sources  # an overridden figure no longer cites the seed
    assert "gpus.hbm" in machine.sources


def test_inline_sourced_figures(tmp_path: Path) -> None:
    base = (Path(__file__).parent / "bad_recipes" / "valid" / "tiny.yaml").read_text()
    text = base.replace("host_memory: 64 GiB", 'host_memory: {value: 64 GiB, source: "measured on box"}')
    shutil.copytree(Path(__file__).parent / "bad_recipes" / "maps", tmp_path / "maps")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "tiny.yaml").write_text(text)
    machine = load_recipe(tmp_path / "sub" / "tiny.yaml").recipe.machines["box"]
    assert machine.host_memory == 64 * GiB and machine.sources["host_memory"] == "measured on box"


# ------------------------------------------------------------------ write-back

@pytest.fixture()
def recipe_copy(tmp_path: Path, repo_root: Path) -> Path:
    for folder in ("maps", "profiles"):
        shutil.copytree(repo_root / "recipes" / folder, tmp_path / folder)  # links out are refused
    target = tmp_path / "dsv41-flash-gb300.yaml"
    shutil.copy(repo_root / "recipes" / "dsv41-flash-gb300.yaml", target)
    return target


def test_set_active_class_changes_one_line(recipe_copy: Path) -> None:
    before = recipe_copy.read_text().splitlines()
    assert set_active_class(recipe_copy, "agent", "prose") is True
    after = recipe_copy.read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(before) == len(after) and changed == [("    active_class: agent", "    active_class: prose")]
    assert load_recipe(recipe_copy).recipe.lane("agent").active_class == "prose"
    assert set_active_class(recipe_copy, "agent", "prose") is False  # already active: untouched


def test_set_active_class_keeps_trailing_comment(recipe_copy: Path) -> None:
    text = recipe_copy.read_text().replace("active_class: agent", "active_class: 'agent'   # swapped by ops")
    recipe_copy.write_text(text)
    set_active_class(recipe_copy, "agent", "math")
    assert "    active_class: math   # swapped by ops\n" in recipe_copy.read_text()


def test_set_active_class_adds_missing_key(recipe_copy: Path) -> None:
    text = recipe_copy.read_text()
    recipe_copy.write_text(text.replace("    active_class: agent\n", ""))
    with pytest.raises(InputError, match="active_class"):
        load_recipe(recipe_copy)  # classes without an active one are invalid …
    set_active_class(recipe_copy, "agent", "math")  # … and the write-back repairs it
    new = recipe_copy.read_text()
    assert "# DeepSeek-V4.1-Flash (MXFP4) on one DGX Station GB300" in new  # comments kept
    assert "# A constant k: k=5 at one stream is the measured figure" in new
    assert load_recipe(recipe_copy).recipe.lane("agent").active_class == "math"


@pytest.mark.parametrize("lane, cls, message", [
    ("agent", "code", "class 'code' is not declared"),
    ("chat", "prose", "no lane 'chat'"),
])
def test_set_active_class_refuses(recipe_copy: Path, lane: str, cls: str, message: str) -> None:
    before = recipe_copy.read_bytes()
    with pytest.raises(InputError, match=message):
        set_active_class(recipe_copy, lane, cls)
    assert recipe_copy.read_bytes() == before
    assert sorted(p.name for p in recipe_copy.parent.iterdir()) == ["dsv41-flash-gb300.yaml", "maps", "profiles"]


# ------------------------------------------------------------------ schema export

def test_json_schema_accepts_shipped_recipes_and_rejects_unknown_fields(repo_root: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    result = invoke("schema")
    assert result.code == 0
    schema = json.loads(result.stdout)
    validator = jsonschema.Draft202012Validator(schema)
    for path in sorted((repo_root / "recipes").glob("*.yaml")):
        data = to_plain(parse_yaml(path.read_text(), str(path)))
        assert list(validator.iter_errors(data)) == [], path
    data["lanes"][0]["gpu_mem_util"] = 0.9
    assert any("gpu_mem_util" in e.message for e in validator.iter_errors(data))


def test_markdown_reference_is_current(repo_root: Path) -> None:
    doc = repo_root / "docs" / "recipe-reference.md"
    result = invoke("schema", "--markdown", "-o", str(doc), "--check")
    assert result.code == 0, result.output + result.stderr
    text = doc.read_text()
    for heading in ("## Recipe", "## Model", "## Machine", "## Lane", "## Offload", "## Speculative"):
        assert heading in text
    assert "| `hot_experts_per_layer` |" in text
