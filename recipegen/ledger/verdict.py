"""The final-state budget violations of one lane (HBM cap, KV for one sequence, host), each with
what to change: each lever checked against the lane's other budgets before it is offered
(`fix_check.vetted`)."""

from __future__ import annotations

import math

from recipegen.common.units import GiB, format_bytes, format_tokens, largest_count_within
from recipegen.ledger.fix_check import UNWORDED, Fix, Recompute, trial, vetted
from recipegen.ledger.kv import sequence_block, sequence_tokens
from recipegen.ledger.pinning import PINNED_ROUNDING, pinned_per_layer
from recipegen.ledger.placement import experts_only, positional_walk
from recipegen.ledger.result import POSITIONAL, USAGE_AWARE, Violation
from recipegen.schema import Lane, Machine, Model


def budget_violations(model: Model, machine: Machine, lane: Lane, cap: float, reserve: float,
                       kv_pool: float, kv_tokens: float, host_total: float, tables: float,
                       host_reserve: float, tp: int, fixed_kv: int | None = None, bank: float = 0.0,
                       kv_token_bytes: float | None = None, workspace: float = 0.0,
                       recompute: Recompute | None = None) -> list[Violation]:
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
        fixed = [Fix(f"lower kv_cache_bytes to at most {format_bytes(max(kv_pool, 0))}",
                     f"lowering kv_cache_bytes to {format_bytes(max(kv_pool, 0))}",
                     lane={"kv_cache_bytes": int(max(kv_pool, 0))}),
                 Fix("lower hot experts per layer")]
        out.append(Violation(
            "hbm", f"reserve + hot experts + the fixed KV pool ({format_bytes(fixed_kv)}) exceed the "
            f"GPU's {format_bytes(cap)} by {format_bytes(over)}",
            vetted(model, machine, lane, "hbm", fixed, f"{fixed[0].text}, or {fixed[1].text}", recompute=recompute), over,
            lane=lane.name))
    elif kv_pool <= 0:
        over = -kv_pool
        if positional:
            # over and need_kv are per GPU, as vLLM reads --cpu-offload-gb
            raise_gib = math.ceil((over + need_kv) / GiB)
            levers = [_raise_offload(lane, raise_gib, f"at least {raise_gib} GiB "
                                                      "(whole layer tensors move, so check the result)")]
        elif hot_max >= 0:
            levers = [_hot(hot_max, f"lower hot experts per layer to {hot_max} (room for one max_model_len "
                                    "sequence)", "lowering")]
        else:
            levers = [Fix("even 0 hot experts leave no room for KV: raise gpu_memory_utilization or use a bigger GPU")]
        util_needed = (reserve + (cap - reserve - kv_pool) + need_kv) / machine.gpus.usable
        if lane.gpu_memory_utilization is not None and util_needed <= 1:
            util = math.ceil(util_needed * 100) / 100
            levers.append(Fix(f"raise gpu_memory_utilization to {util:.2f}",
                              f"raising gpu_memory_utilization to {util:.2f}", lane={"gpu_memory_utilization": util}))
        out.append(Violation(
            "hbm", f"hot experts + HBM reserve exceed the HBM cap by {format_bytes(over)} "
            f"(cap {format_bytes(cap)}): no room left for KV",
            vetted(model, machine, lane, "hbm", levers, ", or ".join(f.text for f in levers), recompute=recompute), over,
            lane=lane.name))
    elif kv_tokens < sequence_tokens(lane):   # vLLM sizes a sequence in whole blocks
        short = sequence_tokens(lane) - kv_tokens
        block = sequence_block(lane)
        length = int(kv_tokens) // block * block
        fixes = [Fix(f"lower max_model_len to at most {length:,} (a whole number of {block}-token blocks)",
                     f"lowering max_model_len to {length:,}", lane={"max_model_len": length})]
        if positional:
            raise_gib = math.ceil(short * kv_token_bytes / tp / GiB)
            fixes.append(_raise_offload(lane, raise_gib, f"about {raise_gib} GiB"))
        elif hot_max >= 0:
            fixes.append(_hot(hot_max, f"lower hot experts per layer to {hot_max}", "lowering"))
        if bank:
            fixes.append(Fix(f"drop the prefetch bank ({format_bytes(bank)} per GPU)", "dropping the prefetch bank",
                             offload={"prefetch_slots_per_layer": 0}))
        out.append(Violation(
            "kv", f"the KV pool holds {format_tokens(kv_tokens)} tokens, less than one max_model_len "
            f"sequence ({lane.max_model_len:,} tokens)",
            vetted(model, machine, lane, "kv", fixes, ", or ".join(f.text for f in fixes), recompute=recompute),
            short * kv_token_bytes, lane=lane.name))
    if host_total > machine.host_memory:
        over = host_total - machine.host_memory
        available = machine.host_memory - tables - host_reserve
        if available < 0:
            fix = "host tables + host reserve alone exceed host memory: this model does not fit this machine"
        elif positional and trial():   # the value is a search over offloads; a trial lane's fix is never printed
            fix = UNWORDED
        else:
            cold_max = min(experts, largest_count_within(available, n * e))
            hot_min = experts - cold_max
            if positional:
                gib = _pinned_budget(model, lane, available, tp)
                levers = [Fix(f"lower offload.load_cpu_offload to at most {gib} GiB",
                              f"lowering offload.load_cpu_offload to {gib} GiB", offload={"load_cpu_offload": gib * GiB}),
                          Fix(f"switch to usage-aware placement with {hot_min}+ hot per layer",
                              f"switching to usage-aware placement with {hot_min} hot per layer",
                              offload={"placement": USAGE_AWARE, "hot_experts_per_layer": hot_min})]
                fix = vetted(model, machine, lane, "host", levers, f"{levers[0].text} (or {levers[1].text})", recompute=recompute)
            else:
                lever = _hot(hot_min, f"raise hot experts per layer to at least {hot_min} ({cold_max} cold, "
                                      f"{format_bytes(cold_max * n * e)} pinned)", "raising")
                printed = lever.text
                if hot_min > hot_max:
                    printed += (f" — but HBM then holds at most {max(hot_max, 0)} hot with room for one "
                                "max_model_len sequence: no split fits both; lower max_model_len or add memory")
                fix = vetted(model, machine, lane, "host", [lever], printed, recompute=recompute)
        out.append(Violation(
            "host", f"host memory over by {format_bytes(over)}: host tables {format_bytes(tables)} + "
            + (f"vLLM's pinned blocks of the offloaded experts ({PINNED_ROUNDING}) "
               if positional else "pinned experts ")
            + f"{format_bytes(host_total - tables - host_reserve)} + reserve "
            f"{format_bytes(host_reserve)} = {format_bytes(host_total)} > {format_bytes(machine.host_memory)}",
            fix, over, lane=lane.name))
    return out


def _raise_offload(lane: Lane, gib: int, by: str) -> Fix:
    """Raise a positional lane's `--cpu-offload-gb` by `gib` whole GiB (`by`: how the fix words it)."""
    return Fix(f"raise offload.load_cpu_offload by {by}", f"raising offload.load_cpu_offload by {gib} GiB",
               offload={"load_cpu_offload": (lane.offload.load_cpu_offload or 0) + gib * GiB})


def _hot(hot: int, text: str, verb: str) -> Fix:
    """Set a usage-aware lane's hot experts per layer to `hot` (a declared byte budget gives way to the count)."""
    return Fix(text, f"{verb} hot experts per layer to {hot}",
               offload={"hot_experts_per_layer": hot, "cold_experts_budget": None})


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
