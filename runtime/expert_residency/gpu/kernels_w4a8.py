"""Triton kernels of the FP8-activation MXFP4 layer (``gpu.experts_w4a8``; layout ``gpu.layout_w4a8``).

Three launches after the grouping kernel (``kernels.group_picks_kernel``), then ``kernels.
finalize_kernel``:

* ``quant_rows_kernel``: the step's hidden states to E4M3 per token and 128 values, vLLM's
  ``per_token_group_quant_fp8`` (``s = max(amax, 1e-10) / 448``, ``q = clamp(x / s)``, both
  divisions correctly rounded);
* ``w13_w4a8_kernel``: per (128-row gate/up tile pair, slot): FP8 x FP8 products of each 128-value
  k step scaled by the token's activation scale and added in fp32, times each row's ``2^(base -
  122)``, SwiGLU, and the result quantized the same way per pick and 128 intermediate values
  (the tile's width) for w2;
* ``w2_w4a8_kernel``: the same products over the intermediate dimension, one bf16 row per pick.

The E2M1 -> E4M3 decode is ``_WORD_TO_E4M3_PTX``: two ``prmt`` byte permutes of an 8-entry table
per word of 8 codes, the table's exponents raised by the block's offset. A slot computes the same
bits whichever bank holds its expert (only the base pointer differs), so a split layer is
bit-identical to the unsplit one; inline PTX does not run under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernels import _expert_base, _pdl_enter, _swiglu

FP8_MAX = tl.constexpr(448.0)
GROUP_EPS = tl.constexpr(1e-10)   # vLLM's per_token_group_quant_fp8 eps

# $2: one word (8 codes); $3: the word's block offset in all four bytes. $0 / $1: the even / odd
# codes as four E4M3 bytes each. Table bytes (low word ``lo``, high word ``hi``): 0 and the E4M3
# encodings of 0.5, 1, 1.5, 2, 3, 4, 6 times 2^(off - 6), i.e. 0x08.., 0x0C.., ... with ``off``
# added to the exponent field (``off << 3``); entry 0 stays zero.
_WORD_TO_E4M3_PTX = tl.constexpr("""
{
.reg .b32 m, t, lo, hi, r;
and.b32 m, $2, 0x77777777;
shl.b32 t, $3, 3;
add.u32 hi, t, 0x1C181410;
and.b32 t, t, 0xFFFFFF00;
add.u32 lo, t, 0x0C080000;
prmt.b32 r, lo, hi, m;
and.b32 t, $2, 0x80808080;
or.b32 $0, t, r;
shr.u32 m, m, 16;
prmt.b32 r, lo, hi, m;
shl.b32 t, $2, 4;
and.b32 t, t, 0x80808080;
or.b32 $1, t, r;
}
""")


@triton.jit
def _w4a8_tile(w_base, o_base, tile, BN: tl.constexpr, BK: tl.constexpr):
    """The ``BN x BK`` E4M3 weight tile ``tile`` of an expert (``layout_w4a8``): each thread's words
    decode straight into its wgmma A-fragment registers (the reshapes only rename registers)."""
    ROWS: tl.constexpr = BN * BK // 32
    rows = tl.arange(0, ROWS)
    packed = tl.load(w_base + tile * (BN * BK // 2) + rows[:, None] * 16 + tl.arange(0, 16)[None, :])
    return w4a8_decode_tile(packed, _tile_offsets(o_base, tile, BN, BK), BN, BK)


@triton.jit
def _tile_offsets(o_base, tile, BN: tl.constexpr, BK: tl.constexpr):
    """A tile's block offsets (low nibbles), ``[BN*BK/32, 4]``: the four words of each 16-byte row."""
    rows = tl.arange(0, BN * BK // 32)
    return tl.load(o_base + tile * (BN * BK // 32) + (rows // 4)[:, None] * 4 + tl.arange(0, 4)[None, :]) & 15


@triton.jit
def w4a8_decode_tile(packed, offs, BN: tl.constexpr, BK: tl.constexpr):
    """``packed [BN*BK/32, 16]`` bytes of one tile (however loaded) and its ``offs`` -> the E4M3
    ``[BN, BK]`` tile: ``[rm, kk_hi, w, g, q | kk_lo, h, d | c]`` -> rows ``(rm, w, h, g)`` x k
    ``(kk_hi, kk_lo, c, q, d)``."""
    R: tl.constexpr = BN // 64
    ROWS: tl.constexpr = BN * BK // 32
    offs = tl.reshape(tl.broadcast_to(offs[:, :, None], (ROWS, 4, 4)), (ROWS, 16))
    even, odd = tl.inline_asm_elementwise(_WORD_TO_E4M3_PTX, "=r,=r,r,r", [packed, offs],
                                          dtype=(tl.float8e4nv, tl.float8e4nv), is_pure=True, pack=4)
    w = tl.reshape(tl.join(even, odd), (R, 2, 4, 8, 4, 2, 2, 4, 2))
    return tl.reshape(tl.permute(w, (0, 2, 6, 3, 1, 5, 8, 4, 7)), (BN, BK))


@triton.jit
def _row_multiplier(o_base, row_tile, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """fp32 ``[BN]``: ``2^(base - 122)`` of each row of ``row_tile``, its base read from the high
    nibbles of the row's block-0 and block-1 offsets in the tile's first k step."""
    r = tl.arange(0, BN)
    # offset byte (rm, kk_hi=0, w, g, kk_lo, h) of row 64rm + 16w + 8h + g
    pos = (((r // 64) * 2 * 4 + (r % 64) // 16) * 8 + r % 8) * 4 + (r % 16) // 8
    first = o_base + (row_tile * (K // BK)).to(tl.int64) * (BN * BK // 32)
    lo = tl.load(first + pos).to(tl.int32) >> 4
    hi = tl.load(first + pos + 2).to(tl.int32) >> 4
    base = lo | (hi << 4)
    return ((base + 5) << 23).to(tl.float32, bitcast=True)   # fp32 exponent field base - 122 + 127


@triton.jit
def _quantize_columns(v, BM: tl.constexpr):
    """fp32 ``[G, BM]`` -> (E4M3 ``[G, BM]``, fp32 ``[BM]`` scales): per column, vLLM's scheme."""
    amax = tl.maximum(tl.max(tl.abs(v), axis=0), GROUP_EPS)
    scale = amax * (1.0 / FP8_MAX)
    q = tl.math.div_rn(v, scale[None, :])
    q = tl.minimum(tl.maximum(q, -FP8_MAX), FP8_MAX)
    return q.to(tl.float8e4nv), scale


@triton.jit
def quant_rows_kernel(x_ptr, stride_x, xq_ptr, xs_ptr, K: tl.constexpr, G: tl.constexpr,
                      PDL: tl.constexpr = False):
    """``xq[t, k] , xs[t, k // G]`` for program (t, k // G): one token's group of ``G`` values."""
    _pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    gi = tl.program_id(1)
    kk = gi * G + tl.arange(0, G)
    v = tl.load(x_ptr + t * stride_x + kk).to(tl.float32)
    q, s = _quantize_columns(v[:, None], 1)
    tl.store(xq_ptr + t * K + kk, tl.reshape(q, (G,)))
    tl.store(xs_ptr + t * (K // G) + gi + tl.arange(0, 1), s)


@triton.jit
def w13_w4a8_kernel(xq_ptr, xs_ptr, codes_ptr, hot_w_ptr, hot_o_ptr, cold_w_ptr, cold_o_ptr,
                    sorted_pick_ptr, slot_start_ptr, slot_expert_ptr, num_slots_ptr,
                    aq_ptr, as_ptr, counts_ptr, tokens_ptr, n_tokens_ptr,
                    w_expert_stride, o_expert_stride,
                    H: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, COUNT: tl.constexpr,
                    SWIGLU_LIMIT: tl.constexpr = 0.0, PDL: tl.constexpr = False):
    """``aq[p, rows], as[p, pid_n] = quant(silu(gate . x_p) * (up . x_p))`` for the picks of the
    slot (gate rows ``pid_n*BN ..``, up rows ``INTER + pid_n*BN ..``). ``COUNT``: as
    ``kernels.w13_swiglu_kernel``'s grouped steps (the first program of a slot adds its pick count
    to ``counts[expert]``, program (0, 0) the step's tokens)."""
    _pdl_enter(PDL)
    pid_n = tl.program_id(0)
    slot = tl.program_id(1)
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
    o_base = _expert_base(codes_ptr, expert, hot_o_ptr, cold_o_ptr, o_expert_stride)
    gate_rows = pid_n * BN + tl.arange(0, BN)
    KT: tl.constexpr = H // BK
    up_tile = INTER // BN + pid_n
    mult_g = _row_multiplier(o_base, pid_n, H, BN, BK)
    mult_u = _row_multiplier(o_base, up_tile, H, BN, BK)
    m0 = start
    while m0 < end:
        mm = m0 + tl.arange(0, BM)
        m_ok = mm < end
        picks = tl.load(sorted_pick_ptr + mm, mask=m_ok, other=0)
        tok = (picks // TOP_K).to(tl.int64)
        acc_g = tl.zeros((BN, BM), dtype=tl.float32)
        acc_u = tl.zeros((BN, BM), dtype=tl.float32)
        for kt in range(0, KT):
            kk = kt * BK + tl.arange(0, BK)
            x8 = tl.load(xq_ptr + tok[None, :] * H + kk[:, None], mask=m_ok[None, :], other=0.0)
            xs = tl.load(xs_ptr + tok * KT + kt, mask=m_ok, other=0.0)
            wg = _w4a8_tile(w_base, o_base, pid_n * KT + kt, BN, BK)
            acc_g += tl.dot(wg, x8) * xs[None, :]
            wu = _w4a8_tile(w_base, o_base, up_tile * KT + kt, BN, BK)
            acc_u += tl.dot(wu, x8) * xs[None, :]
        act = _swiglu(acc_g * mult_g[:, None], acc_u * mult_u[:, None], hot_w_ptr, gate_rows, INTER,
                      SWIGLU_LIMIT)
        q, s = _quantize_columns(act, BM)
        p64 = picks.to(tl.int64)
        tl.store(aq_ptr + p64[None, :] * INTER + gate_rows[:, None], q, mask=m_ok[None, :])
        tl.store(as_ptr + p64 * (INTER // BN) + pid_n, s, mask=m_ok)
        m0 += BM


@triton.jit
def w2_w4a8_kernel(aq_ptr, as_ptr, codes_ptr, hot_w_ptr, hot_o_ptr, cold_w_ptr, cold_o_ptr,
                   sorted_pick_ptr, slot_start_ptr, slot_expert_ptr, num_slots_ptr, y_ptr,
                   w_expert_stride, o_expert_stride,
                   H: tl.constexpr, INTER: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False):
    """``y[p, rows] = bf16(2^(base-122) * sum_k (W8 . aq_p) * as_p)``: one output row per pick."""
    _pdl_enter(PDL)
    pid_n = tl.program_id(0)
    slot = tl.program_id(1)
    if slot >= tl.load(num_slots_ptr):
        return
    start = tl.load(slot_start_ptr + slot)
    end = tl.load(slot_start_ptr + slot + 1)
    expert = tl.load(slot_expert_ptr + slot)
    w_base = _expert_base(codes_ptr, expert, hot_w_ptr, cold_w_ptr, w_expert_stride)
    o_base = _expert_base(codes_ptr, expert, hot_o_ptr, cold_o_ptr, o_expert_stride)
    rows = pid_n * BN + tl.arange(0, BN)
    KT: tl.constexpr = INTER // BK
    mult = _row_multiplier(o_base, pid_n, INTER, BN, BK)
    m0 = start
    while m0 < end:
        mm = m0 + tl.arange(0, BM)
        m_ok = mm < end
        picks = tl.load(sorted_pick_ptr + mm, mask=m_ok, other=0).to(tl.int64)
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        for kt in range(0, KT):
            kk = kt * BK + tl.arange(0, BK)
            a8 = tl.load(aq_ptr + picks[None, :] * INTER + kk[:, None], mask=m_ok[None, :], other=0.0)
            sa = tl.load(as_ptr + picks * KT + kt, mask=m_ok, other=0.0)
            acc += tl.dot(_w4a8_tile(w_base, o_base, pid_n * KT + kt, BN, BK), a8) * sa[None, :]
        tl.store(y_ptr + picks[None, :] * H + rows[:, None], (acc * mult[:, None]).to(tl.bfloat16),
                 mask=m_ok[None, :])
        m0 += BM
