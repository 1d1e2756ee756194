"""A usage-aware refusal names the hot count that came closest to fitting and quotes that count's
own shortfall: the figure an operator would size a host from. The expected peak comes from a
bigger host, where the same count fits and the ledger prints its load-time peak."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

from recipegen.catalog import catalog_entry
from recipegen.cli import main
from recipegen.fit.closest import Tried, closest_text
from recipegen.fit.judged import Problem

GiB = 2**30


def run(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


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
