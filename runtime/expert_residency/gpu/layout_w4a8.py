"""The FP8-activation ("W4A8") layout: MXFP4 experts re-encoded for FP8 tensor-core products.

vLLM 0.33's Humming backend, the one it selects for DeepSeek-V4-style MXFP4 experts on Hopper,
quantizes activations to FP8 and multiplies FP8 by FP8. ``gpu.kernels_w4a8`` does the same on
this layout, which turns each E2M1 code into an E4M3 byte in registers with two byte permutes per
word of eight codes, the block's ue8m0 scale folded into the E4M3 exponent:

* **Words.** A 32-bit word holds 8 codes of one row in one 32-value block. Code ``m = 2d + c``
  is value ``16c + 4q + d`` of the block (``q``: the thread's lane in its group of four; ``d``: a
  byte of an FP8 A-fragment register). Code ``2i``: magnitude (3 bits) at nibble ``i``, sign at
  bit ``8i + 7``; code ``2i + 1``: magnitude at nibble ``4 + i``, sign at bit ``8i + 3``.
* **Tiles.** Each expert is tile-major for ``block_n x 128`` tiles (every tile one contiguous run,
  which the host link needs); inside a tile the words are stored in the wgmma A operand's register
  order ``(rm, kk_hi, w, g, q, kk_lo, h)``: the thread of warp ``w``, lane ``4g + q`` loads its
  own four words (16 bytes) for row ``64rm + 16w + 8h + g`` and values ``32(2kk_hi + kk_lo) + 16c
  + 4q + d`` (``w4a8_tile_index``).
* **Offsets.** The scale tensor keeps its shape and holds, per (row, 32-value block), the block's
  exponent offset ``off = s - base + 1`` (1..12) in the low nibble, tile-major with bytes in order
  ``(rm, kk_hi, w, g, kk_lo, h)``: the same words without ``q``. The decode makes E4M3 bytes of
  ``v * 2^(off - 6)`` for the E2M1 magnitudes ``v`` (0.5 at offset 1 is 2^-6, E4M3's smallest
  normal; 6 at offset 12 is 384 < 448), and the kernel multiplies each row's fp32 sum by
  ``2^(base - 122)``: ``v * 2^(off - 6) * 2^(base - 122) = v * 2^(s - 127)``, the MXFP4 value,
  exactly.
* **Row base.** ``base = max(s) - 11`` over the row's blocks that hold a nonzero code (0 when that
  is negative or the row is all zero) is stored in the high nibbles of the row's offsets of blocks
  0 (low four bits) and 1 (high four bits) of the first k tile.

Exact only while every nonzero block of a row has a scale within 11 powers of two of the row's
largest: Humming re-rounds the values of blocks below that range (``transform.py``
``process_fused_e8m0_scale`` in humming-kernels 0.1.19); this layout refuses instead
(``W4a8LayoutError`` names the tensor, expert, row and the span), so an import is right or
refused. Bank shapes and bytes per expert are the MXFP4 ones: re-homing, swaps, the ledger and
row-map hashes are untouched.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..mxfp4 import E8M0_BIAS, e2m1_table

BLOCK_K = 128          # values per k tile: one FP8 activation scale group
SPAN = 11              # a row's nonzero blocks may span this many powers of two
ROW_BIAS = 122         # row multiplier 2^(base - ROW_BIAS); offsets carry the other + 1 - 6
MAX_OFFSET = SPAN + 1  # offsets run 1..12
_TENSORS = (("w13_weight", "block_n1"), ("w2_weight", "block_n2"))
_CHUNK_BYTES = 16 << 20  # experts converted per step: the encode holds int64 per code


class W4a8LayoutError(ValueError):
    """A checkpoint the FP8-activation layout cannot hold exactly (or tensors of the wrong shape)."""


def check_tile(bn: int, bk: int) -> None:
    if bn % 64 or bk != BLOCK_K:
        raise W4a8LayoutError(f"the FP8-activation layout needs tiles of a multiple of 64 rows x "
                              f"{BLOCK_K} values, got {bn} x {bk}")


def w4a8_tile_index(bn: int, bk: int = BLOCK_K) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, k) inside a ``bn x bk`` tile of byte-slot ``(word, code m)``: two int64 ``[bn*bk/8, 8]``
    tensors, words in storage order ``(rm, kk_hi, w, g, q, kk_lo, h)``."""
    idx = torch.arange(bn * bk // 8)
    h, idx = idx % 2, idx // 2
    kk_lo, idx = idx % 2, idx // 2
    q, idx = idx % 4, idx // 4
    g, idx = idx % 8, idx // 8
    w, idx = idx % 4, idx // 4
    kk_hi, rm = idx % 2, idx // 2
    m = torch.arange(8)
    d, c = m // 2, m % 2
    row = (64 * rm + 16 * w + 8 * h + g)[:, None].expand(-1, 8)
    k = (32 * (2 * kk_hi + kk_lo) + 4 * q)[:, None] + (16 * c + d)[None, :]
    return row, k


def offset_index(bn: int, bk: int = BLOCK_K) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, 32-value block) inside a tile of each offset byte, in storage order
    ``(rm, kk_hi, w, g, kk_lo, h)``: two int64 ``[bn*bk/32]`` tensors (the words' order without
    ``q``: every word of a thread's 16 bytes shares its row and block with the other lanes' ``q``)."""
    row, k = w4a8_tile_index(bn, bk)
    first_lane = row.reshape(-1, 4, 4, 8)[:, 0].reshape(-1, 8), k.reshape(-1, 4, 4, 8)[:, 0].reshape(-1, 8)
    return first_lane[0][:, 0], first_lane[1][:, 0] // 32


def _mag_shift(m: int) -> int:
    return 4 * (m // 2) + (16 if m % 2 else 0)


def _sign_bit(m: int) -> int:
    return 8 * (m // 2) + (3 if m % 2 else 7)


def encode_words(codes: torch.Tensor) -> torch.Tensor:
    """``[..., 8]`` E2M1 codes (code m in the last axis) -> ``[...]`` int64 words (0..2^32-1)."""
    c = codes.to(torch.int64)
    word = torch.zeros(c.shape[:-1], dtype=torch.int64, device=c.device)
    for m in range(8):
        word |= (c[..., m] & 7) << _mag_shift(m)
        word |= ((c[..., m] >> 3) & 1) << _sign_bit(m)
    return word


def decode_words(words: torch.Tensor) -> torch.Tensor:
    """Inverse of ``encode_words``: int64 words ``[...]`` -> E2M1 codes ``[..., 8]`` (int64)."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    return torch.stack([((w >> _mag_shift(m)) & 7) | (((w >> _sign_bit(m)) & 1) << 3) for m in range(8)], -1)


def row_bases(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """int64 ``[..., rows]``: each row's base exponent from its E2M1 codes ``[..., rows, K]`` and
    ue8m0 scales ``[..., rows, K/32]`` (the largest scale of a block with a nonzero code, minus 11,
    at least 0)."""
    nonzero = ((codes & 7) != 0).reshape(*scales.shape, 32).any(-1)
    top = torch.where(nonzero, scales.to(torch.int64), torch.full_like(scales, 0, dtype=torch.int64)).amax(-1)
    return (top - SPAN).clamp(min=0)


def _refusal(name: str, expert: int, row: int, lo: int, hi: int) -> W4a8LayoutError:
    return W4a8LayoutError(
        f"{name}: expert {expert} row {row} has nonzero blocks with ue8m0 scales 2^{lo - E8M0_BIAS} "
        f"to 2^{hi - E8M0_BIAS}, more than {SPAN} powers of two apart: the FP8-activation kernels "
        f"cannot hold that row exactly (Humming re-rounds such blocks; this runtime refuses). Serve "
        f"this model with the default bf16-activation kernels")


def _check(name: str, first_expert: int, codes: torch.Tensor, scales: torch.Tensor,
           base: torch.Tensor) -> None:
    s = scales.to(torch.int64)
    nonzero = ((codes & 7) != 0).reshape(*scales.shape, 32).any(-1)
    if bool((nonzero & (s == 255)).any()):
        e, r, _ = (nonzero & (s == 255)).nonzero()[0].tolist()
        raise W4a8LayoutError(f"{name}: expert {first_expert + e} row {r} has a NaN scale (ue8m0 255)")
    low = nonzero & (s < base[..., None])
    if bool(low.any()):
        e, r, _ = low.nonzero()[0].tolist()
        row_s = s[e, r][nonzero[e, r]]
        raise _refusal(name, first_expert + e, r, int(row_s.min()), int(row_s.max()))


def _convert_one(w: torch.Tensor, s: torch.Tensor, bn: int, name: str) -> None:
    """In place: ``w [E, N, K/2]`` packed E2M1 (vLLM's layout), ``s [E, N, K/32]`` ue8m0."""
    experts, rows, cols = w.shape
    k = cols * 2
    check_tile(bn, BLOCK_K)
    if rows % bn or k % BLOCK_K or tuple(s.shape) != (experts, rows, k // 32):
        raise W4a8LayoutError(f"{name} {tuple(w.shape)} / scales {tuple(s.shape)} are not whole "
                              f"{bn} x {BLOCK_K} tiles")
    row_i, k_i = (t.to(w.device) for t in w4a8_tile_index(bn))
    orow, oblk = (t.to(w.device) for t in offset_index(bn))
    tn, tk = rows // bn, k // BLOCK_K
    step = max(1, _CHUNK_BYTES // max(rows * cols, 1))
    for start in range(0, experts, step):
        wb, sb = w[start:start + step], s[start:start + step]
        n = wb.shape[0]
        codes = torch.stack((wb & 0xF, wb >> 4), dim=-1).reshape(n, rows, k).to(torch.int64)
        base = row_bases(codes, sb)
        _check(name, start, codes, sb, base)
        nonzero = ((codes & 7) != 0).reshape(n, rows, k // 32, 32).any(-1)
        offs = torch.where(nonzero, sb.to(torch.int64) - base[..., None] + 1, torch.ones_like(base[..., None]))
        # tiles [n, tn, tk, bn, 128] -> words in register order [n, tn, tk, words, 8]
        tiles = codes.reshape(n, tn, bn, tk, BLOCK_K).permute(0, 1, 3, 2, 4)
        words = encode_words(tiles[..., row_i, k_i])
        wb.copy_(_word_bytes(words).reshape(wb.shape))
        otiles = offs.reshape(n, tn, bn, tk, BLOCK_K // 32).permute(0, 1, 3, 2, 4)[..., orow, oblk]
        # the row base in the high nibbles of blocks 0 and 1 of the first k tile
        rb = base.reshape(n, tn, bn)[..., orow]
        otiles[:, :, 0] |= torch.where(oblk == 0, (rb & 0xF) << 4, torch.where(oblk == 1, (rb >> 4) << 4, 0))
        sb.copy_(otiles.to(torch.uint8).reshape(sb.shape))


def _word_bytes(words: torch.Tensor) -> torch.Tensor:
    """int64 words (0..2^32-1) -> their 4 little-endian bytes each, uint8 ``[..., 4 * last]``."""
    b = torch.stack([(words >> (8 * i)) & 0xFF for i in range(4)], -1)
    return b.to(torch.uint8).reshape(*words.shape[:-1], -1)


def to_w4a8_layout(tensors: Mapping[str, torch.Tensor], config: object) -> None:
    """Re-encode a layer's full ``w13_weight`` / ``w2_weight`` (packed E2M1, vLLM's layout) and
    their ``*_scale`` tensors in place for ``config``'s tiles (``block_n1`` / ``block_n2`` rows x
    128 values). ``W4a8LayoutError`` when a row does not fit (module docstring): every tensor is
    checked before any is changed, so a refused layer is left as it was."""
    for name, _ in _TENSORS:
        for t in (name, name + "_scale"):
            if t not in tensors:
                raise W4a8LayoutError(f"no {t!r} tensor to lay out (have {sorted(tensors)})")
            if tensors[t].dtype != torch.uint8:
                raise W4a8LayoutError(f"{t}: expected uint8 MXFP4 data, got {tensors[t].dtype}")
    for name, _ in _TENSORS:
        check_w4a8_fits(tensors[name], tensors[name + "_scale"], name)
    for name, rows_field in _TENSORS:
        _convert_one(tensors[name], tensors[name + "_scale"], getattr(config, rows_field), name)


def check_w4a8_fits(packed: torch.Tensor, scales: torch.Tensor, name: str) -> None:
    """``W4a8LayoutError`` when some row of ``packed``/``scales`` (vLLM's MXFP4 layout) spans more
    than 11 powers of two among its nonzero blocks, or holds a NaN scale."""
    experts, rows, cols = packed.shape
    step = max(1, _CHUNK_BYTES // max(rows * cols, 1))
    for start in range(0, experts, step):
        wb, sb = packed[start:start + step], scales[start:start + step]
        codes = torch.stack((wb & 0xF, wb >> 4), dim=-1).reshape(wb.shape[0], rows, cols * 2).to(torch.int64)
        _check(name, start, codes, sb, row_bases(codes, sb))


def decode_w4a8(packed: torch.Tensor, offsets: torch.Tensor, bn: int) -> torch.Tensor:
    """fp32 ``[E, N, K]`` values of tensors in this layout, decoded by hand (the E4M3 byte's value
    times the row multiplier), for tests and references."""
    experts, rows, cols = packed.shape
    k = cols * 2
    tn, tk = rows // bn, k // BLOCK_K
    row_i, k_i = (t.to(packed.device) for t in w4a8_tile_index(bn))
    orow, oblk = (t.to(packed.device) for t in offset_index(bn))
    b = packed.reshape(experts, tn, tk, -1, 4).to(torch.int64)
    words = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    codes = decode_words(words)                                     # [E, tn, tk, W, 8]
    o = offsets.reshape(experts, tn, tk, -1).to(torch.int64)
    widx = torch.arange(words.shape[-1], device=packed.device)
    off = (o & 0xF)[..., (widx // 16) * 4 + widx % 4]               # [E, tn, tk, W]
    vals = e2m1_table(packed.device)[codes] * torch.exp2(off.to(torch.float32) - 6)[..., None]
    first = o[:, :, 0]                                              # [E, tn, per-tile offsets]
    lo = first[..., (oblk == 0).nonzero().flatten()] >> 4
    hi = first[..., (oblk == 1).nonzero().flatten()] >> 4
    base_rows = orow[oblk == 0]
    if not torch.equal(base_rows, orow[oblk == 1]):
        raise AssertionError("block 0 and block 1 offsets list rows in different orders")
    base = torch.empty(experts, tn, bn, dtype=torch.int64, device=packed.device)
    base[..., base_rows] = lo | (hi << 4)
    out = torch.empty(experts, tn, tk, bn, BLOCK_K, device=packed.device)
    out[:, :, :, row_i, k_i] = vals
    out = out.permute(0, 1, 3, 2, 4).reshape(experts, rows, k)
    return out * torch.exp2(base.reshape(experts, rows).to(torch.float32) - ROW_BIAS)[..., None]
