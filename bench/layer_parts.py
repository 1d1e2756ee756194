#!/usr/bin/env python3
"""Where an MXFP4 layer's time goes, launch by launch: bf16-activation layers (``gpu.experts``;
``--bf16``: configs, each on its own layout) and FP8-activation ones (``gpu.experts_w4a8``;
``--w4a8``: configs sharing one layout) built from the same DeepSeek-V4.1 layers (384 experts,
top-6, all in HBM, uniform random routing), each kernel's mean duration from the CUDA profiler
(eager steps: kernel times only, launch gaps excluded; under programmatic dependent launch a
kernel's time includes its wait for the one before, so pass ``pdl=0`` for clean per-kernel
figures), and each expert launch's read rate against the HBM read limit measured in the same
process.

    python3 bench/layer_parts.py --tokens 6,16,96 --out $OUT      # a CUDA GPU (sm_90)
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "bench"))

import gpu_residency as gr  # noqa: E402
from expert_residency.core.banks import build_unsplit_layer  # noqa: E402
from expert_residency.gpu.experts import TritonMxfp4Experts  # noqa: E402
from expert_residency.gpu.experts_w4a8 import TritonW4a8Experts  # noqa: E402

EXPERT_KERNELS = ("w13", "w2")   # kernels whose names start so read expert weights


def kernel_times(step, steps: int) -> dict[str, float]:
    """Mean µs per step of each kernel name over ``steps`` profiled calls of ``step``."""
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    total: dict[str, float] = collections.defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            total[ev.name] += ev.device_time / steps
    return dict(total)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="6,16,96")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--bf16", default="bf16:", help="';'-separated 'label:k=v,...' KernelConfig fields of "
                                                     "bf16-activation layers (each its own layout)")
    ap.add_argument("--w4a8", default="w4a8:", help="';'-separated 'label:k=v,...' KernelConfig fields of "
                                                     "FP8-activation layers (tokens per tile, warps, stages)")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    args = ap.parse_args()
    dev, shape, experts, k = gr.DEV, gr.DSV41, 384, 6
    tokens = [int(t) for t in args.tokens.split(",")]
    gen = torch.Generator(device=dev).manual_seed(7)
    runs, layers, w4a8_layers = {}, {}, []
    for item in filter(None, (c.strip() for c in args.bf16.split(";"))):
        label, fields = item.split(":", 1)
        runs[label] = TritonMxfp4Experts(shape, experts, k, max_tokens=max(tokens), device=dev,
                                         config=gr.parse_config(fields), swiglu_limit=10.0)
        layers[label] = []
    for item in filter(None, (c.strip() for c in args.w4a8.split(";"))):
        label, fields = item.split(":", 1)
        runs[label] = TritonW4a8Experts(shape, experts, k, max_tokens=max(tokens), device=dev,
                                        config=gr.parse_config(fields), swiglu_limit=10.0)
        layers[label] = w4a8_layers   # one FP8-activation layout for every FP8 config (same tiles)
    for i in range(args.layers):
        ckpt = gr.random_layer(experts, gen)
        fp8 = [kx for kx in runs.values() if isinstance(kx, TritonW4a8Experts)]
        if fp8:
            copy = {n: t.clone() for n, t in ckpt.items()}
            fp8[0].to_kernel_layout(copy)
            w4a8_layers.append(build_unsplit_layer(copy, layer_index=i))
        for label, kx in runs.items():
            if not isinstance(kx, TritonW4a8Experts):
                copy = {n: t.clone() for n, t in ckpt.items()}
                kx.to_kernel_layout(copy)
                layers[label].append(build_unsplit_layer(copy, layer_index=i))
        del ckpt
    limit = gr.hbm_read_limit()["GBps"]
    print(f"HBM read limit {limit:.0f} GB/s; {torch.cuda.get_device_name(0)}", flush=True)
    result = {"hbm_read_GBps": limit, "rows": []}
    for t in tokens:
        ids = torch.stack([torch.stack([torch.randperm(experts, generator=gen, device=dev)[:k] for _ in range(t)])
                           for _ in range(args.layers)])
        w = torch.softmax(torch.randn(args.layers, t, k, generator=gen, device=dev), -1)
        x = torch.randn(args.layers, t, shape.hidden, generator=gen, device=dev).to(torch.bfloat16)
        uniq = sum(len(torch.unique(ids[i])) for i in range(args.layers)) / args.layers
        w13_bytes = uniq * 2 * shape.intermediate * (shape.hidden // 2 + shape.hidden // 32)
        w2_bytes = uniq * shape.hidden * (shape.intermediate // 2 + shape.intermediate // 32)
        for name, kx in runs.items():
            def step(kx=kx, name=name):
                for i in range(args.layers):
                    kx.forward(layers[name][i], x[i], w[i], ids[i])
            times = {n: us / args.layers for n, us in kernel_times(step, args.steps).items()}
            row = {"T": t, "layer": name, "us_total": sum(times.values()), "kernels": times}
            for n, us in times.items():
                nbytes = w13_bytes if n.startswith("w13") else w2_bytes if n.startswith("w2") else 0
                if nbytes:
                    row.setdefault("pct_hbm", {})[n] = 100 * nbytes / (us * 1e-6) / 1e9 / limit
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "layer_parts.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
