"""The adaptive policy's lookahead path (plans read ``plan_delay`` steps after their barrier, copies
issued beside the steps, flip-only steps between barriers) on the CPU, through a class shift: every
forward equals the unsplit layer bit for bit, and a plan ranked on the map before a flip-only step
is scheduled against the map after it (a transfer flipped in between may already have moved one of
its experts: such a swap is dropped, never reserved against a map it does not fit)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import (  # noqa: E402
    ExpertCounter,
    build_unsplit_layer,
    device_allocator,
    host_allocator,
    rehome_layer,
    residency_forward,
)
from expert_residency.core.adaptive import AdaptiveConfig, AdaptivePolicy  # noqa: E402
from expert_residency.core.reference import mxfp4_swiglu_per_pick  # noqa: E402
from expert_residency.core.slots import share_row_codes  # noqa: E402
from test_adaptive_policy import LAYERS, class_probs, sample_ids, top_hot  # noqa: E402
from test_core_fixtures import EXPERTS, TOP_K, hidden_states, mxfp4_layer  # noqa: E402

pytestmark = pytest.mark.torch
TOKENS = 16


def test_lookahead_through_a_shift_stays_exact_and_skips_swaps_a_flip_already_made():
    fn = mxfp4_swiglu_per_pick()
    agent = class_probs("agent")
    split, ref = {}, {}
    for row, index in enumerate(LAYERS):
        tensors = mxfp4_layer(60 + row)
        hot, cold = top_hot(agent[row])
        split[index] = rehome_layer({n: t.clone() for n, t in tensors.items()}, hot, cold, layer_index=index,
                                    hot_alloc=device_allocator(torch.device("cpu")), cold_alloc=host_allocator(),
                                    hot_spare=2, cold_spare=2)
        ref[index] = build_unsplit_layer(tensors, layer_index=index)
    share_row_codes(split, order=LAYERS)
    counter = ExpertCounter(LAYERS, EXPERTS, top_k=TOP_K)
    # The GPU's lookahead settings on the CPU: plans read two steps after their barrier, so a
    # flip-only step (every flip_interval forwards) can fall between a plan's ranking and its read.
    policy = AdaptivePolicy(counter, split, AdaptiveConfig(interval=3, swaps_per_layer=2, decay=0.5, margin=0.25,
                                                           evidence=0.0, counts_evidence=0.0),
                            lookahead=True, plan_delay=2)
    g = torch.Generator().manual_seed(11)
    step_no = 0
    for phase in ("agent", "prose", "math"):
        probs = class_probs(phase)
        for _ in range(12):
            for row, i in enumerate(LAYERS):
                ids = sample_ids(probs[row], TOKENS, g)
                x = hidden_states(100 + step_no, TOKENS, torch.bfloat16)
                w = torch.softmax(torch.randn(TOKENS, TOP_K, generator=g), -1)
                out = residency_forward(split[i], x, w, ids, fn, counter=counter)
                assert torch.equal(out, residency_forward(ref[i], x, w, ids, fn)), f"step {step_no} layer {i}"
            step_no += 1
            if policy.tick():
                policy.barrier()
            policy.pump()
            for transfer in policy.in_flight:   # what is copying always fits the live map
                layer = split[transfer.swap.layer]
                assert transfer.swap.promote in layer.cold_ids and transfer.swap.demote in layer.hot_ids
    assert policy.lookahead_on and policy.copied_bytes["in"] > 0
    assert policy.swaps_done >= 4
