"""The T = 1 warp-MMA expert kernels (``gpu.kernels_t1``) on a CUDA GPU (the H200 device).

Run there with ``PYTHONPATH=runtime python3 -m pytest tests/gpu/test_t1_warp_mma.py -q``. Skips on
machines without CUDA, saying why (Triton's interpreter cannot run their inline PTX; on CPU the
launch logic takes the ``tl.dot`` schedule, which ``test_layout_and_interpreter.py`` covers).

Claims and how each can fail:
* the default config launches exactly these two kernels at T = 1 and none at T = 2 or with
  ``t1_warp_mma=False`` (a launch counter, so a silent fallback fails);
* at DSv4.1 geometry (5,120 / 2,304: 128-wide K steps, 128-row w2 tiles), gpt-oss geometry
  (2,880 / 2,880: 64-wide tiles, biases, SwiGLU-OAI, 45 half-steps so one warpgroup) and a small
  one: split == unsplit bit for bit (``torch.equal``) on an all-hot, an all-cold and a straddling
  token, for several warpgroup and chain counts and with either launch through tl.dot; within
  1e-2 relative L2 of the core's torch reference and of the ``tl.dot`` T = 1 kernels (a wrong
  fragment mapping gives O(1));
* the counter counts exactly the computed picks (masked token: nothing; ids -1 and >= E: not
  counted, and they add ``fma(0, 0, acc)``: the output == the core's fma finalize over the
  computed rows with the skipped ones zeroed, bit for bit, though their workspace rows are NaN);
* a CUDA graph of three layers at T = 1 replayed with new routing == eager, counter == recount;
* the loop trip length (``t1_unroll*``: 4, 12, 16 against the default 8) changes no bit: the same
  outputs and per-pick rows as the default (``torch.equal``), split == unsplit, at every
  geometry, and the launches really take it (the kernels' ``UNROLL`` argument);
* the T = 1 launches' register cap (``t1_max_registers``, 128) changes no bit against uncapped
  launches (hot, cold and straddling tokens, split == unsplit), and the launches take it;
* the one-launch T = 1 layer (``t1_fused``, off by default) gives the separate launches' output,
  per-pick rows and counter bit for bit (hot, cold, straddling, skipped picks, a masked token),
  split == unsplit, is the only expert launch, leaves its per-pick counts at zero, and replays in a
  CUDA graph as eager;
* the shared-memory pipeline (``t1_smem_stages``: 2 stages of 8 half-steps, 3 of 4) changes no
  bit against the register ring with the same trips, at T = 1 and in grouped steps of 5 and 12
  tokens, split == unsplit, and the launches take it (``SMEM_STAGES``);
* grouped steps (``gw_max_tokens=16``, the default: T = 2..16 on ``w13_gw_kernel`` /
  ``w2_gw_kernel``, up to eight picks of an expert per program; each program runs its slot's
  passes in turn, or with ``gw_pass_loop=False`` one program per pass): each launched once per
  layer with a grid of one pass (ceil(T / 8) passes for the pass grid; none with the knob at 0,
  within 1e-2 of the ``tl.dot`` grouped kernels then),
  every token's output and per-pick rows bit for bit what the T = 1 kernels give that token
  alone (a column that read another column's token, or a wrong pick store, breaks it), slots of
  up to twelve picks (two passes) and, with the knob raised to 48, of 30-35 at T = 40 (four or
  five passes), -1 and >= E picks, split == unsplit, the counter == recount,
  and a CUDA graph of the grouped step replayed with new routing == eager.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (inline PTX does not run under TRITON_INTERPRET=1): run it on a "
                "GPU machine (BENCHMARKS.md gives the H200 commands)", allow_module_level=True)
pytest.importorskip("triton", reason="needs Triton (the H200 image has triton 3.6)")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))

from expert_residency.core.banks import build_unsplit_layer, device_allocator, rehome_layer  # noqa: E402
from expert_residency.core.counter import ExpertCounter  # noqa: E402
from expert_residency.core.fma_finalize import finalize as core_finalize  # noqa: E402
from expert_residency.core.formats_ref import gptoss_mxfp4_per_pick  # noqa: E402
from expert_residency.core.reference import mxfp4_swiglu_per_pick  # noqa: E402
from expert_residency.core.split import residency_forward  # noqa: E402
from expert_residency.gpu import kernels_t1  # noqa: E402
from expert_residency.gpu.experts import ExpertShape, KernelConfig, TritonMxfp4Experts, config_for_shape  # noqa: E402
from expert_residency.gpu.graphs import CapturedStep  # noqa: E402
from expert_residency.gpu.pinned import pinned_view_allocator  # noqa: E402
from expert_residency.mxfp4 import quantize_mxfp4  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
REL_TOL = 1e-2
E, COLD = 12, 6
# name: (geometry, activation, top-k, biases)
GEOMETRIES = {"dsv41": (ExpertShape(5120, 2304), "silu", 6, False),
              "gptoss": (ExpertShape(2880, 2880), "swigluoai", 4, True),
              "small": (ExpertShape(512, 256), "silu", 6, False)}


def _experts(shape: ExpertShape, biases: bool, seed: int) -> dict[str, torch.Tensor]:
    """Checkpoint-like MXFP4 experts (products ~N(0, 4^2), so gpt-oss's 7.0 clamp bites), drawn
    and quantized on the GPU (the CPU takes ~20 s per DSv4.1 layer)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    h, i = shape.hidden, shape.intermediate
    p13, s13 = quantize_mxfp4(torch.randn(E, 2 * i, h, generator=g, device=DEV) * (4.0 / h ** 0.5))
    p2, s2 = quantize_mxfp4(torch.randn(E, h, i, generator=g, device=DEV) / i ** 0.5)
    out = {"w13_weight": p13, "w13_weight_scale": s13, "w2_weight": p2, "w2_weight_scale": s2}
    if biases:
        out["w13_bias"] = torch.randn(E, 2 * i, generator=g, device=DEV) * 0.5
        out["w2_bias"] = torch.randn(E, h, generator=g, device=DEV) * 0.2
    return out


def _layers(name: str, config: KernelConfig, seed: int = 3, layer_index: int = 0, max_tokens: int = 4):
    shape, act, k, biases = GEOMETRIES[name]
    original = _experts(shape, biases, seed)
    ex = TritonMxfp4Experts(shape, E, k, max_tokens=max_tokens, device=DEV, config=config, activation=act)
    full = {n: t.clone() for n, t in original.items()}
    ex.to_kernel_layout(full)
    perm = torch.randperm(E, generator=torch.Generator().manual_seed(7)).tolist()
    cold, hot = sorted(perm[:COLD]), perm[COLD:]
    unsplit = build_unsplit_layer({n: t.clone() for n, t in full.items()}, layer_index=layer_index)
    split = rehome_layer(dict(full), hot, cold, layer_index=layer_index, hot_alloc=device_allocator(DEV),
                         cold_alloc=pinned_view_allocator(DEV))
    return ex, split, unsplit, build_unsplit_layer(original, layer_index=layer_index), hot, cold


def _config(name: str, **fields) -> KernelConfig:
    # the warp-MMA kernels under test: the warp-specialized grouped launches (which take grouped
    # steps from ws_min_tokens on, compute capability 9.x) stay off unless a test asks for them
    fields.setdefault("ws_grouped", False)
    return config_for_shape(GEOMETRIES[name][0], KernelConfig(**fields))


class _LaunchCount:
    """Counts the grid launches of one Triton kernel (and launches it)."""

    def __init__(self, kernel) -> None:
        self.kernel, self.calls = kernel, 0

    def __getitem__(self, grid):
        self.calls += 1
        self.grid = grid
        return self.kernel[grid]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _rows(hot: list[int], cold: list[int], k: int) -> list[list[int]]:
    return [hot[:k], cold[:k], hot[:k // 2] + cold[:k - k // 2]]


def _tokens(hot: list[int], cold: list[int], ex: TritonMxfp4Experts, seed: int):
    """(ids, router weights, x) of one token per row of ``_rows``: all hot, all cold, straddling."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    for row in _rows(hot, cold, ex.top_k):
        w = torch.softmax(torch.randn(1, ex.top_k, generator=gen, device=DEV), -1)
        yield torch.tensor([row], device=DEV), w, torch.randn(1, ex.shape.hidden, generator=gen,
                                                               device=DEV).bfloat16()


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_default_t1_launches_the_warp_mma_kernels(name: str, monkeypatch) -> None:
    w13 = _LaunchCount(kernels_t1.w13_t1_kernel)
    w2 = _LaunchCount(kernels_t1.w2_t1_kernel)
    monkeypatch.setattr(kernels_t1, "w13_t1_kernel", w13)
    monkeypatch.setattr(kernels_t1, "w2_t1_kernel", w2)
    ex, split, _, _, hot, cold = _layers(name, _config(name))
    k = ex.top_k
    assert ex._t1_groups is not None and "T1-warp-mma" in ex.config.describe()
    x = torch.randn(2, ex.shape.hidden, device=DEV).bfloat16()
    w = torch.softmax(torch.randn(2, k, device=DEV), -1)
    ids = torch.tensor([hot[:k], cold[:k]], device=DEV)
    ex.forward(split, x[:1], w[:1], ids[:1])
    assert (w13.calls, w2.calls) == (1, 1)
    ex.forward(split, x, w, ids)                       # T = 2: a grouped step, not these kernels
    assert (w13.calls, w2.calls) == (1, 1)
    off, split_off, _, _, _, _ = _layers(name, _config(name, t1_warp_mma=False))
    assert off._t1_groups is None
    off.forward(split_off, x[:1], w[:1], ids[:1])
    assert (w13.calls, w2.calls) == (1, 1)


# (w13 warpgroups, w2 warpgroups, chains): 0 warpgroups = that launch through tl.dot
SCHEDULES = [(1, 1, 1), (2, 2, 2), (4, 2, 4), (2, 0, 2), (0, 2, 1)]


@pytest.mark.parametrize("groups", SCHEDULES, ids=lambda g: "g{}-{}c{}".format(*g))
@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_split_equals_unsplit_and_matches_reference(name: str, groups: tuple[int, int, int]) -> None:
    cfg = _config(name, t1_warpgroups1=groups[0], t1_warpgroups2=groups[1], t1_chains1=groups[2],
                  t1_chains2=groups[2])
    ex, split, unsplit, reference, hot, cold = _layers(name, cfg)
    dot = TritonMxfp4Experts(ex.shape, E, ex.top_k, max_tokens=4, device=DEV,
                             config=_config(name, t1_warp_mma=False), activation=ex.activation)
    assert ex._t1_groups is not None and dot._t1_groups is None
    per_pick = gptoss_mxfp4_per_pick() if ex.activation == "swigluoai" else mxfp4_swiglu_per_pick()
    k = ex.top_k
    for ids, w, x in _tokens(hot, cold, ex, 17):
        out = ex.forward(split, x, w, ids).clone()
        picks = ex.workspace.pick_out[:k].clone()
        assert torch.equal(out, ex.forward(unsplit, x, w, ids))
        assert torch.equal(picks, ex.workspace.pick_out[:k])
        ref = residency_forward(reference, x, w, ids, per_pick, pick_dtype=torch.bfloat16)
        via_dot = dot.forward(split, x, w, ids)
        rel, rel_dot = _rel(out, ref), _rel(out, via_dot)
        print(f"\n[{name} {groups}] row {ids.tolist()[0]}: warp-MMA vs torch reference {rel:.2e}, "
              f"vs tl.dot T=1 {rel_dot:.2e}")
        assert torch.isfinite(out.float()).all()
        assert rel <= REL_TOL and rel_dot <= REL_TOL


@pytest.mark.parametrize("name", ["dsv41", "small"])
def test_128_row_w13_tiles_give_the_64_row_tiles_bits(name: str) -> None:
    """The T = 1 w13 kernel on a layout of 128-row w13 tiles reads each 64-row rep where it lies
    and computes what it computes on 64-row tiles, bit for bit (split and unsplit)."""
    ex64, split64, _, _, hot, cold = _layers(name, _config(name, block_n1=64))
    ex128, split128, unsplit128, _, _, _ = _layers(name, _config(name, block_n1=128))
    assert ex128.config.block_n1 == 128 and ex128._t1_groups is not None
    for ids, w, x in _tokens(hot, cold, ex64, 23):
        want = ex64.forward(split64, x, w, ids).clone()
        assert torch.equal(ex128.forward(split128, x, w, ids), want)
        assert torch.equal(ex128.forward(unsplit128, x, w, ids), want)


@pytest.mark.parametrize("name", ["dsv41", "gptoss"])
def test_counter_mask_and_skipped_picks(name: str) -> None:
    ex, split, unsplit, _, hot, cold = _layers(name, _config(name))
    dot = TritonMxfp4Experts(ex.shape, E, ex.top_k, max_tokens=4, device=DEV,
                             config=_config(name, t1_warp_mma=False, fuse_finalize=False),
                             activation=ex.activation)
    k = ex.top_k
    counter = ExpertCounter([0], E, device=DEV)
    gen = torch.Generator(device=DEV).manual_seed(5)
    x = torch.randn(1, ex.shape.hidden, generator=gen, device=DEV).bfloat16()
    w = torch.softmax(torch.randn(1, k, generator=gen, device=DEV), -1)
    row = hot[:k - 2] + [-1, E]                      # two skipped picks (another rank's, out of range)
    ids = torch.tensor([row], device=DEV)
    ex.workspace.pick_out.fill_(float("nan"))
    out = ex.forward(split, x, w, ids, counter=counter).clone()
    expect = torch.zeros(E, dtype=torch.int64, device=DEV)
    expect[torch.tensor(hot[:k - 2], device=DEV)] += 1
    assert torch.equal(counter.counts[0], expect) and int(counter.tokens[0]) == 1
    assert torch.equal(out, ex.forward(unsplit, x, w, ids))
    # skipped picks add fma(0, 0, acc): the core's fma finalize over the computed rows with the
    # skipped ones (NaN in the workspace) and their weights zeroed, bit for bit
    rows = ex.workspace.pick_out[:k].view(1, k, ex.shape.hidden).clone()
    routed = (ids >= 0) & (ids < E)
    expect_out = core_finalize(torch.where(routed.unsqueeze(-1), rows, torch.zeros_like(rows)),
                               torch.where(routed, w, torch.zeros_like(w)), torch.bfloat16)
    assert torch.equal(out, expect_out)
    # the computed rows are right: the tl.dot T=1 kernels and the separate finalize with ids
    assert _rel(out, dot.finalize(dot.pick_outputs(split, x, ids), w, topk_ids=ids)) <= REL_TOL
    assert not torch.isnan(out).any()
    # a masked token computes nothing; its output is unspecified but finite over a finite
    # workspace (the NaN rows above are this test's poison: zero them, as a fresh workspace is)
    ex.workspace.pick_out.zero_()
    masked = ex.forward(split, x, w, torch.tensor([cold[:k]], device=DEV), counter=counter,
                        token_mask=torch.zeros(1, dtype=torch.int32, device=DEV))
    assert torch.equal(counter.counts[0], expect) and int(counter.tokens[0]) == 1   # nothing counted
    assert torch.isfinite(masked.float()).all()


def test_graph_replay_equals_eager_with_counter() -> None:
    name = "dsv41"
    built = [_layers(name, _config(name), seed=s, layer_index=i) for i, s in enumerate((1, 2, 3))]
    ex = built[0][0]
    k, h = ex.top_k, ex.shape.hidden
    counter = ExpertCounter([0, 1, 2], E, device=DEV)
    outs = [torch.empty(1, h, dtype=torch.bfloat16, device=DEV) for _ in built]
    gen = torch.Generator(device=DEV).manual_seed(9)

    def step(x, w, ids):
        for i, layer in enumerate(built):
            ex.forward(layer[1], x[i], w[i], ids[i], counter=counter, out=outs[i])
        return torch.stack(outs)

    def routing():
        ids = torch.stack([torch.randperm(E, generator=gen, device=DEV)[:k].view(1, k) for _ in built])
        w = torch.softmax(torch.randn(len(built), 1, k, generator=gen, device=DEV), -1)
        return torch.randn(len(built), 1, h, generator=gen, device=DEV).bfloat16(), w, ids

    graph = CapturedStep(step, *routing())
    counter.reset()
    recount = torch.zeros(len(built), E, dtype=torch.int64, device=DEV)
    for _ in range(3):
        x, w, ids = routing()
        replayed = graph.replay(x, w, ids).clone()
        eager = torch.stack([ex.forward(layer[2], x[i], w[i], ids[i]) for i, layer in enumerate(built)])
        assert torch.equal(replayed, eager)
        for i in range(len(built)):
            recount[i] += torch.bincount(ids[i].flatten(), minlength=E)
    assert torch.equal(counter.counts, recount)
    assert counter.tokens.tolist() == [3] * len(built)


# loop trips of 4, 8 (the default), 12 and 16 half-steps: gpt-oss's 45 half-steps leave a rest of
# 1 / 5 / 9 / 13 straight-line steps, DSv4.1's w2 (18 per warpgroup) 2 / 2 / 6 / 2
UNROLLS = [(4, 4), (12, 16), (16, 12)]


class _LaunchArgs(_LaunchCount):
    """Records the keyword arguments of each launch (and launches it)."""

    def __getitem__(self, grid):
        launch = super().__getitem__(grid)

        def run(*args, **kwargs):
            self.kwargs = kwargs
            return launch(*args, **kwargs)
        return run


def _record_t1_launches(monkeypatch) -> tuple[_LaunchArgs, _LaunchArgs]:
    """The two T = 1 kernels wrapped so that each records its last launch's keyword arguments."""
    w13, w2 = _LaunchArgs(kernels_t1.w13_t1_kernel), _LaunchArgs(kernels_t1.w2_t1_kernel)
    monkeypatch.setattr(kernels_t1, "w13_t1_kernel", w13)
    monkeypatch.setattr(kernels_t1, "w2_t1_kernel", w2)
    return w13, w2


@pytest.mark.parametrize("unroll", UNROLLS, ids=lambda u: "unroll{}-{}".format(*u))
@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_loop_trip_length_changes_no_bit(name: str, unroll: tuple[int, int], monkeypatch) -> None:
    base, split0, _, _, hot, cold = _layers(name, _config(name))
    ex, split, unsplit, _, _, _ = _layers(name, _config(name, t1_unroll1=unroll[0], t1_unroll2=unroll[1]))
    w13, w2 = _record_t1_launches(monkeypatch)
    k = ex.top_k
    for ids, w, x in _tokens(hot, cold, ex, 23):
        expect = base.forward(split0, x, w, ids).clone()
        assert (w13.kwargs["UNROLL"], w2.kwargs["UNROLL"]) == (KernelConfig.t1_unroll1, KernelConfig.t1_unroll2)
        expect_picks = base.workspace.pick_out[:k].clone()
        out = ex.forward(split, x, w, ids).clone()
        assert (w13.kwargs["UNROLL"], w2.kwargs["UNROLL"]) == unroll
        assert torch.equal(out, expect)
        assert torch.equal(ex.workspace.pick_out[:k], expect_picks)
        assert torch.equal(out, ex.forward(unsplit, x, w, ids))


def _grouped_routing(hot: list[int], cold: list[int], k: int, t: int, gen: torch.Generator) -> torch.Tensor:
    """``[t, k]`` ids: every token picks from the same few experts (slots of up to ``t`` picks),
    hot, cold and straddling rows, the last token with a -1 and an out-of-range id."""
    pool = hot[:k // 2 + 1] + cold[:k - k // 2 + 1]
    rows = []
    for i in range(t):
        order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(int(gen.initial_seed()) + i))
        rows.append([pool[j] for j in order[:k].tolist()])
    rows[-1][0], rows[-1][-1] = -1, E
    return torch.tensor(rows, device=DEV)


@pytest.mark.parametrize("pass_loop", [True, False], ids=["pass-loop", "pass-grid"])
@pytest.mark.parametrize("tokens", [2, 5, 12, 40])
@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_grouped_steps_give_each_token_its_t1_bits(name: str, tokens: int, pass_loop: bool, monkeypatch) -> None:
    """(At T = 12 the routing puts up to twelve picks in a slot: two passes of eight, run by one
    program in turn (the default pass loop) or by two programs (the pass grid); at T = 40 more
    than 24: four passes or more.)"""
    w13 = _LaunchCount(kernels_t1.w13_gw_kernel)
    w2 = _LaunchCount(kernels_t1.w2_gw_kernel)
    monkeypatch.setattr(kernels_t1, "w13_gw_kernel", w13)
    monkeypatch.setattr(kernels_t1, "w2_gw_kernel", w2)
    config = _config(name, gw_max_tokens=48, gw_pass_loop=pass_loop, gw_max_registers=128 if pass_loop else 0)
    ex, split, unsplit, reference, hot, cold = _layers(name, config, max_tokens=max(16, tokens))
    k, h = ex.top_k, ex.shape.hidden
    gen = torch.Generator(device=DEV).manual_seed(31 + tokens)
    ids = _grouped_routing(hot, cold, k, tokens, torch.Generator().manual_seed(tokens))
    routed_ids = ids[(ids >= 0) & (ids < E)]
    most = int(torch.bincount(routed_ids).max())
    assert (most > 8) == (tokens >= 12) and (most > 24) == (tokens == 40)   # passes of eight picks
    w = torch.softmax(torch.randn(tokens, k, generator=gen, device=DEV), -1)
    x = torch.randn(tokens, h, generator=gen, device=DEV).bfloat16()
    counter = ExpertCounter([0], E, device=DEV)
    ex.workspace.pick_out.fill_(float("nan"))
    out = ex.forward(split, x, w, ids, counter=counter).clone()
    picks = ex.workspace.pick_out[:tokens * k].clone().view(tokens, k, h)
    assert (w13.calls, w2.calls) == (1, 1)
    assert w13.grid[2] == w2.grid[2] == (1 if pass_loop else -(-tokens // 8))
    assert torch.equal(out, ex.forward(unsplit, x, w, ids))
    assert (w13.calls, w2.calls) == (2, 2)
    routed = (ids >= 0) & (ids < E)
    recount = torch.bincount(ids[routed].flatten(), minlength=E)
    assert torch.equal(counter.counts[0], recount) and int(counter.tokens[0]) == tokens
    for i in range(tokens):
        alone = ex.forward(split, x[i:i + 1], w[i:i + 1], ids[i:i + 1]).clone()   # the T = 1 kernels
        assert torch.equal(out[i:i + 1], alone), f"token {i}"
        alone_rows = ex.workspace.pick_out[:k]
        assert torch.equal(picks[i][routed[i]], alone_rows[routed[i]]), f"token {i} rows"
    assert (w13.calls, w2.calls) == (2, 2)
    assert torch.isfinite(out.float()).all()
    per_pick = gptoss_mxfp4_per_pick() if ex.activation == "swigluoai" else mxfp4_swiglu_per_pick()
    ref = residency_forward(reference, x, w, ids, per_pick, pick_dtype=torch.bfloat16)
    assert _rel(out, ref) <= REL_TOL
    # the default takes T = 2 / 5 / 12; T = 40 runs here with the knob raised to 48
    assert (tokens <= KernelConfig().gw_max_tokens) == (tokens < 40) and KernelConfig().gw_pass_loop
    off, split_off, _, _, _, _ = _layers(name, _config(name, gw_max_tokens=0), max_tokens=max(16, tokens))
    off.forward(split_off, x, w, ids)                  # switched off: the tl.dot grouped kernels
    assert (w13.calls, w2.calls) == (2, 2)
    assert _rel(out, off.forward(split_off, x, w, ids)) <= REL_TOL


def test_grouped_step_graph_replay_equals_eager() -> None:
    name, t = "dsv41", 6
    ex, split, unsplit, _, hot, cold = _layers(name, _config(name, gw_max_tokens=16), max_tokens=t)
    k, h = ex.top_k, ex.shape.hidden
    counter = ExpertCounter([0], E, device=DEV)
    gen = torch.Generator(device=DEV).manual_seed(13)

    def routing():
        ids = torch.stack([torch.randperm(E, generator=gen, device=DEV)[:k] for _ in range(t)])
        w = torch.softmax(torch.randn(t, k, generator=gen, device=DEV), -1)
        return torch.randn(t, h, generator=gen, device=DEV).bfloat16(), w, ids

    graph = CapturedStep(lambda x, w, ids: ex.forward(split, x, w, ids, counter=counter), *routing())
    counter.reset()
    recount = torch.zeros(E, dtype=torch.int64, device=DEV)
    for _ in range(3):
        x, w, ids = routing()
        replayed = graph.replay(x, w, ids).clone()
        assert torch.equal(replayed, ex.forward(unsplit, x, w, ids))
        recount += torch.bincount(ids.flatten(), minlength=E)
    assert torch.equal(counter.counts[0], recount) and int(counter.tokens[0]) == 3 * t


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_register_cap_changes_no_bit(name: str, monkeypatch) -> None:
    """``t1_max_registers`` (128 by default) changes how ptxas allocates registers and schedules
    loads, not what is multiplied: on hot, cold and straddling tokens the outputs and per-pick
    rows equal the uncapped launches' bit for bit, split == unsplit, and the T = 1 launches take
    the cap (``maxnreg``) while the uncapped ones pass none."""
    base, split0, _, _, hot, cold = _layers(name, _config(name, t1_max_registers=0))
    ex, split, unsplit, _, _, _ = _layers(name, _config(name))
    w13, w2 = _record_t1_launches(monkeypatch)
    k = ex.top_k
    for ids, w, x in _tokens(hot, cold, ex, 47):
        expect = base.forward(split0, x, w, ids).clone()
        assert "maxnreg" not in w13.kwargs and "maxnreg" not in w2.kwargs
        expect_picks = base.workspace.pick_out[:k].clone()
        out = ex.forward(split, x, w, ids).clone()
        assert w13.kwargs["maxnreg"] == w2.kwargs["maxnreg"] == KernelConfig.t1_max_registers == 128
        assert torch.equal(out, expect)
        assert torch.equal(ex.workspace.pick_out[:k], expect_picks)
        assert torch.equal(out, ex.forward(unsplit, x, w, ids))


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_one_launch_gives_the_separate_launches_bits(name: str, monkeypatch) -> None:
    """``t1_fused``: the T = 1 layer in one launch (``kernels_t1.t1_fused_kernel``) runs the two
    launches' arithmetic item by item, so on hot, cold and straddling tokens, a token with two
    skipped picks (-1 and E) and a masked token its output, its per-pick rows of computed picks and
    the counter equal the separate launches' bit for bit; split == unsplit; it is the only expert
    launch; its per-pick counts are back at zero after every call (the next call's waits start from
    them); and three layers captured in a CUDA graph replay with new routing as eager."""
    base, split0, _, _, hot, cold = _layers(name, _config(name))
    ex, split, unsplit, _, _, _ = _layers(name, _config(name, t1_fused=True))
    k = ex.top_k
    fused = _LaunchCount(kernels_t1.t1_fused_kernel)
    separate = _record_t1_launches(monkeypatch)
    monkeypatch.setattr(kernels_t1, "t1_fused_kernel", fused)
    gen = torch.Generator(device=DEV).manual_seed(61)
    steps = [(ids, w, x, None) for ids, w, x in _tokens(hot, cold, ex, 59)]
    x = torch.randn(1, ex.shape.hidden, generator=gen, device=DEV).bfloat16()
    w = torch.softmax(torch.randn(1, k, generator=gen, device=DEV), -1)
    steps.append((torch.tensor([hot[:k - 2] + [-1, E]], device=DEV), w, x, None))
    steps.append((torch.tensor([cold[:k]], device=DEV), w, x, torch.zeros(1, dtype=torch.int32, device=DEV)))
    for ids, w, x, mask in steps:
        c_base, c_ex = ExpertCounter([0], E, device=DEV), ExpertCounter([0], E, device=DEV)
        expect = base.forward(split0, x, w, ids, counter=c_base, token_mask=mask).clone()
        routed = ((ids >= 0) & (ids < E)).view(-1)
        expect_picks = base.workspace.pick_out[:k][routed].clone()
        calls = (fused.calls, separate[0].calls, separate[1].calls)
        out = ex.forward(split, x, w, ids, counter=c_ex, token_mask=mask).clone()
        assert (fused.calls, separate[0].calls, separate[1].calls) == (calls[0] + 1, calls[1], calls[2])
        assert int(ex.split_scratch.t1_ready.abs().sum()) == 0
        assert torch.equal(c_ex.counts, c_base.counts) and torch.equal(c_ex.tokens, c_base.tokens)
        if mask is None:   # a masked token's output rows are unspecified
            assert torch.equal(out, expect)
            assert torch.equal(ex.workspace.pick_out[:k][routed], expect_picks)
            assert torch.equal(out, ex.forward(unsplit, x, w, ids))
    built = [_layers(name, _config(name, t1_fused=True), seed=s, layer_index=i) for i, s in enumerate((4, 5, 6))]
    outs = [torch.empty(1, ex.shape.hidden, dtype=torch.bfloat16, device=DEV) for _ in built]

    def step(xs, ws, idss):
        for i, layer in enumerate(built):
            layer[0].forward(layer[1], xs[i], ws[i], idss[i], out=outs[i])
        return torch.stack(outs)

    def routing():
        ids = torch.stack([torch.randperm(E, generator=gen, device=DEV)[:k].view(1, k) for _ in built])
        ws = torch.softmax(torch.randn(len(built), 1, k, generator=gen, device=DEV), -1)
        return torch.randn(len(built), 1, ex.shape.hidden, generator=gen, device=DEV).bfloat16(), ws, ids

    graph = CapturedStep(step, *routing())
    for _ in range(3):
        xs, ws, idss = routing()
        replayed = graph.replay(xs, ws, idss).clone()
        eager = torch.stack([layer[0].forward(layer[2], xs[i], ws[i], idss[i]) for i, layer in enumerate(built)])
        assert torch.equal(replayed, eager)


@pytest.mark.parametrize("smem", [(2, 8), (3, 4)], ids=lambda s: "stages{}-unroll{}".format(*s))
@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_shared_memory_pipeline_changes_no_bit(name: str, smem: tuple[int, int], monkeypatch) -> None:
    """``t1_smem_stages``: the weights reach the same MMAs, in the same order, through Triton's
    shared-memory pipeline instead of the register ring: at T = 1 (hot, cold and straddling
    tokens) and in grouped steps of 5 and 12 tokens, outputs and per-pick rows equal the ring's
    with the same loop trips bit for bit, split == unsplit, and the launches take it."""
    stages, unroll = smem
    base, split0, _, _, hot, cold = _layers(name, _config(name, t1_unroll1=unroll, t1_unroll2=unroll), max_tokens=16)
    ex, split, unsplit, _, _, _ = _layers(name, _config(name, t1_unroll1=unroll, t1_unroll2=unroll,
                                                        t1_smem_stages=stages), max_tokens=16)
    launches = {n: _LaunchArgs(getattr(kernels_t1, n))
                for n in ("w13_t1_kernel", "w2_t1_kernel", "w13_gw_kernel", "w2_gw_kernel")}
    for n, launch in launches.items():
        monkeypatch.setattr(kernels_t1, n, launch)
    k = ex.top_k
    steps = list(_tokens(hot, cold, ex, 41))
    for tokens in (5, 12):
        gen = torch.Generator(device=DEV).manual_seed(43 + tokens)
        ids = _grouped_routing(hot, cold, k, tokens, torch.Generator().manual_seed(tokens))
        steps.append((ids, torch.softmax(torch.randn(tokens, k, generator=gen, device=DEV), -1),
                       torch.randn(tokens, ex.shape.hidden, generator=gen, device=DEV).bfloat16()))
    for ids, w, x in steps:
        t = ids.shape[0]
        w13, w2 = (launches["w13_t1_kernel"], launches["w2_t1_kernel"]) if t == 1 else \
            (launches["w13_gw_kernel"], launches["w2_gw_kernel"])
        expect = base.forward(split0, x, w, ids).clone()
        assert w13.kwargs["SMEM_STAGES"] == w2.kwargs["SMEM_STAGES"] == 0
        routed = ((ids >= 0) & (ids < E)).view(-1)     # skipped picks' workspace rows are not written
        expect_picks = base.workspace.pick_out[:t * k][routed].clone()
        out = ex.forward(split, x, w, ids).clone()
        assert w13.kwargs["SMEM_STAGES"] == w2.kwargs["SMEM_STAGES"] == stages
        assert torch.equal(out, expect)
        assert torch.equal(ex.workspace.pick_out[:t * k][routed], expect_picks)
        assert torch.equal(out, ex.forward(unsplit, x, w, ids))
