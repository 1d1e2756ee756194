"""`model.checkpoint` written as a relative path that has a repo id's shape (`checkpoints/x`).

The schema reads `org/name` as a Hugging Face repo id (recipegen.schema.patterns), which the
rendering mounts from the hub cache. A recipe loaded from a file refuses such a text at its line
when a file or folder of that relative path exists beside the recipe or in its project (not the
current folder: a recipe means the same wherever a command runs); otherwise `check recipe` and `render` say, in one note line, that it is read as
a repo id.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_support import invoke

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "recipes" / "gpt-oss-120b-l40s.yaml"
NAME = "gpt-oss-local"
HUB_NOTE = "is read as a Hugging Face repo id (mounted from the hub cache"


def _recipe(folder: Path, checkpoint: str | None, *, name: str = NAME) -> Path:
    """The committed gpt-oss-120b recipe under `folder/recipes/`, renamed, its model's checkpoint
    written in the recipe (`{catalog: gpt-oss-120b, checkpoint: …}`) or left to the catalog."""
    text = SOURCE.read_text().replace("name: gpt-oss-120b-l40s", f"name: {name}")
    if checkpoint is not None:
        text = text.replace("model: gpt-oss-120b\n",
                            f"model:\n  catalog: gpt-oss-120b\n  checkpoint: {checkpoint}\n")
    path = folder / "recipes" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _checkpoint_line(path: Path) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1)
                if line.strip().startswith("checkpoint:"))


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_folder_in_the_project_is_refused_at_the_checkpoints_line(here: Path) -> None:
    path = _recipe(here, "checkpoints/gpt-oss-120b")
    (here / "checkpoints" / "gpt-oss-120b").mkdir(parents=True)
    for command in (("check", "recipe"), ("render",)):
        result = invoke(*command, NAME)
        assert result.code == 2, result.output
        line = _checkpoint_line(path)
        assert result.stderr.startswith(f"error: recipes/{NAME}.yaml:{line}: field 'model.checkpoint': "
                                         "'checkpoints/gpt-oss-120b' looks like a local path: it exists in the "
                                         "project folder"), result.stderr
        absolute = os.path.abspath(here / "checkpoints" / "gpt-oss-120b")
        assert f"write its absolute path, `checkpoint: {absolute}`" in result.stderr
        assert "hub cache" in result.stderr
        assert "Traceback" not in result.output
    assert not (here / "compose").exists()                    # render wrote nothing


def test_beside_the_recipe_but_not_in_the_current_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    path = _recipe(project, "models/gpt-oss-120b")
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert invoke("check", "recipe", str(path)).code == 0      # nothing of that name anywhere: a repo id
    (project / "recipes" / "models" / "gpt-oss-120b").mkdir(parents=True)
    result = invoke("check", "recipe", str(path))
    assert result.code == 2 and "it exists in the recipe's folder" in result.stderr, result.stderr
    (project / "recipes" / "models" / "gpt-oss-120b").rmdir()
    (elsewhere / "models").mkdir()
    (elsewhere / "models" / "gpt-oss-120b").write_text("a file counts as well")
    # where the command runs does not change what the recipe means (a hub download into ./org/name)
    result = invoke("check", "recipe", str(path))
    assert result.code == 0, result.stderr
    assert "is read as a Hugging Face repo id" in result.stdout


def test_a_model_files_checkpoint_is_refused_at_the_model_files_line(project: Path) -> None:
    model_file = project / "recipes" / "models" / "qwen3.5-35b-a3b.yaml"
    text = model_file.read_text()
    assert "checkpoint: Qwen/Qwen3.5-35B-A3B" in text
    model_file.write_text(text.replace("checkpoint: Qwen/Qwen3.5-35B-A3B", "checkpoint: weights/qwen3.5"))
    (project / "weights" / "qwen3.5").mkdir(parents=True)
    result = invoke("check", "recipe", "qwen3.5-35b-a3b-rtx5090")
    assert result.code == 2, result.output
    line = _checkpoint_line(model_file)
    assert result.stderr.startswith(f"error: recipes/models/qwen3.5-35b-a3b.yaml:{line}: field 'checkpoint': "
                                     "'weights/qwen3.5' looks like a local path"), result.stderr


def test_a_repo_id_gets_one_note_line_in_check_and_render(here: Path) -> None:
    _recipe(here, "checkpoints/gpt-oss-120b")                   # no such folder: a repo id
    result = invoke("check", "recipe", NAME)
    assert result.code == 0, result.output
    notes = [line for line in result.stdout.splitlines() if HUB_NOTE in line]
    assert notes == ["  note: model.checkpoint checkpoints/gpt-oss-120b is read as a Hugging Face repo id "
                     "(mounted from the hub cache, ${HF_HUB_CACHE:-~/.cache/huggingface/hub}, with "
                     "HF_HUB_OFFLINE=1: download it there first); a local checkpoint needs an absolute path"]
    result = invoke("render", NAME)
    assert result.code == 0, result.output
    assert sum(HUB_NOTE in line for line in result.stdout.splitlines()) == 1, result.stdout
    assert "model.checkpoint checkpoints/gpt-oss-120b" in result.stdout


def test_the_catalogs_repo_id_is_noted_not_checked(here: Path) -> None:
    _recipe(here, None)                                          # checkpoint from the catalog
    (here / "openai" / "gpt-oss-120b").mkdir(parents=True)       # a folder of that name is no reason
    result = invoke("check", "recipe", NAME)
    assert result.code == 0, result.output
    assert "  note: model.checkpoint openai/gpt-oss-120b " + HUB_NOTE in result.stdout


def test_an_absolute_checkpoint_gets_no_note(here: Path) -> None:
    _recipe(here, "/srv/models/gpt-oss-120b")
    for command in (("check", "recipe"), ("render",)):
        result = invoke(*command, NAME)
        assert result.code == 0, result.output
        assert "note: model.checkpoint" not in result.output
