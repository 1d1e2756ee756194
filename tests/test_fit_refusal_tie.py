"""Two placements that fit with the same printed speed: the "not chosen" line says they are the
same and names the rule that decided, never "is faster"."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from recipegen.cli import main
from recipegen.fit.choice import choose, not_chosen_text
from recipegen.fit.objective import Projection


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_equal_printed_speeds_are_not_called_faster(here: Path) -> None:
    """Qwen3-30B-A3B on an RTX 5090 with 7 sequences: usage-aware at 0 hot and positional with
    every layer offloaded both leave every expert cold, and print the same tok/s and band."""
    args = ["new", "qwen3-30b-a3b", "--machine", "rtx-5090", "--min-sequences", "7"]
    text = CliRunner().invoke(main, [*args, "-o", "a.yaml"])
    assert text.exit_code == 0, text.output
    data = json.loads(CliRunner().invoke(main, [*args, "-o", "b.yaml", "--json"]).stdout)
    chosen = data["chosen"]
    other = next(c for c in data["candidates"] if c["placement"] != chosen["placement"])
    assert chosen["speed"]["text"] == other["speed"]["text"]   # the case: figures equal as printed
    line = next(x for x in text.stdout.splitlines() if x.startswith("  also fits:"))
    assert "faster" not in line, line
    # equal speed: the larger KV pool decides, and the line gives both pools
    assert chosen["kv_tokens"] > other["kv_tokens"]
    assert (f"chosen for its larger KV pool ({round(chosen['kv_tokens']):,} tokens against "
            f"{round(other['kv_tokens']):,})") in line, line


def _cand(tok_s: float, kv: float) -> SimpleNamespace:
    text = f"{tok_s:,.1f} tok/s at 1 stream (validation band 1.0–2.0)"
    return SimpleNamespace(projection=Projection(tok_s, text, "test", tokens_per_s=tok_s), kv_tokens=kv)


def test_each_rule_is_named_as_it_decides() -> None:
    fast, slow = _cand(17.0, 1), _cand(16.0, 2)
    assert choose([slow, fast]) is fast and not_chosen_text(fast, slow).endswith("is faster")  # type: ignore[arg-type]
    # a difference below the printed precision: said so, with the digits that show it
    a, b = _cand(16.74, 1), _cand(16.68, 2)
    assert choose([b, a]) is a  # type: ignore[arg-type]
    assert not_chosen_text(a, b) == ("the same 16.7 tok/s at 1 stream at the printed precision; chosen on the "  # type: ignore[arg-type]
                                     "estimate before rounding (16.74 tok/s against 16.68 tok/s), a difference "
                                     "below the printed precision")
    # rounding noise in the last bits is no difference: the larger KV pool decides
    c, d = _cand(16.656055627408374, 100), _cand(16.65605562740838, 50)
    assert choose([d, c]) is c  # type: ignore[arg-type]
    # everything equal: the first tried is kept
    e, f = _cand(10.0, 5), _cand(10.0, 5)
    assert choose([e, f]) is e and "tried first" in not_chosen_text(e, f)  # type: ignore[arg-type]
