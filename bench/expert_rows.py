#!/usr/bin/env python3
"""The step-time estimate's MXFP4 routed-expert rows, derived from the committed H200 results.

Each row of ``recipegen.costmodel.efficiency.EXPERT_EFFICIENCY`` for an MXFP4 geometry is the
routed-expert layer's share of the HBM read limit measured in the same run, all experts in HBM:

* DeepSeek-V4.1-Flash: ``bench/gpu_residency.py`` (13 layers), ``achieved_GBps`` of the all-HBM
  case ÷ that run's ``limits.hbm_read.GBps`` (the figure its target lines print);
* gpt-oss-120b: ``bench/format_peer.py --formats gptoss-mxfp4``, the all-HBM ``pct_hbm`` (its
  MB per layer ÷ µs ÷ the same run's read limit).

Several calls of the same kernels measured the same T (run ER, one H200, 2026-12-04,
``bench/results/expert_rows_h200/``); a row takes the median over the calls that measured each T,
because single calls differ by up to ~10% at T = 1 (a 37-40 µs layer). The spread is printed.

    python3 bench/expert_rows.py            # the rows, with every call's figure beside them
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "expert_rows_h200"
# Calls whose kernels are the default the rows describe (call 6 ran gw_max_tokens=48, not the default).
CALLS = (3, 5, 7, 8)


def _dsv41_shares(path: Path) -> dict[int, float]:
    run = json.loads(path.read_text())
    limit = run["limits"]["hbm_read"]["GBps"]
    return {int(t): row["cases"]["all_hbm"]["achieved_GBps"] / limit for t, row in run["per_T"].items()}


def _gptoss_shares(path: Path) -> dict[int, float]:
    run = json.loads(path.read_text())["formats"]["gptoss-mxfp4"]
    return {int(t): row["all_hbm"]["pct_hbm"] / 100 for t, row in run["per_T"].items()}


SOURCES = {
    "dsv41-flash-mxfp4": ("call{}_residency13.json", _dsv41_shares),
    "gpt-oss-120b": ("call{}_format_peer_gptoss.json", _gptoss_shares),
}


def measured_shares(model: str, results: Path = RESULTS) -> dict[int, list[float]]:
    """T -> the share each call measured (calls in order)."""
    pattern, read = SOURCES[model]
    by_t: dict[int, list[float]] = {}
    for call in CALLS:
        path = results / pattern.format(call)
        if path.exists():
            for t, share in read(path).items():
                by_t.setdefault(t, []).append(share)
    return dict(sorted(by_t.items()))


def derived_row(model: str, results: Path = RESULTS) -> dict[int, float]:
    """T -> the median share over the calls, rounded to the table's two decimals."""
    return {t: round(statistics.median(shares), 2) for t, shares in measured_shares(model, results).items()}


def main() -> None:
    for model in SOURCES:
        print(model)
        for t, shares in measured_shares(model).items():
            calls = ", ".join(f"{s:.3f}" for s in shares)
            print(f"  T = {t:>2}: median {statistics.median(shares):.3f} -> {round(statistics.median(shares), 2):.2f}"
                  f"  (calls: {calls}; spread {max(shares) - min(shares):.3f})")


if __name__ == "__main__":
    main()
