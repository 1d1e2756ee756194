#!/usr/bin/env python3
"""One T=1 MoE layer (DSv4.1 experts, 6 distinct picks, all in HBM) launched eagerly a few times,
for Nsight Compute to read the hardware counters of its two kernels (w13+SwiGLU, w2+finalize):

    ncu --clock-control none -k regex:'w13|w2' --launch-skip 4 --launch-count 2 \
        --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
        --section ComputeWorkloadAnalysis --section Occupancy \
        --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,regex:sm__pipe_.*_cycles_active.avg.pct_of_peak_sustained_active \
        python3 bench/kernel_ncu_t1.py

(``bench/kernel_h200.sh ncu`` runs exactly that.) ``--tokens T --experts E`` instead: one grouped step of T
tokens, top-6 drawn uniformly over E experts (each expert's weights random, all in HBM), for the
grouped kernels (``-k regex:'w13|w2|group|finalize'``). What it answers: whether the T=1 layer waits on
HBM, on instruction issue, or on latency (issue slots idle with warps stalled), and with the
metrics: why the warps stall (cycles per issued instruction by reason) and how busy each pipe is."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from expert_residency.core.banks import build_unsplit_layer  # noqa: E402
from expert_residency.gpu.experts import ExpertShape, TritonMxfp4Experts  # noqa: E402
from gpu_residency import parse_config  # noqa: E402  (the benches' one --config parser)

DSV41 = ExpertShape(hidden=5120, intermediate=2304)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=1, help="tokens in the step (1: the T=1 schedule)")
    ap.add_argument("--experts", type=int, default=8, help="experts in the layer (T=1 picks experts 0..5)")
    ap.add_argument("--config", default="", help="KernelConfig fields, e.g. max_registers_large=0")
    args = ap.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1)
    e, k, h, i, t = args.experts, 6, DSV41.hidden, DSV41.intermediate, args.tokens

    def u8(*dims, lo=0, hi=256):
        return torch.randint(lo, hi, dims, generator=gen, device=dev, dtype=torch.int32).to(torch.uint8)

    full = {"w13_weight": u8(e, 2 * i, h // 2), "w13_weight_scale": u8(e, 2 * i, h // 32, lo=117, hi=126),
            "w2_weight": u8(e, h, i // 2), "w2_weight_scale": u8(e, h, i // 32, lo=117, hi=126)}
    config = parse_config(args.config)
    ex = TritonMxfp4Experts(DSV41, e, k, max_tokens=t, device=dev, config=config)
    ex.to_kernel_layout(full)
    layer = build_unsplit_layer(full, layer_index=0)
    x = torch.randn(t, h, generator=gen, device=dev).to(torch.bfloat16)
    if t == 1:
        ids = torch.tensor([[0, 1, 2, 3, 4, 5]], device=dev)
    else:  # k distinct experts per token, uniform over e
        ids = torch.rand(t, e, generator=gen, device=dev).argsort(dim=1)[:, :k]
    w = torch.softmax(torch.randn(t, k, generator=gen, device=dev), dim=1)
    for _ in range(4):
        out = ex.forward(layer, x, w, ids)
    torch.cuda.synchronize()
    print("config", config.describe(), "tokens", t, "unique experts", int(ids.unique().numel()),
          "out finite", bool(torch.isfinite(out.float()).all()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
