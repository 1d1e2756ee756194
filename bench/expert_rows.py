#!/usr/bin/env python3
"""The step-time estimate's routed-expert rows, derived from the committed H200 results.

Each row of ``recipegen.costmodel.efficiency.EXPERT_EFFICIENCY`` is the routed-expert layer's share
of the HBM read limit measured in the same run, all experts in HBM:

* DeepSeek-V4.1-Flash (MXFP4): ``bench/gpu_residency.py`` (13 layers), ``achieved_GBps`` of the
  all-HBM case ÷ that run's ``limits.hbm_read.GBps`` (the figure its target lines print);
* gpt-oss-120b (MXFP4), Qwen3-30B-A3B (bf16), DeepSeek-V3 (FP8 128×128 blocks):
  ``bench/format_peer.py --formats gptoss-mxfp4 / qwen3-bf16 / dsv3-fp8``, the all-HBM ``pct_hbm``
  (its MB per layer ÷ µs ÷ the same run's read limit).

Several calls measured the same T (run ER, one H200, 2026-12-04, ``bench/results/expert_rows_h200/``;
call 10, 2026-12-05: gpt-oss at T = 48 / 49 / 64 on today's defaults; call 11, the same day: the bf16
and FP8-block layers at T = 1 / 2 / 4 / 6 / 16 / 32 / 96).
A call's figure at T counts where it ran the kernels today's defaults run at T: the grouped
warp-MMA loop up to the geometry's ``gw_max_tokens`` (16 for DeepSeek-V4.1; 48 for gpt-oss, whose
K tiles are halved), the ``tl.dot`` kernels above. Each call's limit is read from the kernel
configuration it printed. A row takes the median over the calls that count at each T, because
single calls differ by up to ~10% at T = 1 (a 37-40 µs layer). The spread is printed.

At the first T above the loop's limit the row changes kernels: each geometry has a measurement
there (DeepSeek-V4.1 at T = 17, gpt-oss at T = 49), so the row steps down instead of interpolating
across the change.

    python3 bench/expert_rows.py            # the rows, with every call's figure beside them
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "expert_rows_h200"
# Today's grouped-loop limit per geometry (config_for_shape of the default KernelConfig; a test checks);
# 0 for the bf16 and FP8-block layers, which have no grouped loop (every call counts at every T).
TODAY_GW_MAX_TOKENS = {"dsv41-flash-mxfp4": 16, "gpt-oss-120b": 48, "qwen3-30b-a3b": 0, "deepseek-v3": 0}


def _gw_limit(described: str) -> int:
    """The grouped loop's token limit in a printed kernel configuration (0: the loop off)."""
    found = re.search(r"warp-mma-grouped@2\.\.(\d+)", described)
    return int(found.group(1)) if found else 0


def _dsv41_shares(path: Path) -> tuple[int, dict[int, float]]:
    run = json.loads(path.read_text())
    limit = run["limits"]["hbm_read"]["GBps"]
    shares = {int(t): row["cases"]["all_hbm"]["achieved_GBps"] / limit for t, row in run["per_T"].items()}
    return run["config"]["gw_max_tokens"], shares


def _format_shares(key: str):
    """A `bench/format_peer.py` result's reader for format `key`: its all-HBM `pct_hbm` by T."""
    def read(path: Path) -> tuple[int, dict[int, float]]:
        run = json.loads(path.read_text())["formats"][key]
        return _gw_limit(run["ours"]), {int(t): row["all_hbm"]["pct_hbm"] / 100 for t, row in run["per_T"].items()}
    return read


SOURCES = {
    "dsv41-flash-mxfp4": ("call*_residency13*.json", _dsv41_shares),
    "gpt-oss-120b": ("call*_format_peer_gptoss*.json", _format_shares("gptoss-mxfp4")),
    "qwen3-30b-a3b": ("call*_format_peer_qwen3-bf16*.json", _format_shares("qwen3-bf16")),
    "deepseek-v3": ("call*_format_peer_dsv3-fp8*.json", _format_shares("dsv3-fp8")),
}


def _call_number(path: Path) -> int:
    return int(re.match(r"call(\d+)_", path.name).group(1))


def measured_shares(model: str, results: Path = RESULTS) -> dict[int, list[tuple[str, float]]]:
    """T -> (file, share) of each call that ran today's kernels at T, in call order."""
    pattern, read = SOURCES[model]
    today = TODAY_GW_MAX_TOKENS[model]
    by_t: dict[int, list[tuple[str, float]]] = {}
    for path in sorted(results.glob(pattern), key=lambda p: (_call_number(p), p.name)):
        limit, shares = read(path)
        for t, share in shares.items():
            if (t <= limit) == (t <= today):     # the same kernels as today's at this T
                by_t.setdefault(t, []).append((path.name, share))
    return dict(sorted(by_t.items()))


def derived_row(model: str, results: Path = RESULTS) -> dict[int, float]:
    """T -> the median share over the calls, rounded to the table's two decimals."""
    return {t: round(statistics.median(s for _, s in calls), 2) for t, calls in measured_shares(model, results).items()}


def main() -> None:
    for model in SOURCES:
        limit = TODAY_GW_MAX_TOKENS[model]
        print(f"{model} ({f'grouped warp-MMA loop up to {limit} tokens' if limit else 'no grouped loop'})")
        for t, calls in measured_shares(model).items():
            shares = [s for _, s in calls]
            median = statistics.median(shares)
            each = ", ".join(f"{name.split('_')[0]} {s:.3f}" for name, s in calls)
            print(f"  T = {t:>2}: median {median:.3f} -> {round(median, 2):.2f}  ({each}; spread {max(shares) - min(shares):.3f})")


if __name__ == "__main__":
    main()
