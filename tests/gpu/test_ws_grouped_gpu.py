"""The warp-specialized grouped expert launches (``KernelConfig.ws_grouped``, ``gpu.kernels_ws``) on
a GPU of compute capability 9.0+: every pick row and output equal the tl.dot launches' bit for bit
(the steps they take are the ones tl.dot would), split == unsplit with cold experts in pinned host
memory, the usage counter exact, and a captured graph replayed with new routing equal to eager."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton", reason="needs Triton (the H200 image has triton 3.6)")

from expert_residency.core.counter import ExpertCounter  # noqa: E402
from expert_residency.gpu.experts import KernelConfig, TritonMxfp4Experts, runs_warp_specialized  # noqa: E402
from expert_residency.gpu.graphs import CapturedStep  # noqa: E402
from routing_draws import random_routing  # noqa: E402
from test_gpu_residency import DEV, DSV41, SMALL, activations, make_layers  # noqa: E402

WS = KernelConfig(ws_grouped=True)
if not runs_warp_specialized(DEV, WS):
    pytest.skip("the warp-specialized kernels need sm_90+ and a Triton with Gluon", allow_module_level=True)


@pytest.mark.parametrize("shape,experts,cold,tokens", [("small", 16, 6, 17), ("small", 16, 6, 40),
                                                       ("dsv41", 32, 12, 17), ("dsv41", 64, 24, 96)])
def test_same_bits_as_tl_dot_split_and_unsplit_with_counter(shape: str, experts: int, cold: int,
                                                            tokens: int) -> None:
    geometry = SMALL if shape == "small" else DSV41
    gen = torch.Generator(device=DEV).manual_seed(300 + tokens)
    k = 6
    unsplit, split, hot_ids, cold_ids, _ = make_layers(geometry, experts, cold, gen)
    ids, w = random_routing(tokens, experts, k, gen, hot_ids, cold_ids)
    ids[0, 0] = -1   # another rank's expert (expert parallelism): adds nothing
    x = activations(tokens, geometry.hidden, gen)
    base = TritonMxfp4Experts(geometry, experts, k, max_tokens=tokens, device=DEV, swiglu_limit=10.0)
    ws = TritonMxfp4Experts(geometry, experts, k, max_tokens=tokens, device=DEV, swiglu_limit=10.0, config=WS)
    expected_rows = base.pick_outputs(unsplit, x, ids).clone()
    expected = base.forward(unsplit, x, w, ids)
    counter = ExpertCounter([0], experts, device=DEV)
    rows = ws.pick_outputs(split, x, ids, counter=counter).clone()
    valid = ids >= 0
    assert torch.equal(rows[valid], expected_rows[valid])
    assert torch.equal(ws.forward(unsplit, x, w, ids), expected)
    assert torch.equal(ws.forward(split, x, w, ids), expected)
    picked = ids[valid].flatten()
    assert torch.equal(counter.counts[0], torch.bincount(picked, minlength=experts))
    assert int(counter.tokens[0]) == tokens


def test_graph_replay_with_new_routing_equals_eager() -> None:
    gen = torch.Generator(device=DEV).manual_seed(331)
    experts, k, tokens = 16, 6, 24
    unsplit, split, hot_ids, cold_ids, _ = make_layers(SMALL, experts, 6, gen)
    ex = TritonMxfp4Experts(SMALL, experts, k, max_tokens=tokens, device=DEV, config=WS)
    out = torch.empty(tokens, SMALL.hidden, dtype=torch.bfloat16, device=DEV)
    ids, w = random_routing(tokens, experts, k, gen, hot_ids, cold_ids)
    x = activations(tokens, SMALL.hidden, gen)
    graph = CapturedStep(lambda xx, ww, ii: ex.forward(split, xx, ww, ii, out=out), x, w, ids)
    ids2, w2 = random_routing(tokens, experts, k, gen)
    x2 = activations(tokens, SMALL.hidden, gen)
    replayed = graph.replay(x2, w2, ids2).clone()
    base = TritonMxfp4Experts(SMALL, experts, k, max_tokens=tokens, device=DEV)
    assert torch.equal(replayed, base.forward(unsplit, x2, w2, ids2))
