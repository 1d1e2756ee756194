"""Grouped steps of a split layer launch the cold experts' slots first (``KernelConfig.cold_first``),
under ``TRITON_INTERPRET=1``: the slots hold the cold experts present in the step, in id order, then
the hot ones, in both groupings (the one-program kernel and the torch ops above
``MAX_FUSED_PICKS``, which must agree exactly); every output bit is the same as with the slots in id
order and as the unsplit layer's, for MXFP4 and the BF16 layer; an unsplit layer keeps id order.
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
COLD = [6, 1, 4]            # the cold bank's experts (rows 0, 1, 2)
HOT = [0, 2, 3, 5, 7]
# Routing of five tokens: cold experts 1, 4 and 6 among hot ones, ids both below and above them.
IDS = [[7, 4], [1, 0], [5, 6], [4, 3], [2, 7]]


def _slots(ex) -> tuple[list[int], list[int], list[int]]:
    ws = ex.workspace
    n = int(ws.num_slots[0])
    picks = len(IDS) * K
    return (ws.slot_expert[:n].tolist(), ws.slot_start[:n + 1].tolist(), ws.sorted_pick[:picks].tolist())


def test_cold_slots_first_same_bits_under_triton_interpreter(monkeypatch) -> None:
    if rerun_interpreted(__file__, "test_cold_slots_first_same_bits_under_triton_interpreter"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer
    from expert_residency.gpu import experts as gx
    from expert_residency.gpu.layout import to_kernel_layout
    from expert_residency.mxfp4 import quantize_mxfp4

    torch.manual_seed(11)
    p13, s13 = quantize_mxfp4(torch.randn(E, 2 * I, H) * 0.05)
    p2, s2 = quantize_mxfp4(torch.randn(E, H, I) * 0.05)
    full = {"w13_weight": p13, "w13_weight_scale": s13, "w2_weight": p2, "w2_weight_scale": s2}
    tiles = dict(block_m=4, block_n1=64, block_k1=128, block_n2=64, block_k2=64)
    to_kernel_layout(full, gx.KernelConfig(**tiles))
    unsplit = build_unsplit_layer(full, layer_index=0)
    split = rehome_layer(dict(full), HOT, COLD, layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    x = torch.randn(len(IDS), H).bfloat16()
    ids = torch.tensor(IDS)
    weights = torch.softmax(torch.randn(len(IDS), K), -1)
    present = sorted(set(ids.flatten().tolist()))
    cold_then_hot = [e for e in present if e in COLD] + [e for e in present if e in HOT]

    outs, slots = {}, {}
    for cold_first in (True, False):
        ex = gx.TritonMxfp4Experts(gx.ExpertShape(H, I), E, K, max_tokens=8, device="cpu",
                                   config=gx.KernelConfig(**tiles, cold_first=cold_first))
        for torch_grouping in (False, True):
            monkeypatch.setattr(gx, "MAX_FUSED_PICKS", 4 if torch_grouping else 1024)
            for name, layer in (("split", split), ("unsplit", unsplit)):
                outs[(cold_first, torch_grouping, name)] = ex.forward(layer, x, weights, ids).clone()
                slots[(cold_first, torch_grouping, name)] = _slots(ex)

    expert_order = {key: s[0] for key, s in slots.items()}
    for torch_grouping in (False, True):
        assert expert_order[(True, torch_grouping, "split")] == cold_then_hot
        assert expert_order[(False, torch_grouping, "split")] == present
        assert expert_order[(True, torch_grouping, "unsplit")] == present     # no cold bank: id order
    assert cold_then_hot != present                                          # the order did change
    # the two groupings give the same slots, pick lists and starts
    assert slots[(True, False, "split")] == slots[(True, True, "split")]
    # each slot holds its expert's picks in pick order, whatever the slot order
    expert_of_pick = ids.flatten().tolist()
    for key, (experts, starts, sorted_pick) in slots.items():
        for slot, expert in enumerate(experts):
            members = sorted_pick[starts[slot]:starts[slot + 1]]
            assert members == [p for p in range(len(expert_of_pick)) if expert_of_pick[p] == expert], key
    reference = outs[(False, False, "unsplit")]
    for key, out in outs.items():
        assert torch.equal(out, reference), key


def test_bf16_layer_cold_slots_first_same_bits_under_triton_interpreter() -> None:
    if rerun_interpreted(__file__, "test_bf16_layer_cold_slots_first_same_bits_under_triton_interpreter"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer
    from expert_residency.gpu.dense_experts import DenseKernelConfig, TritonDenseExperts
    from expert_residency.gpu.experts import ExpertShape

    torch.manual_seed(12)
    full = {"w13_weight": (torch.randn(E, 2 * I, H) * 0.05).bfloat16(),
            "w2_weight": (torch.randn(E, H, I) * 0.05).bfloat16()}
    unsplit = build_unsplit_layer(dict(full), layer_index=0)
    split = rehome_layer(dict(full), HOT, COLD, layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    x = torch.randn(len(IDS), H).bfloat16()
    ids = torch.tensor(IDS)
    weights = torch.softmax(torch.randn(len(IDS), K), -1)
    outs, orders = {}, {}
    for cold_first in (True, False):
        ex = TritonDenseExperts(ExpertShape(H, I), E, K, max_tokens=8, device="cpu", expert_format="bf16",
                                config=DenseKernelConfig(cold_first=cold_first))
        for name, layer in (("split", split), ("unsplit", unsplit)):
            outs[(cold_first, name)] = ex.forward(layer, x, weights, ids).clone()
            orders[(cold_first, name)] = _slots(ex)[0]
    present = sorted(set(ids.flatten().tolist()))
    assert orders[(True, "split")] == [e for e in present if e in COLD] + [e for e in present if e in HOT]
    assert orders[(False, "split")] == orders[(True, "unsplit")] == present
    for key, out in outs.items():
        assert torch.equal(out, outs[(False, "unsplit")]), key


def test_describe_names_slots_in_id_order() -> None:
    """``describe()`` (the kernel config benches and the plugin print) names ``cold_first=False``
    and says nothing of the default, whose text stays as it was."""
    from expert_residency.gpu.dense_experts import DenseKernelConfig
    from expert_residency.gpu.experts import KernelConfig

    for config in (KernelConfig, DenseKernelConfig):
        default, off = config().describe(), config(cold_first=False).describe()
        assert "id-order-slots" not in default
        assert "id-order-slots" in off.split() and off.replace(" id-order-slots", "") == default
