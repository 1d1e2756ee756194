"""The weight and scale layout FlashInfer's TRT-LLM MXFP4 MoE reads, and why banks can be sliced
from it.

vLLM 0.33 prepares it in ``oracle/mxfp4.py`` ``convert_weight_to_mxfp4_moe_kernel_format``, branch
``mxfp4_backend in TRTLLM_BACKENDS`` (the contract tests pin every step below against that source):

1. ``w13`` rows (checkpoint: gate ``0..I-1``, up ``I..2I-1``) are interleaved up-first:
   row ``2j`` = up ``j``, row ``2j+1`` = gate ``j`` (``torch.stack([w3, w1], dim=2)``), weights and
   scales alike;
2. every expert's rows are permuted for the transposed-MMA epilogue, ``epilogue_tile_m = 128``:
   FlashInfer's ``get_shuffle_matrix_a_row_indices`` (``flashinfer/utils.py``) with 32-row blocks,
   in which old row ``r`` moves to ``8 * (r % 4) + r // 4`` (its ``srcToDstBlk32RowMap``); the
   scales get the same row permutation (``get_shuffle_matrix_sf_a_row_indices``, which asserts
   rows % 128 == 0);
3. the ue8m0 scales of all experts, viewed as one ``[E * rows, K / 32]`` matrix, are swizzled into
   FlashInfer's 128x4 layout (``nvfp4_block_scale_interleave``; element ``(m, k)`` at
   ``get_sf_out_offset_128x4`` in ``tensorrt_llm/kernels/quantization_utils.cuh``: 512-byte tiles of
   128 rows x 4 columns, tile-row-major, inside a tile ``(m % 32) * 16 + (m % 128) // 32 * 4 + k % 4``),
   then reshaped back to ``[E, rows, K / 32]`` and viewed as ``float8_e4m3fn``.

Steps 1 and 2 act inside one expert. Step 3 crosses experts only through the flattening, and with
``rows % 128 == 0`` and ``(K / 32) % 4 == 0`` every expert owns whole 128-row tiles, contiguous in
order — so the converted ``[E, ...]`` tensors are per-expert slices: a bank built by taking rows of
the converted layer (``core.banks.rehome_layer``) is exactly the conversion of the bank's own rows.
``check_bank_separable`` enforces those conditions; vLLM's TRT-LLM round-up (hidden to 256,
intermediate to 128, ``mxfp4_round_up_hidden_size_and_intermediate_size``) always meets them.

This module is the torch model of those rules (CPU, no FlashInfer): ``to_trtllm_layout`` /
``from_trtllm_layout`` for the emulation and the tests. The serving path converts with vLLM's own
function (``convert_with_vllm``) so the bytes are the ones a stock lane runs.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import torch

MX_BLOCK = 32
EPILOGUE_TILE_M = 128
SHUFFLE_BLOCK = 32          # FlashInfer's block for epilogue_tile_m % 128 == 0
SF_TILE_ROWS, SF_TILE_COLS = 128, 4
NAMES = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")


def check_bank_separable(hidden: int, intermediate: int) -> None:
    """ValueError unless the TRT-LLM layout of this geometry is a per-expert slice (module doc)."""
    problems = []
    for what, rows in (("w13 rows 2*intermediate", 2 * intermediate), ("w2 rows hidden", hidden)):
        if rows % SF_TILE_ROWS:
            problems.append(f"{what} = {rows} is not a multiple of {SF_TILE_ROWS}")
    for what, dim in (("hidden", hidden), ("intermediate", intermediate)):
        if dim % (MX_BLOCK * SF_TILE_COLS):
            problems.append(f"{what} = {dim} is not a multiple of {MX_BLOCK * SF_TILE_COLS} "
                            f"({SF_TILE_COLS} scale columns of {MX_BLOCK})")
    if problems:
        raise ValueError("TRT-LLM MXFP4 layout cannot be split into banks: " + "; ".join(problems))


def epilogue_row_permutation(rows: int) -> torch.Tensor:
    """``perm`` with ``new[i] = old[perm[i]]`` for ``rows`` rows (step 2), int64 on the CPU."""
    if rows % SHUFFLE_BLOCK:
        raise ValueError(f"rows {rows} are not a multiple of {SHUFFLE_BLOCK}")
    old = torch.arange(rows, dtype=torch.int64)
    within = old % SHUFFLE_BLOCK
    new = old - within + 8 * (within % 4) + within // 4
    perm = torch.empty(rows, dtype=torch.int64)
    perm[new] = old
    return perm


def interleave_up_gate(t: torch.Tensor) -> torch.Tensor:
    """``[E, 2I, ...]`` gate-then-up rows -> up/gate interleaved (step 1)."""
    inter = t.shape[1] // 2
    return torch.stack([t[:, inter:], t[:, :inter]], dim=2).reshape(t.shape)


def deinterleave_up_gate(t: torch.Tensor) -> torch.Tensor:
    """Inverse of ``interleave_up_gate``."""
    e, two_i = t.shape[0], t.shape[1]
    pairs = t.reshape(e, two_i // 2, 2, *t.shape[2:])
    return torch.cat([pairs[:, :, 1], pairs[:, :, 0]], dim=1)


def swizzle_128x4(sf: torch.Tensor) -> torch.Tensor:
    """``[M, C]`` scale bytes (M % 128 == 0, C % 4 == 0) -> the 128x4 layout, same shape (step 3)."""
    m, c = sf.shape
    if m % SF_TILE_ROWS or c % SF_TILE_COLS:
        raise ValueError(f"scale matrix {tuple(sf.shape)} is not whole 128x4 tiles")
    # m = tile*128 + inner*32 + outer; k = ktile*4 + kk  ->  [tile, ktile, outer, inner, kk]
    tiles = sf.reshape(m // 128, 4, 32, c // 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(-1).reshape(m, c)


def unswizzle_128x4(sf: torch.Tensor) -> torch.Tensor:
    """Inverse of ``swizzle_128x4``."""
    m, c = sf.shape
    tiles = sf.reshape(m // 128, c // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(m, c)


def _scales_to_kernel(scale: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    e, rows, cols = scale.shape
    shuffled = scale.view(torch.uint8)[:, perm.to(scale.device)].contiguous()
    return swizzle_128x4(shuffled.reshape(e * rows, cols)).reshape(e, rows, cols).view(torch.float8_e4m3fn)


def _scales_from_kernel(scale: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    e, rows, cols = scale.shape
    plain = unswizzle_128x4(scale.view(torch.uint8).reshape(e * rows, cols)).reshape(e, rows, cols)
    out = torch.empty_like(plain)
    out[:, perm.to(scale.device)] = plain
    return out


def to_trtllm_layout(tensors: MutableMapping[str, torch.Tensor]) -> None:
    """Checkpoint-layout MXFP4 expert tensors (``vllm_plugin.mxfp4_experts``) -> the TRT-LLM layout,
    in place (the torch model of vLLM's conversion; weights uint8, scales float8_e4m3fn views)."""
    w13, w2 = tensors["w13_weight"], tensors["w2_weight"]
    hidden, inter = w13.shape[2] * 2, w13.shape[1] // 2
    check_bank_separable(hidden, inter)
    p13, p2 = epilogue_row_permutation(2 * inter), epilogue_row_permutation(hidden)
    tensors["w13_weight"] = interleave_up_gate(w13)[:, p13.to(w13.device)].contiguous()
    tensors["w13_weight_scale"] = _scales_to_kernel(interleave_up_gate(tensors["w13_weight_scale"]), p13)
    tensors["w2_weight"] = w2[:, p2.to(w2.device)].contiguous()
    tensors["w2_weight_scale"] = _scales_to_kernel(tensors["w2_weight_scale"], p2)


def from_trtllm_layout(tensors: MutableMapping[str, torch.Tensor]) -> None:
    """Inverse of ``to_trtllm_layout`` (in place; scales back to uint8): the emulation reads
    checkpoint-layout rows through it."""
    w13, w2 = tensors["w13_weight"], tensors["w2_weight"]
    hidden, inter = w13.shape[2] * 2, w13.shape[1] // 2
    p13, p2 = epilogue_row_permutation(2 * inter), epilogue_row_permutation(hidden)
    plain13 = torch.empty_like(w13)
    plain13[:, p13.to(w13.device)] = w13
    tensors["w13_weight"] = deinterleave_up_gate(plain13).contiguous()
    tensors["w13_weight_scale"] = deinterleave_up_gate(
        _scales_from_kernel(tensors["w13_weight_scale"], p13)).contiguous()
    plain2 = torch.empty_like(w2)
    plain2[:, p2.to(w2.device)] = w2
    tensors["w2_weight"] = plain2
    tensors["w2_weight_scale"] = _scales_from_kernel(tensors["w2_weight_scale"], p2)


def convert_with_vllm(tensors: MutableMapping[str, torch.Tensor], activation: str = "mxfp8") -> None:
    """Convert checkpoint-layout tensors in place with vLLM 0.33's own TRT-LLM conversion
    (``convert_weight_to_mxfp4_moe_kernel_format``; needs vLLM and FlashInfer on a GPU)."""
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import (
        Mxfp4MoeBackend,
        convert_weight_to_mxfp4_moe_kernel_format,
    )

    w13 = tensors["w13_weight"]
    check_bank_separable(w13.shape[2] * 2, w13.shape[1] // 2)
    backend = (Mxfp4MoeBackend.FLASHINFER_TRTLLM_MXFP4_MXFP8 if activation == "mxfp8"
               else Mxfp4MoeBackend.FLASHINFER_TRTLLM_MXFP4_BF16)
    # The TRT-LLM branch reads only the tensors (``layer`` is used by other backends).
    w13k, w2k, s13k, s2k, _, _ = convert_weight_to_mxfp4_moe_kernel_format(
        backend, None, w13, tensors["w2_weight"], tensors["w13_weight_scale"],
        tensors["w2_weight_scale"], _cache_permute_indices={})
    tensors.update({"w13_weight": w13k, "w2_weight": w2k,
                    "w13_weight_scale": s13k, "w2_weight_scale": s2k})
