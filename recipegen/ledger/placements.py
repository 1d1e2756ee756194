"""The lane's two placements of its routed experts (usage-aware, positional) and what each leaves
for KV: hot/cold counts per layer, HBM in use, the KV pool in bytes, tokens and sequences."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from recipegen.common.units import GiB, format_bytes, largest_count_within
from recipegen.ledger.budget import declared_split
from recipegen.ledger.figures import Figure
from recipegen.ledger.kv import kv_tokens_figure, sequence_block, sequence_tokens
from recipegen.ledger.placement import experts_only, layer_param_bytes, positional_walk
from recipegen.ledger.result import POSITIONAL, USAGE_AWARE, PlacementLedger, n_total_bytes, rounded, src_note
from recipegen.schema import Lane, Model


def usage_aware_placement(model: Model, lane: Lane, rowmap_hot: Sequence[int] | None,
                           rowmap_label: str | None) -> PlacementLedger:
    n, experts = model.num_moe_layers, model.routed_experts
    if lane.offload.placement == USAGE_AWARE:
        split = declared_split(model, lane.offload)
        if split.declared == "cold_experts_budget":
            basis = (f"cold_experts_budget {format_bytes(split.budget_bytes or 0)} buys "
                     f"{split.cold_per_layer} cold per layer (largest whole count that fits)")
        else:
            basis = f"hot_experts_per_layer = {split.hot_per_layer}"
        if rowmap_hot is not None:
            hot = list(rowmap_hot)
            basis = f"{rowmap_label}; budget: {basis}"
        else:
            hot = [split.hot_per_layer] * n
            basis = f"declared budget ({basis}); row map not read"
    else:
        # What usage-aware residency would hold at this lane's positional byte budget (vLLM reads
        # --cpu-offload-gb per GPU: the box's host holds TP times it).
        tp = lane.tensor_parallel_size
        budget = (lane.offload.load_cpu_offload or 0) * tp
        cold = min(experts, largest_count_within(budget, n * model.expert_bytes))
        hot = [experts - cold] * n
        basis = (f"same budget as --cpu-offload-gb ({format_bytes(budget)}"
                 + (f": {format_bytes(budget // tp)} per GPU × {tp}" if tp > 1 else "")
                 + f"): {cold} cold per layer (largest whole count that fits)")
    e = model.expert_bytes
    return PlacementLedger(USAGE_AWARE, hot, [experts - h for h in hot], basis,
                           sum(hot) * e, sum(experts - h for h in hot) * e)


def positional_placement(model: Model, lane: Lane) -> PlacementLedger:
    budget = lane.offload.load_cpu_offload or 0
    walk = positional_walk(model, budget, experts_only=experts_only(lane), ranks=lane.tensor_parallel_size)
    e = model.expert_bytes
    full = model.routed_experts * e
    # Express the walk in expert counts per layer (a partly offloaded layer has its w13 in host).
    cold = [round(b / e) for b in walk.host_per_layer]
    placement = PlacementLedger(
        POSITIONAL, [model.routed_experts - c for c in cold], cold,
        f"vLLM --cpu-offload-gb {budget / GiB:g}: first {walk.layers_whole} MoE layers whole"
        + (f", {walk.layers_partial} partly" if walk.layers_partial else "") + " (approximation)",
        n_total_bytes(model) - walk.offloaded_bytes, walk.offloaded_bytes)
    placement.figures["positional.offloaded"] = Figure(
        "positional.offloaded", "experts offloaded by --cpu-offload-gb (approximation)",
        walk.offloaded_bytes, "bytes",
        "walk expert parameters in module order, offloading each while the total < budget × tp "
        "(each GPU walks its 1/tp shards with the whole per-GPU budget)",
        {"budget_bytes": budget, "tp": lane.tensor_parallel_size,
         "layer_param_bytes": [rounded(b) for b in layer_param_bytes(model)],
         "layers_whole": walk.layers_whole, "layers_partial": walk.layers_partial,
         "layer_experts_bytes": full},
        "approximation of vllm/model_executor/offloader/uva.py:74-125: "
        + ("each decoder layer's non-routed parameters are walked as one chunk before its experts "
           f"({walk.dense_offloaded:,} B of them offloaded)" if model.decoder_layer_bytes is not None
           else "dense parameters the real walk also meets are ignored"))
    measured = [m for m in model.positional_offload if m.cpu_offload == budget]
    if measured:
        i = model.positional_offload.index(measured[0])
        placement.figures["positional.measured"] = Figure(
            "positional.measured", "experts offloaded, measured", measured[0].offloaded, "bytes", "", {},
            "measured input: " + (src_note(model.sources, f"positional_offload[{i}].offloaded") or "catalog"))
        placement.figures["positional.measured_delta"] = Figure(
            "positional.measured_delta", "measured − approximation", measured[0].offloaded - walk.offloaded_bytes,
            "bytes", "measured − approximation",
            {"measured_bytes": measured[0].offloaded, "approximation_bytes": walk.offloaded_bytes},
            "the real walk also offloads dense parameters it meets")
    for i, share in enumerate(model.positional_cold_pick_share):
        placement.figures[f"positional.cold_pick_share[{i}]"] = Figure(
            f"positional.cold_pick_share[{i}]", "share of routed picks on host experts (measured)",
            share, "ratio", "", {}, "measured input: "
            + (src_note(model.sources, f"positional_cold_pick_share[{i}]") or "catalog"))
    return placement


def walk_count(walk_bytes: float, bytes_per_expert: int) -> int | float:
    """Routed experts in `walk_bytes`: a whole count where the walk ends at a layer's end, else the
    fractional one (the walk stops inside a layer: its w13 offloaded, its w2 not)."""
    whole, part = divmod(int(walk_bytes), bytes_per_expert)
    return int(whole) if part == 0 and walk_bytes == int(walk_bytes) else walk_bytes / bytes_per_expert


def positional_experts_figure(key: str, label: str, p: PlacementLedger, model: Model, *, hot: bool) -> Figure:
    """A positional placement's routed experts in HBM (`hot`) or in host, as bytes of vLLM's
    --cpu-offload-gb walk: the walk stops inside a layer, so per-layer whole counts × bytes_per_expert
    would not redo it; the count printed beside the bytes is the exact (fractional) one."""
    e = model.expert_bytes
    count = walk_count(p.hot_bytes if hot else p.cold_bytes, e)
    part = "" if isinstance(count, int) else " (fractional: the walk stops inside a layer, after some of its expert parameters)"
    if hot:
        return Figure(key, label, p.hot_bytes, "bytes",
                      "experts.total − walk bytes (positional.offloaded); as a count, hot_experts = "
                      f"(experts.total − walk bytes) / bytes_per_expert{part}",
                      {"experts_total_bytes": n_total_bytes(model), "walk_bytes": p.cold_bytes,
                       "hot_experts": count, "bytes_per_expert": e}, p.basis)
    return Figure(key, label, p.cold_bytes, "bytes",
                  f"walk bytes (positional.offloaded); as a count, cold_experts = walk bytes / bytes_per_expert{part}",
                  {"walk_bytes": p.cold_bytes, "cold_experts": count, "bytes_per_expert": e}, p.basis)


def placement_figures(p: PlacementLedger, model: Model, lane: Lane, cap: float, reserve: float,
                       kv_token_bytes: float, tp: int, bank: float = 0.0, dense_offloaded: float = 0.0,
                       workspace: float = 0.0, ep_hot: Any = None) -> None:
    """HBM and KV figures of one placement. `dense_offloaded`: non-routed bytes vLLM's
    --cpu-offload-gb walk moved to the host at load (they leave HBM for good). `workspace`: the
    runtime's start-up HBM per GPU (`workspace`), allocated before vLLM sizes the KV pool.
    `ep_hot`: an expert-parallel lane's fullest rank (`parallel.EpHot`), whose hot bytes are the
    per-GPU line instead of an even split."""
    e = model.expert_bytes
    hot_total = sum(p.hot_per_layer)
    hot_gpu = p.hot_bytes / tp
    f = p.figures
    if ep_hot is not None:
        hot_gpu = ep_hot.value
        f["hbm.hot_experts"] = Figure(
            "hbm.hot_experts", "hot routed experts in HBM (fullest EP rank)", hot_gpu, "bytes", ep_hot.formula,
            dict(ep_hot.operands), p.basis + ("" if ep_hot.exact else "; upper bound: row map not read"))
    elif p.placement == POSITIONAL:
        f["hbm.hot_experts"] = Figure(
            "hbm.hot_experts", "routed experts left in HBM (per GPU)", hot_gpu, "bytes",
            "(experts.total − offloaded) / tp", {"experts_total_bytes": n_total_bytes(model),
                                                 "offloaded_bytes": p.cold_bytes, "tp": tp}, p.basis)
    else:
        f["hbm.hot_experts"] = Figure(
            "hbm.hot_experts", "hot routed experts in HBM (per GPU)", hot_gpu, "bytes",
            "Σ hot per layer × bytes_per_expert / tp",
            {"hot_experts": hot_total, "bytes_per_expert": e, "tp": tp}, p.basis)
    if p.placement == USAGE_AWARE:
        f["host.cold_experts"] = Figure(
            "host.cold_experts", "routed experts pinned in host", p.cold_bytes, "bytes",
            "Σ cold per layer × bytes_per_expert", {"cold_experts": sum(p.cold_per_layer), "bytes_per_expert": e},
            p.basis)
    else:
        f["host.cold_experts"] = positional_experts_figure("host.cold_experts", "routed experts pinned in host",
                                                           p, model, hot=False)
    if lane.kv_cache_bytes is not None:
        kv_pool = float(lane.kv_cache_bytes)
        f["hbm.kv_pool"] = Figure("hbm.kv_pool", "KV pool (per GPU, fixed)", kv_pool, "bytes",
                                  "kv_cache_bytes", {"kv_cache_bytes": lane.kv_cache_bytes})
        f["hbm.used"] = Figure("hbm.used", "HBM in use (per GPU)", reserve + hot_gpu + bank + workspace + kv_pool,
                               "bytes", "reserve + hot_experts + prefetch_bank + runtime_workspace + kv_pool",
                               {"reserve_bytes": reserve, "hot_experts_bytes": hot_gpu,
                                "prefetch_bank_bytes": bank, "runtime_workspace_bytes": workspace,
                                "kv_pool_bytes": kv_pool})
    else:
        kv_pool = cap - reserve - hot_gpu - bank - workspace + dense_offloaded / tp
        operands = {"hbm_cap_bytes": cap, "reserve_bytes": reserve, "hot_experts_bytes": hot_gpu}
        if bank:
            operands["prefetch_bank_bytes"] = bank
        if workspace:
            operands["runtime_workspace_bytes"] = workspace
        if dense_offloaded:
            operands.update(dense_offloaded_bytes=dense_offloaded, tp=tp)
        f["hbm.kv_pool"] = Figure("hbm.kv_pool", "KV pool (per GPU)", kv_pool, "bytes",
                                  "hbm_cap − reserve − hot_experts" + (" − prefetch_bank" if bank else "")
                                  + (" − runtime_workspace" if workspace else "")
                                  + (" + dense_offloaded / tp" if dense_offloaded else ""), operands)
    if dense_offloaded:
        f["host.dense_offloaded"] = Figure(
            "host.dense_offloaded", "non-routed weights offloaded by --cpu-offload-gb", dense_offloaded, "bytes",
            "positional walk over decoder layers (decoder_layer_bytes)", {"budget_bytes": lane.offload.load_cpu_offload},
            "vllm/model_executor/offloader/uva.py:74-125 walks every parameter of each decoder layer; these stay "
            "in host memory (read over the link each step)")
    f["kv.tokens"] = kv_tokens_figure(model, lane, kv_pool, kv_token_bytes, tp)
    tokens = f["kv.tokens"].value
    f["kv.full_sequences"] = Figure("kv.full_sequences", "full max_model_len sequences that fit",
                                    math.floor(tokens / sequence_tokens(lane)), "sequences",
                                    "⌊kv_tokens / max_model_len in whole blocks⌋",
                                    {"kv_tokens": rounded(tokens), "max_model_len": lane.max_model_len,
                                     "block_rounding": sequence_block(lane)})
