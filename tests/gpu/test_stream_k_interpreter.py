"""The T=1 stream-K schedule (``KernelConfig.stream_k1`` / ``stream_k2``: each expert launch on a
fixed number of programs, each an equal share of the (pick, row tile, K step) list, tiles cut by a
share boundary reduced by their last piece in share order) under ``TRITON_INTERPRET=1``.

Claims: split == unsplit bit for bit; fused finalize == separate finalize bit for bit; within
bf16 tolerance of the one-program-per-tile schedule (fp32 partial sums: bits not claimed); the
counter exact; every ticket back at zero (the next step is right too); picks of -1 add exactly
what the core's expert-parallel path adds; a padded token computes and counts nothing.
The shares are chosen uneven and cutting tiles (W = 12 units on 5 programs for w13, 24 on 7 for
w2), so the partial hand-off runs; the H200 run checks the compiled kernels
(``tests/gpu/test_gpu_residency.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))
from interpreter_rerun import interpreter_only_marks, rerun_interpreted  # noqa: E402

pytestmark = interpreter_only_marks("tests/gpu/test_gpu_residency.py")


def _rerun_interpreted(test_id: str) -> bool:
    """This file's test ``test_id`` in a fresh ``TRITON_INTERPRET=1`` process when needed
    (``interpreter_rerun``)."""
    return rerun_interpreted(__file__, test_id)


def test_stream_k_one_token_under_triton_interpreter() -> None:
    if _rerun_interpreted("test_stream_k_one_token_under_triton_interpreter"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer
    from expert_residency.core.counter import ExpertCounter
    from expert_residency.gpu import experts as gx
    from expert_residency.gpu import kernels
    from expert_residency.gpu.layout import to_kernel_layout
    from expert_residency.mxfp4 import quantize_mxfp4

    # The share arithmetic by hand: 12 units on 5 programs start at 0, 2, 4, 7, 9 (12 ends).
    starts = [j * 12 // 5 for j in range(6)]
    assert starts == [0, 2, 4, 7, 9, 12]
    share_at = [((w + 1) * 5 + 11) // 12 - 1 for w in range(12)]
    assert share_at == [0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4, 4]

    torch.manual_seed(6)
    e, k, h, i = 6, 3, 256, 128
    p13, s13 = quantize_mxfp4(torch.randn(e, 2 * i, h) * 0.05)
    p2, s2 = quantize_mxfp4(torch.randn(e, h, i) * 0.05)
    full = {"w13_weight": p13, "w13_weight_scale": s13, "w2_weight": p2, "w2_weight_scale": s2}
    tiles = dict(block_m=4, block_n1=64, block_k1=128, block_n2=64, block_k2=64)
    base = gx.KernelConfig(**tiles)
    stream = gx.KernelConfig(**tiles, stream_k1=5, stream_k2=7)
    stream_sep = gx.KernelConfig(**tiles, stream_k1=5, stream_k2=7, fuse_finalize=False)
    to_kernel_layout(full, base)
    unsplit = build_unsplit_layer(full, layer_index=0)
    split = rehome_layer(dict(full), [5, 1, 0, 3], [2, 4], layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    def make(cfg):
        return gx.TritonMxfp4Experts(gx.ExpertShape(h, i), e, k, max_tokens=4, device="cpu", config=cfg)

    ex_base, ex, ex_sep = make(base), make(stream), make(stream_sep)
    assert "streamK5/7" in stream.describe()
    # W (w13) = 3 picks x 2 row tiles x 2 K steps = 12; W (w2) = 3 x 4 x 2 = 24.
    assert ex.split_scratch.stream13.numel() == 5 * 4 * 64 and ex.split_scratch.stream2.numel() == 7 * 2 * 64
    counter = ExpertCounter([0], e)
    sc = ex.split_scratch
    for ids_row in ([2, 0, 4], [1, 3, 5], [4, -1, 3]):
        x = torch.randn(1, h).bfloat16()
        weights = torch.softmax(torch.randn(1, k), -1)
        ids = torch.tensor([ids_row])
        ex.workspace.pick_out.fill_(float("nan"))
        out = ex.forward(split, x, weights, ids, counter=counter).clone()
        rows = ex.workspace.pick_out[:k].view(1, k, h).clone()
        for t in (sc.tickets13, sc.tickets2, sc.stream_tickets2):
            assert int(t.abs().sum()) == 0
        assert torch.equal(out, ex.forward(unsplit, x, weights, ids))          # split == unsplit
        assert torch.equal(out, ex_sep.forward(split, x, weights, ids))        # fused == separate
        assert torch.equal(out, ex.finalize(rows, weights, topk_ids=ids))
        ref = ex_base.forward(split, x, weights, ids)
        rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        assert rel < 2e-2, rel
        if -1 in ids_row:   # the -1 pick: neither its stale (NaN) row nor its weight reaches out
            assert not torch.isnan(out).any()
    valid = torch.tensor([2, 0, 4, 1, 3, 5, 4, 3])
    assert torch.equal(counter.counts[0], torch.bincount(valid, minlength=e))
    assert int(counter.tokens[0]) == 3
    before = counter.counts[0].clone()
    ex.forward(split, torch.randn(1, h).bfloat16(), weights, torch.tensor([[0, 1, 2]]), counter=counter,
               token_mask=torch.tensor([False]))
    assert torch.equal(counter.counts[0], before) and int(counter.tokens[0]) == 3
    for t in (sc.tickets13, sc.tickets2, sc.stream_tickets2):
        assert int(t.abs().sum()) == 0
    # More programs than work units: clamped to one unit per program.
    many = make(gx.KernelConfig(**tiles, stream_k1=64, stream_k2=64))
    x = torch.randn(1, h).bfloat16()
    ids = torch.tensor([[3, 5, 0]])
    assert torch.equal(many.forward(split, x, weights, ids), many.forward(unsplit, x, weights, ids))
    assert kernels.w13_stream_kernel is not None
