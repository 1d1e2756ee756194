"""A first render says `new`, for its files, its summary and its services; `changed` is what a
later render changed (docs/render.md, "Swapping a class")."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.cli.render_cmd import _counts


def test_a_first_render_of_a_new_recipe_says_new(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").mkdir()
    made = invoke("new", "deepseek-v3", "--machine", "h200-sxm-x8", "-o", "recipes/dsv3.yaml")
    assert made.code == 0, made.output
    result = invoke("render", "recipes/dsv3.yaml")
    assert result.code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[:3] == ["wrote compose/dsv3/ from recipes/dsv3.yaml: 2 files, 2 new",
                         "  file compose.yaml: new",
                         "  file .gitignore: new"]
    services = [line for line in lines if line.startswith("  service ")]
    assert [line.split(" — ")[0] for line in services] == ["  service lane-chat: new",
                                                           "  service lane-chat-profile: new"]
    assert "changed" not in result.stdout and "apply:" not in result.stdout
    again = invoke("render", "recipes/dsv3.yaml")
    lines = again.stdout.splitlines()
    assert lines[0] == "wrote compose/dsv3/ from recipes/dsv3.yaml: 2 files, none changed"
    assert [line.split(" — ")[0] for line in lines if line.startswith("  service ")] == [
        "  service lane-chat: unchanged", "  service lane-chat-profile: unchanged"]


def test_a_swap_counts_new_files_apart_from_changed_ones(project: Path) -> None:
    assert invoke("render", "dsv41-flash-gb300").code == 0
    result = invoke("render", "dsv41-flash-gb300", "--class", "agent=prose")
    assert result.code == 0, result.output
    lines = result.stdout.splitlines()
    # compose.yaml changed, maps/agent/agent.rowmap removed, maps/agent/prose.rowmap new
    assert "wrote compose/dsv41-flash-gb300/ from recipes/dsv41-flash-gb300.yaml: 8 files, 1 new, 2 changed" in lines
    assert any(line.startswith("  service lane-agent: changed — ") for line in lines), result.stdout
    assert any(line.startswith("  service lane-agent-profile: unchanged — ") for line in lines), result.stdout


@pytest.mark.parametrize("marks, summary", [
    (["new", "new"], "2 new"),
    (["unchanged", "unchanged"], "none changed"),
    (["changed", "new", "removed", "unchanged"], "1 new, 2 changed"),
    (["rewritten (edited by hand since the last render)", "unchanged"], "1 changed (1 rewritten over hand edits)"),
    (["new", "changed (was also edited by hand since the last render)"], "1 new, 1 changed"),
])
def test_the_summary_counts(marks: list[str], summary: str) -> None:
    assert _counts(marks) == summary
