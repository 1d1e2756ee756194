#!/usr/bin/env python3
"""TP=2 residency on two GPUs over NCCL: one process per GPU, each with its own shard and banks.

Ready for a machine with two GPUs (not yet run: only one-GPU machines were lent so far). NVLink
multicast stays off: NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are set before the
process group starts, and nothing here calls cuMulticastCreate.

Per rank (DSv4.1-Flash MXFP4 geometry as bench/tp_h200.py; the full experts are generated from one
seed on every GPU, so both ranks cut their shards from the same bytes): its shard in vLLM's layout
(``expert_residency.parallel.tp``), the kernel layout, a hot bank in its HBM and a cold bank in
pinned host memory read in place through a device view; the Triton split layer.

Checks: per rank split == unsplit bit for bit (T = 1, 16, 96); after ``all_reduce`` (bf16, NCCL)
the sum vs rank 0's single-GPU unsplit layer over whole experts, against the bound of
``parallel.tp.TP_SUM_TOLERANCE`` (reported bit-identical or not: the reduction order differs).
Timing (CUDA graphs, barrier before each replay, T = 1 and 16): per-layer time of all-HBM vs
usage-aware per rank, and the all-reduce of one layer's output alone.

    PYTHONPATH=runtime python3 bench/tp_nccl.py --out results/            # two GPUs
    TRITON_INTERPRET=1 PYTHONPATH=runtime python3 bench/tp_nccl.py --cpu-dry-run   # logic only, gloo
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ["NCCL_NVLS_ENABLE"] = "0"                 # no NVLink SHARP / multicast objects
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"  # torch symmetric memory without multicast

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tp_h200 as geo  # noqa: E402  (geometry, routing and layer generation shared with the one-GPU run)
from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer  # noqa: E402
from expert_residency.gpu.experts import ExpertShape, KernelConfig, TritonMxfp4Experts  # noqa: E402
from expert_residency.parallel import TP_SUM_TOLERANCE, TensorShard, shard_expert_tensors  # noqa: E402

TP = 2


def rank_main(rank: int, args: argparse.Namespace, init: str, out_dir: str) -> None:
    dry = args.cpu_dry_run
    if dry:
        geo.H, geo.I, geo.E, geo.K, geo.HOT = 256, 256, 8, 2, 5
        dev = torch.device("cpu")
    else:
        dev = torch.device("cuda", rank)
        torch.cuda.set_device(dev)
    geo.DEV = dev
    dist.init_process_group("gloo" if dry else "nccl", init_method=init, rank=rank, world_size=TP)
    try:
        _run_rank(rank, args, dev, dry, out_dir)
    finally:
        dist.destroy_process_group()


def _run_rank(rank: int, args, dev: torch.device, dry: bool, out_dir: str) -> None:
    H, I, E, K, HOT = geo.H, geo.I, geo.E, geo.K, geo.HOT
    cfg = KernelConfig()
    gen = torch.Generator(device=dev).manual_seed(args.seed)   # same bytes on every rank
    p = geo.popularity(args.layers, args.seed)
    ex = TritonMxfp4Experts(ExpertShape(H, I // TP), E, K, max_tokens=96, device=dev, config=cfg)
    ex_full = TritonMxfp4Experts(ExpertShape(H, I), E, K, max_tokens=96, device=dev, config=cfg) if rank == 0 else None
    if dry:
        cold_alloc = host_allocator()
    else:
        from expert_residency.gpu.pinned import pinned_view_allocator
        cold_alloc = pinned_view_allocator(dev)
    unsplit, split, whole = [], [], []
    for layer in range(args.layers):
        full = geo.random_layer(gen)
        order = [int(e) for e in np.argsort(-p[layer], kind="stable")]
        hot, cold = sorted(order[:HOT]), sorted(order[HOT:])     # one row map, the same on both ranks
        shard = shard_expert_tensors(full, TensorShard(TP, rank, I))
        ex.to_kernel_layout(shard)
        unsplit.append(build_unsplit_layer(shard, layer_index=layer))
        split.append(rehome_layer(dict(shard), hot, cold, layer_index=layer, hot_alloc=device_allocator(dev),
                                  cold_alloc=cold_alloc))
        if rank == 0:
            ex_full.to_kernel_layout(full)
            whole.append(build_unsplit_layer(full, layer_index=layer))
        del full
    cold_on = str(next(iter(split[0].cold.tensors.values())).device)
    checks = []
    for tokens in (1, 16, 96):
        x, w, ids = geo.routing(p, 1, min(tokens, 4) if dry else tokens, args.seed + tokens)
        for layer in range(args.layers):
            xs, ws, il = x[0, layer], w[0, layer], ids[0, layer]
            y = ex.forward(split[layer], xs, ws, il).clone()
            equal = bool(torch.equal(y, ex.forward(unsplit[layer], xs, ws, il)))
            q = ex.pick_outputs(unsplit[layer], xs, il).clone()
            gathered_y = [torch.empty_like(y) for _ in range(TP)]
            gathered_q = [torch.empty_like(q) for _ in range(TP)]
            dist.all_gather(gathered_y, y)
            dist.all_gather(gathered_q, q)
            reduced = y.clone()
            dist.all_reduce(reduced)                                  # bf16, as vLLM's TP all-reduce
            flags = torch.tensor([int(equal)], device=dev)
            dist.all_reduce(flags, op=dist.ReduceOp.MIN)
            if rank == 0:
                one = ex_full.forward(whole[layer], xs, ws, il).clone()
                q_one = ex_full.pick_outputs(whole[layer], xs, il).clone()
                wf = ws.float().unsqueeze(-1)
                bound = 2.0 ** -8 * (sum((wf * qq.float().abs()).sum(1) + yy.float().abs()
                                         for qq, yy in zip(gathered_q, gathered_y))
                                     + (wf * q_one.float().abs()).sum(1) + one.float().abs()
                                     + (TP - 1) * sum(yy.float().abs() for yy in gathered_y)) + 1e-30
                diff = (reduced.float() - one.float()).abs()
                checks.append({"tokens": int(xs.shape[0]), "layer": layer,
                               "split_equals_unsplit_all_ranks": bool(flags.item()),
                               "sum_bit_identical": bool(torch.equal(reduced, one)),
                               "sum_within_bound": bool((diff <= bound).all()),
                               "max_abs_diff": float(diff.max()), "max_bound": float(bound.max()),
                               "rel_l2": float((reduced.float() - one.float()).norm() / one.float().norm())})
    timing = {} if dry else _timing(rank, args, ex, unsplit, split, p, dev)
    if rank == 0:
        result = {"world": TP, "backend": dist.get_backend(), "cold_bank_device": cold_on,
                  "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
                  "gpus": [] if dry else [torch.cuda.get_device_name(i) for i in range(TP)],
                  "kernel": cfg.describe(), "tolerance": TP_SUM_TOLERANCE, "checks": checks, "timing": timing}
        (Path(out_dir) / "tp_nccl.json").write_text(json.dumps(result, indent=1))


def _timing(rank, args, ex, unsplit, split, p, dev) -> dict:
    from expert_residency.gpu.graphs import CapturedStep
    out = {}
    for tokens in (1, 16):
        x, w, ids = geo.routing(p, args.steps, tokens, 1000 + tokens)
        graphs = {"all_hbm": CapturedStep(geo.make_step(ex, unsplit, tokens), x[0], w[0], ids[0]),
                  "usage_aware": CapturedStep(geo.make_step(ex, split, tokens), x[0], w[0], ids[0])}
        buf = torch.zeros(tokens, geo.H, dtype=torch.bfloat16, device=dev)
        times = {"all_hbm": [], "usage_aware": [], "all_reduce": []}
        for s in range(args.steps):
            for name, g in graphs.items():
                g.load(x[s], w[s], ids[s])
                dist.barrier()
                torch.cuda.synchronize()
                times[name].append(geo.event_seconds(g.graph.replay))
            dist.barrier()
            torch.cuda.synchronize()
            times["all_reduce"].append(geo.event_seconds(lambda: dist.all_reduce(buf)))
        med = {k: statistics.median(v) for k, v in times.items()}
        per_layer = {"all_hbm": med["all_hbm"] / args.layers * 1e6, "usage_aware": med["usage_aware"] / args.layers * 1e6,
                     "all_reduce_one_layer": med["all_reduce"] * 1e6}
        gathered = [None] * TP
        dist.all_gather_object(gathered, per_layer)
        out[tokens] = {f"rank{r}": g for r, g in enumerate(gathered)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="tiny geometry, gloo, host banks, no graphs: checks the script's logic without GPUs")
    args = ap.parse_args()
    if not args.cpu_dry_run and torch.cuda.device_count() < TP:
        print(f"needs {TP} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(args, "file://" + os.path.join(tmp, "rdzv"), str(args.out)), nprocs=TP, join=True)
    result = json.loads((args.out / "tp_nccl.json").read_text())
    print(json.dumps(result, indent=1))
    ok = all(c["split_equals_unsplit_all_ranks"] and c["sum_within_bound"] for c in result["checks"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
