"""Measured kernel costs the step-time estimate reads (data tables; each row names its run).

Every figure was measured on one NVIDIA H200 (PCIe Gen5; torch 2.11.0+cu130, triton 3.6.0) and is
recorded in BENCHMARKS.md with the command that produced it. On another GPU the estimate scales the
byte terms by that GPU's own HBM read rate and keeps these efficiencies and fixed times: an
assumption, printed with every estimate (no other GPU was measured here).

* ``EXPERT_EFFICIENCY``: the residency runtime's routed-expert layer, all experts in HBM — the
  unique experts' bytes per layer ÷ the layer's time ÷ the HBM read limit measured in the same run,
  by expert format, measured geometry and tokens per step T.
* ``GEMM_BF16`` / ``ATTENTION_DECODE``: per-launch fixed time and streaming efficiency by T
  (``t = fixed + bytes ÷ (HBM read × efficiency)``, a least-squares line through the sizes
  measured), for the dense weights and the KV cache.
* ``SMALL_KERNEL_S``: one small kernel (a norm, rotary, top-k) inside a CUDA graph.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

# The MXFP4 rows: today's kernels (for DeepSeek-V4.1 the T = 1 loops, then on Hopper the
# warp-specialized launches from 2 tokens per step, so no kernel change above, and on every other GPU
# the grouped warp-MMA loop up to 16 tokens and tl.dot above, its step between 16 and 17; for gpt-oss, whose
# biased SwiGLU-OAI experts those launches do not take, the grouped warp-MMA loop up to 48 tokens, its
# K tiles being halved, and tl.dot above, hence its step between 48 and 49), each T the median over
# the calls that ran those kernels there (`bench/expert_rows.py` derives them from the committed
# results; a test checks).
_MXFP4_RUN = ("BENCHMARKS.md, 'The routed-expert rows re-measured', run ER (one H200, 2026-12-04, six calls; "
              "gpt-oss at T = 48 / 49 / 64 once more on 2026-12-05): `python3 bench/gpu_residency.py --tokens ...` "
              "(all-HBM step, 13 layers) and `python3 bench/format_peer.py --formats gptoss-mxfp4 --tokens ...`, each T "
              "the median of the calls that ran those kernels there (bench/expert_rows.py)")
# Measured at two warp-specialized programs per SM, what split layers run; since run SH an H200's
# layers with every expert in HBM run four, 0.94-0.97x this row's step time at T = 2-96 (BENCHMARKS.md).
_MXFP4_HOPPER_RUN = ("BENCHMARKS.md, 'Run WH: the warp-specialized default on the H200' (one H200, 2026-12-06, call 2 = "
                     "bench/results/expert_rows_h200/call12_residency13_ws.json): `bash bench/pending_h200.sh dsrows` "
                     "(all-HBM step, 13 layers, T = 1 to 96); T = 1 the median with run ER's calls, which ran the same "
                     "T = 1 loops (bench/expert_rows.py)")
_DENSE_RUN = ("BENCHMARKS.md, 'The routed-expert rows re-measured', run ER call 11 (one H200, 2026-12-05, one call "
              "per format): `python3 bench/format_peer.py --formats qwen3-bf16 | dsv3-fp8 --tokens 1,2,4,6,16,32,96 "
              "--vllm-src ... --peer-configs ...` (bench/expert_rows.py)")


@dataclass(frozen=True)
class ExpertEfficiency:
    """The routed-expert layer's share of the HBM read limit, by tokens per step."""

    expert_format: str        # mxfp4 | bf16 | fp8-block (the catalog's expert dtype)
    model: str                # catalog model whose geometry was measured
    bytes_per_expert: int
    by_tokens: Mapping[int, float]
    source: str
    # The GPUs whose kernels the row measured, by compute capability major: 9 (Hopper, where the
    # runtime runs the warp-specialized launches), None (every GPU without a row of its own: the
    # runtime's kernels there, all measured on the H200)
    compute_capability_major: int | None = None

    @property
    def key(self) -> str:
        """The row's name in `bench/expert_rows.py`: the model, and `@sm90` for a Hopper-only row."""
        return self.model + (f"@sm{self.compute_capability_major}0" if self.compute_capability_major else "")

    def at(self, tokens: float) -> float:
        return log_interpolate(self.by_tokens, tokens)


EXPERT_EFFICIENCY: tuple[ExpertEfficiency, ...] = (
    ExpertEfficiency("mxfp4", "dsv41-flash-mxfp4", 18_800_640,
                     {1: 0.63, 2: 0.61, 3: 0.65, 4: 0.72, 6: 0.75, 16: 0.83, 24: 0.84, 32: 0.85, 96: 0.81},
                     _MXFP4_HOPPER_RUN, compute_capability_major=9),
    ExpertEfficiency("mxfp4", "dsv41-flash-mxfp4", 18_800_640,
                     {1: 0.63, 2: 0.61, 3: 0.65, 4: 0.69, 6: 0.72, 16: 0.77, 17: 0.74, 24: 0.76, 32: 0.77, 96: 0.78},
                     _MXFP4_RUN),
    ExpertEfficiency("mxfp4", "gpt-oss-120b", 13_236_480,
                     {1: 0.33, 2: 0.55, 3: 0.61, 4: 0.60, 6: 0.69, 16: 0.76, 17: 0.75, 24: 0.77, 32: 0.76, 48: 0.73,
                      49: 0.63, 64: 0.64, 96: 0.64},
                     _MXFP4_RUN),
    ExpertEfficiency("bf16", "qwen3-30b-a3b", 9_437_184,
                     {1: 0.63, 2: 0.70, 4: 0.74, 6: 0.84, 16: 0.91, 32: 0.93, 96: 0.86}, _DENSE_RUN),
    ExpertEfficiency("fp8-block", "deepseek-v3", 44_050_944,
                     {1: 0.81, 2: 0.87, 4: 0.94, 6: 0.93, 16: 0.98, 32: 0.98, 96: 0.96}, _DENSE_RUN),
)


def expert_efficiency(expert_format: str, model: str, bytes_per_expert: float,
                      compute_capability: str | None = None,
                      warp_specialized: bool = True) -> ExpertEfficiency | None:
    """The row measured on this catalog model, else the same format's row nearest in bytes per
    expert (log distance), else None (a format never measured); of a model's rows, the one for this
    GPU's kernels (`compute_capability`, "9.0"), else its row for every other GPU. The Hopper rows
    measured the warp-specialized launches, which take SiLU-gated experts without biases only:
    `warp_specialized` False (other experts) keeps the other GPUs' rows on Hopper too."""
    major = int(compute_capability.split(".")[0]) if compute_capability and warp_specialized else None
    rows = [r for r in EXPERT_EFFICIENCY if r.expert_format == expert_format
            and r.compute_capability_major in (None, major)]
    own = {r.model for r in rows if r.compute_capability_major is not None}
    rows = [r for r in rows if r.compute_capability_major is not None or r.model not in own]
    for row in rows:
        if row.model == model:
            return row
    if not rows:
        return None
    return min(rows, key=lambda r: abs(math.log(r.bytes_per_expert / bytes_per_expert)))


@dataclass(frozen=True)
class LaunchCost:
    """``t = fixed + bytes ÷ (HBM read × efficiency)`` per launch, by tokens per step."""

    what: str
    by_tokens: Mapping[int, tuple[float, float]]   # T -> (fixed seconds, efficiency)
    source: str

    def fixed(self, tokens: float) -> float:
        return log_interpolate({t: f for t, (f, _) in self.by_tokens.items()}, tokens)

    def efficiency(self, tokens: float) -> float:
        return log_interpolate({t: e for t, (_, e) in self.by_tokens.items()}, tokens)

    def seconds(self, nbytes: float, tokens: float, hbm_read: float) -> float:
        return self.fixed(tokens) + nbytes / (hbm_read * self.efficiency(tokens))


def log_interpolate(table: Mapping[int, float], x: float) -> float:
    """Linear in log(x) between measured points; the end values outside them."""
    keys = sorted(table)
    if x <= keys[0]:
        return table[keys[0]]
    if x >= keys[-1]:
        return table[keys[-1]]
    for lo, hi in zip(keys, keys[1:]):
        if lo <= x <= hi:
            share = math.log(x / lo) / math.log(hi / lo)
            return table[lo] + (table[hi] - table[lo]) * share
    raise AssertionError("unreachable")


_DECODE_SIM_RUN = ("BENCHMARKS.md, 'Decode step: full-depth simulation against the estimate', run EA (2026-12-03): "
                   "`PYTHONPATH=runtime python3 bench/decode_sim.py --out $OUT` (components)")

# cuBLAS bf16 GEMM [T, n] x [n, n]^T, n = 2,048 / 4,096 / 8,192, 16 distinct weights per graph;
# least-squares line through the three sizes (the HBM read limit of that run: 4,110 GB/s).
GEMM_BF16 = LaunchCost("bf16 GEMM (dense weights)", {
    1: (5.137e-6, 1.109), 8: (5.165e-6, 1.127), 32: (5.387e-6, 1.111)}, _DECODE_SIM_RUN)
# torch SDPA (flash backend) decode: T sequences x 8 KV heads x 8 query heads, head dim 128, KV
# cache of 1,024 and 8,192 tokens; the line through the two.
ATTENTION_DECODE = LaunchCost("SDPA flash decode (KV cache)", {
    1: (8.836e-6, 0.512), 8: (10.340e-6, 1.058), 32: (8.211e-6, 0.685)}, _DECODE_SIM_RUN)
# 400 launches of a one-row add + RMSNorm Triton kernel in one CUDA graph.
SMALL_KERNEL_S = 1.675e-6
SMALL_KERNEL_SOURCE = _DECODE_SIM_RUN
