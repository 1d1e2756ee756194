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
A call's figure at T counts for a row where it ran the kernels that row's GPUs run at T today
(`Kernels`): the T = 1 loops at T = 1; DeepSeek-V4.1's Hopper row (``dsv41-flash-mxfp4@sm90``) the
warp-specialized launches from 2 tokens (``ws_min_tokens``; a call records whether they ran), its
row for every other GPU the grouped warp-MMA loop up to 16 tokens and ``tl.dot`` above (the
runtime's Triton path where the warp-specialized launches do not run); gpt-oss's grouped warp-MMA
loop up to 48 tokens (its K tiles are halved; the warp-specialized launches do not take biased
SwiGLU-OAI experts), ``tl.dot`` above. Each call's kernels are read from the configuration it
recorded or printed. A row takes the median over the calls that count at each T, because single
calls differ by up to ~10% at T = 1 (a 37-40 µs layer). The spread is printed.

Where today's kernels change at some T (gpt-oss at 49) there is a measurement on each side, so the
row steps down instead of interpolating across the change.

    python3 bench/expert_rows.py            # the rows, with every call's figure beside them
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "expert_rows_h200"
@dataclass(frozen=True)
class Kernels:
    """Which expert kernels a configuration runs at each tokens per step T."""

    gw_max_tokens: int
    """The grouped warp-MMA loop's limit (0: no such loop)."""
    ws_min_tokens: int | None = None
    """The warp-specialized launches take grouped steps from this T (None: they do not run)."""
    ws_programs_per_sm: int = 2
    """Their programs per SM (a run records the count it resolved; runs before that ran 2)."""

    def at(self, tokens: int) -> str:
        if tokens == 1:
            return "t1"
        if self.ws_min_tokens is not None and tokens >= self.ws_min_tokens:
            return f"warp-specialized x{self.ws_programs_per_sm}/SM"
        return "warp-mma-grouped" if tokens <= self.gw_max_tokens else "tl.dot"


# Today's defaults per row (config_for_shape of the default KernelConfig, and runs_warp_specialized;
# a test checks): DeepSeek-V4.1 has two, its Hopper kernels ("@sm90": the warp-specialized launches
# from 2 tokens) and the ones every other GPU runs through the runtime's Triton path (the grouped
# warp-MMA loop up to 16 tokens, tl.dot above), both measured on the H200; the bf16 and FP8-block
# layers have neither loop.
TODAY = {"dsv41-flash-mxfp4@sm90": Kernels(16, 2), "dsv41-flash-mxfp4": Kernels(16), "gpt-oss-120b": Kernels(48),
         "qwen3-30b-a3b": Kernels(0), "deepseek-v3": Kernels(0)}


def _gw_limit(described: str) -> int:
    """The grouped loop's token limit in a printed kernel configuration (0: the loop off)."""
    found = re.search(r"warp-mma-grouped@2\.\.(\d+)", described)
    return int(found.group(1)) if found else 0


def _dsv41_shares(path: Path) -> tuple[Kernels, dict[int, float]]:
    run = json.loads(path.read_text())
    limit = run["limits"]["hbm_read"]["GBps"]
    shares = {int(t): row["cases"]["all_hbm"]["achieved_GBps"] / limit for t, row in run["per_T"].items()}
    config = run["config"]
    # calls before the warp-specialized launches recorded neither the setting nor whether they ran
    ws = config["ws_min_tokens"] if run.get("warp_specialized") else None
    per_sm = run.get("ws_programs_per_sm") or config.get("ws_programs_per_sm") or 2
    return Kernels(config["gw_max_tokens"], ws, per_sm), shares


def _format_shares(key: str):
    """A `bench/format_peer.py` result's reader for format `key`: its all-HBM `pct_hbm` by T."""
    def read(path: Path) -> tuple[int, dict[int, float]]:
        run = json.loads(path.read_text())["formats"][key]
        return Kernels(_gw_limit(run["ours"])), {int(t): row["all_hbm"]["pct_hbm"] / 100 for t, row in run["per_T"].items()}
    return read


SOURCES = {
    "dsv41-flash-mxfp4@sm90": ("call*_residency13*.json", _dsv41_shares),
    "dsv41-flash-mxfp4": ("call*_residency13*.json", _dsv41_shares),
    "gpt-oss-120b": ("call*_format_peer_gptoss*.json", _format_shares("gptoss-mxfp4")),
    "qwen3-30b-a3b": ("call*_format_peer_qwen3-bf16*.json", _format_shares("qwen3-bf16")),
    "deepseek-v3": ("call*_format_peer_dsv3-fp8*.json", _format_shares("dsv3-fp8")),
}


def _call_number(path: Path) -> int:
    return int(re.match(r"call(\d+)_", path.name).group(1))


def measured_shares(row: str, results: Path = RESULTS) -> dict[int, list[tuple[str, float]]]:
    """T -> (file, share) of each call that ran the `row`'s kernels at T, in call order."""
    pattern, read = SOURCES[row]
    today = TODAY[row]
    by_t: dict[int, list[tuple[str, float]]] = {}
    for path in sorted(results.glob(pattern), key=lambda p: (_call_number(p), p.name)):
        kernels, shares = read(path)
        for t, share in shares.items():
            if kernels.at(t) == today.at(t):
                by_t.setdefault(t, []).append((path.name, share))
    return dict(sorted(by_t.items()))


def derived_row(row: str, results: Path = RESULTS) -> dict[int, float]:
    """T -> the median share over the calls, rounded to the table's two decimals."""
    return {t: round(statistics.median(s for _, s in calls), 2) for t, calls in measured_shares(row, results).items()}


def main() -> None:
    for model in SOURCES:
        today = TODAY[model]
        said = [f"grouped warp-MMA loop up to {today.gw_max_tokens} tokens"] if today.gw_max_tokens else []
        if today.ws_min_tokens is not None:
            said = [f"warp-specialized launches from {today.ws_min_tokens} tokens"]
        print(f"{model} ({', '.join(said) or 'no grouped loop'})")
        for t, calls in measured_shares(model).items():
            shares = [s for _, s in calls]
            median = statistics.median(shares)
            each = ", ".join(f"{name.split('_')[0]} {s:.3f}" for name, s in calls)
            print(f"  T = {t:>2}: median {median:.3f} -> {round(median, 2):.2f}  ({each}; spread {max(shares) - min(shares):.3f})")


if __name__ == "__main__":
    main()
