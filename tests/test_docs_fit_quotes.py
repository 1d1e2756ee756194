"""docs/fit.md quotes two lines `recipegen new` prints; each test runs that command and asserts the
page quotes what it prints now, so a ledger change that moves the figure fails here instead of
leaving the page stale (the KV-in-whole-blocks change moved both by a block's worth)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from cli_support import invoke

REPO = Path(__file__).resolve().parent.parent
FIT_PAGE = REPO / "docs" / "fit.md"
LLAMA4_SCOUT = REPO / "tests" / "fixtures" / "hf_configs" / "llama-4-scout-17b-16e-instruct"


def page_text() -> str:
    """fit.md with every run of whitespace one space (quotes wrap across lines)."""
    return re.sub(r"\s+", " ", FIT_PAGE.read_text(encoding="utf-8"))


def new_json(tmp_path: Path, *args: str) -> dict:
    result = invoke("new", *args, "--json", "-o", str(tmp_path / "out.yaml"))
    assert result.code in (0, 1), result.output
    return json.loads(result.output)


def test_fit_page_quotes_the_boundary_new_prints_for_qwen3_30b_on_an_rtx_5090(tmp_path: Path) -> None:
    boundary = new_json(tmp_path, "qwen3-30b-a3b", "--machine", "rtx-5090")["chosen"]["boundary"]
    assert boundary.startswith("one more hot expert per layer ("), boundary
    assert boundary in page_text(), f"docs/fit.md no longer quotes {boundary!r}"


def test_fit_page_quotes_the_context_and_host_new_suggests_for_llama4_scout_on_one_h200(tmp_path: Path) -> None:
    suggestion = new_json(tmp_path, str(LLAMA4_SCOUT), "--machine", "h200-pcie")["suggestion"]
    length = re.search(r"max_model_len ([\d,]+) tokens", suggestion)
    host = re.search(r"at least (\d+) GiB", suggestion)
    assert length and host, suggestion
    quoted = f"`max_model_len {length.group(1)}` and a host of at least {host.group(1)} GiB"
    assert quoted in page_text(), f"docs/fit.md no longer quotes {quoted!r}"
