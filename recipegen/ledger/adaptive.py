"""What `offload.adaptive` costs a lane: the spare rows its swaps are copied into (HBM and host
memory) and the copies' traffic over the host link, from the runtime's own formulas
(`expert_residency.core.adaptive_config`). The copies run beside the decode steps; a barrier only
flips map entries (docs/adaptive.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from expert_residency.core.adaptive_config import (
    barrier_link_bytes,
    copy_bytes_per_step,
    spare_hbm_bytes,
    spare_host_bytes,
)

from recipegen.common.units import GiB, MiB
from recipegen.ledger.figures import Figure
from recipegen.schema import Lane, Machine, Model


def adaptive_hbm(model: Model, lane: Lane, add: Callable[[Figure], Figure]) -> float:
    """`adaptive.spare_hbm_bytes` per GPU (0 when off): the runtime allocates the spare rows with
    the hot bank, before vLLM sizes its KV cache, so they come out of the KV pool like the banks.

    Per GPU: a tensor-parallel rank holds 1/tp of every expert row (the ledger's convention for
    experts), so its spare rows and its copies are 1/tp of the expert bytes.
    """
    adaptive = lane.offload.adaptive
    if adaptive is None:
        return 0.0
    config = adaptive.runtime_config()
    tp, layers = lane.tensor_parallel_size, model.num_moe_layers
    per_expert = round(model.expert_bytes / tp)
    return add(Figure(
        "adaptive.spare_hbm_bytes", "adaptive: spare HBM rows (per GPU)",
        spare_hbm_bytes(config, per_expert, layers), "bytes",
        "spare_rows × bytes_per_expert / tp × moe_layers",
        {"spare_rows": config.spare_rows, "bytes_per_expert": model.expert_bytes, "tp": tp, "moe_layers": layers},
        "allocated with the hot bank, before vLLM sizes the KV cache: the promoted experts are "
        "copied into them while steps run")).value


def adaptive_host_and_link(model: Model, machine: Machine, lane: Lane, hot_bytes: float,
                           add: Callable[[Figure], Figure], notes: list[str]) -> float:
    """`adaptive.spare_host_bytes` (returned: host memory the lane pins besides the cold bank),
    `adaptive.copy_bytes_per_step` and `adaptive.link_bytes_per_plan`, per GPU; nothing when off.
    `hot_bytes`: the lane's hot experts per GPU (what `host_copies: all` keeps a copy of)."""
    adaptive = lane.offload.adaptive
    if adaptive is None:
        return 0.0
    config = adaptive.runtime_config()
    tp, layers = lane.tensor_parallel_size, model.num_moe_layers
    per_expert = round(model.expert_bytes / tp)
    if config.host_copies == "all":
        host = add(Figure(
            "adaptive.spare_host_bytes", "adaptive: host copies of the hot experts (per GPU)", hot_bytes,
            "bytes", "hot experts per GPU (host_copies: all)", {"hot_experts_bytes": hot_bytes},
            "pinned beside the cold bank: every hot expert's bytes stay on the host, so a demotion "
            "is a map change and nothing is copied back")).value
    else:
        host = add(Figure(
            "adaptive.spare_host_bytes", "adaptive: spare host rows (per GPU)",
            spare_host_bytes(config, per_expert, layers, 0), "bytes",
            "spare_rows × bytes_per_expert / tp × moe_layers",
            {"spare_rows": config.spare_rows, "bytes_per_expert": model.expert_bytes, "tp": tp, "moe_layers": layers},
            "pinned beside the cold bank: a demoted expert the host no longer holds is copied back "
            "into one (HBM → host, the link direction the cold reads do not use)")).value
    step = add(Figure(
        "adaptive.copy_bytes_per_step", "adaptive: host → HBM copies per decode step while adapting, at most (per GPU)",
        copy_bytes_per_step(config, per_expert, layers), "bytes",
        "copy_rows_per_layer × moe_layers × bytes_per_expert / tp",
        {"copy_rows_per_layer": config.copy_rows_per_layer, "moe_layers": layers,
         "bytes_per_expert": model.expert_bytes, "tp": tp},
        "on a side stream beside the step; shares the host link with the cold bank's reads"))
    ways = "1" if config.host_copies == "all" else "2"
    # A swap trades one hot expert for one cold one: no plan swaps more than the smaller bank of a
    # layer, whatever swaps_per_layer allows (10^12 once priced a barrier of 140 years).
    hot, cold = _split(model, lane)
    capped = dataclasses.replace(config, swaps_per_layer=min(config.swaps_per_layer, hot, cold))
    plan = add(Figure(
        "adaptive.link_bytes_per_plan", "adaptive: host-link traffic of one plan, at most (per GPU)",
        barrier_link_bytes(capped, per_expert, layers), "bytes",
        f"{ways} × bytes_per_expert / tp × min(swaps_per_layer, hot, cold per layer) × moe_layers",
        {"bytes_per_expert": model.expert_bytes, "tp": tp, "hot_per_layer": hot, "cold_per_layer": cold,
         "swaps_per_layer": config.swaps_per_layer, "moe_layers": layers},
        "every layer swapping its cap: one row in per swap" + ("" if ways == "1" else ", one row out at most")))
    bandwidth = machine.pinned_read_bandwidth
    notes.append(
        f"adaptive residency: swaps are copied beside the decode steps, at most {size_text(step.value)} per step "
        f"and GPU (≈ {_duration(step.value / bandwidth)} of the {bandwidth / 1e9:g} GB/s host link, shared with "
        f"the cold reads; offload.adaptive.copy_rows_per_layer {config.copy_rows_per_layer:g} sets it); a plan "
        f"copies at most {size_text(plan.value)}; every {config.flip_interval} forwards a flip makes the copied "
        f"swaps live (map entries only). The spare rows take {size_text(spare_hbm_bytes(config, per_expert, layers))} "
        f"of HBM and {size_text(host)} of host memory per GPU (offload.adaptive.spare_rows {config.spare_rows}, "
        f"host_copies {config.host_copies})")
    return host


def _duration(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 0.1 else f"{seconds * 1e3:.2f} ms"


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
