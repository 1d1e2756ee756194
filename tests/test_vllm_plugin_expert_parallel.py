"""The plugin's expert-parallel module on CPU, with stand-in layers laid out like vLLM 0.33's.

Each stand-in ``RoutedExperts`` carries what 0.33 gives a layer under ``--enable-expert-parallel``
(``moe_parallel_config`` with ``tp_size = 1``, the expert map from vLLM's own
``determine_expert_map`` executed from the wheel's source, registered as ``_expert_map``,
``local_num_experts`` rows per parameter in local-slot order as the loader leaves them). Per rank:
the row map sliced by hand, split == unsplit bit for bit (bf16, MXFP4, FP8 block), the same share
as ``parallel.ep.ep_forward``, the ranks' sum within the stated bound of one rank holding every
expert; refusals for what the runtime cannot compute.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))

from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer  # noqa: E402
from expert_residency.core.split import residency_forward  # noqa: E402
from expert_residency.parallel import ep_forward  # noqa: E402
from expert_residency.vllm_plugin.expert_parallel import (  # noqa: E402
    device_expert_map,
    ep_reason,
    layer_ep_facts,
    local_ids,
    local_picks,
    rehome_ep_rank,
    sliced_banks,
    unsplit_ep_rank,
)
from random_experts import random_experts  # noqa: E402
from vllm033_source import vllm033_source  # noqa: E402

HOT, COLD = [5, 1, 7, 0, 3], [2, 6, 4]   # the lane's global row map for one layer of 8 experts


def _determine_expert_map():
    root = vllm033_source("model_executor/layers/fused_moe/expert_map_manager.py")
    if root is None:
        pytest.skip("vLLM 0.33.0 source not unpacked")
    path = root / "model_executor/layers/fused_moe/expert_map_manager.py"
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "determine_expert_map")
    namespace = {"torch": torch, "ExpertPlacementStrategy": str}
    exec(compile(ast.Module([fn], []), str(path), "exec"), namespace)
    return namespace["determine_expert_map"]


class StandInRoutedExperts(torch.nn.Module):
    """The attributes the plugin reads from a vLLM 0.33 ``RoutedExperts`` under EP."""

    def __init__(self, full: dict[str, torch.Tensor], ep_size: int, ep_rank: int, strategy: str = "linear",
                 *, all2all_kernels: bool = False, eplb: bool = False, fused_shared: int = 0,
                 mask: bool = False, backend: str = "allgather_reducescatter") -> None:
        super().__init__()
        e = next(iter(full.values())).shape[0]
        local, emap, _ = _determine_expert_map()(ep_size, ep_rank, e, strategy)
        self.layer_name = "model.layers.3.mlp.experts"
        self.global_num_experts, self.local_num_experts = e, local
        self.expert_placement_strategy = strategy
        pc = SimpleNamespace(use_ep=True, ep_size=ep_size, ep_rank=ep_rank, tp_size=1, tp_rank=0,
                             all2all_backend=backend, enable_eplb=eplb, use_all2all_kernels=all2all_kernels)
        self.moe_config = SimpleNamespace(moe_parallel_config=pc)
        self.expert_map_manager = SimpleNamespace(expert_map=emap, num_fused_shared_experts=fused_shared)
        self.quant_method = SimpleNamespace(moe_kernel=SimpleNamespace(
            fused_experts=SimpleNamespace(consumes_expert_mask=mask)))
        self.register_buffer("_expert_map", emap, persistent=False)   # routed_experts.py:268-276
        # The loader's result: global expert g at row expert_map[g] (routed_experts.py:727-737).
        order = sorted((int(s), g) for g, s in enumerate(emap.tolist()) if s >= 0)
        for name, t in full.items():
            self.register_parameter(name, torch.nn.Parameter(t[[g for _, g in order]].clone(),
                                                             requires_grad=False))

    def expert_tensors(self) -> dict[str, torch.Tensor]:
        return {n: p.data for n, p in self.named_parameters(recurse=False)}


def _experts(fmt: str, e: int = 8, h: int = 64, i: int = 128):
    return random_experts(fmt, e, h, i, seed=5)


def _routing(t: int, e: int, k: int, h: int):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(t, h, generator=g).bfloat16()
    weights, ids = torch.topk(torch.softmax(torch.randn(t, e, generator=g), -1), k)
    ids[0] = torch.tensor([2, 6])       # one token wholly in the cold bank
    ids[1] = torch.tensor([0, 3])       # one token wholly on rank 0 under linear EP=2
    return x, weights, ids


def test_sliced_banks_by_hand() -> None:
    full, _ = _experts("bf16")
    # linear EP=2, rank 1: globals 4..7 -> slots 0..3; hot 5,7 -> 1,3; cold 6,4 -> 2,0
    r1 = StandInRoutedExperts(full, 2, 1)
    assert sliced_banks({3: HOT}, {3: COLD}, {3: r1}) == ({3: [1, 3]}, {3: [2, 0]})
    # linear EP=2, rank 0: globals 0..3; hot 1,0,3 -> 1,0,3; cold 2 -> 2
    assert sliced_banks({3: HOT}, {3: COLD}, {3: StandInRoutedExperts(full, 2, 0)}) == ({3: [1, 0, 3]}, {3: [2]})
    # round_robin EP=2, rank 1: globals 1,3,5,7 -> slots 0..3; all hot, in row order 5,1,7,3
    rr = StandInRoutedExperts(full, 2, 1, "round_robin")
    assert sliced_banks({3: HOT}, {3: COLD}, {3: rr}) == ({3: [2, 0, 3, 1]}, {3: []})
    # EP=3 over 8 experts, linear: base 2, remainder 2 -> rank 2 holds globals 6, 7 as slots 0, 1
    r2 = StandInRoutedExperts(full, 3, 2)
    assert r2.local_num_experts == 2
    assert sliced_banks({3: HOT}, {3: COLD}, {3: r2}) == ({3: [1]}, {3: [0]})
    # a layer without EP keeps the global lists
    tp = StandInRoutedExperts(full, 2, 1)
    tp.moe_config.moe_parallel_config.use_ep = False
    assert layer_ep_facts(tp) is None and ep_reason(tp) is None
    assert sliced_banks({3: HOT}, {3: COLD}, {3: tp}) == ({3: HOT}, {3: COLD})


def test_local_picks_by_hand() -> None:
    emap = torch.tensor([-1, -1, -1, -1, 0, 1, 2, 3], dtype=torch.int32)   # rank 1 of linear EP=2
    ids = torch.tensor([[5, 2], [0, 7]], dtype=torch.int32)
    w = torch.tensor([[0.75, 0.25], [0.5, 0.5]])
    local, weights = local_picks(emap, ids, w)
    assert local.tolist() == [[1, 0], [0, 3]] and local.dtype == torch.int32
    assert weights.tolist() == [[0.75, 0.0], [0.0, 0.5]]
    # the fused Triton layer's form: -1 for other ranks' experts, weights untouched
    assert local_ids(emap, ids).tolist() == [[1, -1], [-1, 3]] and local_ids(emap, ids).dtype == torch.int32


@pytest.mark.parametrize("fmt", ["bf16", "mxfp4", "fp8"])
@pytest.mark.parametrize("strategy,ep", [("linear", 2), ("round_robin", 2), ("linear", 3)])
def test_split_equals_unsplit_per_rank(fmt: str, strategy: str, ep: int) -> None:
    h, i = (256, 256) if fmt == "fp8" else (64, 128)
    e, k, t = 8, 2, 6
    full, fn = _experts(fmt, e, h, i)
    x, weights, ids = _routing(t, e, k, h)
    outs = []
    for rank in range(ep):
        layer = StandInRoutedExperts(full, ep, rank, strategy)
        assert ep_reason(layer) is None
        hot, cold = sliced_banks({3: HOT}, {3: COLD}, {3: layer})
        unsplit = build_unsplit_layer(layer.expert_tensors(), layer_index=3)
        split = rehome_layer(layer.expert_tensors(), hot[3], cold[3], layer_index=3,
                             hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
        emap = device_expert_map(layer)
        lids, lw = local_picks(emap, ids, weights)
        y = residency_forward(split, x, lw, lids, fn, pick_dtype=torch.bfloat16)
        assert torch.equal(y, residency_forward(unsplit, x, lw, lids, fn, pick_dtype=torch.bfloat16))
        # the same share as the torch EP reference, which also zeroes the foreign rows
        assert torch.equal(y, ep_forward(split, x, weights, ids, emap, fn, pick_dtype=torch.bfloat16))
        # the test-side builders from full tensors give the same banks' output
        ref = rehome_ep_rank(full, HOT, COLD, emap.tolist(), layer_index=3,
                             hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
        assert torch.equal(y, residency_forward(ref, x, lw, lids, fn, pick_dtype=torch.bfloat16))
        assert torch.equal(y, residency_forward(unsplit_ep_rank(full, emap.tolist(), layer_index=3),
                                                x, lw, lids, fn, pick_dtype=torch.bfloat16))
        outs.append(y)
    one = residency_forward(build_unsplit_layer(full, layer_index=3), x, weights, ids, fn,
                            pick_dtype=torch.bfloat16)
    summed = outs[0]
    for y in outs[1:]:
        summed = summed + y
    diff = (summed.float() - one.float()).abs()
    bound = 2.0 ** -8 * (sum(y.float().abs() for y in outs) * ep + one.float().abs()) + 1e-30
    assert bool((diff <= bound).all())
    if strategy == "linear" and ep == 2:
        # token 1 routes to globals 0 and 3, both on rank 0 (0..3): rank 1's share is exactly 0
        for y in outs[1:]:
            assert torch.equal(y[1], torch.zeros_like(y[1]))


def test_refusals_name_the_layer() -> None:
    full, _ = _experts("bf16")
    assert "layers.3" in ep_reason(StandInRoutedExperts(full, 2, 0, eplb=True)) and \
        "EPLB" in ep_reason(StandInRoutedExperts(full, 2, 0, eplb=True))
    assert "fused into the routed" in ep_reason(StandInRoutedExperts(full, 2, 0, fused_shared=1))
    assert "0/1 expert mask" in ep_reason(StandInRoutedExperts(full, 2, 0, mask=True))
    assert "--data-parallel-size 1" in ep_reason(StandInRoutedExperts(full, 2, 0, all2all_kernels=True))
    assert "deepep_low_latency" in ep_reason(
        StandInRoutedExperts(full, 2, 0, backend="deepep_low_latency"))
    wrong = StandInRoutedExperts(full, 2, 0)
    wrong.local_num_experts = 3
    assert "gives 4 local experts, the layer holds 3" in ep_reason(wrong)


def test_adaptive_with_ep_refused() -> None:
    from expert_residency.vllm_plugin.checks import expert_parallel_adaptive_reason

    assert expert_parallel_adaptive_reason(False, "model.layers.3.mlp.experts") is None
    reason = expert_parallel_adaptive_reason(True, "model.layers.3.mlp.experts")
    assert reason.startswith("model.layers.3.mlp.experts: adaptive residency") and "global id" in reason
