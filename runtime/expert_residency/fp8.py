"""FP8 (E4M3) block-scaled expert weights and per-token-group activation quantization.

Layout (vLLM 0.33 ``Fp8MoEMethod.create_weights`` with ``weight_block_size`` set,
``model_executor/layers/quantization/fp8.py:570-645``): ``w13_weight [E, 2I, H]`` and
``w2_weight [E, H, I]`` in ``torch.float8_e4m3fn``; one fp32 scale per 128 x 128 block,
``w13_weight_scale_inv [E, ceil(2I/128), ceil(H/128)]`` and
``w2_weight_scale_inv [E, ceil(H/128), ceil(I/128)]`` (the ``_inv`` name is DeepSeek-V3's; the
value *multiplies* the stored fp8 value: ``w = float(q) * s``).

Activations are quantized on the fly per token and per group of 128 consecutive values along
the reduction dim (``per_token_group_quant_fp8``, ``quantization/utils/fp8_utils.py:131-134``):
``s = max(amax, 1e-10) * (1 / 448)``, ``q = clamp(x / s, -448, 448)`` rounded to E4M3.
Every E4M3 value is exact in bf16 and fp32, so dequantization is exact.
"""

from __future__ import annotations

import torch

from .contract.expert_formats import FP8_BLOCK

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
BLOCK = FP8_BLOCK  # contract.expert_formats
# vLLM's eps in per_token_group_quant_fp8 (fp8_utils.py:635).
GROUP_EPS = 1e-10


def _blocks(n: int, block: int) -> int:
    return (n + block - 1) // block


def expand_block_scales(scales: torch.Tensor, rows: int, cols: int,
                        block: tuple[int, int] = (BLOCK, BLOCK)) -> torch.Tensor:
    """``[..., ceil(rows/bn), ceil(cols/bk)]`` block scales -> one scale per weight ``[..., rows, cols]``."""
    bn, bk = block
    full = scales.repeat_interleave(bn, dim=-2).repeat_interleave(bk, dim=-1)
    return full[..., :rows, :cols]


def dequantize_fp8_block(weight: torch.Tensor, scales: torch.Tensor,
                         block: tuple[int, int] = (BLOCK, BLOCK)) -> torch.Tensor:
    """fp8 ``[..., N, K]`` and fp32 block scales -> fp32 ``[..., N, K]`` (``float(q) * s``, exact
    per element up to the one fp32 rounding of the product)."""
    if weight.dtype != FP8_DTYPE:
        raise TypeError(f"FP8 block weights must be {FP8_DTYPE}, got {weight.dtype}")
    rows, cols = weight.shape[-2:]
    want = (_blocks(rows, block[0]), _blocks(cols, block[1]))
    if tuple(scales.shape[-2:]) != want or scales.shape[:-2] != weight.shape[:-2]:
        raise ValueError(f"block scales {tuple(scales.shape)} do not match weights "
                         f"{tuple(weight.shape)} in {block[0]}x{block[1]} blocks (want [..., {want[0]}, {want[1]}])")
    return weight.float() * expand_block_scales(scales.float(), rows, cols, block)


def quantize_fp8_block(w: torch.Tensor, block: tuple[int, int] = (BLOCK, BLOCK)
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Float ``[..., N, K]`` -> (fp8 ``[..., N, K]``, fp32 scales ``[..., N/bn, K/bk]``), scale =
    block amax / 448 (the checkpoint convention). For tests and synthetic checkpoints."""
    rows, cols = w.shape[-2:]
    bn, bk = block
    if rows % bn or cols % bk:
        raise ValueError(f"weights {tuple(w.shape)} are not whole {bn}x{bk} blocks")
    lead = w.shape[:-2]
    blocks = w.float().reshape(*lead, rows // bn, bn, cols // bk, bk)
    amax = blocks.abs().amax(dim=(-3, -1))
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (blocks / scales[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).reshape(w.shape).to(FP8_DTYPE)
    return q, scales


def per_token_group_quant_fp8(x: torch.Tensor, group: int = BLOCK, *, ue8m0: bool = False
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., K]`` -> (fp8 ``[..., K]``, fp32 scales ``[..., K/group]``) as vLLM's
    ``per_token_group_quant_fp8`` (fp8_utils.py:131-134): ``s = max(amax, eps) * (1/448)``
    (``ue8m0``: rounded up to a power of two), ``q = clamp(x / s, -448, 448)``."""
    k = x.shape[-1]
    if k % group:
        raise ValueError(f"last dimension {k} is not a multiple of the group size {group}")
    g = x.float().reshape(*x.shape[:-1], k // group, group)
    amax = torch.clamp(g.abs().amax(dim=-1), min=GROUP_EPS)
    scale = amax * (1.0 / FP8_MAX)
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = torch.clamp(g / scale.unsqueeze(-1), -FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(x.shape), scale
