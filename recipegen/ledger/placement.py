"""Where routed experts sit: vLLM's positional walk, row-map counts, and the re-homing peak.

Pure arithmetic on per-layer byte lists; no I/O.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from recipegen.ledger.flags import flag_values
from recipegen.schema import Lane, Model


def layer_param_bytes(model: Model) -> list[int]:
    """Bytes of each expert parameter of one MoE layer, in module order (w13 then w2).

    vLLM stores each of a layer's expert tensors as one parameter holding all routed experts.
    Without declared tensors, the layer's experts count as one parameter.
    """
    experts = model.routed_experts
    if model.expert_tensors:
        return [int(t.num_bytes()) * experts for t in model.expert_tensors]
    return [model.expert_bytes * experts]


@dataclass(frozen=True)
class PositionalWalk:
    """What plain `--cpu-offload-gb` moves to host, per MoE layer (bytes)."""

    budget_bytes: int
    host_per_layer: list[int]   # routed-expert bytes offloaded, per MoE layer
    offloaded_bytes: int        # routed-expert bytes offloaded
    layers_whole: int        # MoE layers with every expert parameter offloaded
    layers_partial: int      # MoE layers with some expert parameters offloaded
    dense_offloaded: int = 0  # non-routed bytes the walk met first (with decoder_layer_bytes)


# Parameter-name segments of routed-expert parameters (vLLM FusedMoE: `mlp.experts.w13_weight`, ...).
EXPERT_SEGMENTS = frozenset({"experts", "w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale",
                             "w13_bias", "w2_bias", "w13_weight_scale_inv", "w2_weight_scale_inv"})


def offload_param_filter(extra_args: list[str]) -> frozenset[str]:
    """The segments of a lane's `--cpu-offload-params` (vLLM 0.33: only matching parameters are
    offloaded, vllm/model_executor/offloader/uva.py:102-113), empty when not set."""
    return frozenset(v for value in flag_values(list(extra_args), "--cpu-offload-params")
                     for v in value.split(",") if v)


def experts_only(lane: Lane) -> bool:
    """Whether the lane's `--cpu-offload-params` names routed-expert parameters only."""
    segments = offload_param_filter(list(lane.extra_args))
    return bool(segments) and segments <= EXPERT_SEGMENTS


def positional_walk(model: Model, budget_bytes: int, *, experts_only: bool = False,
                    ranks: int = 1) -> PositionalWalk:
    """vLLM 0.33 `UVAOffloader._maybe_offload_to_cpu` (vllm/model_executor/offloader/uva.py:74-125):
    walk parameters in module order and offload each while the running total is below the
    budget (so the last one overshoots).

    `budget_bytes` is `--cpu-offload-gb` as vLLM reads it: per GPU (vllm/config/offload.py:23-32,
    "The space in GiB to offload to CPU, per GPU"). Under tensor parallelism each of the `ranks`
    workers walks its own parameters with the whole budget; a routed-expert parameter splits
    evenly over them (its 1/TP intermediate slice, or E/TP whole experts under expert parallelism),
    so the box-wide walk is the unsharded one at `ranks` × the budget, and the bytes returned are
    the box's (per GPU: / ranks). Non-routed chunks are taken as split too (an approximation:
    some of them are replicated).

    With the model's `decoder_layer_bytes`, every decoder layer is walked in order, its
    non-routed parameters (one chunk: attention, norms, router, shared experts; a dense layer's
    MLP) before its routed experts. Without them only routed-expert parameters are walked (the
    real walk also moves the dense parameters it meets first — a measured figure is the check on
    this). A layer's scales travel with their weights. `experts_only`: the lane restricts the
    walk to routed-expert parameters (`--cpu-offload-params experts`), so dense ones stay in HBM.
    """
    params = layer_param_bytes(model)
    per_layer = [0] * model.num_moe_layers
    total = dense = 0
    layers = model.decoder_layer_bytes
    if layers is None or experts_only:
        order: list[tuple[int | None, list[int]]] = [(i, params) for i in range(model.num_moe_layers)]
    else:
        moe_pos = {layer: i for i, layer in enumerate(model.moe_layers)}
        order = []
        for layer in range(model.decoder_layers):
            if layers.layers is not None:  # hybrids: each layer's own non-routed bytes
                order.append((None, [layers.layers[layer]]))
                if layer in moe_pos:
                    order.append((moe_pos[layer], params))
            elif layer in moe_pos:
                order.append((None, [layers.moe_layer]))
                order.append((moe_pos[layer], params))
            else:
                order.append((None, [layers.dense_layer or 0]))
    limit = budget_bytes * ranks
    for position, sizes in order:
        for size in sizes:
            if total + dense >= limit:
                break
            if position is None:
                dense += size
            else:
                total += size
                per_layer[position] += size
    full = sum(params)
    whole = sum(1 for b in per_layer if b == full)
    partial = sum(1 for b in per_layer if 0 < b < full)
    return PositionalWalk(budget_bytes, per_layer, total, whole, partial, dense)


@dataclass(frozen=True)
class RehomingPeaks:
    """Expert bytes on each side at load, at the worst moment of re-homing, and at the end."""

    hbm_initial: int
    host_initial: int
    hbm_peak: int
    host_peak: int
    hbm_final: int
    host_final: int
    order: list[int]          # MoE layer positions in re-homing order


def rehoming_peaks(initial_hbm: list[int], initial_host: list[int],
                   final_hbm: list[int], final_host: list[int]) -> RehomingPeaks:
    """Expert bytes on each side while the runtime re-homes from the load placement to the map.

    The order is the runtime's own (`expert_residency.core.plan.plan_rehome_order`, stdlib-only),
    so the ledger predicts the peaks the runtime will produce: each layer's new banks are allocated
    before its original tensors are freed; HBM-resident and offloaded layers are interleaved so
    neither side exceeds max(initial, final) by more than one layer. A layer the positional walk
    offloaded only partly (w13 on the host, w2 still in HBM) is planned with its exact split.
    """
    if all(initial_hbm[i] == final_hbm[i] and initial_host[i] == final_host[i] for i in range(len(initial_hbm))):
        hbm, host = sum(initial_hbm), sum(initial_host)
        return RehomingPeaks(hbm, host, hbm, host, hbm, host, [])
    peak, final, order = _planned(tuple(initial_hbm), tuple(initial_host), tuple(final_hbm), tuple(final_host))
    return RehomingPeaks(sum(initial_hbm), sum(initial_host), max(peak[0], sum(initial_hbm)),
                         max(peak[1], sum(initial_host)), final[0], final[1], list(order))


@functools.lru_cache(maxsize=8192)
def _planned(initial_hbm: tuple[int, ...], initial_host: tuple[int, ...], final_hbm: tuple[int, ...],
             final_host: tuple[int, ...]) -> tuple[tuple[int, int], tuple[int, int], tuple[int, ...]]:
    """The runtime's re-homing plan (peak, final, order) for these placements. Kept: a fit searches
    load offloads for each hot count and lands on the same placements many times, and the plan is a
    search of its own."""
    from expert_residency.core.plan import LayerPlacement, plan_rehome_order

    layers = [LayerPlacement(i, initial_host[i] == 0, final_hbm[i], final_host[i], device_bytes=initial_hbm[i])
              for i in range(len(initial_hbm))]
    plan = plan_rehome_order(layers)
    return tuple(plan.peak), tuple(plan.final), tuple(plan.order)
