"""TP = 2 with the Triton MXFP4 split layer under TRITON_INTERPRET=1 (CPU, no GPU): each rank's
shard (vLLM's layout, then the kernel layout) split == unsplit bit for bit, and the two ranks' sum
close to one layer holding whole experts. The interpreter rounds fp32 -> bf16 by truncation and has
no true fma, so the sum is checked against a relative L2 figure here; the H200 run
(bench/tp_h200.py) checks the compiled kernels.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from interpreter_rerun import rerun_interpreted

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton for TRITON_INTERPRET=1")
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: bench/tp_h200.py runs the compiled kernels")
def test_tp2_triton_split_layer_under_interpreter() -> None:
    if rerun_interpreted(__file__, "test_tp2_triton_split_layer_under_interpreter"):
        return   # Triton was imported without the interpreter earlier: ran in a fresh process
    os.environ["TRITON_INTERPRET"] = "1"
    from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator
    from expert_residency.gpu import experts as gx
    from expert_residency.mxfp4 import quantize_mxfp4
    from expert_residency.parallel import TensorShard, rehome_tp_rank, shard_expert_tensors

    torch.manual_seed(0)
    e, k, h, i, t, tp = 8, 2, 256, 256, 5, 2
    p13, s13 = quantize_mxfp4(torch.randn(e, 2 * i, h) * 0.05)
    p2, s2 = quantize_mxfp4(torch.randn(e, h, i) * 0.05)
    full = {"w13_weight": p13, "w13_weight_scale": s13, "w2_weight": p2, "w2_weight_scale": s2}
    x = torch.randn(t, h).bfloat16()
    weights, ids = torch.topk(torch.softmax(torch.randn(t, e), -1), k)
    ids[0] = torch.tensor([2, 6])
    cfg = gx.KernelConfig(dequant=0, block_m=4, block_n1=32, block_k1=64, block_n2=32, block_k2=64)
    hot, cold = [5, 1, 7, 0, 3], [2, 6, 4]
    outs = []
    for rank in range(tp):
        shard = TensorShard(tp, rank, i)
        ex = gx.TritonMxfp4Experts(gx.ExpertShape(h, shard.width), e, k, max_tokens=8, device="cpu", config=cfg)
        tensors = shard_expert_tensors(full, shard)
        ex.to_kernel_layout(tensors)   # vLLM's layout -> tile-major, per rank, after sharding
        unsplit = build_unsplit_layer(tensors, layer_index=0)
        split = rehome_tp_rank(full, hot, cold, shard, layer_index=0,
                               hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
        # rehome_tp_rank re-homes vLLM's layout; lay each bank out for the kernel the same way
        for bank in (split.hot, split.cold):
            ex.to_kernel_layout(bank.tensors)
        y_split = ex.forward(split, x, weights, ids).clone()
        assert torch.equal(y_split, ex.forward(unsplit, x, weights, ids)), f"rank {rank}"
        outs.append(y_split)
    whole = build_unsplit_layer({n: v.clone() for n, v in full.items()}, layer_index=0)
    ex1 = gx.TritonMxfp4Experts(gx.ExpertShape(h, i), e, k, max_tokens=8, device="cpu", config=cfg)
    ex1.to_kernel_layout(whole.hot.tensors)
    one = ex1.forward(whole, x, weights, ids)
    summed = (outs[0] + outs[1]).float()
    rel = float((summed - one.float()).norm() / one.float().norm())
    assert rel < 2e-2, rel           # interpreter bf16 truncation, as the single-GPU interpreter test
    assert float((outs[0].float() - one.float()).norm() / one.float().norm()) > 0.2   # one rank is not the sum
