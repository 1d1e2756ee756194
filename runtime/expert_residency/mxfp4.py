"""MXFP4 (OCP microscaling FP4) pack/unpack helpers shared by the CPU core and the GPU kernels.

Layout (vLLM's ``Mxfp4MoEMethod`` checkpoint layout, before any backend swizzle):

* values: FP4 E2M1, two per ``uint8`` along the last axis, **low nibble = even element**
  (vLLM's Triton decoders do ``interleave(packed & 0xF, packed >> 4)``); a ``[..., N]`` value tensor
  is stored as ``uint8 [..., N // 2]``;
* scales: one ue8m0 byte per block of 32 consecutive values along the last axis,
  ``uint8 [..., N // 32]``, value ``2 ** (byte - 127)`` (byte 255 is NaN).

E2M1 magnitudes by code 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign.
Dequantization is exact in fp32 (and in bf16 for scales within bf16's exponent range).
"""

from __future__ import annotations

import torch

BLOCK = 32
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E8M0_BIAS = 127


def e2m1_table(device: torch.device | str | None = None) -> torch.Tensor:
    """fp32 ``[16]``: the value of every 4-bit E2M1 code."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """4-bit E2M1 codes (any integer dtype, values 0..15) → fp32, by arithmetic on the device.

    No lookup table: a table built from Python data would be a host-to-device copy, which CUDA-graph
    capture refuses. exponent field ``e = (c >> 1) & 3``, mantissa bit ``m = c & 1``:
    ``e == 0`` → ``0.5 * m`` (subnormal), else ``(1 + 0.5 * m) * 2 ** (e - 1)``; bit 3 is the sign.
    """
    c = codes.to(torch.int32)
    e = (c >> 1) & 3
    m = (c & 1).to(torch.float32)
    normal = torch.ldexp(1.0 + 0.5 * m, (e - 1).clamp(min=0))
    magnitude = torch.where(e == 0, 0.5 * m, normal)
    return torch.where((c & 8) != 0, -magnitude, magnitude)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """``uint8 [..., N/2]`` → fp32 ``[..., N]`` E2M1 values (low nibble first)."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed FP4 must be uint8, got {packed.dtype}")
    low = decode_e2m1(packed & 0x0F)
    high = decode_e2m1(packed >> 4)
    return torch.stack([low, high], dim=-1).flatten(-2)


def e8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    """``uint8`` ue8m0 → fp32 ``2 ** (s - 127)`` (255 → NaN). Exact, including 2**-127."""
    if scales.dtype != torch.uint8:
        raise TypeError(f"ue8m0 scales must be uint8, got {scales.dtype}")
    exps = scales.to(torch.int32) - E8M0_BIAS
    values = torch.ldexp(torch.ones_like(exps, dtype=torch.float32), exps)
    return torch.where(scales == 255, torch.full_like(values, float("nan")), values)


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Packed values ``uint8 [..., N/2]`` and scales ``uint8 [..., N/32]`` → ``dtype [..., N]``."""
    values = unpack_fp4(packed)
    n = values.shape[-1]
    if scales.shape[:-1] != packed.shape[:-1] or scales.shape[-1] * BLOCK != n:
        raise ValueError(f"scales {tuple(scales.shape)} do not match packed values "
                         f"{tuple(packed.shape)} (one scale per {BLOCK} values)")
    blocks = values.reshape(*values.shape[:-1], n // BLOCK, BLOCK)
    scaled = blocks * e8m0_to_float(scales).unsqueeze(-1)
    return scaled.reshape(values.shape).to(dtype)


def quantize_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float ``[..., N]`` (N a multiple of 32) → (packed ``uint8 [..., N/2]``, scales ``uint8 [..., N/32]``).

    OCP MX rule: shared exponent ``floor(log2(amax)) - 2`` (E2M1's largest exponent), values
    rounded to the nearest E2M1 code (ties to the even code), saturating at ±6. For tests and
    synthetic checkpoints; checkpoints come quantized.
    """
    n = x.shape[-1]
    if n % BLOCK:
        raise ValueError(f"last dimension {n} is not a multiple of {BLOCK}")
    blocks = x.float().reshape(*x.shape[:-1], n // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=-1)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(torch.finfo(torch.float32).tiny))) - 2,
                      torch.full_like(amax, -E8M0_BIAS))
    exp = exp.clamp(-E8M0_BIAS, E8M0_BIAS).to(torch.int32)
    scaled = blocks / torch.ldexp(torch.ones_like(amax), exp).unsqueeze(-1)
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=x.device)
    distance = (scaled.abs().unsqueeze(-1) - mags).abs()
    best = distance.min(dim=-1, keepdim=True).values
    # Among equally near codes prefer the even one (round half to even on the E2M1 grid).
    candidates = (distance == best).to(torch.int32) * (2 - (torch.arange(8, device=x.device) % 2))
    code = candidates.argmax(dim=-1)
    code = torch.where(scaled < 0, code + 8, code).to(torch.uint8)
    code = torch.where(code == 8, torch.zeros_like(code), code)  # no negative zero
    flat = code.reshape(*x.shape[:-1], n)
    packed = (flat[..., 0::2] | (flat[..., 1::2] << 4)).to(torch.uint8)
    scales = (exp + E8M0_BIAS).to(torch.uint8)
    return packed, scales
