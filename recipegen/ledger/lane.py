"""The ledger of one lane on one machine: `compute_lane` assembles the figures of each part.

Experts (bytes per expert, per layer, total), the HBM cap and reserve, the KV rate, both
placements (`placements`), the declared budget, host memory, the verdict (`verdict`) and the
load-time peaks (`load`). Every figure is in bytes with its formula and operands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from recipegen.common.units import GiB, format_bytes, format_count, format_tokens
from recipegen.ledger.adaptive import adaptive_host_and_link
from recipegen.ledger.budget import declared_split
from recipegen.ledger.figures import Figure
from recipegen.ledger.kv import kv_rate, state_sequence_bound
from recipegen.ledger.kv_state import StatePool
from recipegen.ledger.load import load_figures
from recipegen.ledger.parallel import dense_per_rank, ep_fullest_hot, expert_parallel, parallel_figures
from recipegen.ledger.pinning import pinned_operands, pinned_per_layer
from recipegen.ledger.placement import experts_only, offload_param_filter, positional_walk
from recipegen.ledger.placements import (
    placement_figures,
    positional_experts_figure,
    positional_placement,
    usage_aware_placement,
)
from recipegen.ledger.reserves import hbm_reserve, host_reserve, placement_hbm_reserve, reserve_basis, stage_share
from recipegen.ledger.result import POSITIONAL, USAGE_AWARE, LaneLedger, PlacementLedger, Violation, src_note
from recipegen.ledger.runtime_check import runtime_caveat, runtime_violations
from recipegen.ledger.verdict import budget_violations
from recipegen.ledger.vllm_layout import as_lane_lays_out
from recipegen.ledger.workspace import same_budget_workspace, workspace_figures
from recipegen.schema import Lane, Machine, Model
from recipegen.schema.lane import HbmReserve, HostReserve


@dataclass
class _Figures:
    """The figures, notes and violations of a lane as they are computed."""

    figs: dict[str, Figure] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)

    def add(self, f: Figure) -> Figure:
        self.figs[f.key] = f
        return f


@dataclass(frozen=True)
class _Hbm:
    cap: float          # what vLLM may use per GPU
    reserve: float      # measured non-expert, non-KV HBM per GPU
    weights: float      # declared dense + drafter weights per GPU (inside the reserve)


def compute_lane(model: Model, machine: Machine, lane: Lane, *,
                 rowmap_hot: Sequence[int] | None = None, rowmap_label: str | None = None,
                 rowmap_hot_ids: Sequence[Sequence[int]] | None = None) -> LaneLedger:
    """All figures of one lane. `rowmap_hot`: the active map's hot count per MoE layer, if read;
    `rowmap_hot_ids`: its hot ids per layer (an expert-parallel lane's fullest rank is counted from them)."""
    out = _Figures()
    tp = lane.tensor_parallel_size
    model = _as_loaded(model, machine, lane, out)
    _tp_note(model, tp, out)
    _expert_figures(model, out)
    hbm = _hbm_figures(model, machine, lane, out)
    bank = _prefetch_bank(model, lane, out)
    workspace = workspace_figures(model, machine, lane, out.add)   # with adaptive residency's spare HBM rows
    kv_token_bytes, state = _kv_rate(model, machine, lane, out)
    ua, pos, active = _placements(model, machine, lane, hbm, bank, kv_token_bytes, rowmap_hot, rowmap_label, out,
                                  workspace, rowmap_hot_ids)
    _placement_summary(model, lane, active, out)
    kv_pool, kv_tokens = out.figs["hbm.kv_pool"].value, out.figs["kv.tokens"].value
    _concurrency_warning(lane, out)
    if state is not None:
        state_sequence_bound(state, lane, kv_pool, out.add, out.notes)
    adaptive_host = adaptive_host_and_link(model, machine, lane, active.figures["hbm.hot_experts"].value,
                                           out.add, out.notes)
    tables, reserve_host, host_total = _host_figures(model, machine, lane, active, out, adaptive_host)
    parallel_figures(model, lane, active, out.figs, out.add, out.notes, out.violations)

    # --- verdict
    if lane.kv_cache_bytes is not None:
        # A fixed pool: the "room" is what the cap leaves after reserve and hot experts.
        room = hbm.cap - hbm.reserve - active.figures["hbm.hot_experts"].value - bank - workspace
        kv_for_checks = room if room < kv_pool else kv_pool
    else:
        kv_for_checks = kv_pool
    out.violations.extend(budget_violations(model, machine, lane, hbm.cap,
                                            hbm.reserve - active.dense_host_bytes / tp, kv_for_checks,
                                            kv_tokens, host_total, tables, reserve_host, tp,
                                            fixed_kv=lane.kv_cache_bytes, bank=bank,
                                            kv_token_bytes=kv_token_bytes, workspace=workspace,
                                            recompute=compute_lane))
    _runtime_check(model, machine, lane, out)

    # --- load time (after the verdict: a side already over budget at the end is not re-reported)
    final_over = {v.kind for v in out.violations}
    load_figures(model, machine, lane, active, out.add, hbm.reserve, hbm.weights, tables, reserve_host,
                 out.violations, tp, skip_hbm="hbm" in final_over, skip_host="host" in final_over,
                 dense_offloaded=active.dense_host_bytes, workspace=workspace, recompute=compute_lane)
    return LaneLedger(lane.name, lane.machine, list(lane.gpus), lane.offload.placement, out.figs, ua, pos,
                      out.violations, out.notes)


def _as_loaded(model: Model, machine: Machine, lane: Lane, out: _Figures) -> Model:
    """The model as the lane's engine holds it (`vllm_layout`): vLLM's own, possibly padded,
    expert layout; on a usage-aware lane the runtime's banks hold those same padded tensors."""
    checkpoint_bytes = model.expert_bytes
    if model.encoder_bytes and model.dense_bytes is not None and "--language-model-only" in lane.extra_args:
        out.notes.append(f"--language-model-only: vLLM 0.33 does not build the vision tower "
                         f"({format_bytes(model.encoder_bytes)} of dense_bytes; model_executor/models/interfaces.py:"
                         "347-367)")
        model = model.model_copy(update={"dense_bytes": model.dense_bytes - model.encoder_bytes, "encoder_bytes": 0})
    loaded, layout = as_lane_lays_out(model, machine, lane)
    if layout is not None:
        held = ("" if lane.offload.placement == POSITIONAL else
                "; the runtime's hot and cold banks hold these padded tensors "
                "(vllm_plugin/mxfp4_experts.py padding_contract_reason)")
        out.notes.append(f"vLLM 0.33 lays these experts out padded for {layout.backend}: "
                         f"{layout.bytes_per_expert:,} B per expert in memory vs {checkpoint_bytes:,} B "
                         f"in the checkpoint (experts.bytes_per_expert is the in-memory size){held}")
        out.add(Figure("experts.checkpoint_bytes_per_expert", "bytes per routed expert in the checkpoint",
                       checkpoint_bytes, "bytes", "", {}, "before vLLM's padding"))
    return loaded


def _tp_note(model: Model, tp: int, out: _Figures) -> None:
    if tp > 1 and model.attention:
        # Name only the KV layouts this model has: the note's terms are explained in the output's footer.
        kinds = {g.kind for g in model.attention}
        kv = ["KV heads max(1, heads // TP), replicated when TP exceeds them"] if kinds - {"mla"} else []
        kv += ["an MLA latent on every GPU"] if "mla" in kinds else []
        out.notes.append(f"tensor parallel over {tp} GPUs: figures are per GPU as vLLM lays the model out "
                         "(each routed expert's 1/TP shard; dense weights split or replicated by layer; "
                         + "; ".join(kv) + "; docs/parallel.md)")
    elif tp > 1:
        out.notes.append(f"tensor parallel over {tp} GPUs: experts, dense weights and KV are taken as "
                         "split evenly across them (per-GPU figures are lane totals / TP)")


def _placements(model: Model, machine: Machine, lane: Lane, hbm: _Hbm, bank: float, kv_token_bytes: float,
                rowmap_hot: Sequence[int] | None, rowmap_label: str | None,
                out: _Figures, workspace: float = 0.0,
                rowmap_hot_ids: Sequence[Sequence[int]] | None = None
                ) -> tuple[PlacementLedger, PlacementLedger | None, PlacementLedger]:
    """Both placements with their HBM/KV figures, and the lane's own (active) one.
    `workspace`: the runtime's start-up HBM (`workspace`), taken by the usage-aware column only
    (on a positional lane, what the runtime would allocate at the same budget)."""
    tp = lane.tensor_parallel_size
    ua = usage_aware_placement(model, lane, rowmap_hot, rowmap_label)
    pos = (positional_placement(model, lane)
           if lane.offload.load_cpu_offload or lane.offload.placement == POSITIONAL else None)
    if lane.offload.load_cpu_offload == 0 and lane.offload.load_cpu_offload is not None:
        out.notes.append("load_cpu_offload 0 GiB: vLLM loads every routed expert into HBM (no "
                         "--cpu-offload-gb)" + (", then the runtime moves the cold ones into pinned host memory"
                                                if lane.offload.placement == USAGE_AWARE else ""))
    segments = offload_param_filter(list(lane.extra_args))
    if segments and not experts_only(lane):
        out.notes.append(f"--cpu-offload-params {','.join(sorted(segments))} is not modelled exactly: the ledger "
                         "walks every parameter as if unselective (routed-expert segments only are modelled)")
    # Non-routed bytes the load's --cpu-offload-gb walk moves to host (stay there after re-homing).
    dense_off = (positional_walk(model, lane.offload.load_cpu_offload, experts_only=experts_only(lane),
                                 ranks=tp).dense_offloaded
                 if lane.offload.load_cpu_offload else 0)
    # A positional lane's usage-aware column: what the runtime would allocate splitting there.
    ua_workspace = (workspace if lane.offload.placement == USAGE_AWARE
                    else same_budget_workspace(model, machine, lane, ua.cold_bytes))
    for placement in (ua, pos):
        if placement is not None:
            own = placement is pos or lane.offload.placement == USAGE_AWARE
            placement.dense_host_bytes = dense_off if own else 0
            ep_hot = None
            if tp > 1 and expert_parallel(lane):
                # whole experts per rank: the fullest rank's hot bytes, not an even split
                ids = ([list(i) for i in rowmap_hot_ids] if placement is ua and rowmap_hot_ids is not None
                       and lane.offload.placement == USAGE_AWARE else None)
                ep_hot = ep_fullest_hot(model, lane, placement.hot_per_layer, ids)
            # An estimated reserve holds vLLM's fused-MoE workspace only where vLLM computes the experts.
            own_reserve = placement_hbm_reserve(model, machine, lane, out.figs["hbm.reserve"],
                                                placement.placement, placement.hot_per_layer)
            if own_reserve is not None:
                placement.figures["hbm.reserve"] = own_reserve
            placement_figures(placement, model, lane, hbm.cap,
                              hbm.reserve if own_reserve is None else own_reserve.value, kv_token_bytes, tp, bank,
                              dense_offloaded=placement.dense_host_bytes,
                              workspace=ua_workspace if placement is ua else 0.0, ep_hot=ep_hot)
    active = pos if lane.offload.placement == POSITIONAL else ua
    assert active is not None
    if active.dense_host_bytes:
        per_step = active.dense_host_bytes / machine.pinned_read_bandwidth
        out.notes.append(
            f"--cpu-offload-gb {(lane.offload.load_cpu_offload or 0) / GiB:g} also moves "
            f"{format_bytes(active.dense_host_bytes)} of non-routed weights (attention, norms, routers) to host "
            f"memory, where they stay and are read over the {machine.pinned_read_bandwidth / 1e9:g} GB/s link on "
            f"every step (~{per_step * 1e3:.0f} ms); add extra_args: [--cpu-offload-params, experts] to offload "
            "routed experts only (vllm/model_executor/offloader/uva.py:102-113)")
    return ua, pos, active


def _runtime_check(model: Model, machine: Machine, lane: Lane, out: _Figures) -> None:
    """The runtime's capability table: a refusal is a violation, an unverified device a note."""
    out.violations.extend(runtime_violations(model, machine, lane))
    caveat = runtime_caveat(model, machine, lane)
    if caveat:
        out.notes.append(caveat + ": check split == unsplit on the box (recipegen parity) before relying on it")


def _concurrency_warning(lane: Lane, out: _Figures) -> None:
    """More expected streams than full-length sequences in the KV pool: not a budget violation
    (short requests share the pool), but said with the numbers, since long ones will not all fit."""
    streams, full = lane.concurrency.max, int(out.figs["kv.full_sequences"].value)
    if streams <= full:
        return
    tokens = out.figs["kv.tokens"].value
    per_stream = out.add(Figure(
        "kv.tokens_per_stream", "KV tokens per stream at concurrency.max (average)", int(tokens // streams), "tokens",
        "⌊kv_tokens / streams⌋", {"kv_tokens": tokens, "streams": streams},
        "more streams than full max_model_len sequences fit: the average each may hold while all run")).value
    out.notes.append(
        f"warning: concurrency up to {streams} streams, but the KV pool holds {format_tokens(tokens)} tokens "
        f"= {format_count(full, 'full-length sequence')} of max_model_len {lane.max_model_len:,}: {streams} streams fit only "
        f"while they average ≤ {per_stream:,} tokens each (prompt + output); longer ones make vLLM "
        "preempt or queue requests. Lower concurrency.max or max_model_len, or give the KV pool more HBM")


def _expert_figures(model: Model, out: _Figures) -> None:
    e, n_layers, n_experts = model.expert_bytes, model.num_moe_layers, model.routed_experts
    if model.expert_tensors:
        tensors = " + ".join(f"{t.name} {'x'.join(map(str, t.shape))} {t.dtype}" for t in model.expert_tensors)
        out.add(Figure("experts.bytes_per_expert", "bytes per routed expert", e, "bytes",
                       "Σ tensors (values × bits / 8 + scale bytes per block)",
                       {"tensors": tensors}, src_note(model.sources, "expert_tensors")))
    else:
        out.add(Figure("experts.bytes_per_expert", "bytes per routed expert", e, "bytes", "", {},
                       src_note(model.sources, "bytes_per_expert")))
    out.add(Figure("experts.per_layer", "routed experts per MoE layer", n_experts * e, "bytes",
                   "routed_experts × bytes_per_expert", {"routed_experts": n_experts, "bytes_per_expert": e}))
    out.add(Figure("experts.total", "all routed experts", n_layers * n_experts * e, "bytes",
                   "moe_layers × routed_experts × bytes_per_expert",
                   {"moe_layers": n_layers, "routed_experts": n_experts, "bytes_per_expert": e}))


def _hbm_figures(model: Model, machine: Machine, lane: Lane, out: _Figures) -> _Hbm:
    """HBM per GPU: capacity, the cap vLLM may use, the reserve and its declared parts."""
    tp = lane.tensor_parallel_size
    gpus = machine.gpus
    hbm_capacity = gpus.usable
    if gpus.driver_reserved:
        out.add(Figure("hbm.capacity", "HBM per GPU (as CUDA sees it)", hbm_capacity, "bytes",
                       "driver total − driver reserved", {"driver_total_bytes": gpus.hbm,
                                                           "driver_reserved_bytes": gpus.driver_reserved},
                       "; ".join(n for n in (src_note(machine.sources, "gpus.hbm"),
                                             src_note(machine.sources, "gpus.driver_reserved")) if n)
                       or f"machine {machine.name}"))
    else:
        out.add(Figure("hbm.capacity", "HBM per GPU", hbm_capacity, "bytes", "", {},
                       src_note(machine.sources, "gpus.hbm") or f"machine {machine.name}"))
    util = lane.gpu_memory_utilization
    if util is not None:
        cap = out.add(Figure("hbm.cap", "HBM cap (vLLM budget)", hbm_capacity * util, "bytes",
                             "hbm_capacity × gpu_memory_utilization",
                             {"hbm_capacity_bytes": hbm_capacity, "gpu_memory_utilization": util})).value
    else:
        cap = float(hbm_capacity)
        out.add(Figure("hbm.cap", "HBM cap (physical; fixed KV pool)", cap, "bytes",
                       "hbm_capacity (kv_cache_bytes fixes the KV pool; utilisation is ignored by vLLM)",
                       {"hbm_capacity_bytes": hbm_capacity}))
    reserve = hbm_reserve(model, machine, lane, out.add)
    dense_rank = dense_per_rank(model, tp)
    dense = dense_rank.value
    drafter = ((model.drafter.weights if model.drafter else None) or 0) / tp
    if model.dense_bytes is not None or drafter:
        out.add(Figure("hbm.reserve.dense", "  of which dense weights", dense, "bytes",
                       dense_rank.formula, dense_rank.operands,
                       "; ".join(n for n in (src_note(model.sources, "dense_bytes"), dense_rank.note) if n)))
        if drafter:
            out.add(Figure("hbm.reserve.drafter", "  of which drafter weights", drafter, "bytes",
                           "drafter.weights / tp", {"drafter_bytes": drafter * tp, "tp": tp}))
        rest = out.add(Figure("hbm.reserve.runtime", "  of which activations, CUDA graphs, rest",
                              reserve - dense - drafter, "bytes", "reserve − dense − drafter",
                              {"reserve_bytes": reserve, "dense_bytes": dense, "drafter_bytes": drafter},
                              f"declared parts are inside the {_reserve_words(lane.reserves.hbm)}, never added on top"))
        if rest.value < 0:
            out.violations.append(Violation(
                "reserve", f"declared dense + drafter weights ({format_bytes(dense + drafter)}) exceed "
                f"the measured HBM reserve ({format_bytes(reserve)}) they are part of",
                "re-measure the reserve (reserves.hbm) or correct the model's dense_bytes/drafter",
                -rest.value, lane=lane.name))
    return _Hbm(cap, reserve, dense + drafter)


def _prefetch_bank(model: Model, lane: Lane, out: _Figures) -> float:
    tp = lane.tensor_parallel_size
    slots = lane.offload.prefetch_slots_per_layer
    bank = slots * model.num_moe_layers * model.expert_bytes / tp
    if bank:
        out.add(Figure("hbm.prefetch_bank", "prefetch bank (per GPU)", bank, "bytes",
                       "prefetch_slots_per_layer × moe_layers × bytes_per_expert / tp",
                       {"prefetch_slots_per_layer": slots, "moe_layers": model.num_moe_layers,
                        "bytes_per_expert": model.expert_bytes, "tp": tp}))
    return bank


def _kv_rate(model: Model, machine: Machine, lane: Lane, out: _Figures) -> tuple[float, StatePool | None]:
    """KV bytes per token of the lane, summed over its tensor-parallel ranks: the target's, plus
    the drafter's when it runs. The ledger's KV formulas divide it by TP for one GPU."""
    pool = None
    if model.attention:
        target, pool = kv_rate(model, machine, lane, out.add, out.notes, out.violations)
    else:
        target = model.kv_token_bytes
    drafter_kv = (model.drafter.kv_bytes_per_token or 0) if (model.drafter and lane.speculative) else 0
    kv_token_bytes = target + drafter_kv
    if drafter_kv:
        out.add(Figure("kv.bytes_per_token", "KV bytes per token (target + drafter)", kv_token_bytes, "bytes/token",
                       "target_kv_bytes_per_token + drafter.kv_bytes_per_token",
                       {"target_kv_bytes_per_token": target, "drafter_kv_bytes_per_token": drafter_kv}))
    return kv_token_bytes, pool


def _placement_summary(model: Model, lane: Lane, active: PlacementLedger, out: _Figures) -> None:
    """The declared budget as counts and bytes, and the active placement's headline figures."""
    e, n_layers, n_experts = model.expert_bytes, model.num_moe_layers, model.routed_experts
    add = out.add
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
        hot_declared = split.declared == "hot_experts_per_layer"
        add(Figure("budget.hot_per_layer", "declared budget: hot experts per layer", split.hot_per_layer,
                   "count", "" if hot_declared else "routed_experts − cold_per_layer",
                   {} if hot_declared else {"routed_experts": n_experts, "cold_per_layer": split.cold_per_layer},
                   "declared" if hot_declared else "derived from cold_experts_budget"))
    hot_label = f"hot experts in HBM ({lane.offload.placement})"
    cold_label = f"cold experts pinned in host ({lane.offload.placement})"
    if active.placement == POSITIONAL:   # the walk's bytes (it stops inside a layer), not whole counts
        add(positional_experts_figure("placement.hot_experts", hot_label, active, model, hot=True))
        add(positional_experts_figure("placement.cold_experts", cold_label, active, model, hot=False))
    else:
        add(Figure("placement.hot_experts", hot_label, active.hot_bytes, "bytes", "Σ hot per layer × bytes_per_expert",
                   {"hot_experts": sum(active.hot_per_layer), "bytes_per_expert": e}, active.basis))
        add(Figure("placement.cold_experts", cold_label, active.cold_bytes, "bytes",
                   "Σ cold per layer × bytes_per_expert",
                   {"cold_experts": sum(active.cold_per_layer), "bytes_per_expert": e}, active.basis))
    for key in ("hbm.hot_experts", "hbm.kv_pool", "kv.tokens", "kv.full_sequences"):
        out.figs[key] = active.figures[key]
    add(Figure("kv.max_model_len", "max_model_len", lane.max_model_len, "tokens", "", {}))


def _reserve_words(spec: HbmReserve | HostReserve | None) -> str:
    """The reserve by its basis: a pipeline stage's share says it was derived, not declared."""
    if stage_share(spec):
        return "stage reserve derived from the lane's single-box reserve"
    return f"{reserve_basis(spec)} reserve"


def _host_figures(model: Model, machine: Machine, lane: Lane, active: PlacementLedger,
                  out: _Figures, adaptive: float = 0.0) -> tuple[float, float, float]:
    """Host memory: tables + pinned cold experts (+ adaptive residency's spare host rows) + reserve.
    Returns (tables, reserve, total)."""
    add, e, cold_bytes = out.add, model.expert_bytes, active.cold_bytes
    host_memory = machine.host_memory
    add(Figure("host.memory", "host memory", host_memory, "bytes", "", {},
               src_note(machine.sources, "host_memory") or f"machine {machine.name}"))
    tables = add(Figure("host.tables", "host tables", model.host_table_bytes, "bytes",
                        " + ".join(t.name for t in model.host_tables) or "none",
                        {t.name + "_bytes": t.bytes for t in model.host_tables},
                        src_note(model.sources, "host_tables[0].bytes"))).value
    reserve = host_reserve(model, lane, add, out.notes)
    if active.placement == POSITIONAL:
        add(positional_experts_figure("host.cold_experts", "pinned cold experts", active, model, hot=False))
    else:
        add(Figure("host.cold_experts", "pinned cold experts", cold_bytes, "bytes",
                   "Σ cold per layer × bytes_per_expert", {"cold_experts": sum(active.cold_per_layer),
                                                            "bytes_per_expert": e}, active.basis))
    held, held_name = cold_bytes, "cold_experts"
    if lane.offload.placement == POSITIONAL and cold_bytes:
        # Nothing re-homes on a positional lane: vLLM's pinned blocks, each parameter rounded up to a
        # power of two by PyTorch's caching host allocator, are what the host holds for the whole run.
        walk = positional_walk(model, lane.offload.load_cpu_offload or 0, experts_only=experts_only(lane),
                               ranks=lane.tensor_parallel_size)
        formula, operands = pinned_operands(model, walk.host_per_layer)
        held = add(Figure("host.cold_pinned", "pinned cold experts as vLLM holds them",
                          sum(pinned_per_layer(model, walk.host_per_layer)), "bytes", formula, operands,
                          "positional lane: the runtime never moves these experts, so vLLM's pinned blocks stay for the "
                          "whole run; each parameter is pinned at PyTorch's caching-host-allocator size "
                          "(vllm/model_executor/offloader/uva.py:114-116, ATen/core/CachingHostAllocator.h:"
                          "300-309; docs/ledger.md 'Load time')")).value
        held_name = "cold_experts_pinned"
    add(Figure("host.before_reserve", "host tables + pinned experts", tables + held, "bytes",
               f"host_tables + {held_name}", {"host_tables_bytes": tables, f"{held_name}_bytes": held},
               "before page cache and processes"))
    dense = active.dense_host_bytes
    terms = [("host_tables", tables), (held_name, held)]
    if dense:
        add(active.figures["host.dense_offloaded"])
        terms.append(("dense_offloaded", dense))
    if adaptive:
        terms.append(("adaptive_spare_host", adaptive))
    terms.append(("host_reserve", reserve))
    total = add(Figure("host.total", "host in use", sum(v for _, v in terms), "bytes",
                       " + ".join(name for name, _ in terms), {f"{name}_bytes": v for name, v in terms})).value
    add(Figure("host.headroom", "host headroom", host_memory - total, "bytes",
               "host_memory − host_in_use", {"host_memory_bytes": host_memory, "host_in_use_bytes": total}))
    return tables, reserve, total
