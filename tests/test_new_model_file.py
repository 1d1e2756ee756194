"""`recipegen new MODEL` with MODEL a model file (what `recipegen model import` writes and a recipe
reads as `model: {file: models/<name>.yaml}`): read by the recipes' own loader, referenced by the
drafted recipe where it is (relative to the recipe), copied beside the recipe only where the recipe
loader cannot reach it. Before, the file went to the config.json importer: `config.json is not valid
JSON: unexpected character '#'`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from cli_support import invoke

REPO = Path(__file__).resolve().parent.parent
NEMOTRON = REPO / "recipes" / "models" / "nemotron-3-nano-30b-a3b.yaml"
SCOUT = REPO / "recipes" / "models" / "llama-4-scout-17b-16e-instruct.yaml"
SCOUT_CONFIG = REPO / "tests" / "fixtures" / "hf_configs" / "llama-4-scout-17b-16e-instruct"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _project_model(here: Path, source: Path = NEMOTRON, folder: str = "recipes/models") -> Path:
    target = here / folder / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target


def test_a_model_file_in_the_project_is_referenced_where_it_is(here: Path) -> None:
    model = _project_model(here)
    before = model.read_bytes()
    result = invoke("new", "recipes/models/nemotron-3-nano-30b-a3b.yaml", "--machine", "h200-pcie")
    assert result.code == 0, result.output
    assert "config.json" not in result.output
    assert result.output.startswith("new recipe recipes/nemotron-3-nano-30b-a3b-h200-pcie.yaml: model file "
                                    "recipes/models/nemotron-3-nano-30b-a3b.yaml on catalog machine h200-pcie")
    assert "model: {file: models/nemotron-3-nano-30b-a3b.yaml}" in result.output
    recipe = here / "recipes" / "nemotron-3-nano-30b-a3b-h200-pcie.yaml"
    assert yaml.safe_load(recipe.read_text())["model"] == {"file": "models/nemotron-3-nano-30b-a3b.yaml"}
    assert model.read_bytes() == before                      # read, not rewritten
    assert sorted(p.name for p in (here / "recipes" / "models").iterdir()) == [model.name]
    assert "wrote recipes/models" not in result.output     # nothing written but the recipe (and its maps)
    # the written recipe is a recipe like any other: it loads, its budgets hold, it renders
    for args in (["check", "recipe", str(recipe)], ["check", "budgets", str(recipe)], ["render", str(recipe)]):
        checked = invoke(*args)
        assert checked.code == 0, (args, checked.output)
    assert (here / "compose" / recipe.stem / "compose.yaml").is_file()


def test_the_qa_command_fits_like_the_checkpoint_it_was_imported_from(here: Path) -> None:
    """The QA pass's command: Llama-4-Scout's model file on one H200 PCIe. Nothing fits at its full
    10M context there (docs/fit.md), and the model file gives the same refusal and suggestion as
    the config.json it was imported from — not a JSON error."""
    _project_model(here, SCOUT)
    by_file = invoke("new", "recipes/models/llama-4-scout-17b-16e-instruct.yaml", "--machine", "h200-pcie",
                     "-o", "l4.yaml", "--json")
    assert by_file.code == 1, by_file.output
    by_config = invoke("new", str(SCOUT_CONFIG), "--machine", "h200-pcie", "-o", "l4c.yaml", "--json")
    assert by_config.code == 1, by_config.output
    a, b = json.loads(by_file.stdout), json.loads(by_config.stdout)
    assert a["suggestion"] == b["suggestion"] and "max_model_len 2,223,104" in a["suggestion"]
    assert a["written"] is False and not (here / "l4.yaml").exists()


def test_a_model_file_the_recipe_cannot_reach_is_copied_beside_it(here: Path) -> None:
    """A recipe kept in `elsewhere/sub/` belongs to the project `elsewhere/`; the repository's model
    file is outside it, so the recipe gets a copy in `models/` beside it, as a checkpoint's import."""
    result = invoke("new", str(NEMOTRON), "--machine", "h200-pcie", "-o", "elsewhere/sub/n.yaml", "--json")
    assert result.code == 0, result.output
    out = json.loads(result.stdout)
    copy = here / "elsewhere" / "sub" / "models" / NEMOTRON.name
    assert out["model_file"] == str(Path("elsewhere/sub/models") / NEMOTRON.name)
    assert out["model_reference"] == {"file": f"models/{NEMOTRON.name}"}
    assert copy.read_bytes() == NEMOTRON.read_bytes()
    assert any("outside the recipe's project" in note for note in out["model_notes"]), out["model_notes"]
    text = invoke("check", "recipe", "elsewhere/sub/n.yaml")
    assert text.code == 0, text.output


def test_the_copy_note_is_printed(here: Path) -> None:
    result = invoke("new", str(NEMOTRON), "--machine", "h200-pcie", "-o", "elsewhere/sub/n.yaml")
    assert result.code == 0, result.output
    assert "is outside the recipe's project" in result.output and \
        f"copied to models/{NEMOTRON.stem}.yaml beside the recipe" in result.output
    assert f"wrote elsewhere/sub/models/{NEMOTRON.name} (the model file the recipe reads)" in result.output


def test_a_model_file_at_the_project_root_is_referenced_up_a_folder(here: Path) -> None:
    _project_model(here, folder="models")
    result = invoke("new", f"models/{NEMOTRON.name}", "--machine", "h200-pcie", "--name", "n")
    assert result.code == 0, result.output
    assert yaml.safe_load((here / "recipes" / "n.yaml").read_text())["model"] == {"file": f"../models/{NEMOTRON.name}"}
    assert not (here / "recipes" / "models").exists()
    assert invoke("check", "recipe", "recipes/n.yaml").code == 0


def test_a_broken_model_file_is_reported_at_its_own_line_and_nothing_is_written(here: Path) -> None:
    model = _project_model(here)
    text = model.read_text()
    model.write_text(text.replace("routed_experts:\n  value: 128", "routed_experts:\n  value: many"))
    assert "value: many" in model.read_text()
    result = invoke("new", "recipes/models/nemotron-3-nano-30b-a3b.yaml", "--machine", "h200-pcie")
    assert result.code == 2, result.output
    assert "recipes/models/nemotron-3-nano-30b-a3b.yaml:" in result.stderr and "config.json" not in result.stderr
    assert "routed_experts" in result.stderr
    assert sorted(p.name for p in (here / "recipes").iterdir()) == ["models"]


def test_a_config_json_is_still_imported(here: Path) -> None:
    result = invoke("new", str(SCOUT_CONFIG / "config.json"), "--machine", "h200-sxm-x8", "-o", "s.yaml", "--json")
    assert result.code == 0, result.output
    assert json.loads(result.stdout)["model_file"] == str(Path("models") / f"{SCOUT.stem}.yaml")
