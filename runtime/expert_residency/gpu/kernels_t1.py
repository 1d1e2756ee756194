"""The T = 1 expert kernels: warp-level tensor-core MMA on the MMA-order layout (launch logic in
``gpu.experts``; the other kernels and the layout in ``gpu.kernels`` and ``gpu.layout``).

At T = 1 every weight is used once, so what decides the layer's time is how many instructions
and how much waiting each weight costs, not the tensor cores' throughput. ``tl.dot`` lowers to
wgmma on sm_90: a shared-memory B operand, a descriptor, a fence and a wait around every
instruction, and every warp of a program synchronised at each K step. These kernels issue
``mma.sync.m16n8k16`` (sm_80+) from inline PTX instead, one per 32-bit word of the layout: the
word's four decoded bf16x2 registers *are* that instruction's A fragment (rows g and g + 8,
values 2q.. and 2q + 8..), so every operand is a register of the thread that loaded it — 16
contiguous bytes of weights per thread and K half-step, no shared memory, no barrier, and each
warp runs on its own. The token is the B fragment: every lane loads its four bf16 pairs of each
half-step from the input row (L1-resident; the same in all eight columns, of which the epilogue
keeps one), so no launch prepares it.

A program owns one row tile of one pick (the grid of ``w13_swiglu_kernel`` / ``w2_kernel`` at
T = 1) on ``4 * KSPLIT`` warps: warpgroup ``G`` takes the tile's 64-value K half-steps ``G,
G + KSPLIT, ...`` with the weights of its next four half-steps in flight in registers; each warp
accumulates in ``CHAINS`` independent MMA chains (so an MMA rarely waits for the one before),
added at the end in a fixed order, then the ``KSPLIT`` partial sums in group order. The w2 launch
issues its first weight loads before it waits for w13 (programmatic dependent launch): the
weights, the routing and the row map are not what w13 writes. The arithmetic of a pick depends
on the geometry, ``KSPLIT`` and ``CHAINS`` only — never on the bank its expert lives in (both
banks go through the same loads), on the other picks or on timing — so the split layer stays
bit-identical to the unsplit one. The counter, the token mask, skipped picks (ids outside ``0..E-1`` add
``fma(0, 0, acc)``), expert biases, both activations and the fused finalize behave exactly as in
``gpu.kernels``' T = 1 schedule, through the same helpers.

``t1_fused_kernel`` (``KernelConfig.t1_fused``, off) runs a T = 1 layer's w13 and w2 items in one
launch through the same per-tile helpers (``_w13_t1_tile``, ``_w2_t1_tile``), each pick's w2 tiles
waiting on a count its w13 tiles raise.

GPU only: Triton's interpreter cannot run inline PTX, so under ``TRITON_INTERPRET=1`` the launch
logic takes ``gpu.kernels``' T = 1 schedule (``gpu.experts``).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.target_info import cuda_capability_geq

from .kernels import (
    _bf16x2_scale,
    _expert_base,
    _finalize_rows,
    _glu,
    _last_of_split,
    _one_token_pick,
    _pdl_enter,
    word_decode_ptx,
)

# Words (16 bytes) per thread and K half-step, threads per warpgroup, and the layout's blocks:
# one (row-rep, half-step) block is 128 threads x 16 bytes of words = 512 int32, and 128 scale
# bytes = 32 int32 (``gpu.kernels._load_mma_tile``).
_BLOCK_WORDS: tl.constexpr = tl.constexpr(512)
_BLOCK_SCALE_WORDS: tl.constexpr = tl.constexpr(32)


def _row_mma_asm(sm90: bool, chains: int) -> str:
    """Decode the thread's four words and issue their four m16n8k16 MMAs, word ``i`` accumulating
    into chain ``i % chains`` (independent chains: an MMA need not wait for the previous one's
    result). Operands (pack = 4, one register per element), with ``C = chains``: ``$0 ..
    $(4C-1)`` the chains' accumulators out; then the words, the multipliers of rows g and of rows
    g + 8 for each word, the B registers b0 and b1 for each word (four each), and the chains'
    accumulators in."""
    c = chains
    words, m_lo, m_hi, b0, b1, acc_in = (4 * c + 4 * n for n in range(6))
    regs = ".reg .b32 a0, a1, a2, a3, t, u;\n.reg .b32 " + ", ".join(f"c{r}" for r in range(4 * c)) + ";"
    if not sm90:
        regs += "\n.reg .b32 nz;\nmov.b32 nz, 0x80008000;"
    body = [f"mov.b32 c{r}, ${acc_in + r};" for r in range(4 * c)]
    for i in range(4):
        d = ", ".join(f"c{4 * (i % c) + e}" for e in range(4))
        body.append(word_decode_ptx(f"${words + i}", f"${m_lo + i}", f"${m_hi + i}", ("a0", "a1", "a2", "a3"),
                                    sm90))
        body.append(f"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{d}}}, {{a0, a1, a2, a3}}, "
                    f"{{${b0 + i}, ${b1 + i}}}, {{{d}}};")
    body += [f"mov.b32 ${r}, c{r};" for r in range(4 * c)]
    return "{\n" + regs + "\n" + "\n".join(body) + "\n}"


def _constraints(chains: int) -> str:
    return ",".join(["=r"] * 4 * chains + ["r"] * 4 * (5 + chains))


_ROW_MMA_SM90: tl.constexpr = tl.constexpr(_row_mma_asm(True, 1))
_ROW_MMA_SM80: tl.constexpr = tl.constexpr(_row_mma_asm(False, 1))
_ROW_MMA2_SM90: tl.constexpr = tl.constexpr(_row_mma_asm(True, 2))
_ROW_MMA2_SM80: tl.constexpr = tl.constexpr(_row_mma_asm(False, 2))
_ROW_MMA4_SM90: tl.constexpr = tl.constexpr(_row_mma_asm(True, 4))
_ROW_MMA4_SM80: tl.constexpr = tl.constexpr(_row_mma_asm(False, 4))
_ROW_MMA_CONSTRAINTS: tl.constexpr = tl.constexpr(_constraints(1))
_ROW_MMA2_CONSTRAINTS: tl.constexpr = tl.constexpr(_constraints(2))
_ROW_MMA4_CONSTRAINTS: tl.constexpr = tl.constexpr(_constraints(4))


@triton.jit
def _row_mma(words, m_lo, m_hi, b0, b1, c0, c1, c2, c3, CHAINS: tl.constexpr):
    """``_row_mma_asm`` on the accumulator chains ``c0 ..`` (the first ``CHAINS`` are used)."""
    if CHAINS == 1:
        if cuda_capability_geq(9):
            c0 = tl.inline_asm_elementwise(_ROW_MMA_SM90, _ROW_MMA_CONSTRAINTS, [words, m_lo, m_hi, b0, b1, c0],
                                           dtype=tl.float32, is_pure=True, pack=4)
        else:
            c0 = tl.inline_asm_elementwise(_ROW_MMA_SM80, _ROW_MMA_CONSTRAINTS, [words, m_lo, m_hi, b0, b1, c0],
                                           dtype=tl.float32, is_pure=True, pack=4)
    elif CHAINS == 2:
        if cuda_capability_geq(9):
            c0, c1 = tl.inline_asm_elementwise(_ROW_MMA2_SM90, _ROW_MMA2_CONSTRAINTS,
                                               [words, m_lo, m_hi, b0, b1, c0, c1],
                                               dtype=(tl.float32, tl.float32), is_pure=True, pack=4)
        else:
            c0, c1 = tl.inline_asm_elementwise(_ROW_MMA2_SM80, _ROW_MMA2_CONSTRAINTS,
                                               [words, m_lo, m_hi, b0, b1, c0, c1],
                                               dtype=(tl.float32, tl.float32), is_pure=True, pack=4)
    else:
        if cuda_capability_geq(9):
            c0, c1, c2, c3 = tl.inline_asm_elementwise(_ROW_MMA4_SM90, _ROW_MMA4_CONSTRAINTS,
                                                       [words, m_lo, m_hi, b0, b1, c0, c1, c2, c3],
                                                       dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
                                                       is_pure=True, pack=4)
        else:
            c0, c1, c2, c3 = tl.inline_asm_elementwise(_ROW_MMA4_SM80, _ROW_MMA4_CONSTRAINTS,
                                                       [words, m_lo, m_hi, b0, b1, c0, c1, c2, c3],
                                                       dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
                                                       is_pure=True, pack=4)
    return c0, c1, c2, c3


@triton.jit
def _mma_half(c0, c1, c2, c3, words, scale_word, b0, b1, j, CHAINS: tl.constexpr):
    """One K half-step of one 64-row rep: ``scale_word [N, 1]`` holds the thread's four ue8m0
    bytes ``(b0, h)``; word ``j = (b0, c)`` takes byte ``(b0, 0)`` for rows g and ``(b0, 1)`` for
    rows g + 8, as bf16x2 ``2^(s-1)`` (``gpu.kernels``: the E2M1 bias folded into the scale)."""
    shift = (j // 2) * 16
    m_lo = _bf16x2_scale((scale_word >> shift) & 0xFF)
    m_hi = _bf16x2_scale((scale_word >> (shift + 8)) & 0xFF)
    return _row_mma(words, m_lo, m_hi, b0, b1, c0, c1, c2, c3, CHAINS)


@triton.jit
def _fetch(w_base, s_base, h, a_w, b_w, a_s, b_s, w_off, s_off, BH: tl.constexpr, STEP_W: tl.constexpr,
           STEP_S: tl.constexpr, TWO: tl.constexpr):
    """Weights of half-step ``h`` (K step ``h // BH``, half ``h % BH``; per thread): stream A's
    (and with ``TWO`` stream B's) words and scale word. ``a_*`` / ``b_*``: the streams' first
    block, in int32 units."""
    w_at = (h // BH) * STEP_W + (h % BH) * _BLOCK_WORDS + w_off
    s_at = (h // BH) * STEP_S + (h % BH) * _BLOCK_SCALE_WORDS + s_off
    wa = tl.load(w_base + a_w + w_at)
    sa = tl.load(s_base + a_s + s_at)
    if TWO:
        wb = tl.load(w_base + b_w + w_at)
        sb = tl.load(s_base + b_s + s_at)
    else:
        wb = wa
        sb = sa
    return wa, sa, wb, sb


@triton.jit
def _load_x(ptr, ASM: tl.constexpr):
    """The input row's bf16 pairs at ``ptr``: ``tl.load``, or with ``ASM`` the same global load
    (``ld.global.b32``, as ``tl.load`` emits it; no ``.nc``, the row may be the previous launch's
    output under programmatic dependent launch) in inline PTX, which Triton's software pipeliner
    leaves alone, so the row stays an L1 read instead of taking a shared-memory stage beside the
    weights."""
    if ASM:
        return tl.inline_asm_elementwise("ld.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                         is_pure=True, pack=1)
    else:
        return tl.load(ptr)


@triton.jit
def _step(a0, a1, a2, a3, b0, b1, b2, b3, wa, sa, wb, sb, x_pairs, h, x_off, j, BH: tl.constexpr,
          TWO: tl.constexpr, CHAINS: tl.constexpr, ASM_X: tl.constexpr = False):
    """Half-step ``h`` of both streams: the input row's B registers b0 / b1 (its bf16 pairs; L1
    reads, the row is small and every warp reads it), then the MMAs. (Loading them a half-step
    ahead measured the same on the H200: 45.0 vs 45.3 us per layer.)"""
    xb = x_pairs + (h // BH) * (32 * BH) + (h % BH) * 32
    x0 = _load_x(xb + x_off, ASM_X)
    x1 = _load_x(xb + x_off + 4, ASM_X)
    a0, a1, a2, a3 = _mma_half(a0, a1, a2, a3, wa, sa, x0, x1, j, CHAINS)
    if TWO:
        b0, b1, b2, b3 = _mma_half(b0, b1, b2, b3, wb, sb, x0, x1, j, CHAINS)
    return a0, a1, a2, a3, b0, b1, b2, b3


@triton.jit
def _ring_step(a0, a1, a2, a3, b0, b1, b2, b3, wa, sa, wb, sb, x_pairs, h, x_off, j, nxt,
               w_base, s_base, a_w, b_w, a_s, b_s, w_off, s_off, BH: tl.constexpr, STEP_W: tl.constexpr,
               STEP_S: tl.constexpr, TWO: tl.constexpr, CHAINS: tl.constexpr, REFILL: tl.constexpr):
    """One set of the ring: half-step ``h``'s MMAs on its weights (``_step``), then, with
    ``REFILL``, the set refilled with half-step ``nxt``."""
    a0, a1, a2, a3, b0, b1, b2, b3 = _step(a0, a1, a2, a3, b0, b1, b2, b3, wa, sa, wb, sb, x_pairs, h, x_off, j,
                                           BH, TWO, CHAINS)
    if REFILL:
        wa, sa, wb, sb = _fetch(w_base, s_base, nxt, a_w, b_w, a_s, b_s, w_off, s_off, BH, STEP_W, STEP_S, TWO)
    return a0, a1, a2, a3, b0, b1, b2, b3, wa, sa, wb, sb


@triton.jit
def _thread_offsets(KSPLIT: tl.constexpr, x_row):
    """Per thread of ``128 * KSPLIT`` (``[N, 1]``) and accumulator element ``j`` (``[1, 4]``): its
    warpgroup, and its offsets (int32 units) into a half-step's weight block, scale words and
    input row."""
    tid = tl.arange(0, 128 * KSPLIT)[:, None]
    j = tl.arange(0, 4)[None, :]
    t = tid % 128
    lane = t % 32
    w_off = t * 4 + j                          # the thread's 16 bytes of a block
    s_off = (t // 32) * 8 + lane // 4          # its rows' 4 scale bytes (b0, h)
    x_off = 8 * j + lane % 4 + x_row           # pair 2q.. of word j's k16 chunk (b1: +4 pairs)
    return j, tid // 128, w_off, s_off, x_off


@triton.jit
def _wait_until(ptr, target):
    """Spin until the int32 at ``ptr`` reaches ``target``: polled with volatile loads and a short
    sleep between polls (an acquire load invalidates the SM's L1, where co-resident programs keep
    their input row, so it is not what polls), then one acquire load (GPU scope: what was stored
    before the releases that raised the count is visible after)."""
    while tl.load(ptr, volatile=True) < target:
        tl.inline_asm_elementwise("nanosleep.u32 64;\nmov.u32 $0, 0;", "=r,r", [target], dtype=tl.int32,
                                  is_pure=False, pack=1)
    # The acquire, once (a loop so that its value is used: the count only grows until every w2 tile
    # of the pick, this one included, is past its wait).
    while tl.atomic_add(ptr, 0, sem="acquire", scope="gpu") < target:
        pass


@triton.jit
def _warp_mma_rows(x_pairs, w_base, s_base, a_w, b_w, a_s, b_s, HALVES: tl.constexpr, BH: tl.constexpr,
                   STEP_W: tl.constexpr, STEP_S: tl.constexpr, KSPLIT: tl.constexpr, TWO: tl.constexpr,
                   CHAINS: tl.constexpr, PDL_AFTER_PROLOGUE: tl.constexpr = False, UNROLL: tl.constexpr = 8,
                   x_row=0, SMEM_STAGES: tl.constexpr = 0, ready_ptr=0, ready_target=0,
                   WAIT_READY: tl.constexpr = False):
    """fp32 fragments ``[128, 4]`` (thread ``t`` of the tile's warpgroup, accumulator element
    ``j``: row ``16 * (t // 32) + (t % 32) // 4 + 8 * (j // 2)`` of the rep, the token in every
    column) of stream A (and B) times the input row over ``HALVES`` K half-steps, the
    warpgroups' partial sums added in group order. ``PDL_AFTER_PROLOGUE``: ``_pdl_enter`` after
    the first four half-steps' weight loads are issued (they then overlap the previous kernel's
    tail; only for weights that no in-flight kernel writes) and before the input row is read.
    ``UNROLL``: half-steps per loop trip (a multiple of 4). ``x_row``: 0 (every lane reads the row
    at ``x_pairs``), or int32 ``[128 * KSPLIT, 1]`` per-thread offsets (in bf16 pairs) of the row
    its B column reads (``_gw_b_rows``: up to eight tokens, one per column). ``SMEM_STAGES``
    (0: the register ring below): the weights instead reach the MMAs through Triton's software
    pipeline, ``SMEM_STAGES`` shared-memory stages of ``UNROLL`` half-steps each (asynchronous
    copies, ``SMEM_STAGES - 1`` loop trips ahead), the input row through plain loads; the same
    MMAs in the same order, so the same bits. ``WAIT_READY``: after the first four half-steps'
    weight loads are issued, wait until the int32 at ``ready_ptr`` reaches ``ready_target``
    (``_wait_until``) before the input row is read (``t1_fused_kernel``'s w2 items)."""
    if SMEM_STAGES > 0:
        return _warp_mma_rows_pipelined(x_pairs, w_base, s_base, a_w, b_w, a_s, b_s, HALVES, BH, STEP_W, STEP_S,
                                        KSPLIT, TWO, CHAINS, PDL_AFTER_PROLOGUE, UNROLL, x_row, SMEM_STAGES)
    j, grp, w_off, s_off, x_off = _thread_offsets(KSPLIT, x_row)
    ITERS: tl.constexpr = HALVES // KSPLIT     # this warpgroup's half-steps: i * KSPLIT + grp
    LAST: tl.constexpr = ITERS - 1
    a0 = tl.zeros((128 * KSPLIT, 4), dtype=tl.float32)
    a1, a2, a3, b0, b1, b2, b3 = a0, a0, a0, a0, a0, a0, a0
    # Four half-steps of weights in flight (sets 0..3, a ring): each set is refilled right after
    # its MMAs with the half-step four ahead, so the loop (unrolled by a multiple of four) moves no
    # registers.
    # Past the end the last half-step is fetched again (in bounds, unused).
    w0a, s0a, w0b, s0b = _fetch(w_base, s_base, grp, a_w, b_w, a_s, b_s, w_off, s_off, BH, STEP_W, STEP_S, TWO)
    w1a, s1a, w1b, s1b = _fetch(w_base, s_base, tl.minimum(1, LAST) * KSPLIT + grp, a_w, b_w, a_s, b_s, w_off,
                                s_off, BH, STEP_W, STEP_S, TWO)
    w2a, s2a, w2b, s2b = _fetch(w_base, s_base, tl.minimum(2, LAST) * KSPLIT + grp, a_w, b_w, a_s, b_s, w_off,
                                s_off, BH, STEP_W, STEP_S, TWO)
    w3a, s3a, w3b, s3b = _fetch(w_base, s_base, tl.minimum(3, LAST) * KSPLIT + grp, a_w, b_w, a_s, b_s, w_off,
                                s_off, BH, STEP_W, STEP_S, TWO)
    _pdl_enter(PDL_AFTER_PROLOGUE)
    if WAIT_READY:
        _wait_until(ready_ptr, ready_target)
    # UNROLL half-steps per loop trip. ptxas issues the refills that the next trip consumes
    # (loop-carried) after the trip's last MMA, so each trip starts by waiting for them; the
    # refills consumed later in the same trip it issues early. Longer trips make that wait rarer.
    # Set s % 4 holds half-step s; after its MMAs it is refilled with half-step s + 4.
    for i in range(0, ITERS - (UNROLL - 1), UNROLL):
        for s in tl.static_range(UNROLL):
            h = (i + s) * KSPLIT + grp
            nxt = tl.minimum(i + s + 4, LAST) * KSPLIT + grp
            if s % 4 == 0:
                a0, a1, a2, a3, b0, b1, b2, b3, w0a, s0a, w0b, s0b = _ring_step(
                    a0, a1, a2, a3, b0, b1, b2, b3, w0a, s0a, w0b, s0b, x_pairs, h, x_off, j, nxt,
                    w_base, s_base, a_w, b_w, a_s, b_s, w_off, s_off, BH, STEP_W, STEP_S, TWO, CHAINS, True)
            elif s % 4 == 1:
                a0, a1, a2, a3, b0, b1, b2, b3, w1a, s1a, w1b, s1b = _ring_step(
                    a0, a1, a2, a3, b0, b1, b2, b3, w1a, s1a, w1b, s1b, x_pairs, h, x_off, j, nxt,
                    w_base, s_base, a_w, b_w, a_s, b_s, w_off, s_off, BH, STEP_W, STEP_S, TWO, CHAINS, True)
            elif s % 4 == 2:
                a0, a1, a2, a3, b0, b1, b2, b3, w2a, s2a, w2b, s2b = _ring_step(
                    a0, a1, a2, a3, b0, b1, b2, b3, w2a, s2a, w2b, s2b, x_pairs, h, x_off, j, nxt,
                    w_base, s_base, a_w, b_w, a_s, b_s, w_off, s_off, BH, STEP_W, STEP_S, TWO, CHAINS, True)
            else:
                a0, a1, a2, a3, b0, b1, b2, b3, w3a, s3a, w3b, s3b = _ring_step(
                    a0, a1, a2, a3, b0, b1, b2, b3, w3a, s3a, w3b, s3b, x_pairs, h, x_off, j, nxt,
                    w_base, s_base, a_w, b_w, a_s, b_s, w_off, s_off, BH, STEP_W, STEP_S, TWO, CHAINS, True)
    # The last ITERS % UNROLL half-steps, straight-line; the first four sit in the sets already.
    REST: tl.constexpr = ITERS % UNROLL
    for s in tl.static_range(REST):
        h = (ITERS - REST + s) * KSPLIT + grp
        nxt = (ITERS - REST + s + 4) * KSPLIT + grp
        if s % 4 == 0:
            a0, a1, a2, a3, b0, b1, b2, b3, w0a, s0a, w0b, s0b = _ring_step(
                a0, a1, a2, a3, b0, b1, b2, b3, w0a, s0a, w0b, s0b, x_pairs, h, x_off, j, nxt,
                w_base, s_base, a_w, b_w, a_s, b_s, w_off, s_off, BH, STEP_W, STEP_S, TWO, CHAINS, s + 4 < REST)
        elif s % 4 == 1:
            a0, a1, a2, a3, b0, b1, b2, b3, w1a, s1a, w1b, s1b = _ring_step(
                a0, a1, a2, a3, b0, b1, b2, b3, w1a, s1a, w1b, s1b, x_pairs, h, x_off, j, nxt,
                w_base, s_base, a_w, b_w, a_s, b_s, w_off, s_off, BH, STEP_W, STEP_S, TWO, CHAINS, s + 4 < REST)
        elif s % 4 == 2:
            a0, a1, a2, a3, b0, b1, b2, b3, w2a, s2a, w2b, s2b = _ring_step(
                a0, a1, a2, a3, b0, b1, b2, b3, w2a, s2a, w2b, s2b, x_pairs, h, x_off, j, nxt,
                w_base, s_base, a_w, b_w, a_s, b_s, w_off, s_off, BH, STEP_W, STEP_S, TWO, CHAINS, s + 4 < REST)
        else:
            a0, a1, a2, a3, b0, b1, b2, b3, w3a, s3a, w3b, s3b = _ring_step(
                a0, a1, a2, a3, b0, b1, b2, b3, w3a, s3a, w3b, s3b, x_pairs, h, x_off, j, nxt,
                w_base, s_base, a_w, b_w, a_s, b_s, w_off, s_off, BH, STEP_W, STEP_S, TWO, CHAINS, s + 4 < REST)
    return _finish(a0, a1, a2, a3, b0, b1, b2, b3, KSPLIT, CHAINS)


@triton.jit
def _warp_mma_rows_pipelined(x_pairs, w_base, s_base, a_w, b_w, a_s, b_s, HALVES: tl.constexpr, BH: tl.constexpr,
                             STEP_W: tl.constexpr, STEP_S: tl.constexpr, KSPLIT: tl.constexpr, TWO: tl.constexpr,
                             CHAINS: tl.constexpr, PDL_AFTER_PROLOGUE: tl.constexpr, UNROLL: tl.constexpr,
                             x_row, SMEM_STAGES: tl.constexpr):
    """``_warp_mma_rows`` with ``SMEM_STAGES``: a loop of ``UNROLL`` half-steps per trip whose
    weight and scale loads Triton turns into asynchronous copies into a ring of shared-memory
    stages (the register ring keeps four half-steps in flight per thread; this keeps
    ``(SMEM_STAGES - 1) * UNROLL``, in shared memory, at the price of a shared-memory read per
    load and the copies' bookkeeping). The last ``ITERS % UNROLL`` half-steps run straight-line."""
    j, grp, w_off, s_off, x_off = _thread_offsets(KSPLIT, x_row)
    ITERS: tl.constexpr = HALVES // KSPLIT
    a0 = tl.zeros((128 * KSPLIT, 4), dtype=tl.float32)
    a1, a2, a3, b0, b1, b2, b3 = a0, a0, a0, a0, a0, a0, a0
    # Triton issues the pipeline's first copies where the loop starts, after this point, so the
    # wait for the previous kernel (whose output may be the input row) comes before any weight
    # read; the register ring issues its first four half-steps of weights before it.
    _pdl_enter(PDL_AFTER_PROLOGUE)
    for i in tl.range(0, ITERS - (UNROLL - 1), UNROLL, num_stages=SMEM_STAGES):
        for s in tl.static_range(UNROLL):
            h = (i + s) * KSPLIT + grp
            wa, sa, wb, sb = _fetch(w_base, s_base, h, a_w, b_w, a_s, b_s, w_off, s_off, BH, STEP_W, STEP_S, TWO)
            a0, a1, a2, a3, b0, b1, b2, b3 = _step(a0, a1, a2, a3, b0, b1, b2, b3, wa, sa, wb, sb, x_pairs, h,
                                                   x_off, j, BH, TWO, CHAINS, True)
    REST: tl.constexpr = ITERS % UNROLL
    for s in tl.static_range(REST):
        h = (ITERS - REST + s) * KSPLIT + grp
        wa, sa, wb, sb = _fetch(w_base, s_base, h, a_w, b_w, a_s, b_s, w_off, s_off, BH, STEP_W, STEP_S, TWO)
        a0, a1, a2, a3, b0, b1, b2, b3 = _step(a0, a1, a2, a3, b0, b1, b2, b3, wa, sa, wb, sb, x_pairs, h,
                                               x_off, j, BH, TWO, CHAINS, True)
    return _finish(a0, a1, a2, a3, b0, b1, b2, b3, KSPLIT, CHAINS)


@triton.jit
def _finish(a0, a1, a2, a3, b0, b1, b2, b3, KSPLIT: tl.constexpr, CHAINS: tl.constexpr):
    """Both streams' chains summed (``_chain_sum``), then the warpgroups' partials in group order."""
    acc_a = _chain_sum(a0, a1, a2, a3, CHAINS)
    acc_b = _chain_sum(b0, b1, b2, b3, CHAINS)
    if KSPLIT > 1:
        acc_a = tl.sum(tl.reshape(acc_a, (KSPLIT, 128, 4)), axis=0)
        acc_b = tl.sum(tl.reshape(acc_b, (KSPLIT, 128, 4)), axis=0)
    return acc_a, acc_b


@triton.jit
def _chain_sum(c0, c1, c2, c3, CHAINS: tl.constexpr):
    """The chains' fp32 sum in a fixed order: ``c0``; ``c0 + c1``; ``(c0 + c1) + (c2 + c3)``."""
    if CHAINS == 1:
        return c0
    elif CHAINS == 2:
        return c0 + c1
    else:
        return (c0 + c1) + (c2 + c3)


@triton.jit
def _fragment_rows():
    """Row within a 64-row rep of each ``[128, 4]`` fragment element, and the elements stored
    (lane q = 0, even j: each row once)."""
    t = tl.arange(0, 128)[:, None]
    j = tl.arange(0, 4)[None, :]
    rows = 16 * (t // 32) + (t % 32) // 4 + 8 * (j // 2)
    return rows, ((t % 4) == 0) & ((j % 2) == 0)


@triton.jit
def w13_t1_kernel(x_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr, act_ptr,
                  counts_ptr, tokens_ptr, w_expert_stride, s_expert_stride, ids_ptr, token_mask_ptr, E,
                  hot_b_ptr, cold_b_ptr, b_expert_stride,
                  H: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, BK: tl.constexpr,
                  KSPLIT: tl.constexpr, COUNT: tl.constexpr, CHAINS: tl.constexpr = 1,
                  HAS_TOKEN_MASK: tl.constexpr = False,
                  SWIGLU_LIMIT: tl.constexpr = 0.0, HAS_BIAS: tl.constexpr = False, ACT: tl.constexpr = 0,
                  ALPHA: tl.constexpr = 1.0, PDL: tl.constexpr = False, UNROLL: tl.constexpr = 8,
                  BN1: tl.constexpr = 64, SMEM_STAGES: tl.constexpr = 0):
    """``act[p, rows] = bf16(glu(gate . x, up . x))`` for 64 rows ``64 * program_id(0) + ...`` of
    pick ``p = program_id(1)`` (``w13_swiglu_kernel`` with ``ONE_TOKEN``, same counter/mask/bias/
    activation semantics). ``BN1``: the layout's w13 tile rows (64 or 128); a 64-row program of a
    128-row tile reads rep ``program_id(0) % 2`` of it (the blocks after rep 0's in each K step)."""
    _pdl_enter(PDL)
    pid_n = tl.program_id(0)
    slot = tl.program_id(1)
    expert, ok = _one_token_pick(ids_ptr, token_mask_ptr, tokens_ptr, slot, E, (pid_n == 0) & (slot == 0),
                                 TOP_K, HAS_TOKEN_MASK, COUNT)
    if ok == 0:
        return
    if COUNT:
        if pid_n == 0:
            tl.atomic_add(counts_ptr + expert, 1)
    _w13_t1_tile(x_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr, act_ptr, w_expert_stride,
                 s_expert_stride, hot_b_ptr, cold_b_ptr, b_expert_stride, expert, slot, pid_n, H, INTER, BK, KSPLIT,
                 CHAINS, SWIGLU_LIMIT, HAS_BIAS, ACT, ALPHA, UNROLL, BN1, SMEM_STAGES)


@triton.jit
def _w13_t1_tile(x_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr, act_ptr, w_expert_stride,
                 s_expert_stride, hot_b_ptr, cold_b_ptr, b_expert_stride, expert, slot, pid_n, H: tl.constexpr,
                 INTER: tl.constexpr, BK: tl.constexpr, KSPLIT: tl.constexpr, CHAINS: tl.constexpr,
                 SWIGLU_LIMIT: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, ALPHA: tl.constexpr,
                 UNROLL: tl.constexpr, BN1: tl.constexpr, SMEM_STAGES: tl.constexpr):
    """``w13_t1_kernel``'s work for one computed pick (``slot``, expert ``expert``) and 64-row tile
    ``pid_n``: the activation rows, stored."""
    i32 = tl.pointer_type(tl.int32)
    w_base = _expert_base(codes_ptr, expert, hot_w_ptr, cold_w_ptr, w_expert_stride).to(i32)
    s_base = _expert_base(codes_ptr, expert, hot_s_ptr, cold_s_ptr, s_expert_stride).to(i32)
    NK: tl.constexpr = H // BK
    STEP_W: tl.constexpr = BN1 * BK // 8       # int32 per BN1 x BK tile (BN1 * BK / 2 bytes)
    STEP_S: tl.constexpr = BN1 * BK // 128
    BH: tl.constexpr = BK // 64
    REPS: tl.constexpr = BN1 // 64
    gate = pid_n // REPS                       # the gate rows' tile row
    up = (INTER // 64 + pid_n) // REPS         # the up rows' tile row, after all gate tiles
    r = pid_n % REPS                           # the 64-row rep inside both
    acc_g, acc_u = _warp_mma_rows(x_ptr.to(i32), w_base, s_base, gate * NK * STEP_W + r * BH * _BLOCK_WORDS,
                                  up * NK * STEP_W + r * BH * _BLOCK_WORDS,
                                  gate * NK * STEP_S + r * BH * _BLOCK_SCALE_WORDS,
                                  up * NK * STEP_S + r * BH * _BLOCK_SCALE_WORDS, NK * BH, BH,
                                  STEP_W, STEP_S, KSPLIT, True, CHAINS, UNROLL=UNROLL, SMEM_STAGES=SMEM_STAGES)
    rows, keep = _fragment_rows()
    rows += pid_n * 64
    if HAS_BIAS:
        b_base = _expert_base(codes_ptr, expert, hot_b_ptr, cold_b_ptr, b_expert_stride)
        acc_g += tl.load(b_base + rows).to(tl.float32)
        acc_u += tl.load(b_base + INTER + rows).to(tl.float32)
    act = _glu(acc_g, acc_u, SWIGLU_LIMIT, ACT, ALPHA)
    tl.store(act_ptr + slot * INTER + rows, act.to(tl.bfloat16), mask=keep)


@triton.jit
def w2_t1_kernel(act_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr, y_ptr,
                 w_expert_stride, s_expert_stride, ids_ptr, token_mask_ptr, E,
                 hot_b_ptr, cold_b_ptr, b_expert_stride, weights_ptr, out_ptr, fin_ticket_ptr,
                 H: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, KSPLIT: tl.constexpr, CHAINS: tl.constexpr = 1,
                 HAS_TOKEN_MASK: tl.constexpr = False,
                 HAS_BIAS: tl.constexpr = False, FUSE_FINALIZE: tl.constexpr = False,
                 PDL: tl.constexpr = False, UNROLL: tl.constexpr = 8, SMEM_STAGES: tl.constexpr = 0):
    """``y[p, rows] = bf16(w2_rows . act_p (+ b2))`` for the ``BN`` (64 or 128) rows of row tile
    ``program_id(0)`` of pick ``p = program_id(1)``; ``FUSE_FINALIZE``: as ``w2_kernel``'s — every
    program of a row tile (skipped picks included) takes a ticket after its store, the last adds
    the token's rows in router order (``_finalize_rows``).

    ``PDL``: the routing, the row map and the weights are not written by the w13 launch this one
    follows (ids and mask were complete before w13 passed its own wait, which precedes the launch
    of this one), so a computed pick issues its first weight loads before it waits (``_pdl_enter``)
    for w13's activation rows; a skipped one waits first."""
    pid_n = tl.program_id(0)
    slot = tl.program_id(1)
    expert, ok = _one_token_pick(ids_ptr, token_mask_ptr, ids_ptr, slot, E, False, TOP_K, HAS_TOKEN_MASK,
                                 False)
    if ok == 0:
        _pdl_enter(PDL)
    if not FUSE_FINALIZE:
        if ok == 0:
            return
    if ok:
        _w2_t1_tile(act_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr, y_ptr, w_expert_stride,
                    s_expert_stride, hot_b_ptr, cold_b_ptr, b_expert_stride, expert, slot, pid_n, H, INTER, BN, BK,
                    KSPLIT, CHAINS, HAS_BIAS, PDL, UNROLL, SMEM_STAGES)
    if FUSE_FINALIZE:
        if _last_of_split(fin_ticket_ptr + pid_n, TOP_K):
            _finalize_rows(y_ptr, weights_ptr, ids_ptr, out_ptr, pid_n * BN + tl.arange(0, BN), E, H, TOP_K, BN)


@triton.jit
def t1_fused_kernel(x_ptr, codes_ptr, hot13_w_ptr, hot13_s_ptr, cold13_w_ptr, cold13_s_ptr,
                    hot2_w_ptr, hot2_s_ptr, cold2_w_ptr, cold2_s_ptr, act_ptr, y_ptr, counts_ptr, tokens_ptr,
                    w13_expert_stride, s13_expert_stride, w2_expert_stride, s2_expert_stride, ids_ptr,
                    token_mask_ptr, E, hot13_b_ptr, cold13_b_ptr, b13_expert_stride, hot2_b_ptr, cold2_b_ptr,
                    b2_expert_stride, weights_ptr, out_ptr, fin_ticket_ptr, ready_ptr, seen_ptr,
                    H: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, BK1: tl.constexpr,
                    BN2: tl.constexpr, BK2: tl.constexpr, KSPLIT: tl.constexpr, CHAINS1: tl.constexpr,
                    CHAINS2: tl.constexpr, COUNT: tl.constexpr, HAS_TOKEN_MASK: tl.constexpr = False,
                    SWIGLU_LIMIT: tl.constexpr = 0.0, HAS_BIAS: tl.constexpr = False, ACT: tl.constexpr = 0,
                    ALPHA: tl.constexpr = 1.0, PDL: tl.constexpr = False, UNROLL1: tl.constexpr = 8,
                    UNROLL2: tl.constexpr = 8, BN1: tl.constexpr = 64):
    """The T = 1 layer in one launch: ``w13_t1_kernel``'s (pick, 64-row tile) items, then
    ``w2_t1_kernel``'s (pick, row tile) items with its fused finalize, walked ``num_programs`` apart by
    a grid that fits the GPU at once (every program resident: a w2 item waits on other programs).

    A w13 item stores its activation rows, then adds 1 to its pick's ``ready`` count (release,
    after a barrier over the program's stores). A w2 item issues its first four half-steps of
    weights, waits until its pick's count reaches ``INTER // 64`` (every tile of that pick's
    activation row stored; ``_warp_mma_rows`` with ``WAIT_READY``) and goes on as ``w2_t1_kernel``
    does; so a pick's w2 tiles start as soon as its own w13 tiles are done, with no launch between.
    The last w2 item of a pick to pass its wait (a ``seen`` count) puts both counts back to 0 for
    the next launch. Each item runs the separate kernels' arithmetic, so the bits are theirs. Skipped
    picks (ids outside ``0..E-1``, masked tokens) are neither computed nor waited on; they take
    their finalize tickets as in ``w2_t1_kernel``."""
    _pdl_enter(PDL)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    NT13: tl.constexpr = INTER // 64
    NT2: tl.constexpr = H // BN2
    for item in range(pid, NT13 * TOP_K, programs):
        pid_n = item % NT13
        slot = item // NT13
        expert, ok = _one_token_pick(ids_ptr, token_mask_ptr, tokens_ptr, slot, E, item == 0, TOP_K,
                                     HAS_TOKEN_MASK, COUNT)
        if ok:
            if COUNT:
                if pid_n == 0:
                    tl.atomic_add(counts_ptr + expert, 1)
            _w13_t1_tile(x_ptr, codes_ptr, hot13_w_ptr, hot13_s_ptr, cold13_w_ptr, cold13_s_ptr, act_ptr,
                         w13_expert_stride, s13_expert_stride, hot13_b_ptr, cold13_b_ptr, b13_expert_stride, expert,
                         slot, pid_n, H, INTER, BK1, KSPLIT, CHAINS1, SWIGLU_LIMIT, HAS_BIAS, ACT, ALPHA, UNROLL1,
                         BN1, 0)
            tl.debug_barrier()   # every thread's stores of the tile before the release
            tl.atomic_add(ready_ptr + slot, 1, sem="release", scope="gpu")
    for item in range(pid, NT2 * TOP_K, programs):
        pid_n = item % NT2
        slot = item // NT2
        expert, ok = _one_token_pick(ids_ptr, token_mask_ptr, ids_ptr, slot, E, False, TOP_K, HAS_TOKEN_MASK,
                                     False)
        if ok:
            _w2_t1_tile(act_ptr, codes_ptr, hot2_w_ptr, hot2_s_ptr, cold2_w_ptr, cold2_s_ptr, y_ptr,
                        w2_expert_stride, s2_expert_stride, hot2_b_ptr, cold2_b_ptr, b2_expert_stride, expert, slot,
                        pid_n, H, INTER, BN2, BK2, KSPLIT, CHAINS2, HAS_BIAS, False, UNROLL2, 0,
                        ready_ptr + slot, NT13, True)
            if tl.atomic_add(seen_ptr + slot, 1, sem="relaxed", scope="gpu") == NT2 - 1:
                tl.atomic_xchg(ready_ptr + slot, 0)   # every w2 tile of the pick is past its wait
                tl.atomic_xchg(seen_ptr + slot, 0)
        if _last_of_split(fin_ticket_ptr + pid_n, TOP_K):
            _finalize_rows(y_ptr, weights_ptr, ids_ptr, out_ptr, pid_n * BN2 + tl.arange(0, BN2), E, H, TOP_K, BN2)


@triton.jit
def _w2_tile_words(codes_ptr, expert, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr, w_expert_stride,
                   s_expert_stride, pid_n, NK: tl.constexpr, STEP_W: tl.constexpr, STEP_S: tl.constexpr):
    """A w2 row tile's weights: ``expert``'s weight and scale bases in the bank the row map names
    (int32 pointers) and the tile's first weight and scale words after them (``NK`` K steps of
    ``STEP_W`` / ``STEP_S`` words per tile row)."""
    i32 = tl.pointer_type(tl.int32)
    w_base = _expert_base(codes_ptr, expert, hot_w_ptr, cold_w_ptr, w_expert_stride).to(i32)
    s_base = _expert_base(codes_ptr, expert, hot_s_ptr, cold_s_ptr, s_expert_stride).to(i32)
    return w_base, s_base, pid_n * NK * STEP_W, pid_n * NK * STEP_S


@triton.jit
def _w2_t1_tile(act_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr, y_ptr, w_expert_stride,
                s_expert_stride, hot_b_ptr, cold_b_ptr, b_expert_stride, expert, slot, pid_n, H: tl.constexpr,
                INTER: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KSPLIT: tl.constexpr, CHAINS: tl.constexpr,
                HAS_BIAS: tl.constexpr, PDL: tl.constexpr, UNROLL: tl.constexpr, SMEM_STAGES: tl.constexpr,
                ready_ptr=0, ready_target=0, WAIT_READY: tl.constexpr = False):
    """``w2_t1_kernel``'s work for one computed pick (``slot``, expert ``expert``) and row tile
    ``pid_n``: its ``BN`` output rows, stored (``PDL`` / ``WAIT_READY``: the wait after the first
    weight loads, ``_warp_mma_rows``)."""
    i32 = tl.pointer_type(tl.int32)
    NK: tl.constexpr = INTER // BK
    BH: tl.constexpr = BK // 64
    STEP_W: tl.constexpr = BN * BK // 8
    STEP_S: tl.constexpr = BN * BK // 128
    w_base, s_base, a_w, a_s = _w2_tile_words(codes_ptr, expert, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr,
                                              w_expert_stride, s_expert_stride, pid_n, NK, STEP_W, STEP_S)
    # rep 1 of a 128-row tile: the blocks after rep 0's BH blocks of each K step
    acc0, acc1 = _warp_mma_rows(act_ptr.to(i32) + slot * (INTER // 2), w_base, s_base, a_w,
                                a_w + BH * _BLOCK_WORDS, a_s, a_s + BH * _BLOCK_SCALE_WORDS, NK * BH, BH,
                                STEP_W, STEP_S, KSPLIT, BN == 128, CHAINS, PDL, UNROLL,
                                SMEM_STAGES=SMEM_STAGES, ready_ptr=ready_ptr, ready_target=ready_target,
                                WAIT_READY=WAIT_READY)
    rows, keep = _fragment_rows()
    rows += pid_n * BN
    if HAS_BIAS:
        b_base = _expert_base(codes_ptr, expert, hot_b_ptr, cold_b_ptr, b_expert_stride)
        acc0 += tl.load(b_base + rows).to(tl.float32)
        if BN == 128:
            acc1 += tl.load(b_base + rows + 64).to(tl.float32)
    tl.store(y_ptr + slot * H + rows, acc0.to(tl.bfloat16), mask=keep)
    if BN == 128:
        tl.store(y_ptr + slot * H + rows + 64, acc1.to(tl.bfloat16), mask=keep)


# -- grouped steps (T >= 2): the same loops on up to eight picks of one expert per pass --------------
#
# The m16n8k16 MMA's B operand has eight columns; the T = 1 kernels fill all eight with the one
# token and keep column 0. Here each column carries a pick of the slot's expert (B column
# ``lane // 4`` of each thread), so one pass over a row tile's weights serves up to eight picks
# for the same loads, decodes and MMAs. A column's results depend on its own B column only, and
# every column runs the T = 1 kernels' arithmetic (same K order, warpgroups, chains), so each
# pick's row is bit for bit the row the T = 1 kernels give that token alone: the step's bits do
# not depend on which other picks share the slot, the bank or the schedule.

@triton.jit
def _gw_b_rows(sorted_pick_ptr, m0, end, row_pairs, TOKEN_ROWS: tl.constexpr, TOP_K: tl.constexpr,
               KSPLIT: tl.constexpr):
    """Per thread (``[128 * KSPLIT, 1]``): the bf16-pair offset of the input row its B column
    (``lane // 4``: pick ``m0 + lane // 4`` of the slot's sorted picks) reads — the pick's token
    row of ``x`` (``TOKEN_ROWS``) or the pick's own activation row. Columns past the slot's last
    pick read the pass's first pick (their results are not stored)."""
    N: tl.constexpr = 128 * KSPLIT
    idx = m0 + (tl.arange(0, N)[:, None] % 32) // 4
    pick = tl.load(sorted_pick_ptr + tl.where(idx < end, idx, m0))
    if TOKEN_ROWS:
        pick = pick // TOP_K
    return pick * row_pairs


@triton.jit
def _gw_fragment_cols():
    """B column (the pass's pick ``0..7``) of each ``[128, 4]`` accumulator element: ``2 * (lane
    % 4) + j % 2`` (m16n8k16's C fragment; rows as ``_fragment_rows``)."""
    t = tl.arange(0, 128)[:, None]
    j = tl.arange(0, 4)[None, :]
    return 2 * (t % 4) + (j % 2)


@triton.jit
def _gw_slot(slot_start_ptr, slot_expert_ptr, num_slots_ptr, slot, pass_):
    """Slot ``slot``'s expert, its sorted-pick range end, and this pass's first pick ``m0`` (the
    slot's picks ``8 * pass_ ..``); ``m0 >= end`` where the slot or the pass is empty."""
    n_slots = tl.load(num_slots_ptr)
    live = slot < n_slots
    safe = tl.where(live, slot, 0)
    start = tl.load(slot_start_ptr + safe)
    end = tl.where(live, tl.load(slot_start_ptr + safe + 1), start)
    return tl.load(slot_expert_ptr + safe), start, start + 8 * pass_, end


@triton.jit
def w13_gw_kernel(x_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr,
                  sorted_pick_ptr, slot_start_ptr, slot_expert_ptr, num_slots_ptr, act_ptr,
                  counts_ptr, tokens_ptr, n_tokens_ptr, stride_x, w_expert_stride, s_expert_stride,
                  hot_b_ptr, cold_b_ptr, b_expert_stride,
                  H: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, BK: tl.constexpr,
                  KSPLIT: tl.constexpr, COUNT: tl.constexpr, CHAINS: tl.constexpr = 1,
                  SWIGLU_LIMIT: tl.constexpr = 0.0, HAS_BIAS: tl.constexpr = False, ACT: tl.constexpr = 0,
                  ALPHA: tl.constexpr = 1.0, PDL: tl.constexpr = False, UNROLL: tl.constexpr = 8,
                  PASS_LOOP: tl.constexpr = False, SMEM_STAGES: tl.constexpr = 0):
    """``act[p, rows] = bf16(glu(gate . x_t, up . x_t))`` for the 64 rows of row tile
    ``program_id(0)`` and picks ``p`` (token ``t``) ``8 * program_id(2) ..`` (up to eight) of slot
    ``program_id(1)`` (the grouping kernel's slots; a program whose pass is empty returns);
    ``w13_swiglu_kernel``'s counter (the first program of a slot adds its pick count, program
    (0, 0, 0) the step's tokens), bias and activations. ``PASS_LOOP`` (a grid of one pass): the
    program runs every pass of its slot in turn, eight picks each, so no program is launched for
    an empty pass."""
    _pdl_enter(PDL)
    pid_n = tl.program_id(0)
    slot = tl.program_id(1)
    pass_ = tl.program_id(2)
    if COUNT:
        if (pid_n == 0) & (slot == 0) & (pass_ == 0):
            tl.atomic_add(tokens_ptr, tl.load(n_tokens_ptr).to(tl.int64))
    expert, start, m0, end = _gw_slot(slot_start_ptr, slot_expert_ptr, num_slots_ptr, slot, pass_)
    if m0 >= end:
        return
    if COUNT:
        if (pid_n == 0) & (pass_ == 0):
            tl.atomic_add(counts_ptr + expert, (end - start).to(tl.int64))
    i32 = tl.pointer_type(tl.int32)
    w_base = _expert_base(codes_ptr, expert, hot_w_ptr, cold_w_ptr, w_expert_stride).to(i32)
    s_base = _expert_base(codes_ptr, expert, hot_s_ptr, cold_s_ptr, s_expert_stride).to(i32)
    NK: tl.constexpr = H // BK
    STEP_W: tl.constexpr = 64 * BK // 8
    STEP_S: tl.constexpr = 64 * BK // 128
    up = INTER // 64 + pid_n
    rows, _ = _fragment_rows()
    rows += pid_n * 64
    if PASS_LOOP:
        while m0 < end:
            _w13_gw_pass(x_ptr, codes_ptr, expert, w_base, s_base, hot_b_ptr, cold_b_ptr, b_expert_stride,
                         sorted_pick_ptr, act_ptr, m0, end, stride_x, pid_n, up, rows, INTER, TOP_K, BK, NK,
                         STEP_W, STEP_S, KSPLIT, CHAINS, SWIGLU_LIMIT, HAS_BIAS, ACT, ALPHA, UNROLL, SMEM_STAGES)
            m0 += 8
    else:
        _w13_gw_pass(x_ptr, codes_ptr, expert, w_base, s_base, hot_b_ptr, cold_b_ptr, b_expert_stride,
                     sorted_pick_ptr, act_ptr, m0, end, stride_x, pid_n, up, rows, INTER, TOP_K, BK, NK,
                     STEP_W, STEP_S, KSPLIT, CHAINS, SWIGLU_LIMIT, HAS_BIAS, ACT, ALPHA, UNROLL, SMEM_STAGES)


@triton.jit
def _w13_gw_pass(x_ptr, codes_ptr, expert, w_base, s_base, hot_b_ptr, cold_b_ptr, b_expert_stride,
                 sorted_pick_ptr, act_ptr, m0, end, stride_x, pid_n, up, rows, INTER: tl.constexpr,
                 TOP_K: tl.constexpr, BK: tl.constexpr, NK: tl.constexpr, STEP_W: tl.constexpr,
                 STEP_S: tl.constexpr, KSPLIT: tl.constexpr, CHAINS: tl.constexpr, SWIGLU_LIMIT: tl.constexpr,
                 HAS_BIAS: tl.constexpr, ACT: tl.constexpr, ALPHA: tl.constexpr, UNROLL: tl.constexpr,
                 SMEM_STAGES: tl.constexpr):
    """One pass of ``w13_gw_kernel``: picks ``m0 .. min(m0 + 8, end)`` of the slot."""
    i32 = tl.pointer_type(tl.int32)
    x_row = _gw_b_rows(sorted_pick_ptr, m0, end, stride_x // 2, True, TOP_K, KSPLIT)
    acc_g, acc_u = _warp_mma_rows(x_ptr.to(i32), w_base, s_base, pid_n * NK * STEP_W, up * NK * STEP_W,
                                  pid_n * NK * STEP_S, up * NK * STEP_S, NK * (BK // 64), BK // 64,
                                  STEP_W, STEP_S, KSPLIT, True, CHAINS, UNROLL=UNROLL, x_row=x_row,
                                  SMEM_STAGES=SMEM_STAGES)
    if HAS_BIAS:
        b_base = _expert_base(codes_ptr, expert, hot_b_ptr, cold_b_ptr, b_expert_stride)
        acc_g += tl.load(b_base + rows).to(tl.float32)
        acc_u += tl.load(b_base + INTER + rows).to(tl.float32)
    act = _glu(acc_g, acc_u, SWIGLU_LIMIT, ACT, ALPHA)
    cols = m0 + _gw_fragment_cols()
    c_ok = cols < end
    pick = tl.load(sorted_pick_ptr + cols, mask=c_ok, other=0).to(tl.int64)
    tl.store(act_ptr + pick * INTER + rows, act.to(tl.bfloat16), mask=c_ok)


@triton.jit
def w2_gw_kernel(act_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr,
                 sorted_pick_ptr, slot_start_ptr, slot_expert_ptr, num_slots_ptr, y_ptr,
                 w_expert_stride, s_expert_stride, hot_b_ptr, cold_b_ptr, b_expert_stride,
                 H: tl.constexpr, INTER: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 KSPLIT: tl.constexpr, CHAINS: tl.constexpr = 1, HAS_BIAS: tl.constexpr = False,
                 PDL: tl.constexpr = False, UNROLL: tl.constexpr = 8, PASS_LOOP: tl.constexpr = False,
                 SMEM_STAGES: tl.constexpr = 0):
    """``y[p, rows] = bf16(w2_rows . act_p (+ b2))`` for the ``BN`` (64 or 128) rows of row tile
    ``program_id(0)`` and picks ``8 * program_id(2) ..`` of slot ``program_id(1)`` (the finalize
    is its own launch at T >= 2); ``PASS_LOOP`` as in ``w13_gw_kernel``."""
    _pdl_enter(PDL)
    pid_n = tl.program_id(0)
    slot = tl.program_id(1)
    expert, start, m0, end = _gw_slot(slot_start_ptr, slot_expert_ptr, num_slots_ptr, slot, tl.program_id(2))
    if m0 >= end:
        return
    NK: tl.constexpr = INTER // BK
    BH: tl.constexpr = BK // 64
    STEP_W: tl.constexpr = BN * BK // 8
    STEP_S: tl.constexpr = BN * BK // 128
    w_base, s_base, a_w, a_s = _w2_tile_words(codes_ptr, expert, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr,
                                              w_expert_stride, s_expert_stride, pid_n, NK, STEP_W, STEP_S)
    rows, _ = _fragment_rows()
    rows += pid_n * BN
    if PASS_LOOP:
        while m0 < end:
            _w2_gw_pass(act_ptr, codes_ptr, expert, w_base, s_base, hot_b_ptr, cold_b_ptr, b_expert_stride,
                        sorted_pick_ptr, y_ptr, m0, end, a_w, a_s, rows, H, INTER, BN, NK, BH, STEP_W, STEP_S,
                        KSPLIT, CHAINS, HAS_BIAS, UNROLL, SMEM_STAGES)
            m0 += 8
    else:
        _w2_gw_pass(act_ptr, codes_ptr, expert, w_base, s_base, hot_b_ptr, cold_b_ptr, b_expert_stride,
                    sorted_pick_ptr, y_ptr, m0, end, a_w, a_s, rows, H, INTER, BN, NK, BH, STEP_W, STEP_S,
                    KSPLIT, CHAINS, HAS_BIAS, UNROLL, SMEM_STAGES)


@triton.jit
def _w2_gw_pass(act_ptr, codes_ptr, expert, w_base, s_base, hot_b_ptr, cold_b_ptr, b_expert_stride,
                sorted_pick_ptr, y_ptr, m0, end, a_w, a_s, rows, H: tl.constexpr, INTER: tl.constexpr,
                BN: tl.constexpr, NK: tl.constexpr, BH: tl.constexpr, STEP_W: tl.constexpr, STEP_S: tl.constexpr,
                KSPLIT: tl.constexpr, CHAINS: tl.constexpr, HAS_BIAS: tl.constexpr, UNROLL: tl.constexpr,
                SMEM_STAGES: tl.constexpr):
    """One pass of ``w2_gw_kernel``: picks ``m0 .. min(m0 + 8, end)`` of the slot."""
    i32 = tl.pointer_type(tl.int32)
    x_row = _gw_b_rows(sorted_pick_ptr, m0, end, INTER // 2, False, 1, KSPLIT)
    acc0, acc1 = _warp_mma_rows(act_ptr.to(i32), w_base, s_base, a_w, a_w + BH * _BLOCK_WORDS, a_s,
                                a_s + BH * _BLOCK_SCALE_WORDS, NK * BH, BH, STEP_W, STEP_S, KSPLIT, BN == 128,
                                CHAINS, False, UNROLL, x_row, SMEM_STAGES)
    if HAS_BIAS:
        b_base = _expert_base(codes_ptr, expert, hot_b_ptr, cold_b_ptr, b_expert_stride)
        acc0 += tl.load(b_base + rows).to(tl.float32)
        if BN == 128:
            acc1 += tl.load(b_base + rows + 64).to(tl.float32)
    cols = m0 + _gw_fragment_cols()
    c_ok = cols < end
    pick = tl.load(sorted_pick_ptr + cols, mask=c_ok, other=0).to(tl.int64)
    tl.store(y_ptr + pick * H + rows, acc0.to(tl.bfloat16), mask=c_ok)
    if BN == 128:
        tl.store(y_ptr + pick * H + rows + 64, acc1.to(tl.bfloat16), mask=c_ok)
