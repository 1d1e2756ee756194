"""BF16 and FP8-block split layers on a CUDA GPU (the H200): Triton dense experts over a hot HBM
bank and a cold bank in pinned host memory read in place.

Run there with ``PYTHONPATH=runtime python3 -m pytest tests/gpu/test_dense_gpu.py -q``. Skips
without CUDA or Triton, saying why. The runs on the H200 are listed in BENCHMARKS.md.

Claims and how each can fail:
* split == unsplit bit for bit (``torch.equal``) — tokens entirely hot, entirely cold and
  straddling, 1..96 tokens (the chunk loop), every format/activation/bias case, a real geometry;
* Triton vs the core's torch reference of the same format within relative L2 <= 1e-2 (both round
  activation and pick rows to bf16; FP8 inputs are quantized identically up to division rounding);
* the Triton finalize == the core's correctly rounded fma finalize, bit for bit;
* graph replay == eager with new routing on every replay; the in-graph counter == a recount
  (T = 1 and T = 16);
* swaps under a captured graph == the unsplit reference; a map flip without its copies diverges;
* the T = 1 schedule (no grouping launch, finalize inside w2, programmatic dependent launches)
  == the four-launch schedule bit for bit, a -1 pick included; FP8's activation quantization in
  the w13 epilogue == the separate launch bit for bit;
* FP8 on 32-row tiles (the warp-level MMA, fp32 accumulation) within 1e-4 of the reference, the
  default 64-row tiles (Hopper's warpgroup MMA, reduced-precision FP8 accumulation) above 1e-3.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU: these tests run on the H200", allow_module_level=True)
pytest.importorskip("triton", reason="needs Triton (the H200 image has triton 3.6)")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))

from expert_residency.core.banks import build_unsplit_layer, device_allocator, rehome_layer  # noqa: E402
from expert_residency.core.counter import ExpertCounter  # noqa: E402
from expert_residency.core.fma_finalize import finalize as core_finalize  # noqa: E402
from expert_residency.core.formats_ref import float_per_pick, fp8_block_per_pick  # noqa: E402
from expert_residency.core.split import residency_forward  # noqa: E402
from expert_residency.core.swap import StagingBuffer, swap_experts, swap_steps  # noqa: E402
from expert_residency.fp8 import quantize_fp8_block  # noqa: E402
from expert_residency.gpu.dense_experts import DenseKernelConfig, TritonDenseExperts  # noqa: E402
from expert_residency.gpu.experts import ExpertShape  # noqa: E402
from expert_residency.gpu.graphs import CapturedStep  # noqa: E402
from expert_residency.gpu.pinned import pinned_view_allocator  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
SMALL = ExpertShape(hidden=512, intermediate=256)
QWEN3_30B = ExpertShape(hidden=2048, intermediate=768)    # BF16 experts, 128 per layer, top-8
REL_TOL = 1e-2
# FP8 on the warp-level MMA against the reference of the same quantized operands: what remains is
# fp32 summation order and the bf16 roundings it can flip (a bf16 ulp is 2^-8 of a value; a few
# flipped elements of thousands move the relative L2 by ~1e-5).
FP8_ACC_TOL = 1e-4
CASES = {  # name: (format, activation, biases, w13 scale)
    "bf16-silu": ("bf16", "silu", False, 1.0),
    "bf16-gptoss": ("bf16", "swigluoai", True, 8.0),
    "fp8-silu": ("fp8-block", "silu", False, 1.0),
    "fp8-gptoss": ("fp8-block", "swigluoai", True, 8.0),
}


def experts_for(case: str, shape: ExpertShape, experts: int, gen: torch.Generator) -> dict:
    fmt, _, bias, scale = CASES[case]
    h, i = shape.hidden, shape.intermediate
    w13 = torch.randn(experts, 2 * i, h, generator=gen, device=DEV) * (scale / h ** 0.5)
    w2 = torch.randn(experts, h, i, generator=gen, device=DEV) / i ** 0.5
    if fmt == "bf16":
        out = {"w13_weight": w13.bfloat16(), "w2_weight": w2.bfloat16()}
    else:
        q13, s13 = quantize_fp8_block(w13)
        q2, s2 = quantize_fp8_block(w2)
        out = {"w13_weight": q13, "w13_weight_scale_inv": s13, "w2_weight": q2, "w2_weight_scale_inv": s2}
    if bias:
        out["w13_bias"] = torch.randn(experts, 2 * i, generator=gen, device=DEV) * 0.5
        out["w2_bias"] = torch.randn(experts, h, generator=gen, device=DEV) * 0.2
    return out


def make(case: str, shape: ExpertShape, experts: int, cold_count: int, k: int, max_tokens: int,
         gen: torch.Generator, config: DenseKernelConfig = DenseKernelConfig()):
    fmt, act, _, _ = CASES[case]
    original = experts_for(case, shape, experts, gen)
    perm = torch.randperm(experts, generator=torch.Generator().manual_seed(7)).tolist()
    cold_ids, hot_ids = sorted(perm[:cold_count]), perm[cold_count:]
    unsplit = build_unsplit_layer({n: t.clone() for n, t in original.items()}, layer_index=0)
    split = rehome_layer({n: t.clone() for n, t in original.items()}, hot_ids, cold_ids, layer_index=0,
                         hot_alloc=device_allocator(DEV), cold_alloc=pinned_view_allocator(DEV))
    ex = TritonDenseExperts(shape, experts, k, max_tokens=max_tokens, device=DEV, config=config,
                            expert_format=fmt, activation=act)
    ref_fn = (float_per_pick if fmt == "bf16" else fp8_block_per_pick)(act)
    return original, unsplit, split, hot_ids, cold_ids, ex, ref_fn


def routing(tokens: int, experts: int, k: int, gen: torch.Generator, hot=None, cold=None):
    ids = torch.topk(torch.rand(tokens, experts, generator=gen, device=DEV), k, dim=1).indices
    if hot is not None and tokens >= 3:
        ids[0] = torch.tensor(hot[:k], device=DEV)
        ids[1] = torch.tensor(cold[:k], device=DEV)
        ids[2] = torch.tensor(hot[:k // 2] + cold[:k - k // 2], device=DEV)
    weights = torch.softmax(torch.randn(tokens, k, generator=gen, device=DEV), dim=1)
    return ids, weights


def x_for(tokens: int, hidden: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(tokens, hidden, generator=gen, device=DEV).to(torch.bfloat16)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("tokens", [1, 3, 16, 96])
def test_split_equals_unsplit_and_matches_reference(case: str, tokens: int) -> None:
    gen = torch.Generator(device=DEV).manual_seed(10 + tokens)
    experts, k = 16, 6
    _, unsplit, split, hot, cold, ex, ref_fn = make(case, SMALL, experts, 6, k, 128, gen)
    ids, w = routing(tokens, experts, k, gen, hot, cold)
    x = x_for(tokens, SMALL.hidden, gen)
    got = ex.forward(split, x, w, ids)
    assert torch.equal(got, ex.forward(unsplit, x, w, ids))
    if tokens <= 16:   # the torch reference gathers T*2I*H per pick column
        ref = residency_forward(unsplit, x, w, ids, ref_fn, pick_dtype=torch.bfloat16)
        assert rel(got, ref) <= REL_TOL, rel(got, ref)


@pytest.mark.parametrize("case", ["bf16-silu", "fp8-silu"])
def test_real_geometry_split_equals_unsplit(case: str) -> None:
    gen = torch.Generator(device=DEV).manual_seed(3)
    experts, k, tokens = 32, 8, 16
    _, unsplit, split, hot, cold, ex, _ = make(case, QWEN3_30B, experts, 20, k, tokens, gen)
    ids, w = routing(tokens, experts, k, gen, hot, cold)
    x = x_for(tokens, QWEN3_30B.hidden, gen)
    assert torch.equal(ex.forward(split, x, w, ids), ex.forward(unsplit, x, w, ids))


def test_finalize_matches_core_fma_bitwise() -> None:
    gen = torch.Generator(device=DEV).manual_seed(4)
    _, unsplit, _, _, _, ex, _ = make("bf16-silu", SMALL, 16, 6, 6, 32, gen)
    ids, w = routing(32, 16, 6, gen)
    picks = ex.pick_outputs(unsplit, x_for(32, SMALL.hidden, gen), ids).clone()
    assert torch.equal(ex.finalize(picks, w), core_finalize(picks, w, torch.bfloat16))


@pytest.mark.parametrize("case", ["bf16-gptoss", "fp8-silu"])
@pytest.mark.parametrize("tokens", [1, 16])
def test_graph_replay_counter_and_swaps(case: str, tokens: int) -> None:
    gen = torch.Generator(device=DEV).manual_seed(5)
    experts, k = 16, 6
    _, unsplit, split, hot, cold, ex, _ = make(case, SMALL, experts, 6, k, tokens, gen)
    counter = ExpertCounter([0], experts, device=DEV)
    out = torch.empty(tokens, SMALL.hidden, dtype=torch.bfloat16, device=DEV)

    def step(x, w, ids):
        return ex.forward(split, x, w, ids, counter=counter, out=out)

    ids, w = routing(tokens, experts, k, gen, hot, cold)
    x = x_for(tokens, SMALL.hidden, gen)
    graph = CapturedStep(step, x, w, ids)
    assert ex._fuses_finalize(tokens) == (tokens == 1)
    counter.reset()
    recount = torch.zeros(experts, dtype=torch.int64, device=DEV)
    for _ in range(3):
        ids, w = routing(tokens, experts, k, gen, hot, cold)
        x = x_for(tokens, SMALL.hidden, gen)
        replayed = graph.replay(x, w, ids).clone()
        recount += torch.bincount(ids.flatten(), minlength=experts)
        assert torch.equal(replayed, ex.forward(unsplit, x, w, ids))
    assert torch.equal(counter.counts[0], recount)
    # Swaps (weights, block scales, biases) then replay == unsplit; a bare map flip diverges.
    pairs = [(hot[0], cold[0]), (hot[3], cold[2])]
    swap_experts(split, pairs)
    torch.cuda.synchronize()
    ids[:, 0], ids[:, 1] = pairs[0][0], pairs[1][1]
    reference = ex.forward(unsplit, x, w, ids).clone()
    assert torch.equal(graph.replay(x, w, ids), reference)
    hot_e, cold_e = split.hot_ids[5], split.cold_ids[1]
    ids[:, -1] = hot_e
    reference2 = ex.forward(unsplit, x, w, ids).clone()
    for s in swap_steps(split, hot_e, cold_e, StagingBuffer.for_layer(split)):
        if s.kind == "map":
            s.run()
    assert not torch.equal(graph.replay(x, w, ids), reference2)


FOUR_LAUNCHES = DenseKernelConfig(one_token=False, fuse_finalize=False, pdl=False, fuse_act_quant=False)


@pytest.mark.parametrize("case", ["bf16-silu", "fp8-silu", "bf16-gptoss"])
def test_t1_schedule_equals_four_launches(case: str) -> None:
    gen = torch.Generator(device=DEV).manual_seed(6)
    experts, k = 16, 6
    _, unsplit, split, hot, cold, ex, _ = make(case, SMALL, experts, 6, k, 8, gen)
    grouped = TritonDenseExperts(SMALL, experts, k, max_tokens=8, device=DEV, config=FOUR_LAUNCHES,
                                 expert_format=ex.expert_format, activation=ex.activation)
    picks = [hot[:k], cold[:k], hot[:k // 2] + cold[:k - k // 2], hot[:k - 1] + [-1]]
    for row in picks:
        ids = torch.tensor([row], device=DEV)
        w = torch.softmax(torch.randn(1, k, generator=gen, device=DEV), dim=1)
        x = x_for(1, SMALL.hidden, gen)
        counter = ExpertCounter([0], experts, device=DEV)
        got = ex.forward(split, x, w, ids, counter=counter)
        assert torch.equal(got, ex.forward(unsplit, x, w, ids))
        assert torch.equal(got, grouped.forward(unsplit, x, w, ids)), row
        assert torch.equal(counter.counts[0], torch.bincount(ids[ids >= 0], minlength=experts))
        assert int(counter.tokens[0]) == 1


@pytest.mark.parametrize("tokens", [1, 5, 96])
def test_fp8_act_quant_in_w13_keeps_the_bits(tokens: int) -> None:
    gen = torch.Generator(device=DEV).manual_seed(8)
    experts, k = 16, 6
    fused_cfg = DenseKernelConfig(block_n1=128)
    _, unsplit, split, hot, cold, fused, _ = make("fp8-silu", SMALL, experts, 6, k, 96, gen, fused_cfg)
    separate = TritonDenseExperts(SMALL, experts, k, max_tokens=96, device=DEV,
                                  config=DenseKernelConfig(block_n1=128, fuse_act_quant=False),
                                  expert_format="fp8-block")
    ids, w = routing(tokens, experts, k, gen, hot, cold)
    x = x_for(tokens, SMALL.hidden, gen)
    got = fused.forward(split, x, w, ids)
    assert torch.equal(got, separate.forward(split, x, w, ids))
    assert torch.equal(got, fused.forward(unsplit, x, w, ids))


@pytest.mark.parametrize("tokens", [1, 16])
def test_fp8_warp_mma_tiles_meet_the_reference(tokens: int) -> None:
    # The torch reference multiplies the same quantized operands in fp32 (core.formats_ref), so
    # what separates a kernel from it is how the tensor cores add the products. 32-row tiles run
    # the warp-level MMA, whose FP8 products add in fp32: fp32 summation noise (FP8_ACC_TOL). The
    # default 64-row tiles run Hopper's warpgroup MMA, whose FP8 accumulation keeps fewer bits
    # (each 128-value block's dot is added in fp32 afterwards, as DeepGEMM and vLLM's Triton
    # fused MoE do): far above it. Split == unsplit holds either way.
    gen = torch.Generator(device=DEV).manual_seed(12 + tokens)
    experts, k = 16, 6
    _, unsplit, split, hot, cold, warp_mma, ref_fn = make(
        "fp8-silu", SMALL, experts, 6, k, 16, gen, DenseKernelConfig(block_n1=32, block_n2=32))
    wgmma = TritonDenseExperts(SMALL, experts, k, max_tokens=16, device=DEV, config=DenseKernelConfig(),
                               expert_format="fp8-block")
    ids, w = routing(tokens, experts, k, gen, hot, cold)
    x = x_for(tokens, SMALL.hidden, gen)
    got = warp_mma.forward(split, x, w, ids)
    assert torch.equal(got, warp_mma.forward(unsplit, x, w, ids))
    ref = residency_forward(unsplit, x, w, ids, ref_fn, pick_dtype=torch.bfloat16)
    wgmma_err = rel(wgmma.forward(split, x, w, ids), ref)
    assert rel(got, ref) <= FP8_ACC_TOL, (rel(got, ref), wgmma_err)
    assert wgmma_err > 10 * FP8_ACC_TOL, wgmma_err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-rs", "-s"] + sys.argv[1:]))
