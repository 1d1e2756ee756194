"""The kernels' expert layout: vLLM's MXFP4 tensors re-ordered tile by tile, in place.

vLLM stores an expert's packed values row-major (``w13 [2I, H/2]``: each row ``H/2`` bytes), so a
kernel tile of ``BN`` rows × ``BK`` values touches ``BN`` separate ``BK/2``-byte runs, and its
ue8m0 scales ``BN`` runs of ``BK/32`` bytes (4 bytes at BK=128). Over HBM that costs little; over
the host link every short run is its own small read request, and the cold bank reads at a
fraction of the link's rate. ``to_kernel_layout`` re-orders each expert's bytes so that every
(row tile, k tile) is one contiguous run — ``[R, C] → [R/BN, C/BC, BN, BC]`` — for the tile shape
of the kernel that reads the tensor (w13 and its scales: ``block_n1 × block_k1``; w2 and its
scales: ``block_n2 × block_k2``).

It is a permutation *within* each expert's row of the bank tensors: bank shapes, bytes per expert,
re-homing, swaps (whole expert rows) and hashes of the row map are untouched. Convert the layer's
full tensors once, before ``core.banks.rehome_layer``; every bank then holds the kernel layout.
The torch references read vLLM's layout, so keep (or convert back with ``from_kernel_layout``) the
original for them.

**MMA order** (``dequant=3``, the default kernel): inside each tile the bytes are further arranged
in the order the tensor cores consume them, so that each thread of the kernel's warpgroup loads
its own A-fragment values with 16-byte loads and decodes them in registers without any exchange
between threads. A tile of ``BN`` rows (``BN/64`` row-reps ``rm``) × ``BK`` values (``BK/64``
pairs ``bh`` of 32-value scale blocks ``b = 2bh + b0``) becomes 16-byte rows indexed
``(rm, bh, w, g, q)``, each four 32-bit words ``(b0, c)``: the thread of warp ``w``, lane
``4g+q`` owns rows ``64rm + 16w + 8h + g`` and values ``32b + 16c + 8d + 2q + e`` (the
wgmma/mma.m16n8k16 A fragment). A word holds the 8 codes ``(h, d, e)`` of one k16 step; code
``(h, d, e)`` goes to output ``j = 2d + h``, lane ``e``, whose bf16 needs the code's sign at bit
``15 + 16e`` and its ``(e1 e0 m)`` at bits ``8..6 + 16e`` of the output register. The decode makes
output ``j`` from the word rotated left by ``r``: ``r = 0, 4, 10`` for ``j = 0, 1, 2``, and for
``j = 3`` the sign, ``e0`` and ``m`` from the rotation by 6 and ``e1`` from the rotation by 14, so
a code's bit sits at (its output bit − ``r``) mod 32 of the word (these four rotations place the
32 bits with no collision; a tiling by single rotations does not exist, so one output takes two:
nine integer operations per word where the previous placement took thirteen; the kernel's decode,
``kernels._MMA_WORD_TO_BF16_PTX``). Scales become bytes ``(rm, bh, w, g, b0, h)`` per tile. Still
a permutation of each expert's bytes (bytes per expert unchanged), each tile still one contiguous
run for the host link. The decode multiplies by ``2^(s-1)`` in bf16, so scales must be ≤ 128
(weights ≤ 12): checked here.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .word_bits import word_bit

# tensor name -> (which tile rows, which tile values) in KernelConfig field names
TILE_FIELDS = {
    "w13_weight": ("block_n1", "block_k1", 2),
    "w13_weight_scale": ("block_n1", "block_k1", 32),
    "w2_weight": ("block_n2", "block_k2", 2),
    "w2_weight_scale": ("block_n2", "block_k2", 32),
}
_CHUNK_BYTES = 256 << 20  # experts converted per step: bounds the temporary copy


def tile_shape(name: str, config: object) -> tuple[int, int]:
    """(rows per tile, bytes per tile row) of ``name`` under ``config`` (a ``KernelConfig``)."""
    rows_field, k_field, values_per_byte = TILE_FIELDS[name]
    return getattr(config, rows_field), getattr(config, k_field) // values_per_byte


def to_kernel_layout(tensors: Mapping[str, torch.Tensor], config: object) -> None:
    """Re-order every expert tensor of ``tensors`` (``[E, R, C]`` uint8) tile-major, in place."""
    _convert(tensors, config, inverse=False)


def from_kernel_layout(tensors: Mapping[str, torch.Tensor], config: object) -> None:
    """Undo ``to_kernel_layout`` in place."""
    _convert(tensors, config, inverse=True)


MMA_ORDER_DEQUANT = 3  # KernelConfig.dequant of the kernel that reads the MMA-order layout
MAX_MMA_SCALE = 128     # ue8m0 code whose 2^(s-1) is still a finite bf16 (exponent field s + 126)


def is_mma_order(config: object) -> bool:
    return getattr(config, "dequant", None) == MMA_ORDER_DEQUANT


def check_mma_tiles(bn: int, bk: int) -> None:
    if bn % 64 or bk % 64:
        raise ValueError(f"the MMA-order layout needs tiles of a multiple of 64 rows x 64 values, "
                         f"got {bn} x {bk}")


def _convert(tensors: Mapping[str, torch.Tensor], config: object, *, inverse: bool) -> None:
    if is_mma_order(config):
        _convert_mma(tensors, config, inverse=inverse)
        return
    if not getattr(config, "tile_major", True):
        return
    for name in TILE_FIELDS:
        if name not in tensors:
            raise ValueError(f"no {name!r} tensor to lay out (have {sorted(tensors)})")
        t = tensors[name]
        bn, bc = tile_shape(name, config)
        experts, rows, cols = t.shape
        if rows % bn or cols % bc:
            raise ValueError(f"{name} {tuple(t.shape)} is not a whole number of {bn} x {bc}-byte tiles")
        per_expert = rows * cols * t.element_size()
        step = max(1, _CHUNK_BYTES // max(per_expert, 1))
        for start in range(0, experts, step):
            block = t[start:start + step]
            n = block.shape[0]
            if inverse:
                src = block.reshape(n, rows // bn, cols // bc, bn, bc).permute(0, 1, 3, 2, 4)
            else:
                src = block.reshape(n, rows // bn, bn, cols // bc, bc).permute(0, 1, 3, 2, 4)
            block.copy_(src.reshape(n, rows, cols))


# -- the MMA-order layout (dequant=3) --------------------------------------------------------------

_MMA_CHUNK_BYTES = 16 << 20  # smaller steps: the encode holds int32 per code


def _weight_dims(n: int, rows: int, k: int, bn: int, bk: int) -> tuple[int, ...]:
    # rows -> (tr, rm, w, h, g); k -> (tk, bh, b0, c, d, q, e)
    return (n, rows // bn, bn // 64, 4, 2, 8, k // bk, bk // 64, 2, 2, 2, 4, 2)


_W_PERM = (0, 1, 6, 2, 7, 3, 5, 11, 8, 9, 4, 10, 12)   # -> n, tr, tk, rm, bh, w, g, q, b0, c | h, d, e
_S_PERM = (0, 1, 6, 2, 7, 3, 5, 8, 4)                  # -> n, tr, tk, rm, bh, w, g, b0, h


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def _encode_words(codes: torch.Tensor) -> torch.Tensor:
    """``[..., h, d, e]`` E2M1 codes (int32) -> ``[...]`` int32 words in the kernel's bit placement
    (code ``(h, d, e)`` -> output ``j = 2d + h``, lane ``e``)."""
    word = torch.zeros(codes.shape[:-3], dtype=torch.int64, device=codes.device)
    for e in range(2):
        for j in range(4):
            d, h = divmod(j, 2)
            code = codes[..., h, d, e].long()
            for bit in range(4):
                word |= ((code >> bit) & 1) << word_bit(j, e, bit)
    return torch.where(word >= 2 ** 31, word - 2 ** 32, word).to(torch.int32)


def _decode_words(word: torch.Tensor) -> torch.Tensor:
    """Inverse of ``_encode_words``: ``[...]`` int32 -> ``[..., h, d, e]`` uint8 codes."""
    w = word.long() & 0xFFFFFFFF
    out = torch.zeros(word.shape + (2, 2, 2), dtype=torch.uint8, device=word.device)
    for e in range(2):
        for j in range(4):
            d, h = divmod(j, 2)
            code = torch.zeros_like(w)
            for bit in range(4):
                code |= ((w >> word_bit(j, e, bit)) & 1) << bit
            out[..., h, d, e] = code.to(torch.uint8)
    return out


def _convert_mma(tensors: Mapping[str, torch.Tensor], config: object, *, inverse: bool) -> None:
    for name in TILE_FIELDS:
        if name not in tensors:
            raise ValueError(f"no {name!r} tensor to lay out (have {sorted(tensors)})")
    for prefix, rows_field, k_field in (("w13_weight", "block_n1", "block_k1"), ("w2_weight", "block_n2", "block_k2")):
        bn, bk = getattr(config, rows_field), getattr(config, k_field)
        check_mma_tiles(bn, bk)
        w, s = tensors[prefix], tensors[prefix + "_scale"]
        experts, rows, cols = w.shape
        k = cols * 2
        if rows % bn or k % bk or tuple(s.shape) != (experts, rows, k // 32):
            raise ValueError(f"{prefix} {tuple(w.shape)} / scales {tuple(s.shape)} are not whole "
                             f"{bn} x {bk} MMA-order tiles")
        if not inverse and s.numel() and int(s.max()) > MAX_MMA_SCALE:
            raise ValueError(f"{prefix}_scale holds a ue8m0 scale above {MAX_MMA_SCALE} (2^1): the "
                             f"MMA-order decode (2^(s-1) in bf16) cannot represent it")
        step = max(1, _MMA_CHUNK_BYTES // max(rows * cols, 1))
        for start in range(0, experts, step):
            wb, sb = w[start:start + step], s[start:start + step]
            n = wb.shape[0]
            dims = _weight_dims(n, rows, k, bn, bk)
            sdims = (n, rows // bn, bn // 64, 4, 2, 8, k // bk, bk // 64, 2)
            if inverse:
                words = wb.reshape(-1).view(torch.int32).reshape(tuple(dims[i] for i in _W_PERM[:-3]))
                codes = _decode_words(words).permute(_inverse(_W_PERM)).reshape(n, rows, k)
                wb.copy_((codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8))
                sb.copy_(sb.reshape(tuple(sdims[i] for i in _S_PERM)).permute(_inverse(_S_PERM)).reshape(sb.shape))
            else:
                codes = torch.stack((wb & 0xF, wb >> 4), dim=-1).reshape(dims).permute(_W_PERM).to(torch.int32)
                words = _encode_words(codes)
                wb.copy_(words.reshape(-1).view(torch.uint8).reshape(wb.shape))
                sb.copy_(sb.reshape(sdims).permute(_S_PERM).reshape(sb.shape))
