"""The warp-specialized grouped expert launches (``KernelConfig.ws_grouped``, the default on Hopper,
``gpu.kernels_ws``) on a GPU of compute capability 9.x: every pick row and output equal the tl.dot
launches' bit for bit (``BASE``: both off, so tl.dot takes every grouped step), split == unsplit with
cold experts in pinned host memory, the usage counter exact, a captured graph replayed with new
routing equal to eager, and a kernel that does not compile falls back to tl.dot."""

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

WS = KernelConfig()
BASE = KernelConfig(ws_grouped=False, gw_max_tokens=0)   # tl.dot at every grouped step


def _step(geometry, experts: int, cold: int, tokens: int, seed: int):
    """Split and unsplit layers of ``experts`` (``cold`` of them in pinned host memory), routing
    over both banks and activations for a step of ``tokens``."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    unsplit, split, hot_ids, cold_ids, _ = make_layers(geometry, experts, cold, gen)
    ids, w = random_routing(tokens, experts, 6, gen, hot_ids, cold_ids)
    return unsplit, split, ids, w, activations(tokens, geometry.hidden, gen)
if not runs_warp_specialized(DEV, WS):
    pytest.skip("the warp-specialized kernels need compute capability 9.x and a Triton with Gluon",
                allow_module_level=True)


@pytest.mark.parametrize("shape,experts,cold,tokens", [("small", 16, 6, 2), ("small", 16, 6, 6), ("small", 16, 6, 17),
                                                       ("small", 16, 6, 40), ("dsv41", 32, 12, 3),
                                                       ("dsv41", 32, 12, 6), ("dsv41", 32, 12, 16),
                                                       ("dsv41", 64, 24, 96)])
def test_same_bits_as_tl_dot_split_and_unsplit_with_counter(shape: str, experts: int, cold: int,
                                                            tokens: int) -> None:
    geometry = SMALL if shape == "small" else DSV41
    gen = torch.Generator(device=DEV).manual_seed(300 + tokens)
    k = 6
    unsplit, split, hot_ids, cold_ids, _ = make_layers(geometry, experts, cold, gen)
    ids, w = random_routing(tokens, experts, k, gen, hot_ids, cold_ids)
    ids[0, 0] = -1   # another rank's expert (expert parallelism): adds nothing
    x = activations(tokens, geometry.hidden, gen)
    base = TritonMxfp4Experts(geometry, experts, k, max_tokens=tokens, device=DEV, swiglu_limit=10.0, config=BASE)
    ws = TritonMxfp4Experts(geometry, experts, k, max_tokens=tokens, device=DEV, swiglu_limit=10.0, config=WS)
    assert ws._gw_max_tokens() == WS.ws_min_tokens - 1
    expected_rows = base.pick_outputs(unsplit, x, ids).clone()
    expected = base.forward(unsplit, x, w, ids)
    counter = ExpertCounter([0], experts, device=DEV)
    rows = ws.pick_outputs(split, x, ids, counter=counter).clone()
    valid = ids >= 0
    assert torch.equal(rows[valid], expected_rows[valid])
    assert torch.equal(ws.forward(unsplit, x, w, ids), expected)
    assert torch.equal(ws.forward(split, x, w, ids), expected)
    assert {which for which, _ in ws._ws_compiled} == {"w13", "w2"} and ws._ws   # they ran, no fallback
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
    assert {which for which, _ in ex._ws_compiled} == {"w13", "w2"}
    base = TritonMxfp4Experts(SMALL, experts, k, max_tokens=tokens, device=DEV, config=BASE)
    assert torch.equal(replayed, base.forward(unsplit, x2, w2, ids2))


@pytest.mark.parametrize("fields", [dict(ws_cold_programs=1), dict(ws_cold_programs=0), dict(cold_first=False),
                                    dict(ws_programs_per_sm=1), dict(ws_programs_per_sm=4),
                                    dict(ws_prefetch=not WS.ws_prefetch),
                                    dict(ws_prefetch=not WS.ws_prefetch, ws_programs_per_sm=3),
                                    dict(ws_programs_per_sm=2), dict(ws_loader_warps1=1, ws_loader_warps2=1),
                                    dict(ws_loader_warps1=2, ws_loader_warps2=2, ws_programs_per_sm=4)])
def test_cold_program_split_and_grid_settings_keep_the_bits(fields: dict) -> None:
    experts, k, tokens = 32, 6, 33
    unsplit, split, ids, w, x = _step(DSV41, experts, 12, tokens, 350)
    base = TritonMxfp4Experts(DSV41, experts, k, max_tokens=tokens, device=DEV, config=BASE)
    ws = TritonMxfp4Experts(DSV41, experts, k, max_tokens=tokens, device=DEV, config=KernelConfig(**fields))
    assert torch.equal(ws.forward(split, x, w, ids), base.forward(unsplit, x, w, ids))
    assert {which for which, _ in ws._ws_compiled} == {"w13", "w2"} and ws._ws


def test_t1_grouped_with_one_token_off_has_the_tl_dot_bits() -> None:
    """ws_min_tokens=1 with one_token off: T = 1 grouped like larger steps, through these launches."""
    experts, k, tokens = 32, 6, 1
    unsplit, split, ids, w, x = _step(DSV41, experts, 12, tokens, 370)
    grouped_tl_dot = KernelConfig(ws_grouped=False, gw_max_tokens=0, one_token=False)
    base = TritonMxfp4Experts(DSV41, experts, k, max_tokens=tokens, device=DEV, config=grouped_tl_dot)
    ws = TritonMxfp4Experts(DSV41, experts, k, max_tokens=tokens, device=DEV,
                            config=KernelConfig(one_token=False, ws_min_tokens=1))
    counter = ExpertCounter([0], experts, device=DEV)
    assert torch.equal(ws.forward(split, x, w, ids, counter=counter), base.forward(unsplit, x, w, ids))
    assert {which for which, _ in ws._ws_compiled} == {"w13", "w2"} and ws._ws
    assert torch.equal(counter.counts[0], torch.bincount(ids.flatten(), minlength=experts))


def test_a_kernel_that_does_not_compile_falls_back_to_tl_dot(monkeypatch) -> None:
    from expert_residency.gpu import kernels_ws

    class Broken:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise RuntimeError("async_copy_global_to_shared has been removed; call async_load instead")
            return launch

    monkeypatch.setitem(kernels_ws.KERNELS, "w13", Broken())
    experts, k, tokens = 16, 6, 20
    unsplit, split, ids, w, x = _step(SMALL, experts, 6, tokens, 360)
    base = TritonMxfp4Experts(SMALL, experts, k, max_tokens=tokens, device=DEV, config=BASE)
    ws = TritonMxfp4Experts(SMALL, experts, k, max_tokens=tokens, device=DEV, config=WS)
    assert ws._gw_max_tokens() == WS.ws_min_tokens - 1
    with pytest.warns(RuntimeWarning, match="did not compile with Triton .*async_load.*other MoE kernels from now on"):
        out = ws.forward(split, x, w, ids)
    assert torch.equal(out, base.forward(unsplit, x, w, ids))
    assert not ws._ws   # later steps go straight to tl.dot, and the warp-MMA kernels keep 2..16 again
    assert ws._gw_max_tokens() == WS.gw_max_tokens


def test_programs_per_sm_by_default_are_what_was_measured_best_on_this_gpu() -> None:
    """0 (the default) resolves from the device's memory clock and bus width on layers with every
    expert in HBM: 4 on an H200, 2 on an H100 (BENCHMARKS.md, runs SH and OC; other GPUs only
    resolve to 2 or 4); split layers take 2. A count in the config holds on both."""
    ex = TritonMxfp4Experts(SMALL, 32, 6, max_tokens=4, device=DEV, config=KernelConfig())
    name = torch.cuda.get_device_name(DEV)
    expected = 4 if "H200" in name else 2 if "H100" in name else None
    assert ex.ws_programs_on(split=False) == ex.ws_programs_per_sm
    assert ex.ws_programs_per_sm == expected if expected else ex.ws_programs_per_sm in (2, 4)
    assert ex.ws_programs_on(split=True) == 2
    three = TritonMxfp4Experts(SMALL, 32, 6, max_tokens=4, device=DEV, config=KernelConfig(ws_programs_per_sm=3))
    assert three.ws_programs_on(split=True) == three.ws_programs_on(split=False) == 3
