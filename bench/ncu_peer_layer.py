#!/usr/bin/env python3
"""One DeepSeek-V4.1 MXFP4 layer (384 experts, all in HBM, the benches' skewed routing at T tokens)
run eagerly a few times by one side — ours, or Humming as vLLM 0.33 runs it on SM90 — for Nsight
Compute to read the two sides' hardware counters on the same routing:

    for side in ours humming; do
      ncu --clock-control none --kernel-name-base function -k regex:"$( [ $side = ours ] && echo '^w13|^w2' || echo '^humming' )" \
          --launch-skip 2 --launch-count 2 --section SpeedOfLight --section LaunchStats --section Occupancy \
          --section SchedulerStats --section WarpStateStats \
          --metrics dram__bytes_read.sum,smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
          python3 bench/ncu_peer_layer.py --side $side --tokens 96
    done

(``bench/ncu_peer.sh`` runs exactly that for T = 16 and 96.) Each run launches the layer four times:
the first two compile and warm up, so ``--launch-skip 2 --launch-count 2`` reads the third run's
two GEMM launches (ours: w13 + SwiGLU, w2 + finalize; Humming: its w13 and w2 ``humming`` kernels —
its input quantization, activation and ``moe_fused_mul_sum`` are other kernels, not read). What it
answers: where each side's weight stream stands against DRAM (throughput, achieved occupancy, warp
instructions per byte read, why warps stall), so the gap between them has a measured cause.
Needs ``humming-kernels`` and the unpacked vLLM 0.33.0 wheel's glue (as ``bench/peer_moe.py``).
Written 2026-12-05 for the next H200 session; not yet run on a GPU (none was lent that day)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_residency as gr  # noqa: E402  (DSV41, random_layer, popularity, sample_routing, parse_config)
from expert_residency.core.banks import build_unsplit_layer  # noqa: E402
from expert_residency.gpu.experts import TritonMxfp4Experts  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--side", choices=("ours", "humming"), required=True)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--experts", type=int, default=384)
    ap.add_argument("--top-k", type=int, default=6)
    ap.add_argument("--swiglu-limit", type=float, default=10.0, help="DeepSeek-V4's SiLU clamp (both sides)")
    ap.add_argument("--config", default="", help="KernelConfig fields for ours")
    ap.add_argument("--vllm-src", default=str(ROOT / ".cache/vllm-0.33.0/vllm"))
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    dev, t, k = torch.device("cuda"), args.tokens, args.top_k
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    ckpt = gr.random_layer(args.experts, gen)
    expert_bytes = sum(v[0].numel() * v.element_size() for v in ckpt.values())   # 18,800,640 B at DSv4.1
    p = gr.popularity(args.experts, 1, args.seed)
    ids_all, w_all = gr.sample_routing(p, 1, t, k, args.seed + t)
    ids, w = ids_all[0, 0], w_all[0, 0]
    x = torch.randn(t, gr.DSV41.hidden, generator=gen, device=dev).to(torch.bfloat16)
    out = torch.empty(t, gr.DSV41.hidden, dtype=torch.bfloat16, device=dev)
    limit = args.swiglu_limit or None
    if args.side == "ours":
        ex = TritonMxfp4Experts(gr.DSV41, args.experts, k, max_tokens=t, device=dev,
                                config=gr.parse_config(args.config), swiglu_limit=limit)
        ex.to_kernel_layout(ckpt)
        layer = build_unsplit_layer(ckpt, layer_index=0)
        describe = ex.config.describe()

        def run() -> None:
            ex.forward(layer, x, w, ids, out=out)
    else:
        import humming_peer
        glue = humming_peer.load_vllm_glue(Path(args.vllm_src))
        peer = humming_peer.HummingPeer(glue, ckpt, k, limit, t, shapes_m=[t * k])
        describe = json.dumps(peer.describe(), default=str)

        def run() -> None:
            peer.layer(x, w, ids, out)
    for _ in range(4):
        run()
    torch.cuda.synchronize()
    unique = int(ids.unique().numel())
    print(json.dumps({"side": args.side, "tokens": t, "unique_experts": unique,
                      "weight_bytes": unique * expert_bytes,
                      "out_finite": bool(torch.isfinite(out.float()).all())}), flush=True)
    print("config", describe, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
