"""Load-time figures: the lane loads with vLLM's `--cpu-offload-gb`, then the runtime re-homes to
the row map; the HBM and host peaks between the two states, and the violations they cause (each
fix checked against the lane's other budgets before it is offered: `fix_check.vetted`)."""

from __future__ import annotations

import math
from typing import Any

from recipegen.common.units import GiB, format_bytes
from recipegen.ledger.figures import Figure
from recipegen.ledger.fix_check import UNWORDED, Fix, Recompute, trial, vetted
from recipegen.ledger.pinning import pinned_operands, pinned_per_layer, rehoming_host_peak
from recipegen.ledger.placement import experts_only, positional_walk, rehoming_peaks
from recipegen.ledger.reserves import load_context_allowance
from recipegen.ledger.result import USAGE_AWARE, PlacementLedger, Violation
from recipegen.schema import Lane, Machine, Model


def load_figures(model: Model, machine: Machine, lane: Lane, active: PlacementLedger, add: Any,
                  reserve: float, declared_weights: float, tables: float, host_reserve: float,
                  violations: list[Violation], tp: int, *, skip_hbm: bool = False,
                  skip_host: bool = False, dense_offloaded: float = 0.0, workspace: float = 0.0,
                  recompute: Recompute | None = None) -> None:
    """`dense_offloaded`: non-routed bytes the walk moved to host (out of HBM, into pinned host).
    `workspace`: the runtime's start-up HBM per GPU (`workspace`): the plugin allocates the counter,
    step masks and kernel objects in `after_model_loaded` before `core.rehome_model` re-homes the
    first layer, so it is live from the load placement to the end of re-homing."""
    e = model.expert_bytes
    budget = lane.offload.load_cpu_offload or 0
    walk = positional_walk(model, budget, experts_only=experts_only(lane), ranks=tp)
    layer_full = model.routed_experts * e
    init_host = walk.host_per_layer
    init_hbm = [layer_full - h for h in init_host]
    if lane.offload.placement == USAGE_AWARE:
        final_hbm = [h * e for h in active.hot_per_layer]
        final_host = [c * e for c in active.cold_per_layer]
        peaks = rehoming_peaks(init_hbm, init_host, final_hbm, final_host)
        how = ("the runtime moves experts layer by layer from where --cpu-offload-gb loaded them to "
               "where the row map puts them, in its order (expert_residency.core.plan), new banks "
               "allocated before the old tensors are freed")
    else:
        final_host = init_host
        peaks = rehoming_peaks(init_hbm, init_host, init_hbm, init_host)
        how = "positional lane: the load placement is the final placement"
    # vLLM pins each offloaded parameter at PyTorch's power-of-two size (recipegen.ledger.pinning).
    pinned = pinned_per_layer(model, init_host)
    pinned_peak = rehoming_host_peak(pinned, final_host, peaks.order)
    how += ("; vLLM's pinned parameters counted as PyTorch's caching host allocator reserves them "
            "(next power of two each: vllm/model_executor/offloader/uva.py:114-116, "
            "ATen/core/CachingHostAllocator.h:300-309), "
            + ("released layer by layer as each is moved" if lane.offload.placement == USAGE_AWARE
               else "kept for the whole run"))
    if model.dense_bytes is not None:
        weights_at_load = declared_weights - dense_offloaded / tp
        weights_note = "dense (+ drafter) weights as declared" + (
            ", less the non-routed bytes --cpu-offload-gb moved to host" if dense_offloaded else "")
    else:
        weights_at_load = reserve
        weights_note = "no dense_bytes declared: the whole HBM reserve is counted (conservative)"
    add(Figure("load.hbm_experts_initial", "experts in HBM after load (per GPU)", peaks.hbm_initial / tp,
               "bytes", "experts.total − positional walk(load_cpu_offload)",
               {"load_cpu_offload_bytes": budget, "offloaded_bytes": walk.offloaded_bytes, "tp": tp}))
    add(Figure("load.host_experts_initial", "experts pinned after load", peaks.host_initial, "bytes",
               "positional walk(load_cpu_offload)", {"load_cpu_offload_bytes": budget}))
    pin_formula, pin_operands = pinned_operands(model, init_host)
    add(Figure("load.host_pinned_initial", "host memory vLLM pins for them", sum(pinned), "bytes",
               pin_formula, pin_operands,
               "vLLM keeps a layer's values and block scales as separate parameters and pins each with "
               "Tensor.pin_memory() (vllm/model_executor/offloader/uva.py:114-116); PyTorch's caching host "
               "allocator reserves the next power of two of each (ATen/core/CachingHostAllocator.h:300-309); "
               "measured on one NVIDIA H200, PyTorch 2.11: a 4.5 GiB tensor pinned 8 GiB"))
    context = load_context_allowance(tp)
    operands = {"weights_at_load_bytes": weights_at_load, "peak_experts_bytes": peaks.hbm_peak, "tp": tp,
                "cuda_context_bytes": context}
    formula = "weights_at_load + peak expert bytes in HBM / tp + cuda_context"
    weights_note += ("; cuda_context: what the worker holds before the weights load (CUDA context and cuBLAS, "
                     "with NCCL on a tensor-parallel lane), measured on one H100: "
                     + (f"{context / 2**20:,.0f} MiB on one GPU" if tp <= 1
                        else f"{context / 2**20:,.0f} MiB per GPU with NCCL, a floor")
                     + " (recipegen.ledger.reserves)")
    if workspace:
        operands["runtime_workspace_bytes"] = workspace
        formula += " + runtime_workspace"
        weights_note += ("; the runtime's workspace, counter and step masks, allocated before the "
                         "runtime moves the first layer's experts (vllm_plugin/worker_runtime.py "
                         "after_model_loaded)")
    hbm_peak = add(Figure("load.hbm_peak", "HBM peak during load (per GPU)",
                          weights_at_load + peaks.hbm_peak / tp + workspace + context, "bytes", formula,
                          operands, f"{how}; {weights_note}; KV is allocated after")).value
    if dense_offloaded:
        host_peak = add(Figure("load.host_peak", "host peak during load",
                               tables + host_reserve + dense_offloaded + pinned_peak, "bytes",
                               "host_tables + host_reserve + dense_offloaded + peak pinned expert bytes",
                               {"host_tables_bytes": tables, "host_reserve_bytes": host_reserve,
                                "dense_offloaded_bytes": dense_offloaded, "peak_pinned_bytes": pinned_peak,
                                "peak_expert_bytes_unrounded": peaks.host_peak},
                               how)).value
    else:
        host_peak = add(Figure("load.host_peak", "host peak during load", tables + host_reserve + pinned_peak,
                               "bytes", "host_tables + host_reserve + peak pinned expert bytes",
                               {"host_tables_bytes": tables, "host_reserve_bytes": host_reserve,
                                "peak_pinned_bytes": pinned_peak,
                                "peak_expert_bytes_unrounded": peaks.host_peak}, how)).value
    capacity = machine.gpus.usable
    # A fix leaves a usage-aware lane's split, row map included, as it is: only the load offload changes.
    rowmap_hot = active.hot_per_layer if lane.offload.placement == USAGE_AWARE else None
    if hbm_peak > capacity and not skip_hbm:
        need = hbm_peak - capacity
        gib = math.ceil((budget + need) / GiB)
        fix = Fix(f"raise offload.load_cpu_offload to at least {gib} GiB so fewer experts land in HBM at load",
                  f"raising offload.load_cpu_offload to {gib} GiB", offload={"load_cpu_offload": gib * GiB})
        violations.append(Violation(
            "load-hbm", f"HBM peaks at {format_bytes(hbm_peak)} while loading, {format_bytes(need)} over "
            f"the GPU's {format_bytes(capacity)}",
            vetted(model, machine, lane, "load-hbm", [fix], fix.text, rowmap_hot=rowmap_hot, recompute=recompute), need, lane=lane.name))
    if host_peak > machine.host_memory and not skip_host:
        need = host_peak - machine.host_memory
        if trial():   # the value is a search over load offloads, and a trial lane's fix is never printed
            suggestion = UNWORDED
        else:
            gib = _largest_fitting_load_offload(model, lane, active, tp, machine.host_memory - tables - host_reserve)
            fix = Fix(f"lower offload.load_cpu_offload to at most {gib} GiB",
                      f"lowering offload.load_cpu_offload to {gib} GiB", offload={"load_cpu_offload": gib * GiB})
            suggestion = vetted(model, machine, lane, "load-host", [fix], fix.text, rowmap_hot=rowmap_hot, recompute=recompute)
        violations.append(Violation(
            "load-host", f"host memory peaks at {format_bytes(host_peak)} while loading, "
            f"{format_bytes(need)} over the machine's {format_bytes(machine.host_memory)}",
            suggestion, need, lane=lane.name))


def _pinned_load_peak(model: Model, lane: Lane, active: PlacementLedger, tp: int, budget: float) -> float:
    """Host bytes a load with `--cpu-offload-gb` = `budget` peaks at, beyond tables and reserve: vLLM's
    pinned blocks (each parameter at its power-of-two size) while the runtime re-homes, and the non-routed
    bytes the walk moved — the same arithmetic as `load.host_peak`."""
    e = model.expert_bytes
    walk = positional_walk(model, budget, experts_only=experts_only(lane), ranks=tp)
    init_host = walk.host_per_layer
    init_hbm = [model.routed_experts * e - h for h in init_host]
    if lane.offload.placement == USAGE_AWARE:
        final_host = [c * e for c in active.cold_per_layer]
        peaks = rehoming_peaks(init_hbm, init_host, [h * e for h in active.hot_per_layer], final_host)
    else:
        final_host = init_host
        peaks = rehoming_peaks(init_hbm, init_host, init_hbm, init_host)
    return rehoming_host_peak(pinned_per_layer(model, init_host), final_host, peaks.order) + walk.dense_offloaded


def _largest_fitting_load_offload(model: Model, lane: Lane, active: PlacementLedger, tp: int,
                                  available: float) -> int:
    """The largest whole-GiB `load_cpu_offload` whose load-time host peak fits `available` bytes (host
    memory less tables and reserve). Pinned blocks are powers of two, so lowering the offload by the
    bytes over does not give the answer: each whole GiB below the lane's is tried, as the ledger counts it."""
    gib = math.floor((lane.offload.load_cpu_offload or 0) / GiB)
    while gib > 0 and (_pinned_at_load(model, lane, tp, gib * GiB) > available
                       or _pinned_load_peak(model, lane, active, tp, gib * GiB) > available):
        gib -= 1
    return gib


def _pinned_at_load(model: Model, lane: Lane, tp: int, budget: float) -> float:
    """What `_pinned_load_peak` starts from, its floor: every offloaded layer's pinned blocks and the
    non-routed bytes the walk moved, before any re-homing. Cheap; where it is over already, the
    re-homing order (a search) need not be planned to know the offload does not fit."""
    walk = positional_walk(model, budget, experts_only=experts_only(lane), ranks=tp)
    return sum(pinned_per_layer(model, walk.host_per_layer)) + walk.dense_offloaded
