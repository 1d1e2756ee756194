"""Torch reference per-pick functions for the expert formats people serve (``core.split``'s contract).

One pick = ``y = W2 . act(W13 . x + b13) + b2`` for one (token, expert); the unweighted ``y`` is the
pick row (the finalize applies the router weight, as vLLM's kernels multiply the whole biased
output by it: ``fused_moe/fused_moe.py:585-596`` adds the bias, then multiplies the routed weight).
Every pick is computed with identical shapes whatever the bank, so a pick's bits depend only on
the token and the expert's rows: split == unsplit bit for bit.

Activations (``activation=``):

* ``"silu"`` — gate rows ``0..I-1``, up rows ``I..2I-1`` (vLLM's merged ``w13``):
  ``silu(gate) * up`` (with ``swiglu_limit``: ``core.reference``'s clamp).
* ``"swigluoai"`` — gpt-oss, exactly vLLM 0.33's ``SwigluOAIAndMul.forward_native``
  (``model_executor/layers/activation.py:481-493``): gate and up **interleaved** in ``w13``
  (``gate, up = x[..., ::2], x[..., 1::2]``, line 488; ``fused_moe/activation.py:30-33``), then
  ``gate = min(gate, limit)`` (line 489), ``up = clamp(up, -limit, limit)`` (line 490),
  ``glu = gate * sigmoid(gate * alpha)`` (line 491), ``out = (up + 1) * glu`` (line 492), with
  ``alpha = 1.702`` and ``limit = 7.0`` (line 481; the MXFP4 Triton path passes the same defaults,
  ``fused_moe/experts/gpt_oss_triton_kernels_moe.py:714-715``). The clamps come before the
  sigmoid; the ``+1`` is on the clamped up. ``b13`` is added to the fp32 products first (so the
  bias is inside the clamp), ``b2`` after the down projection. gpt-oss declares biased experts
  with this activation at ``models/gpt_oss.py:399-400``; biases are fp32 in the MXFP4 path
  (``gpt_oss_triton_kernels_moe.py:776``); under TP only rank 0 holds ``w2_bias``
  (``models/gpt_oss.py:235-236``).

Rounding points (where a kernel stores): the gate/up products stay fp32 into the activation (the
fused epilogue of the MXFP4 path; ``round_gate_up=True`` rounds them to the activation dtype first,
as vLLM's Triton ``fused_moe`` stores ``intermediate_cache1`` before its activation op); the
activation is cast to the activation dtype (bf16) once; the pick row is cast by the caller's pick
dtype.

Weight formats:

* ``float_per_pick``  — BF16/FP16/FP32 weights (``UnquantizedFusedMoEMethod``).
* ``mxfp4_per_pick``  — MXFP4 packed + ue8m0 scales (``Mxfp4MoEMethod``), dequantized exactly.
* ``fp8_block_per_pick`` — FP8 E4M3 weights with 128x128 fp32 block scales (``Fp8MoEMethod`` with
  ``weight_block_size``): W8A8 as vLLM's Triton ``fused_moe`` computes it — the layer input and
  the bf16 activation are quantized per token per 128 values (``fp8.per_token_group_quant_fp8``;
  ``fused_moe/experts/triton_moe.py:539-543`` for the second GEMM), and each 128-deep block's
  fp32 dot is scaled by its two scales and accumulated in block order, ``acc += dot * a_s * w_s``
  (``fused_moe/fused_moe.py:550``).

These gather each pick's weights (memory ``T*2I*H`` per pick column): references, not the serving
path on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..contract.expert_formats import GPTOSS_SWIGLU_ALPHA, GPTOSS_SWIGLU_LIMIT
from ..fp8 import BLOCK as FP8_BLOCK
from ..fp8 import FP8_DTYPE, per_token_group_quant_fp8
from ..mxfp4 import dequantize_mxfp4
from .banks import ExpertBank
from .reference import check_swiglu_limit
from .split import PerPickExpertFn, dense_per_pick

SILU = "silu"
SWIGLUOAI = "swigluoai"
SWIGLUOAI_UNINTERLEAVE = "swigluoai_uninterleave"   # same math, gate rows first
ACTIVATIONS = (SILU, SWIGLUOAI, SWIGLUOAI_UNINTERLEAVE)
# GPTOSS_SWIGLU_ALPHA / _LIMIT: vLLM 0.33's SwigluOAIAndMul defaults, which gpt-oss runs with
# (contract.expert_formats).

Activation = Callable[[torch.Tensor], torch.Tensor]


def swigluoai(g: torch.Tensor, alpha: float = GPTOSS_SWIGLU_ALPHA,
              limit: float = GPTOSS_SWIGLU_LIMIT, *, interleaved: bool = True) -> torch.Tensor:
    """``[..., 2I]`` interleaved gate/up (fp32) -> ``[..., I]``: vLLM's ``forward_native`` order
    (``interleaved=False``: gate rows first, the ``swigluoai_uninterleave`` layout)."""
    if interleaved:
        gate, up = g[..., ::2], g[..., 1::2]
    else:
        gate, up = g[..., :g.shape[-1] // 2], g[..., g.shape[-1] // 2:]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    glu = gate * torch.sigmoid(gate * alpha)
    return (up + 1) * glu


def silu_and_mul(g: torch.Tensor, limit: float | None = None) -> torch.Tensor:
    """``[..., 2I]`` gate rows first -> ``[..., I]`` (``limit``: vLLM's clamp for SILU experts)."""
    inter = g.shape[-1] // 2
    gate, up = g[..., :inter], g[..., inter:]
    if limit is not None:
        gate = torch.clamp(gate, max=limit)
        up = torch.clamp(up, min=-limit, max=limit)
    return torch.nn.functional.silu(gate) * up


def make_activation(activation: str = SILU, *, swiglu_limit: float | None = None,
                    alpha: float | None = None) -> Activation:
    """The activation by vLLM's ``MoEActivation`` value. ``swigluoai`` defaults to gpt-oss's
    alpha 1.702 and limit 7.0 (``swiglu_limit``/``alpha`` override them); ``silu`` takes no alpha."""
    if activation in (SWIGLUOAI, SWIGLUOAI_UNINTERLEAVE):
        lim = GPTOSS_SWIGLU_LIMIT if swiglu_limit is None else check_swiglu_limit(swiglu_limit)
        a = GPTOSS_SWIGLU_ALPHA if alpha is None else float(alpha)
        inter = activation == SWIGLUOAI
        return lambda g: swigluoai(g, a, lim, interleaved=inter)
    if activation == SILU:
        if alpha is not None:
            raise ValueError("activation 'silu' takes no alpha (that is swigluoai)")
        lim = check_swiglu_limit(swiglu_limit)
        return lambda g: silu_and_mul(g, lim)
    raise ValueError(f"activation {activation!r} is not one of {ACTIVATIONS}")


# One pick column's GEMM: (inputs [T, K] any float, bank, weight name, rows [T]) -> fp32 [T, N].
Gemm = Callable[[torch.Tensor, ExpertBank, str, torch.Tensor], torch.Tensor]


def _float_gemm(inputs: torch.Tensor, bank: ExpertBank, name: str, rows: torch.Tensor) -> torch.Tensor:
    return torch.matmul(bank[name][rows].float(), inputs.float().unsqueeze(-1)).squeeze(-1)


def _mxfp4_gemm(scale_suffix: str) -> Gemm:
    def gemm(inputs: torch.Tensor, bank: ExpertBank, name: str, rows: torch.Tensor) -> torch.Tensor:
        w = dequantize_mxfp4(bank[name][rows], bank[name + scale_suffix][rows])
        return torch.matmul(w, inputs.float().unsqueeze(-1)).squeeze(-1)
    return gemm


def _fp8_block_gemm(scale_suffix: str, ue8m0: bool) -> Gemm:
    def gemm(inputs: torch.Tensor, bank: ExpertBank, name: str, rows: torch.Tensor) -> torch.Tensor:
        w = bank[name][rows]                         # fp8 [T, N, K]
        if w.dtype != FP8_DTYPE:
            raise TypeError(f"{name}: FP8 block weights must be {FP8_DTYPE}, got {w.dtype}")
        tokens, n, k = w.shape
        if k % FP8_BLOCK:
            raise ValueError(f"{name}: reduction dim {k} is not a multiple of {FP8_BLOCK}")
        kb = k // FP8_BLOCK
        a_q, a_s = per_token_group_quant_fp8(inputs, FP8_BLOCK, ue8m0=ue8m0)   # [T, K], [T, kb]
        w_s = bank[name + scale_suffix][rows].float().repeat_interleave(FP8_BLOCK, dim=-2)[:, :n]  # [T, N, kb]
        wb = w.float().reshape(tokens, n, kb, FP8_BLOCK)
        ab = a_q.float().reshape(tokens, kb, FP8_BLOCK)
        acc = torch.zeros(tokens, n, dtype=torch.float32, device=inputs.device)
        for b in range(kb):   # block order, each block's dot scaled then added (fused_moe.py:550)
            dot = torch.matmul(wb[:, :, b, :], ab[:, b, :].unsqueeze(-1)).squeeze(-1)
            acc = acc + dot * a_s[:, b:b + 1] * w_s[:, :, b]
        return acc
    return gemm


def _per_pick(gemm: Gemm, activation: Activation, *, w13_name: str, w2_name: str,
              w13_bias: str, w2_bias: str, round_gate_up: bool) -> PerPickExpertFn:
    def compute(x: torch.Tensor, bank: ExpertBank, rows: torch.Tensor) -> torch.Tensor:
        b13 = bank.tensors.get(w13_bias)
        b2 = bank.tensors.get(w2_bias)
        columns = []
        for k in range(rows.shape[1]):
            r = rows[:, k]
            g = gemm(x, bank, w13_name, r)
            if b13 is not None:
                g = g + b13[r].float()
            if round_gate_up:
                g = g.to(x.dtype).float()
            a = activation(g).to(x.dtype)
            y = gemm(a, bank, w2_name, r)
            if b2 is not None:
                y = y + b2[r].float()
            columns.append(y)
        return torch.stack(columns, dim=1)

    return dense_per_pick(compute)


def float_per_pick(activation: str = SILU, *, swiglu_limit: float | None = None,
                   alpha: float | None = None, round_gate_up: bool = False,
                   w13_name: str = "w13_weight", w2_name: str = "w2_weight",
                   w13_bias: str = "w13_bias", w2_bias: str = "w2_bias") -> PerPickExpertFn:
    """BF16/FP16/FP32 expert weights (vLLM's unquantized layout), optional biases."""
    return _per_pick(_float_gemm, make_activation(activation, swiglu_limit=swiglu_limit, alpha=alpha),
                     w13_name=w13_name, w2_name=w2_name, w13_bias=w13_bias, w2_bias=w2_bias,
                     round_gate_up=round_gate_up)


def mxfp4_per_pick(activation: str = SILU, *, swiglu_limit: float | None = None,
                   alpha: float | None = None, round_gate_up: bool = False,
                   w13_name: str = "w13_weight", w2_name: str = "w2_weight",
                   scale_suffix: str = "_scale", w13_bias: str = "w13_bias",
                   w2_bias: str = "w2_bias") -> PerPickExpertFn:
    """MXFP4 packed weights + ue8m0 scales; ``mxfp4_per_pick("swigluoai")`` is gpt-oss."""
    return _per_pick(_mxfp4_gemm(scale_suffix),
                     make_activation(activation, swiglu_limit=swiglu_limit, alpha=alpha),
                     w13_name=w13_name, w2_name=w2_name, w13_bias=w13_bias, w2_bias=w2_bias,
                     round_gate_up=round_gate_up)


GATE_UP_TENSORS = ("w13_weight", "w13_weight_scale", "w13_bias")


def deinterleave_gate_up(tensors: dict[str, torch.Tensor],
                         names: tuple[str, ...] = GATE_UP_TENSORS) -> None:
    """gpt-oss's interleaved w13 rows (gate ``2n``, up ``2n+1``) -> gate rows first, in place, for
    every present tensor of ``names`` (packed values, their scales, the bias): row ``n`` <- ``2n``,
    row ``I + n`` <- ``2n + 1``. The same permutation of every expert's rows (bytes per expert
    unchanged), so re-homing, swaps and row maps are untouched; then SwiGLU-OAI reads gate rows
    first (vLLM's ``SWIGLUOAI_UNINTERLEAVE`` layout, ``fused_moe/activation.py:30-36``)."""
    for name in names:
        if name not in tensors:
            continue
        t = tensors[name]
        if t.shape[1] % 2:
            raise ValueError(f"{name}: {t.shape[1]} gate/up rows is not even")
        t.copy_(torch.cat([t[:, 0::2], t[:, 1::2]], dim=1))


def gptoss_mxfp4_per_pick(**kw) -> PerPickExpertFn:
    """gpt-oss's experts as vLLM 0.33 serves them: MXFP4, biases, SwiGLU-OAI (1.702, 7.0)."""
    return mxfp4_per_pick(SWIGLUOAI, **kw)


def fp8_block_per_pick(activation: str = SILU, *, swiglu_limit: float | None = None,
                       alpha: float | None = None, round_gate_up: bool = False,
                       ue8m0_activation_scales: bool = False,
                       w13_name: str = "w13_weight", w2_name: str = "w2_weight",
                       scale_suffix: str = "_scale_inv", w13_bias: str = "w13_bias",
                       w2_bias: str = "w2_bias") -> PerPickExpertFn:
    """FP8 E4M3 weights, 128x128 fp32 block scales (``w13_weight_scale_inv``), W8A8 with
    per-token-group activation quantization (see the module docstring).

    ``scale_suffix`` is appended to the weight name: vLLM names the block scales
    ``w13_weight_scale_inv``/``w2_weight_scale_inv`` (``quantization/fp8.py:486, 637-638``)."""
    gemm = _fp8_block_gemm(scale_suffix, ue8m0_activation_scales)
    return _per_pick(gemm, make_activation(activation, swiglu_limit=swiglu_limit, alpha=alpha),
                     w13_name=w13_name, w2_name=w2_name, w13_bias=w13_bias, w2_bias=w2_bias,
                     round_gate_up=round_gate_up)
