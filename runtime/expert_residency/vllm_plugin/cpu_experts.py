"""Per-pick expert function on vLLM's CPU build: the CPU expert kernel (``cpu_fused_moe``) per bank.

vLLM's CPU experts (``CPUUnquantizedExperts`` and its AMX/NEON/VSX subclasses) fuse the top-k
weighting and reduction into the kernel. To get per-pick rows (the split invoke's contract in
``expert_residency.core.split``) each top-k slot ``k`` is one kernel call with top-1, unit weight
and the bank-local row of slot ``k`` for every token (fixed shapes: picks of the other bank read
row 0 and are discarded by the masked write). The value written for a pick therefore depends only
on the token and the expert's rows, never on the bank — which is what the bit-identity claim needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..core.banks import ExpertBank
from ..core.split import PerPickExpertFn

WEIGHT_NAMES = ("w13_weight", "w2_weight")


def cpu_per_pick_fn(routed_experts: Any) -> tuple[PerPickExpertFn | None, str]:
    """(function, backend name) for a RoutedExperts layer on the CPU build; (None, why) otherwise."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    kernel = getattr(routed_experts.quant_method, "moe_kernel", None)
    fused = getattr(kernel, "fused_experts", None)
    backend = type(fused).__name__ if fused is not None else type(routed_experts.quant_method).__name__
    if not isinstance(fused, CPUUnquantizedExperts):
        return None, backend
    if getattr(fused, "_use_zentorch", False):
        return None, backend + " (zentorch)"
    if getattr(fused, "w1_bias", None) is not None or getattr(fused, "w2_bias", None) is not None:
        return None, backend + " (expert biases)"
    activation = routed_experts.activation
    apply: Callable[..., None] = fused.apply

    def per_pick(hidden_states: torch.Tensor, bank: ExpertBank, rows: torch.Tensor,
                 mask: torch.Tensor, out: torch.Tensor) -> None:
        tokens, top_k = rows.shape
        w13, w2 = bank.tensors["w13_weight"], bank.tensors["w2_weight"]
        unit = torch.ones(tokens, 1, dtype=torch.float32, device=hidden_states.device)
        row_out = torch.empty(tokens, out.shape[-1], dtype=out.dtype, device=out.device)
        empty = hidden_states.new_empty(0)
        for k in range(top_k):
            apply(output=row_out, hidden_states=hidden_states, w1=w13, w2=w2,
                  topk_weights=unit, topk_ids=rows[:, k:k + 1].to(torch.int32).contiguous(),
                  activation=activation, global_num_experts=bank.num_rows, expert_map=None,
                  a1q_scale=None, a2_scale=None, workspace13=empty, workspace2=empty,
                  expert_tokens_meta=None, apply_router_weight_on_input=False)
            out[:, k].copy_(torch.where(mask[:, k:k + 1], row_out, out[:, k]))

    return per_pick, backend
