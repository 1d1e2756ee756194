#!/usr/bin/env python3
"""What the grouped step's empty programs cost: one question, measured before any kernel changes.

A grouped step (T > 1) launches its two expert kernels on a fixed grid of ``min(T·top_k, E)``
slots per row tile — the most experts a step can touch, so that the launch captures into a CUDA
graph — and each program whose slot is past the step's real count (``num_slots``, known on the
GPU only) loads it and returns. At DeepSeek-V4.1 geometry and T = 96 that is 384 slots launched
for about 200 used: ~14,000 programs per layer that only start, read one word and exit, dispatched
after the real ones. This bench times the same CUDA-graph step two ways on the same routing:

* ``bound``: the runtime as it runs (the grid of ``min(T·top_k, E)`` slots);
* ``exact``: the grid cut to the routing's real slot count (read on the host before capture —
  not something the runtime can do inside a graph, where the routing changes per replay).

The ratio ``exact ÷ bound`` is the most a persistent slot loop (a grid sized to the GPU, each
program walking slots) could save on that step.

    python3 bench/empty_slots.py --tokens 16,32,96 --layers 8 --out $OUT/empty_slots.json

Run on one H100 80GB HBM3, 2026-12-05 (BENCHMARKS.md, run H1): exact ÷ bound 1.000 / 1.000 / 1.001
at T = 16 / 32 / 96 — the empty programs cost nothing measurable, and a persistent slot loop built to
remove them (timed beside the default with bench/peer_moe.py in the same machine session, commit
fccd45a) was no faster (0.997-1.019 with 64 or 128 slot rows, 1.08-1.11 with 32), so it was taken
out again. ``same_bits`` compares the two graphs' outputs; it read false at T = 16 and 32 and true at
96 in that run, not explained (a bench-only patch of the grid; the runtime's bit-identity is
tested elsewhere, split == unsplit on the GPU).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_residency as gr  # noqa: E402  (DSV41, DEV, random_layer, popularity, sample_routing, ...)
from expert_residency.core.banks import build_unsplit_layer  # noqa: E402
from expert_residency.gpu.experts import TritonMxfp4Experts  # noqa: E402
from expert_residency.gpu.graphs import CapturedStep  # noqa: E402


def exact_grid(ex: TritonMxfp4Experts, slots_per_layer: list[int]):
    """``ex._group`` that launches each layer's call on its real slot count (layer order = call order)."""
    original = ex._group
    calls = itertools.cycle(slots_per_layer)

    def group(*args, **kwargs):
        counts, _ = original(*args, **kwargs)
        return counts, next(calls)

    return group


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="16,32,96")
    ap.add_argument("--layers", type=int, default=8, help="layers per step (8 × 6.72 GiB: past L2)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--config", default="", help="KernelConfig fields, as bench/gpu_residency.py")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", default="empty_slots.json")
    args = ap.parse_args()
    dev, k, experts = gr.DEV, 6, 384
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    ckpts = [gr.random_layer(experts, gen) for _ in range(args.layers)]
    p = gr.popularity(experts, args.layers, args.seed)
    probe = TritonMxfp4Experts(gr.DSV41, experts, k, max_tokens=1, device=dev,
                               config=gr.parse_config(args.config))
    layers = []
    for ck in ckpts:
        probe.to_kernel_layout(ck)   # in place, once: both cases read the same banks
        layers.append(build_unsplit_layer(ck, layer_index=len(layers)))
    results = []
    for t in (int(s) for s in args.tokens.split(",")):
        ids_all, w_all = gr.sample_routing(p, 1, t, k, args.seed + t)
        ids, w = ids_all[0], w_all[0]                       # [layers, T, k]
        x = torch.randn(args.layers, t, gr.DSV41.hidden, generator=gen, device=dev).to(torch.bfloat16)
        slots = [int(ids[i].unique().numel()) for i in range(args.layers)]
        row = {"tokens": t, "slots_used_mean": statistics.fmean(slots), "slots_launched": min(t * k, experts)}
        graphs = {}
        for case in ("bound", "exact"):
            ex = TritonMxfp4Experts(gr.DSV41, experts, k, max_tokens=t, device=dev,
                                    config=gr.parse_config(args.config))
            if case == "exact":
                ex._group = exact_grid(ex, slots)
            graphs[case] = CapturedStep(gr.make_step(ex, layers, t), x, w, ids)
            row["config"] = ex.config.describe()
        times = {case: [] for case in graphs}
        for g in graphs.values():
            gr.time_fn(g.graph.replay, 1, warmup=3)
        for rep in range(args.reps):   # interleaved, the order flipped every rep
            for case, g in (list(graphs.items())[::1 if rep % 2 == 0 else -1]):
                times[case].append(gr.event_seconds(g.graph.replay))
        for case in graphs:
            row[f"{case}_us_per_layer_median"] = statistics.median(times[case]) / args.layers * 1e6
        outs = {case: g.out for case, g in graphs.items()}
        row["exact_over_bound"] = row["exact_us_per_layer_median"] / row["bound_us_per_layer_median"]
        row["same_bits"] = bool(torch.equal(outs["bound"], outs["exact"]))
        print(json.dumps(row), flush=True)
        results.append(row)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
