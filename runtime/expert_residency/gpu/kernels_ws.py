"""Warp-specialized expert GEMMs of a grouped step, in Gluon (Triton's lower-level language).

The ``tl.dot`` launches of ``gpu.kernels`` have every warp of a program copy its tiles, meet two
CTA barriers per K step, decode and multiply, so an SM sees bursts of eligible warps and then
none. These kernels split the warps instead (Hopper and newer):

- a persistent grid: programs walk the step's (slot, row tile) items ``num_programs`` apart;
- a loader partition (``LOADER_WARPS`` warps, ``LOADER_REGS`` registers) copies each K step's
  weight tile(s) (w13: the gate and the up tile), their scales (each lane group's 4 bytes once per
  lane) and the slot's input rows (``src[pick // ROW_DIV]``) with cp.async into a ring of
  ``STAGES`` shared-memory buffers, each signalled by an mbarrier when its copies land;
- the default partition (one warpgroup) waits on a buffer, reads it into registers, frees it,
  decodes with the layout's own PTX (``kernels._MMA_WORD_TO_BF16_PTX``: the MMA-order layout of
  ``gpu.layout``, 128-value K tiles) and multiplies with ``mma.sync`` m16n8k16; it stores each slot
  pass's rows: bf16 products (w2, unreduced per pick) or the SwiGLU of gate and up (w13, as
  ``kernels._glu`` with ``ACT == 0``), and, with ``COUNT``, adds each slot's pick count to the
  usage counter (the slot's first row tile) and the step's tokens (program 0), as
  ``kernels.w13_swiglu_kernel`` does.

Each pick row is the same fp32 sum of the same k16 products in K order as the ``tl.dot`` kernels
(measured bit for bit on an H100, BENCHMARKS.md run WS), read from either bank through the row map
with the same copies, so split == unsplit holds. Gluon is experimental and its API moves: the
cp.async copy is ``async_copy_global_to_shared`` in Triton 3.6 and ``async_load`` later. Importing
this module raises ImportError where Gluon is absent; ``gpu.experts`` then keeps the ``tl.dot``
kernels.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from . import kernels

_DECODE_PTX = gl.constexpr(kernels._MMA_WORD_TO_BF16_PTX.value)
# Gluon is experimental and its API moves: Triton 3.6 names the cp.async copy
# async_copy_global_to_shared, later releases async_load (same arguments; the old name raises).
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


@gluon.jit
def _expert_base(codes_ptr, expert, hot_ptr, cold_ptr, expert_stride):
    """``kernels._expert_base`` in Gluon (Gluon kernels call Gluon functions): ``expert``'s first
    byte in the bank the row map names."""
    code = gl.load(codes_ptr + expert)
    row = gl.where(code >= 0, code, -code - 1).to(gl.int64)
    return gl.where(code >= 0, hot_ptr, cold_ptr) + row * expert_stride


@gluon.jit
def _item_range(codes_ptr, slot_expert_ptr, num_slots_ptr, NT: gl.constexpr, COLD_PROGRAMS: gl.constexpr,
                SEARCH_STEPS: gl.constexpr):
    """This program's (slot, row tile) items, ``range(first, end, stride)`` over items ``slot * NT +
    tile``. ``COLD_PROGRAMS`` > 0 (a split layer grouped cold slots first): programs below it walk
    the cold slots' items, the others the hot slots', so the hot reads stream beside the cold ones
    instead of every program starting on an expert read over the host link. The number of cold
    slots is found by bisection over the slots' row-map codes (``SEARCH_STEPS`` >= log2(slots + 1))."""
    n_slots = gl.load(num_slots_ptr)
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    if COLD_PROGRAMS > 0:
        lo = 0        # slots below lo read cold experts, slots from hi on hot ones
        hi = n_slots
        for _ in gl.static_range(SEARCH_STEPS):
            mid = (lo + hi) // 2
            inside = mid < hi
            code = gl.load(codes_ptr + gl.load(slot_expert_ptr + mid, mask=inside, other=0), mask=inside, other=0)
            lo = gl.where(inside & (code < 0), mid + 1, lo)
            hi = gl.where(inside & (code >= 0), mid, hi)
        cold_items = lo * NT
        on_cold = pid < COLD_PROGRAMS
        first = gl.where(on_cold, pid, cold_items + pid - COLD_PROGRAMS)
        end = gl.where(on_cold, cold_items, n_slots * NT)
        stride = gl.where(on_cold, COLD_PROGRAMS, programs - COLD_PROGRAMS)
    else:
        first = pid
        end = n_slots * NT
        stride = programs
    return first, end, stride


@gluon.jit
def _slot_of(item, last, NT: gl.constexpr):
    """The slot of item ``item``, whose rows and expert are read a whole item ahead of their use
    (``PREFETCH``: the loads' latency then passes behind the previous item's K steps instead of
    stalling the partition at each item's start). An item past the program's last reads the last
    one's (slot 0 where the program has none): every read stays inside the step's slots."""
    return gl.maximum(gl.minimum(item, last - 1), 0) // NT


@gluon.jit
def _pass_range(start, end, BM: gl.constexpr, PREFETCH: gl.constexpr):
    """A slot's passes of ``BM`` picks as ``range(lo, hi, step)`` with pass ``p`` starting at pick
    ``base + p * scale``: ``range(start, end, BM)`` itself, or with ``PREFETCH`` the passes counted
    (``start + p * BM``): Triton 3.6 does not carry across a loop's iterations a value read an item
    ahead whose only use is a nested loop's bounds (every iteration read the value from before the
    loop; 3.9 compiles it right), and counting uses both values in arithmetic."""
    if PREFETCH:
        return 0, (end - start + BM - 1) // BM, 1, start, BM
    else:
        return start, end, BM, 0, 1


@gluon.jit
def _loader(src_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr,
            sorted_pick_ptr, slot_start_ptr, slot_expert_ptr, num_slots_ptr,
            w_expert_stride, s_expert_stride, wbuf, sbuf, abuf, ready, empty,
            K: gl.constexpr, ROW_DIV: gl.constexpr, NT: gl.constexpr, UP_TILE: gl.constexpr,
            BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
            GATED: gl.constexpr, LOADER_WARPS: gl.constexpr, COLD_PROGRAMS: gl.constexpr,
            SEARCH_STEPS: gl.constexpr, PREFETCH: gl.constexpr):
    """Copies each K step's weight tile(s) (the gate and up tiles when ``GATED``), their scales
    (each lane group's 4 bytes once per lane) and the slot's input rows (``src[pick // ROW_DIV]``:
    the layer input by token for w13, the w2 input by pick) into ring buffer ``it % STAGES``."""
    ROWS: gl.constexpr = BN * BK // 32
    KT: gl.constexpr = K // BK
    TILES: gl.constexpr = 2 if GATED else 1
    LW: gl.constexpr = gl.BlockedLayout([1, 16], [32, 1], [LOADER_WARPS, 1], [1, 0])
    LS: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [LOADER_WARPS, 1], [1, 0])
    LA: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [LOADER_WARPS, 1], [1, 0])
    rw = gl.arange(0, ROWS, layout=gl.SliceLayout(1, LW))
    w_off = rw[:, None] * 16 + gl.arange(0, 16, layout=gl.SliceLayout(0, LW))[None, :]
    rs = gl.arange(0, ROWS, layout=gl.SliceLayout(1, LS))
    s_off = (rs // 4)[:, None] * 4 + gl.arange(0, 4, layout=gl.SliceLayout(0, LS))[None, :]
    ma = gl.arange(0, BM, layout=gl.SliceLayout(1, LA))
    ka = gl.arange(0, BK, layout=gl.SliceLayout(0, LA))
    first, last, stride = _item_range(codes_ptr, slot_expert_ptr, num_slots_ptr, NT, COLD_PROGRAMS, SEARCH_STEPS)
    if PREFETCH:
        ahead = _slot_of(first, last, NT)
        next_start = gl.load(slot_start_ptr + ahead)
        next_end = gl.load(slot_start_ptr + ahead + 1)
        next_expert = gl.load(slot_expert_ptr + ahead)
    it = 0
    for item in range(first, last, stride):
        slot = item // NT
        tile = item % NT
        if PREFETCH:
            start = next_start
            end = next_end
            expert = next_expert
            ahead = _slot_of(item + stride, last, NT)
            next_start = gl.load(slot_start_ptr + ahead)
            next_end = gl.load(slot_start_ptr + ahead + 1)
            next_expert = gl.load(slot_expert_ptr + ahead)
        else:
            start = gl.load(slot_start_ptr + slot)
            end = gl.load(slot_start_ptr + slot + 1)
            expert = gl.load(slot_expert_ptr + slot)
        w_base = _expert_base(codes_ptr, expert, hot_w_ptr, cold_w_ptr, w_expert_stride)
        s_base = _expert_base(codes_ptr, expert, hot_s_ptr, cold_s_ptr, s_expert_stride)
        lo, hi, step, base, scale = _pass_range(start, end, BM, PREFETCH)
        for p in range(lo, hi, step):
            m0 = base + p * scale
            mm = m0 + ma
            m_ok = mm < end
            picks = gl.load(sorted_pick_ptr + mm, mask=m_ok, other=0)
            src_rows = src_ptr + (picks // ROW_DIV).to(gl.int64) * K
            for kt in range(KT):
                s = it % STAGES
                mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
                for j in gl.static_range(TILES):
                    t64 = ((tile + j * UP_TILE) * KT + kt).to(gl.int64)
                    _async_load(wbuf.index(s * TILES + j), w_base + t64 * (BN * BK // 2) + w_off)
                    _async_load(sbuf.index(s * TILES + j), s_base + t64 * (BN * BK // 32) + s_off)
                _async_load(abuf.index(s), src_rows[:, None] + (kt * BK + ka)[None, :], mask=m_ok[:, None])
                async_copy.mbarrier_arrive(ready.index(s), increment_count=False)
                it += 1


@gluon.jit
def _decode_tile(packed, sc, BN: gl.constexpr, BK: gl.constexpr, A_LAYOUT: gl.constexpr):
    """``kernels._load_mma_tile``'s decode on registers already read: ``packed`` [ROWS, 16] uint8,
    ``sc`` [ROWS, 4] int32 (bytes (b0, h) of each lane's rows) -> bf16 [BN, BK] in ``A_LAYOUT``."""
    R: gl.constexpr = BN // 64
    BH: gl.constexpr = BK // 64
    ROWS: gl.constexpr = BN * BK // 32
    mult = sc * 0x00800080 + 0x3F003F00
    mult = gl.reshape(mult, (ROWS, 2, 1, 2, 1))
    mult = gl.reshape(mult.broadcast_to((ROWS, 2, 2, 2, 2)), (ROWS, 16))
    mult = gl.convert_layout(mult, packed.type.layout)
    r0, r1 = gl.inline_asm_elementwise(_DECODE_PTX, "=r,=r,=r,=r,r,r,r,r,r", [packed, mult],
                                       dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=4)
    w = gl.reshape(gl.join(r0, r1), (R, BH, 4, 8, 4, 2, 2, 2, 2, 2))
    w = gl.permute(w, (0, 2, 7, 3, 1, 5, 6, 9, 4, 8))
    return gl.convert_layout(gl.reshape(w, (BN, BK)), A_LAYOUT)


@gluon.jit
def _compute(out_ptr, codes_ptr, sorted_pick_ptr, slot_start_ptr, slot_expert_ptr, num_slots_ptr, counts_ptr, tokens_ptr,
             n_tokens_ptr, wbuf, sbuf, abuf, ready, empty,
             K: gl.constexpr, OUT_STRIDE: gl.constexpr, NT: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
             BK: gl.constexpr, STAGES: gl.constexpr, GATED: gl.constexpr, SWIGLU_LIMIT: gl.constexpr,
             COUNT: gl.constexpr, COLD_PROGRAMS: gl.constexpr, SEARCH_STEPS: gl.constexpr, PREFETCH: gl.constexpr,
             THREAD_RELEASE: gl.constexpr):
    """Waits on each ring buffer, reads it into registers, frees it, decodes and multiplies;
    stores each slot pass's rows: bf16 products (w2), or SwiGLU of gate and up (w13, as
    ``kernels._glu`` with ``ACT == 0``)."""
    KT: gl.constexpr = K // BK
    TILES: gl.constexpr = 2 if GATED else 1
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    B_L: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    LW: gl.constexpr = gl.BlockedLayout([1, 16], [32, 1], [4, 1], [1, 0])
    LS: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [4, 1], [1, 0])
    if COUNT:
        if gl.program_id(0) == 0:
            gl.atomic_add(tokens_ptr, gl.load(n_tokens_ptr).to(gl.int64))
    first, last, stride = _item_range(codes_ptr, slot_expert_ptr, num_slots_ptr, NT, COLD_PROGRAMS, SEARCH_STEPS)
    if PREFETCH:
        ahead = _slot_of(first, last, NT)
        next_start = gl.load(slot_start_ptr + ahead)
        next_end = gl.load(slot_start_ptr + ahead + 1)
    it = 0
    for item in range(first, last, stride):
        slot = item // NT
        tile = item % NT
        if PREFETCH:
            start = next_start
            end = next_end
            ahead = _slot_of(item + stride, last, NT)
            next_start = gl.load(slot_start_ptr + ahead)
            next_end = gl.load(slot_start_ptr + ahead + 1)
        else:
            start = gl.load(slot_start_ptr + slot)
            end = gl.load(slot_start_ptr + slot + 1)
        if COUNT:
            if tile == 0:
                gl.atomic_add(counts_ptr + gl.load(slot_expert_ptr + slot), (end - start).to(gl.int64))
        lo, hi, step, base, scale = _pass_range(start, end, BM, PREFETCH)
        for p in range(lo, hi, step):
            m0 = base + p * scale
            if PREFETCH:   # the pass's pick ids, read before its K steps: the stores need them after
                mm = m0 + gl.arange(0, BM, layout=gl.SliceLayout(0, MMA))
                picks = gl.load(sorted_pick_ptr + mm, mask=mm < end, other=0).to(gl.int64)
            acc = gl.zeros([BN, BM], gl.float32, MMA)
            acc_u = gl.zeros([BN, BM], gl.float32, MMA)
            for _kt in range(KT):
                s = it % STAGES
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                packed = wbuf.index(s * TILES).load(LW)
                sc = sbuf.index(s * TILES).load(LS).to(gl.int32)
                if GATED:
                    packed_u = wbuf.index(s * TILES + 1).load(LW)
                    sc_u = sbuf.index(s * TILES + 1).load(LS).to(gl.int32)
                b = abuf.index(s).permute((1, 0)).load(B_L)
                if THREAD_RELEASE:   # each thread arrives: no warpgroup barrier before the arrive
                    async_copy.mbarrier_arrive(empty.index(s), increment_count=False)
                else:
                    mbarrier.arrive(empty.index(s))
                acc = mma_v2(_decode_tile(packed, sc, BN, BK, A_L), b, acc)
                if GATED:
                    acc_u = mma_v2(_decode_tile(packed_u, sc_u, BN, BK, A_L), b, acc_u)
                it += 1
            rows = tile * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, MMA))
            mm = m0 + gl.arange(0, BM, layout=gl.SliceLayout(0, MMA))
            m_ok = mm < end
            if not PREFETCH:
                picks = gl.load(sorted_pick_ptr + mm, mask=m_ok, other=0).to(gl.int64)
            if GATED:
                if SWIGLU_LIMIT > 0:
                    acc = gl.minimum(acc, SWIGLU_LIMIT)
                    acc_u = gl.minimum(gl.maximum(acc_u, -SWIGLU_LIMIT), SWIGLU_LIMIT)
                acc = acc / (1.0 + gl.exp(-acc)) * acc_u
            gl.store(out_ptr + picks[None, :] * OUT_STRIDE + rows[:, None], acc.to(gl.bfloat16),
                     mask=m_ok[None, :])


@gluon.jit
def _expert_ws(src_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr,
               sorted_pick_ptr, slot_start_ptr, slot_expert_ptr, num_slots_ptr, out_ptr,
               counts_ptr, tokens_ptr, n_tokens_ptr, w_expert_stride, s_expert_stride,
               K: gl.constexpr, ROWS_OUT: gl.constexpr, ROW_DIV: gl.constexpr, GATED: gl.constexpr,
               SWIGLU_LIMIT: gl.constexpr, COUNT: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
               BK: gl.constexpr, STAGES: gl.constexpr, LOADER_WARPS: gl.constexpr, LOADER_REGS: gl.constexpr,
               COLD_PROGRAMS: gl.constexpr, SEARCH_STEPS: gl.constexpr, PREFETCH: gl.constexpr,
               THREAD_RELEASE: gl.constexpr):
    """One expert GEMM of a grouped step, persistent and warp-specialized: w2 (``GATED`` False:
    ``out[p] = w2 . src[p]``, ``ROWS_OUT`` = H) or w13 + SwiGLU (``GATED``: gate rows ``n`` and up rows
    ``n + ROWS_OUT`` applied to ``src[p // ROW_DIV]``, ``ROWS_OUT`` = I)."""
    ROWS: gl.constexpr = BN * BK // 32
    NT: gl.constexpr = ROWS_OUT // BN
    TILES: gl.constexpr = 2 if GATED else 1
    wbuf = gl.allocate_shared_memory(gl.uint8, [STAGES * TILES, ROWS, 16], gl.SwizzledSharedLayout(16, 1, 1, [1, 0]))
    sbuf = gl.allocate_shared_memory(gl.uint8, [STAGES * TILES, ROWS, 4], gl.SwizzledSharedLayout(4, 1, 1, [1, 0]))
    abuf = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=32 * LOADER_WARPS)  # each loader thread's copies land
        mbarrier.init(empty.index(i), count=128 if THREAD_RELEASE else 1)
    gl.warp_specialize([
        (_compute, (out_ptr, codes_ptr, sorted_pick_ptr, slot_start_ptr, slot_expert_ptr, num_slots_ptr, counts_ptr,
                    tokens_ptr, n_tokens_ptr, wbuf, sbuf, abuf, ready, empty,
                    K, ROWS_OUT, NT, BM, BN, BK, STAGES, GATED, SWIGLU_LIMIT, COUNT, COLD_PROGRAMS, SEARCH_STEPS,
                    PREFETCH, THREAD_RELEASE)),
        (_loader, (src_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr,
                   sorted_pick_ptr, slot_start_ptr, slot_expert_ptr, num_slots_ptr,
                   w_expert_stride, s_expert_stride, wbuf, sbuf, abuf, ready, empty,
                   K, ROW_DIV, NT, NT, BM, BN, BK, STAGES, GATED, LOADER_WARPS, COLD_PROGRAMS, SEARCH_STEPS,
                   PREFETCH)),
    ], [LOADER_WARPS], [LOADER_REGS])


# Two kernels of one body: the profiler tells launches apart by name.
@gluon.jit
def w13_ws_kernel(src_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr,
                  sorted_pick_ptr, slot_start_ptr, slot_expert_ptr, num_slots_ptr, out_ptr,
                  counts_ptr, tokens_ptr, n_tokens_ptr, w_expert_stride, s_expert_stride,
                  K: gl.constexpr, ROWS_OUT: gl.constexpr, ROW_DIV: gl.constexpr, GATED: gl.constexpr,
                  SWIGLU_LIMIT: gl.constexpr, COUNT: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                  BK: gl.constexpr, STAGES: gl.constexpr, LOADER_WARPS: gl.constexpr, LOADER_REGS: gl.constexpr,
                  COLD_PROGRAMS: gl.constexpr = 0, SEARCH_STEPS: gl.constexpr = 1,
                  PREFETCH: gl.constexpr = False, THREAD_RELEASE: gl.constexpr = False):
    _expert_ws(src_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr, sorted_pick_ptr, slot_start_ptr,
               slot_expert_ptr, num_slots_ptr, out_ptr, counts_ptr, tokens_ptr, n_tokens_ptr, w_expert_stride,
               s_expert_stride, K, ROWS_OUT, ROW_DIV, GATED, SWIGLU_LIMIT, COUNT, BM, BN, BK, STAGES,
               LOADER_WARPS, LOADER_REGS, COLD_PROGRAMS, SEARCH_STEPS, PREFETCH, THREAD_RELEASE)


@gluon.jit
def w2_ws_kernel(src_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr,
                 sorted_pick_ptr, slot_start_ptr, slot_expert_ptr, num_slots_ptr, out_ptr,
                 counts_ptr, tokens_ptr, n_tokens_ptr, w_expert_stride, s_expert_stride,
                 K: gl.constexpr, ROWS_OUT: gl.constexpr, ROW_DIV: gl.constexpr, GATED: gl.constexpr,
                 SWIGLU_LIMIT: gl.constexpr, COUNT: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                 BK: gl.constexpr, STAGES: gl.constexpr, LOADER_WARPS: gl.constexpr, LOADER_REGS: gl.constexpr,
                 COLD_PROGRAMS: gl.constexpr = 0, SEARCH_STEPS: gl.constexpr = 1,
                 PREFETCH: gl.constexpr = False, THREAD_RELEASE: gl.constexpr = False):
    _expert_ws(src_ptr, codes_ptr, hot_w_ptr, hot_s_ptr, cold_w_ptr, cold_s_ptr, sorted_pick_ptr, slot_start_ptr,
               slot_expert_ptr, num_slots_ptr, out_ptr, counts_ptr, tokens_ptr, n_tokens_ptr, w_expert_stride,
               s_expert_stride, K, ROWS_OUT, ROW_DIV, GATED, SWIGLU_LIMIT, COUNT, BM, BN, BK, STAGES,
               LOADER_WARPS, LOADER_REGS, COLD_PROGRAMS, SEARCH_STEPS, PREFETCH, THREAD_RELEASE)


WS_ARGS = [("src_ptr", "*bf16"), ("codes_ptr", "*i32"), ("hot_w_ptr", "*u8"), ("hot_s_ptr", "*u8"),
           ("cold_w_ptr", "*u8"), ("cold_s_ptr", "*u8"), ("sorted_pick_ptr", "*i32"), ("slot_start_ptr", "*i32"),
           ("slot_expert_ptr", "*i32"), ("num_slots_ptr", "*i32"), ("out_ptr", "*bf16"), ("counts_ptr", "*i64"),
           ("tokens_ptr", "*i64"), ("n_tokens_ptr", "*i32"), ("w_expert_stride", "i64"), ("s_expert_stride", "i64")]
KERNELS = {"w13": w13_ws_kernel, "w2": w2_ws_kernel}

# Launch settings measured best on an H100 (BENCHMARKS.md, run WS): 8 tokens per slot pass, four
# ring buffers, a loader warpgroup of 56 registers. The register cap per thread follows the programs
# per SM (``tile_rules.ws_max_registers``: 128 at two).
BLOCK_M = 8
STAGES = 4
LOADER_WARPS = 4
LOADER_REGS = 56


def gemm_constants(which: str, hidden: int, inter: int, top_k: int, *, swiglu_limit: float = 0.0,
                   count: bool = False, block_m: int = BLOCK_M, stages: int = STAGES,
                   loader_warps: int = LOADER_WARPS, loader_regs: int = LOADER_REGS,
                   cold_programs: int = 0, max_slots: int = 1, prefetch: bool = False,
                   thread_release: bool = False) -> dict:
    """The constants of one launch: w13 + SwiGLU over the layer input (64-row gate and up tiles,
    the token of pick p is p // top_k) or w2 over the w2 input (128-row tiles, by pick).
    ``cold_programs``: programs that walk the cold slots' items (``_item_range``; 0: every program
    walks every item), the bisection sized for ``max_slots`` slots. ``prefetch``: each item's slot rows,
    expert and pick ids read an item ahead (``_slot_of``; the same copies and products).
    ``thread_release``: a probe of what the compute warpgroup's barrier before each buffer's release
    costs (``bench/ws_probe.py``): every compute thread frees the buffer with its own
    ``cp.async.mbarrier.arrive`` instead of one thread after a warpgroup barrier. PTX orders that
    arrive after the thread's cp.async copies only, not its shared-memory reads, so the runtime
    never sets it."""
    common = dict(BM=block_m, BK=128, STAGES=stages, LOADER_WARPS=loader_warps, LOADER_REGS=loader_regs,
                  COLD_PROGRAMS=cold_programs, SEARCH_STEPS=max(1, max_slots.bit_length()), PREFETCH=prefetch,
                  THREAD_RELEASE=thread_release)
    if which == "w13":
        return dict(K=hidden, ROWS_OUT=inter, ROW_DIV=top_k, GATED=True, SWIGLU_LIMIT=float(swiglu_limit),
                    COUNT=count, BN=64, **common)
    return dict(K=inter, ROWS_OUT=hidden, ROW_DIV=1, GATED=False, SWIGLU_LIMIT=0.0, COUNT=False, BN=128, **common)
