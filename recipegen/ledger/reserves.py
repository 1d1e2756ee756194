"""The measured reserves of a lane: HBM (non-expert, non-KV) and host (page cache, processes)."""

from __future__ import annotations

from typing import Any

from recipegen.ledger.figures import Figure
from recipegen.schema import Lane, Machine, Model


def hbm_reserve(model: Model, machine: Machine, lane: Lane, add: Any) -> float:
    spec = lane.reserves.hbm
    tp = lane.tensor_parallel_size
    if spec.value is not None:
        return add(Figure("hbm.reserve", "HBM reserve (non-expert, non-KV)", spec.value, "bytes", "", {},
                          f"measured input: {spec.source}")).value
    m = spec.back_solved_from
    assert m is not None
    hot_at_measure = m.hot_experts_per_layer * model.num_moe_layers * model.expert_bytes / tp
    value = machine.gpus.hbm * m.gpu_memory_utilization - hot_at_measure - m.kv_pool
    return add(Figure(
        "hbm.reserve", "HBM reserve (dense, drafter, activations, CUDA graphs)", value, "bytes",
        "hbm_capacity × measured_utilization − measured_hot × moe_layers × bytes_per_expert / tp − measured_kv_pool",
        {"hbm_capacity_bytes": machine.gpus.hbm, "measured_utilization": m.gpu_memory_utilization,
         "measured_hot": m.hot_experts_per_layer, "moe_layers": model.num_moe_layers,
         "bytes_per_expert": model.expert_bytes, "tp": tp, "measured_kv_pool_bytes": m.kv_pool},
        f"back-solved from a measured boot: {spec.source}")).value


def host_reserve(model: Model, lane: Lane, add: Any, notes: list[str]) -> float:
    spec = lane.reserves.host
    if spec is None:
        notes.append("no host reserve declared: page cache and processes are not counted")
        return add(Figure("host.reserve", "host reserve (page cache, processes)", 0, "bytes", "", {},
                          "not declared (reserves.host)")).value
    if spec.value is not None:
        return add(Figure("host.reserve", "host reserve (page cache, processes)", spec.value, "bytes",
                          "", {}, f"measured input: {spec.source}")).value
    m = spec.back_solved_from
    assert m is not None
    value = m.host_used - m.pinned_experts - model.host_table_bytes
    return add(Figure("host.reserve", "host reserve (page cache, processes)", value, "bytes",
                      "measured_host_used − measured_pinned_experts − host_tables",
                      {"measured_host_used_bytes": m.host_used,
                       "measured_pinned_experts_bytes": m.pinned_experts,
                       "host_tables_bytes": model.host_table_bytes},
                      f"back-solved from a measured boot: {spec.source}")).value
