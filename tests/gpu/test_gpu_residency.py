"""GPU residency path on a CUDA GPU (the H200 device): Triton MXFP4 experts over a hot HBM bank and
a cold bank in pinned host memory read in place.

Run there with ``PYTHONPATH=runtime python3 -m pytest tests/gpu -q`` (or ``python3
tests/gpu/test_gpu_residency.py``). Skips on machines without CUDA or Triton, saying why.

Claims and how each can fail:
* split == unsplit bit for bit (torch.equal) with the Triton kernel — random routing, tokens
  entirely hot, entirely cold and straddling, experts with more picks than one tile (chunk loop),
  both dequantizers, the real DSv4.1 expert geometry and a small one;
* the same with vLLM's SwiGLU clamp (``swiglu_limit``), against the clamped torch reference;
* Triton vs the core's torch MXFP4 reference within a stated tolerance (relative L2 <= 1e-2: the
  reference rounds the SwiGLU activation and pick rows to bf16 like the kernel, so the gap is fp32
  summation order plus the occasional bf16 rounding flip; measured ~1e-3);
* the small-step schedule (T=1 ungrouped, optional split-K) against the whole-K grouped one and
  the torch reference within tolerance (bit equality not claimed: fp32 partial sums), split-K
  tickets back at zero after each launch;
* the Triton finalize == the core's correctly rounded fma finalize, bit for bit; the T=1 finalize
  folded into the w2 launch and programmatic dependent launches == separate plain launches, bit
  for bit (eager and in a CUDA graph);
* graph replay == eager, with new routing on every replay;
* the in-kernel counter == a bincount recount (with and without padded tokens, under replay);
* swaps: replay after ``core.swap.swap_experts`` == the unsplit reference; a map flip without its
  copies diverges (so the check is real).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU: run them on a GPU machine (BENCHMARKS.md gives the H200 commands)",
                allow_module_level=True)
pytest.importorskip("triton", reason="needs Triton (the H200 image has triton 3.6)")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))

from expert_residency.core.banks import build_unsplit_layer, device_allocator, rehome_layer  # noqa: E402
from expert_residency.core.counter import ExpertCounter  # noqa: E402
from expert_residency.core.fma_finalize import finalize as core_finalize  # noqa: E402
from expert_residency.core.reference import mxfp4_swiglu_per_pick  # noqa: E402
from expert_residency.core.split import residency_forward  # noqa: E402
from expert_residency.core.swap import StagingBuffer, swap_experts, swap_steps  # noqa: E402
from expert_residency.gpu.experts import MAX_FUSED_PICKS, ExpertShape, KernelConfig, TritonMxfp4Experts  # noqa: E402
from expert_residency.gpu.graphs import CapturedStep  # noqa: E402
from expert_residency.gpu.layout import to_kernel_layout  # noqa: E402
from expert_residency.gpu.pinned import PinnedRegion, device_view, pinned_view_allocator  # noqa: E402
from routing_draws import random_routing  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
SMALL = ExpertShape(hidden=512, intermediate=256)
DSV41 = ExpertShape(hidden=5120, intermediate=2304)
REL_TOL = 1e-2
CONFIGS = {
    "int-dequant": KernelConfig(dequant=0, block_n1=32, block_k1=256, block_k2=256),
    "dot_scaled": KernelConfig(dequant=1),
    "prmt-dequant": KernelConfig(dequant=2),
    "prmt-bn32-bk256": KernelConfig(dequant=2, block_n1=32, block_k1=256, block_k2=256),
    "mma-order": KernelConfig(),   # the default (dequant=3, w2 128-row tiles, 4 stages)
    "mma-order-bn64-3stages": KernelConfig(block_n2=64, num_stages=3),
    "mma-order-bn128-bk64": KernelConfig(block_n1=128, block_k1=64, block_n2=128, block_k2=64),
    "mma-order-w13-128-rows": KernelConfig(block_n1=128),
    # the small-step schedule off: every T grouped, unsplit K, one pipeline depth (the kernel
    # before the split-K schedule)
    "mma-order-no-small-schedule": KernelConfig(split_k1=1, split_k2=1, one_token=False,
                                                num_stages_large=None),
    # split-K of small steps (off by default; w13 K in 4 splits, w2 in 2)
    "mma-order-splitk": KernelConfig(split_k1=4, split_k2=2),
    # T=1 stream-K: both expert launches on 264 programs (2 per H200 SM), equal shares of the
    # (pick, row tile, K step) list; tiles cut by a share boundary reduced in share order
    "mma-order-streamk": KernelConfig(stream_k1=264, stream_k2=264),
    # T=1 through tl.dot (the default takes the warp-MMA kernels of gpu.kernels_t1 there)
    "mma-order-t1-dot": KernelConfig(t1_warp_mma=False),
    # the tl.dot launches capped at 128 registers per thread at every step size (4 programs per SM)
    "mma-order-regs128": KernelConfig(max_registers=128, max_registers_large=128),
}


def random_experts(shape: ExpertShape, experts: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random MXFP4 experts: every nibble code, scales around 2**-6 (checkpoint-like)."""
    h, i = shape.hidden, shape.intermediate

    def u8(*dims: int, lo: int = 0, hi: int = 256) -> torch.Tensor:
        return torch.randint(lo, hi, dims, generator=gen, device=DEV, dtype=torch.int32).to(torch.uint8)

    return {
        "w13_weight": u8(experts, 2 * i, h // 2),
        "w13_weight_scale": u8(experts, 2 * i, h // 32, lo=117, hi=126),
        "w2_weight": u8(experts, h, i // 2),
        "w2_weight_scale": u8(experts, h, i // 32, lo=117, hi=126),
    }


class Layers(NamedTuple):
    unsplit: object   # every expert in one HBM bank, kernel layout (the bit-identity reference)
    split: object     # hot bank in HBM + cold bank in pinned host memory, kernel layout
    hot_ids: list
    cold_ids: list
    reference: object  # unsplit in vLLM's layout, for the torch reference per-pick function


def make_layers(shape: ExpertShape, experts: int, cold_count: int, gen: torch.Generator,
                config: KernelConfig = KernelConfig(),
                original: dict[str, torch.Tensor] | None = None) -> Layers:
    original = original if original is not None else random_experts(shape, experts, gen)
    full = {name: t.clone() for name, t in original.items()}
    to_kernel_layout(full, config)
    perm = torch.randperm(experts, generator=torch.Generator().manual_seed(7)).tolist()
    cold_ids, hot_ids = sorted(perm[:cold_count]), perm[cold_count:]  # hot rows in shuffled order
    unsplit = build_unsplit_layer(full, layer_index=0)
    split = rehome_layer(dict(full), hot_ids, cold_ids, layer_index=0,
                         hot_alloc=device_allocator(DEV), cold_alloc=pinned_view_allocator(DEV))
    return Layers(unsplit, split, hot_ids, cold_ids, build_unsplit_layer(original, layer_index=0))


def activations(tokens: int, hidden: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(tokens, hidden, generator=gen, device=DEV).to(torch.bfloat16)


# -- pinned view ---------------------------------------------------------------------------------

def test_pinned_view_aliases_host_memory() -> None:
    region = PinnedRegion((3, 1000, 7), torch.int32, DEV)
    assert region.registered or region.host.is_pinned()
    print(f"\npinned region: exact-size cudaHostRegister={region.registered}")
    region.host.copy_(torch.arange(21000, dtype=torch.int32).view(3, 1000, 7))
    assert region.view.device.type == "cuda" and region.view.data_ptr() == region.host.data_ptr()
    assert torch.equal(region.view.sum(dim=0).cpu(), region.host.sum(dim=0))
    region.view.add_(5)                       # a kernel writing through the view ...
    torch.cuda.synchronize()
    assert int(region.host[2, 999, 6]) == 20999 + 5   # ... lands in host memory in place
    plain = torch.empty(10, pin_memory=True)
    assert device_view(plain).data_ptr() == plain.data_ptr()
    with pytest.raises(ValueError, match="page-locked"):
        device_view(torch.empty(10))


def test_cold_bank_lives_in_host_memory() -> None:
    gen = torch.Generator(device=DEV).manual_seed(1)
    _, split, _, cold_ids, _ = make_layers(SMALL, 16, 6, gen)
    before = torch.cuda.memory_allocated()
    region = PinnedRegion((64 << 20,), torch.uint8, DEV)
    assert torch.cuda.memory_allocated() == before  # a view allocates no device memory
    del region
    assert split.cold.num_rows == 6 and all(t.is_cuda for t in split.cold.tensors.values())
    assert all(isinstance(o, PinnedRegion) for o in split.cold.owners)
    host_bytes = sum(o.nbytes for o in split.cold.owners)
    assert host_bytes == split.cold.nbytes() == 6 * SMALL.bytes_per_expert


# -- bit-identity, tolerance, finalize ----------------------------------------------------------

@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("tokens", [1, 3, 16, 96])
def test_split_equals_unsplit_bitwise(config: str, tokens: int) -> None:
    gen = torch.Generator(device=DEV).manual_seed(100 + tokens)
    experts, k = 16, 6
    unsplit, split, hot_ids, cold_ids, _ = make_layers(SMALL, experts, 6, gen, CONFIGS[config])
    ex = TritonMxfp4Experts(SMALL, experts, k, max_tokens=128, device=DEV, config=CONFIGS[config])
    ids, weights = random_routing(tokens, experts, k, gen, hot_ids, cold_ids)
    x = activations(tokens, SMALL.hidden, gen)
    picks_split = ex.pick_outputs(split, x, ids).clone()
    out_split = ex.finalize(picks_split, weights)
    picks_unsplit = ex.pick_outputs(unsplit, x, ids).clone()
    out_unsplit = ex.finalize(picks_unsplit, weights)
    assert torch.isfinite(out_split.float()).all()
    assert torch.equal(picks_split, picks_unsplit)
    assert torch.equal(out_split, out_unsplit)
    # The same bits through the core's split invoke (Triton per-pick fn, torch fma finalize).
    core_out = residency_forward(split, x, weights, ids, ex.per_pick_fn(), pick_dtype=torch.bfloat16)
    assert torch.equal(core_out, out_split)


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
def test_split_equals_unsplit_dsv41_geometry(config: str) -> None:
    gen = torch.Generator(device=DEV).manual_seed(5)
    experts, k, tokens = 12, 6, 6
    unsplit, split, hot_ids, cold_ids, reference = make_layers(DSV41, experts, 6, gen, CONFIGS[config])
    ex = TritonMxfp4Experts(DSV41, experts, k, max_tokens=16, device=DEV, config=CONFIGS[config])
    ids, weights = random_routing(tokens, experts, k, gen, hot_ids, cold_ids)
    x = activations(tokens, DSV41.hidden, gen)
    out_split = ex.forward(split, x, weights, ids).clone()
    out_unsplit = ex.forward(unsplit, x, weights, ids).clone()
    assert torch.equal(out_split, out_unsplit)
    ref = residency_forward(reference, x, weights, ids, mxfp4_swiglu_per_pick(), pick_dtype=torch.bfloat16)
    rel = ((out_split.float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"\n[{config}] DSv4.1 geometry, T={tokens}: Triton vs torch reference relative L2 = {rel:.2e}")
    assert rel <= REL_TOL


def _clamp_limit(original: dict[str, torch.Tensor], x: torch.Tensor) -> float:
    """Half the median |gate/up product| of these experts on ``x``: a limit that clamps a large
    share of them (so a missing or misplaced clamp shows far above the tolerance)."""
    from expert_residency.mxfp4 import dequantize_mxfp4

    w13 = dequantize_mxfp4(original["w13_weight"], original["w13_weight_scale"])
    g = torch.einsum("eoh,th->teo", w13, x.float())
    return float(g.abs().median()) * 0.5


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("shape", ["small", "dsv41"])
def test_swiglu_clamp_split_equals_unsplit_and_matches_reference(config: str, shape: str) -> None:
    """vLLM 0.33's ``swiglu_limit`` (DeepSeek-V4/V4.1): split == unsplit bit for bit (fused
    forward and the per-pick path), Triton within REL_TOL of the clamped torch reference, and the
    clamped reference far from the unclamped one."""
    geometry = SMALL if shape == "small" else DSV41
    gen = torch.Generator(device=DEV).manual_seed(31)
    experts, k, tokens = 12, 6, (16 if shape == "small" else 6)
    original = random_experts(geometry, experts, gen)
    unsplit, split, hot_ids, cold_ids, reference = make_layers(geometry, experts, 6, gen,
                                                               CONFIGS[config], original)
    ids, weights = random_routing(tokens, experts, k, gen, hot_ids, cold_ids)
    x = activations(tokens, geometry.hidden, gen)
    limit = _clamp_limit(original, x)
    ex = TritonMxfp4Experts(geometry, experts, k, max_tokens=tokens, device=DEV,
                            config=CONFIGS[config], swiglu_limit=limit)
    out_split = ex.forward(split, x, weights, ids).clone()
    assert torch.equal(out_split, ex.forward(unsplit, x, weights, ids))
    core_out = residency_forward(split, x, weights, ids, ex.per_pick_fn(), pick_dtype=torch.bfloat16)
    assert torch.equal(core_out, out_split)
    ref = residency_forward(reference, x, weights, ids, mxfp4_swiglu_per_pick(swiglu_limit=limit),
                            pick_dtype=torch.bfloat16)
    plain = residency_forward(reference, x, weights, ids, mxfp4_swiglu_per_pick(),
                              pick_dtype=torch.bfloat16)
    rel = ((out_split.float() - ref.float()).norm() / ref.float().norm()).item()
    gap = ((plain.float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"\n[{config}] {shape}, swiglu_limit={limit:.3g}: Triton vs clamped reference rel L2 "
          f"{rel:.2e}; clamped vs unclamped reference {gap:.2e}")
    assert rel <= REL_TOL
    assert gap > 10 * REL_TOL


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
def test_triton_vs_torch_reference(config: str) -> None:
    gen = torch.Generator(device=DEV).manual_seed(11)
    experts, k, tokens = 16, 6, 16
    unsplit, split, hot_ids, cold_ids, reference = make_layers(SMALL, experts, 6, gen, CONFIGS[config])
    ex = TritonMxfp4Experts(SMALL, experts, k, max_tokens=tokens, device=DEV, config=CONFIGS[config])
    ids, weights = random_routing(tokens, experts, k, gen, hot_ids, cold_ids)
    x = activations(tokens, SMALL.hidden, gen)
    picks = ex.pick_outputs(split, x, ids).clone()
    out = ex.finalize(picks, weights)
    from expert_residency.core.split import split_invoke
    ref_picks = split_invoke(reference, x, ids, mxfp4_swiglu_per_pick(), out_dtype=torch.bfloat16)
    ref = core_finalize(ref_picks, weights, torch.bfloat16)
    rel_picks = ((picks.float() - ref_picks.float()).norm() / ref_picks.float().norm()).item()
    rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"\n[{config}] Triton vs torch reference: picks rel L2 {rel_picks:.2e}, layer rel L2 {rel:.2e}")
    assert rel_picks <= REL_TOL and rel <= REL_TOL


def test_dequantizers_and_layouts_agree() -> None:
    """Every dequantizer and both layouts feed the tensor cores the same exact bf16 weights; the
    outputs agree to rounding (bit equality across configs is not claimed: tiles differ)."""
    gen = torch.Generator(device=DEV).manual_seed(4)
    experts, k, tokens = 16, 6, 16
    original = random_experts(SMALL, experts, gen)
    configs = dict(CONFIGS, **{"row-major": KernelConfig(tile_major=False)})
    outs = {}
    for name, cfg in configs.items():
        layers = make_layers(SMALL, experts, 6, gen, cfg, original=original)
        if not outs:
            ids, weights = random_routing(tokens, experts, k, gen, layers.hot_ids, layers.cold_ids)
            x = activations(tokens, SMALL.hidden, gen)
        ex = TritonMxfp4Experts(SMALL, experts, k, max_tokens=tokens, device=DEV, config=cfg)
        outs[name] = ex.forward(layers.split, x, weights, ids)
    base = outs["int-dequant"].float()
    for name, out in outs.items():
        rel = ((out.float() - base).norm() / base.norm()).item()
        print(f"\n{name} vs int-dequant: relative L2 {rel:.2e}, bit-identical {torch.equal(out, outs['int-dequant'])}")
        assert rel <= 1e-3


def test_triton_finalize_matches_core_fma_bitwise() -> None:
    gen = torch.Generator(device=DEV).manual_seed(3)
    ex = TritonMxfp4Experts(SMALL, 16, 6, max_tokens=64, device=DEV)
    for tokens in (1, 7, 64):
        picks = (torch.randn(tokens, 6, SMALL.hidden, generator=gen, device=DEV) * 3).to(torch.bfloat16)
        weights = torch.rand(tokens, 6, generator=gen, device=DEV)
        assert torch.equal(ex.finalize(picks, weights), core_finalize(picks, weights, torch.bfloat16))
        assert torch.equal(ex.finalize(picks, weights, out_dtype=torch.float32),
                           core_finalize(picks, weights, torch.float32))


def test_large_step_uses_torch_grouping_with_same_bits() -> None:
    gen = torch.Generator(device=DEV).manual_seed(9)
    experts, k = 16, 6
    tokens = MAX_FUSED_PICKS // k + 40  # over the one-program grouping limit
    unsplit, split, hot_ids, cold_ids, _ = make_layers(SMALL, experts, 6, gen)
    ex = TritonMxfp4Experts(SMALL, experts, k, max_tokens=tokens, device=DEV)
    ids, weights = random_routing(tokens, experts, k, gen, hot_ids, cold_ids)
    x = activations(tokens, SMALL.hidden, gen)
    counter = ExpertCounter([0], experts, device=DEV)
    big = ex.forward(split, x, weights, ids, counter=counter).clone()
    assert torch.equal(big, ex.forward(unsplit, x, weights, ids))
    assert torch.equal(counter.counts[0], torch.bincount(ids.flatten(), minlength=experts))
    # Same tokens through the fused grouping in small steps: identical rows (grouping order only
    # decides which tile a pick lands in; a pick's arithmetic does not depend on it).
    head = 64
    small = ex.forward(split, x[:head].contiguous(), weights[:head], ids[:head])
    assert torch.equal(small, big[:head])


def test_large_step_graph_capture_with_counter() -> None:
    """The torch grouping path (prefill-sized steps) is capturable too, counter included."""
    gen = torch.Generator(device=DEV).manual_seed(12)
    experts, k = 16, 6
    tokens = MAX_FUSED_PICKS // k + 8
    unsplit, split, hot_ids, cold_ids, _ = make_layers(SMALL, experts, 6, gen)
    ex = TritonMxfp4Experts(SMALL, experts, k, max_tokens=tokens, device=DEV)
    counter = ExpertCounter([0], experts, device=DEV)
    out = torch.empty(tokens, SMALL.hidden, dtype=torch.bfloat16, device=DEV)
    ids, w = random_routing(tokens, experts, k, gen, hot_ids, cold_ids)
    x = activations(tokens, SMALL.hidden, gen)
    graph = CapturedStep(lambda xx, ww, ii: ex.forward(split, xx, ww, ii, counter=counter, out=out), x, w, ids)
    counter.reset()
    ids2, w2 = random_routing(tokens, experts, k, gen)
    replayed = graph.replay(x, w2, ids2).clone()
    assert torch.equal(replayed, ex.forward(unsplit, x, w2, ids2))
    assert torch.equal(counter.counts[0], torch.bincount(ids2.flatten(), minlength=experts))
    assert int(counter.tokens[0]) == tokens


# -- graphs, counter, swaps ----------------------------------------------------------------------

def _graph_fixture(tokens: int, layers: int = 2):
    gen = torch.Generator(device=DEV).manual_seed(20 + tokens)
    experts, k = 16, 6
    built = [make_layers(SMALL, experts, 6, gen) for _ in range(layers)]
    for i, layers in enumerate(built):
        layers.split.layer_index = i
    ex = TritonMxfp4Experts(SMALL, experts, k, max_tokens=tokens, device=DEV)
    return gen, experts, k, built, ex


@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_graph_replay_equals_eager_with_new_routing(tokens: int) -> None:
    gen, experts, k, built, ex = _graph_fixture(tokens)
    counter = ExpertCounter(list(range(len(built))), experts, device=DEV)
    outs = [torch.empty(tokens, SMALL.hidden, dtype=torch.bfloat16, device=DEV) for _ in built]

    def step(x, w, ids):
        for i, layers in enumerate(built):
            ex.forward(layers.split, x[i], w[i], ids[i], counter=counter, out=outs[i])
        return torch.stack(outs)

    def routing():
        pairs = [random_routing(tokens, experts, k, gen) for _ in built]
        return (torch.stack([activations(tokens, SMALL.hidden, gen) for _ in built]),
                torch.stack([w for _, w in pairs]), torch.stack([i for i, _ in pairs]))

    x0, w0, i0 = routing()
    graph = CapturedStep(step, x0, w0, i0)
    counter.reset()
    recount = torch.zeros(len(built), experts, dtype=torch.int64, device=DEV)
    for _ in range(4):
        x, w, ids = routing()
        replayed = graph.replay(x, w, ids).clone()
        for i in range(len(built)):
            recount[i] += torch.bincount(ids[i].flatten(), minlength=experts)
        eager = torch.stack([ex.forward(layers.unsplit, x[i], w[i], ids[i])
                             for i, layers in enumerate(built)])
        assert torch.equal(replayed, eager)
    assert torch.equal(counter.counts, recount)      # the in-graph atomics counted every pick once
    assert counter.tokens.tolist() == [4 * tokens] * len(built)


@pytest.mark.parametrize("tokens", [1, 3, 16, 96])
def test_minus_one_picks_add_what_the_core_ep_path_adds(tokens: int) -> None:
    """Picks with id -1 and non-zero router weights (vLLM's non-local experts under expert
    parallelism), the workspace full of NaN: the layer == ``parallel.ep.ep_forward`` (the core's
    torch path: zero weight, zero row, correctly rounded fma finalize) bit for bit, fused T=1 and
    separate finalize alike, split == unsplit; the separate finalize alone == core.finalize over
    the zeroed rows (and, without ids, it does read the stale NaN rows: the check is real)."""
    from expert_residency.parallel.ep import ep_forward

    gen = torch.Generator(device=DEV).manual_seed(91)
    experts, k, e_global = 12, 6, 16
    local_of = torch.full((e_global,), -1, dtype=torch.int32)
    mine = torch.randperm(e_global, generator=torch.Generator().manual_seed(5))[:experts].sort().values
    local_of[mine] = torch.arange(experts, dtype=torch.int32)
    expert_map = local_of.to(DEV)
    layers = make_layers(DSV41, experts, 6, gen)
    for cfg in (KernelConfig(), KernelConfig(fuse_finalize=False, pdl=False), CONFIGS["mma-order-streamk"]):
        ex = TritonMxfp4Experts(DSV41, experts, k, max_tokens=96, device=DEV, config=cfg)
        global_ids = torch.stack([torch.randperm(e_global, generator=gen, device=DEV)[:k]
                                  for _ in range(tokens)])
        global_ids[0] = torch.nonzero(local_of < 0).flatten().repeat(2)[:k].to(DEV)  # all elsewhere
        weights = torch.softmax(torch.randn(tokens, k, generator=gen, device=DEV), dim=1)
        local = expert_map[global_ids.long()]
        x = activations(tokens, DSV41.hidden, gen)
        outs = []
        for layer in (layers.split, layers.unsplit):
            ex.workspace.pick_out.fill_(float("nan"))
            ex.workspace.act.fill_(float("nan"))
            outs.append(ex.forward(layer, x, weights, local).clone())
        assert torch.equal(outs[0], outs[1])
        assert not torch.isnan(outs[0]).any()
        assert torch.equal(outs[0][0].view(torch.int16), torch.zeros_like(outs[0][0].view(torch.int16)))
        ref = ep_forward(layers.unsplit, x, weights, global_ids, expert_map, ex.per_pick_fn(),
                         pick_dtype=torch.bfloat16)
        assert torch.equal(outs[0], ref), cfg.describe()
        picks = ex.workspace.pick_out[:tokens * k].view(tokens, k, DSV41.hidden).clone()
        routed = local >= 0
        expect = core_finalize(torch.where(routed.unsqueeze(-1), picks, torch.zeros_like(picks)),
                               torch.where(routed, weights, torch.zeros_like(weights)), torch.bfloat16)
        assert torch.equal(ex.finalize(picks, weights, topk_ids=local), expect)
        if bool(torch.isnan(picks).any()):
            assert torch.isnan(ex.finalize(picks, weights)).any()


def test_fused_finalize_and_pdl_same_bits_as_separate_launches() -> None:
    """The default T=1 launch (finalize folded into w2, programmatic dependent launch) against
    the same kernels with a separate finalize launch and plain launches, at DSv4.1 geometry:
    bit for bit on hot, cold, straddling tokens and a skipped pick (id -1), == the core's torch
    fma finalize over the Triton pick rows, split == unsplit, the finalize tickets back at zero;
    and a 3-layer CUDA graph of the default at T = 1 and T = 16 replayed with new routing ==
    the plain launches eagerly (PDL edges inside the graph keep every layer's order)."""
    gen = torch.Generator(device=DEV).manual_seed(77)
    experts, k = 12, 6
    fused_cfg = KernelConfig()
    plain_cfg = KernelConfig(fuse_finalize=False, pdl=False)
    assert fused_cfg.fuse_finalize and fused_cfg.pdl
    built = [make_layers(DSV41, experts, 6, gen, fused_cfg) for _ in range(3)]
    unsplit, split, hot_ids, cold_ids, _ = built[0]
    fused = TritonMxfp4Experts(DSV41, experts, k, max_tokens=16, device=DEV, config=fused_cfg)
    plain = TritonMxfp4Experts(DSV41, experts, k, max_tokens=16, device=DEV, config=plain_cfg)
    assert fused._pdl and not plain._pdl and fused._fuses_finalize(1)
    for row in (hot_ids[:6], cold_ids[:6], hot_ids[:3] + cold_ids[:3], hot_ids[:2] + [-1] + cold_ids[:3]):
        ids = torch.tensor([row], device=DEV)
        weights = torch.softmax(torch.randn(1, k, generator=gen, device=DEV), dim=1)
        x = activations(1, DSV41.hidden, gen)
        out = fused.forward(split, x, weights, ids).clone()
        assert int(fused.split_scratch.tickets2.abs().sum()) == 0
        assert torch.equal(out, fused.forward(unsplit, x, weights, ids))
        rows = fused.workspace.pick_out[:k].view(1, k, DSV41.hidden)
        assert torch.equal(out, plain.finalize(rows, weights, topk_ids=ids))  # the -1 pick adds fma(0, 0, acc)
        if -1 not in row:
            assert torch.equal(out, plain.forward(split, x, weights, ids))
            core_out = residency_forward(split, x, weights, ids, plain.per_pick_fn(), pick_dtype=torch.bfloat16)
            assert torch.equal(out, core_out)
    for tokens in (1, 16):
        outs = [torch.empty(tokens, DSV41.hidden, dtype=torch.bfloat16, device=DEV) for _ in built]

        def step(x, w, ids):
            for i, layers in enumerate(built):
                fused.forward(layers.split, x[i], w[i], ids[i], out=outs[i])
            return torch.stack(outs)

        def routing():
            pairs = [random_routing(tokens, experts, k, gen) for _ in built]
            return (torch.stack([activations(tokens, DSV41.hidden, gen) for _ in built]),
                    torch.stack([w for _, w in pairs]), torch.stack([i for i, _ in pairs]))

        graph = CapturedStep(step, *routing())
        for _ in range(3):
            x, w, ids = routing()
            replayed = graph.replay(x, w, ids).clone()
            eager = torch.stack([plain.forward(layers.unsplit, x[i], w[i], ids[i])
                                 for i, layers in enumerate(built)])
            assert torch.equal(replayed, eager)


@pytest.mark.parametrize("tokens", [6, 16, 96])
def test_register_cap_gives_the_same_bits(tokens: int) -> None:
    """A register cap on the tl.dot launches (``max_registers*``) changes where values live, not
    what is computed: at DeepSeek-V4.1 geometry, small (T = 6) and large steps, the default caps'
    and a 128-register cap's pick rows and outputs are the uncapped layer's bit for bit, split
    and unsplit."""
    gen = torch.Generator(device=DEV).manual_seed(300 + tokens)
    experts, k = 12, 6
    unsplit, split, hot_ids, cold_ids, _ = make_layers(DSV41, experts, 6, gen)
    uncapped = TritonMxfp4Experts(DSV41, experts, k, max_tokens=96, device=DEV,
                                  config=KernelConfig(max_registers=0, max_registers_large=0))
    ids, weights = random_routing(tokens, experts, k, gen, hot_ids, cold_ids)
    x = activations(tokens, DSV41.hidden, gen)
    reference = uncapped.forward(unsplit, x, weights, ids).clone()
    reference_rows = uncapped.pick_outputs(unsplit, x, ids).clone()
    for config in (KernelConfig(), KernelConfig(max_registers=128, max_registers_large=128)):
        assert config.max_registers and config.max_registers_large
        capped = TritonMxfp4Experts(DSV41, experts, k, max_tokens=96, device=DEV, config=config)
        for layer in (split, unsplit):
            assert torch.equal(capped.forward(layer, x, weights, ids), reference)
            assert torch.equal(capped.pick_outputs(layer, x, ids), reference_rows)


@pytest.mark.parametrize("tokens", [1, 6])
def test_small_step_schedule_matches_unsplit_schedule_and_reference(tokens: int) -> None:
    """The split-K + ungrouped schedule of small steps (DSv4.1 geometry: w13 K in 4 splits of 10
    steps, w2 in 2 of 9) against the whole-K grouped schedule and the torch reference: the same
    numbers to fp32 summation order (bit equality is not claimed: the partial sums round
    differently), split == unsplit banks bit for bit, tickets back at zero after every launch,
    and the counter exact with a padded token (T=1: the ungrouped path reads the mask itself)."""
    gen = torch.Generator(device=DEV).manual_seed(40 + tokens)
    experts, k = 12, 6
    small_cfg = CONFIGS["mma-order-splitk"]
    plain_cfg = CONFIGS["mma-order-no-small-schedule"]
    unsplit, split, hot_ids, cold_ids, reference = make_layers(DSV41, experts, 6, gen, small_cfg)
    ex = TritonMxfp4Experts(DSV41, experts, k, max_tokens=16, device=DEV, config=small_cfg)
    plain = TritonMxfp4Experts(DSV41, experts, k, max_tokens=16, device=DEV, config=plain_cfg)
    ids, weights = random_routing(tokens, experts, k, gen, hot_ids, cold_ids)
    if tokens == 1:
        ids[0] = torch.tensor(hot_ids[:3] + cold_ids[:3], device=DEV)  # straddling
    x = activations(tokens, DSV41.hidden, gen)
    out = ex.forward(split, x, weights, ids).clone()
    assert torch.equal(out, ex.forward(unsplit, x, weights, ids))
    core_out = residency_forward(split, x, weights, ids, ex.per_pick_fn(), pick_dtype=torch.bfloat16)
    assert torch.equal(core_out, out)
    assert int(ex.split_scratch.tickets13.abs().sum()) == 0 and int(ex.split_scratch.tickets2.abs().sum()) == 0
    whole = plain.forward(unsplit, x, weights, ids)
    ref = residency_forward(reference, x, weights, ids, mxfp4_swiglu_per_pick(), pick_dtype=torch.bfloat16)
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()  # noqa: E731
    print(f"\nT={tokens}: small-step schedule vs whole-K schedule rel L2 {rel(out, whole):.2e} "
          f"(bit-identical {torch.equal(out, whole)}), vs torch reference {rel(out, ref):.2e}")
    assert rel(out, whole) <= REL_TOL and rel(out, ref) <= REL_TOL
    counter = ExpertCounter([0], experts, device=DEV)
    mask = torch.ones(tokens, dtype=torch.bool, device=DEV)
    mask[-1] = False
    masked = ex.forward(split, x, weights, ids, counter=counter, token_mask=mask)
    assert torch.equal(counter.counts[0], torch.bincount(ids[mask].flatten(), minlength=experts))
    assert int(counter.tokens[0]) == tokens - 1
    if tokens > 1:
        assert torch.equal(masked[mask], out[mask])


@pytest.mark.parametrize("programs", [(264, 264), (396, 264)])
def test_stream_k_t1_dsv41(programs: tuple[int, int]) -> None:
    """T=1 stream-K at DSv4.1 geometry (w13: 6 x 36 tiles x 40 K steps = 8,640 units, w2: 6 x 40
    x 18 = 4,320, on 132-396 programs, so most tiles are cut): split == unsplit bit for bit,
    fused == separate finalize bit for bit, within tolerance of the one-program-per-tile schedule
    and the torch reference, every ticket back at zero, the counter exact with a padded token;
    eager == a CUDA graph replay with new routing."""
    gen = torch.Generator(device=DEV).manual_seed(61)
    experts, k = 12, 6
    cfg = KernelConfig(stream_k1=programs[0], stream_k2=programs[1])
    sep = KernelConfig(stream_k1=programs[0], stream_k2=programs[1], fuse_finalize=False)
    unsplit, split, hot_ids, cold_ids, reference = make_layers(DSV41, experts, 6, gen, cfg)
    ex = TritonMxfp4Experts(DSV41, experts, k, max_tokens=16, device=DEV, config=cfg)
    ex_sep = TritonMxfp4Experts(DSV41, experts, k, max_tokens=16, device=DEV, config=sep)
    base = TritonMxfp4Experts(DSV41, experts, k, max_tokens=16, device=DEV, config=KernelConfig())
    sc = ex.split_scratch
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()  # noqa: E731
    for row in (hot_ids[:6], cold_ids[:6], hot_ids[:3] + cold_ids[:3]):
        ids = torch.tensor([row], device=DEV)
        weights = torch.softmax(torch.randn(1, k, generator=gen, device=DEV), dim=1)
        x = activations(1, DSV41.hidden, gen)
        out = ex.forward(split, x, weights, ids).clone()
        for t in (sc.tickets13, sc.tickets2, sc.stream_tickets2):
            assert int(t.abs().sum()) == 0
        assert torch.equal(out, ex.forward(unsplit, x, weights, ids))
        assert torch.equal(out, ex_sep.forward(split, x, weights, ids))
        ref = residency_forward(reference, x, weights, ids, mxfp4_swiglu_per_pick(), pick_dtype=torch.bfloat16)
        whole = base.forward(split, x, weights, ids)
        print(f"\n[streamK {programs}] T=1 vs one-program-per-tile rel L2 {rel(out, whole):.2e} "
              f"(bit-identical {torch.equal(out, whole)}), vs torch reference {rel(out, ref):.2e}")
        assert rel(out, whole) <= REL_TOL and rel(out, ref) <= REL_TOL
    counter = ExpertCounter([0], experts, device=DEV)
    ex.forward(split, x, weights, ids, counter=counter)
    ex.forward(split, x, weights, ids, counter=counter, token_mask=torch.zeros(1, dtype=torch.bool, device=DEV))
    assert torch.equal(counter.counts[0], torch.bincount(ids.flatten(), minlength=experts))
    assert int(counter.tokens[0]) == 1
    out_buf = torch.empty(1, DSV41.hidden, dtype=torch.bfloat16, device=DEV)
    graph = CapturedStep(lambda xx, w, i: ex.forward(split, xx, w, i, out=out_buf), x, weights, ids)
    for _ in range(3):
        ids, weights = random_routing(1, experts, k, gen)
        x = activations(1, DSV41.hidden, gen)
        replayed = graph.replay(x, weights, ids).clone()
        assert torch.equal(replayed, ex.forward(unsplit, x, weights, ids))


def test_counter_exact_with_padded_tokens() -> None:
    gen, experts, k, built, ex = _graph_fixture(32, layers=1)
    split = built[0].split
    counter = ExpertCounter([0], experts, device=DEV)
    expected = torch.zeros(experts, dtype=torch.int64, device=DEV)
    tokens_seen = 0
    for _step in range(5):
        ids, w = random_routing(32, experts, k, gen)
        mask = torch.rand(32, generator=gen, device=DEV) > 0.3
        ex.forward(split, activations(32, SMALL.hidden, gen), w, ids, counter=counter, token_mask=mask)
        expected += torch.bincount(ids[mask].flatten(), minlength=experts)
        tokens_seen += int(mask.sum())
    assert torch.equal(counter.counts[0], expected)
    assert int(counter.tokens[0]) == tokens_seen


def test_swap_in_graph_is_exact_and_misordered_swap_is_caught() -> None:
    tokens = 16
    gen, experts, k, built, ex = _graph_fixture(tokens, layers=1)
    unsplit, split, hot_ids, cold_ids, _ = built[0]
    out = torch.empty(tokens, SMALL.hidden, dtype=torch.bfloat16, device=DEV)

    def step(x, w, ids):
        return ex.forward(split, x, w, ids, out=out)

    # Routing that uses the swapped experts on every token.
    pairs = [(hot_ids[0], cold_ids[0]), (hot_ids[3], cold_ids[2]), (hot_ids[7], cold_ids[4])]
    fillers = [hot_ids[1], hot_ids[2], hot_ids[4], hot_ids[5]]  # k - 2 experts no pair touches
    ids = torch.stack([torch.tensor([pairs[t % 3][0], pairs[t % 3][1]] + fillers)
                       for t in range(tokens)]).to(DEV)
    w = torch.softmax(torch.randn(tokens, k, generator=gen, device=DEV), dim=1)
    x = activations(tokens, SMALL.hidden, gen)
    reference = ex.forward(unsplit, x, w, ids).clone()
    graph = CapturedStep(step, x, w, ids)
    assert torch.equal(graph.replay(), reference)
    swap_experts(split, pairs)                       # copies, then the two-element map write
    torch.cuda.synchronize()
    assert all(e in split.cold_ids for e, _ in pairs) and all(e in split.hot_ids for _, e in pairs)
    assert torch.equal(graph.replay(), reference)    # replay reads the updated map
    # Mis-ordered: flip the map for a pair without moving its rows -> outputs must diverge.
    hot_e, cold_e = split.hot_ids[5], split.cold_ids[1]
    ids[:, -1] = hot_e
    reference2 = ex.forward(unsplit, x, w, ids).clone()
    staging = StagingBuffer.for_layer(split)
    for s in swap_steps(split, hot_e, cold_e, staging):
        if s.kind == "map":
            s.run()
    assert not torch.equal(graph.replay(x, w, ids), reference2)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-rs", "-s"] + sys.argv[1:]))
