"""With the adaptive policy on, the step path stays graph-safe: counting is the only device work it
adds, ``tick()`` adds no op at all, and barrier work happens only inside ``barrier()``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import ExpertCounter, device_allocator, host_allocator, rehome_layer, residency_forward  # noqa: E402
from expert_residency.core.adaptive import AdaptiveConfig, AdaptivePolicy  # noqa: E402
from expert_residency.core.reference import swiglu_per_pick  # noqa: E402
from test_core_fixtures import (  # noqa: E402
    EXPERTS,
    clone_tensors,
    float_layer,
    hidden_states,
    random_partition,
    routing,
    single_torch_thread,  # noqa: E402,F401  (autouse)
)
from test_core_graphsafe import FORBIDDEN, OpRecorder  # noqa: E402

pytestmark = pytest.mark.torch


def _setup(lookahead: bool | None = None):
    layers = {}
    for index in (1, 4):
        hot, cold = random_partition(index, EXPERTS, 9)
        layers[index] = rehome_layer(clone_tensors(float_layer(index, torch.bfloat16)), hot, cold,
                                     layer_index=index, hot_alloc=device_allocator("cpu"),
                                     cold_alloc=host_allocator(), hot_spare=2, cold_spare=2)
    counter = ExpertCounter((1, 4), EXPERTS)
    config = AdaptiveConfig(interval=2, swaps_per_layer=2, decay=0.5, margin=0.0, evidence=0.0, counts_evidence=0.0,
                            copy_rows_per_layer=1e6)
    policy = AdaptivePolicy(counter, layers, config, lookahead=lookahead)
    return layers, counter, policy


def _step(layers, counter, policy, seed):
    """Record one engine step (both layers' forwards with counting, then ``tick``); the inputs are
    built before recording, as the engine's router would have produced them."""
    fn = swiglu_per_pick()
    inputs = {}
    for index, layer in layers.items():
        ids, weights = routing(seed, 12, hot_ids=layer.hot_experts, cold_ids=layer.cold_experts)
        inputs[index] = (hidden_states(seed, 12, torch.bfloat16), weights, ids, torch.arange(12) < 10)
    with OpRecorder() as rec:
        for index, layer in layers.items():
            x, weights, ids, mask = inputs[index]
            residency_forward(layer, x, weights, ids, fn, counter=counter, token_mask=mask)
        due = policy.tick()
    return rec.ops, due


def test_step_path_with_adaptive_counting_has_no_sync_and_fixed_shapes():
    layers, counter, policy = _setup()
    first, due = _step(layers, counter, policy, 0)
    names = {name for name, _ in first}
    assert not names & FORBIDDEN, names & FORBIDDEN
    assert "index_add" in names or "index_add_" in names  # the counting the policy feeds on
    assert due is False
    second, due = _step(layers, counter, policy, 1)
    assert due is True
    before = [layer.hot_experts for layer in layers.values()]
    policy.barrier()  # the barrier may read back; it is outside the recorded step
    assert [layer.hot_experts for layer in layers.values()] != before  # the next step runs on a new map
    third, _ = _step(layers, counter, policy, 2)
    # the same op sequence and shapes whatever the routing and the live map
    assert second == first and third == first


def test_tick_adds_no_op():
    layers, counter, policy = _setup()
    with OpRecorder() as rec:
        for _ in range(5):
            policy.tick()
    assert rec.ops == []


@pytest.mark.parametrize("lookahead", [False, True])
def test_barrier_keeps_every_address_a_captured_graph_reads(lookahead):
    """Swaps write into the existing bank rows and row map: no tensor a graph captured is replaced."""
    layers, counter, policy = _setup(lookahead)

    def addresses():
        return {(index, name, bank): t.data_ptr() for index, layer in layers.items()
                for bank, b in (("hot", layer.hot), ("cold", layer.cold)) for name, t in b.tensors.items()} | \
            {(index, "codes", ""): layer.row_codes.data_ptr() for index, layer in layers.items()} | \
            {("counter", "counts", ""): counter.counts.data_ptr()}

    before = addresses()
    for seed in range(4):
        _step(layers, counter, policy, seed)
        policy.barrier()
        policy.pump()
    assert policy.swaps_done > 0
    assert addresses() == before


@pytest.mark.parametrize("lookahead", [False, True])
def test_barrier_device_part_is_capturable(lookahead):
    """What a barrier captures in a CUDA graph (window, decay, ranking) records no host-sync or
    data-dependent-shape op, the same ops and shapes at every barrier whatever the counts and the
    map, and writes only the policy's own buffers (their addresses never change)."""
    layers, counter, policy = _setup(lookahead)
    buffers = lambda: (policy.scores.data_ptr(), policy._seen.data_ptr(), policy._served_hot.data_ptr())  # noqa: E731
    before = buffers()
    recorded = []
    for seed in range(4):
        _step(layers, counter, policy, seed)
        _step(layers, counter, policy, seed + 10)
        with OpRecorder() as rec:
            out = policy._plan_on_device()
        recorded.append(rec.ops)
        names = {name for name, _ in rec.ops}
        assert not names & FORBIDDEN, names & FORBIDDEN
        assert tuple(out.shape) == (4 * 2 * 2 + 3,)   # promote, demote, accept, gain per (layer, column)
        # keep the policy's state as a barrier would leave it (apply this plan now)
        policy._swap_now(policy._parse(out.to("cpu"))[0], run=lambda steps: [st.run() for st in steps])
    assert policy.swaps_done > 0
    assert all(ops == recorded[0] for ops in recorded)
    assert buffers() == before
