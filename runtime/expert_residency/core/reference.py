"""Torch reference per-pick expert functions (``core.split.PerPickExpertFn``).

Both compute a gated-SiLU (SwiGLU) expert in vLLM's layout — ``w13_weight [E, 2I, H]`` with the gate
in rows ``0..I-1`` and the up projection in ``I..2I-1``, ``w2_weight [E, H, I]``, optional
``w13_bias [E, 2I]``/``w2_bias [E, H]`` — for every (token, pick) with identical shapes whatever the
bank, so a pick's bits never depend on the bank size:

    g   = W13[e] @ x            (fp32 accumulate)        (+ b13)
    a   = silu(g[:I]) * g[I:]   cast to the activation dtype (as the fused kernels store it)
          with ``swiglu_limit=L`` (> 0): silu(min(g[:I], L)) * clamp(g[I:], -L, L) — vLLM 0.33's
          ``silu_and_mul_with_clamp``/``swiglu_limit_func`` for SILU experts (gate clamped from
          above only, up on both sides, before the SiLU; no alpha, no +1 — not GPT-OSS's SwiGLU)
    y   = W2[e] @ a             (fp32 accumulate)        (+ b2), cast to the pick dtype

``swiglu_per_pick()`` reads float weights of any dtype; ``mxfp4_swiglu_per_pick()`` reads MXFP4
packed weights (``uint8``) with ue8m0 scales (``w13_weight_scale [E, 2I, H/32]``,
``w2_weight_scale [E, H, I/32]``) and dequantizes the gathered rows exactly in fp32.
These are references (they gather each pick's weights: memory ``T*2I*H`` per pick column), not
the serving path on a GPU.
"""

from __future__ import annotations

import torch

from ..mxfp4 import dequantize_mxfp4
from .banks import ExpertBank
from .split import PerPickExpertFn, dense_per_pick


def check_swiglu_limit(swiglu_limit: float | None) -> float | None:
    """The clamp a per-pick function applies: None (no clamp) or a finite float > 0."""
    if swiglu_limit is None:
        return None
    limit = float(swiglu_limit)
    if not limit > 0 or limit == float("inf"):
        raise ValueError(f"swiglu_limit must be None or a finite float > 0, got {swiglu_limit!r}")
    return limit


def _swiglu_pick(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, b13: torch.Tensor | None,
                 b2: torch.Tensor | None, act_dtype: torch.dtype,
                 swiglu_limit: float | None = None) -> torch.Tensor:
    """x ``[T, H]``; w13 ``[T, 2I, H]`` and w2 ``[T, H, I]`` fp32 (gathered for one pick column)."""
    g = torch.matmul(w13, x.float().unsqueeze(-1)).squeeze(-1)
    if b13 is not None:
        g = g + b13.float()
    inter = g.shape[-1] // 2
    gate, up = g[:, :inter], g[:, inter:]
    if swiglu_limit is not None:
        gate = torch.clamp(gate, max=swiglu_limit)
        up = torch.clamp(up, min=-swiglu_limit, max=swiglu_limit)
    a = (torch.nn.functional.silu(gate) * up).to(act_dtype).float()
    y = torch.matmul(w2, a.unsqueeze(-1)).squeeze(-1)
    if b2 is not None:
        y = y + b2.float()
    return y


def swiglu_per_pick(w13_name: str = "w13_weight", w2_name: str = "w2_weight",
                    w13_bias: str = "w13_bias", w2_bias: str = "w2_bias",
                    swiglu_limit: float | None = None) -> PerPickExpertFn:
    """Reference per-pick SwiGLU over float expert weights (``swiglu_limit``: the clamp above)."""
    limit = check_swiglu_limit(swiglu_limit)

    def compute(x: torch.Tensor, bank: ExpertBank, rows: torch.Tensor) -> torch.Tensor:
        columns = []
        for k in range(rows.shape[1]):
            r = rows[:, k]
            columns.append(_swiglu_pick(
                x, bank[w13_name][r].float(), bank[w2_name][r].float(),
                bank.tensors[w13_bias][r] if w13_bias in bank.tensors else None,
                bank.tensors[w2_bias][r] if w2_bias in bank.tensors else None, x.dtype, limit))
        return torch.stack(columns, dim=1)

    return dense_per_pick(compute)


def mxfp4_swiglu_per_pick(w13_name: str = "w13_weight", w2_name: str = "w2_weight",
                          scale_suffix: str = "_scale", w13_bias: str = "w13_bias",
                          w2_bias: str = "w2_bias", swiglu_limit: float | None = None
                          ) -> PerPickExpertFn:
    """Reference per-pick SwiGLU over MXFP4 packed weights + ue8m0 block scales
    (``swiglu_limit``: the clamp above; None computes exactly what it did without the option)."""
    limit = check_swiglu_limit(swiglu_limit)

    def compute(x: torch.Tensor, bank: ExpertBank, rows: torch.Tensor) -> torch.Tensor:
        columns = []
        for k in range(rows.shape[1]):
            r = rows[:, k]
            w13 = dequantize_mxfp4(bank[w13_name][r], bank[w13_name + scale_suffix][r])
            w2 = dequantize_mxfp4(bank[w2_name][r], bank[w2_name + scale_suffix][r])
            columns.append(_swiglu_pick(
                x, w13, w2,
                bank.tensors[w13_bias][r] if w13_bias in bank.tensors else None,
                bank.tensors[w2_bias][r] if w2_bias in bank.tensors else None, x.dtype, limit))
        return torch.stack(columns, dim=1)

    return dense_per_pick(compute)
