"""Helpers of the hostile-input corpus: run the CLI as a user would and insist on a clean
`file:line: field` error (exit 2) instead of a traceback."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from cli_support import invoke

REPO = Path(__file__).resolve().parents[2]
REFERENCE = "dsv41-flash-gb300"

SUBPROCESS_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime")])}
"""The environment a CLI run in a child process gets: this checkout's packages first."""

# The CLI, SIGKILLed at its KILL_AT-th os.replace (after the temp is written and fsynced).
KILLER = """
import os, signal, sys
limit = int(os.environ["KILL_AT"]); count = [0]
real = os.replace
def hit(*a, **k):
    count[0] += 1
    if count[0] == limit:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*a, **k)
os.replace = hit
from recipegen.cli import main
sys.argv = ["recipegen", *sys.argv[1:]]
main()
"""


def key_paths(node: Any, prefix: str = "") -> set[str]:
    """Every key path of a parsed document (list positions collapsed): its structure."""
    out: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            out.add(f"{prefix}/{key}")
            out |= key_paths(value, f"{prefix}/{key}")
    elif isinstance(node, list):
        for item in node:
            out |= key_paths(item, f"{prefix}[]")
    return out


def killed_at_rename(project: Path, *args: str, at: int = 1) -> subprocess.CompletedProcess:
    """``recipegen ARGS`` in a child process in ``project``, SIGKILLed at its ``at``-th rename
    (return code -9 when it got that far)."""
    return subprocess.run([sys.executable, "-c", KILLER, *args], cwd=project,
                          env={**SUBPROCESS_ENV, "KILL_AT": str(at)}, capture_output=True, text=True,
                          timeout=300)


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Exit code and combined output; fails the test on any Python exception escaping (`invoke`)."""
    result = invoke(*args, env=env)
    assert "Traceback" not in result.output, result.output
    return result.code, result.output


def refused(*args: str, expect: str = "") -> str:
    """The CLI refuses with exit 2 and one `error:` message (containing `expect`)."""
    code, output = cli(*args)
    assert code == 2, f"exit {code}, expected 2: {output}"
    assert "error:" in output, output
    assert expect in output, output
    return output


def reference_plain() -> dict[str, Any]:
    return yaml.safe_load((REPO / "recipes" / f"{REFERENCE}.yaml").read_text(encoding="utf-8"))


def write_recipe(project: Path, name: str, doc: dict[str, Any], *, keep_name: bool = False) -> Path:
    doc = copy.deepcopy(doc)
    if not keep_name:
        doc["name"] = name
    path = project / "recipes" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}
