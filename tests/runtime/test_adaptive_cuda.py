"""The adaptive policy on a CUDA GPU (the H200): the step of two MXFP4 layers captured once in a CUDA
graph, the cold banks in pinned host memory read in place, routing shifting agent → prose → math;
the swaps' copies run on side streams between and beside the replays (0.4 expert rows per layer and
step), a barrier every few replays flips the map outside the graph, and every replay stays
bit-identical to eager unsplit, and after every barrier a check routing every expert through every
top-k slot does too. Skips without CUDA.

Run there with ``PYTHONPATH=runtime:tests/runtime python3 -m pytest tests/runtime/test_adaptive_cuda.py -q -s``
(``-s`` prints the median barrier time, a figure for the record, not an assertion).
"""

from __future__ import annotations

import statistics
import time

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run it on a GPU machine; BENCHMARKS.md gives the H200 commands)", allow_module_level=True)

from expert_residency.core import (  # noqa: E402
    ExpertCounter,
    build_unsplit_layer,
    device_allocator,
    mapped_host_allocator,
    rehome_layer,
    residency_forward,
)
from expert_residency.core.adaptive import AdaptiveConfig, AdaptivePolicy  # noqa: E402
from expert_residency.core.reference import mxfp4_swiglu_per_pick  # noqa: E402
from expert_residency.core.slots import share_row_codes  # noqa: E402
from test_adaptive_policy import LAYERS, class_probs, sample_ids, top_hot  # noqa: E402
from test_core_cuda import pinned_device_view  # noqa: E402
from test_core_fixtures import EXPERTS, TOP_K, hidden_states, mxfp4_layer  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.torch]
DEV = torch.device("cuda")
TOKENS = 16


def test_graph_replays_stay_exact_through_adaptive_swap_rounds():
    fn = mxfp4_swiglu_per_pick()
    agent = class_probs("agent")
    split, ref = {}, {}
    for row, index in enumerate(LAYERS):
        tensors = {n: t.to(DEV) for n, t in mxfp4_layer(60 + row).items()}
        hot, cold = top_hot(agent[row])
        split[index] = rehome_layer({n: t.clone() for n, t in tensors.items()}, hot, cold, layer_index=index,
                                    hot_alloc=device_allocator(DEV),
                                    cold_alloc=mapped_host_allocator(pinned_device_view), hot_spare=2,
                                    cold_spare=2)
        ref[index] = build_unsplit_layer(tensors, layer_index=index)
    share_row_codes(split, order=LAYERS)   # as the plugin does, before the capture
    counter = ExpertCounter(LAYERS, EXPERTS, device=DEV, top_k=TOP_K)
    policy = AdaptivePolicy(counter, split, AdaptiveConfig(interval=3, swaps_per_layer=2, decay=0.5,
                                                           margin=0.25, evidence=0.0, counts_evidence=0.0))
    assert policy.graph_state == "captured"   # at start-up: no capture (and its device sync) on a step
    static = {i: {"x": hidden_states(0, TOKENS, torch.bfloat16).to(DEV),
                  "ids": torch.zeros(TOKENS, TOP_K, dtype=torch.int32, device=DEV),
                  "w": torch.full((TOKENS, TOP_K), 1.0 / TOP_K, device=DEV)} for i in LAYERS}
    for i in LAYERS:
        static[i]["ids"].copy_(torch.arange(TOP_K, device=DEV).expand(TOKENS, TOP_K))

    def step():
        return {i: residency_forward(split[i], static[i]["x"], static[i]["w"], static[i]["ids"], fn,
                                     counter=counter) for i in LAYERS}

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    counter.reset()

    def eager_reference(i):
        return residency_forward(ref[i], static[i]["x"], static[i]["w"], static[i]["ids"], fn)

    def full_check() -> bool:
        ids = torch.tensor([[(e + 5 * k) % EXPERTS for k in range(TOP_K)] for e in range(EXPERTS)],
                           dtype=torch.int32, device=DEV)
        x = hidden_states(7, EXPERTS, torch.bfloat16).to(DEV)
        w = torch.softmax(torch.randn(EXPERTS, TOP_K, generator=torch.Generator().manual_seed(7)), -1).to(DEV)
        return all(torch.equal(residency_forward(split[i], x, w, ids, fn), residency_forward(ref[i], x, w, ids, fn))
                   for i in LAYERS)

    addresses = {i: (split[i].row_codes.data_ptr(), tuple(t.data_ptr() for t in split[i].hot.tensors.values()))
                 for i in LAYERS}
    g = torch.Generator().manual_seed(11)
    barrier_s = []
    step_no = 0
    for phase in ("agent", "prose", "math"):
        probs = class_probs(phase)
        for _ in range(12):
            for row, i in enumerate(LAYERS):
                static[i]["ids"].copy_(sample_ids(probs[row], TOKENS, g).to(DEV))
                static[i]["x"].copy_(hidden_states(100 + step_no, TOKENS, torch.bfloat16).to(DEV))
                static[i]["w"].copy_(torch.softmax(torch.randn(TOKENS, TOP_K, generator=g), -1).to(DEV))
            graph.replay()
            for i in LAYERS:
                assert torch.equal(outs[i], eager_reference(i)), f"replay {step_no} layer {i} ({phase})"
            step_no += 1
            if policy.tick():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                report = policy.barrier()
                torch.cuda.synchronize()
                barrier_s.append(time.perf_counter() - t0)
                assert full_check(), f"bit-exact check failed after barrier {report.barrier}"
            policy.pump()   # this step's copies, on the side streams, beside the next replay
    assert policy.lookahead_on and policy.copied_bytes["in"] > 0
    assert policy.copies.memcpy is not None   # the copies went through the CUDA runtime's memcpy
    assert policy.swaps_done >= 4
    assert {i: (split[i].row_codes.data_ptr(), tuple(t.data_ptr() for t in split[i].hot.tensors.values()))
            for i in LAYERS} == addresses
    print(f"\nadaptive barrier on {torch.cuda.get_device_name()}: median {statistics.median(barrier_s) * 1e3:.2f} ms "
          f"over {len(barrier_s)} barriers, {policy.swaps_done} swaps (2 layers x 16 experts, MXFP4 test geometry)")


def test_the_side_streams_copy_through_the_cuda_runtime_both_ways_exactly():
    """The pump's pieces go through ``cudaMemcpyAsync`` of the runtime PyTorch loaded (not
    ``Tensor.copy_``): host row → HBM row through the mapped view the cold bank uses, HBM row → a
    pinned host row, each a byte range inside a row; a size mismatch is refused."""
    from expert_residency.core.copies import CudaCopies

    engine = CudaCopies(DEV)
    assert engine.memcpy is not None, "no libcudart mapped into this process: the copies fell back to copy_"
    g = torch.Generator().manual_seed(3)
    host = torch.randint(0, 256, (3, 4096), dtype=torch.uint8, generator=g).pin_memory()
    mapped = pinned_device_view(host)
    hbm = torch.randint(0, 256, (3, 4096), dtype=torch.uint8, generator=g).to(DEV)
    back = torch.zeros(3, 4096, dtype=torch.uint8).pin_memory()
    expect_hbm, expect_back = hbm.clone(), back.clone()
    expect_hbm[1, 100:3000] = host[2, 100:3000].to(DEV)
    expect_back[0, 7:4000] = hbm[0, 7:4000].cpu()
    engine.issue([(hbm[1, 100:3000], mapped[2, 100:3000], "in"), (back[0, 7:4000], hbm[0, 7:4000], "out")])
    engine.compute_waits([engine.marker()])
    torch.cuda.current_stream().synchronize()
    assert torch.equal(hbm, expect_hbm) and torch.equal(back, expect_back)
    with pytest.raises(ValueError, match="a copy of 10 B into 9 B"):
        engine.issue([(hbm[2, :9], mapped[0, :10], "in")])
