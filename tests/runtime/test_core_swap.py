"""Swaps through a staging buffer keep outputs bit-identical; a mis-ordered swap is caught."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import (  # noqa: E402
    StagingBuffer,
    build_unsplit_layer,
    current_rowmap,
    decode_row_codes,
    device_allocator,
    host_allocator,
    rehome_layer,
    residency_forward,
    swap_experts,
    swap_steps,
)
from expert_residency.core.reference import mxfp4_swiglu_per_pick, swiglu_per_pick  # noqa: E402
from test_core_fixtures import (  # noqa: E402
    EXPERTS,
    clone_tensors,
    float_layer,
    hidden_states,
    mxfp4_layer,
    random_partition,
    single_torch_thread,  # noqa: E402,F401  (autouse)
)

pytestmark = pytest.mark.torch


def _setup(kind: str):
    tensors = mxfp4_layer(31) if kind == "mxfp4" else float_layer(31, torch.bfloat16)
    fn = mxfp4_swiglu_per_pick() if kind == "mxfp4" else swiglu_per_pick()
    hot, cold = random_partition(6, EXPERTS, 10)
    layer = rehome_layer(clone_tensors(tensors), hot, cold, layer_index=2,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    reference = build_unsplit_layer(tensors, layer_index=2)
    # every expert picked by some token, in every position
    ids = torch.tensor([[e, (e + 5) % EXPERTS, (e + 11) % EXPERTS] for e in range(EXPERTS)], dtype=torch.int32)
    weights = torch.softmax(torch.randn(EXPERTS, 3, generator=torch.Generator().manual_seed(1)), dim=-1)
    x = hidden_states(5, EXPERTS, torch.bfloat16)
    want = residency_forward(reference, x, weights, ids, fn)

    def check() -> bool:
        return torch.equal(residency_forward(layer, x, weights, ids, fn), want)

    return layer, check


@pytest.mark.parametrize("kind", ["bf16", "mxfp4"])
def test_ordered_swaps_are_bit_identical_before_and_after(kind):
    layer, check = _setup(kind)
    assert check()
    staging = StagingBuffer.for_layer(layer)
    pairs = [(layer.hot_ids[0], layer.cold_ids[0]), (layer.hot_ids[4], layer.cold_ids[3]),
             (layer.hot_ids[9], layer.cold_ids[5]), (layer.hot_ids[2], layer.cold_ids[1]),
             (layer.hot_ids[7], layer.cold_ids[2])]
    before_hot, before_cold = list(layer.hot_ids), list(layer.cold_ids)
    for hot_expert, cold_expert in pairs:
        swap_experts(layer, [(hot_expert, cold_expert)], staging)
        assert check()
        assert cold_expert in layer.hot_ids and hot_expert in layer.cold_ids
        assert decode_row_codes(layer.row_codes) == (layer.hot_ids, layer.cold_ids)
    # shapes unchanged (shape_hash), assignment changed (content_hash)
    assert len(layer.hot_ids) == len(before_hot) and len(layer.cold_ids) == len(before_cold)
    assert set(layer.hot_ids) != set(before_hot)
    assert all(layer.hot[name].shape[0] == 10 for name in layer.hot.tensors)


def test_swap_changes_content_hash_not_shape_hash():
    layer, _ = _setup("bf16")
    before = current_rowmap({2: layer})
    swap_experts(layer, [(layer.hot_ids[3], layer.cold_ids[4])])
    after = current_rowmap({2: layer})
    assert after.shape_hash() == before.shape_hash()
    assert after.content_hash() != before.content_hash()


@pytest.mark.parametrize("kind", ["bf16", "mxfp4"])
def test_map_flip_before_the_copies_is_caught(kind):
    """A forward that runs between a premature map flip and the copies reads the wrong rows."""
    layer, check = _setup(kind)
    steps = swap_steps(layer, layer.hot_ids[1], layer.cold_ids[2], StagingBuffer.for_layer(layer))
    flip = [s for s in steps if s.kind == "map"]
    copies = [s for s in steps if s.kind == "copy"]
    assert len(flip) == 1 and steps[-1] is flip[0]  # the correct order: copies, then the flip
    flip[0].run()
    assert not check()  # caught
    for step in copies:
        step.run()
    assert check()  # once the copies land, the same state as an ordered swap


def test_map_flip_without_copies_is_caught():
    layer, check = _setup("bf16")
    steps = swap_steps(layer, layer.hot_ids[0], layer.cold_ids[0], StagingBuffer.for_layer(layer))
    steps[-1].run()
    assert not check()


def test_swap_that_forgets_the_scales_is_caught():
    """Weights and block scales must move together: copying only the packed weights diverges."""
    layer, check = _setup("mxfp4")
    steps = swap_steps(layer, layer.hot_ids[5], layer.cold_ids[1], StagingBuffer.for_layer(layer))
    for step in steps:
        if step.kind == "map" or "_scale" not in step.description:
            step.run()
    assert not check()


def test_copies_in_the_wrong_order_are_caught():
    """Overwriting the hot row before it is staged loses the hot expert."""
    layer, check = _setup("bf16")
    steps = swap_steps(layer, layer.hot_ids[6], layer.cold_ids[3], StagingBuffer.for_layer(layer))
    by_tensor: dict[str, list] = {}
    for step in steps[:-1]:
        by_tensor.setdefault(step.description.split(":")[0], []).append(step)
    for stage, hot_in, cold_out in by_tensor.values():
        hot_in.run()
        stage.run()
        cold_out.run()
    steps[-1].run()
    assert not check()


def test_swap_rejects_bad_requests():
    layer, _ = _setup("bf16")
    staging = StagingBuffer.for_layer(layer)
    with pytest.raises(ValueError, match="is not hot"):
        swap_steps(layer, layer.cold_ids[0], layer.cold_ids[1], staging)
    with pytest.raises(ValueError, match="is not cold"):
        swap_steps(layer, layer.hot_ids[0], layer.hot_ids[1], staging)
    other, _ = _setup("mxfp4")
    with pytest.raises(ValueError, match="staging buffer"):
        swap_steps(layer, layer.hot_ids[0], layer.cold_ids[0], StagingBuffer.for_layer(other))
