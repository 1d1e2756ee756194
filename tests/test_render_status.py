"""What `recipegen render` says of each file it wrote, measured against the bytes on disk before
the write (docs/render.md, "Swapping a class"): a generated file edited or deleted by hand and put
back by the render is `rewritten`, never `unchanged`, and counts in the summary; paths in the
report, the swap's lines and `--check` are relative inside the current folder, absolute outside."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.render.output import MANIFEST_NAME, read_manifest

RECIPE = "dsv41-flash-gb300"     # 8 files with monitoring/, maps/agent/<class>.rowmap
RULES = "monitoring/rules.yml"


def file_lines(out: str) -> dict[str, str]:
    return {line.split(": ", 1)[0][len("  file "):]: line.split(": ", 1)[1]
            for line in out.splitlines() if line.startswith("  file ")}


@pytest.fixture()
def rendered(project: Path) -> Path:
    result = invoke("render", RECIPE)
    assert result.code == 0, result.output
    return project / "compose" / RECIPE


def test_a_re_render_over_untouched_files_changes_none(rendered: Path) -> None:
    result = invoke("render", RECIPE)
    assert result.code == 0, result.output
    assert result.output.splitlines()[0].endswith(": 8 files, none changed"), result.output
    assert set(file_lines(result.output).values()) == {"unchanged"}


def test_a_hand_edited_file_is_reported_rewritten_and_counted(rendered: Path) -> None:
    rules = rendered / RULES
    fresh = rules.read_bytes()
    rules.write_bytes(fresh + b"# hot fix: threshold raised by hand\n")
    result = invoke("render", RECIPE)
    assert result.code == 0, result.output
    assert result.output.splitlines()[0] == (f"wrote compose/{RECIPE}/ from recipes/{RECIPE}.yaml: 8 files, "
                                             "1 changed (1 rewritten over hand edits)"), result.output
    files = file_lines(result.output)
    assert files[RULES] == "rewritten (edited by hand since the last render)"
    assert {mark for name, mark in files.items() if name != RULES} == {"unchanged"}
    assert rules.read_bytes() == fresh                      # the render did put it back
    # and the next render has nothing left to rewrite
    result = invoke("render", RECIPE)
    assert result.output.splitlines()[0].endswith(": 8 files, none changed"), result.output


def test_a_deleted_file_is_reported_rewritten(rendered: Path) -> None:
    (rendered / "compose.yaml").unlink()
    result = invoke("render", RECIPE)
    assert result.code == 0, result.output
    assert "1 changed (1 rewritten over hand edits)" in result.output.splitlines()[0], result.output
    assert file_lines(result.output)["compose.yaml"] == "rewritten (deleted by hand since the last render)"


def test_a_hand_edit_equal_to_the_new_render_is_unchanged(rendered: Path) -> None:
    # the bytes on disk decide: a manifest out of step with identical bytes changes no file
    manifest = rendered / MANIFEST_NAME
    text = manifest.read_text()
    digest = read_manifest(rendered)["compose.yaml"]
    manifest.write_text(text.replace(digest, hashlib.sha256(b"older").hexdigest()))
    result = invoke("render", RECIPE)
    assert result.code == 0, result.output
    assert file_lines(result.output)["compose.yaml"] == "unchanged", result.output
    assert read_manifest(rendered)["compose.yaml"] == digest


def test_a_swap_over_a_hand_edited_compose_file_says_both(rendered: Path, project: Path) -> None:
    compose_file = rendered / "compose.yaml"
    compose_file.write_bytes(compose_file.read_bytes() + b"# appended by hand\n")
    result = invoke("render", RECIPE, "--class", "agent=prose")
    assert result.code == 0, result.output
    files = file_lines(result.output)
    assert files["compose.yaml"] == "changed (was also edited by hand since the last render)", result.output
    assert files["maps/agent/prose.rowmap"] == "new" and files["maps/agent/agent.rowmap"] == "removed"
    assert b"# appended by hand" not in compose_file.read_bytes()
    # the swap's own line names the recipe as the render report does: relative inside the folder
    assert f"recipes/{RECIPE}.yaml: lane agent: active_class agent -> prose" in result.output.splitlines()
    assert str(project) not in result.output, result.output


def test_check_names_stale_files_relative_inside_the_current_folder(rendered: Path, project: Path) -> None:
    (rendered / RULES).write_text("edited\n")
    result = invoke("render", "--check")
    assert result.code == 1, result.output
    assert f"stale: compose/{RECIPE}/{RULES}: differs from a fresh render" in result.output.splitlines(), result.output
    assert str(project) not in result.output


def test_paths_outside_the_current_folder_stay_absolute(rendered: Path, project: Path,
                                                        tmp_path_factory: pytest.TempPathFactory,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    recipe = project / "recipes" / f"{RECIPE}.yaml"
    result = invoke("render", str(recipe), "--class", "agent=math")
    assert result.code == 0, result.output
    assert f"{recipe}: lane agent: active_class agent -> math" in result.output.splitlines(), result.output
    assert result.output.count(f"wrote {project}/compose/{RECIPE}/ from {recipe}:") == 1, result.output


def test_render_names_a_monitored_lane_without_a_drift_baseline(rendered: Path) -> None:
    # The reference's agent histogram is a synthetic example (its file says so), so the lane
    # exports no predicted cold share and the render says what that means and how to measure one.
    result = invoke("render", RECIPE)
    assert result.code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("  note: ")]
    assert notes == [
        "  note: lane agent: no drift alert baseline: class agent's histogram "
        "(profiles/dsv41-flash/agent.hist) is synthetic (generated, not measured traffic), so no "
        "predicted cold share is exported and the cold-share drift alert stays quiet; measure the "
        f"class's traffic with `recipegen profile {RECIPE} agent --class agent --prompts FILE` "
        "(or `--serve SECONDS`), then render again"], result.output
    assert "EXPERT_RESIDENCY_PREDICTED_COLD_SHARE" not in (rendered / "compose.yaml").read_text()
