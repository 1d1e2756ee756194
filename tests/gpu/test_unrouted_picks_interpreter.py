"""Picks with id -1 (an expert of another rank under expert parallelism, or an unrouted pick) under
``TRITON_INTERPRET=1``: the Triton layer adds exactly what the core's expert-parallel torch path
(``parallel.ep.ep_forward``: zero weight, zero row, ``core.finalize``) adds for them, never the
stale workspace row times its router weight, in the separate finalize and in the T=1 fused one,
on every schedule (T=1 ungrouped, small grouped, large grouped, torch grouping); split == unsplit
bit for bit.

Exactness under the interpreter: its ``tl.fma`` is a multiply then an add, the core's ``fma_f32``
a correctly rounded fma. With router weights that are multiples of 1/64 (6 significant bits) times
bf16 rows (8 bits) every product is exact in fp32, so both round once and must agree bit for bit
(on the GPU both are correctly rounded fmas for any weights: ``tests/gpu/test_gpu_residency.py``),
and the results are compared in fp32 (the interpreter casts fp32 -> bf16 by truncation).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))
from interpreter_rerun import interpreter_only_marks, rerun_interpreted  # noqa: E402

NAN = float("nan")

pytestmark = interpreter_only_marks("tests/gpu/test_gpu_residency.py")


def _rerun_interpreted(test_id: str) -> bool:
    """This file's test ``test_id`` in a fresh ``TRITON_INTERPRET=1`` process when needed
    (``interpreter_rerun``)."""
    return rerun_interpreted(__file__, test_id)


def _weights(t: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Non-zero router weights with 6 significant bits (exact fp32 products with bf16 rows)."""
    return torch.randint(1, 64, (t, k), generator=gen).float() / 64


def test_minus_one_picks_match_the_core_ep_path_under_triton_interpreter(monkeypatch) -> None:
    if _rerun_interpreted("test_minus_one_picks_match_the_core_ep_path_under_triton_interpreter"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer
    from expert_residency.core.fma_finalize import finalize as core_finalize
    from expert_residency.gpu import experts as gx
    from expert_residency.gpu.layout import to_kernel_layout
    from expert_residency.mxfp4 import quantize_mxfp4
    from expert_residency.parallel.ep import ep_forward

    torch.manual_seed(4)
    gen = torch.Generator().manual_seed(5)
    e, k, h, i = 6, 3, 256, 128
    p13, s13 = quantize_mxfp4(torch.randn(e, 2 * i, h) * 0.05)
    p2, s2 = quantize_mxfp4(torch.randn(e, h, i) * 0.05)
    full = {"w13_weight": p13, "w13_weight_scale": s13, "w2_weight": p2, "w2_weight_scale": s2}
    # This rank holds global experts 0, 2, 3, 5, 7, 8 in local slots 0..5; 1, 4, 6 are elsewhere.
    expert_map = torch.tensor([0, -1, 1, 2, -1, 3, -1, 4, 5], dtype=torch.int32)
    cfg = gx.KernelConfig(block_m=4, block_n1=64, block_k1=128, block_n2=64, block_k2=64)
    to_kernel_layout(full, cfg)
    unsplit = build_unsplit_layer(full, layer_index=0)
    split = rehome_layer(dict(full), [5, 1, 0, 3], [2, 4], layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    configs = {"fused": cfg, "separate": gx.KernelConfig(block_m=4, block_n1=64, block_k1=128, block_n2=64,
                                                          block_k2=64, fuse_finalize=False)}
    steps = {  # global ids; every step has picks of other ranks with non-zero weights
        1: [[1, 3, 6]],
        3: [[4, 0, 8], [6, 1, 4], [2, 7, 1]],             # the middle token entirely elsewhere
        5: [[0, 1, 2], [3, 4, 5], [6, 7, 8], [8, 6, 0], [4, 4, 1]],
    }
    checked = 0
    for name, config in configs.items():
        ex = gx.TritonMxfp4Experts(gx.ExpertShape(h, i), e, k, max_tokens=8, device="cpu", config=config)
        assert ex._fuses_finalize(1) == (name == "fused")
        for t, rows in steps.items():
            for torch_grouping in ((False, True) if t == 5 else (False,)):
                # torch grouping: the prefill fallback, reached here by lowering its threshold
                monkeypatch.setattr(gx, "MAX_FUSED_PICKS", 4 if torch_grouping else 1024)
                x = torch.randn(t, h).bfloat16()
                global_ids = torch.tensor(rows)
                weights = _weights(t, k, gen)
                local = expert_map[global_ids.long()]
                assert bool((local < 0).any())
                outs = []
                for layer in (split, unsplit):
                    ex.workspace.pick_out.fill_(NAN)   # stale rows: garbage the finalize must not use
                    ex.workspace.act.fill_(NAN)
                    out = torch.empty(t, h, dtype=torch.float32)  # fp32: no final bf16 cast
                    outs.append(ex.forward(layer, x, weights, local, out=out).clone())
                    picks = ex.workspace.pick_out[:t * k].view(t, k, h).clone()
                assert torch.equal(outs[0], outs[1]), (name, t, torch_grouping)      # split == unsplit
                assert not torch.isnan(outs[0]).any()
                # The core's expert-parallel torch path, the Triton per-pick rows, core.finalize.
                ref = ep_forward(unsplit, x, weights, global_ids, expert_map, ex.per_pick_fn(),
                                 pick_dtype=torch.bfloat16, out_dtype=torch.float32)
                assert torch.equal(outs[0], ref), (name, t, torch_grouping)
                # The separate finalize alone, on the rows the layer left (NaN where not routed).
                routed = (local >= 0).unsqueeze(-1)
                assert bool(torch.isnan(picks).any())
                expect = core_finalize(torch.where(routed, picks, torch.zeros_like(picks)),
                                       torch.where(routed.squeeze(-1), weights, torch.zeros_like(weights)),
                                       torch.float32)
                assert torch.equal(ex.finalize(picks, weights, topk_ids=local, out_dtype=torch.float32),
                                   expect)
                if t == 3:  # a token with no pick on this rank contributes exactly +0
                    assert torch.equal(outs[0][1].view(torch.int32), torch.zeros(h, dtype=torch.int32))
                checked += 1
    assert checked == 8
    # An id past the last expert is unrouted as well; without ids the finalize takes every row.
    ex = gx.TritonMxfp4Experts(gx.ExpertShape(h, i), e, k, max_tokens=8, device="cpu", config=cfg)
    picks = torch.randn(2, k, h).bfloat16()
    picks[0, 2] = NAN
    weights = _weights(2, k, gen)
    ids = torch.tensor([[0, 1, e], [2, 3, 4]])
    keep = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    expect = core_finalize(torch.nan_to_num(picks) * keep.unsqueeze(-1).bfloat16(), weights * keep,
                           torch.float32)
    assert torch.equal(ex.finalize(picks, weights, topk_ids=ids, out_dtype=torch.float32), expect)
    assert torch.isnan(ex.finalize(picks, weights)[0]).all()
