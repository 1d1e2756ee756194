"""Two (or more) processes, one TP rank each, over torch.distributed: each rank re-homes its shard
of one MoE layer with the shared row map, checks split == unsplit bit for bit, all-reduces its
output, and rank 0 compares the sum with one process holding whole experts (``TP_SUM_TOLERANCE``).

CPU: ``python -m expert_residency.parallel.selfcheck --world 2`` (gloo, torch reference experts).
The same per-rank code runs with ``--backend nccl --device cuda`` (one GPU per rank); bench/tp_nccl.py
is the GPU benchmark with the Triton experts. Prints one JSON line; exit 1 on a failed check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from ..core.banks import build_unsplit_layer, device_allocator, host_allocator
from ..core.formats_ref import mxfp4_per_pick
from ..core.split import residency_forward, split_invoke
from ..mxfp4 import quantize_mxfp4
from .tp import TensorShard, rehome_tp_rank, unsplit_tp_rank

HOT, COLD = [5, 1, 7, 0, 3], [2, 6, 4]


def make_case(e: int = 8, h: int = 64, i: int = 128, t: int = 5, k: int = 2, seed: int = 3):
    """Deterministic MXFP4 experts and routing (every process builds the same bytes)."""
    g = torch.Generator().manual_seed(seed)
    p13, s13 = quantize_mxfp4(torch.randn(e, 2 * i, h, generator=g) * 0.05)
    p2, s2 = quantize_mxfp4(torch.randn(e, h, i, generator=g) * 0.05)
    full = {"w13_weight": p13, "w13_weight_scale": s13, "w2_weight": p2, "w2_weight_scale": s2}
    x = torch.randn(t, h, generator=g).bfloat16()
    weights, ids = torch.topk(torch.softmax(torch.randn(t, e, generator=g), -1), k)
    ids[0] = torch.tensor([2, 6])[:k]
    return full, x, weights, ids


def rank_main(rank: int, world: int, backend: str, init_method: str, out_dir: str, device: str) -> None:
    """One TP rank: its shard, its banks, split == unsplit, all-reduce; writes rank<r>.pt."""
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)
    try:
        dev = torch.device(f"cuda:{rank}" if device == "cuda" else "cpu")
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        full, x, weights, ids = make_case()
        i = full["w2_weight"].shape[2] * 2
        shard = TensorShard(world, rank, i)
        split = rehome_tp_rank(full, HOT, COLD, shard, layer_index=0, hot_alloc=device_allocator(dev),
                               cold_alloc=host_allocator(pin=dev.type == "cuda"))
        if dev.type == "cuda":   # the torch reference reads device tensors; the cold bank moves over
            split.cold.tensors = {n: v.to(dev) for n, v in split.cold.tensors.items()}
        unsplit = unsplit_tp_rank({n: v.to(dev) for n, v in full.items()}, shard, layer_index=0)
        fn = mxfp4_per_pick()
        xd, wd, idd = x.to(dev), weights.to(dev), ids.to(dev)
        y_split = residency_forward(split, xd, wd, idd, fn, pick_dtype=torch.bfloat16)
        y_unsplit = residency_forward(unsplit, xd, wd, idd, fn, pick_dtype=torch.bfloat16)
        picks = split_invoke(unsplit, xd, idd, fn, out_dtype=torch.bfloat16)
        reduced = y_split.clone()
        dist.all_reduce(reduced)            # bf16, as vLLM's tensor_model_parallel_all_reduce
        torch.save({"rank": rank, "split_equals_unsplit": bool(torch.equal(y_split, y_unsplit)),
                    "y": y_split.cpu(), "picks": picks.cpu(), "reduced": reduced.cpu(),
                    "hot_rows": split.hot.num_rows, "cold_rows": split.cold.num_rows,
                    "cold_device": str(next(iter(split.cold.tensors.values())).device)},
                   Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def compare(out_dir: str, world: int) -> dict:
    """Rank results vs one process holding whole experts (torch reference, CPU)."""
    ranks = [torch.load(Path(out_dir) / f"rank{r}.pt") for r in range(world)]
    full, x, weights, ids = make_case()
    whole = build_unsplit_layer(full, layer_index=0)
    fn = mxfp4_per_pick()
    y_one = residency_forward(whole, x, weights, ids, fn, pick_dtype=torch.bfloat16)
    q_one = split_invoke(whole, x, ids, fn, out_dtype=torch.bfloat16)
    w = weights.float().unsqueeze(-1)
    per_rank = sum((w * r["picks"].float().abs()).sum(1) + r["y"].float().abs() for r in ranks)
    bound = 2.0 ** -8 * (per_rank + (w * q_one.float().abs()).sum(1) + y_one.float().abs()
                         + (world - 1) * sum(r["y"].float().abs() for r in ranks)) + 1e-30
    reduced = ranks[0]["reduced"]
    diff = (reduced.float() - y_one.float()).abs()
    return {"world": world,
            "split_equals_unsplit": [r["split_equals_unsplit"] for r in ranks],
            "all_ranks_same_sum": all(torch.equal(r["reduced"], reduced) for r in ranks),
            "sum_within_bound": bool((diff <= bound).all()),
            "sum_bit_identical": bool(torch.equal(reduced, y_one)),
            "max_abs_diff": float(diff.max()), "max_bound": float(bound.max()),
            "max_abs_out": float(y_one.float().abs().max()),
            "banks": [(r["hot_rows"], r["cold_rows"], r["cold_device"]) for r in ranks]}


def run(world: int = 2, backend: str = "gloo", device: str = "cpu") -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        mp.spawn(rank_main, args=(world, backend, init, tmp, device), nprocs=world, join=True)
        return compare(tmp, world)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = ap.parse_args(argv)
    result = run(args.world, args.backend, args.device)
    print(json.dumps(result))
    ok = all(result["split_equals_unsplit"]) and result["sum_within_bound"] and result["all_ranks_same_sum"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
