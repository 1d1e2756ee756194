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
"""

from __future__ import annotations

from typing import Mapping

import torch

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


def _convert(tensors: Mapping[str, torch.Tensor], config: object, *, inverse: bool) -> None:
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
