"""Random routed experts in vLLM 0.33's parameter names for the parallel tests (tests import it
directly): bf16 with biases, MXFP4 (packed E2M1 + ue8m0 scales) or FP8 E4M3 with 128x128 block
scales, plus the core's per-pick function for that format."""

from __future__ import annotations

import torch
from expert_residency.core.formats_ref import float_per_pick, fp8_block_per_pick, mxfp4_per_pick
from expert_residency.fp8 import quantize_fp8_block
from expert_residency.mxfp4 import quantize_mxfp4


def random_experts(fmt: str, e: int, h: int, i: int, seed: int) -> tuple[dict[str, torch.Tensor], object]:
    """`e` experts of hidden `h`, intermediate `i` in format `fmt` ("bf16", "mxfp4", "fp8"), drawn
    from `seed`; (tensors by vLLM parameter name, per-pick function)."""
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(e, 2 * i, h, generator=g) * 0.05
    w2 = torch.randn(e, h, i, generator=g) * 0.05
    if fmt == "bf16":
        return {"w13_weight": w13.bfloat16(), "w2_weight": w2.bfloat16(),
                "w13_bias": (torch.randn(e, 2 * i, generator=g) * 0.1).bfloat16(),
                "w2_bias": (torch.randn(e, h, generator=g) * 0.1).bfloat16()}, float_per_pick()
    if fmt == "mxfp4":
        p13, s13 = quantize_mxfp4(w13)
        p2, s2 = quantize_mxfp4(w2)
        return {"w13_weight": p13, "w13_weight_scale": s13, "w2_weight": p2, "w2_weight_scale": s2}, mxfp4_per_pick()
    q13, s13 = quantize_fp8_block(w13)
    q2, s2 = quantize_fp8_block(w2)
    return {"w13_weight": q13, "w13_weight_scale_inv": s13, "w2_weight": q2, "w2_weight_scale_inv": s2}, \
        fp8_block_per_pick()
