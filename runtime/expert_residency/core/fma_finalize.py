"""The finalize: accumulate a token's K weighted pick rows in fp32 with fma, in original top-k order,
and cast once.

For every token ``t`` and hidden column ``h``::

    acc = 0.0f
    for k in 0..K-1:                      # the router's order, never the bank order
        acc = fmaf(topk_weights[t, k], float(pick_out[t, k, h]), acc)
    out[t, h] = cast<out_dtype>(acc)      # round-to-nearest-even, once

This is what makes the split bit-identical to the unsplit path: each pick row is produced by the
same per-pick arithmetic whichever bank holds the expert, and the reduction never sees the banks.
The GPU engineer's Triton finalize (``tl.fma``) must produce exactly these bits; this torch version
is the reference and the CPU implementation.

torch has no fused multiply-add primitive, so ``fma_f32`` computes a correctly rounded fp32 fma
exactly: the product of two fp32 values is exact in fp64, the fp64 sum's rounding error is
recovered with TwoSum, and the one case where rounding the fp64 sum to fp32 could differ from
rounding the exact sum (the fp64 sum lands exactly on an fp32 rounding midpoint while the error
is non-zero) is resolved by stepping one fp64 ulp towards the error. Fixed shapes, device-only
ops, no host sync.
"""

from __future__ import annotations

import torch


def fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Correctly rounded ``fmaf(a, b, c)`` elementwise for fp32 tensors (broadcasting)."""
    a64, b64, c64 = a.double(), b.double(), c.double()
    product = a64 * b64                       # exact: 24+24 significant bits fit in 53
    s = product + c64
    # TwoSum: s + err == product + c exactly (fp64, no overflow for fp32 operands).
    bv = s - product
    av = s - bv
    err = (product - av) + (c64 - bv)
    r = s.float()
    # Was s exactly halfway between r and its fp32 neighbour towards s? Then the tie was decided
    # by the fp64 rounding, not by the exact value; redo it from one fp64 ulp towards err.
    toward = torch.where(s >= r.double(), torch.full_like(r, float("inf")), torch.full_like(r, float("-inf")))
    neighbour = torch.nextafter(r, toward)
    midpoint = (r.double() + neighbour.double()) * 0.5   # exact: both are fp32 values
    tie = (s == midpoint) & (err != 0) & torch.isfinite(neighbour)
    nudged = torch.nextafter(s, torch.where(err > 0, torch.full_like(s, float("inf")),
                                            torch.full_like(s, float("-inf"))))
    return torch.where(tie, nudged.float(), r)


def finalize(pick_out: torch.Tensor, topk_weights: torch.Tensor, out_dtype: torch.dtype,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """Reduce ``pick_out [T, K, H]`` (unweighted per-pick expert outputs, any float dtype) with
    ``topk_weights [T, K]`` (cast to fp32) into ``[T, H]`` of ``out_dtype``.

    ``out`` (optional, ``[T, H]``, ``out_dtype``) is written in place and returned.
    """
    if pick_out.dim() != 3 or topk_weights.shape != pick_out.shape[:2]:
        raise ValueError(f"finalize wants pick_out [T,K,H] and topk_weights [T,K], got "
                         f"{tuple(pick_out.shape)} and {tuple(topk_weights.shape)}")
    weights = topk_weights.float()
    acc = torch.zeros(pick_out.shape[0], pick_out.shape[2], dtype=torch.float32, device=pick_out.device)
    for k in range(pick_out.shape[1]):
        acc = fma_f32(weights[:, k:k + 1], pick_out[:, k, :].float(), acc)
    result = acc.to(out_dtype)
    if out is None:
        return result
    out.copy_(result)
    return out
