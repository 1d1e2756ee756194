"""Triton expert kernels for BF16 and FP8-block (E4M3, 128x128 fp32 scales) experts over a hot and a
cold bank (launch logic in ``gpu.dense_experts``).

The launch structure of the MXFP4 path (``gpu.kernels``, whose grouping and finalize kernels and
T=1 helpers are reused unchanged): group the step's picks by expert, ``dense_w13_act_kernel``
(gate/up products, bias, activation, bf16 activation rows, optional in-kernel usage counter),
``dense_w2_kernel`` (one unreduced bf16 row per pick, bias), then the fp32-fma finalize. At T=1
(``ONE_TOKEN``) there is no grouping launch and the finalize runs at the end of the w2 launch
(``FUSE_FINALIZE``: the last program of each row tile, by ticket); FP8 quantizes the layer input
once per step (``quant_groups_kernel``) and the activation rows either in the w13 epilogue
(``QUANT_ACT``, 128-row tiles) or in a second ``quant_groups_kernel`` launch — the same bits. On
sm_90+ every launch is a programmatic dependent launch (``PDL``).
Each expert's rows come from whichever bank the row map ``codes[e]`` names (``>= 0`` hot row in
HBM, ``< 0`` cold row ``~code`` in pinned host memory read in place); both banks go through the
same loads and the same tiling, so a pick's bits do not depend on where its expert lives: the
split layer is bit-identical to the unsplit one.

Weights in vLLM's layout as loaded (no re-ordering): ``w13 [E, 2I, H]``, ``w2 [E, H, I]``,
optional ``b13 [E, 2I]``, ``b2 [E, H]`` (any float dtype, added in fp32).

* ``FP8 = False``: bf16 weights, ``acc += W . x`` in fp32.
* ``FP8 = True``: E4M3 weights (passed as their ``uint8`` bytes) with fp32 block scales
  ``[E, ceil(N/128), K/128]``; the GEMM input is quantized per token per 128 values in the kernel
  exactly as ``fp8.per_token_group_quant_fp8`` (``s = max(amax, 1e-10) * (1/448)``,
  ``q = E4M3(clamp(x / s, -448, 448))``, round to nearest even), and each 128-deep block adds
  ``dot(Wq, xq) * s_x * s_w`` (vLLM's ``fused_moe/fused_moe.py:550`` order). The inputs are
  quantized once per step (``quant_groups_kernel``) into E4M3 and each block's dot runs on the FP8
  tensor cores (Hopper accumulates their products with reduced precision inside the MMA, as vLLM's
  FP8 kernels do; relative L2 to the fp32-accumulating torch reference 3.7e-3 on DeepSeek-V3,
  vLLM's own 1.8e-2). Under the interpreter (no FP8 type) the same values are held as bf16.

Activation (``ACT``): ``0`` SiLU with gate rows first (optional clamp ``LIMIT`` > 0, vLLM's
``swiglu_limit``); ``1`` SwiGLU-OAI (gpt-oss) with gate/up **interleaved** (rows ``2n``, ``2n+1``):
``gate = min(g, L)``, ``up = clamp(u, -L, L)``, ``(up + 1) * gate * sigmoid(ALPHA * gate)``
(vLLM 0.33 ``layers/activation.py:488-492``); ``2`` the same SwiGLU-OAI with gate rows first
(vLLM's ``swigluoai_uninterleave``; gpt-oss weights after ``core.formats_ref.deinterleave_gate_up``).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

# Shared with the MXFP4 kernels (used inside the jitted kernels): the row map, programmatic
# dependent launch, the T=1 pick of a slot, the last-program ticket and the fused T=1 finalize.
from .kernels import (
    _expert_base,
    _finalize_rows,
    _last_of_split,
    _one_token_pick,
    _pdl_enter,
)

# Triton's CPU interpreter multiplies bf16 tiles wrongly (see gpu.kernels) and has no fp8 type:
# under TRITON_INTERPRET=1 the tile products run on fp32 copies of the same exact values and the
# E4M3 bytes are decoded with integer ops. Compiled kernels use the tensor cores and the hardware
# E4M3 -> bf16 conversion (both exact, so the two agree value for value).
_INTERPRETED: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")

FP8_MAX: tl.constexpr = tl.constexpr(448.0)
GROUP_EPS: tl.constexpr = tl.constexpr(1e-10)


@triton.jit
def _e4m3_bytes_to_bf16(b):
    """E4M3 (fn) bytes (uint8 tile) -> exact bf16 values."""
    if _INTERPRETED:
        v = b.to(tl.int32)
        sign = (v >> 7) & 1
        ex = (v >> 3) & 15
        man = v & 7
        normal = ((sign << 15) | ((ex + 120) << 7) | (man << 4)).to(tl.int16).to(tl.bfloat16, bitcast=True)
        sub = man.to(tl.float32) * 0.001953125                      # m * 2^-9
        sub = tl.where(sign != 0, -sub, sub).to(tl.bfloat16)
        return tl.where(ex == 0, sub, normal)
    return b.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)


@triton.jit
def _round_e4m3(v):
    """fp32 ``v`` with ``|v| <= 448`` -> the nearest E4M3 value (ties to even), as fp32: the
    quantum is ``2^(e-3)`` for exponent ``e`` (``e >= -6``: subnormals below), and ``r + 1.5*2^23``
    rounds ``r = v / quantum`` (< 16, exact) to an integer with fp32's own round-to-nearest-even."""
    bits = v.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)
    quantum = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    r = v / quantum
    r = (r + 12582912.0) - 12582912.0
    return r * quantum


@triton.jit
def _quant_group(x_t, BK: tl.constexpr):
    """One 128-value group per column of ``x_t [BK, BM]`` (fp32): (bf16 E4M3 values, fp32 scale [BM])."""
    amax = tl.maximum(tl.max(tl.abs(x_t), axis=0), GROUP_EPS)
    scale = amax * (1.0 / FP8_MAX)
    q = tl.math.div_rn(x_t, tl.broadcast_to(scale[None, :], x_t.shape))
    q = tl.minimum(tl.maximum(q, -FP8_MAX), FP8_MAX)
    return _round_e4m3(q).to(tl.bfloat16), scale


@triton.jit
def quant_groups_kernel(src_ptr, q_ptr, s_ptr, src_stride, K: tl.constexpr, PDL: tl.constexpr = False):
    """FP8 GEMM input, once per step: one 128-value group of one row per program (grid ``(rows,
    K/128)``) -> ``q [rows, K]`` (E4M3; held as bf16 under the interpreter, which has no FP8
    type) and ``s [rows, K/128]`` fp32, by
    ``_quant_group``, the same operations the expert kernels used to repeat in every output tile
    (so the same bits). ``PDL``: ``kernels._pdl_enter``."""
    _pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    kk = g * 128 + tl.arange(0, 128)
    v = tl.load(src_ptr + row * src_stride + kk).to(tl.float32)[:, None]
    q, scale = _quant_group(v, 128)
    tl.store(q_ptr + row * K + kk[:, None], q.to(q_ptr.dtype.element_ty))   # bf16 -> E4M3: exact
    tl.store(s_ptr + row * (K // 128) + g + tl.arange(0, 1), scale)


@triton.jit
def _dot(w, x_t, acc):
    if _INTERPRETED:
        return tl.dot(w.to(tl.float32), x_t.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(w, x_t, acc)


@triton.jit
def _rows_dot(acc, w_base, s_base, rows, x_t, x_scale, k0, K: tl.constexpr, BK: tl.constexpr,
              FP8: tl.constexpr):
    """``acc[BN, BM] += W[rows, k0:k0+BK] @ x_t`` (FP8: the block's dot scaled by ``x_scale [BM]``
    and the rows' block scales, then added)."""
    kk = k0 + tl.arange(0, BK)
    w_ptr = w_base + rows.to(tl.int64)[:, None] * K + kk[None, :]
    w = tl.load(w_ptr)
    # One return after a constexpr if/else: Triton's code generator also compiles statements that
    # follow a return inside a constexpr branch (the bf16 dot on FP8 bytes then fails to compile).
    if FP8:
        if _INTERPRETED:   # x_t: E4M3 values held as bf16; bytes decoded with integer ops
            dot = _dot(_e4m3_bytes_to_bf16(w), x_t, tl.zeros(acc.shape, dtype=tl.float32))
        else:              # x_t: E4M3; both operands straight into the FP8 tensor cores
            dot = tl.dot(w.to(tl.float8e4nv, bitcast=True), x_t, tl.zeros(acc.shape, dtype=tl.float32))
        KB: tl.constexpr = K // 128
        w_s = tl.load(s_base + (rows // 128).to(tl.int64) * KB + k0 // 128)
        out = acc + dot * x_scale[None, :] * w_s[:, None]
    else:
        out = _dot(w, x_t, acc)
    return out


@triton.jit
def dense_w13_act_kernel(x_ptr, xs_ptr, codes_ptr, hot_w_ptr, cold_w_ptr, hot_s_ptr, cold_s_ptr,
                         hot_b_ptr, cold_b_ptr,
                         sorted_pick_ptr, slot_start_ptr, slot_expert_ptr, num_slots_ptr, act_ptr,
                         counts_ptr, tokens_ptr, n_tokens_ptr,
                         stride_x, w_expert_stride, s_expert_stride, b_expert_stride,
                         ids_ptr, token_mask_ptr, E, aq_ptr, as_ptr,
                         H: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                         FP8: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
                         COUNT: tl.constexpr, LIMIT: tl.constexpr = 0.0, ALPHA: tl.constexpr = 1.0,
                         ONE_TOKEN: tl.constexpr = False, HAS_TOKEN_MASK: tl.constexpr = False,
                         QUANT_ACT: tl.constexpr = False, PDL: tl.constexpr = False):
    """``act[p, n] = bf16(act(gate_n . x + b, up_n . x + b))`` for every pick ``p`` of the slot.
    FP8: ``x_ptr`` holds the step's quantized input (``quant_groups_kernel``) and ``xs_ptr`` its
    group scales.

    ``ONE_TOKEN`` (T = 1): no grouping launch — slot ``p`` is pick ``p``, its expert read from
    ``ids`` (``kernels._one_token_pick``: an id outside ``0..E-1`` or a masked token computes
    nothing); the counter counts the pick and, in program (0, 0), the token.
    ``QUANT_ACT`` (FP8 with ``BN == 128``: each tile's rows are whole 128-value groups of the
    second GEMM's input): the bf16 activation rows are quantized here, by ``_quant_group`` on the
    same bf16 values ``quant_groups_kernel`` would read, into ``aq [P, INTER]`` (E4M3) and
    ``as [P, INTER/128]`` — the same bits without the extra launch (nothing is stored to ``act``).
    ``PDL``: ``kernels._pdl_enter``."""
    _pdl_enter(PDL)
    pid_n = tl.program_id(0)
    slot = tl.program_id(1)
    if ONE_TOKEN:
        expert, ok = _one_token_pick(ids_ptr, token_mask_ptr, tokens_ptr, slot, E,
                                     (pid_n == 0) & (slot == 0), TOP_K, HAS_TOKEN_MASK, COUNT)
        if ok == 0:
            return
        start = slot
        end = slot + 1
    else:
        if COUNT:
            if (pid_n == 0) & (slot == 0):
                tl.atomic_add(tokens_ptr, tl.load(n_tokens_ptr).to(tl.int64))
        if slot >= tl.load(num_slots_ptr):
            return
        start = tl.load(slot_start_ptr + slot)
        end = tl.load(slot_start_ptr + slot + 1)
        expert = tl.load(slot_expert_ptr + slot)
    if COUNT:
        if pid_n == 0:
            tl.atomic_add(counts_ptr + expert, (end - start).to(tl.int64))
    w_base = _expert_base(codes_ptr, expert, hot_w_ptr, cold_w_ptr, w_expert_stride)
    s_base = _expert_base(codes_ptr, expert, hot_s_ptr, cold_s_ptr, s_expert_stride)
    b_base = _expert_base(codes_ptr, expert, hot_b_ptr, cold_b_ptr, b_expert_stride)
    out_rows = pid_n * BN + tl.arange(0, BN)
    if ACT == 1:
        gate_rows = 2 * out_rows
        up_rows = 2 * out_rows + 1
    else:
        gate_rows = out_rows
        up_rows = out_rows + INTER
    m0 = start
    while m0 < end:
        mm = m0 + tl.arange(0, BM)
        m_ok = mm < end
        if ONE_TOKEN:
            picks = mm
        else:
            picks = tl.load(sorted_pick_ptr + mm, mask=m_ok, other=0)
        tok = (picks // TOP_K).to(tl.int64)
        acc_g = tl.zeros((BN, BM), dtype=tl.float32)
        acc_u = tl.zeros((BN, BM), dtype=tl.float32)
        for k0 in range(0, H, BK):
            kk = k0 + tl.arange(0, BK)
            x_t = tl.load(x_ptr + tok[None, :] * stride_x + kk[:, None], mask=m_ok[None, :], other=0.0)
            if FP8:   # quantized once per step; a masked pick reads 0 (its dot is 0 either way)
                xq = x_t
                xs = tl.load(xs_ptr + tok * (H // 128) + k0 // 128, mask=m_ok, other=0.0)
            else:
                xq = x_t
                xs = tl.zeros((BM,), dtype=tl.float32)
            acc_g = _rows_dot(acc_g, w_base, s_base, gate_rows, xq, xs, k0, H, BK, FP8)
            acc_u = _rows_dot(acc_u, w_base, s_base, up_rows, xq, xs, k0, H, BK, FP8)
        if HAS_BIAS:
            acc_g += tl.load(b_base + gate_rows).to(tl.float32)[:, None]
            acc_u += tl.load(b_base + up_rows).to(tl.float32)[:, None]
        if ACT >= 1:
            gate = tl.minimum(acc_g, LIMIT)
            up = tl.minimum(tl.maximum(acc_u, -LIMIT), LIMIT)
            act = (up + 1.0) * (gate / (1.0 + tl.exp(-(gate * ALPHA))))
        else:
            if LIMIT > 0:
                acc_g = tl.minimum(acc_g, LIMIT)
                acc_u = tl.minimum(tl.maximum(acc_u, -LIMIT), LIMIT)
            act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        row_of_pick = picks[None, :].to(tl.int64) * INTER + out_rows[:, None]
        if QUANT_ACT:   # BN == 128: one whole quantization group per pick column
            q, scale = _quant_group(act.to(tl.bfloat16).to(tl.float32), BN)
            tl.store(aq_ptr + row_of_pick, q.to(aq_ptr.dtype.element_ty), mask=m_ok[None, :])
            tl.store(as_ptr + picks.to(tl.int64) * (INTER // 128) + pid_n, scale, mask=m_ok)
        else:
            tl.store(act_ptr + row_of_pick, act.to(tl.bfloat16), mask=m_ok[None, :])
        m0 += BM


@triton.jit
def dense_w2_kernel(act_ptr, act_s_ptr, codes_ptr, hot_w_ptr, cold_w_ptr, hot_s_ptr, cold_s_ptr,
                    hot_b_ptr, cold_b_ptr,
                    sorted_pick_ptr, slot_start_ptr, slot_expert_ptr, num_slots_ptr, y_ptr,
                    w_expert_stride, s_expert_stride, b_expert_stride,
                    ids_ptr, token_mask_ptr, E, weights_ptr, out_ptr, fin_ticket_ptr,
                    H: tl.constexpr, INTER: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    FP8: tl.constexpr, HAS_BIAS: tl.constexpr, TOP_K: tl.constexpr = 1,
                    ONE_TOKEN: tl.constexpr = False, HAS_TOKEN_MASK: tl.constexpr = False,
                    FUSE_FINALIZE: tl.constexpr = False, PDL: tl.constexpr = False):
    """``y[p, n] = bf16(w2_n . act_p + b2_n)``: one unreduced output row per pick (FP8: ``act_ptr``
    quantized, ``act_s_ptr`` its group scales).

    ``ONE_TOKEN`` as in ``dense_w13_act_kernel``. ``FUSE_FINALIZE`` (with ``ONE_TOKEN``): the
    step's one token is finalized in this launch exactly as ``kernels.w2_kernel`` does it — every
    program of a row tile (one per pick, skipped picks included) takes a ticket on
    ``fin_ticket[pid_n]`` after its store, and the last adds the tile's ``TOP_K`` stored bf16 rows
    with ``finalize_kernel``'s fp32 fma in router order (``kernels._finalize_rows``; a pick whose
    id is outside ``0..E-1`` adds ``fma(0, 0, acc)``): the same bits whichever program is last.
    ``PDL``: ``kernels._pdl_enter``."""
    _pdl_enter(PDL)
    pid_n = tl.program_id(0)
    slot = tl.program_id(1)
    if ONE_TOKEN:
        expert, ok = _one_token_pick(ids_ptr, token_mask_ptr, ids_ptr, slot, E, False, TOP_K,
                                     HAS_TOKEN_MASK, False)
        start = slot
        if FUSE_FINALIZE:   # a skipped pick computes nothing but still takes its ticket
            expert = tl.where(ok, expert, 0)
            end = tl.where(ok, slot + 1, slot)
        else:
            if ok == 0:
                return
            end = slot + 1
    else:
        if slot >= tl.load(num_slots_ptr):
            return
        start = tl.load(slot_start_ptr + slot)
        end = tl.load(slot_start_ptr + slot + 1)
        expert = tl.load(slot_expert_ptr + slot)
    w_base = _expert_base(codes_ptr, expert, hot_w_ptr, cold_w_ptr, w_expert_stride)
    s_base = _expert_base(codes_ptr, expert, hot_s_ptr, cold_s_ptr, s_expert_stride)
    b_base = _expert_base(codes_ptr, expert, hot_b_ptr, cold_b_ptr, b_expert_stride)
    rows = pid_n * BN + tl.arange(0, BN)
    m0 = start
    while m0 < end:
        mm = m0 + tl.arange(0, BM)
        m_ok = mm < end
        if ONE_TOKEN:
            picks = mm.to(tl.int64)
        else:
            picks = tl.load(sorted_pick_ptr + mm, mask=m_ok, other=0).to(tl.int64)
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        for k0 in range(0, INTER, BK):
            kk = k0 + tl.arange(0, BK)
            a_t = tl.load(act_ptr + picks[None, :] * INTER + kk[:, None], mask=m_ok[None, :], other=0.0)
            if FP8:
                aq = a_t
                a_s = tl.load(act_s_ptr + picks * (INTER // 128) + k0 // 128, mask=m_ok, other=0.0)
            else:
                aq = a_t
                a_s = tl.zeros((BM,), dtype=tl.float32)
            acc = _rows_dot(acc, w_base, s_base, rows, aq, a_s, k0, INTER, BK, FP8)
        if HAS_BIAS:
            acc += tl.load(b_base + rows).to(tl.float32)[:, None]
        dest = y_ptr + picks[None, :] * H + rows[:, None]
        tl.store(dest, acc.to(tl.bfloat16), mask=m_ok[None, :])
        m0 += BM
    if FUSE_FINALIZE:
        if _last_of_split(fin_ticket_ptr + pid_n, TOP_K):
            _finalize_rows(y_ptr, weights_ptr, ids_ptr, out_ptr, rows, E, H, TOP_K, BN)
