"""A grouped step's expert launches on fewer slot rows than slots (``KernelConfig.slot_programs``),
under ``TRITON_INTERPRET=1``: each program walks the slots ``slot, slot + rows, ...``, so every slot
is still computed once — the same output bits as one program per possible slot, split and
unsplit (hot and cold banks), with the usage counter (its counts equal too) and with split-K small steps, for steps whose slots
outnumber the rows several times over and for a row count above the step's slots.
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

E, K, H, I = 8, 2, 256, 128
COLD = [6, 1, 4]
HOT = [0, 2, 3, 5, 7]


def test_slot_rows_walk_every_slot_once_same_bits_under_triton_interpreter() -> None:
    if rerun_interpreted(__file__, "test_slot_rows_walk_every_slot_once_same_bits_under_triton_interpreter"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer
    from expert_residency.core.counter import ExpertCounter
    from expert_residency.gpu import experts as gx
    from expert_residency.gpu.layout import to_kernel_layout
    from expert_residency.mxfp4 import quantize_mxfp4

    torch.manual_seed(5)
    p13, s13 = quantize_mxfp4(torch.randn(E, 2 * I, H) * 0.05)
    p2, s2 = quantize_mxfp4(torch.randn(E, H, I) * 0.05)
    full = {"w13_weight": p13, "w13_weight_scale": s13, "w2_weight": p2, "w2_weight_scale": s2}
    tiles = dict(block_m=4, block_n1=64, block_k1=128, block_n2=64, block_k2=64)
    to_kernel_layout(full, gx.KernelConfig(**tiles))
    layers = {"unsplit": build_unsplit_layer(full, layer_index=0),
              "split": rehome_layer(dict(full), HOT, COLD, layer_index=0,
                                    hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())}
    gen = torch.Generator().manual_seed(9)
    tokens = 7                                   # every expert present: 8 slots for 14 picks
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(tokens)])
    ids[:E // K] = torch.arange(E).view(-1, K)   # so that all 8 experts appear
    x = torch.randn(tokens, H, generator=gen).bfloat16()
    weights = torch.softmax(torch.randn(tokens, K, generator=gen), -1)
    assert len(set(ids.flatten().tolist())) == E

    outs, counts = {}, {}
    for rows in (0, 1, 3, 64):                   # 0: one row per possible slot (min(T*K, E) = 8)
        ex = gx.TritonMxfp4Experts(gx.ExpertShape(H, I), E, K, max_tokens=8, device="cpu",
                                   config=gx.KernelConfig(**tiles, slot_programs=rows))
        for name, layer in layers.items():
            counter = ExpertCounter([0], E, device="cpu")
            outs[(rows, name)] = ex.forward(layer, x, weights, ids, counter=counter).clone()
            counts[(rows, name)] = counter.counts.clone()

    reference = outs[(0, "unsplit")]
    assert torch.isfinite(reference.float()).all() and reference.abs().sum() > 0
    expected_counts = torch.bincount(ids.flatten(), minlength=E)
    for key, out in outs.items():
        assert torch.equal(out, reference), key                     # bit for bit
        assert torch.equal(counts[key].flatten()[:E].to(torch.int64), expected_counts), key


def test_slot_programs_must_not_be_negative() -> None:
    from expert_residency.gpu.experts import KernelConfig

    with pytest.raises(ValueError, match="slot_programs -1"):
        KernelConfig(slot_programs=-1)
    assert "slot-programs48" in KernelConfig(slot_programs=48).describe()
    assert "slot-programs" not in KernelConfig().describe()


def test_slot_rows_with_split_k_same_bits_and_tickets_reset_under_triton_interpreter() -> None:
    # a small step with the K reductions split: each split's partials and the tile's ticket are
    # indexed by the real slot, whichever program walks it; two steps in a row check the tickets
    # were left at zero
    if rerun_interpreted(__file__, "test_slot_rows_with_split_k_same_bits_and_tickets_reset_under_triton_interpreter"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    from expert_residency.core.banks import build_unsplit_layer
    from expert_residency.core.counter import ExpertCounter
    from expert_residency.gpu import experts as gx
    from expert_residency.gpu.layout import to_kernel_layout
    from expert_residency.mxfp4 import quantize_mxfp4

    torch.manual_seed(6)
    p13, s13 = quantize_mxfp4(torch.randn(E, 2 * I, H) * 0.05)
    p2, s2 = quantize_mxfp4(torch.randn(E, H, I) * 0.05)
    full = {"w13_weight": p13, "w13_weight_scale": s13, "w2_weight": p2, "w2_weight_scale": s2}
    tiles = dict(block_m=4, block_n1=64, block_k1=128, block_n2=64, block_k2=64, split_k1=2, split_k2=2)
    to_kernel_layout(full, gx.KernelConfig(**tiles))
    layer = build_unsplit_layer(full, layer_index=0)
    ids = torch.tensor([[3, 5], [5, 0], [7, 3]])          # T = 3: a small step, 4 slots of 6 possible
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, H, generator=gen).bfloat16()
    weights = torch.softmax(torch.randn(3, K, generator=gen), -1)

    outs, counts = {}, {}
    for rows in (0, 1, 2):
        ex = gx.TritonMxfp4Experts(gx.ExpertShape(H, I), E, K, max_tokens=8, device="cpu",
                                   config=gx.KernelConfig(**tiles, slot_programs=rows))
        assert gx.effective_splits(ex.shape, ex.config) == (2, 2)
        counter = ExpertCounter([0], E, device="cpu")
        first = ex.forward(layer, x, weights, ids, counter=counter).clone()
        outs[rows] = ex.forward(layer, x, weights, ids, counter=counter).clone()
        assert torch.equal(first, outs[rows]), rows         # the second step saw clean tickets
        counts[rows] = counter.counts.flatten()[:E].to(torch.int64)

    assert torch.isfinite(outs[0].float()).all() and outs[0].abs().sum() > 0
    for rows in (1, 2):
        assert torch.equal(outs[rows], outs[0]), rows
        assert torch.equal(counts[rows], 2 * torch.bincount(ids.flatten(), minlength=E)), rows
