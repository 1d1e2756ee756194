"""The FP8-activation MXFP4 layer (``gpu.experts_w4a8``) on a CUDA GPU of compute capability 9.0+.

Claims and how each can fail:
* the layer-input quantization kernel gives vLLM's ``per_token_group_quant_fp8`` bytes and scales
  exactly (the runtime's torch twin, ``expert_residency.fp8``);
* split == unsplit bit for bit (random routing, tokens entirely hot / cold / straddling, slots
  with more picks than one tile; the DeepSeek-V4.1 geometry), eager and in a CUDA graph replayed
  with new routing, the in-kernel counter equal to a recount (padded tokens included);
* against a torch reference built from vLLM's MXFP4 tensors (not this layout): the same FP8
  roundings of both GEMM inputs, fp32 products, bf16 pick rows; within 1.5e-2 relative L2 (the
  FP8 tensor cores accumulate with fewer bits than fp32: the dense FP8 kernels measured 5.4e-3);
* a pick with id -1 adds nothing: changing the last expert's weights changes no output bit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
    pytest.skip("needs a CUDA GPU of compute capability 9.0+ (FP8 wgmma): run them on the H200",
                allow_module_level=True)
pytest.importorskip("triton", reason="needs Triton (the H200 image has triton 3.6)")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))

from expert_residency.core.banks import build_unsplit_layer, device_allocator, rehome_layer  # noqa: E402
from expert_residency.core.counter import ExpertCounter  # noqa: E402
from expert_residency.core.fma_finalize import finalize as core_finalize  # noqa: E402
from expert_residency.fp8 import per_token_group_quant_fp8  # noqa: E402
from expert_residency.gpu import kernels_w4a8  # noqa: E402
from expert_residency.gpu.experts import ExpertShape  # noqa: E402
from expert_residency.gpu.experts_w4a8 import TritonW4a8Experts  # noqa: E402
from expert_residency.gpu.graphs import CapturedStep  # noqa: E402
from expert_residency.gpu.pinned import pinned_view_allocator  # noqa: E402
from expert_residency.mxfp4 import dequantize_mxfp4  # noqa: E402
from routing_draws import random_routing  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
SMALL = ExpertShape(hidden=512, intermediate=256)
DSV41 = ExpertShape(hidden=5120, intermediate=2304)
REL_TOL = 1.5e-2


def random_experts(shape: ExpertShape, experts: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Every nibble code; block scales spanning 2^-10 .. 2^-3 (within the layout's 11 powers of two)."""
    h, i = shape.hidden, shape.intermediate

    def u8(*dims: int, lo: int = 0, hi: int = 256) -> torch.Tensor:
        return torch.randint(lo, hi, dims, generator=gen, device=DEV, dtype=torch.int32).to(torch.uint8)

    return {"w13_weight": u8(experts, 2 * i, h // 2), "w13_weight_scale": u8(experts, 2 * i, h // 32, lo=117, hi=125),
            "w2_weight": u8(experts, h, i // 2), "w2_weight_scale": u8(experts, h, i // 32, lo=117, hi=125)}


def build(shape: ExpertShape, experts: int, cold: int, gen: torch.Generator, ex: TritonW4a8Experts):
    original = random_experts(shape, experts, gen)
    full = {n: t.clone() for n, t in original.items()}
    ex.to_kernel_layout(full)
    perm = torch.randperm(experts, generator=torch.Generator().manual_seed(7)).tolist()
    cold_ids, hot_ids = sorted(perm[:cold]), perm[cold:]
    unsplit = build_unsplit_layer(full, layer_index=0)
    split = rehome_layer(dict(full), hot_ids, cold_ids, layer_index=0, hot_alloc=device_allocator(DEV),
                         cold_alloc=pinned_view_allocator(DEV))
    return original, unsplit, split, hot_ids, cold_ids


def activations(tokens: int, hidden: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(tokens, hidden, generator=gen, device=DEV).to(torch.bfloat16)


def reference(original: dict[str, torch.Tensor], x, ids, weights, swiglu_limit=None) -> torch.Tensor:
    """vLLM's MXFP4 tensors dequantized in fp32; both GEMM inputs through the runtime's twin of
    vLLM's FP8 quantization (per token and 128 values); each pick's row rounded to bf16; the fma
    finalize."""
    t, k = ids.shape
    i = original["w13_weight"].shape[1] // 2
    xq, xs = per_token_group_quant_fp8(x, 128)
    xf = (xq.float().reshape(t, -1, 128) * xs[..., None]).reshape(t, -1)
    rows = torch.zeros(t, k, x.shape[1], dtype=torch.bfloat16, device=DEV)
    for e in torch.unique(ids).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w13 = dequantize_mxfp4(original["w13_weight"][e], original["w13_weight_scale"][e], torch.float32)
        w2 = dequantize_mxfp4(original["w2_weight"][e], original["w2_weight_scale"][e], torch.float32)
        h = xf[tok] @ w13.T
        g, u = h[:, :i], h[:, i:]
        if swiglu_limit is not None:
            g, u = g.clamp(max=swiglu_limit), u.clamp(-swiglu_limit, swiglu_limit)
        a = torch.nn.functional.silu(g) * u
        aq, as_ = per_token_group_quant_fp8(a, 128)
        af = (aq.float().reshape(len(tok), -1, 128) * as_[..., None]).reshape(len(tok), -1)
        rows[tok, slot] = (af @ w2.T).to(torch.bfloat16)
    return core_finalize(rows, weights, torch.bfloat16)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_layer_input_quantization_is_vllms_bit_for_bit() -> None:
    gen = torch.Generator(device=DEV).manual_seed(1)
    ex = TritonW4a8Experts(SMALL, 8, 4, max_tokens=40, device=DEV)
    x = activations(37, SMALL.hidden, gen) * 3
    x[5, :128] = 0            # an all-zero group takes the eps scale
    sc = ex._scratch
    kernels_w4a8.quant_rows_kernel[(37, SMALL.hidden // 128)](x, x.stride(0), sc.xq, sc.xs, K=SMALL.hidden, G=128)
    q, s = per_token_group_quant_fp8(x, 128)
    assert torch.equal(sc.xq[:37].view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(sc.xs[:37], s)


@pytest.mark.parametrize("tokens", [1, 3, 16, 96])
def test_split_equals_unsplit_and_matches_the_reference(tokens: int) -> None:
    gen = torch.Generator(device=DEV).manual_seed(100 + tokens)
    experts, k = 16, 6
    ex = TritonW4a8Experts(SMALL, experts, k, max_tokens=128, device=DEV, swiglu_limit=10.0)
    original, unsplit, split, hot_ids, cold_ids = build(SMALL, experts, 6, gen, ex)
    ids, weights = random_routing(tokens, experts, k, gen, hot_ids, cold_ids)
    x = activations(tokens, SMALL.hidden, gen)
    out_split = ex.forward(split, x, weights, ids).clone()
    out_unsplit = ex.forward(unsplit, x, weights, ids).clone()
    assert torch.isfinite(out_split.float()).all()
    assert torch.equal(out_split, out_unsplit)
    rel = rel_l2(out_split, reference(original, x, ids, weights, 10.0))
    print(f"\nFP8-activation layer, T={tokens}: relative L2 against the FP8-input fp32 reference {rel:.2e}")
    assert rel <= REL_TOL


def test_dsv41_geometry_split_equals_unsplit_and_matches_the_reference() -> None:
    gen = torch.Generator(device=DEV).manual_seed(5)
    experts, k, tokens = 12, 6, 6
    ex = TritonW4a8Experts(DSV41, experts, k, max_tokens=16, device=DEV, swiglu_limit=10.0)
    original, unsplit, split, hot_ids, cold_ids = build(DSV41, experts, 6, gen, ex)
    ids, weights = random_routing(tokens, experts, k, gen, hot_ids, cold_ids)
    x = activations(tokens, DSV41.hidden, gen)
    out_split = ex.forward(split, x, weights, ids).clone()
    assert torch.equal(out_split, ex.forward(unsplit, x, weights, ids))
    rel = rel_l2(out_split, reference(original, x, ids, weights, 10.0))
    print(f"\nFP8-activation layer, DSv4.1 geometry T={tokens}: relative L2 {rel:.2e}")
    assert rel <= REL_TOL


def test_graph_replay_with_counter_and_padded_tokens() -> None:
    gen = torch.Generator(device=DEV).manual_seed(21)
    experts, k, tokens = 16, 6, 24
    ex = TritonW4a8Experts(SMALL, experts, k, max_tokens=tokens, device=DEV)
    _, unsplit, split, _, _ = build(SMALL, experts, 6, gen, ex)
    counter = ExpertCounter([0], experts, device=DEV)
    out = torch.empty(tokens, SMALL.hidden, dtype=torch.bfloat16, device=DEV)
    mask = torch.ones(tokens, dtype=torch.bool, device=DEV)
    ids0, w0 = random_routing(tokens, experts, k, gen)
    x0 = activations(tokens, SMALL.hidden, gen)
    graph = CapturedStep(lambda xx, ww, ii: ex.forward(split, xx, ww, ii, counter=counter, token_mask=mask,
                                                       out=out), x0, w0, ids0)
    counter.reset()
    expected, seen = torch.zeros(experts, dtype=torch.int64, device=DEV), 0
    for _ in range(4):
        ids, w = random_routing(tokens, experts, k, gen)
        x = activations(tokens, SMALL.hidden, gen)
        m = torch.rand(tokens, generator=gen, device=DEV) > 0.25
        mask.copy_(m)
        replayed = graph.replay(x, w, ids).clone()
        eager = ex.forward(unsplit, x, w, ids, token_mask=m)
        assert torch.equal(replayed[m], eager[m])
        expected += torch.bincount(ids[m].flatten(), minlength=experts)
        seen += int(m.sum())
    assert torch.equal(counter.counts[0], expected)
    assert int(counter.tokens[0]) == seen


def test_minus_one_picks_add_nothing() -> None:
    gen = torch.Generator(device=DEV).manual_seed(33)
    experts, k, tokens = 16, 6, 16
    ex = TritonW4a8Experts(SMALL, experts, k, max_tokens=tokens, device=DEV)
    _, unsplit, _, _, _ = build(SMALL, experts, 0, gen, ex)
    ids, w = random_routing(tokens, experts - 1, k, gen)     # the last expert is never picked
    ids[::2, 0] = -1
    x = activations(tokens, SMALL.hidden, gen)
    before = ex.forward(unsplit, x, w, ids).clone()
    for name in ("w13_weight", "w2_weight"):
        unsplit.hot.tensors[name][experts - 1] = torch.randint(0, 256, unsplit.hot.tensors[name][0].shape,
                                                               device=DEV, dtype=torch.int32).to(torch.uint8)
    assert torch.equal(ex.forward(unsplit, x, w, ids), before)
