"""Bad surroundings of a render and of the ops commands: each gets one `error:` line naming what
is wrong and what to do, never a traceback or a Python repr, and nothing half-written.

- a file where the output folder (or a folder inside it) goes;
- `verify` / `drift` before the recipe was ever rendered (Compose would fail on the folder);
- two recipes with the same `name` (both would render into compose/<name>/): a copy that keeps
  another recipe's name is refused for not being its file's name, and the recipe whose name it
  took for sharing it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.ops.compose import ComposeError, ComposeProject

REPO = Path(__file__).resolve().parent.parent
SINGLE = "qwen3-30b-a3b-rtx4090"          # one machine: compose/<recipe>/ is the output folder
MULTI = "dsv41-flash-gb300x2-pp2"         # two machines: compose/<recipe>/<machine>/
WITH_MAPS = "dsv41-flash-gb300"           # writes maps/agent/agent.rowmap


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_clean(out: str) -> None:
    assert out.startswith("error: "), out
    for leak in ("Traceback", "PosixPath", "Errno", "Not a directory"):
        assert leak not in out, out


# ------------------------------------------------------------------ a file where a folder goes


def test_output_folder_that_is_a_file_is_named_and_nothing_is_written(project: Path) -> None:
    (project / "compose").mkdir()
    (project / "compose" / SINGLE).write_text("hi\n")
    result = invoke("render", SINGLE)
    assert result.code == 2, result.output
    assert_clean(result.output)
    assert f"output folder compose/{SINGLE} exists and is not a folder" in result.output
    assert ".gitignore" not in result.output  # not a path below the file, which cannot exist
    assert (project / "compose" / SINGLE).read_text() == "hi\n"
    assert sorted(p.name for p in (project / "compose").iterdir()) == [SINGLE]  # no lock left


@pytest.mark.parametrize("flag", ["--check", "--diff"])
def test_check_and_diff_name_an_output_folder_that_is_a_file(project: Path, flag: str) -> None:
    (project / "compose").mkdir()
    (project / "compose" / SINGLE).write_text("hi\n")
    result = invoke("render", SINGLE, flag)
    assert result.code == 2, result.output                   # not 'stale' or 'new file': the folder cannot be compared
    assert f"output folder compose/{SINGLE} exists and is not a folder" in result.output


@pytest.mark.parametrize("blocked", [MULTI, f"{MULTI}/station-b"])
def test_multi_machine_output_folder_that_is_a_file_refuses_before_any_machine_is_written(
        project: Path, blocked: str) -> None:
    target = project / "compose" / blocked
    target.parent.mkdir(parents=True)
    target.write_text("hi\n")
    result = invoke("render", MULTI)
    assert result.code == 2, result.output
    assert_clean(result.output)
    assert f"output folder compose/{blocked} exists and is not a folder" in result.output
    # station-a sorts first: it must not have been written before station-b was refused
    assert sorted(p.relative_to(project / "compose").as_posix()
                  for p in (project / "compose").rglob("*")) == sorted(
        {MULTI, blocked} if blocked != MULTI else {MULTI})


def test_a_file_where_a_generated_subfolder_goes_keeps_the_previous_output(project: Path) -> None:
    result = invoke("render", WITH_MAPS)
    assert result.code == 0, result.output
    out_dir = project / "compose" / WITH_MAPS
    shutil.rmtree(out_dir / "maps")
    (out_dir / "maps").write_text("mine\n")
    before = snapshot(out_dir)
    result = invoke("render", WITH_MAPS)
    assert result.code == 2, result.output
    assert_clean(result.output)
    assert f"compose/{WITH_MAPS}/maps exists and is not a folder" in result.output
    assert snapshot(out_dir) == before  # no temp, no half-swapped file


# ------------------------------------------------------------------ ops before a render


@pytest.mark.parametrize("command", ["verify", "drift"])
def test_ops_before_any_render_say_to_render_first(project: Path, command: str) -> None:
    result = invoke(command, SINGLE, "chat")
    assert result.code == 2, result.output
    assert_clean(result.output)
    assert f"compose/{SINGLE}/ of recipe {SINGLE} has not been rendered yet" in result.output
    assert f"run `recipegen render {SINGLE}` first" in result.output
    assert not (project / "compose").exists()


def test_ops_on_an_output_folder_that_is_a_file_name_it(project: Path) -> None:
    (project / "compose").mkdir()
    (project / "compose" / SINGLE).write_text("hi\n")
    result = invoke("verify", SINGLE, "chat")
    assert result.code == 2, result.output
    assert_clean(result.output)
    assert f"output folder compose/{SINGLE} exists and is not a folder" in result.output


def test_compose_that_cannot_start_is_reported_without_a_python_repr(tmp_path: Path) -> None:
    missing = tmp_path / "compose" / "gone"
    project = ComposeProject(missing, [missing / "compose.yaml"], argv=[sys.executable])
    with pytest.raises(ComposeError) as caught:
        project.config()
    message = str(caught.value)
    assert "PosixPath" not in message and "[Errno" not in message, message
    assert message.endswith(f": No such file or directory: {missing}"), message

    tmp_path.joinpath("here").mkdir()
    no_binary = tmp_path / "no-such-compose"
    project = ComposeProject(tmp_path / "here", [], argv=[str(no_binary)])
    with pytest.raises(ComposeError) as caught:
        project.config()
    assert str(caught.value).endswith(f": No such file or directory: {no_binary}"), caught.value


# ------------------------------------------------------------------ two recipes, one name


def _name_line(path: Path) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), start=1)
                if line.startswith("name:"))


@pytest.fixture()
def duplicate(project: Path) -> Path:
    """recipes/dup.yaml: a copy of SINGLE on another port that keeps its `name`."""
    text = (project / "recipes" / f"{SINGLE}.yaml").read_text()
    assert "port: 8000" in text
    dup = project / "recipes" / "dup.yaml"
    dup.write_text(text.replace("port: 8000", "port: 8001"))
    return dup


def test_rendering_all_recipes_refuses_two_with_one_name(project: Path, duplicate: Path) -> None:
    result = invoke("render")
    assert result.code == 2, result.output
    error = result.output.splitlines()[-1]
    assert_clean(error)
    assert "Traceback" not in result.output
    line = _name_line(duplicate)
    # refused before any recipe renders: dup.yaml sorts first, so the second file with its name
    # is the one named, beside the first, with both lines
    assert error.startswith(f"error: recipes/{SINGLE}.yaml:{line}: field 'name': "
                            f"recipes/dup.yaml:{line} has the same name {SINGLE}"), result.output
    assert f"both would render into compose/{SINGLE}/" in error
    assert not (project / "compose" / SINGLE).exists()


def test_rendering_all_recipes_with_one_name_twice_writes_nothing(project: Path,
                                                                   duplicate: Path) -> None:
    result = invoke("render")
    assert result.code == 2, result.output
    assert not (project / "compose").exists(), result.output


def test_a_recipe_whose_name_another_declares_is_refused(project: Path, duplicate: Path) -> None:
    """SINGLE is valid on its own; dup.yaml beside it declares SINGLE's name: rendering SINGLE is
    refused naming both, nothing written."""
    result = invoke("render", SINGLE)
    assert result.code == 2, result.output
    assert_clean(result.output)
    assert "field 'name'" in result.output and "has the same name" in result.output
    assert "recipes/dup.yaml" in result.output and f"recipes/{SINGLE}.yaml" in result.output
    assert not (project / "compose" / SINGLE).exists()


@pytest.mark.parametrize("args", [("render", "dup"), ("render", "--check")])
def test_the_copy_that_keeps_another_recipes_name_is_refused_for_its_file_name(
        project: Path, duplicate: Path, args: tuple[str, ...]) -> None:
    """dup.yaml declares SINGLE's name: a recipe's name must be its file's, so it is refused for
    that first (naming both names and the fix), before it could render over SINGLE's folder."""
    result = invoke(*args)
    assert result.code == 2, result.output  # --check: not "stale" (1) forever, but the cause
    assert_clean(result.output)
    line = _name_line(duplicate)
    assert f"recipes/dup.yaml:{line}: field 'name': name '{SINGLE}' is not the file's name 'dup'" in result.output, \
        result.output
    assert f"write `name: dup` or rename the file to {SINGLE}.yaml" in result.output, result.output
    assert not (project / "compose" / SINGLE).exists()
    assert not (project / "compose" / "dup").exists()


def test_a_recipe_that_only_mentions_another_name_renders(project: Path) -> None:
    text = (project / "recipes" / f"{SINGLE}.yaml").read_text()
    other = text.replace(f"name: {SINGLE}", "name: qwen3-other", 1).replace("port: 8000", "port: 8001")
    (project / "recipes" / "qwen3-other.yaml").write_text(f"# a variant of {SINGLE}\n" + other)
    result = invoke("render", SINGLE)
    assert result.code == 0, result.output
    assert (project / "compose" / SINGLE / "compose.yaml").is_file()
    result = invoke("render", "qwen3-other")
    assert result.code == 0, result.output
    assert (project / "compose" / "qwen3-other" / "compose.yaml").is_file()


def test_check_recipe_refuses_both_recipes_of_one_name(project: Path, duplicate: Path) -> None:
    result = invoke("check", "recipe")
    assert result.code == 2, result.output
    errors = [l for l in result.output.splitlines() if l.startswith("error:")]
    # both are refused: dup.yaml first for declaring a name other than its file's, SINGLE for the
    # name dup.yaml also declares (both would render into compose/<name>/)
    assert len(errors) == 2, result.output
    by_file = {e.split(":")[1].strip(): e for e in errors}
    assert set(by_file) == {"recipes/dup.yaml", f"recipes/{SINGLE}.yaml"}, result.output
    assert f"name '{SINGLE}' is not the file's name 'dup'" in by_file["recipes/dup.yaml"], result.output
    same_name = f"recipes/dup.yaml:{_name_line(duplicate)} has the same name {SINGLE}"
    assert same_name in by_file[f"recipes/{SINGLE}.yaml"], result.output


def test_k8s_refuses_a_multinode_recipe_whose_name_another_has(project: Path) -> None:
    source = project / "recipes" / "dsv41-flash-gb300x2-pp2.yaml"
    (project / "recipes" / "twin.yaml").write_text(source.read_text())
    result = invoke("k8s", "dsv41-flash-gb300x2-pp2")
    assert result.code == 2 and "has the same name dsv41-flash-gb300x2-pp2" in result.output, result.output
    assert not (project / "k8s").exists()
