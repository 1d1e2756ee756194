#!/usr/bin/env python3
"""One T=1 MoE layer (DSv4.1 experts, 6 distinct picks, all in HBM) launched eagerly a few times,
for Nsight Compute to read the hardware counters of its two kernels (w13+SwiGLU, w2+finalize):

    ncu --clock-control none -k regex:'w13|w2' --launch-skip 4 --launch-count 2 \
        --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
        --section ComputeWorkloadAnalysis --section Occupancy \
        --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,regex:sm__pipe_.*_cycles_active.avg.pct_of_peak_sustained_active \
        python3 bench/kernel_ncu_t1.py

(``bench/kernel_h200.sh ncu`` runs exactly that.) What it answers: whether the T=1 layer waits on
HBM, on instruction issue, or on latency (issue slots idle with warps stalled), and with the
metrics: why the warps stall (cycles per issued instruction by reason) and how busy each pipe is."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from expert_residency.core.banks import build_unsplit_layer  # noqa: E402
from expert_residency.gpu.experts import ExpertShape, KernelConfig, TritonMxfp4Experts  # noqa: E402

DSV41 = ExpertShape(hidden=5120, intermediate=2304)


def main() -> int:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1)
    e, k, h, i = 8, 6, DSV41.hidden, DSV41.intermediate

    def u8(*dims, lo=0, hi=256):
        return torch.randint(lo, hi, dims, generator=gen, device=dev, dtype=torch.int32).to(torch.uint8)

    full = {"w13_weight": u8(e, 2 * i, h // 2), "w13_weight_scale": u8(e, 2 * i, h // 32, lo=117, hi=126),
            "w2_weight": u8(e, h, i // 2), "w2_weight_scale": u8(e, h, i // 32, lo=117, hi=126)}
    ex = TritonMxfp4Experts(DSV41, e, k, max_tokens=1, device=dev, config=KernelConfig())
    ex.to_kernel_layout(full)
    layer = build_unsplit_layer(full, layer_index=0)
    x = torch.randn(1, h, generator=gen, device=dev).to(torch.bfloat16)
    ids = torch.tensor([[0, 1, 2, 3, 4, 5]], device=dev)
    w = torch.softmax(torch.randn(1, k, generator=gen, device=dev), dim=1)
    for _ in range(4):
        out = ex.forward(layer, x, w, ids)
    torch.cuda.synchronize()
    print("config", KernelConfig().describe(), "out finite", bool(torch.isfinite(out.float()).all()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
