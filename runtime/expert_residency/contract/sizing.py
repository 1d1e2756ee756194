"""The runtime's start-up device bytes and the kernel defaults they depend on: one definition for the
kernels' objects (``gpu.experts.Workspace`` / ``SplitScratch``, ``vllm_plugin.step_masks.StepMasks``
size themselves with these functions) and for recipegen's ledger (``recipegen.ledger.workspace``).
``tests/test_ledger_workspace.py`` checks them against hand arithmetic and against the real
tensors' ``nbytes`` on CPU.

P = max_tokens × top_k picks, H / I the expert's hidden / intermediate size as the banks hold it.
"""

from __future__ import annotations

from .expert_formats import FP8_BLOCK

# ``gpu.experts.KernelConfig`` defaults (the Triton MXFP4 split layer): tokens per tile, w13 / w2
# rows per program and reduction depth per step.
BLOCK_M = 16
BLOCK_N1, BLOCK_K1 = 64, 128
BLOCK_N2, BLOCK_K2 = 128, 128
SMALL_TOKENS = 6  # steps of T <= min(SMALL_TOKENS, BLOCK_M) tokens run the small-step schedule
SPLIT_K1, SPLIT_K2 = 1, 1  # K splits of a small step (1: none)
STREAM_K1, STREAM_K2 = 0, 0  # T = 1 stream-K programs of w13 / w2 (0: off)
MMA_ORDER_TILE_FLOOR = 64  # the smallest tile of the MMA-order layout (the default dequantizer)
ACT_BYTES = 2  # bf16 activation and pick-output rows


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1): ``triton.next_power_of_2``."""
    return 1 << (int(n) - 1).bit_length()


def fitted_tile(tile: int, dim: int, floor: int = MMA_ORDER_TILE_FLOOR) -> int:
    """``gpu.experts.config_for_shape``: the tile halved until it divides ``dim`` (not below ``floor``)."""
    while dim % tile and tile > floor:
        tile //= 2
    return tile


def small_step_limit(small_tokens: int = SMALL_TOKENS, block_m: int = BLOCK_M) -> int:
    """Largest T that runs the small-step schedule (a slot then fits one BM tile)."""
    return min(small_tokens, block_m)


def workspace_bytes(max_tokens: int, top_k: int, hidden: int, intermediate: int,
                    act_bytes: int = ACT_BYTES) -> int:
    """One ``gpu.experts.Workspace``: with PB the next power of two >= max(P, 2), int32
    ``2·PB + (P + 1) + max(P, 1) + 2``, one int64, and ``act_bytes·P·(I + H)`` (activation rows
    and per-pick output rows, which dominate)."""
    picks = int(max_tokens) * int(top_k)
    pb = next_pow2(max(picks, 2))
    ints = 2 * pb + (picks + 1) + max(picks, 1) + 2
    return 4 * ints + 8 + act_bytes * picks * (int(intermediate) + int(hidden))


def split_scratch_bytes(max_tokens: int, top_k: int, hidden: int, intermediate: int, *,
                        block_n1: int = BLOCK_N1, block_n2: int = BLOCK_N2,
                        small_tokens: int = SMALL_TOKENS, block_m: int = BLOCK_M,
                        splits: tuple[int, int] = (1, 1), one_token: bool = True,
                        stream_k1: int = STREAM_K1, stream_k2: int = STREAM_K2) -> int:
    """One ``gpu.experts.SplitScratch``: with p = max(min(T, small-step limit)·top_k, 1) picks and
    the effective K splits s1, s2 (counted where > 1), fp32 ``p·(s1·2I + s2·H)`` partials and int32
    tickets ``p·(I/block_n1 + H/block_n2)``; with T = 1 stream-K (``one_token``) also fp32
    ``4·stream_k1·block_n1 + 2·stream_k2·block_n2`` and, when stream_k2 > 0, int32
    ``top_k·H/block_n2``. The defaults split no K and run no stream-K: tickets only."""
    p = max(min(int(max_tokens), small_step_limit(small_tokens, block_m)) * int(top_k), 1)
    h, i = int(hidden), int(intermediate)
    s1, s2 = (s if s > 1 else 0 for s in splits)
    tickets = p * (i // block_n1 + h // block_n2)
    stream = 0
    if one_token:
        stream = 4 * (4 * stream_k1 * block_n1 + 2 * stream_k2 * block_n2)
        if stream_k2:
            stream += 4 * int(top_k) * (h // block_n2)
    return 4 * p * (s1 * 2 * i + s2 * h) + 4 * tickets + stream


def fp8_scratch_bytes(max_tokens: int, top_k: int, hidden: int, intermediate: int) -> int:
    """The FP8-block dense kernels' quantized GEMM inputs (``gpu.dense_experts``), T = max_tokens:
    E4M3 ``T·H + P·I`` bytes and fp32 scales ``4·(T·H/128 + P·I/128)``."""
    t, h, i = int(max_tokens), int(hidden), int(intermediate)
    p = t * int(top_k)
    return t * h + p * i + 4 * (t * (h // FP8_BLOCK) + p * (i // FP8_BLOCK))


def counter_bytes(moe_layers: int, experts: int) -> int:
    """``core.ExpertCounter``: int64 counts ``[layers, experts]``, tokens and decode tokens ``[layers]``."""
    return 8 * int(moe_layers) * int(experts) + 16 * int(moe_layers)


def decode_counter_bytes(moe_layers: int, experts: int) -> int:
    """``core.ExpertCounter.enable_decode_counts`` (adaptive ``rank_picks: decode``): the decode-picks
    count and the per-step start, int64 ``[layers, experts]`` each."""
    return 2 * 8 * int(moe_layers) * int(experts)


def step_mask_bytes(max_tokens: int) -> int:
    """``vllm_plugin.step_masks.StepMasks``: bool ``[max_tokens + 1]``, int32 ``[max_tokens]``, one int64."""
    return int(max_tokens) * (1 + 4) + 1 + 8


# The dense (BF16 / FP8-block) kernels' T = 1 fused finalize hands off through one int32 ticket per
# w2 row tile of at least this many rows (the narrowest tile tl.dot takes), sized for any tile.
DENSE_FIN_TICKET_ROWS = 16


def dense_ticket_bytes(hidden: int) -> int:
    """``gpu.dense_experts``' T = 1 fused-finalize tickets: int32 ``ceil(H / 16)``."""
    return 4 * -(-int(hidden) // DENSE_FIN_TICKET_ROWS)


def decode_mask_bytes(max_tokens: int) -> int:
    """``StepMasks.enable_decode_rows`` (adaptive ``rank_picks: decode``): the per-row decode mask,
    bool ``[max_tokens + 1]``, and the decode-only-step flag, one int64."""
    return int(max_tokens) + 1 + 8
