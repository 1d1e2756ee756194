"""Triton kernels of the GPU residency path (launch logic lives in ``gpu.experts``).

One MoE layer's routed experts run as four launches (two at T=1: each pick is its own slot, no
grouping, and the finalize runs inside the w2 launch; compiled on CUDA sm_80+ those two are the
warp-MMA kernels of ``gpu.kernels_t1``, which reuse the helpers below), all fixed-shape and sync-free so the layer
captures into a CUDA graph. On sm_90+ every launch is a programmatic dependent launch (``PDL``):
its programs are placed while the previous kernel drains and wait (``griddepcontrol.wait``)
before touching memory, so only the launch gap overlaps:

1. ``group_picks_kernel`` (one program): sort the step's ``T*K`` picks by (expert, pick index) and
   cut them into *slots*, one per distinct expert; on a split layer the cold experts' slots first
   (their reads over the host link are the layer's longest; launched last, they would start late).
2. ``w13_swiglu_kernel``: for every slot and every tile of intermediate rows, dequantize the
   expert's MXFP4 gate and up rows in registers, multiply by the slot's tokens, apply SwiGLU
   (optionally vLLM's ``swiglu_limit`` clamp) in fp32 and store the activation rows as bf16
   (what fused MoE kernels feed their second GEMM).
   With the usage counter on, each slot's first program adds the slot's pick count to the
   counter with one integer atomic (count-only/drift mode; exact).
3. ``w2_kernel``: the down projection of every slot, one **unreduced** bf16 row per pick.
   Optional split-K for small steps (``SPLIT``, both expert kernels; off by default, see
   ``gpu.experts.KernelConfig``): fp32 partials added in split order by each tile's last split.
4. ``finalize_kernel``: per token, ``acc = fma(w_k, y_k, acc)`` in fp32 in the router's top-k order,
   cast once (bit-identical to ``core.finalize``, which computes a correctly rounded fmaf); a pick
   with an id outside ``0..E-1`` (expert parallelism's -1) adds ``fma(0, 0, acc)``, as the core's
   expert-parallel path (``parallel.ep``) does, never its stale workspace row. At T=1
   the same operations run at the end of ``w2_kernel`` (``FUSE_FINALIZE``), in the last program of
   each row tile (a ticket, as the split-K hand-off): the order of the sum is fixed, not the
   order in which programs finish.

Banks: each expert kernel reads the device row map ``codes[e]`` (``core.devmap``: ``>= 0`` hot row,
``< 0`` cold row ``~code``) and takes that expert's weights from the hot bank (HBM) or from the
cold bank (pinned host memory read in place over the host link). Both banks go through the very
same loads and the same tiling, so a pick's bits do not depend on where its expert lives, on the
bank sizes or on the other picks: the split layer is bit-identical to the unsplit one.

Weights are vLLM's MXFP4 tensors (``expert_residency.mxfp4``): ``w13 [E, 2I, H/2]`` and
``w2 [E, H, I/2]`` uint8 (low nibble = even element), ue8m0 scales ``[E, 2I, H/32]`` and
``[E, H, I/32]``; each expert's bytes either row-major as loaded or tile-major (``gpu.layout``,
``TILE_MAJOR``: every tile one contiguous run, for the host link). The products are arranged weights × activations (``[rows, K] @ [K, tokens]``) so
that the tensor-core tile's large side is the weight rows and a decode step's few tokens sit in
the small side.

Four dequantizers (``DEQUANT``), all exact: ``0`` builds each bf16 weight from its E2M1 code and
ue8m0 scale with integer ops (also runs under ``TRITON_INTERPRET=1``: the CPU check of the
indexing); ``1`` hands the packed values and scales to ``tl.dot_scaled`` (Triton's own MXFP4
upcast); ``2`` looks the codes up with byte permutes in inline PTX and multiplies by the scale in
bf16 (GPU only); ``3`` (the default) reads the *MMA-order* layout (``gpu.layout``): every thread
loads its own tensor-core A-fragment bytes with 16-byte loads and turns each 32-bit word (8 codes
of one row and one 32-value scale block) into four bf16x2 registers with a mask, a shift and one
``mul.bf16x2`` by ``2^(s-1)`` (the E2M1 exponent bias folded into the scale) — no shared-memory
round trip, no repacking. At T=1 every weight is used once, so the dequantizer's instructions per
weight, not the tensor cores, decide whether the kernel keeps up with HBM.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.language.target_info import cuda_capability_geq

from .word_bits import DECODE_PIECES, wraps

# Triton's CPU interpreter multiplies bf16 tiles wrongly (it treats their storage as integers), so
# under TRITON_INTERPRET=1 the tile products run on fp32 copies of the same bf16 values (exact
# products, fp32 sums). Compiled kernels always multiply bf16 tiles on the tensor cores.
_INTERPRETED: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def _pdl_enter(PDL: tl.constexpr):
    """Programmatic dependent launch (sm_90+; ``gpu.experts`` launches with ``launch_pdl``): wait
    until the previous kernel in the stream has finished and its writes are visible, *before*
    this program reads or writes anything, then let the next kernel's programs start their own
    launch (they wait the same way). What overlaps is only the launch and the programs' start
    with the previous kernel's tail, so no ordering the kernels rely on changes."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def group_picks_kernel(ids_ptr, token_mask_ptr, sorted_pick_ptr, slot_start_ptr, slot_expert_ptr,
                       num_slots_ptr, scratch_ptr, n_tokens_ptr, codes_ptr,
                       P, T, E,
                       TOP_K: tl.constexpr, PB: tl.constexpr, HAS_TOKEN_MASK: tl.constexpr,
                       COLD_FIRST: tl.constexpr = False, PDL: tl.constexpr = False):
    """Group ``P = T*TOP_K`` picks by expert. ``PB`` is the next power of two >= P.

    Outputs: ``sorted_pick[0:P]`` pick indices ordered by (expert, pick), skipped picks last;
    ``slot_start[0:num_slots+1]`` (the last entry is the number of valid picks); ``slot_expert``;
    ``n_tokens`` (valid tokens of the step, for the counter). ``COLD_FIRST`` (a split layer): the
    experts whose row code is negative (the cold bank's) come first, then the hot ones, each in id
    order, so the expert launches start the cold experts' slow reads with their first programs.
    """
    _pdl_enter(PDL)
    offs = tl.arange(0, PB)
    in_range = offs < P
    ids = tl.load(ids_ptr + offs, mask=in_range, other=-1).to(tl.int32)
    valid = in_range & (ids >= 0) & (ids < E)
    if HAS_TOKEN_MASK:
        tok_ok = tl.load(token_mask_ptr + offs // TOP_K, mask=in_range, other=0)
        valid = valid & (tok_ok != 0)
        tok_valid = tl.load(token_mask_ptr + offs, mask=offs < T, other=0)
        n_tok = tl.sum((tok_valid != 0).to(tl.int32), axis=0)
    else:
        n_tok = tl.sum((offs < T).to(tl.int32), axis=0)  # T may be specialised to a constant
    # Unique keys: rank-major, pick index minor; skipped picks sort after every real expert.
    if COLD_FIRST:
        code = tl.load(codes_ptr + ids, mask=valid, other=0)
        key = tl.where(valid, tl.where(code < 0, ids, ids + E), 2 * E) * PB + offs
    else:
        key = tl.where(valid, ids, E) * PB + offs
    key = tl.sort(key)
    rank = key // PB
    pick = key % PB
    if COLD_FIRST:  # back from rank to expert id; E marks the skipped picks
        expert = tl.where(rank >= 2 * E, E, tl.where(rank >= E, rank - E, rank))
    else:
        expert = rank
    tl.store(sorted_pick_ptr + offs, pick, mask=in_range)
    tl.store(scratch_ptr + offs, expert)
    tl.debug_barrier()
    prev = tl.load(scratch_ptr + offs - 1, mask=offs > 0, other=-1)
    first = (expert != prev) & (expert < E)
    slot = tl.cumsum(first.to(tl.int32), axis=0) - 1
    tl.store(slot_start_ptr + slot, offs, mask=first)
    tl.store(slot_expert_ptr + slot, expert, mask=first)
    n_slots = tl.sum(first.to(tl.int32), axis=0)
    n_valid = tl.sum(valid.to(tl.int32), axis=0)
    tl.store(slot_start_ptr + n_slots, n_valid)
    tl.store(num_slots_ptr, n_slots)
    tl.store(n_tokens_ptr, n_tok)


@triton.jit
def _dequant_mxfp4(packed, scales, ROWS: tl.constexpr, BK: tl.constexpr):
    """``uint8 [ROWS, BK/2]`` E2M1 pairs + ``uint8 [ROWS, BK/32]`` ue8m0 → exact bf16 ``[ROWS, BK]``.

    The scale is folded into the exponent with integer ops: for magnitude code ``c = 2e + m``
    (``e`` >= 1) the bf16 bits are ``(c << 6) + ((s - 1) << 7)``; code 1 (0.5) is ``(s - 1) << 7``;
    code 0 is zero; bit 3 is the sign. Valid for ``1 <= s`` and ``s + 2 <= 254`` (checkpoint scales
    are far inside that).
    """
    p = packed.to(tl.int32)
    codes = tl.reshape(tl.join(p & 0xF, p >> 4), (ROWS, BK))
    s = scales.to(tl.int32)
    s = tl.reshape(tl.broadcast_to(tl.reshape(s, (ROWS, BK // 32, 1)), (ROWS, BK // 32, 32)), (ROWS, BK))
    mag = codes & 7
    bits = tl.where(mag >= 2, mag << 6, 0) + tl.where(mag > 0, (s - 1) << 7, 0)
    bits = bits | ((codes & 8) << 12)
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


# E2M1 -> bf16 for 4 packed bytes (8 codes) in one 32-bit register, by byte permutes (prmt) on
# two 8-entry tables (the low and high byte of each code's bf16 value) plus the sign bit. Output:
# $0,$1 = the low-nibble (even) elements of bytes 0..3, $2,$3 = the high-nibble (odd) elements,
# each register a bf16x2 pair. About 2 instructions per weight instead of ~14 integer ops.
_E2M1_TO_BF16_PTX = tl.constexpr("""
{
.reg .b32 m, s, mh, sh, lb0, lb1, hb0, hb1, sg0, sg1;
and.b32 m, $4, 0x77777777;
and.b32 s, $4, 0x88888888;
shr.u32 s, s, 3;
shr.u32 mh, m, 16;
shr.u32 sh, s, 16;
prmt.b32 lb0, 0xC0800000, 0xC0804000, m;
prmt.b32 lb1, 0xC0800000, 0xC0804000, mh;
prmt.b32 hb0, 0x3F3F3F00, 0x40404040, m;
prmt.b32 hb1, 0x3F3F3F00, 0x40404040, mh;
prmt.b32 sg0, 0x00008000, 0, s;
prmt.b32 sg1, 0x00008000, 0, sh;
or.b32 hb0, hb0, sg0;
or.b32 hb1, hb1, sg1;
prmt.b32 $0, lb0, hb0, 0x6240;
prmt.b32 $1, lb1, hb1, 0x6240;
prmt.b32 $2, lb0, hb0, 0x7351;
prmt.b32 $3, lb1, hb1, 0x7351;
}
""")


@triton.jit
def _dequant_mxfp4_prmt(packed, scales, ROWS: tl.constexpr, BK: tl.constexpr):
    """Same bf16 values as ``_dequant_mxfp4`` (exact), via the prmt table lookup and one bf16
    multiply by the power-of-two scale. GPU only (inline PTX)."""
    lo, hi = tl.inline_asm_elementwise(_E2M1_TO_BF16_PTX, "=r,=r,=r,=r,r", [packed],
                                       dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    w = tl.reshape(tl.join(lo, hi), (ROWS, BK))
    sc = (scales.to(tl.int16) << 7).to(tl.bfloat16, bitcast=True)
    sc = tl.reshape(tl.broadcast_to(tl.reshape(sc, (ROWS, BK // 32, 1)), (ROWS, BK // 32, 32)), (ROWS, BK))
    return w * sc


# MMA-order word -> 4 bf16x2 registers, scaled. $4: one 32-bit word = the 8 E2M1 codes of one
# thread's tensor-core A fragment for one k16 step (rows g, g+8; values 2q+e and 2q+8+e), bit-placed
# by ``gpu.layout`` so that output j is the word rotated left by 0, 4, 10 (j = 0, 1, 2), or for j = 3
# by 6 (sign, e0, m) and 14 (e1), masked to the sign at bit 15 and (e1 e0 m) at bits 8..6 of each
# lane: bf16 then holds the code's value times 2^-126, and the multiply by bf16x2(2^(s-1)) = 2^126 *
# 2^(s-127) gives the exact scaled weight (mul.bf16x2 is exact on subnormal inputs). $5..$8: the
# multipliers of the word's 4 byte-elements (rows g, g, g+8, g+8). Outputs $0..$3: the fragment
# registers (row g, k 2q..), (row g+8, k 2q..), (row g, k 2q+8..), (row g+8, k 2q+8..).
def word_decode_ptx(word: str, m_lo: str, m_hi: str, outs: tuple[str, str, str, str],
                    sm90: bool = True) -> str:
    """PTX of the decode above for one MMA-order word: ``word`` (a register) -> the four bf16x2
    fragment registers ``outs``, scaled by ``m_lo`` (rows g) and ``m_hi`` (rows g+8): each output
    the OR of its ``word_bits.DECODE_PIECES`` (the word rotated left, masked). Uses the scratch
    registers ``t`` and ``u`` (and ``nz`` = -0.0 before sm_90, which has no mul.bf16x2: the same
    exact product as an fma with a -0.0 addend, x + -0 == x for every x). Nine integer operations
    and four multiplies per word."""
    def scaled(dst: str, src: str, mult: str) -> str:
        return (f"mul.rn.bf16x2 {dst}, {src}, {mult};" if sm90
                else f"fma.rn.bf16x2 {dst}, {src}, {mult}, nz;")

    def moved(dst: str, mask: int, r: int) -> str:
        # A rotation that wraps no kept bit is a plain left shift, which ptxas may issue on the
        # multiply-add pipe (IMAD.SHL) beside the logic pipe's rotations and masks.
        if wraps(mask, r):
            return f"shf.l.wrap.b32 {dst}, {word}, {word}, {r};"
        return f"shl.b32 {dst}, {word}, {r};"
    lines = []
    for j, (out, mult) in enumerate(zip(outs, (m_lo, m_hi, m_lo, m_hi))):
        pieces = DECODE_PIECES[j]
        if len(pieces) == 1:
            (mask, r), = pieces
            src = word
            if r:
                lines.append(moved("t", mask, r))
                src = "t"
            lines += [f"and.b32 {out}, {src}, 0x{mask:08X};", scaled(out, out, mult)]
        else:
            (mask_t, r_t), (mask_u, r_u) = pieces
            lines += [moved("t", mask_t, r_t), moved("u", mask_u, r_u), f"and.b32 t, t, 0x{mask_t:08X};",
                      f"and.b32 u, u, 0x{mask_u:08X};", "or.b32 t, t, u;", scaled(out, "t", mult)]
    return "\n".join(lines)


def _word_to_bf16_asm(sm90: bool) -> str:
    regs = ".reg .b32 t, u;" if sm90 else ".reg .b32 t, u, nz;\nmov.b32 nz, 0x80008000;"
    return ("\n{\n" + regs + "\n" + word_decode_ptx("$4", "$5", "$7", ("$0", "$1", "$2", "$3"), sm90)
            + "\n}\n")


_MMA_WORD_TO_BF16_PTX = tl.constexpr(_word_to_bf16_asm(sm90=True))
_MMA_WORD_TO_BF16_PTX_SM80 = tl.constexpr(_word_to_bf16_asm(sm90=False))

# The decode's pieces as constexprs for the interpreter twin (masks as signed int32: the interpreter
# refuses int32 literals above 2^31).
def _signed(mask: int) -> int:
    return mask - (1 << 32) if mask >= 1 << 31 else mask


# The twin is written for this shape of the table: one unrotated piece, two single pieces, one pair.
assert [len(p) for p in DECODE_PIECES] == [1, 1, 1, 2] and DECODE_PIECES[0][0][1] == 0
_J0_MASK: tl.constexpr = tl.constexpr(_signed(DECODE_PIECES[0][0][0]))
_J1_MASK: tl.constexpr = tl.constexpr(_signed(DECODE_PIECES[1][0][0]))
_J1_R: tl.constexpr = tl.constexpr(DECODE_PIECES[1][0][1])
_J2_MASK: tl.constexpr = tl.constexpr(_signed(DECODE_PIECES[2][0][0]))
_J2_R: tl.constexpr = tl.constexpr(DECODE_PIECES[2][0][1])
_J3_MASK_A: tl.constexpr = tl.constexpr(_signed(DECODE_PIECES[3][0][0]))
_J3_R_A: tl.constexpr = tl.constexpr(DECODE_PIECES[3][0][1])
_J3_MASK_B: tl.constexpr = tl.constexpr(_signed(DECODE_PIECES[3][1][0]))
_J3_R_B: tl.constexpr = tl.constexpr(DECODE_PIECES[3][1][1])


@triton.jit
def _rotl(word, R: tl.constexpr):
    """Interpreter twin of ``shf.l.wrap``: int32 ``word`` rotated left by ``R`` (0 < R < 32)."""
    u = word.to(tl.uint32, bitcast=True)
    return ((u << R) | (u >> (32 - R))).to(tl.int32, bitcast=True)


@triton.jit
def _bf16x2_scale(s):
    """ue8m0 scale byte(s) ``s`` (int32) -> bf16x2 of ``2^(s-1)`` in both lanes (exponent field
    ``s + 126``): the decode's multiplier, the E2M1 exponent bias folded in (``gpu.layout`` refuses
    scales above 128, whose multiplier would overflow)."""
    return s * 0x00800080 + 0x3F003F00


@triton.jit
def _mma_lane_value(p, scale):
    """The value the PTX's bf16 lane ``p`` (sign bit 15, exponent bits 8..7, mantissa bit 6) has
    after the multiply, from its bit fields (the interpreter flushes bf16 subnormals)."""
    ex = (p >> 7) & 3
    m = ((p >> 6) & 1).to(tl.float32)
    mag = tl.where(ex == 0, 0.5 * m, (1 << ex).to(tl.float32) * 0.5 * (1.0 + 0.5 * m))
    return tl.where(((p >> 15) & 1) != 0, -mag, mag) * scale


@triton.jit
def _mma_word_lanes(v, scale):
    """Interpreter twin of one PTX output: the bit-placed int32 ``v`` as its two bf16 lanes."""
    return (_mma_lane_value(v & 0xFFFF, scale).to(tl.bfloat16),
            _mma_lane_value((v >> 16) & 0xFFFF, scale).to(tl.bfloat16))


@triton.jit
def _load_mma_tile(w_tile, s_tile, BN: tl.constexpr, BK: tl.constexpr):
    """One ``BN x BK`` weight tile in the MMA-order layout -> exact bf16 ``[BN, BK]``.

    Tile bytes (``gpu.layout``): 16-byte rows indexed ``(rm, bh, w, g, q)`` — row-rep, pair of
    32-value scale blocks, warp, lane group, lane in group — each holding one thread's 4 words
    ``(b0, c)`` of 4 bytes ``(h, e)``; the thread of warp ``w``, lane ``4g+q`` owns rows
    ``64rm + 16w + 8h + g`` and values ``32b + 16c + 8d + 2q + e`` (``b = 2bh + b0``): the wgmma A
    fragment, in the fragment's own register order, so the loads are 16 bytes wide and the reshapes
    below are register renamings. Scales: bytes ``(rm, bh, w, g, b0, h)`` per tile.
    """
    R: tl.constexpr = BN // 64
    BH: tl.constexpr = BK // 64
    ROWS: tl.constexpr = BN * BK // 32
    rows = tl.arange(0, ROWS)
    packed = tl.load(w_tile + rows[:, None] * 16 + tl.arange(0, 16)[None, :])
    sc = tl.load(s_tile + (rows // 4)[:, None] * 4 + tl.arange(0, 4)[None, :]).to(tl.int32)  # (b0, h)
    if _INTERPRETED:
        even, odd = tl.split(tl.reshape(packed.to(tl.int32), (ROWS, 4, 2, 2)))  # bytes (0, 2), (1, 3)
        b0, b2 = tl.split(even)
        b1, b3 = tl.split(odd)
        word = b0 | (b1 << 8) | (b2 << 16) | (b3 << 24)  # [ROWS, 4 (b0, c)] little-endian words
        mult = (sc << 23).to(tl.float32, bitcast=True)   # 2^(s-127), exactly (s >= 1)
        m_h0, m_h1 = tl.split(tl.reshape(mult, (ROWS, 2, 2)))  # [ROWS, 2 (b0)] per row half
        m_h0 = tl.reshape(tl.broadcast_to(tl.reshape(m_h0, (ROWS, 2, 1)), (ROWS, 2, 2)), (ROWS, 4))
        m_h1 = tl.reshape(tl.broadcast_to(tl.reshape(m_h1, (ROWS, 2, 1)), (ROWS, 2, 2)), (ROWS, 4))
        l00, l01 = _mma_word_lanes(word & _J0_MASK, m_h0)
        l10, l11 = _mma_word_lanes(_rotl(word, _J1_R) & _J1_MASK, m_h1)
        l20, l21 = _mma_word_lanes(_rotl(word, _J2_R) & _J2_MASK, m_h0)
        v3 = (_rotl(word, _J3_R_A) & _J3_MASK_A) | (_rotl(word, _J3_R_B) & _J3_MASK_B)
        l30, l31 = _mma_word_lanes(v3, m_h1)
        # r0[.., h, e] = output h's lane e (the asm's byte order); r1 = outputs 2, 3
        r0 = tl.reshape(tl.join(tl.join(l00, l10), tl.join(l01, l11)), (ROWS, 16))
        r1 = tl.reshape(tl.join(tl.join(l20, l30), tl.join(l21, l31)), (ROWS, 16))
    else:
        mult = _bf16x2_scale(sc)
        mult = tl.reshape(mult, (ROWS, 2, 1, 2, 1))  # (b0, c, h, e)
        mult = tl.reshape(tl.broadcast_to(mult, (ROWS, 2, 2, 2, 2)), (ROWS, 16))
        if cuda_capability_geq(9):
            r0, r1 = tl.inline_asm_elementwise(_MMA_WORD_TO_BF16_PTX, "=r,=r,=r,=r,r,r,r,r,r", [packed, mult],
                                               dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
        else:
            r0, r1 = tl.inline_asm_elementwise(_MMA_WORD_TO_BF16_PTX_SM80, "=r,=r,=r,=r,r,r,r,r,r",
                                               [packed, mult], dtype=(tl.bfloat16, tl.bfloat16),
                                               is_pure=True, pack=4)
    # [rm, bh, w, g, q, b0, c, h, e, d] -> rows (rm, w, h, g) x values (bh, b0, c, d, q, e)
    w = tl.reshape(tl.join(r0, r1), (R, BH, 4, 8, 4, 2, 2, 2, 2, 2))
    w = tl.permute(w, (0, 2, 7, 3, 1, 5, 6, 9, 4, 8))
    return tl.reshape(w, (BN, BK))


@triton.jit
def _expert_base(codes_ptr, expert, hot_ptr, cold_ptr, expert_stride):
    """Pointer to ``expert``'s first byte in whichever bank the row map says holds it."""
    code = tl.load(codes_ptr + expert)
    # One select instead of an if/else: the compiler then still knows the base is 16-byte aligned
    # (both bank pointers and the stride are), which the MMA-order loads need to be 16 bytes wide.
    row = tl.where(code >= 0, code, -code - 1).to(tl.int64)
    return tl.where(code >= 0, hot_ptr, cold_ptr) + row * expert_stride


@triton.jit
def _mx_tile_dot(acc, w_base, s_base, row0, k0, x_t, K: tl.constexpr,
                 BN: tl.constexpr, BK: tl.constexpr, DEQUANT: tl.constexpr, TILE_MAJOR: tl.constexpr):
    """``acc[BN, BM] += W[row0:row0+BN, k0:k0+BK] @ x_t[BK, BM]`` with W in MXFP4 (reduction dim K).

    ``TILE_MAJOR``: the expert's bytes are stored tile by tile (``gpu.layout``), so a tile's packed
    values (``BN*BK/2`` bytes) and scales (``BN*BK/32`` bytes) are each one contiguous run — long
    reads, which is what the host link needs; otherwise rows are ``K/2`` bytes apart (vLLM layout).
    """
    if DEQUANT == 3:  # MMA-order layout (always tile-major)
        tile = ((row0 // BN) * (K // BK) + k0 // BK).to(tl.int64)
        w = _load_mma_tile(w_base + tile * (BN * BK // 2), s_base + tile * (BN * BK // 32), BN, BK)
        if _INTERPRETED:
            return tl.dot(w.to(tl.float32), x_t.to(tl.float32), acc, input_precision="ieee")
        return tl.dot(w, x_t, acc)
    rr = tl.arange(0, BN)
    if TILE_MAJOR:
        tile = ((row0 // BN) * (K // BK) + k0 // BK).to(tl.int64)
        w_ptr = w_base + tile * (BN * BK // 2) + rr[:, None] * (BK // 2) + tl.arange(0, BK // 2)[None, :]
        s_ptr = s_base + tile * (BN * BK // 32) + rr[:, None] * (BK // 32) + tl.arange(0, BK // 32)[None, :]
    else:
        rows = (row0 + rr).to(tl.int64)
        w_ptr = w_base + rows[:, None] * (K // 2) + (k0 // 2 + tl.arange(0, BK // 2))[None, :]
        s_ptr = s_base + rows[:, None] * (K // 32) + (k0 // 32 + tl.arange(0, BK // 32))[None, :]
    packed = tl.load(w_ptr)
    scales = tl.load(s_ptr)
    if DEQUANT == 0:
        w = _dequant_mxfp4(packed, scales, BN, BK)
        if _INTERPRETED:
            acc = tl.dot(w.to(tl.float32), x_t.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, x_t, acc)
    elif DEQUANT == 1:
        acc = tl.dot_scaled(packed, scales, "e2m1", x_t, None, "bf16", acc)
    else:
        w = _dequant_mxfp4_prmt(packed, scales, BN, BK)
        acc = tl.dot(w, x_t, acc)
    return acc


@triton.jit
def _swiglu(acc_g, acc_u, b_ptr, rows, INTER: tl.constexpr, SWIGLU_LIMIT: tl.constexpr,
            HAS_BIAS: tl.constexpr = False, ACT: tl.constexpr = 0, ALPHA: tl.constexpr = 1.0):
    """The activation on the fully reduced fp32 gate and up products of ``rows``.

    ``HAS_BIAS``: add the expert's fp32 bias (``b_ptr``: its ``[2I]`` row, gate first) before any
    clamp. ``ACT == 0``: SiLU-GLU, vLLM's clamp when ``SWIGLU_LIMIT`` > 0; ``ACT == 1``: SwiGLU-OAI
    (gpt-oss), ``(clamp(up, -L, L) + 1) * gate * sigmoid(ALPHA * gate)`` with ``gate = min(g, L)``.
    """
    if HAS_BIAS:
        acc_g += tl.load(b_ptr + rows).to(tl.float32)[:, None]
        acc_u += tl.load(b_ptr + INTER + rows).to(tl.float32)[:, None]
    return _glu(acc_g, acc_u, SWIGLU_LIMIT, ACT, ALPHA)


@triton.jit
def _glu(acc_g, acc_u, SWIGLU_LIMIT: tl.constexpr, ACT: tl.constexpr, ALPHA: tl.constexpr):
    """``_swiglu``'s activation, elementwise on fp32 gate and up sums of any shape."""
    if ACT == 1:
        gate = tl.minimum(acc_g, SWIGLU_LIMIT)
        up = tl.minimum(tl.maximum(acc_u, -SWIGLU_LIMIT), SWIGLU_LIMIT)
        return (up + 1.0) * (gate / (1.0 + tl.exp(-(gate * ALPHA))))
    else:
        if SWIGLU_LIMIT > 0:
            acc_g = tl.minimum(acc_g, SWIGLU_LIMIT)
            acc_u = tl.minimum(tl.maximum(acc_u, -SWIGLU_LIMIT), SWIGLU_LIMIT)
        return acc_g / (1.0 + tl.exp(-acc_g)) * acc_u


@triton.jit
def _k_range(K: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr):
    """This program's share ``[k_lo, k_hi)`` of the reduction: split ``sk = program_id(2)`` of
    ``SPLIT`` takes K steps ``[sk*NK//SPLIT, (sk+1)*NK//SPLIT)`` (``SPLIT <= NK``, uneven shares
    allowed). ``SPLIT == 1`` compiles the whole range with constant bounds, as before."""
    if SPLIT > 1:
        NK: tl.constexpr = K // BK
        sk = tl.program_id(2)
        return (sk * NK // SPLIT) * BK, ((sk + 1) * NK // SPLIT) * BK
    else:
        return 0, K


@triton.jit
def _last_of_split(ticket_ptr, SPLIT: tl.constexpr):
    """Split-K hand-off: every program of a tile has stored its fp32 partial; the one that takes
    the last ticket reduces. The barrier orders all of this program's partial stores before the
    acq_rel ticket; the last program's acquire orders its partial loads after everyone's stores.
    It resets the ticket for the next launch (graph replays). No program waits on another."""
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
    last = ticket == SPLIT - 1
    if last:
        tl.atomic_xchg(ticket_ptr, 0)
    return last


@triton.jit
def w13_swiglu_kernel(x_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr,
                      sorted_pick_ptr, slot_start_ptr, slot_expert_ptr, num_slots_ptr, act_ptr,
                      counts_ptr, tokens_ptr, n_tokens_ptr,
                      stride_x, w_expert_stride, s_expert_stride,
                      ids_ptr, token_mask_ptr, part_ptr, ticket_ptr, E,
                      hot_b_ptr, cold_b_ptr, b_expert_stride,
                      H: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DEQUANT: tl.constexpr,
                      TILE_MAJOR: tl.constexpr, COUNT: tl.constexpr, SWIGLU_LIMIT: tl.constexpr = 0.0,
                      SPLIT: tl.constexpr = 1, ONE_TOKEN: tl.constexpr = False,
                      HAS_TOKEN_MASK: tl.constexpr = False, PART_PICKS: tl.constexpr = 1,
                      HAS_BIAS: tl.constexpr = False, ACT: tl.constexpr = 0, ALPHA: tl.constexpr = 1.0,
                      PDL: tl.constexpr = False):
    """``act[p, n] = bf16(silu(gate_n . x_t) * (up_n . x_t))`` for every pick ``p`` of the slot.

    ``SWIGLU_LIMIT`` > 0: vLLM 0.33's clamped SwiGLU for SILU experts (``swiglu_limit``),
    ``silu(min(gate, L)) * clamp(up, -L, L)`` on the fp32 products; 0.0 (the default) compiles
    exactly the unclamped kernel (the branch is resolved at compile time). ``HAS_BIAS``/``ACT``/
    ``ALPHA``: gpt-oss's biases and SwiGLU-OAI (``_swiglu``; the bias row comes from the same bank
    as the weights, through the row map, after the whole K reduction).

    ``COUNT``: the usage counter — the first program of each slot adds the slot's pick count to
    ``counts[expert]`` (exact integer atomics, off the step's serial path), program (0, 0) adds the
    step's valid tokens.

    Small steps (``gpu.experts`` chooses by T when it traces the launch):
    ``ONE_TOKEN`` (T = 1): no grouping launch — slot ``p`` is pick ``p``, its expert read from
    ``ids`` (a token's picks are its slots; a pick's arithmetic does not depend on its slot).
    ``SPLIT`` > 1: grid axis 2 splits the hidden (reduction) dimension; each split stores its
    fp32 gate/up partials in ``part [SPLIT, PART_PICKS, 2*INTER]`` and the last of a tile's splits
    (``_last_of_split``) adds them **in split order 0, 1, ...**, then applies SwiGLU: the sum
    depends on T's schedule only, never on a bank, on timing or on which split finished last.
    ``PDL``: ``_pdl_enter``.
    """
    _pdl_enter(PDL)
    pid_n = tl.program_id(0)
    slot = tl.program_id(1)
    if SPLIT > 1:
        first_split = tl.program_id(2) == 0
    else:
        first_split = True
    if ONE_TOKEN:
        expert, ok = _one_token_pick(ids_ptr, token_mask_ptr, tokens_ptr, slot, E,
                                     (pid_n == 0) & (slot == 0) & first_split, TOP_K, HAS_TOKEN_MASK, COUNT)
        if ok == 0:
            return
        start = slot
        end = slot + 1
    else:
        if COUNT:
            if (pid_n == 0) & (slot == 0) & first_split:
                tl.atomic_add(tokens_ptr, tl.load(n_tokens_ptr).to(tl.int64))
        if slot >= tl.load(num_slots_ptr):
            return
        start = tl.load(slot_start_ptr + slot)
        end = tl.load(slot_start_ptr + slot + 1)
        expert = tl.load(slot_expert_ptr + slot)
    if COUNT:
        if (pid_n == 0) & first_split:
            tl.atomic_add(counts_ptr + expert, (end - start).to(tl.int64))
    w_base = _expert_base(codes_ptr, expert, hot_w_ptr, cold_w_ptr, w_expert_stride)
    s_base = _expert_base(codes_ptr, expert, hot_s_ptr, cold_s_ptr, s_expert_stride)
    if HAS_BIAS:
        b_base = _expert_base(codes_ptr, expert, hot_b_ptr, cold_b_ptr, b_expert_stride)
    else:
        b_base = hot_b_ptr
    gate_rows = pid_n * BN + tl.arange(0, BN)
    k_lo, k_hi = _k_range(H, BK, SPLIT)
    m0 = start
    while m0 < end:  # a while loop: run-time bounds (a slot holds 1..T picks)
        mm = m0 + tl.arange(0, BM)
        m_ok = mm < end
        if ONE_TOKEN:
            picks = mm
        else:
            picks = tl.load(sorted_pick_ptr + mm, mask=m_ok, other=0)
        tok = (picks // TOP_K).to(tl.int64)
        acc_g = tl.zeros((BN, BM), dtype=tl.float32)
        acc_u = tl.zeros((BN, BM), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BK):
            kk = k0 + tl.arange(0, BK)
            x_t = tl.load(x_ptr + tok[None, :] * stride_x + kk[:, None], mask=m_ok[None, :], other=0.0)
            acc_g = _mx_tile_dot(acc_g, w_base, s_base, pid_n * BN, k0, x_t, H, BN, BK, DEQUANT, TILE_MAJOR)
            acc_u = _mx_tile_dot(acc_u, w_base, s_base, pid_n * BN + INTER, k0, x_t, H, BN, BK, DEQUANT,
                                 TILE_MAJOR)
        dest = act_ptr + picks[None, :].to(tl.int64) * INTER + gate_rows[:, None]
        if SPLIT > 1:  # a slot of a small step has <= T <= BM picks: this loop runs once
            part = part_ptr + picks[None, :].to(tl.int64) * (2 * INTER) + gate_rows[:, None]
            split_stride = PART_PICKS * 2 * INTER
            tl.store(part + tl.program_id(2) * split_stride, acc_g, mask=m_ok[None, :])
            tl.store(part + tl.program_id(2) * split_stride + INTER, acc_u, mask=m_ok[None, :])
            if _last_of_split(ticket_ptr + slot * (INTER // BN) + pid_n, SPLIT):
                acc_g = tl.load(part, mask=m_ok[None, :], other=0.0, cache_modifier=".cg")
                acc_u = tl.load(part + INTER, mask=m_ok[None, :], other=0.0, cache_modifier=".cg")
                for s in tl.static_range(1, SPLIT):
                    acc_g += tl.load(part + s * split_stride, mask=m_ok[None, :], other=0.0,
                                     cache_modifier=".cg")
                    acc_u += tl.load(part + s * split_stride + INTER, mask=m_ok[None, :], other=0.0,
                                     cache_modifier=".cg")
                act = _swiglu(acc_g, acc_u, b_base, gate_rows, INTER, SWIGLU_LIMIT, HAS_BIAS, ACT, ALPHA)
                tl.store(dest, act.to(tl.bfloat16), mask=m_ok[None, :])
        else:
            act = _swiglu(acc_g, acc_u, b_base, gate_rows, INTER, SWIGLU_LIMIT, HAS_BIAS, ACT, ALPHA)
            tl.store(dest, act.to(tl.bfloat16), mask=m_ok[None, :])
        m0 += BM


@triton.jit
def w2_kernel(act_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr,
              sorted_pick_ptr, slot_start_ptr, slot_expert_ptr, num_slots_ptr, y_ptr,
              w_expert_stride, s_expert_stride,
              ids_ptr, token_mask_ptr, part_ptr, ticket_ptr, E,
              hot_b_ptr, cold_b_ptr, b_expert_stride,
              weights_ptr, out_ptr, fin_ticket_ptr,
              H: tl.constexpr, INTER: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DEQUANT: tl.constexpr,
              TILE_MAJOR: tl.constexpr, TOP_K: tl.constexpr = 1, SPLIT: tl.constexpr = 1,
              ONE_TOKEN: tl.constexpr = False, HAS_TOKEN_MASK: tl.constexpr = False,
              PART_PICKS: tl.constexpr = 1, HAS_BIAS: tl.constexpr = False,
              FUSE_FINALIZE: tl.constexpr = False, PDL: tl.constexpr = False):
    """``y[p, n] = bf16(w2_n . act_p (+ b2_n))``: one unreduced output row per pick. ``ONE_TOKEN``
    and ``SPLIT`` (over the intermediate dimension; fp32 partials ``[SPLIT, PART_PICKS, H]`` added
    in split order by the tile's last split) as in ``w13_swiglu_kernel``; ``HAS_BIAS``: the
    expert's fp32 ``[H]`` bias added to the reduced sum before the cast.

    ``FUSE_FINALIZE`` (``ONE_TOKEN`` with ``SPLIT == 1`` only): the finalize of the step's one
    token in this launch. Every program of a row tile (one per pick, skipped picks included)
    takes a ticket on ``fin_ticket[pid_n]`` after its store; the last reads the tile's ``TOP_K``
    stored bf16 rows and computes ``out = cast(fma(w_K-1, y_K-1, ... fma(w_0, y_0, 0)))`` in fp32
    in router order, exactly ``finalize_kernel``'s operations with ids (a pick with an id outside
    ``0..E-1`` adds ``fma(0, 0, acc)``): same bits whichever program is last.
    """
    _pdl_enter(PDL)
    pid_n = tl.program_id(0)
    slot = tl.program_id(1)
    if ONE_TOKEN:
        expert, ok = _one_token_pick(ids_ptr, token_mask_ptr, ids_ptr, slot, E, False, TOP_K,
                                     HAS_TOKEN_MASK, False)
        start = slot
        if FUSE_FINALIZE:  # a skipped pick computes nothing but still takes its ticket
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
    rows = pid_n * BN + tl.arange(0, BN)
    if HAS_BIAS:
        b_row = tl.load(_expert_base(codes_ptr, expert, hot_b_ptr, cold_b_ptr, b_expert_stride) + rows)
        bias = b_row.to(tl.float32)[:, None]
    k_lo, k_hi = _k_range(INTER, BK, SPLIT)
    m0 = start
    while m0 < end:
        mm = m0 + tl.arange(0, BM)
        m_ok = mm < end
        if ONE_TOKEN:
            picks = mm.to(tl.int64)
        else:
            picks = tl.load(sorted_pick_ptr + mm, mask=m_ok, other=0).to(tl.int64)
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BK):
            kk = k0 + tl.arange(0, BK)
            a_t = tl.load(act_ptr + picks[None, :] * INTER + kk[:, None], mask=m_ok[None, :], other=0.0)
            acc = _mx_tile_dot(acc, w_base, s_base, pid_n * BN, k0, a_t, INTER, BN, BK, DEQUANT, TILE_MAJOR)
        dest = y_ptr + picks[None, :] * H + rows[:, None]
        if SPLIT > 1:
            part = part_ptr + picks[None, :] * H + rows[:, None]
            split_stride = PART_PICKS * H
            tl.store(part + tl.program_id(2) * split_stride, acc, mask=m_ok[None, :])
            if _last_of_split(ticket_ptr + slot * (H // BN) + pid_n, SPLIT):
                acc = tl.load(part, mask=m_ok[None, :], other=0.0, cache_modifier=".cg")
                for s in tl.static_range(1, SPLIT):
                    acc += tl.load(part + s * split_stride, mask=m_ok[None, :], other=0.0,
                                   cache_modifier=".cg")
                if HAS_BIAS:
                    acc += bias
                tl.store(dest, acc.to(tl.bfloat16), mask=m_ok[None, :])
        else:
            if HAS_BIAS:
                acc += bias
            tl.store(dest, acc.to(tl.bfloat16), mask=m_ok[None, :])
        m0 += BM
    if FUSE_FINALIZE:
        if _last_of_split(fin_ticket_ptr + pid_n, TOP_K):
            _finalize_rows(y_ptr, weights_ptr, ids_ptr, out_ptr, rows, E, H, TOP_K, BN)


@triton.jit
def _one_token_pick(ids_ptr, token_mask_ptr, tokens_ptr, slot, E, count_token, TOP_K: tl.constexpr,
                    HAS_TOKEN_MASK: tl.constexpr, COUNT: tl.constexpr):
    """T = 1, slot = pick: ``(expert, ok)`` — the pick's id and whether it is computed (an id in
    ``0..E-1`` and, with ``HAS_TOKEN_MASK``, a real token). ``COUNT`` and ``count_token`` (one
    program of the launch): add the step's token to the counter's ``tokens``, masked or not as
    the grouping kernel counts it."""
    expert = tl.load(ids_ptr + slot).to(tl.int32)
    ok = (expert >= 0) & (expert < E)
    if HAS_TOKEN_MASK:
        ok = ok & (tl.load(token_mask_ptr + slot // TOP_K) != 0)
    if COUNT:
        if count_token:
            if HAS_TOKEN_MASK:
                tl.atomic_add(tokens_ptr, (tl.load(token_mask_ptr) != 0).to(tl.int64))
            else:
                tl.atomic_add(tokens_ptr, 1)
    return expert, ok


@triton.jit
def _finalize_rows(y_ptr, weights_ptr, ids_ptr, out_ptr, rows, E, H: tl.constexpr, TOP_K: tl.constexpr,
                   BN: tl.constexpr):
    """The fused T=1 finalize of output ``rows`` (``BN`` of them): ``finalize_kernel``'s fp32
    fma over the token's ``TOP_K`` stored bf16 rows in router order (L2 reads: other programs
    wrote them), one cast."""
    out = tl.zeros((BN,), dtype=tl.float32)
    for kk in tl.static_range(TOP_K):
        w = tl.load(weights_ptr + kk).to(tl.float32)
        y = tl.load(y_ptr + kk * H + rows, cache_modifier=".cg").to(tl.float32)
        w, y = _routed_pick(ids_ptr + kk, E, w, y)
        out = tl.fma(tl.full((BN,), 0.0, tl.float32) + w, y, out)
    tl.store(out_ptr + rows, out.to(out_ptr.dtype.element_ty))


@triton.jit
def _routed_pick(id_ptr, E, w, y):
    """A pick's (weight, row) as the finalize adds them: a pick whose id is outside ``0..E-1``
    (vLLM's -1 for an expert of another rank under expert parallelism, or an unrouted pick) was
    never computed, so its workspace row is stale; it contributes ``fma(0, 0, acc)``, exactly
    what ``parallel.ep.ep_forward`` gives the core's torch finalize (zero weight, zero row),
    whatever the router weight and the stale row hold (NaN included)."""
    pick_id = tl.load(id_ptr)
    routed = (pick_id >= 0) & (pick_id < E)
    return tl.where(routed, w, 0.0), tl.where(routed, y, 0.0)


@triton.jit
def finalize_kernel(y_ptr, weights_ptr, out_ptr, ids_ptr, E, H: tl.constexpr, TOP_K: tl.constexpr,
                    BH: tl.constexpr, HAS_IDS: tl.constexpr = False, PDL: tl.constexpr = False):
    """``out[t] = cast(fma(w[t,K-1], y[t,K-1], ... fma(w[t,0], y[t,0], 0)))`` in fp32, router order.
    ``HAS_IDS``: picks whose id (``ids [T, K]``) is outside ``0..E-1`` add ``fma(0, 0, acc)``
    (``_routed_pick``); without ids every row is taken as it is (the core's contract)."""
    _pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    col_ok = cols < H
    acc = tl.zeros((BH,), dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        w = tl.load(weights_ptr + t * TOP_K + k).to(tl.float32)
        y = tl.load(y_ptr + (t * TOP_K + k) * H + cols, mask=col_ok, other=0.0).to(tl.float32)
        if HAS_IDS:
            w, y = _routed_pick(ids_ptr + t * TOP_K + k, E, w, y)
        acc = tl.fma(tl.full((BH,), 0.0, tl.float32) + w, y, acc)
    tl.store(out_ptr + t * H + cols, acc.to(out_ptr.dtype.element_ty), mask=col_ok)


# -- T = 1 stream-K: a balanced grid ---------------------------------------------------------------
# At T=1 the expert kernels have TOP_K * (rows / BN) tiles (DSv4.1: 216 for w13, 240 for w2) on
# 132 SMs: some SMs hold two programs, others one, and those idle once done. The stream-K kernels
# below flatten every (pick, row tile, K step) into one list of W work units and give each of
# PROGRAMS programs (a multiple of the SM count) the equal share [j*W//P, (j+1)*W//P). A tile whose
# K steps fall in one share is reduced and stored as before; a tile cut by share boundaries has
# its pieces' fp32 partials stored per (share, first/last piece) and added by the tile's last
# piece (a ticket) **in share order**: the sum depends on W and PROGRAMS only, never on a bank or
# on timing, so split == unsplit still holds bit for bit.


@triton.jit
def _share_start(j, W: tl.constexpr, PROGRAMS: tl.constexpr):
    """First work unit of share ``j``."""
    return j * W // PROGRAMS


@triton.jit
def _share_at(w, W: tl.constexpr, PROGRAMS: tl.constexpr):
    """The share holding work unit ``w``: the largest ``j`` with ``j*W//P <= w``."""
    return ((w + 1) * PROGRAMS + W - 1) // W - 1


@triton.jit
def _last_of(ticket_ptr, count):
    """``_last_of_split`` with a run-time number of participants."""
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
    last = ticket == count - 1
    if last:
        tl.atomic_xchg(ticket_ptr, 0)
    return last


@triton.jit
def w13_stream_kernel(x_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr, act_ptr,
                      counts_ptr, tokens_ptr, w_expert_stride, s_expert_stride,
                      ids_ptr, token_mask_ptr, part_ptr, ticket_ptr, E,
                      hot_b_ptr, cold_b_ptr, b_expert_stride,
                      H: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DEQUANT: tl.constexpr,
                      TILE_MAJOR: tl.constexpr, COUNT: tl.constexpr, SWIGLU_LIMIT: tl.constexpr,
                      PROGRAMS: tl.constexpr, HAS_TOKEN_MASK: tl.constexpr = False,
                      HAS_BIAS: tl.constexpr = False, ACT: tl.constexpr = 0, ALPHA: tl.constexpr = 1.0,
                      PDL: tl.constexpr = False):
    """``w13_swiglu_kernel`` at T = 1 (ungrouped: slot = pick) on a balanced grid of ``PROGRAMS``
    programs (stream-K, above). Partials: ``part [PROGRAMS, 2 (first/last piece), 2 (gate, up), BN]``
    fp32; one ticket per (pick, row tile). Counter: the tile with row tile 0 and K step 0 counts
    its pick, share 0 the token."""
    _pdl_enter(PDL)
    NT: tl.constexpr = INTER // BN
    NK: tl.constexpr = H // BK
    W: tl.constexpr = TOP_K * NT * NK
    pid = tl.program_id(0)
    if COUNT:
        if pid == 0:
            if HAS_TOKEN_MASK:
                tl.atomic_add(tokens_ptr, (tl.load(token_mask_ptr) != 0).to(tl.int64))
            else:
                tl.atomic_add(tokens_ptr, 1)
    w = _share_start(pid, W, PROGRAMS)
    w_hi = _share_start(pid + 1, W, PROGRAMS)
    rows_bn = tl.arange(0, BN)
    cols = tl.arange(0, BM)
    while w < w_hi:
        tile = w // NK
        k_first = w - tile * NK
        seg_hi = tl.minimum(w_hi, (tile + 1) * NK)
        k_last = seg_hi - tile * NK
        slot = tile // NT
        pid_n = tile - slot * NT
        expert = tl.load(ids_ptr + slot).to(tl.int32)
        ok = (expert >= 0) & (expert < E)
        if HAS_TOKEN_MASK:
            ok = ok & (tl.load(token_mask_ptr) != 0)
        if ok:
            if COUNT:
                if (pid_n == 0) & (k_first == 0):
                    tl.atomic_add(counts_ptr + expert, 1)
            w_base = _expert_base(codes_ptr, expert, hot_w_ptr, cold_w_ptr, w_expert_stride)
            s_base = _expert_base(codes_ptr, expert, hot_s_ptr, cold_s_ptr, s_expert_stride)
            if HAS_BIAS:
                b_base = _expert_base(codes_ptr, expert, hot_b_ptr, cold_b_ptr, b_expert_stride)
            else:
                b_base = hot_b_ptr
            picks = slot + cols
            m_ok = picks < slot + 1
            tok = (picks // TOP_K).to(tl.int64)
            gate_rows = pid_n * BN + rows_bn
            acc_g = tl.zeros((BN, BM), dtype=tl.float32)
            acc_u = tl.zeros((BN, BM), dtype=tl.float32)
            for k0 in range(k_first * BK, k_last * BK, BK):
                kk = k0 + tl.arange(0, BK)
                x_t = tl.load(x_ptr + tok[None, :] * H + kk[:, None], mask=m_ok[None, :], other=0.0)
                acc_g = _mx_tile_dot(acc_g, w_base, s_base, pid_n * BN, k0, x_t, H, BN, BK, DEQUANT,
                                     TILE_MAJOR)
                acc_u = _mx_tile_dot(acc_u, w_base, s_base, pid_n * BN + INTER, k0, x_t, H, BN, BK,
                                     DEQUANT, TILE_MAJOR)
            dest = act_ptr + picks[None, :].to(tl.int64) * INTER + gate_rows[:, None]
            if (k_first == 0) & (k_last == NK):
                act = _swiglu(acc_g, acc_u, b_base, gate_rows, INTER, SWIGLU_LIMIT, HAS_BIAS, ACT, ALPHA)
                tl.store(dest, act.to(tl.bfloat16), mask=m_ok[None, :])
            else:
                piece = (_share_start(pid, W, PROGRAMS) < tile * NK).to(tl.int32)
                col0 = (cols - 0)[None, :] * 0
                part = part_ptr + (pid * 2 + piece) * (2 * BN) + rows_bn[:, None] + col0
                tl.store(part, acc_g, mask=m_ok[None, :])
                tl.store(part + BN, acc_u, mask=m_ok[None, :])
                j_first = _share_at(tile * NK, W, PROGRAMS)
                j_last = _share_at(tile * NK + NK - 1, W, PROGRAMS)
                if _last_of(ticket_ptr + tile, j_last - j_first + 1):
                    first_piece = (_share_start(j_first, W, PROGRAMS) < tile * NK).to(tl.int32)
                    first = part_ptr + (j_first * 2 + first_piece) * (2 * BN) + rows_bn[:, None] + col0
                    acc_g = tl.load(first, mask=m_ok[None, :], other=0.0, cache_modifier=".cg")
                    acc_u = tl.load(first + BN, mask=m_ok[None, :], other=0.0, cache_modifier=".cg")
                    for j in range(j_first + 1, j_last + 1):  # later shares start inside the tile
                        p = part_ptr + (j * 2) * (2 * BN) + rows_bn[:, None] + col0
                        acc_g += tl.load(p, mask=m_ok[None, :], other=0.0, cache_modifier=".cg")
                        acc_u += tl.load(p + BN, mask=m_ok[None, :], other=0.0, cache_modifier=".cg")
                    act = _swiglu(acc_g, acc_u, b_base, gate_rows, INTER, SWIGLU_LIMIT, HAS_BIAS, ACT,
                                  ALPHA)
                    tl.store(dest, act.to(tl.bfloat16), mask=m_ok[None, :])
        w = seg_hi


@triton.jit
def w2_stream_kernel(act_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr, y_ptr,
                     w_expert_stride, s_expert_stride,
                     ids_ptr, token_mask_ptr, part_ptr, ticket_ptr, E,
                     hot_b_ptr, cold_b_ptr, b_expert_stride,
                     weights_ptr, out_ptr, fin_ticket_ptr,
                     H: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DEQUANT: tl.constexpr,
                     TILE_MAJOR: tl.constexpr, PROGRAMS: tl.constexpr,
                     HAS_TOKEN_MASK: tl.constexpr = False, HAS_BIAS: tl.constexpr = False,
                     FUSE_FINALIZE: tl.constexpr = False, PDL: tl.constexpr = False):
    """``w2_kernel`` at T = 1 on a balanced grid (stream-K, above); partials
    ``part [PROGRAMS, 2, BN]`` fp32, one ticket per (pick, row tile) on ``ticket``.
    ``FUSE_FINALIZE``: each finished (pick, row tile) — stored, or skipped (counted by its K-step-0
    piece) — takes a ticket on ``fin_ticket[row tile]``; the last of the ``TOP_K`` runs
    ``w2_kernel``'s fused finalize (the same operations, so the same bits)."""
    _pdl_enter(PDL)
    NT: tl.constexpr = H // BN
    NK: tl.constexpr = INTER // BK
    W: tl.constexpr = TOP_K * NT * NK
    pid = tl.program_id(0)
    w = _share_start(pid, W, PROGRAMS)
    w_hi = _share_start(pid + 1, W, PROGRAMS)
    rows_bn = tl.arange(0, BN)
    cols = tl.arange(0, BM)
    while w < w_hi:
        tile = w // NK
        k_first = w - tile * NK
        seg_hi = tl.minimum(w_hi, (tile + 1) * NK)
        k_last = seg_hi - tile * NK
        slot = tile // NT
        pid_n = tile - slot * NT
        rows = pid_n * BN + rows_bn
        expert = tl.load(ids_ptr + slot).to(tl.int32)
        ok = (expert >= 0) & (expert < E)
        if HAS_TOKEN_MASK:
            ok = ok & (tl.load(token_mask_ptr) != 0)
        done = ((k_first == 0) & (ok == 0)).to(tl.int32)  # a skipped tile: done by its first piece
        if ok:
            w_base = _expert_base(codes_ptr, expert, hot_w_ptr, cold_w_ptr, w_expert_stride)
            s_base = _expert_base(codes_ptr, expert, hot_s_ptr, cold_s_ptr, s_expert_stride)
            picks = (slot + cols).to(tl.int64)
            m_ok = picks < slot + 1
            acc = tl.zeros((BN, BM), dtype=tl.float32)
            for k0 in range(k_first * BK, k_last * BK, BK):
                kk = k0 + tl.arange(0, BK)
                a_t = tl.load(act_ptr + picks[None, :] * INTER + kk[:, None], mask=m_ok[None, :], other=0.0)
                acc = _mx_tile_dot(acc, w_base, s_base, pid_n * BN, k0, a_t, INTER, BN, BK, DEQUANT,
                                   TILE_MAJOR)
            dest = y_ptr + picks[None, :] * H + rows[:, None]
            if (k_first == 0) & (k_last == NK):
                if HAS_BIAS:
                    b_row = tl.load(_expert_base(codes_ptr, expert, hot_b_ptr, cold_b_ptr, b_expert_stride) + rows)
                    acc += b_row.to(tl.float32)[:, None]
                tl.store(dest, acc.to(tl.bfloat16), mask=m_ok[None, :])
                done = done * 0 + 1
            else:
                piece = (_share_start(pid, W, PROGRAMS) < tile * NK).to(tl.int32)
                col0 = cols[None, :] * 0
                part = part_ptr + (pid * 2 + piece) * BN + rows_bn[:, None] + col0
                tl.store(part, acc, mask=m_ok[None, :])
                j_first = _share_at(tile * NK, W, PROGRAMS)
                j_last = _share_at(tile * NK + NK - 1, W, PROGRAMS)
                if _last_of(ticket_ptr + tile, j_last - j_first + 1):
                    first_piece = (_share_start(j_first, W, PROGRAMS) < tile * NK).to(tl.int32)
                    acc = tl.load(part_ptr + (j_first * 2 + first_piece) * BN + rows_bn[:, None] + col0,
                                  mask=m_ok[None, :], other=0.0, cache_modifier=".cg")
                    for j in range(j_first + 1, j_last + 1):
                        acc += tl.load(part_ptr + (j * 2) * BN + rows_bn[:, None] + col0,
                                       mask=m_ok[None, :], other=0.0, cache_modifier=".cg")
                    if HAS_BIAS:
                        b_row = tl.load(_expert_base(codes_ptr, expert, hot_b_ptr, cold_b_ptr,
                                                     b_expert_stride) + rows)
                        acc += b_row.to(tl.float32)[:, None]
                    tl.store(dest, acc.to(tl.bfloat16), mask=m_ok[None, :])
                    done = done * 0 + 1
        if FUSE_FINALIZE:
            if done != 0:
                if _last_of(fin_ticket_ptr + pid_n, TOP_K):
                    _finalize_rows(y_ptr, weights_ptr, ids_ptr, out_ptr, rows, E, H, TOP_K, BN)
        w = seg_hi
