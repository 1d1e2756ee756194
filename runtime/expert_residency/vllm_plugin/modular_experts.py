"""Per-pick expert function through vLLM's own modular MoE kernel (``FusedMoEKernel.apply``), for
unquantized (bf16/fp16) layers on any modular backend.

For unquantized weights everything a bank needs is passed at call time (``w1``/``w2``); quantized
methods keep their scales in the kernel's quant config, built for the whole layer at load, so a
bank's rows would meet the wrong scales — those are refused here. Each top-k slot is one kernel
call with top-1 and unit weight over the bank's rows (fixed shapes; picks of the other bank read
row 0 and are discarded), so the call returns that slot's unweighted pick rows.

Verified end to end on the CPU build (``EXPERT_RESIDENCY_PER_PICK=modular``: the same
``CPUUnquantizedExperts`` reached through prepare/finalize). On GPU backends this path has not
run: bit-identity across bank sizes additionally needs the backend's tiling not to depend on the
number of experts in the call (Triton ``fused_moe`` picks its config by expert count) — to be
verified per backend before relying on it.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.banks import ExpertBank
from ..core.split import PerPickExpertFn


def modular_per_pick_fn(routed_experts: Any) -> tuple[PerPickExpertFn | None, str]:
    """(function, backend description) or (None, why not)."""
    from vllm.model_executor.layers.fused_moe.moe_output import UnfinalizedMoEOutput
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod,
    )

    method = routed_experts.quant_method
    kernel = getattr(method, "moe_kernel", None)
    if kernel is None:
        return None, f"{type(method).__name__} (no modular kernel)"
    backend = type(kernel.fused_experts).__name__
    if kernel.is_monolithic:
        return None, backend + " (monolithic)"
    if not isinstance(method, UnquantizedFusedMoEMethod):
        return None, (f"{backend} ({type(method).__name__}: quantized scales live in the "
                      "kernel's quant config, not per bank)")
    fused = kernel.fused_experts
    if getattr(fused, "w1_bias", None) is not None or getattr(fused, "w2_bias", None) is not None:
        return None, backend + " (expert biases)"
    activation = routed_experts.activation
    ids_dtype = method.topk_indices_dtype or torch.int32

    def per_pick(hidden_states: torch.Tensor, bank: ExpertBank, rows: torch.Tensor,
                 mask: torch.Tensor, out: torch.Tensor) -> None:
        tokens, top_k = rows.shape
        unit = torch.ones(tokens, 1, dtype=torch.float32, device=hidden_states.device)
        for k in range(top_k):
            result = kernel.apply(hidden_states=hidden_states, w1=bank.tensors["w13_weight"],
                                  w2=bank.tensors["w2_weight"], topk_weights=unit,
                                  topk_ids=rows[:, k:k + 1].to(ids_dtype).contiguous(),
                                  activation=activation, global_num_experts=bank.num_rows,
                                  expert_map=None, apply_router_weight_on_input=False)
            if isinstance(result, UnfinalizedMoEOutput):
                raise RuntimeError(f"{backend} deferred its finalize; the per-pick path needs "
                                   "finalized top-1 rows")
            out[:, k].copy_(torch.where(mask[:, k:k + 1], result.to(out.dtype), out[:, k]))

    return per_pick, backend + " via FusedMoEKernel.apply"
