"""A torch model of FlashInfer's ``trtllm_fp4_block_scale_routed_moe(..., do_finalize=False)`` for
the CPU: the same call signature, the same argument checks the launcher makes, and the same
unfinalized output layout, built from the layout rules (``blackwell.layout``) and the routing
rules of FlashInfer 0.7.2.post1 (docs/blackwell.md cites the lines):

* a route ``(t, k)`` whose id lies in ``[local_expert_offset, local_expert_offset +
  local_num_experts)`` is local; every other in-range id is not local and gets ``-1`` in
  ``expanded_idx_to_permuted_idx``;
* local routes are permuted expert-major (local expert ascending, then token order), each expert's
  run padded to a multiple of the tile (8 tokens, the runner's smallest ``tileTokensDim``); pad rows
  hold garbage — here NaN, so a reader that touches a pad row or a ``-1`` route is caught
  (``row_order_seed`` scatters the rows at random instead: the order is FlashInfer's business);
* ``gemm2_output`` rows are the **unweighted** expert outputs in bf16; ``expert_weights`` is the
  caller's weight tensor returned as is (FlashInfer "always borrows the caller's topk_weights").

The per-route arithmetic is the core's reference (``core.reference``: fp32 dequantized MXFP4,
SwiGLU with the optional clamp, bf16 intermediate and output), read through
``layout.from_trtllm_layout`` — so this models *where* FlashInfer puts each row, not the bits its
tensor cores produce. It exists to test the runtime's remap, gather and finalize without a GPU,
and to dry-run ``blackwell.selfcheck --emulate``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.reference import _swiglu_pick
from ..mxfp4 import dequantize_mxfp4
from .layout import from_trtllm_layout
from .trtllm import RENORMALIZE, SWIGLU

TILE_TOKENS = 8


class LaunchError(ValueError):
    """An argument the real launcher would reject (its TVM_FFI_ICHECKs)."""


def emulated_routed_moe(*, topk_ids: Any, hidden_states: torch.Tensor,
                        hidden_states_scale: torch.Tensor | None, gemm1_weights: torch.Tensor,
                        gemm1_weights_scale: torch.Tensor, gemm2_weights: torch.Tensor,
                        gemm2_weights_scale: torch.Tensor, num_experts: int, top_k: int,
                        intermediate_size: int, local_expert_offset: int, local_num_experts: int,
                        do_finalize: bool = True, gemm1_clamp_limit: torch.Tensor | None = None,
                        activation_type: int = SWIGLU, routing_method_type: int = 0,
                        gemm1_bias: torch.Tensor | None = None,
                        gemm2_bias: torch.Tensor | None = None, gemm1_alpha: Any = None,
                        gemm1_beta: Any = None, row_order_seed: int | None = None,
                        **_: Any) -> list[torch.Tensor]:
    """See the module docstring. Only ``do_finalize=False`` with unpacked ``(ids, weights)``
    routing and bf16 activations is modelled; anything else raises ``LaunchError``.
    ``row_order_seed`` (not a FlashInfer argument): place the local routes' rows in a random order
    instead of expert-major, to show a reader depends on the permute map only."""
    if not isinstance(topk_ids, tuple):
        raise LaunchError("only the unpacked (topk_ids, topk_weights) routing form is modelled")
    ids, weights = topk_ids
    if do_finalize:
        raise LaunchError("the emulation models do_finalize=False only")
    if hidden_states_scale is not None or hidden_states.dtype != torch.bfloat16:
        raise LaunchError("the emulation models bf16 activations only")
    if activation_type != SWIGLU or routing_method_type != RENORMALIZE:
        raise LaunchError(f"activation {activation_type} / routing {routing_method_type}")
    if gemm1_alpha is not None or gemm1_beta is not None or gemm1_bias is not None \
            or gemm2_bias is not None:
        raise LaunchError("alpha/beta/biases are not modelled")
    # The launcher's checks (trtllm_fused_moe_kernel_launcher.cu).
    if ids.dtype != torch.int32 or ids.dim() != 2 or not ids.is_contiguous():
        raise LaunchError(f"topk_ids must be contiguous int32 [T, K], got {ids.dtype} {tuple(ids.shape)}")
    if ids.shape[1] != top_k or weights.shape != ids.shape:
        raise LaunchError(f"topk_ids {tuple(ids.shape)} / weights {tuple(weights.shape)} vs top_k {top_k}")
    if weights.dtype not in (torch.float32, torch.bfloat16):
        raise LaunchError(f"topk_weights must be fp32 or bf16, got {weights.dtype}")
    if not (0 < local_num_experts <= num_experts and local_expert_offset >= 0
            and local_expert_offset + local_num_experts <= num_experts and top_k <= num_experts):
        raise LaunchError(f"local experts [{local_expert_offset}, +{local_num_experts}) "
                          f"outside num_experts {num_experts}")
    if bool(((ids < 0) | (ids >= num_experts)).any()):
        raise LaunchError("an expert id outside [0, num_experts): the routing kernels index "
                          "shared memory by id")
    for name, w in (("gemm1_weights", gemm1_weights), ("gemm2_weights", gemm2_weights)):
        if w.shape[0] != local_num_experts:
            raise LaunchError(f"{name} has {w.shape[0]} experts, local_num_experts is {local_num_experts}")
    if gemm1_weights.shape[1] != 2 * intermediate_size:
        raise LaunchError(f"gemm1 rows {gemm1_weights.shape[1]} != 2 * {intermediate_size}")
    if gemm1_clamp_limit is not None and gemm1_clamp_limit.numel() != local_num_experts:
        raise LaunchError("gemm1_clamp_limit must hold one limit per local expert")

    tokens, hidden = hidden_states.shape
    plain = {"w13_weight": gemm1_weights, "w13_weight_scale": gemm1_weights_scale,
             "w2_weight": gemm2_weights, "w2_weight_scale": gemm2_weights_scale}
    from_trtllm_layout(plain)
    local = ids.long() - local_expert_offset
    is_local = (local >= 0) & (local < local_num_experts)
    routes = [(int(e), t, k) for t in range(tokens) for k in range(top_k)
              for e in [int(local[t, k])] if bool(is_local[t, k])]
    routes.sort()  # expert-major, then token order (t, k)
    permuted_idx = torch.full((tokens * top_k,), -1, dtype=torch.int32)
    row = 0
    slots: list[tuple[int, int, int]] = []
    for i, (e, t, k) in enumerate(routes):
        if i and routes[i - 1][0] != e:
            row = -(-row // TILE_TOKENS) * TILE_TOKENS  # pad the previous expert's run
        permuted_idx[t * top_k + k] = row
        slots.append((row, e, t))
        row += 1
    rows_total = max(TILE_TOKENS, -(-row // TILE_TOKENS) * TILE_TOKENS)
    if row_order_seed is not None:
        g = torch.Generator().manual_seed(row_order_seed)
        targets = torch.randperm(rows_total, generator=g).tolist()
        new_row = {old: targets[i] for i, (old, _, _) in enumerate(slots)}
        slots = [(new_row[r], e, t) for r, e, t in slots]
        permuted_idx = torch.tensor([new_row[v] if v >= 0 else -1 for v in permuted_idx.tolist()],
                                    dtype=torch.int32)
    gemm2 = torch.full((rows_total, hidden), float("nan"), dtype=torch.bfloat16)
    for row, e, t in slots:
        w13 = dequantize_mxfp4(plain["w13_weight"][e:e + 1], plain["w13_weight_scale"][e:e + 1])
        w2 = dequantize_mxfp4(plain["w2_weight"][e:e + 1], plain["w2_weight_scale"][e:e + 1])
        limit = None if gemm1_clamp_limit is None else float(gemm1_clamp_limit[e])
        y = _swiglu_pick(hidden_states[t:t + 1], w13, w2, None, None, torch.bfloat16, limit)
        gemm2[row] = y[0].to(torch.bfloat16)
    return [gemm2, weights, permuted_idx]
