"""A router id of -1 (vLLM's id for another rank's expert, or an unrouted pick) on every torch path
that takes picks, with the **last expert filled with NaN**: Python's ``codes[-1]`` wrap-around, or
any lookup of ``table[-1]``, would read that expert and turn the token's output into NaN.

Paths: the core's split invoke + fp32-fma finalize (``core.split.residency_forward``) and the
expert-parallel path (``parallel.ep.ep_forward``), each with the per-pick functions of
``core.reference`` (float and MXFP4 SwiGLU) and of ``core.formats_ref`` (float, MXFP4, gpt-oss
MXFP4, FP8 block), on the unsplit layer and on a split one whose cold bank holds the last expert.

Expected, derived without the code under test's skip: a -1 pick contributes ``fma(0, 0, acc)``,
which is what a pick of a finite expert with router weight 0 contributes (``0 * y`` is a signed
zero, and ``acc + 0 == acc`` for any ``acc`` other than -0); so each output must equal, bit for
bit, the same path run with every -1 replaced by expert 0 at weight 0. The test can fail: a token
that routes the last expert for real comes out NaN (the poison is live), and the wrap-around
(-1 -> E - 1) comes out NaN.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import build_unsplit_layer, device_allocator, host_allocator, rehome_layer, residency_forward  # noqa: E402
from expert_residency.core.formats_ref import float_per_pick, fp8_block_per_pick, gptoss_mxfp4_per_pick, mxfp4_per_pick  # noqa: E402
from expert_residency.core.reference import mxfp4_swiglu_per_pick, swiglu_per_pick  # noqa: E402
from expert_residency.fp8 import quantize_fp8_block  # noqa: E402
from expert_residency.parallel.ep import ep_forward  # noqa: E402
from test_core_fixtures import (  # noqa: E402
    EXPERTS,
    clone_tensors,
    float_layer,
    hidden_states,
    mxfp4_layer,
    single_torch_thread,  # noqa: E402,F401  (autouse)
)

pytestmark = pytest.mark.torch
NAN = float("nan")
LAST = EXPERTS - 1
HOT = [3, 0, 7, 1, 9, 12, 5, 2, 14, 10]          # not the last expert
COLD = [e for e in range(EXPERTS) if e not in HOT]
assert LAST in COLD
# token 0: -1 in the middle; token 1: -1 first and last; token 2: no -1; token 3: every pick -1
IDS = torch.tensor([[3, -1, 8, 0], [-1, 11, 6, -1], [4, 13, 2, 1], [-1, -1, -1, -1]], dtype=torch.int32)
WEIGHTS = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4],
                        [0.3, 0.3, 0.2, 0.2]], dtype=torch.float32)
SKIPPED = IDS < 0


def _fp8_layer(seed: int) -> dict[str, torch.Tensor]:
    f = float_layer(seed, torch.float32, hidden=128, inter=128)
    q13, s13 = quantize_fp8_block(f["w13_weight"])
    q2, s2 = quantize_fp8_block(f["w2_weight"])
    return {"w13_weight": q13, "w13_weight_scale_inv": s13, "w2_weight": q2, "w2_weight_scale_inv": s2}


def _poison_last(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The last expert's float tensors (weights, biases, FP8 block scales) all NaN. MXFP4 codes
    have no NaN, so MXFP4 layers get NaN biases (the per-pick functions add them after each GEMM)."""
    out = clone_tensors(tensors)
    for t in out.values():
        if t.dtype.is_floating_point:
            t[LAST] = NAN
    if "w13_bias" not in out:   # packed MXFP4 without biases: add them, finite except the last expert
        e, two_i = out["w13_weight"].shape[:2]
        h = out["w2_weight"].shape[1]
        g = torch.Generator().manual_seed(5)
        out["w13_bias"] = torch.randn(e, two_i, generator=g) * 0.05
        out["w2_bias"] = torch.randn(e, h, generator=g) * 0.05
        out["w13_bias"][LAST] = NAN
        out["w2_bias"][LAST] = NAN
    return out


CASES = {   # name: (tensors, per-pick fn, hidden, activations dtype)
    "reference-float": (lambda: float_layer(5, torch.bfloat16, bias=True), swiglu_per_pick, 64, torch.bfloat16),
    "reference-mxfp4": (lambda: mxfp4_layer(6), mxfp4_swiglu_per_pick, 64, torch.bfloat16),
    "formats-float": (lambda: float_layer(7, torch.float32), float_per_pick, 64, torch.float32),
    "formats-mxfp4": (lambda: mxfp4_layer(8), mxfp4_per_pick, 64, torch.bfloat16),
    "formats-gptoss-mxfp4": (lambda: mxfp4_layer(9), gptoss_mxfp4_per_pick, 64, torch.bfloat16),
    "formats-fp8-block": (lambda: _fp8_layer(10), fp8_block_per_pick, 128, torch.bfloat16),
}


def _layers(tensors):
    split = rehome_layer(clone_tensors(tensors), HOT, COLD, layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    return build_unsplit_layer(tensors, layer_index=0), split


@pytest.mark.parametrize("case", sorted(CASES))
def test_minus_one_never_reads_the_last_expert(case: str) -> None:
    make, make_fn, hidden, dtype = CASES[case]
    tensors = _poison_last(make())
    fn = make_fn()
    unsplit, split = _layers(tensors)
    x = hidden_states(11, IDS.shape[0], dtype, hidden=hidden)
    identity = torch.arange(EXPERTS, dtype=torch.int32)
    substitute = torch.where(SKIPPED, torch.zeros_like(IDS), IDS)   # expert 0 at weight 0
    zero_w = torch.where(SKIPPED, torch.zeros_like(WEIGHTS), WEIGHTS)
    want = residency_forward(unsplit, x, zero_w, substitute, fn)
    assert torch.isfinite(want.float()).all()
    assert torch.equal(want[3], torch.zeros_like(want[3]))        # no pick of its own: exactly +0
    for name, layer in (("unsplit", unsplit), ("split", split)):
        assert torch.equal(residency_forward(layer, x, WEIGHTS, IDS, fn), want), f"{case}: {name} layer"
        assert torch.equal(ep_forward(layer, x, WEIGHTS, IDS, identity, fn), want), f"{case}: {name} layer, EP path"

    # the poison is live: routing the last expert for real gives NaN, and so would the wrap-around
    real = IDS.clone()
    real[2, 1] = LAST
    assert torch.isnan(residency_forward(split, x, WEIGHTS, real, fn)[2].float()).all()
    wrapped = torch.where(SKIPPED, IDS + EXPERTS, IDS)
    assert torch.isnan(residency_forward(unsplit, x, WEIGHTS, wrapped, fn)[0].float()).all()
