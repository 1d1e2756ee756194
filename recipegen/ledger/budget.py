"""Offload budget <-> hot/cold counts (DESIGN: a byte budget buys the largest whole count that fits)."""

from __future__ import annotations

from dataclasses import dataclass

from recipegen.common.units import largest_count_within
from recipegen.schema import Model, Offload


@dataclass(frozen=True)
class DeclaredSplit:
    """The lane's declared budget as per-layer counts, and which form was declared."""

    hot_per_layer: int
    cold_per_layer: int
    declared: str  # "hot_experts_per_layer" | "cold_experts_budget"
    budget_bytes: int | None  # the declared cold byte budget, if that form was used


def declared_split(model: Model, offload: Offload) -> DeclaredSplit:
    """Per-layer hot/cold counts implied by a usage-aware lane's declared budget."""
    experts = model.routed_experts
    if offload.hot_experts_per_layer is not None:
        hot = offload.hot_experts_per_layer
        return DeclaredSplit(hot, experts - hot, "hot_experts_per_layer", None)
    assert offload.cold_experts_budget is not None, "usage-aware offload declares one budget form"
    per_layer_expert_bytes = model.num_moe_layers * model.expert_bytes  # one expert in every layer
    cold = min(experts, largest_count_within(offload.cold_experts_budget, per_layer_expert_bytes))
    return DeclaredSplit(experts - cold, cold, "cold_experts_budget", offload.cold_experts_budget)
