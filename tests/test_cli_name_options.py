"""`--name` of `new`, `model import` and `machine detect` is checked as the option, before anything
is read or looked up: a bad name is refused naming `--name` (not a field of config.json or of the
drafted recipe), with the file-name pattern's own hint; an empty one is refused, not read as "the
default"; a recipe name longer than the schema allows is refused with the limit."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.schema.patterns import FILE_NAME, NAME_MAX_LENGTH

CONFIG = Path(__file__).parent / "fixtures" / "hf_configs" / "deepseek-v3"

COMMANDS = {
    "new": ("new", "qwen3-30b-a3b", "--machine", "h200-pcie"),
    "model import": ("model", "import", str(CONFIG), "-o", "-"),
    # refused before NVML is read: this machine has no GPU, so a reading would fail otherwise
    "machine detect": ("machine", "detect"),
}
WHAT = {"new": "recipe", "model import": "model", "machine detect": "machine"}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("bad", ["Bad Name", "../escape", "a/b", "-dash-first", "name\n"])
def test_a_name_that_is_no_file_name_is_refused_as_the_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               command: str, bad: str) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(*COMMANDS[command], "--name", bad)
    assert result.code == 2, result.output
    assert "Invalid value for '--name'" in result.stderr
    assert f"is not a {WHAT[command]} name: use {FILE_NAME.hint}" in result.stderr
    assert "config.json" not in result.stderr and "field 'name'" not in result.stderr
    assert list(tmp_path.iterdir()) == []   # nothing written


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_empty_name_is_refused_not_taken_as_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           command: str) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(*COMMANDS[command], "--name", "")
    assert result.code == 2, result.output
    assert f"an empty {WHAT[command]} name; leave the option out for the default" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_recipe_name_over_the_schema_limit_is_refused_and_one_at_it_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    over = invoke(*COMMANDS["new"], "--name", "r" * (NAME_MAX_LENGTH + 1))
    assert over.code == 2, over.output
    assert f"is not a recipe name: at most {NAME_MAX_LENGTH} characters" in over.stderr
    assert not (tmp_path / "recipes").exists()
    at = invoke(*COMMANDS["new"], "--name", "r" * NAME_MAX_LENGTH)
    assert at.code == 0, at.output
    assert (tmp_path / "recipes" / f"{'r' * NAME_MAX_LENGTH}.yaml").is_file()


def test_a_good_model_name_is_the_imported_files_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke("model", "import", str(CONFIG), "--name", "my-v3.fp8_a")
    assert result.code == 0, result.output
    written = tmp_path / "recipes" / "models" / "my-v3.fp8_a.yaml"
    assert written.is_file() and "name: my-v3.fp8_a" in written.read_text()
