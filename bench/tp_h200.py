#!/usr/bin/env python3
"""TP=2 residency on ONE GPU: both tensor-parallel ranks' shards run one after the other on the same
H200 (an emulation of two ranks: no second GPU, no NCCL; the all-reduce is a bf16 torch add).

Model: DSv4.1-Flash routed experts (MXFP4 w13 4608x5120 + w2 5120x2304), 384 experts, top-6,
``--layers`` MoE layers. The full experts are random MXFP4 bytes in vLLM's layout; each rank's shard
is cut from them as vLLM 0.33 loads it (``expert_residency.parallel.tp``: gate and up halves each
sliced along the intermediate rows, w2 along its columns, scales with them; Ip = 1152), then put in
the kernel layout. One row map for both ranks: per layer the 295 most popular experts hot, 89 cold in
pinned host memory read in place.

Checks (eager): per rank, the Triton split layer == the same rank's unsplit layer bit for bit at
T = 1, 16, 96; the bf16 sum of the two ranks vs the single-GPU unsplit layer over whole experts,
against the rounding bound of ``parallel.tp.TP_SUM_TOLERANCE``.
Timing (CUDA graphs of a ``--layers`` step, new routing each replay, interleaved): per rank all-HBM
(its unsplit shard) vs usage-aware (its hot bank + pinned cold bank), T = 1 and 16, and the
single-GPU whole-expert layer for scale. Per-layer time = median step / layers.

    PYTHONPATH=runtime python3 bench/tp_h200.py --out results/          # writes tp_h200.json/.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from expert_residency.core.banks import (  # noqa: E402
    build_unsplit_layer,
    device_allocator,
    rehome_layer,  # noqa: E402
)
from expert_residency.gpu.experts import ExpertShape, KernelConfig, TritonMxfp4Experts  # noqa: E402
from expert_residency.gpu.graphs import CapturedStep  # noqa: E402
from expert_residency.gpu.pinned import pinned_view_allocator  # noqa: E402
from expert_residency.parallel import TP_SUM_TOLERANCE, TensorShard, shard_expert_tensors  # noqa: E402

H, I, E, K, HOT = 5120, 2304, 384, 6, 295
DEV = torch.device("cuda")


def popularity(layers: int, seed: int) -> np.ndarray:
    """p[layer, expert] ∝ exp(-4.94 (r/E)^1.01) over a seeded permutation (as bench/gpu_residency.py)."""
    rng = np.random.default_rng(seed)
    base = np.exp(-4.94 * (np.arange(E) / E) ** 1.01)
    base /= base.sum()
    p = np.empty((layers, E))
    for layer in range(layers):
        p[layer, rng.permutation(E)] = base
    return p


def routing(p: np.ndarray, steps: int, tokens: int, seed: int):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    probs = torch.tensor(p, dtype=torch.float32, device=DEV)
    layers = p.shape[0]
    ids = torch.empty(steps, layers, tokens, K, dtype=torch.int64, device=DEV)
    for layer in range(layers):
        draws = torch.multinomial(probs[layer].expand(steps * tokens, E).contiguous(), K, replacement=False,
                                  generator=gen)
        ids[:, layer] = draws.view(steps, tokens, K)
    weights = torch.softmax(torch.randn(steps, layers, tokens, K, generator=gen, device=DEV), dim=-1)
    x = torch.randn(steps, layers, tokens, H, generator=gen, device=DEV).to(torch.bfloat16)
    return x, weights, ids


def random_layer(gen: torch.Generator) -> dict[str, torch.Tensor]:
    shapes = {"w13_weight": (E, 2 * I, H // 2), "w13_weight_scale": (E, 2 * I, H // 32),
              "w2_weight": (E, H, I // 2), "w2_weight_scale": (E, H, I // 32)}
    out = {}
    for name, shape in shapes.items():
        t = torch.empty(shape, dtype=torch.uint8, device=DEV)
        t.random_(117, 126, generator=gen) if name.endswith("scale") else t.random_(0, 256, generator=gen)
        out[name] = t
    return out


def event_seconds(fn) -> float:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3


def make_step(ex: TritonMxfp4Experts, layers, tokens: int):
    outs = torch.empty(len(layers), tokens, H, dtype=torch.bfloat16, device=DEV)

    def step(x, w, ids):
        for i, layer in enumerate(layers):
            ex.forward(layer, x[i], w[i], ids[i], out=outs[i])
        return outs

    return step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    tp = 2
    cfg = KernelConfig()
    gen = torch.Generator(device=DEV).manual_seed(args.seed)
    p = popularity(args.layers, args.seed)
    hot_cold = []
    for layer in range(args.layers):
        order = [int(e) for e in np.argsort(-p[layer], kind="stable")]
        hot_cold.append((sorted(order[:HOT]), sorted(order[HOT:])))
    full_layers, ranks = [], {r: {"all_hbm": [], "usage_aware": []} for r in range(tp)}
    ex_rank = TritonMxfp4Experts(ExpertShape(H, I // tp), E, K, max_tokens=96, device=DEV, config=cfg)
    ex_full = TritonMxfp4Experts(ExpertShape(H, I), E, K, max_tokens=96, device=DEV, config=cfg)
    cold_bytes = 0
    for layer in range(args.layers):
        full = random_layer(gen)   # vLLM's layout
        hot, cold = hot_cold[layer]
        for r in range(tp):
            shard = shard_expert_tensors(full, TensorShard(tp, r, I))
            ex_rank.to_kernel_layout(shard)
            ranks[r]["all_hbm"].append(build_unsplit_layer(shard, layer_index=layer))
            split = rehome_layer(dict(shard), hot, cold, layer_index=layer, hot_alloc=device_allocator(DEV),
                                 cold_alloc=pinned_view_allocator(DEV))
            cold_bytes += split.bank_bytes().cold
            ranks[r]["usage_aware"].append(split)
        ex_full.to_kernel_layout(full)
        full_layers.append(build_unsplit_layer(full, layer_index=layer))
    torch.cuda.synchronize()

    # -- checks (eager) --------------------------------------------------------------------
    checks = []
    for tokens in (1, 16, 96):
        x, w, ids = routing(p, 1, tokens, args.seed + tokens)
        for layer in range(args.layers):
            xs, ws, ids_l = x[0, layer], w[0, layer], ids[0, layer]
            outs, picks = [], []
            equal = []
            for r in range(tp):
                y_split = ex_rank.forward(ranks[r]["usage_aware"][layer], xs, ws, ids_l).clone()
                y_unsplit = ex_rank.forward(ranks[r]["all_hbm"][layer], xs, ws, ids_l).clone()
                picks.append(ex_rank.pick_outputs(ranks[r]["all_hbm"][layer], xs, ids_l).clone())
                equal.append(bool(torch.equal(y_split, y_unsplit)))
                outs.append(y_split)
            one = ex_full.forward(full_layers[layer], xs, ws, ids_l).clone()
            q_one = ex_full.pick_outputs(full_layers[layer], xs, ids_l).clone()
            summed = outs[0] + outs[1]          # bf16, rank order: what a two-rank all-reduce adds
            wf = ws.float().unsqueeze(-1)
            bound = 2.0 ** -8 * (sum((wf * q.float().abs()).sum(1) + y.float().abs() for q, y in zip(picks, outs))
                                 + (wf * q_one.float().abs()).sum(1) + one.float().abs()
                                 + (tp - 1) * sum(y.float().abs() for y in outs)) + 1e-30
            diff = (summed.float() - one.float()).abs()
            rel = float((summed.float() - one.float()).norm() / one.float().norm())
            checks.append({"tokens": tokens, "layer": layer, "split_equals_unsplit": equal,
                           "sum_bit_identical": bool(torch.equal(summed, one)),
                           "sum_within_bound": bool((diff <= bound).all()), "max_abs_diff": float(diff.max()),
                           "max_bound": float(bound.max()), "rel_l2": rel,
                           "finite": bool(torch.isfinite(one.float()).all())})

    # -- timing (graphs) -------------------------------------------------------------------
    timing = {}
    for tokens in (1, 16):
        x, w, ids = routing(p, args.steps, tokens, 1000 + tokens)
        graphs = {}
        for r in range(tp):
            for case in ("all_hbm", "usage_aware"):
                graphs[f"rank{r}_{case}"] = CapturedStep(make_step(ex_rank, ranks[r][case], tokens), x[0], w[0], ids[0])
        graphs["one_gpu_whole_experts"] = CapturedStep(make_step(ex_full, full_layers, tokens), x[0], w[0], ids[0])
        times = {name: [] for name in graphs}
        for s in range(args.steps):
            for name, g in graphs.items():
                g.load(x[s], w[s], ids[s])
                times[name].append(event_seconds(g.graph.replay))
        med = {name: statistics.median(v) / args.layers * 1e6 for name, v in times.items()}
        timing[tokens] = {"per_layer_us": med,
                          "usage_aware_over_all_hbm": {r: med[f"rank{r}_usage_aware"] / med[f"rank{r}_all_hbm"]
                                                       for r in range(tp)},
                          "tp2_emulated_layer_us": {c: max(med[f"rank{r}_{c}"] for r in range(tp))
                                                    for c in ("all_hbm", "usage_aware")}}
    result = {"machine": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": __import__("triton").__version__, "kernel": cfg.describe(),
              "emulation": "one GPU runs both TP ranks' shards one after the other; no NCCL, the all-reduce "
                           "is a bf16 torch add; per-layer times exclude any all-reduce",
              "layers": args.layers, "hot": HOT, "cold": E - HOT, "cold_bytes_pinned_per_rank": cold_bytes // tp,
              "tolerance": TP_SUM_TOLERANCE, "checks": checks, "timing": timing}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tp_h200.json").write_text(json.dumps(result, indent=1))
    lines = [f"TP=2 emulated on one {result['machine']} ({result['kernel']}), DSv4.1-Flash MXFP4 shards, "
             f"{args.layers} layers, hot {HOT} / cold {E - HOT}; {result['emulation']}", "",
             "| T | rank | all-HBM µs/layer | usage-aware µs/layer | ratio |", "|---|---|---|---|---|"]
    for tokens, t in timing.items():
        for r in range(tp):
            lines.append(f"| {tokens} | {r} | {t['per_layer_us'][f'rank{r}_all_hbm']:.1f} | "
                         f"{t['per_layer_us'][f'rank{r}_usage_aware']:.1f} | {t['usage_aware_over_all_hbm'][r]:.3f} |")
        lines.append(f"| {tokens} | one GPU, whole experts | {t['per_layer_us']['one_gpu_whole_experts']:.1f} | | |")
    ok = all(all(c["split_equals_unsplit"]) and c["sum_within_bound"] and c["finite"] for c in checks)
    lines += ["", f"checks: {'all pass' if ok else 'FAILED'} — per-rank split == unsplit "
              f"{all(all(c['split_equals_unsplit']) for c in checks)}, sum within bound "
              f"{all(c['sum_within_bound'] for c in checks)}, sum bit-identical to one GPU "
              f"{sum(c['sum_bit_identical'] for c in checks)}/{len(checks)}, max rel L2 "
              f"{max(c['rel_l2'] for c in checks):.2e}"]
    (args.out / "tp_h200.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
