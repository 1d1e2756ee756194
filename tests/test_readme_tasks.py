"""README's three tasks ("From a model and a machine"): every command run as written, in an empty
project, and every output line the README quotes found in that command's output."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import invoke
from doc_commands import commands_and_quotes

README = Path(__file__).resolve().parent.parent / "README.md"


def tasks() -> list[tuple[list[str], list[str]]]:
    """(command argv, quoted output lines) in README order, from the section's code blocks."""
    text = README.read_text(encoding="utf-8")
    section = text.split("### From a model and a machine")[1].split("\n### ")[0]
    return commands_and_quotes(section.split("```")[1::2])


def test_the_readme_tasks_print_what_the_readme_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    found = tasks()
    assert [argv[0] for argv, _ in found] == ["new", "check", "new", "check", "new", "compare"]
    for argv, quoted in found:
        result = invoke(*argv)
        assert result.code == 0, f"{argv}: {result.output}"
        lines = [line.rstrip() for line in result.stdout.splitlines()]
        for want in quoted:
            assert want in lines, f"`recipegen {' '.join(argv)}` no longer prints:\n{want}\n--- it printed:\n{result.stdout}"
