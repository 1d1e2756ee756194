"""The final-state budget violations of one lane (HBM cap, KV for one sequence, host), each with
what to change."""

from __future__ import annotations

import math

from recipegen.common.units import GiB, format_bytes, format_tokens, largest_count_within
from recipegen.ledger.kv import sequence_block, sequence_tokens
from recipegen.ledger.pinning import PINNED_ROUNDING, pinned_per_layer
from recipegen.ledger.placement import experts_only, positional_walk
from recipegen.ledger.result import POSITIONAL, Violation
from recipegen.schema import Lane, Machine, Model


def budget_violations(model: Model, machine: Machine, lane: Lane, cap: float, reserve: float,
                       kv_pool: float, kv_tokens: float, host_total: float, tables: float,
                       host_reserve: float, tp: int, fixed_kv: int | None = None, bank: float = 0.0,
                       kv_token_bytes: float | None = None, workspace: float = 0.0) -> list[Violation]:
    """HBM (cap, KV for one max_model_len) and host budgets of one lane, with what to change.

    `kv_pool`: for a utilisation lane the pool that is left; for a fixed-pool lane the room the
    cap leaves for it (so a negative or short value means the fixed pool does not fit).
    """
    out: list[Violation] = []
    e, n, experts = model.expert_bytes, model.num_moe_layers, model.routed_experts
    per_hot = n * e / tp                          # HBM per GPU for one more hot expert per layer
    kv_token_bytes = kv_token_bytes or model.kv_token_bytes
    need_kv = lane.max_model_len * kv_token_bytes / tp
    positional = lane.offload.placement == POSITIONAL
    # Largest hot count per layer that leaves room for one max_model_len sequence.
    room = cap - reserve - bank - workspace - need_kv  # workspace: the runtime's start-up HBM
    hot_max = min(experts, math.floor(room / per_hot)) if room >= 0 else -1
    if fixed_kv is not None and kv_pool < fixed_kv:
        over = fixed_kv - kv_pool
        out.append(Violation(
            "hbm", f"reserve + hot experts + the fixed KV pool ({format_bytes(fixed_kv)}) exceed the "
            f"GPU's {format_bytes(cap)} by {format_bytes(over)}",
            f"lower kv_cache_bytes to at most {format_bytes(max(kv_pool, 0))}, or lower hot experts "
            "per layer", over, lane=lane.name))
    elif kv_pool <= 0:
        over = -kv_pool
        if positional:
            # over and need_kv are per GPU, as vLLM reads --cpu-offload-gb
            fix = (f"raise offload.load_cpu_offload by at least {math.ceil((over + need_kv) / GiB)} GiB "
                   "(whole layer tensors move, so check the result)")
        elif hot_max >= 0:
            fix = f"lower hot experts per layer to {hot_max} (room for one max_model_len sequence)"
        else:
            fix = "even 0 hot experts leave no room for KV: raise gpu_memory_utilization or use a bigger GPU"
        util_needed = (reserve + (cap - reserve - kv_pool) + need_kv) / machine.gpus.usable
        if lane.gpu_memory_utilization is not None and util_needed <= 1:
            fix += f", or raise gpu_memory_utilization to {math.ceil(util_needed * 100) / 100:.2f}"
        out.append(Violation(
            "hbm", f"hot experts + HBM reserve exceed the HBM cap by {format_bytes(over)} "
            f"(cap {format_bytes(cap)}): no room left for KV", fix, over, lane=lane.name))
    elif kv_tokens < sequence_tokens(lane):   # vLLM sizes a sequence in whole blocks
        short = sequence_tokens(lane) - kv_tokens
        block = sequence_block(lane)
        fixes = [f"lower max_model_len to at most {int(kv_tokens) // block * block:,} (a whole number of "
                 f"{block}-token blocks)"]
        if positional:
            fixes.append(f"raise offload.load_cpu_offload by about "
                         f"{math.ceil(short * kv_token_bytes / tp / GiB)} GiB")
        elif hot_max >= 0:
            fixes.append(f"lower hot experts per layer to {hot_max}")
        if bank:
            fixes.append(f"drop the prefetch bank ({format_bytes(bank)} per GPU)")
        out.append(Violation(
            "kv", f"the KV pool holds {format_tokens(kv_tokens)} tokens, less than one max_model_len "
            f"sequence ({lane.max_model_len:,} tokens)", ", or ".join(fixes),
            short * kv_token_bytes, lane=lane.name))
    if host_total > machine.host_memory:
        over = host_total - machine.host_memory
        available = machine.host_memory - tables - host_reserve
        if available < 0:
            fix = "host tables + host reserve alone exceed host memory: this model does not fit this machine"
        else:
            cold_max = min(experts, largest_count_within(available, n * e))
            hot_min = experts - cold_max
            if positional:
                fix = (f"lower offload.load_cpu_offload to at most {_pinned_budget(model, lane, available, tp)} GiB "
                       f"(or switch to usage-aware placement with {hot_min}+ hot per layer)")
            else:
                fix = (f"raise hot experts per layer to at least {hot_min} ({cold_max} cold, "
                       f"{format_bytes(cold_max * n * e)} pinned)")
                if hot_min > hot_max:
                    fix += (f" — but HBM then holds at most {max(hot_max, 0)} hot with room for one "
                            "max_model_len sequence: no split fits both; lower max_model_len or add memory")
        out.append(Violation(
            "host", f"host memory over by {format_bytes(over)}: host tables {format_bytes(tables)} + "
            + (f"vLLM's pinned blocks of the offloaded experts ({PINNED_ROUNDING}) "
               if positional else "pinned experts ")
            + f"{format_bytes(host_total - tables - host_reserve)} + reserve "
            f"{format_bytes(host_reserve)} = {format_bytes(host_total)} > {format_bytes(machine.host_memory)}",
            fix, over, lane=lane.name))
    return out


def _pinned_budget(model: Model, lane: Lane, available: float, tp: int) -> int:
    """The largest whole-GiB `--cpu-offload-gb` whose walk, pinned as vLLM pins it (each parameter
    rounded up to a power of two, recipegen.ledger.pinning), fits in `available` host bytes."""
    gib = max(0, math.floor(available / tp / GiB))
    while gib > 0:
        walk = positional_walk(model, gib * GiB, experts_only=experts_only(lane), ranks=tp)
        if sum(pinned_per_layer(model, walk.host_per_layer)) + walk.dense_offloaded <= available:
            break
        gib -= 1
    return gib
