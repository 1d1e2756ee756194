"""The core reference's SwiGLU clamp (``swiglu_limit``), as vLLM 0.33 applies it to SILU experts
(``fused_moe/activation.py`` ``silu_and_mul_with_clamp``, ``fused_moe/utils.py``
``_swiglu_limit_torch``): ``silu(min(gate, L)) * clamp(up, -L, L)``, gate rows first.

Claims, each able to fail:
* the MXFP4 (and float) per-pick reference with a limit equals a plain dequantize -> clamp ->
  matmul written here (tolerance: fp32 summation order);
* the clamp changes the output (the test layers' products exceed the limit);
* residency == unsplit with the clamp, bit for bit (``torch.equal``);
* ``swiglu_limit=None`` is the unclamped reference, bit for bit; a limit <= 0 or inf is refused.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import build_unsplit_layer, device_allocator, host_allocator, rehome_layer, residency_forward  # noqa: E402
from expert_residency.core.reference import check_swiglu_limit, mxfp4_swiglu_per_pick, swiglu_per_pick  # noqa: E402
from expert_residency.mxfp4 import dequantize_mxfp4  # noqa: E402
from test_core_fixtures import (  # noqa: E402
    EXPERTS,
    INTER,
    TOP_K,
    clone_tensors,
    float_layer,
    hidden_states,
    mxfp4_layer,
    random_partition,
    routing,
    single_torch_thread,  # noqa: E402,F401  (autouse)
)

pytestmark = pytest.mark.torch

# The fixtures' gate/up products are ~N(0, 1): a limit of 0.75 clamps a large share of them.
LIMIT = 0.75


def _direct(w13: torch.Tensor, w2: torch.Tensor, x: torch.Tensor, ids: torch.Tensor,
            weights: torch.Tensor, limit: float | None) -> torch.Tensor:
    """Per (token, pick): fp32 ``g = W13[e] x``; gate ≤ L, -L ≤ up ≤ L; bf16 activation (what the
    kernels store); fp32 ``W2[e] a``; bf16 pick row; fp32 weighted sum; one cast."""
    out = torch.zeros(x.shape[0], w2.shape[1])
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            g = w13[e].float() @ x[t].float()
            gate, up = g[:INTER], g[INTER:]
            if limit is not None:
                gate = torch.clamp(gate, max=limit)
                up = torch.clamp(up, min=-limit, max=limit)
            a = (torch.nn.functional.silu(gate) * up).to(x.dtype).float()
            y = (w2[e].float() @ a).to(x.dtype).float()
            out[t] += float(weights[t, k]) * y
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_mxfp4_reference_with_clamp_equals_dequantize_clamp_matmul():
    tensors = mxfp4_layer(21)
    x = hidden_states(1, 12, torch.bfloat16)
    ids, weights = routing(1, 12)
    w13 = dequantize_mxfp4(tensors["w13_weight"], tensors["w13_weight_scale"])
    w2 = dequantize_mxfp4(tensors["w2_weight"], tensors["w2_weight_scale"])
    layer = build_unsplit_layer(tensors, layer_index=0)
    got = residency_forward(layer, x, weights, ids, mxfp4_swiglu_per_pick(swiglu_limit=LIMIT))
    want = _direct(w13, w2, x, ids, weights, LIMIT)
    assert _rel(got, want) < 1e-2
    plain = _direct(w13, w2, x, ids, weights, None)
    assert _rel(plain, want) > 0.1, "the clamp must change the output for this test to mean much"
    # Same check on the float-weight reference.
    floats = float_layer(22, torch.float32)
    got = residency_forward(build_unsplit_layer(floats, layer_index=0), x, weights, ids,
                            swiglu_per_pick(swiglu_limit=LIMIT))
    assert _rel(got, _direct(floats["w13_weight"], floats["w2_weight"], x, ids, weights, LIMIT)) < 1e-2


def test_no_limit_is_the_unclamped_reference_bit_for_bit():
    tensors = mxfp4_layer(23)
    x = hidden_states(2, 10, torch.bfloat16)
    ids, weights = routing(2, 10)
    layer = build_unsplit_layer(tensors, layer_index=0)
    default = residency_forward(layer, x, weights, ids, mxfp4_swiglu_per_pick())
    assert torch.equal(default, residency_forward(layer, x, weights, ids,
                                                  mxfp4_swiglu_per_pick(swiglu_limit=None)))
    # A limit above every product clamps nothing: also bit-identical.
    huge = residency_forward(layer, x, weights, ids, mxfp4_swiglu_per_pick(swiglu_limit=1e30))
    assert torch.equal(default, huge)
    assert not torch.equal(default, residency_forward(layer, x, weights, ids,
                                                      mxfp4_swiglu_per_pick(swiglu_limit=LIMIT)))


@pytest.mark.parametrize("hot_count", [3, 12])
def test_split_equals_unsplit_with_clamp(hot_count):
    tensors = mxfp4_layer(24)
    hot, cold = random_partition(hot_count, EXPERTS, hot_count)
    reference = build_unsplit_layer(tensors, layer_index=2)
    split = rehome_layer(clone_tensors(tensors), hot, cold, layer_index=2,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    fn = mxfp4_swiglu_per_pick(swiglu_limit=LIMIT)
    for seed in range(2):
        x = hidden_states(seed, 16, torch.bfloat16)
        ids, weights = routing(seed, 16, hot_ids=hot, cold_ids=cold)
        assert ids.shape[1] == TOP_K
        assert torch.equal(residency_forward(split, x, weights, ids, fn),
                           residency_forward(reference, x, weights, ids, fn))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_limit_must_be_finite_and_positive(bad):
    with pytest.raises(ValueError, match="swiglu_limit must be None or a finite float > 0"):
        mxfp4_swiglu_per_pick(swiglu_limit=bad)
    assert check_swiglu_limit(None) is None and check_swiglu_limit(7) == 7.0
