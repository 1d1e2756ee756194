"""The budget ledger of a recipe: HBM, KV, host and load-time figures per lane, and the verdict.

Pure: takes a validated recipe (plus the row maps already read), returns figures. Every size is in
bytes; every figure carries its formula and operands. This module is the only place a budget
formula lives — render, verify, plan and the cost model read its results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from recipegen.ledger.budget import declared_split
from recipegen.ledger.figures import Figure
from recipegen.ledger.placement import layer_param_bytes, positional_walk, rehoming_peaks
from recipegen.schema import Lane, Machine, Model, Recipe
from recipegen.units import GiB, format_bytes, format_tokens, largest_count_within

USAGE_AWARE, POSITIONAL = "usage-aware", "positional"


@dataclass(frozen=True)
class Violation:
    """A budget that does not hold: which, by how much, and what to change."""

    kind: str          # hbm | kv | host | load-hbm | load-host | reserve | gpu-shared | machine-host
    message: str
    suggestion: str
    over_bytes: float | None = None
    lane: str | None = None
    machine: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "message": self.message, "suggestion": self.suggestion}
        if self.over_bytes is not None:
            out["over_bytes"] = self.over_bytes
            out["over_gib"] = self.over_bytes / GiB
        if self.lane:
            out["lane"] = self.lane
        if self.machine:
            out["machine"] = self.machine
        return out


@dataclass
class PlacementLedger:
    """One way of placing the lane's experts, with what it leaves for KV."""

    placement: str
    hot_per_layer: list[int]
    cold_per_layer: list[int]
    basis: str               # where the counts come from
    hot_bytes: int           # routed-expert bytes in HBM (lane total)
    cold_bytes: int          # routed-expert bytes pinned in host
    figures: dict[str, Figure] = field(default_factory=dict)

    def counts_label(self) -> str:
        return f"{_span(self.hot_per_layer)} hot / {_span(self.cold_per_layer)} cold per layer"

    def to_json(self) -> dict[str, Any]:
        return {"placement": self.placement, "basis": self.basis,
                "hot_per_layer": _compact(self.hot_per_layer),
                "cold_per_layer": _compact(self.cold_per_layer),
                "figures": {k: f.to_json() for k, f in self.figures.items()}}


@dataclass
class LaneLedger:
    lane: str
    machine: str
    gpus: list[int]
    placement: str
    figures: dict[str, Figure]
    usage_aware: PlacementLedger
    positional: PlacementLedger | None
    violations: list[Violation]
    notes: list[str]

    @property
    def ok(self) -> bool:
        return not self.violations

    def fig(self, key: str) -> Figure:
        return self.figures[key]

    @property
    def active(self) -> PlacementLedger:
        """The lane's own placement."""
        if self.placement == POSITIONAL:
            assert self.positional is not None
            return self.positional
        return self.usage_aware

    def to_json(self) -> dict[str, Any]:
        return {"lane": self.lane, "machine": self.machine, "gpus": self.gpus,
                "placement": self.placement, "ok": self.ok,
                "figures": {k: f.to_json() for k, f in self.figures.items()},
                "usage_aware": self.usage_aware.to_json(),
                "positional": self.positional.to_json() if self.positional else None,
                "violations": [v.to_json() for v in self.violations], "notes": self.notes}


@dataclass
class RecipeLedger:
    recipe: str
    path: str
    lanes: list[LaneLedger]
    machine_violations: list[Violation]

    @property
    def violations(self) -> list[Violation]:
        return [v for lane in self.lanes for v in lane.violations] + self.machine_violations

    @property
    def ok(self) -> bool:
        return not self.violations

    def lane(self, name: str) -> LaneLedger:
        for lane in self.lanes:
            if lane.lane == name:
                return lane
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "path": self.path, "ok": self.ok,
                "lanes": [lane.to_json() for lane in self.lanes],
                "machine_violations": [v.to_json() for v in self.machine_violations]}


# ------------------------------------------------------------------------------------------

def compute_ledger(loaded: Any) -> RecipeLedger:
    """The ledger of a `LoadedRecipe` (its `.recipe`, `.path` and the row maps it read)."""
    recipe: Recipe = loaded.recipe
    lanes = []
    for lane in recipe.lanes:
        rowmap = None
        rowmap_file = None
        if lane.active_class is not None:
            rowmap = loaded.rowmaps.get((lane.name, lane.active_class))
            rowmap_file = lane.classes[lane.active_class].rowmap
        if lane.parallel is not None:  # a lane over several machines: one ledger per stage
            from recipegen.ledger.multinode import compute_multinode_lane
            lanes.append(compute_multinode_lane(
                recipe, lane, rowmap_hot=rowmap.hot_counts() if rowmap is not None else None,
                rowmap_label=(f"row map {rowmap_file} (class {lane.active_class})"
                              if rowmap is not None else None)))
            continue
        lanes.append(compute_lane(recipe.model, recipe.machines[lane.machine], lane,
                                  rowmap_hot=rowmap.hot_counts() if rowmap is not None else None,
                                  rowmap_label=(f"row map {rowmap_file} (class {lane.active_class})"
                                                if rowmap is not None else None)))
    return RecipeLedger(recipe.name, str(loaded.path), lanes, machine_checks(recipe, lanes))


def compute_lane(model: Model, machine: Machine, lane: Lane, *,
                 rowmap_hot: Sequence[int] | None = None, rowmap_label: str | None = None) -> LaneLedger:
    """All figures of one lane. `rowmap_hot`: the active map's hot count per MoE layer, if read."""
    figs: dict[str, Figure] = {}
    notes: list[str] = []
    violations: list[Violation] = []

    def add(f: Figure) -> Figure:
        figs[f.key] = f
        return f

    e = model.expert_bytes
    n_layers = model.num_moe_layers
    n_experts = model.routed_experts
    tp = lane.tensor_parallel_size
    if tp > 1:
        notes.append(f"tensor parallel over {tp} GPUs: experts, dense weights and KV are taken as "
                     "split evenly across them (per-GPU figures are lane totals / TP)")

    # --- experts ---------------------------------------------------------------------------
    if model.expert_tensors:
        tensors = " + ".join(f"{t.name} {'x'.join(map(str, t.shape))} {t.dtype}" for t in model.expert_tensors)
        add(Figure("experts.bytes_per_expert", "bytes per routed expert", e, "bytes",
                   "Σ tensors (values × bits / 8 + scale bytes per block)",
                   {"tensors": tensors}, _src(model.sources, "expert_tensors")))
    else:
        add(Figure("experts.bytes_per_expert", "bytes per routed expert", e, "bytes", "", {},
                   _src(model.sources, "bytes_per_expert")))
    add(Figure("experts.per_layer", "routed experts per MoE layer", n_experts * e, "bytes",
               "routed_experts × bytes_per_expert", {"routed_experts": n_experts, "bytes_per_expert": e}))
    total_experts = n_layers * n_experts * e
    add(Figure("experts.total", "all routed experts", total_experts, "bytes",
               "moe_layers × routed_experts × bytes_per_expert",
               {"moe_layers": n_layers, "routed_experts": n_experts, "bytes_per_expert": e}))

    # --- HBM cap and reserve (per GPU) ------------------------------------------------------
    hbm_capacity = machine.gpus.hbm
    add(Figure("hbm.capacity", "HBM per GPU", hbm_capacity, "bytes", "", {},
               _src(machine.sources, "gpus.hbm") or f"machine {machine.name}"))
    util = lane.gpu_memory_utilization
    if util is not None:
        cap = add(Figure("hbm.cap", "HBM cap (vLLM budget)", hbm_capacity * util, "bytes",
                         "hbm_capacity × gpu_memory_utilization",
                         {"hbm_capacity_bytes": hbm_capacity, "gpu_memory_utilization": util})).value
    else:
        cap = float(hbm_capacity)
        add(Figure("hbm.cap", "HBM cap (physical; fixed KV pool)", cap, "bytes",
                   "hbm_capacity (kv_cache_bytes fixes the KV pool; utilisation is ignored by vLLM)",
                   {"hbm_capacity_bytes": hbm_capacity}))
    reserve = _hbm_reserve(model, machine, lane, add)
    dense = (model.dense_bytes or 0) / tp
    drafter = ((model.drafter.weights if model.drafter else None) or 0) / tp
    if model.dense_bytes is not None or drafter:
        add(Figure("hbm.reserve.dense", "  of which dense weights", dense, "bytes",
                   "dense_bytes / tp", {"dense_bytes": model.dense_bytes or 0, "tp": tp},
                   _src(model.sources, "dense_bytes")))
        if drafter:
            add(Figure("hbm.reserve.drafter", "  of which drafter weights", drafter, "bytes",
                       "drafter.weights / tp", {"drafter_bytes": drafter * tp, "tp": tp}))
        rest = add(Figure("hbm.reserve.runtime", "  of which activations, CUDA graphs, rest",
                          reserve - dense - drafter, "bytes", "reserve − dense − drafter",
                          {"reserve_bytes": reserve, "dense_bytes": dense, "drafter_bytes": drafter},
                          "declared parts are inside the measured reserve, never added on top"))
        if rest.value < 0:
            violations.append(Violation(
                "reserve", f"declared dense + drafter weights ({format_bytes(dense + drafter)}) exceed "
                f"the measured HBM reserve ({format_bytes(reserve)}) they are part of",
                "re-measure the reserve (reserves.hbm) or correct the model's dense_bytes/drafter",
                -rest.value, lane=lane.name))

    # --- prefetch bank and KV rate ----------------------------------------------------------
    bank = lane.offload.prefetch_slots_per_layer * n_layers * e / tp
    if bank:
        add(Figure("hbm.prefetch_bank", "prefetch bank (per GPU)", bank, "bytes",
                   "prefetch_slots_per_layer × moe_layers × bytes_per_expert / tp",
                   {"prefetch_slots_per_layer": lane.offload.prefetch_slots_per_layer,
                    "moe_layers": n_layers, "bytes_per_expert": e, "tp": tp}))
    drafter_kv = (model.drafter.kv_bytes_per_token or 0) if (model.drafter and lane.speculative) else 0
    kv_token_bytes = model.kv_token_bytes + drafter_kv
    if drafter_kv:
        add(Figure("kv.bytes_per_token", "KV bytes per token (target + drafter)", kv_token_bytes, "count",
                   "target_kv_bytes_per_token + drafter.kv_bytes_per_token",
                   {"target_kv_bytes_per_token": model.kv_token_bytes, "drafter_kv_bytes_per_token": drafter_kv}))

    # --- placements ------------------------------------------------------------------------
    ua = _usage_aware_placement(model, lane, rowmap_hot, rowmap_label)
    pos = _positional_placement(model, lane) if lane.offload.load_cpu_offload else None
    for placement in (ua, pos):
        if placement is not None:
            _placement_figures(placement, model, lane, cap, reserve, kv_token_bytes, tp, bank)
    active = pos if lane.offload.placement == POSITIONAL else ua
    assert active is not None

    hot_bytes, cold_bytes = active.hot_bytes, active.cold_bytes
    if lane.offload.placement == USAGE_AWARE:
        split = declared_split(model, lane.offload)
        per_cold = n_layers * e
        if split.declared == "hot_experts_per_layer":
            add(Figure("budget.cold_bytes", "declared budget: cold experts implied in host",
                       split.cold_per_layer * per_cold, "bytes",
                       "(routed_experts − hot_experts_per_layer) × moe_layers × bytes_per_expert",
                       {"routed_experts": n_experts, "hot_experts_per_layer": split.hot_per_layer,
                        "moe_layers": n_layers, "bytes_per_expert": e}, "declared: hot_experts_per_layer"))
        else:
            add(Figure("budget.cold_per_layer", "declared budget: cold experts per layer it buys",
                       split.cold_per_layer, "count",
                       "⌊cold_experts_budget / (moe_layers × bytes_per_expert)⌋",
                       {"cold_experts_budget_bytes": split.budget_bytes, "moe_layers": n_layers,
                        "bytes_per_expert": e}, "declared: cold_experts_budget (largest whole count that fits)"))
            add(Figure("budget.cold_bytes", "declared budget: cold experts it implies in host",
                       split.cold_per_layer * per_cold, "bytes", "cold_per_layer × moe_layers × bytes_per_expert",
                       {"cold_per_layer": split.cold_per_layer, "moe_layers": n_layers, "bytes_per_expert": e}))
        add(Figure("budget.hot_per_layer", "declared budget: hot experts per layer", split.hot_per_layer,
                   "count", "routed_experts − cold_per_layer" if split.declared != "hot_experts_per_layer" else "",
                   {"routed_experts": n_experts, "cold_per_layer": split.cold_per_layer}
                   if split.declared != "hot_experts_per_layer" else {},
                   "declared" if split.declared == "hot_experts_per_layer" else "derived from cold_experts_budget"))
    add(Figure("placement.hot_experts", f"hot experts in HBM ({lane.offload.placement})", hot_bytes,
               "bytes", "Σ hot per layer × bytes_per_expert",
               {"hot_experts": sum(active.hot_per_layer), "bytes_per_expert": e}, active.basis))
    add(Figure("placement.cold_experts", f"cold experts pinned in host ({lane.offload.placement})",
               cold_bytes, "bytes", "Σ cold per layer × bytes_per_expert",
               {"cold_experts": sum(active.cold_per_layer), "bytes_per_expert": e}, active.basis))
    for key in ("hbm.hot_experts", "hbm.kv_pool", "kv.tokens", "kv.full_sequences"):
        figs[key] = active.figures[key]
    kv_pool = figs["hbm.kv_pool"].value
    kv_tokens = figs["kv.tokens"].value
    add(Figure("kv.max_model_len", "max_model_len", lane.max_model_len, "tokens", "", {}))

    # --- host --------------------------------------------------------------------------------
    host_memory = machine.host_memory
    add(Figure("host.memory", "host memory", host_memory, "bytes", "", {},
               _src(machine.sources, "host_memory") or f"machine {machine.name}"))
    tables = add(Figure("host.tables", "host tables", model.host_table_bytes, "bytes",
                        " + ".join(t.name for t in model.host_tables) or "none",
                        {t.name + "_bytes": t.bytes for t in model.host_tables},
                        _src(model.sources, "host_tables[0].bytes"))).value
    host_reserve = _host_reserve(model, lane, add, notes)
    add(Figure("host.cold_experts", "pinned cold experts", cold_bytes, "bytes",
               "Σ cold per layer × bytes_per_expert", {"cold_experts": sum(active.cold_per_layer),
                                                        "bytes_per_expert": e}, active.basis))
    add(Figure("host.before_reserve", "host tables + pinned experts", tables + cold_bytes, "bytes",
               "host_tables + cold_experts", {"host_tables_bytes": tables, "cold_experts_bytes": cold_bytes},
               "before page cache and processes"))
    host_total = add(Figure("host.total", "host in use", tables + cold_bytes + host_reserve, "bytes",
                            "host_tables + cold_experts + host_reserve",
                            {"host_tables_bytes": tables, "cold_experts_bytes": cold_bytes,
                             "host_reserve_bytes": host_reserve})).value
    add(Figure("host.headroom", "host headroom", host_memory - host_total, "bytes",
               "host_memory − host_in_use", {"host_memory_bytes": host_memory, "host_in_use_bytes": host_total}))

    # --- verdict -----------------------------------------------------------------------------
    if lane.kv_cache_bytes is not None:
        # A fixed pool: the "room" is what the cap leaves after reserve and hot experts.
        room = cap - reserve - hot_bytes / tp - bank
        kv_for_checks = room if room < kv_pool else kv_pool
    else:
        kv_for_checks = kv_pool
    violations.extend(_budget_violations(model, machine, lane, cap, reserve, kv_for_checks,
                                         kv_tokens, host_total, tables, host_reserve, tp,
                                         fixed_kv=lane.kv_cache_bytes, bank=bank,
                                         kv_token_bytes=kv_token_bytes))

    # --- load time (after the verdict: a side already over budget at the end is not re-reported)
    final_over = {v.kind for v in violations}
    _load_figures(model, machine, lane, active, add, reserve, dense + drafter, tables, host_reserve,
                  violations, tp, skip_hbm="hbm" in final_over, skip_host="host" in final_over)
    return LaneLedger(lane.name, lane.machine, list(lane.gpus), lane.offload.placement, figs, ua, pos,
                      violations, notes)


# ------------------------------------------------------------------------------------------

def _hbm_reserve(model: Model, machine: Machine, lane: Lane, add: Any) -> float:
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


def _host_reserve(model: Model, lane: Lane, add: Any, notes: list[str]) -> float:
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


def _usage_aware_placement(model: Model, lane: Lane, rowmap_hot: Sequence[int] | None,
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
        # What usage-aware residency would hold at this lane's positional byte budget.
        budget = lane.offload.load_cpu_offload or 0
        cold = min(experts, largest_count_within(budget, n * model.expert_bytes))
        hot = [experts - cold] * n
        basis = (f"same budget as --cpu-offload-gb ({format_bytes(budget)}): {cold} cold per layer "
                 "(largest whole count that fits)")
    e = model.expert_bytes
    return PlacementLedger(USAGE_AWARE, hot, [experts - h for h in hot], basis,
                           sum(hot) * e, sum(experts - h for h in hot) * e)


def _positional_placement(model: Model, lane: Lane) -> PlacementLedger:
    budget = lane.offload.load_cpu_offload or 0
    walk = positional_walk(model, budget)
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
        "walk expert parameters in module order, offloading each while the total < budget",
        {"budget_bytes": budget, "layer_param_bytes": [_r(b) for b in layer_param_bytes(model)],
         "layers_whole": walk.layers_whole, "layers_partial": walk.layers_partial,
         "layer_experts_bytes": full},
        "approximation of vllm/model_executor/offloader/uva.py: dense parameters the real walk also "
        "meets are ignored")
    measured = [m for m in model.positional_offload if m.cpu_offload == budget]
    if measured:
        i = model.positional_offload.index(measured[0])
        placement.figures["positional.measured"] = Figure(
            "positional.measured", "experts offloaded, measured", measured[0].offloaded, "bytes", "", {},
            "measured input: " + (_src(model.sources, f"positional_offload[{i}].offloaded") or "catalog"))
        placement.figures["positional.measured_delta"] = Figure(
            "positional.measured_delta", "measured − approximation", measured[0].offloaded - walk.offloaded_bytes,
            "bytes", "measured − approximation",
            {"measured_bytes": measured[0].offloaded, "approximation_bytes": walk.offloaded_bytes},
            "the real walk also offloads dense parameters it meets")
    for i, share in enumerate(model.positional_cold_pick_share):
        placement.figures[f"positional.cold_pick_share[{i}]"] = Figure(
            f"positional.cold_pick_share[{i}]", "share of routed picks on host experts (measured)",
            share, "ratio", "", {}, "measured input: "
            + (_src(model.sources, f"positional_cold_pick_share[{i}]") or "catalog"))
    return placement


def _placement_figures(p: PlacementLedger, model: Model, lane: Lane, cap: float, reserve: float,
                       kv_token_bytes: float, tp: int, bank: float = 0.0) -> None:
    e = model.expert_bytes
    hot_total = sum(p.hot_per_layer)
    hot_gpu = p.hot_bytes / tp
    f = p.figures
    if p.placement == POSITIONAL:
        f["hbm.hot_experts"] = Figure(
            "hbm.hot_experts", "routed experts left in HBM (per GPU)", hot_gpu, "bytes",
            "(experts.total − offloaded) / tp", {"experts_total_bytes": n_total_bytes(model),
                                                 "offloaded_bytes": p.cold_bytes, "tp": tp}, p.basis)
    else:
        f["hbm.hot_experts"] = Figure(
            "hbm.hot_experts", "hot routed experts in HBM (per GPU)", hot_gpu, "bytes",
            "Σ hot per layer × bytes_per_expert / tp",
            {"hot_experts": hot_total, "bytes_per_expert": e, "tp": tp}, p.basis)
    f["host.cold_experts"] = Figure(
        "host.cold_experts", "routed experts pinned in host", p.cold_bytes, "bytes",
        "Σ cold per layer × bytes_per_expert" if p.placement == USAGE_AWARE else "positional walk",
        {"cold_experts": sum(p.cold_per_layer), "bytes_per_expert": e}, p.basis)
    if lane.kv_cache_bytes is not None:
        kv_pool = float(lane.kv_cache_bytes)
        f["hbm.kv_pool"] = Figure("hbm.kv_pool", "KV pool (per GPU, fixed)", kv_pool, "bytes",
                                  "kv_cache_bytes", {"kv_cache_bytes": lane.kv_cache_bytes})
        f["hbm.used"] = Figure("hbm.used", "HBM in use (per GPU)", reserve + hot_gpu + bank + kv_pool,
                               "bytes", "reserve + hot_experts + prefetch_bank + kv_pool",
                               {"reserve_bytes": reserve, "hot_experts_bytes": hot_gpu,
                                "prefetch_bank_bytes": bank, "kv_pool_bytes": kv_pool})
    else:
        kv_pool = cap - reserve - hot_gpu - bank
        operands = {"hbm_cap_bytes": cap, "reserve_bytes": reserve, "hot_experts_bytes": hot_gpu}
        if bank:
            operands["prefetch_bank_bytes"] = bank
        f["hbm.kv_pool"] = Figure("hbm.kv_pool", "KV pool (per GPU)", kv_pool, "bytes",
                                  "hbm_cap − reserve − hot_experts" + (" − prefetch_bank" if bank else ""),
                                  operands)
    tokens = max(0.0, kv_pool) * tp / kv_token_bytes
    f["kv.tokens"] = Figure("kv.tokens", "KV pool in tokens", tokens, "tokens",
                            "kv_pool × tp / kv_bytes_per_token",
                            {"kv_pool_bytes": kv_pool, "tp": tp, "kv_bytes_per_token": kv_token_bytes,
                             "tokens_per_gib": GiB / kv_token_bytes},
                            _src(model.sources, "kv_tokens_per_gib") or _src(model.sources, "kv_bytes_per_token"))
    f["kv.full_sequences"] = Figure("kv.full_sequences", "full max_model_len sequences that fit",
                                    math.floor(tokens / lane.max_model_len), "sequences",
                                    "⌊kv_tokens / max_model_len⌋",
                                    {"kv_tokens": _r(tokens), "max_model_len": lane.max_model_len})


def _load_figures(model: Model, machine: Machine, lane: Lane, active: PlacementLedger, add: Any,
                  reserve: float, declared_weights: float, tables: float, host_reserve: float,
                  violations: list[Violation], tp: int, *, skip_hbm: bool = False,
                  skip_host: bool = False) -> None:
    e = model.expert_bytes
    budget = lane.offload.load_cpu_offload or 0
    walk = positional_walk(model, budget)
    layer_full = model.routed_experts * e
    init_host = walk.host_per_layer
    init_hbm = [layer_full - h for h in init_host]
    if lane.offload.placement == USAGE_AWARE:
        final_hbm = [h * e for h in active.hot_per_layer]
        final_host = [c * e for c in active.cold_per_layer]
        peaks = rehoming_peaks(init_hbm, init_host, final_hbm, final_host)
        how = ("re-homing layer by layer from the --cpu-offload-gb load placement to the row map in "
               "the runtime's order (expert_residency.core.plan), new banks allocated before the old "
               "tensors are freed")
    else:
        peaks = rehoming_peaks(init_hbm, init_host, init_hbm, init_host)
        how = "positional lane: the load placement is the final placement"
    if model.dense_bytes is not None:
        weights_at_load = declared_weights
        weights_note = "dense (+ drafter) weights as declared"
    else:
        weights_at_load = reserve
        weights_note = "no dense_bytes declared: the whole HBM reserve is counted (conservative)"
    add(Figure("load.hbm_experts_initial", "experts in HBM after load (per GPU)", peaks.hbm_initial / tp,
               "bytes", "experts.total − positional walk(load_cpu_offload)",
               {"load_cpu_offload_bytes": budget, "offloaded_bytes": walk.offloaded_bytes, "tp": tp}))
    add(Figure("load.host_experts_initial", "experts pinned after load", peaks.host_initial, "bytes",
               "positional walk(load_cpu_offload)", {"load_cpu_offload_bytes": budget}))
    hbm_peak = add(Figure("load.hbm_peak", "HBM peak during load (per GPU)",
                          weights_at_load + peaks.hbm_peak / tp, "bytes",
                          "weights_at_load + peak expert bytes in HBM / tp",
                          {"weights_at_load_bytes": weights_at_load, "peak_experts_bytes": peaks.hbm_peak,
                           "tp": tp}, f"{how}; {weights_note}; KV is allocated after")).value
    host_peak = add(Figure("load.host_peak", "host peak during load", tables + host_reserve + peaks.host_peak,
                           "bytes", "host_tables + host_reserve + peak pinned expert bytes",
                           {"host_tables_bytes": tables, "host_reserve_bytes": host_reserve,
                            "peak_pinned_bytes": peaks.host_peak}, how)).value
    capacity = machine.gpus.hbm
    if hbm_peak > capacity and not skip_hbm:
        need = hbm_peak - capacity
        violations.append(Violation(
            "load-hbm", f"HBM peaks at {format_bytes(hbm_peak)} while loading, {format_bytes(need)} over "
            f"the GPU's {format_bytes(capacity)}",
            f"raise offload.load_cpu_offload to at least {math.ceil((budget + need * tp) / GiB)} GiB so "
            "fewer experts land in HBM at load", need, lane=lane.name))
    if host_peak > machine.host_memory and not skip_host:
        need = host_peak - machine.host_memory
        violations.append(Violation(
            "load-host", f"host memory peaks at {format_bytes(host_peak)} while loading, "
            f"{format_bytes(need)} over the machine's {format_bytes(machine.host_memory)}",
            f"lower offload.load_cpu_offload to at most {max(0, math.floor((budget - need) / GiB))} GiB",
            need, lane=lane.name))


def _budget_violations(model: Model, machine: Machine, lane: Lane, cap: float, reserve: float,
                       kv_pool: float, kv_tokens: float, host_total: float, tables: float,
                       host_reserve: float, tp: int, fixed_kv: int | None = None, bank: float = 0.0,
                       kv_token_bytes: float | None = None) -> list[Violation]:
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
    room = cap - reserve - bank - need_kv
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
            fix = (f"raise offload.load_cpu_offload by at least {math.ceil((over + need_kv) * tp / GiB)} GiB "
                   "(whole layer tensors move, so check the result)")
        elif hot_max >= 0:
            fix = f"lower hot experts per layer to {hot_max} (room for one max_model_len sequence)"
        else:
            fix = "even 0 hot experts leave no room for KV: raise gpu_memory_utilization or use a bigger GPU"
        util_needed = (reserve + (cap - reserve - kv_pool) + need_kv) / machine.gpus.hbm
        if lane.gpu_memory_utilization is not None and util_needed <= 1:
            fix += f", or raise gpu_memory_utilization to {math.ceil(util_needed * 100) / 100:.2f}"
        out.append(Violation(
            "hbm", f"hot experts + HBM reserve exceed the HBM cap by {format_bytes(over)} "
            f"(cap {format_bytes(cap)}): no room left for KV", fix, over, lane=lane.name))
    elif kv_tokens < lane.max_model_len:
        short = lane.max_model_len - kv_tokens
        fixes = [f"lower max_model_len to at most {int(kv_tokens):,}"]
        if positional:
            fixes.append(f"raise offload.load_cpu_offload by about "
                         f"{math.ceil(short * kv_token_bytes / GiB)} GiB")
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
                fix = (f"lower offload.load_cpu_offload to at most {math.floor(available / GiB)} GiB "
                       f"(or switch to usage-aware placement with {hot_min}+ hot per layer)")
            else:
                fix = (f"raise hot experts per layer to at least {hot_min} ({cold_max} cold, "
                       f"{format_bytes(cold_max * n * e)} pinned)")
                if hot_min > hot_max:
                    fix += (f" — but HBM then holds at most {max(hot_max, 0)} hot with room for one "
                            "max_model_len sequence: no split fits both; lower max_model_len or add memory")
        out.append(Violation(
            "host", f"host memory over by {format_bytes(over)}: host tables {format_bytes(tables)} + "
            f"pinned experts {format_bytes(host_total - tables - host_reserve)} + reserve "
            f"{format_bytes(host_reserve)} = {format_bytes(host_total)} > {format_bytes(machine.host_memory)}",
            fix, over, lane=lane.name))
    return out


def concurrent_total(members: list[tuple[Lane, LaneLedger]], key: str) -> float:
    """Figure `key` over lanes sharing a machine, as they can be up together: every always-on
    lane plus the largest lane with a compose profile (those come up one at a time)."""
    always = sum(g.fig(key).value for l, g in members if l.profile is None)
    optional = [g.fig(key).value for l, g in members if l.profile is not None]
    return always + (max(optional) if optional else 0)


def machine_checks(recipe: Recipe, lanes: list[LaneLedger]) -> list[Violation]:
    """Budgets shared by lanes: host memory of a machine, and GPUs used by more than one lane.

    Lanes with a compose profile are not always on: they count one at a time (the largest).
    """
    out: list[Violation] = []
    by_machine: dict[str, list[tuple[Lane, LaneLedger]]] = {}
    for lane, ledger in zip(recipe.lanes, lanes):
        if hasattr(ledger, "stages"):  # a lane over several machines: each stage on its own
            from recipegen.ledger.multinode import stage_engines
            for machine_name, stage_lane, stage_ledger in stage_engines(lane, ledger):
                by_machine.setdefault(machine_name, []).append((stage_lane, stage_ledger))
            continue
        by_machine.setdefault(lane.machine, []).append((lane, ledger))
    for name, members in by_machine.items():
        if len(members) < 2:
            continue
        machine = recipe.machines[name]
        always = [(l, g) for l, g in members if l.profile is None]
        host = concurrent_total(members, "host.total")
        if host > machine.host_memory:
            over = host - machine.host_memory
            out.append(Violation(
                "machine-host", f"lanes on machine {name!r} together use {format_bytes(host)} of host "
                f"memory, {format_bytes(over)} over {format_bytes(machine.host_memory)}",
                "give lanes a compose profile so they are not up together, or raise their hot experts",
                over, machine=name))
        gpu_util: dict[int, list[tuple[str, float]]] = {}
        for lane, _ in always:
            share = lane.gpu_memory_utilization if lane.gpu_memory_utilization is not None else \
                (lane.kv_cache_bytes or 0) / machine.gpus.hbm
            for gpu in lane.gpus:
                gpu_util.setdefault(gpu, []).append((lane.name, share))
        for gpu, users in sorted(gpu_util.items()):
            if len(users) > 1 and sum(u for _, u in users) > 1.0:
                out.append(Violation(
                    "gpu-shared", f"GPU {gpu} of {name!r} is shared by always-on lanes "
                    + ", ".join(f"{n} ({u:.2f})" for n, u in users)
                    + f" whose utilisations sum to {sum(u for _, u in users):.2f} > 1",
                    "lower their gpu_memory_utilization, or give all but one a compose profile",
                    machine=name))
    return out


# ------------------------------------------------------------------------------------------

def n_total_bytes(model: Model) -> int:
    return model.num_moe_layers * model.routed_experts * model.expert_bytes


def _src(sources: dict[str, str], key: str) -> str:
    return f"source: {sources[key]}" if key in sources else ""


def _r(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(x, 3)


def _span(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}–{hi}"


def _compact(values: list[int]) -> list[int] | int:
    return values[0] if len(set(values)) == 1 else values
