"""A router id outside ``0..E-1`` (vLLM's -1: a pick computed on another rank, or unrouted) adds
``fma(0, 0, acc)`` in the core torch path, as ``parallel.ep.ep_forward`` and the Triton kernels do:
never the last expert's row (``codes[-1]`` wraps around) nor a stale ``pick_out`` row."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import (  # noqa: E402
    ExpertCounter,
    build_unsplit_layer,
    device_allocator,
    finalize,
    host_allocator,
    rehome_layer,
    residency_forward,
    route_picks,
    split_invoke,
)
from expert_residency.core.reference import mxfp4_swiglu_per_pick, swiglu_per_pick  # noqa: E402
from expert_residency.parallel.ep import ep_forward  # noqa: E402
from expert_residency.vllm_plugin.expert_parallel import local_ids, local_picks  # noqa: E402
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

# token 0: a skipped pick in the middle; token 1: the last expert routed for real; token 2: two
# skipped picks (one past the end in IDS); token 3: every pick skipped.
MINUS_ONE_IDS = torch.tensor([[3, -1, 7, 0], [EXPERTS - 1, 2, 5, 9], [-1, 4, -1, 1], [-1, -1, -1, -1]],
                             dtype=torch.int32)
IDS = MINUS_ONE_IDS.clone()
IDS[2, 2] = EXPERTS
WEIGHTS = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], [0.5, 0.2, 0.2, 0.1],
                        [0.3, 0.3, 0.2, 0.2]], dtype=torch.float32)
SKIPPED = (IDS < 0) | (IDS >= EXPERTS)
assert torch.equal(SKIPPED, MINUS_ONE_IDS < 0)


def _layers(tensors):
    hot, cold = random_partition(21, EXPERTS, 6)
    assert EXPERTS - 1 in cold   # the wrapped-around row would be a cold one
    split = rehome_layer(clone_tensors(tensors), hot, cold, layer_index=2,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    return build_unsplit_layer(tensors, layer_index=2), split


def _expected(layer, x, fn, dtype, ids):
    """Independent expectation: every pick computed on a valid id (skipped ones on expert 0), then
    the skipped ones' rows and weights zeroed, so their fma step is fma(0, 0, acc)."""
    skipped = (ids < 0) | (ids >= EXPERTS)
    safe = torch.where(skipped, torch.zeros_like(ids), ids)
    picks = split_invoke(layer, x, safe, fn)
    picks = torch.where(skipped.unsqueeze(-1), torch.zeros_like(picks), picks)
    return finalize(picks, torch.where(skipped, 0.0, WEIGHTS.to(ids.device)), dtype)


@pytest.mark.parametrize("ids", [MINUS_ONE_IDS, IDS], ids=["minus_one", "minus_one_and_E"])
@pytest.mark.parametrize("fmt", ["bf16", "mxfp4"])
def test_out_of_range_id_adds_nothing(fmt, ids):
    if fmt == "bf16":
        tensors, fn, dtype = float_layer(5, torch.bfloat16, bias=True), swiglu_per_pick(), torch.bfloat16
    else:
        tensors, fn, dtype = mxfp4_layer(6), mxfp4_swiglu_per_pick(), torch.bfloat16
    unsplit, split = _layers(tensors)
    x = hidden_states(8, IDS.shape[0], dtype)
    want = _expected(unsplit, x, fn, dtype, ids)
    # ep_forward with the identity expert map: the same skipped picks are other ranks' there
    identity = torch.arange(EXPERTS, dtype=torch.int32)
    for layer in (unsplit, split):
        got = residency_forward(layer, x, WEIGHTS, ids, fn)
        assert torch.equal(got, want)
        assert torch.equal(ep_forward(layer, x, WEIGHTS, ids, identity, fn), want)
    assert torch.equal(want[3], torch.zeros_like(want[3]))
    # and not what wrapping -1 to the last expert computes (the old behaviour)
    wrapped = torch.where(MINUS_ONE_IDS < 0, MINUS_ONE_IDS + EXPERTS, MINUS_ONE_IDS)
    assert not torch.equal(residency_forward(unsplit, x, WEIGHTS, wrapped, fn)[0], want[0])


def test_stale_pick_out_rows_are_not_read():
    """``split_invoke`` into a reused ``pick_out``: a skipped pick's row is 0, not the old value."""
    unsplit, split = _layers(float_layer(7, torch.float32))
    x = hidden_states(9, IDS.shape[0], torch.float32)
    for layer in (unsplit, split):
        stale = torch.full((IDS.shape[0], IDS.shape[1], x.shape[1]), 7.0)
        picks = split_invoke(layer, x, IDS, swiglu_per_pick(), pick_out=stale)
        assert torch.equal(picks[SKIPPED], torch.zeros_like(picks[SKIPPED]))
        assert (picks[~SKIPPED] != 7.0).all()


def test_route_picks_masks_skip_out_of_range_ids():
    unsplit, split = _layers(float_layer(1, torch.float32))
    for layer in (unsplit, split):
        r = route_picks(layer.row_codes, IDS)
        assert torch.equal(r.valid, ~SKIPPED)
        assert not (r.hot_mask & r.cold_mask).any()
        assert torch.equal(r.hot_mask | r.cold_mask, ~SKIPPED)
        assert int(r.hot_rows.max()) < max(layer.hot.num_rows, 1)
        assert int(r.cold_rows.max()) < max(layer.cold.num_rows, 1)


def test_expert_map_lookups_do_not_wrap():
    """vLLM plugin EP helpers: a -1 global id is another rank's pick, not global expert E-1's."""
    emap = torch.full((EXPERTS,), -1, dtype=torch.int32)
    emap[EXPERTS - 4:] = torch.arange(4, dtype=torch.int32)      # this rank holds the last 4 experts
    ids = torch.tensor([[-1, EXPERTS - 1, 0, EXPERTS]], dtype=torch.int32)
    weights = torch.tensor([[0.5, 0.25, 0.125, 0.125]])
    assert local_ids(emap, ids).tolist() == [[-1, 3, -1, -1]]
    slots, w = local_picks(emap, ids, weights)
    assert slots.tolist() == [[0, 3, 0, 0]] and w.tolist() == [[0.0, 0.25, 0.0, 0.0]]


def test_counter_ignores_out_of_range_ids():
    counter = ExpertCounter([2], EXPERTS)
    counter.count(2, IDS)
    counts, tokens, _ = counter.snapshot()
    want = torch.zeros(EXPERTS, dtype=torch.int64)
    for e in IDS[~SKIPPED].tolist():
        want[e] += 1
    assert counts[0].tolist() == want.tolist() and tokens == IDS.shape[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run it on a GPU machine)")
def test_skipped_picks_in_a_cuda_graph():
    """The skip is device data: a captured step replays new routing (with -1s) equal to eager."""
    dev = torch.device("cuda")
    tensors = {n: t.to(dev) for n, t in float_layer(4, torch.bfloat16, bias=True).items()}
    hot, cold = random_partition(21, EXPERTS, 6)
    layer = rehome_layer(tensors, hot, cold, layer_index=2, hot_alloc=device_allocator(dev),
                         cold_alloc=device_allocator(dev))
    fn = swiglu_per_pick()
    x = hidden_states(8, IDS.shape[0], torch.bfloat16).to(dev)
    ids = torch.zeros_like(IDS, device=dev)
    weights = WEIGHTS.to(dev)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        residency_forward(layer, x, weights, ids, fn)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = residency_forward(layer, x, weights, ids, fn)
    for routed in (MINUS_ONE_IDS, IDS):
        ids.copy_(routed.to(dev))
        graph.replay()
        eager = residency_forward(layer, x, weights, routed.to(dev), fn)
        assert torch.equal(out, eager)
        assert torch.equal(out, _expected(layer, x, fn, torch.bfloat16, routed.to(dev)))
