"""The torch core on a CUDA GPU (run on one NVIDIA H200): same code as the CPU tests,
cold bank in pinned host memory read in place, the step captured in a CUDA graph.

Run there with ``PYTHONPATH=runtime:tests/runtime python3 -m pytest tests/runtime/test_core_cuda.py -q``.
Skips without CUDA. Claims and how each can fail:

* split == unsplit bit for bit on CUDA with the torch reference per-pick functions (bf16, MXFP4),
  the cold bank being pinned host memory behind a device view;
* the whole core step (route, per-pick, finalize, counter) captured once in a CUDA graph replays
  with new routing equal to eager unsplit, keeps doing so after swaps (map is device data), and
  the counter reset in place then equals a recount of the replays;
* the CUDA finalize produces the same bits as the CPU one (both are the correctly rounded fma);
* re-homing a mixed device/host-loaded model never allocates more device memory than the plan's
  predicted device peak, and ends at exactly the hot bytes.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run it on a GPU machine; BENCHMARKS.md gives the H200 commands)", allow_module_level=True)

import numpy as np  # noqa: E402
from expert_residency.core import (  # noqa: E402
    ExpertCounter,
    StagingBuffer,
    build_unsplit_layer,
    device_allocator,
    finalize,
    fma_f32,
    mapped_host_allocator,
    rehome_layer,
    rehome_model,
    residency_forward,
    swap_experts,
)
from expert_residency.core.reference import mxfp4_swiglu_per_pick, swiglu_per_pick  # noqa: E402
from test_core_fixtures import EXPERTS, float_layer, hidden_states, mxfp4_layer, random_partition, routing  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.torch]
DEV = torch.device("cuda")


class _CudaArray:
    """``__cuda_array_interface__`` over a pinned host buffer: torch.as_tensor aliases it (UVA)."""

    def __init__(self, host: torch.Tensor) -> None:
        self.__cuda_array_interface__ = {"shape": (host.numel() * host.element_size(),), "typestr": "|u1",
                                         "data": (host.data_ptr(), False), "strides": None, "version": 3}


def pinned_device_view(host: torch.Tensor) -> torch.Tensor:
    """A CUDA tensor over the same pinned host bytes (what vLLM's get_accelerator_view_from_cpu_tensor
    returns); kept local so the core's GPU check depends on nothing but torch."""
    raw = torch.as_tensor(_CudaArray(host), device=DEV)
    assert raw.data_ptr() == host.data_ptr(), "as_tensor copied instead of aliasing"
    return raw.view(host.dtype).view(host.shape)


def _cold_allocator():
    return mapped_host_allocator(pinned_device_view)


def _on_cuda(tensors):
    return {name: t.to(DEV) for name, t in tensors.items()}


@pytest.mark.parametrize("kind", ["bf16", "mxfp4"])
def test_split_equals_unsplit_with_pinned_cold_bank(kind):
    tensors = _on_cuda(mxfp4_layer(3) if kind == "mxfp4" else float_layer(3, torch.bfloat16))
    fn = mxfp4_swiglu_per_pick() if kind == "mxfp4" else swiglu_per_pick()
    hot, cold = random_partition(9, EXPERTS, 10)
    split = rehome_layer({n: t.clone() for n, t in tensors.items()}, hot, cold, layer_index=0,
                         hot_alloc=device_allocator(DEV), cold_alloc=_cold_allocator())
    assert split.cold.owners, "the cold bank's host memory must be owned by the bank"
    assert all(t.is_cuda for t in split.cold.tensors.values())
    # read in place: the device tensors are the pinned host buffers, not copies
    assert sorted(t.data_ptr() for t in split.cold.tensors.values()) == \
        sorted(o.data_ptr() for o in split.cold.owners)
    reference = build_unsplit_layer(tensors, layer_index=0)
    for seed in range(3):
        x = hidden_states(seed, 32, torch.bfloat16).to(DEV)
        ids, weights = routing(seed, 32, hot_ids=hot, cold_ids=cold)
        ids, weights = ids.to(DEV), weights.to(DEV)
        assert torch.equal(residency_forward(split, x, weights, ids, fn),
                           residency_forward(reference, x, weights, ids, fn))


def test_core_step_in_a_cuda_graph_with_swaps_and_counter():
    tensors = _on_cuda(mxfp4_layer(5))
    fn = mxfp4_swiglu_per_pick()
    hot, cold = random_partition(2, EXPERTS, 9)
    split = rehome_layer({n: t.clone() for n, t in tensors.items()}, hot, cold, layer_index=4,
                         hot_alloc=device_allocator(DEV), cold_alloc=_cold_allocator())
    reference = build_unsplit_layer(tensors, layer_index=4)
    counter = ExpertCounter((4,), EXPERTS, device=DEV)
    tokens = 24
    x0 = hidden_states(0, tokens, torch.bfloat16).to(DEV)
    ids0, w0 = (t.to(DEV) for t in routing(0, tokens))
    static_x, static_ids, static_w = x0.clone(), ids0.clone(), w0.clone()
    static_mask = torch.ones(tokens, dtype=torch.bool, device=DEV)

    def step():
        return residency_forward(split, static_x, static_w, static_ids, fn, counter=counter,
                                 token_mask=static_mask)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    counter.reset()  # in place: the graph keeps incrementing the same tensors

    recount = np.zeros(EXPERTS, dtype=np.int64)
    staging = StagingBuffer.for_layer(split)
    for seed in range(1, 7):
        x = hidden_states(seed, tokens, torch.bfloat16).to(DEV)
        ids, w = (t.to(DEV) for t in routing(seed, tokens, hot_ids=split.hot_ids, cold_ids=split.cold_ids))
        mask = torch.arange(tokens, device=DEV) < tokens - seed  # some padding
        static_x.copy_(x)
        static_ids.copy_(ids)
        static_w.copy_(w)
        static_mask.copy_(mask)
        graph.replay()
        assert torch.equal(out, residency_forward(reference, x, w, ids, fn)), seed
        recount += np.bincount(ids[: tokens - seed].reshape(-1).cpu().numpy(), minlength=EXPERTS)
        # swap at a barrier between steps; the next replay must still be exact
        swap_experts(split, [(split.hot_ids[seed % 9], split.cold_ids[seed % 7])], staging)
    counts, total, _ = counter.snapshot()
    assert np.array_equal(counts[0], recount)
    assert total == sum(tokens - s for s in range(1, 7))

    # a map flip without its copies, replayed, diverges (the check is real)
    from expert_residency.core import swap_steps
    swap_steps(split, split.hot_ids[0], split.cold_ids[0], staging)[-1].run()
    x = hidden_states(99, tokens, torch.bfloat16).to(DEV)
    ids, w = (t.to(DEV) for t in routing(99, tokens, hot_ids=split.hot_ids, cold_ids=split.cold_ids))
    static_x.copy_(x)
    static_ids.copy_(ids)
    static_w.copy_(w)
    graph.replay()
    assert not torch.equal(out, residency_forward(reference, x, w, ids, fn))


def test_finalize_bits_match_between_cuda_and_cpu():
    g = torch.Generator().manual_seed(3)
    n = 200_000
    a = torch.randn(n, generator=g) * torch.pow(2.0, torch.randint(-30, 30, (n,), generator=g).float())
    b = torch.randn(n, generator=g)
    c = torch.randn(n, generator=g) * torch.pow(2.0, torch.randint(-40, 40, (n,), generator=g).float())
    k = torch.randint(1, 2 ** 12, (n // 4,), generator=g).float()
    a[: n // 4] = 1 + k * 2 ** -12
    b[: n // 4] = 1 + k * 2 ** -12
    c[: n // 8] = torch.pow(2.0, -torch.randint(60, 120, (n // 8,), generator=g).float())
    assert torch.equal(fma_f32(a, b, c), fma_f32(a.to(DEV), b.to(DEV), c.to(DEV)).cpu())
    picks = torch.randn(64, 6, 512, generator=g).to(torch.bfloat16)
    weights = torch.softmax(torch.randn(64, 6, generator=g), dim=-1)
    assert torch.equal(finalize(picks, weights, torch.bfloat16),
                       finalize(picks.to(DEV), weights.to(DEV), torch.bfloat16).cpu())


def test_rehome_device_peak_within_plan():
    experts, hidden, inter = 64, 1024, 512  # ~0.79 MB per expert (MXFP4), ~50 MB per layer
    n_layers = 8
    on_device_layers = set(range(2, n_layers))
    cold_alloc = _cold_allocator()
    layer_tensors = {}
    device_ids = set()
    keep_host = []
    g = torch.Generator(device=DEV).manual_seed(0)
    for i in range(n_layers):
        shapes = {"w13_weight": (experts, 2 * inter, hidden // 2), "w13_weight_scale": (experts, 2 * inter, hidden // 32),
                  "w2_weight": (experts, hidden, inter // 2), "w2_weight_scale": (experts, hidden, inter // 32)}
        tensors = {}
        for name, shape in shapes.items():
            t = torch.randint(0, 255, shape, dtype=torch.uint8, device=DEV, generator=g)
            if i in on_device_layers:
                device_ids.add(id(t))
                tensors[name] = t
            else:  # like vLLM's UVA offloader: pinned host memory behind a device view
                view = cold_alloc(shape, torch.uint8)
                view.tensor.copy_(t)
                keep_host.append(view.owner)
                tensors[name] = view.tensor
            del t
        layer_tensors[i] = tensors
    hot_counts = {i: [48, 52, 40, 60, 50, 44, 56, 64][i] for i in range(n_layers)}
    hot = {i: random_partition(i, experts, n)[0] for i, n in hot_counts.items()}
    cold = {i: [e for e in range(experts) if e not in hot[i]] for i in hot}
    torch.cuda.synchronize()
    # requested bytes (not the caching allocator's rounded blocks) of everything alive now, minus
    # the device-resident originals = what is not expert memory
    stats = torch.cuda.memory_stats
    baseline = stats()["requested_bytes.all.current"] - sum(
        t.numel() for i in on_device_layers for t in layer_tensors[i].values())
    torch.cuda.reset_peak_memory_stats()
    state = rehome_model(layer_tensors, hot, cold, hot_alloc=device_allocator(DEV), cold_alloc=cold_alloc,
                         on_device=lambda t: id(t) in device_ids)
    torch.cuda.synchronize()
    peak = stats()["requested_bytes.all.peak"] - baseline
    final = stats()["requested_bytes.all.current"] - baseline
    codes_bytes = 4 * experts * n_layers
    assert state.plan.within_bound
    assert final == state.total.hot + codes_bytes
    assert peak <= state.plan.peak[0] + codes_bytes, (peak, state.plan.peak)
    assert state.plan.peak[0] <= max(state.plan.initial[0], state.plan.final[0]) + state.plan.largest_layer_bytes
    keep_host.clear()
