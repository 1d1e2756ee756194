"""One Triton launch that refreshes both step masks (``step_masks.StepMasks``) on the device.

It replaces the torch path's small ops (the per-step host cost is their launches, not the
GPU work): one program writes the whole ``valid`` buffer (the real rows, then False up to and
including the trailing slot) and the decode count — the requests of ``query_start_loc`` with one
new token whose first row is real. A request's row validity is recomputed from the inputs, not read
back from the buffer being written, so no barrier is needed. Row, request and token counts are
runtime arguments that Triton does not specialise on, so a new step size never recompiles; no
output depends on a host read. Imported only where Triton is (CUDA, or ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# How the real rows of a step are known (the torch path's three cases, same order).
FROM_PADDING, FROM_ACTUAL, ALL_ROWS = 0, 1, 2
BLOCK = 1024


@triton.jit(do_not_specialize=["n_rows", "n_actual", "n_req"])
def _refresh_kernel(valid_ptr, decode_ptr, pad_ptr, qsl_ptr, rows_ptr, step_ptr, n_rows, n_actual, n_req,
                    TOTAL: tl.constexpr, MODE: tl.constexpr, HAS_QSL: tl.constexpr,
                    BLOCK: tl.constexpr, ROWS: tl.constexpr = False):
    offs = tl.arange(0, BLOCK)
    real = tl.zeros([BLOCK], dtype=tl.int64)
    # valid[r] for every slot r < TOTAL (max_tokens + 1): real rows of the step, else False;
    # decode_rows[r] cleared (set below for the decode requests' rows).
    for start in range(0, TOTAL, BLOCK):
        r = start + offs
        inside = r < n_rows
        if MODE == 0:
            pad = tl.load(pad_ptr + r, mask=inside, other=1)
            v = inside & (pad == 0)
        elif MODE == 1:
            v = inside & (r < n_actual)
        else:
            v = inside
        tl.store(valid_ptr + r, v, mask=r < TOTAL)
        if ROWS:
            tl.store(rows_ptr + r, tl.zeros([BLOCK], dtype=tl.int1), mask=r < TOTAL)
            real += v.to(tl.int64)
    if ROWS:
        # the clearing stores above come from other threads than the row stores below
        tl.debug_barrier()
    acc = tl.zeros([BLOCK], dtype=tl.int64)
    if HAS_QSL:
        for start in range(0, n_req, BLOCK):
            i = start + offs
            m = i < n_req
            s0 = tl.load(qsl_ptr + i, mask=m, other=0)
            s1 = tl.load(qsl_ptr + i + 1, mask=m, other=0)
            row_in = m & (s0 >= 0) & (s0 < n_rows)
            if MODE == 0:
                pad0 = tl.load(pad_ptr + s0, mask=row_in, other=1)
                first_real = row_in & (pad0 == 0)
            elif MODE == 1:
                first_real = row_in & (s0 < n_actual)
            else:
                first_real = row_in
            one = first_real & ((s1 - s0) == 1)
            acc += one.to(tl.int64)
            if ROWS:
                tl.store(rows_ptr + s0, one, mask=one)
    decode = tl.sum(acc, axis=0)
    tl.store(decode_ptr, decode)
    if ROWS:
        n_real = tl.sum(real, axis=0)
        tl.store(step_ptr, ((decode == n_real) & (n_real > 0)).to(tl.int64))


def refresh(valid_full: torch.Tensor, decode_count: torch.Tensor, n_rows: int, *,
            is_padding: torch.Tensor | None, num_actual_tokens: int | None,
            query_start_loc: torch.Tensor | None, decode_rows: torch.Tensor | None = None,
            decode_step: torch.Tensor | None = None) -> None:
    """Fill ``valid_full`` (bool ``[max_tokens + 1]``) and ``decode_count`` (int64 ``[1]``) — and
    when given ``decode_rows`` (bool ``[max_tokens + 1]``) and ``decode_step`` (int64 ``[1]``) — in
    one launch, exactly as ``StepMasks._update_torch`` does (``n_rows`` already capped at
    max_tokens). Without ``query_start_loc`` the decode count is 0 and no row is a decode row."""
    if is_padding is not None:
        mode, pad, actual = FROM_PADDING, is_padding, 0
    elif num_actual_tokens is not None:
        mode, pad, actual = FROM_ACTUAL, valid_full, int(num_actual_tokens)
    else:
        mode, pad, actual = ALL_ROWS, valid_full, 0
    qsl = query_start_loc if query_start_loc is not None else decode_count
    n_req = max(query_start_loc.numel() - 1, 0) if query_start_loc is not None else 0
    has_qsl = query_start_loc is not None
    total = valid_full.numel()
    with_rows = decode_rows is not None
    if not with_rows:   # the pointers are never read or written then
        decode_rows, decode_step = valid_full, decode_count
    # Triton's JIT launch re-binds and re-specialises every argument on each call, which costs as
    # much host time as the torch ops did. After the first launch of a variant, launch its
    # compiled kernel directly; the key holds everything the JIT specialised on (constexprs, device,
    # each pointer's 16-byte alignment; the ints are not specialised).
    key = (valid_full.device.index, total, mode, has_qsl, with_rows,
           *(t.data_ptr() % 16 == 0 for t in (valid_full, decode_count, pad, qsl, decode_rows, decode_step)))
    compiled = _COMPILED.get(key)
    if compiled is not None:
        compiled[(1, 1, 1)](valid_full, decode_count, pad, qsl, decode_rows, decode_step, int(n_rows), actual,
                            n_req, total, mode, has_qsl, BLOCK, with_rows)
        return
    kernel = _refresh_kernel[(1,)](valid_full, decode_count, pad, qsl, decode_rows, decode_step, int(n_rows),
                                   actual, n_req, TOTAL=total, MODE=mode, HAS_QSL=has_qsl, BLOCK=BLOCK,
                                   ROWS=with_rows, num_warps=4)
    if kernel is not None and hasattr(kernel, "run") and hasattr(kernel, "__getitem__"):
        _COMPILED[key] = kernel  # None under TRITON_INTERPRET=1: the JIT path every time


_COMPILED: dict[tuple, object] = {}
