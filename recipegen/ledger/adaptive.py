"""What `offload.adaptive` may cost a lane: the staging row in HBM and the host-link bytes of one
barrier, from the runtime's own formulas (`expert_residency.core.adaptive_config`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from expert_residency.core.adaptive_config import barrier_link_bytes, staging_bytes

from recipegen.common.units import GiB, MiB
from recipegen.ledger.figures import Figure
from recipegen.schema import Lane, Machine, Model


def adaptive_figures(model: Model, machine: Machine, lane: Lane, add: Callable[[Figure], Figure],
                     notes: list[str]) -> None:
    """`adaptive.staging_bytes` and `adaptive.link_bytes_per_barrier` (per GPU), nothing when off.

    Per GPU: a tensor-parallel rank holds 1/tp of every expert row (the ledger's convention for
    experts), so its staging row and its swaps move 1/tp of the expert bytes.
    """
    adaptive = lane.offload.adaptive
    if adaptive is None:
        return
    config = adaptive.runtime_config()
    tp = lane.tensor_parallel_size
    per_expert = model.expert_bytes / tp
    # One staging row per distinct row layout: the model's MoE layers share one expert shape.
    staging = add(Figure(
        "adaptive.staging_bytes", "adaptive: staging row (per GPU)", staging_bytes(round(per_expert)),
        "bytes", "bytes_per_expert / tp × row_layouts",
        {"bytes_per_expert": model.expert_bytes, "tp": tp, "row_layouts": 1},
        "allocated once by the runtime, outside vLLM's KV sizing; one expert row"))
    layers = model.num_moe_layers
    # A swap moves one hot expert out and one cold one in: no barrier swaps more than the smaller
    # bank of a layer, whatever swaps_per_layer allows (10^12 used to price a 140-year barrier).
    hot, cold = _split(model, lane)
    swaps = min(config.swaps_per_layer, hot, cold)
    link = add(Figure(
        "adaptive.link_bytes_per_barrier", "adaptive: host-link traffic per barrier, at most (per GPU)",
        barrier_link_bytes(dataclasses.replace(config, swaps_per_layer=swaps), round(per_expert), layers),
        "bytes", "2 × bytes_per_expert / tp × min(swaps_per_layer, hot, cold per layer) × moe_layers",
        {"bytes_per_expert": model.expert_bytes, "tp": tp, "hot_per_layer": hot, "cold_per_layer": cold,
         "swaps_per_layer": config.swaps_per_layer, "moe_layers": layers},
        "every layer swapping its cap: one expert row in and one out per swap"))
    seconds = link.value / machine.pinned_read_bandwidth
    stall = f"{seconds:.2f} s" if seconds >= 0.1 else f"{seconds * 1e3:.2f} ms"
    notes.append(
        f"adaptive residency: a barrier every {config.interval} forwards moves at most "
        f"{size_text(link.value)} per GPU over the host link (≈ {stall} at "
        f"{machine.pinned_read_bandwidth / 1e9:g} GB/s pinned read, a stall of that step; "
        f"offload.adaptive.swaps_per_layer {config.swaps_per_layer} sets it) and stages through "
        f"{size_text(staging.value)} of HBM")


def _split(model: Model, lane: Lane) -> tuple[int, int]:
    """Hot and cold experts per layer the lane declares (all hot / none cold without a budget)."""
    from recipegen.ledger.budget import declared_split

    offload = lane.offload
    if offload.hot_experts_per_layer is None and offload.cold_experts_budget is None:
        return model.routed_experts, 0
    split = declared_split(model, offload)
    return split.hot_per_layer, split.cold_per_layer


def size_text(value: float) -> str:
    """MiB below an eighth of a GiB, else GiB (the adaptive notes and lines)."""
    return f"{value / MiB:,.2f} MiB" if value < GiB / 8 else f"{value / GiB:,.2f} GiB"
