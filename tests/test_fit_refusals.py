"""What `new` / `fit` say when they refuse or choose.

* A usage-aware refusal names the hot count that came closest to fitting and quotes that count's
  own shortfall: the figure an operator would size a host from. The expected peak comes from a
  bigger host, where the same count fits and the ledger prints its load-time peak.
* `--min-sequences` asked beyond what HBM holds: the smallest change names the most full-length
  sequences that fit, checked by fitting it and one more.
* Two placements that fit with the same printed speed: the "not chosen" line says they are the
  same and names the rule that decided, never "is faster"."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from cli_support import invoke

from recipegen.catalog import catalog_entry
from recipegen.fit.choice import choose, not_chosen_text
from recipegen.fit.closest import Tried, closest_text
from recipegen.fit.judged import Problem
from recipegen.fit.objective import Projection

GiB = 2**30


def run(*args: str) -> tuple[int, dict]:
    """``recipegen ARGS --json``, which must exit 0 or 1: the exit code and the document printed."""
    result = invoke(*args, "--json")
    assert result.code in (0, 1), result.output
    return result.code, json.loads(result.stdout)


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def usage_aware_reason(out: dict) -> str:
    return next(r["reason"] for r in out["refusals"] if r["placement"] == "usage-aware")


def test_the_refusal_quotes_the_peak_of_the_count_a_bigger_host_fits(here: Path) -> None:
    """Qwen3-30B-A3B at 40,960 tokens on an RTX 4090 with its catalog 64 GiB host: nothing fits.
    The same GPU with a 96 GiB host fits, at the most hot experts HBM allows; that count's
    load-time host peak, less 64 GiB, is the real shortfall (the old reason quoted the lowest
    count's, 76.38 GiB / 12.38 GiB over)."""
    entry = catalog_entry("machines", "rtx-4090")
    entry["name"] = "rtx-4090-96"
    entry["host_memory"] = {"value": "96 GiB", "source": "a bigger host, for the test"}
    (here / "big.yaml").write_text(yaml.safe_dump(entry))
    code, big = run("new", "qwen3-30b-a3b", "--machine", "big.yaml", "--max-model-len", "40960", "-o", "big-r.yaml")
    assert code == 0 and big["chosen"]["placement"] == "usage-aware"
    hot = big["chosen"]["hot_experts_per_layer"]
    peak = big["ledger"]["figures"]["load.host_peak"]["value"] / GiB
    assert 64 < peak < 96

    code, small = run("new", "qwen3-30b-a3b", "--machine", "rtx-4090", "--max-model-len", "40960", "-o", "r.yaml")
    assert code == 1
    reason = usage_aware_reason(small)
    assert f"the closest to fitting, {hot} hot per layer" in reason, reason
    assert f"peaks at {peak:.2f} GiB while loading, {peak - 64:.2f} GiB over" in reason, reason


def test_the_refusal_and_the_smallest_change_quote_one_peak(here: Path) -> None:
    """Qwen3-235B-A22B-FP8 on one H200 PCIe (125.87 GiB host): the reason's load-time peak is the
    one the smallest-change line sizes the host from, and a host of that many GiB fits."""
    code, out = run("new", "qwen3-235b-a22b-fp8", "--machine", "h200-pcie", "-o", "r.yaml")
    assert code == 1
    need = float(out["suggestion"].split("usage-aware: ")[1].split(" GiB")[0])
    reason = usage_aware_reason(out)
    assert f"peaks at {need:.2f} GiB while loading" in reason, reason

    entry = catalog_entry("machines", "h200-pcie")
    entry["name"] = "h200-roomy"
    entry["host_memory"] = {"value": f"{math.ceil(need)} GiB", "source": "the suggestion's figure"}
    (here / "roomy.yaml").write_text(yaml.safe_dump(entry))
    assert run("new", "qwen3-235b-a22b-fp8", "--machine", "roomy.yaml", "-o", "roomy-r.yaml")[0] == 0


def _tried(hot: int, *problems: tuple[str, float | None]) -> Tried:
    found = tuple(Problem(kind, f"{kind} figures", over) for kind, over in problems)
    ev = SimpleNamespace(problems=found, kinds=lambda: {p.kind for p in found})
    return Tried(hot, 10, ev)  # type: ignore[arg-type]


def test_closest_is_fewest_budgets_then_fewest_bytes_and_no_shortfall_is_overstated() -> None:
    """Different counts failing different budgets: the count breaking one budget is closer than one
    breaking two, whatever their bytes; where the latter comes nearer on the shared budget, the
    reason says so, so the shortfall printed for that budget is the least of any count tried."""
    tried = [_tried(12, ("load-host", 5 * GiB)), _tried(11, ("load-host", 3 * GiB)),
             _tried(10, ("load-host", 1 * GiB), ("host", 0.5 * GiB))]
    text = closest_text(tried)
    assert text.startswith("the closest to fitting, 11 hot per layer (--cpu-offload-gb 10 at load), breaks "
                           "[load-host] load-host figures"), text
    # 10 hot's other budget, [host], is one the closest count holds: named with its shortfall, and "too"
    assert text.endswith("(10 hot per layer is only 1.00 GiB over [load-host] but 0.50 GiB over [host] too)"), text
    # a refusal that is not a matter of bytes is the farthest
    assert closest_text([_tried(9, ("runtime", None)), _tried(8, ("load-host", 40 * GiB))]).startswith(
        "the closest to fitting, 8 hot")


def test_a_nearer_count_names_its_shortfall_on_a_budget_the_closest_breaks_too() -> None:
    """12 hot is over by 1 + 1 GiB, 11 hot by 0.5 + 3 GiB: 12 is the closest (the same two budgets,
    fewer bytes). 11 comes nearer on [load-host] only; on [host] it is 3 GiB over, and 12 breaks
    [host] as well, so the note gives that figure and no "too"."""
    text = closest_text([_tried(12, ("load-host", 1 * GiB), ("host", 1 * GiB)),
                         _tried(11, ("load-host", 0.5 * GiB), ("host", 3 * GiB))])
    assert text.startswith("the closest to fitting, 12 hot per layer"), text
    assert text.endswith("(11 hot per layer is only 0.50 GiB over [load-host] but 3.00 GiB over [host])"), text
    assert "too" not in text, text


def test_a_nearer_count_splits_the_budgets_the_closest_breaks_from_the_ones_it_holds() -> None:
    """The nearer count breaks [host] (which the closest breaks too: no "too"), [kv] by 1 GiB and
    [runtime] (no byte figure), which the closest holds: those two take one "too"."""
    text = closest_text([_tried(12, ("load-host", 1 * GiB), ("host", 1 * GiB)),
                         _tried(11, ("load-host", 0.25 * GiB), ("host", 2 * GiB), ("kv", 1 * GiB),
                                ("runtime", None))])
    assert text.endswith("(11 hot per layer is only 0.25 GiB over [load-host] but 2.00 GiB over [host], "
                         "and 1.00 GiB over [kv] and breaks [runtime] too)"), text


# -- --min-sequences beyond what fits

CONTEXT = "40960"   # Qwen3-30B-A3B's full context, the one the refusal is about


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


# -- equal speeds

def test_equal_printed_speeds_are_not_called_faster(here: Path) -> None:
    """Qwen3-30B-A3B on an RTX 5090 with 7 sequences: usage-aware at 0 hot and positional with
    every layer offloaded both leave every expert cold, and print the same tok/s and band."""
    args = ["new", "qwen3-30b-a3b", "--machine", "rtx-5090", "--min-sequences", "7"]
    text = invoke(*args, "-o", "a.yaml")
    assert text.code == 0, text.output
    data = json.loads(invoke(*args, "-o", "b.yaml", "--json").stdout)
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
