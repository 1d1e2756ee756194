"""`--min-sequences` asked beyond what HBM holds: the smallest change names the most full-length
sequences that fit, checked by fitting it and one more."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipegen.cli import main

CONTEXT = "40960"   # Qwen3-30B-A3B's full context, the one the refusal is about


def run(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_suggested_sequence_count_is_the_most_that_fits(here: Path) -> None:
    code, out = run("new", "qwen3-30b-a3b", "--machine", "rtx-5090", "--min-sequences", "1000", "-o", "r.yaml")
    assert code == 1
    found = re.search(r"--min-sequences (\d+)", out["suggestion"])
    assert found, out["suggestion"]
    most = int(found.group(1))
    # the refusal says how many the pool holds at best: the suggestion must not ask for fewer
    held = {int(m) for r in out["refusals"] for m in re.findall(r"holds (\d+) full-length", r["reason"])}
    assert held and most == max(held), (most, held)
    # and it is the boundary: that many fit at this context, one more does not
    fits = run("new", "qwen3-30b-a3b", "--machine", "rtx-5090", "--max-model-len", CONTEXT,
               "--min-sequences", str(most), "-o", "fits.yaml")[0]
    more = run("new", "qwen3-30b-a3b", "--machine", "rtx-5090", "--max-model-len", CONTEXT,
               "--min-sequences", str(most + 1), "-o", "more.yaml")[0]
    assert (fits, more) == (0, 1)
