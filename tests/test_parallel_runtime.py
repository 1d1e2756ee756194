"""Residency under vLLM 0.33's tensor and expert parallelism, per rank, on CPU (torch references).

TP: each rank's shard laid out as vLLM's loader leaves it (hand-built index tensors say which rows
and columns), split == unsplit bit for bit per rank for float, MXFP4 and FP8-block experts, and the
sum over ranks within the stated rounding bound of one rank holding whole experts.
EP: the expert map equals vLLM 0.33's own ``determine_expert_map`` (executed from the wheel's
source), the row map sliced by hand, split == unsplit per rank, refusals.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))

from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer  # noqa: E402
from expert_residency.core.split import residency_forward, split_invoke  # noqa: E402
from expert_residency.parallel import (  # noqa: E402
    ExpertPlacement,
    TensorShard,
    check_same_rowmap,
    ep_forward,
    expert_map_for,
    local_expert_rows,
    rehome_tp_rank,
    shard_expert_tensors,
    slice_rowmap,
    unsplit_tp_rank,
    unsupported_ep_reason,
)
from random_experts import random_experts  # noqa: E402

VLLM033 = ROOT / ".cache/vllm-0.33.0/vllm"
HOT, COLD = [5, 1, 7, 0, 3], [2, 6, 4]


# -- layout ------------------------------------------------------------------------------------
def _index_tensors(e: int = 2, h: int = 4, i: int = 8) -> dict[str, torch.Tensor]:
    """Float tensors whose value names their position: w13[e, r, c] = 1000 e + 10 r + c / 10."""
    w13 = torch.arange(e).view(e, 1, 1) * 1000.0 + torch.arange(2 * i).view(1, -1, 1) * 10.0 \
        + torch.arange(h).view(1, 1, -1) / 10
    w2 = torch.arange(e).view(e, 1, 1) * 1000.0 + torch.arange(h).view(1, -1, 1) * 10.0 \
        + torch.arange(i).view(1, 1, -1) / 10
    return {"w13_weight": w13, "w2_weight": w2, "w13_bias": w13[:, :, 0].clone(),
            "w2_bias": w2[:, :, 0].clone() + 0.5}


def test_tp_shard_is_vllms_layout_by_hand() -> None:
    full = _index_tensors()
    r1 = shard_expert_tensors(full, TensorShard(tp_size=2, tp_rank=1, intermediate_size=8))
    # I = 8, Ip = 4: rank 1 holds gate rows 4..7 then up rows 12..15, w2 columns 4..7.
    assert torch.equal(r1["w13_weight"][1, :, 0], torch.tensor([1040., 1050, 1060, 1070, 1120, 1130, 1140, 1150]))
    assert torch.equal(r1["w2_weight"][0, 2], torch.tensor([20.4, 20.5, 20.6, 20.7]))
    assert torch.equal(r1["w13_bias"][0], torch.tensor([40., 50, 60, 70, 120, 130, 140, 150]))
    assert torch.equal(r1["w2_bias"], torch.zeros(2, 4))   # the all-reduce adds rank 0's once
    r0 = shard_expert_tensors(full, TensorShard(2, 0, 8))
    assert torch.equal(r0["w2_bias"], full["w2_bias"])
    # Reassembling the ranks' halves gives the checkpoint back (nothing lost, nothing doubled).
    gate = torch.cat([r0["w13_weight"][:, :4], r1["w13_weight"][:, :4]], 1)
    up = torch.cat([r0["w13_weight"][:, 4:], r1["w13_weight"][:, 4:]], 1)
    assert torch.equal(torch.cat([gate, up], 1), full["w13_weight"])
    assert torch.equal(torch.cat([r0["w2_weight"], r1["w2_weight"]], 2), full["w2_weight"])


def test_tp_shard_interleaved_padded_and_quantized_dims() -> None:
    full = _index_tensors(i=8)
    inter = shard_expert_tensors(full, TensorShard(2, 1, 8, interleaved_gate_up=True))
    assert torch.equal(inter["w13_weight"][0, :, 0], torch.arange(8, 16) * 10.0)   # rows 8..15 as one run
    padded = shard_expert_tensors(full, TensorShard(2, 1, 8, padded_intermediate=6))
    # each half gets its 4 checkpoint rows then 2 zero rows; w2 its 4 columns then 2 zero columns
    assert padded["w13_weight"].shape == (2, 12, 4)
    assert torch.equal(padded["w13_weight"][0, :, 0],
                       torch.tensor([40., 50, 60, 70, 0, 0, 120, 130, 140, 150, 0, 0]))
    assert torch.equal(padded["w2_weight"][0, 1], torch.tensor([10.4, 10.5, 10.6, 10.7, 0, 0]))
    # MXFP4 (I = 128, TP = 2, Ip = 64): w2 packed bytes 32..63, w2 scale columns 2..3 of 4.
    p2 = torch.arange(128 // 2, dtype=torch.uint8).expand(3, 8, -1).contiguous()
    s2 = torch.arange(128 // 32, dtype=torch.uint8).expand(3, 8, -1).contiguous()
    mx = shard_expert_tensors({"w2_weight": p2, "w2_weight_scale": s2}, TensorShard(2, 1, 128))
    assert torch.equal(mx["w2_weight"][0, 0], torch.arange(32, 64, dtype=torch.uint8))
    assert torch.equal(mx["w2_weight_scale"][2, 7], torch.tensor([2, 3], dtype=torch.uint8))
    # FP8 128x128 blocks, I = 384, TP = 2: Ip = 192 cuts a block (vLLM pads/refines; refused here).
    with pytest.raises(ValueError, match="cut a quantization block"):
        shard_expert_tensors({"w2_weight_scale_inv": torch.ones(2, 2, 3)}, TensorShard(2, 0, 384))
    with pytest.raises(ValueError, match="not divisible by tp_size"):
        TensorShard(3, 0, 8)
    with pytest.raises(ValueError, match="not a w13_"):
        shard_expert_tensors({"gate_weight": torch.ones(2, 2, 2)}, TensorShard(2, 0, 8))
    with pytest.raises(ValueError, match="another row map"):
        check_same_rowmap([(HOT, COLD), ([1, 5, 7, 0, 3], COLD)])
    check_same_rowmap([(HOT, COLD), (list(HOT), list(COLD))])


# -- TP numerics -------------------------------------------------------------------------------
def _experts(fmt: str, e: int, h: int, i: int) -> tuple[dict[str, torch.Tensor], object]:
    return random_experts(fmt, e, h, i, seed=3)


def _routing(t: int, e: int, k: int, h: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(t, h, generator=g).bfloat16()
    weights, ids = torch.topk(torch.softmax(torch.randn(t, e, generator=g), -1), k)
    ids[0] = torch.tensor([2, 6])[:k]   # one token wholly in the cold bank
    return x, weights, ids


def _sum_bound(picks_per_rank, outs, picks_full, out_full, weights, ranks):
    """The hand-derived bound of TP_SUM_TOLERANCE (see parallel/tp.py) per element."""
    w = weights.float().unsqueeze(-1)
    per_rank = sum((w * q.float().abs()).sum(1) + y.float().abs() for q, y in zip(picks_per_rank, outs))
    whole = (w * picks_full.float().abs()).sum(1) + out_full.float().abs()
    adds = (ranks - 1) * sum(y.float().abs() for y in outs)
    return 2.0 ** -8 * (per_rank + whole + adds) + 1e-30


@pytest.mark.parametrize("fmt,h,i,tp", [("bf16", 64, 64, 2), ("mxfp4", 64, 128, 2), ("fp8", 256, 512, 2),
                                        ("bf16", 64, 64, 4)])
def test_tp_split_equals_unsplit_per_rank_and_sums_to_one_rank(fmt: str, h: int, i: int, tp: int) -> None:
    e, k, t = 8, 2, 5
    full, fn = _experts(fmt, e, h, i)
    x, weights, ids = _routing(t, e, k, h)
    outs, picks = [], []
    for rank in range(tp):
        shard = TensorShard(tp, rank, i)
        split = rehome_tp_rank(full, HOT, COLD, shard, layer_index=0,
                               hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
        assert split.hot.num_rows == 5 and split.cold.num_rows == 3
        unsplit = unsplit_tp_rank(full, shard, layer_index=0)
        y_split = residency_forward(split, x, weights, ids, fn, pick_dtype=torch.bfloat16)
        y_unsplit = residency_forward(unsplit, x, weights, ids, fn, pick_dtype=torch.bfloat16)
        assert torch.equal(y_split, y_unsplit), f"rank {rank}: split != unsplit"
        outs.append(y_split)
        picks.append(split_invoke(unsplit, x, ids, fn, out_dtype=torch.bfloat16))
    whole = build_unsplit_layer(full, layer_index=0)
    y_one = residency_forward(whole, x, weights, ids, fn, pick_dtype=torch.bfloat16)
    q_one = split_invoke(whole, x, ids, fn, out_dtype=torch.bfloat16)
    summed = outs[0].clone()
    for y in outs[1:]:
        summed += y                     # bf16 additions in rank order, as a ring all-reduce does
    diff = (summed.float() - y_one.float()).abs()
    bound = _sum_bound(picks, outs, q_one, y_one, weights, tp)
    assert bool((diff <= bound).all()), float((diff - bound).max())
    assert float(y_one.float().abs().max()) > 0   # the comparison is not of zeros
    # The per-rank parts are not each close to the whole: the test would catch a rank doing all of it.
    assert float((outs[0].float() - y_one.float()).abs().max()) > float(bound.max())


def test_tp_padded_mxfp4_shard_computes_the_same_as_unpadded() -> None:
    e, k, t, h, i = 8, 2, 5, 64, 128
    full, fn = _experts("mxfp4", e, h, i)
    x, weights, ids = _routing(t, e, k, h)
    plain = residency_forward(unsplit_tp_rank(full, TensorShard(2, 1, i), layer_index=0), x, weights, ids,
                              fn, pick_dtype=torch.bfloat16)
    shard = TensorShard(2, 1, i, padded_intermediate=128)    # a backend rounding 64 up to 128
    split = rehome_tp_rank(full, HOT, COLD, shard, layer_index=0,
                           hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    padded = residency_forward(split, x, weights, ids, fn, pick_dtype=torch.bfloat16)
    assert split.hot["w13_weight"].shape[1] == 256
    assert torch.equal(padded, plain)   # zero rows/columns add exact zeros


# -- EP ----------------------------------------------------------------------------------------
def _vllm_determine_expert_map():
    """vLLM 0.33.0's own function, executed from the wheel's source (only torch needed)."""
    path = VLLM033 / "model_executor/layers/fused_moe/expert_map_manager.py"
    if not path.is_file():
        pytest.skip(f"vLLM 0.33.0 source not unpacked at {path}")
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "determine_expert_map")
    namespace = {"torch": torch, "ExpertPlacementStrategy": str}
    exec(compile(ast.Module([fn], []), str(path), "exec"), namespace)
    return namespace["determine_expert_map"]


@pytest.mark.parametrize("strategy", ["linear", "round_robin"])
def test_expert_map_is_vllms(strategy: str) -> None:
    vllm_map = _vllm_determine_expert_map()
    for e, size in ((8, 2), (10, 4), (256, 8), (384, 8), (7, 3)):
        for rank in range(size):
            local, expected, _ = vllm_map(size, rank, e, strategy)
            ours = expert_map_for(ExpertPlacement(size, rank, e, strategy))
            assert ours == expected.tolist() and sum(v >= 0 for v in ours) == local


def test_ep_slice_by_hand_and_refusals() -> None:
    # E = 8, EP = 2, linear: rank 1 holds globals 4..7 as slots 0..3.
    m1 = expert_map_for(ExpertPlacement(2, 1, 8))
    assert m1 == [-1, -1, -1, -1, 0, 1, 2, 3]
    assert slice_rowmap(HOT, COLD, m1) == ([1, 3], [2, 0])       # hot 5,7 -> 1,3; cold 6,4 -> 2,0
    rr = expert_map_for(ExpertPlacement(2, 1, 8, "round_robin"))   # globals 1,3,5,7
    assert slice_rowmap(HOT, COLD, rr) == ([2, 0, 3, 1], [])
    assert slice_rowmap(HOT, COLD, torch.tensor(rr, dtype=torch.int32)) == ([2, 0, 3, 1], [])
    with pytest.raises(ValueError, match="9 entries but the row map has 8"):
        slice_rowmap(HOT, COLD, m1 + [-1])
    with pytest.raises(ValueError, match="local slot"):
        slice_rowmap(HOT, COLD, [0, 0, -1, -1, -1, -1, -1, -1])
    assert unsupported_ep_reason(ExpertPlacement(2, 1, 8)) is None
    assert "EPLB" in unsupported_ep_reason(ExpertPlacement(2, 1, 8, enable_eplb=True))
    assert "EPLB" in unsupported_ep_reason(ExpertPlacement(2, 1, 8, num_redundant_experts=2))
    assert "deepep_low_latency" in unsupported_ep_reason(
        ExpertPlacement(2, 1, 8, all2all_backend="deepep_low_latency"))
    assert "fused into the routed" in unsupported_ep_reason(ExpertPlacement(2, 1, 8, num_fused_shared_experts=1))
    assert "sets tp_size=1" in unsupported_ep_reason(ExpertPlacement(2, 1, 8, tp_size=2))


@pytest.mark.parametrize("strategy", ["linear", "round_robin"])
def test_ep_split_equals_unsplit_per_rank_and_sums_to_one_rank(strategy: str) -> None:
    e, k, t, h, i, ep = 8, 2, 6, 64, 128, 2
    full, fn = _experts("mxfp4", e, h, i)
    x, weights, ids = _routing(t, e, k, h)
    outs = []
    for rank in range(ep):
        emap = expert_map_for(ExpertPlacement(ep, rank, e, strategy))
        local = {n: local_expert_rows(v, emap) for n, v in full.items()}
        hot, cold = slice_rowmap(HOT, COLD, emap)
        split = rehome_layer(dict(local), hot, cold, layer_index=0,
                             hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
        unsplit = build_unsplit_layer(local, layer_index=0)
        m = torch.tensor(emap, dtype=torch.int32)
        y = ep_forward(split, x, weights, ids, m, fn, pick_dtype=torch.bfloat16)
        assert torch.equal(y, ep_forward(unsplit, x, weights, ids, m, fn, pick_dtype=torch.bfloat16))
        outs.append(y)
    one = residency_forward(build_unsplit_layer(full, layer_index=0), x, weights, ids, fn,
                            pick_dtype=torch.bfloat16)
    summed = outs[0] + outs[1]
    diff = (summed.float() - one.float()).abs()
    bound = 2.0 ** -8 * (sum(y.float().abs() for y in outs) * ep + one.float().abs()) + 1e-30
    assert bool((diff <= bound).all())
    # A token whose two picks are both on one rank gets exactly that rank's fma chain: rank 0 holds
    # 0..3 under linear, so a token routed to (0, 3) has rank 1's share exactly 0.
    if strategy == "linear":
        x2, w2, ids2 = x[:1], weights[:1], torch.tensor([[0, 3]])
        m1 = torch.tensor(expert_map_for(ExpertPlacement(ep, 1, e)), dtype=torch.int32)
        local1 = {n: local_expert_rows(v, m1.tolist()) for n, v in full.items()}
        zero = ep_forward(build_unsplit_layer(local1, layer_index=0), x2, w2, ids2, m1, fn,
                          pick_dtype=torch.bfloat16)
        assert torch.equal(zero, torch.zeros_like(zero))
