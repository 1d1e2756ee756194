"""The core's per-format torch references (``core.formats_ref``): gpt-oss MXFP4 with biases and
SwiGLU-OAI, BF16 (SILU and SwiGLU-OAI, with and without biases) and FP8 E4M3 with 128x128 block
scales.

Claims, each able to fail:
* SwiGLU-OAI on hand-computed numbers: interleaved gate/up, gate clamped from above only, up on
  both sides, ``(up + 1) * gate * sigmoid(1.702 * gate)``, limit 7.0;
* each reference equals a dequantize-then-fp32-matmul loop written here (tolerances stated per
  test), and the biases, the clamp and the interleaving each change the output;
* split == unsplit bit for bit (``torch.equal``) for several hot/cold partitions with tokens
  entirely hot, entirely cold and straddling the banks; swaps (every tensor, scales and biases
  included) keep the output bit-identical;
* FP8 helpers on hand numbers: per-token-group scales ``amax / 448``, block scales per 128x128.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import (  # noqa: E402
    build_unsplit_layer,
    device_allocator,
    host_allocator,
    rehome_layer,
    residency_forward,
    swap_experts,
)
from expert_residency.core.formats_ref import (  # noqa: E402
    deinterleave_gate_up,
    float_per_pick,
    fp8_block_per_pick,
    gptoss_mxfp4_per_pick,
    make_activation,
    mxfp4_per_pick,
    swigluoai,
)
from expert_residency.fp8 import FP8_DTYPE, dequantize_fp8_block, per_token_group_quant_fp8, quantize_fp8_block  # noqa: E402
from expert_residency.mxfp4 import dequantize_mxfp4, quantize_mxfp4  # noqa: E402
from test_core_fixtures import (  # noqa: E402
    clone_tensors,
    hidden_states,
    random_partition,
    routing,
    single_torch_thread,  # noqa: E402,F401  (autouse)
)

pytestmark = pytest.mark.torch

E, K = 8, 4                 # experts, top-k
H, I = 256, 128             # FP8 needs whole 128x128 blocks: w13 is 2 x 2 blocks, w2 2 x 1


def _sig(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def test_swigluoai_by_hand():
    # Interleaved [gate0, up0, gate1, up1, gate2, up2].
    g = torch.tensor([[2.0, 0.5, 10.0, -9.0, -3.0, 8.0]])
    got = swigluoai(g)
    want = [
        (0.5 + 1) * 2.0 * _sig(1.702 * 2.0),
        (-7.0 + 1) * 7.0 * _sig(1.702 * 7.0),      # gate 10 -> 7, up -9 -> -7
        (7.0 + 1) * -3.0 * _sig(1.702 * -3.0),     # gate not clamped from below; up 8 -> 7
    ]
    assert got.shape == (1, 3)
    assert torch.allclose(got[0], torch.tensor(want), rtol=1e-6, atol=0)
    # Overrides (a model with other constants), and the gate-first SILU for contrast.
    assert torch.allclose(make_activation("swigluoai", alpha=1.0, swiglu_limit=100.0)(g)[0, 1],
                          torch.tensor((-9.0 + 1) * 10.0 * _sig(10.0)), rtol=1e-6)
    # Gate rows first (after deinterleave_gate_up): the same numbers.
    assert torch.equal(make_activation("swigluoai_uninterleave")(g[:, [0, 2, 4, 1, 3, 5]]), got)
    silu = make_activation("silu")(torch.tensor([[2.0, 10.0, 0.5, -9.0]]))
    assert torch.allclose(silu[0], torch.tensor([2.0 * _sig(2.0) * 0.5, 10.0 * _sig(10.0) * -9.0]), rtol=1e-6)


def test_activation_refusals():
    with pytest.raises(ValueError, match="not one of"):
        make_activation("gelu")
    with pytest.raises(ValueError, match="no alpha"):
        make_activation("silu", alpha=1.702)
    with pytest.raises(ValueError, match="swiglu_limit"):
        make_activation("swigluoai", swiglu_limit=0.0)


# -- layers -----------------------------------------------------------------------------------

def _float_weights(seed: int, *, w13_scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w13_weight": torch.randn(E, 2 * I, H, generator=g) * (w13_scale / H ** 0.5),
            "w2_weight": torch.randn(E, H, I, generator=g) / I ** 0.5}


def _biases(seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1000)
    return {"w13_bias": (torch.randn(E, 2 * I, generator=g) * 0.5).to(dtype),
            "w2_bias": (torch.randn(E, H, generator=g) * 0.2).to(dtype)}


def gptoss_layer(seed: int) -> dict[str, torch.Tensor]:
    """MXFP4 w13 (interleaved gate/up rows), w2, ue8m0 scales, fp32 biases. The gate/up products
    are ~N(0, 4^2) so the limit 7.0 clamps some of them."""
    w = _float_weights(seed, w13_scale=4.0)
    p13, s13 = quantize_mxfp4(w["w13_weight"])
    p2, s2 = quantize_mxfp4(w["w2_weight"])
    return {"w13_weight": p13, "w13_weight_scale": s13, "w2_weight": p2, "w2_weight_scale": s2,
            **_biases(seed, torch.float32)}


def bf16_layer(seed: int, bias: bool = False, w13_scale: float = 1.0) -> dict[str, torch.Tensor]:
    out = {n: t.bfloat16() for n, t in _float_weights(seed, w13_scale=w13_scale).items()}
    if bias:
        out.update(_biases(seed, torch.bfloat16))
    return out


def fp8_layer(seed: int) -> dict[str, torch.Tensor]:
    w = _float_weights(seed)
    # Spread the block magnitudes so the per-block scales differ by up to 8x.
    w["w13_weight"][:, :I] *= 4.0
    w["w2_weight"][:, H // 2:] *= 0.5
    q13, s13 = quantize_fp8_block(w["w13_weight"])
    q2, s2 = quantize_fp8_block(w["w2_weight"])
    return {"w13_weight": q13, "w13_weight_scale_inv": s13, "w2_weight": q2, "w2_weight_scale_inv": s2}


def _direct(w13: torch.Tensor, w2: torch.Tensor, b13, b2, x: torch.Tensor, ids: torch.Tensor,
            weights: torch.Tensor, activation: str, fp8_inputs: bool = False) -> torch.Tensor:
    """Per (token, pick), in plain fp32 from dequantized weights: ``g = W13 x + b13``; the
    activation written out again here; bf16 activation; ``y = W2 a + b2``; bf16 pick row; fp32
    weighted sum. ``fp8_inputs``: both GEMMs' inputs first go through E4M3 per 128 values and back
    (W8A8 emulated by dequantizing)."""
    def inp(v: torch.Tensor) -> torch.Tensor:
        if not fp8_inputs:
            return v.float()
        q, s = per_token_group_quant_fp8(v.unsqueeze(0))
        return (q.float().reshape(-1, 128) * s.reshape(-1, 1)).reshape(-1)

    out = torch.zeros(x.shape[0], w2.shape[1])
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            g = w13[e].float() @ inp(x[t])
            if b13 is not None:
                g = g + b13[e].float()
            if activation == "swigluoai":
                gate = torch.clamp(g[0::2], max=7.0)
                up = torch.clamp(g[1::2], min=-7.0, max=7.0)
                a = (up + 1.0) * gate * torch.sigmoid(1.702 * gate)
            else:
                a = torch.nn.functional.silu(g[:I]) * g[I:]
            y = w2[e].float() @ inp(a.bfloat16())
            if b2 is not None:
                y = y + b2[e].float()
            out[t] += float(weights[t, k]) * y.bfloat16().float()
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _forward(tensors, fn, x, ids, weights):
    return residency_forward(build_unsplit_layer(tensors, layer_index=0), x, weights, ids, fn,
                             pick_dtype=torch.bfloat16)


def test_gptoss_mxfp4_reference_equals_dequantize_then_matmul():
    tensors = gptoss_layer(1)
    x = hidden_states(1, 12, torch.bfloat16, hidden=H)
    ids, weights = routing(1, 12, experts=E, top_k=K)
    w13 = dequantize_mxfp4(tensors["w13_weight"], tensors["w13_weight_scale"])
    w2 = dequantize_mxfp4(tensors["w2_weight"], tensors["w2_weight_scale"])
    got = _forward(tensors, gptoss_mxfp4_per_pick(), x, ids, weights)
    want = _direct(w13, w2, tensors["w13_bias"], tensors["w2_bias"], x, ids, weights, "swigluoai")
    # Only fp32 summation order and the bf16 roundings of activation and pick row differ.
    assert _rel(got, want) < 1e-2
    g = torch.einsum("enh,th->ten", w13, x.float())
    assert float((g.abs() > 7.0).float().mean()) > 0.05, "the limit must clamp for this to test it"
    # Each ingredient matters: biases, the interleaving, the clamp.
    no_bias = {n: v for n, v in tensors.items() if not n.endswith("_bias")}
    assert _rel(_forward(no_bias, gptoss_mxfp4_per_pick(), x, ids, weights), want) > 0.05
    assert _rel(_direct(w13, w2, tensors["w13_bias"], tensors["w2_bias"], x, ids, weights, "silu"), want) > 0.1
    assert _rel(_forward(tensors, gptoss_mxfp4_per_pick(swiglu_limit=1e6), x, ids, weights), want) > 0.05


@pytest.mark.parametrize("activation,bias", [("silu", False), ("silu", True), ("swigluoai", True)])
def test_bf16_reference_equals_plain_matmul(activation, bias):
    tensors = bf16_layer(2, bias=bias, w13_scale=4.0 if activation == "swigluoai" else 1.0)
    x = hidden_states(2, 10, torch.bfloat16, hidden=H)
    ids, weights = routing(2, 10, experts=E, top_k=K)
    got = _forward(tensors, float_per_pick(activation), x, ids, weights)
    want = _direct(tensors["w13_weight"], tensors["w2_weight"], tensors.get("w13_bias"),
                   tensors.get("w2_bias"), x, ids, weights, activation)
    assert _rel(got, want) < 1e-2


def test_deinterleaved_gptoss_layer_is_the_same_layer():
    """``deinterleave_gate_up`` (what a gate-first kernel reads) + ``swigluoai_uninterleave`` ==
    the interleaved layer with ``swigluoai``, bit for bit; rows moved by hand."""
    tensors = gptoss_layer(5)
    moved = clone_tensors(tensors)
    deinterleave_gate_up(moved)
    assert torch.equal(moved["w13_weight"][2, I + 3], tensors["w13_weight"][2, 7])    # up row 3
    assert torch.equal(moved["w13_weight_scale"][2, 3], tensors["w13_weight_scale"][2, 6])
    assert float(moved["w13_bias"][1, I]) == float(tensors["w13_bias"][1, 1])
    assert torch.equal(moved["w2_weight"], tensors["w2_weight"])
    x = hidden_states(5, 6, torch.bfloat16, hidden=H)
    ids, weights = routing(5, 6, experts=E, top_k=K)
    assert torch.equal(_forward(moved, mxfp4_per_pick("swigluoai_uninterleave"), x, ids, weights),
                       _forward(tensors, gptoss_mxfp4_per_pick(), x, ids, weights))


def test_round_gate_up_is_the_unfused_rounding():
    """``round_gate_up`` (vLLM's Triton fused_moe stores the gate/up products in bf16 before the
    activation): close to the fused order, not always the same bits."""
    tensors = bf16_layer(3, bias=True, w13_scale=4.0)
    x = hidden_states(3, 16, torch.bfloat16, hidden=H)
    ids, weights = routing(3, 16, experts=E, top_k=K)
    fused = _forward(tensors, float_per_pick("swigluoai"), x, ids, weights)
    unfused = _forward(tensors, float_per_pick("swigluoai", round_gate_up=True), x, ids, weights)
    assert _rel(unfused, fused) < 1e-2 and not torch.equal(unfused, fused)


def test_fp8_block_reference_equals_dequantize_then_matmul():
    tensors = fp8_layer(4)
    x = hidden_states(4, 12, torch.bfloat16, hidden=H)
    ids, weights = routing(4, 12, experts=E, top_k=K)
    w13 = dequantize_fp8_block(tensors["w13_weight"], tensors["w13_weight_scale_inv"])
    w2 = dequantize_fp8_block(tensors["w2_weight"], tensors["w2_weight_scale_inv"])
    got = _forward(tensors, fp8_block_per_pick(), x, ids, weights)
    want = _direct(w13, w2, None, None, x, ids, weights, "silu")
    # The reference also quantizes both GEMMs' inputs to E4M3 per 128 values (W8A8, as vLLM):
    # 3 mantissa bits, relative error <= 2^-4 per value, ~2^-4/sqrt(3) RMS; the plain fp32 loop
    # keeps bf16 inputs. Through two GEMMs and SiLU that is a few percent.
    rel = _rel(got, want)
    assert 1e-3 < rel < 6e-2, rel
    # With the inputs quantized the same way, only summation order and block-scale rounding remain.
    assert _rel(got, _direct(w13, w2, None, None, x, ids, weights, "silu", fp8_inputs=True)) < 1e-2
    # Ignoring the block scales (all ones) is far off: they are used per block.
    ones = dict(tensors, w13_weight_scale_inv=torch.ones_like(tensors["w13_weight_scale_inv"]))
    assert _rel(_forward(ones, fp8_block_per_pick(), x, ids, weights), want) > 0.5


def test_fp8_helpers_by_hand():
    # One token, two groups of 128: amax 224 -> scale 0.5; amax 0 -> eps / 448.
    x = torch.zeros(1, 256)
    x[0, 0], x[0, 5] = 224.0, -3.0
    q, s = per_token_group_quant_fp8(x)
    assert q.dtype == FP8_DTYPE and s.shape == (1, 2)
    assert float(s[0, 0]) == pytest.approx(0.5, rel=1e-7)
    assert float(s[0, 1]) == pytest.approx(1e-10 / 448, rel=1e-6)
    assert float(q[0, 0].float()) == 448.0 and float(q[0, 5].float()) == -6.0
    # ue8m0: scale rounded up to a power of two (amax 300 -> 300/448 = 0.67 -> 1.0).
    x[0, 0] = 300.0
    assert float(per_token_group_quant_fp8(x, ue8m0=True)[1][0, 0]) == 1.0
    # Block scales: 256x256 with block (1, 0) holding 4x the values -> its scale is 4x.
    w = torch.full((256, 256), 1.0)
    w[128:, :128] = 4.0
    qw, sw = quantize_fp8_block(w)
    assert sw.shape == (2, 2)
    assert torch.allclose(sw, torch.tensor([[1.0, 1.0], [4.0, 1.0]]) / 448)
    assert torch.equal(dequantize_fp8_block(qw, sw), w)
    with pytest.raises(ValueError, match="do not match"):
        dequantize_fp8_block(qw, sw[:1])
    with pytest.raises(TypeError, match="float8"):
        dequantize_fp8_block(w, sw)


# -- split == unsplit, swaps ------------------------------------------------------------------

FORMATS = {
    "gptoss-mxfp4": (gptoss_layer, gptoss_mxfp4_per_pick),
    "mxfp4-silu-bias": (gptoss_layer, lambda: mxfp4_per_pick("silu")),
    "bf16-silu": (lambda s: bf16_layer(s), lambda: float_per_pick("silu")),
    "bf16-gptoss": (lambda s: bf16_layer(s, bias=True, w13_scale=4.0), lambda: float_per_pick("swigluoai")),
    "fp8-block": (fp8_layer, fp8_block_per_pick),
    "fp8-block-swigluoai-bias": (lambda s: {**fp8_layer(s), **_biases(s, torch.bfloat16)},
                                 lambda: fp8_block_per_pick("swigluoai")),
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("hot_count", [1, 5])
def test_split_equals_unsplit_bit_for_bit(fmt, hot_count):
    build, make_fn = FORMATS[fmt]
    tensors = build(10 + hot_count)
    hot, cold = random_partition(hot_count, E, hot_count)
    reference = build_unsplit_layer(tensors, layer_index=3)
    split = rehome_layer(clone_tensors(tensors), hot, cold, layer_index=3,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    assert split.hot.num_rows == hot_count and split.cold.num_rows == E - hot_count
    assert set(split.cold.tensors) == set(tensors)   # scales and biases split with the weights
    fn = make_fn()
    x = hidden_states(hot_count, 12, torch.bfloat16, hidden=H)
    ids, weights = routing(hot_count, 12, experts=E, top_k=K, hot_ids=hot, cold_ids=cold)
    straddle = [t for t in range(12) if {int(e) in hot for e in ids[t]} == {True, False}]
    assert straddle, "the batch must contain tokens straddling the banks"
    got = residency_forward(split, x, weights, ids, fn, pick_dtype=torch.bfloat16)
    want = residency_forward(reference, x, weights, ids, fn, pick_dtype=torch.bfloat16)
    assert torch.equal(got, want)
    assert got.abs().sum() > 0


@pytest.mark.parametrize("fmt", ["gptoss-mxfp4", "bf16-gptoss", "fp8-block"])
def test_swaps_keep_the_output_bit_identical(fmt):
    build, make_fn = FORMATS[fmt]
    tensors = build(31)
    hot, cold = random_partition(31, E, 3)
    reference = build_unsplit_layer(tensors, layer_index=0)
    split = rehome_layer(clone_tensors(tensors), hot, cold, layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    fn = make_fn()
    x = hidden_states(31, 8, torch.bfloat16, hidden=H)
    ids, weights = routing(31, 8, experts=E, top_k=K)
    want = residency_forward(reference, x, weights, ids, fn, pick_dtype=torch.bfloat16)
    swap_experts(split, [(hot[0], cold[0]), (hot[2], cold[3])])
    assert cold[0] in split.hot_ids and hot[0] in split.cold_ids
    assert torch.equal(residency_forward(split, x, weights, ids, fn, pick_dtype=torch.bfloat16), want)
    # A bias row left behind by a swap would show: exchange only the w2_bias rows of the new
    # hot/cold pair behind the map's back and the output changes (for the biased formats).
    if "w2_bias" in split.hot.tensors:
        r_hot, r_cold = split.hot_ids.index(cold[0]), split.cold_ids.index(hot[0])
        row = split.hot.tensors["w2_bias"][r_hot].clone()
        split.hot.tensors["w2_bias"][r_hot] = split.cold.tensors["w2_bias"][r_cold]
        split.cold.tensors["w2_bias"][r_cold] = row
        if bool((ids == cold[0]).any() | (ids == hot[0]).any()):
            assert not torch.equal(residency_forward(split, x, weights, ids, fn, pick_dtype=torch.bfloat16), want)
