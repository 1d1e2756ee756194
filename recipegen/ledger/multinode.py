"""The ledger of a lane that spans machines: one ledger per pipeline stage (= per machine), a lane
summary, and the all-HBM question (does every weight fit in HBM next to a useful KV pool?).

Pure. Each stage is the lane's own budget arithmetic (`lane.compute_lane`, the one home of every
HBM/KV/host formula) applied to the stage's share of the model: its MoE layers, its share of the
dense weights, the drafter on the last stage, the host tables of its layers, KV for its layers. The
only formulas here are those shares and the stage's HBM reserve:

- layers per stage: vLLM's own rule (`recipegen.multinode.partition`) or the declared partition;
- dense share: dense_bytes × stage_layers / decoder_layers (attention, shared experts and norms
  are per layer; embeddings and LM head sit on the first and last stage — an approximation);
- KV per token: kv_bytes_per_token × stage_layers / decoder_layers (every stage caches its layers);
- stage HBM reserve: the lane's measured per-GPU reserve minus its dense and drafter parts (what is
  left is activations, CUDA graphs and runtime, which every GPU pays), plus the stage's dense share
  (and the drafter on the last stage — vLLM runs the drafter on the last pipeline rank).

vLLM sizes one KV pool per rank and the engine uses the smallest (every stage caches every token
for its layers), so the lane's KV tokens are the minimum over stages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from recipegen.common.units import format_bytes, format_tokens
from recipegen.ledger.figures import Figure
from recipegen.ledger.kv import sequence_block, sequence_tokens
from recipegen.ledger.lane import compute_lane
from recipegen.ledger.reserves import reserve_basis, stage_share_source, stage_share_words
from recipegen.ledger.result import LaneLedger, PlacementLedger, Violation
from recipegen.multinode.partition import StageLayers, stage_layers
from recipegen.schema import HbmReserve, HostReserve, HostTable, Lane, Model, Recipe
from recipegen.schema.model import kv_bytes_per_token


@dataclass
class StageLedger:
    """One pipeline stage on one machine: its layers and its own full ledger."""

    rank: int
    machine: str
    gpus: list[int]
    layers: StageLayers
    all_experts_in_hbm: bool
    tables: list[str]                   # host tables this stage holds
    ledger: LaneLedger                  # compute_lane on the stage's share of the model
    figures: dict[str, Figure]          # the share figures (layers, dense, KV rate, reserve)

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "role": self.role, "machine": self.machine, "gpus": self.gpus,
                "layers": [self.layers.start, self.layers.end],
                "moe_layers": [self.layers.moe_layers[0], self.layers.moe_layers[-1]]
                if self.layers.moe_layers else [],
                "all_experts_in_hbm": self.all_experts_in_hbm, "host_tables": self.tables,
                "figures": {k: f.to_json() for k, f in self.figures.items()},
                "ledger": self.ledger.to_json()}


@dataclass
class LayoutVerdict:
    """Does a whole-lane layout fit? One line per stage."""

    name: str
    experts_in_hbm: bool
    tables_in_hbm: bool
    fits: bool
    stages: list[tuple[str, float, float, bool]]   # (machine, kv tokens, kv pool bytes, fits)
    shortfall: float                               # bytes over, summed over failing stages
    weights_and_reserves: float = 0.0              # Σ stages: reserve + experts in HBM (all GPUs)
    hbm_cap: float = 0.0                           # Σ stages: HBM cap (all GPUs)
    key: str = ""                                  # its figures' key: layout.<key>.*
    figures: dict[str, Figure] = field(default_factory=dict)   # the numbers its line prints, explained

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "experts_in_hbm": self.experts_in_hbm,
                "tables_in_hbm": self.tables_in_hbm, "fits": self.fits,
                "stages": [{"machine": m, "kv_tokens": t, "kv_pool_bytes": p, "fits": ok}
                           for m, t, p, ok in self.stages],
                "shortfall_bytes": self.shortfall, "weights_and_reserves_bytes": self.weights_and_reserves,
                "hbm_cap_bytes": self.hbm_cap}

    @property
    def any_split_fits(self) -> bool:
        """Whether some layer split could fit it at all (Σ weights and reserves ≤ Σ caps)."""
        return self.weights_and_reserves <= self.hbm_cap


@dataclass
class MultiNodeLaneLedger(LaneLedger):
    """A lane over several machines. Its own `figures`/`violations` are the lane summary and every
    stage's violations; `stages` hold one full ledger per machine."""

    stages: list[StageLedger] = field(default_factory=list)
    layouts: list[LayoutVerdict] = field(default_factory=list)
    recommendation: str = ""
    pipeline_parallel_size: int = 1
    tensor_parallel_size: int = 1
    stage_fetch: list[Any] = field(default_factory=list)   # filled by costmodel.stages (needs histograms)

    def stage_on(self, machine: str) -> StageLedger:
        for stage in self.stages:
            if stage.machine == machine:
                return stage
        raise KeyError(machine)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out.update({"multinode": True, "pipeline_parallel_size": self.pipeline_parallel_size,
                    "tensor_parallel_size": self.tensor_parallel_size,
                    "stages": [s.to_json() for s in self.stages],
                    "layouts": [v.to_json() for v in self.layouts],
                    "recommendation": self.recommendation,
                    "stage_fetch": [f.to_json() for f in self.stage_fetch]})
        return out


# ------------------------------------------------------------------------------------------

def lane_stages(model: Model, lane: Lane) -> list[StageLayers]:
    """The lane's stages' layer ranges (vLLM's rule unless declared)."""
    assert lane.parallel is not None
    return stage_layers(model.decoder_layers, model.moe_layers, lane.parallel.pipeline_parallel_size,
                        lane.parallel.layer_partition)


def compute_multinode_lane(recipe: Recipe, lane: Lane, *, rowmap_hot: Sequence[int] | None = None,
                           rowmap_label: str | None = None) -> MultiNodeLaneLedger:
    """Per-stage ledgers of a multi-node lane, the lane summary and the all-HBM verdicts."""
    assert lane.parallel is not None
    model = recipe.model
    parallel = lane.parallel
    head_machine = recipe.machines[lane.machine]
    # The lane's reserve as measured (one GPU holding the whole model): computed by the lane
    # arithmetic itself, so its dense/drafter/rest split is the ledger's own.
    whole = compute_lane(model, head_machine, lane.model_copy(update={"parallel": None}),
                         rowmap_hot=rowmap_hot, rowmap_label=rowmap_label)
    layers = lane_stages(model, lane)
    stages = [_stage(recipe, lane, whole, rank, sl, rowmap_hot, rowmap_label,
                     experts_in_hbm=parallel.pipeline[rank].all_experts_in_hbm,
                     tables_in_hbm=parallel.host_tables_in_hbm)
              for rank, sl in enumerate(layers)]
    layouts = [_layout(recipe, lane, whole, layers, name, key, experts, tables)
               for name, key, experts, tables in (
                   ("every weight in HBM (experts and host tables)", "all_weights_in_hbm", True, True),
                   ("every expert in HBM, host tables in host", "experts_in_hbm", True, False))]

    figs: dict[str, Figure] = {}
    tokens = [s.ledger.fig("kv.tokens").value for s in stages]
    low = min(range(len(stages)), key=lambda i: tokens[i])
    figs["kv.tokens"] = Figure(
        "kv.tokens", "lane KV pool in tokens (smallest stage)", tokens[low], "tokens",
        "min over stages of stage kv_tokens", {f"stage{s.rank}_{s.machine}_tokens": round(t)
                                               for s, t in zip(stages, tokens)},
        "vLLM allocates the same number of KV blocks on every rank: the smallest pool decides")
    figs["kv.max_model_len"] = Figure("kv.max_model_len", "max_model_len", lane.max_model_len, "tokens", "", {})
    figs["kv.full_sequences"] = Figure(
        "kv.full_sequences", "full max_model_len sequences that fit", math.floor(tokens[low] / sequence_tokens(lane)),
        "sequences", "⌊kv_tokens / max_model_len in whole blocks⌋",
        {"kv_tokens": round(tokens[low]), "max_model_len": lane.max_model_len, "block_rounding": sequence_block(lane)})
    for key, label in (("hbm.hot_experts", "hot routed experts in HBM (all stages)"),
                       ("host.cold_experts", "routed experts pinned in host (all machines)")):
        values = {f"stage{s.rank}_bytes": s.ledger.fig(key).value * (len(s.gpus) if key.startswith("hbm") else 1)
                  for s in stages}
        figs["lane." + key] = Figure("lane." + key, label, sum(values.values()), "bytes",
                                     "Σ stages" + (" (× GPUs per stage)" if key.startswith("hbm") else ""),
                                     values)
    figs["lane.host_tables"] = Figure(
        "lane.host_tables", "host tables (all machines)", sum(s.ledger.fig("host.tables").value for s in stages),
        "bytes", "Σ stages", {f"stage{s.rank}_bytes": s.ledger.fig("host.tables").value for s in stages},
        "in HBM instead (--engram-config cpu_offload false)" if parallel.host_tables_in_hbm else "")

    for layout in layouts:
        figs.update(layout.figures)
    figs.update(_adaptive_lane_figures(stages))
    violations = [v for s in stages for v in s.ledger.violations]
    notes = [f"pipeline parallel {len(stages)} × tensor parallel {parallel.tensor_parallel_size} on vLLM's "
             f"multi-node mode; layers per stage {[s.layers.num_layers for s in stages]} "
             + ("(declared VLLM_PP_LAYER_PARTITION)" if parallel.layer_partition else
                "(vLLM's get_pp_indices rule)")]
    recommendation = _recommend(lane, stages, layouts)
    head = stages[0].ledger
    placement = "all-HBM" if all(s.all_experts_in_hbm or not any(s.ledger.active.cold_per_layer)
                                 for s in stages) else lane.offload.placement
    return MultiNodeLaneLedger(
        lane=lane.name, machine=lane.machine, gpus=list(lane.gpus), placement=placement,
        figures={**head.figures, **figs}, usage_aware=_joined(stages, "usage_aware"),
        positional=None, violations=violations, notes=notes + head.notes, stages=stages,
        layouts=layouts, recommendation=recommendation,
        pipeline_parallel_size=len(stages), tensor_parallel_size=parallel.tensor_parallel_size)


def _adaptive_lane_figures(stages: Sequence[StageLedger]) -> dict[str, Figure]:
    """`offload.adaptive` over the lane: the stages that run it (not those holding every expert in
    HBM) each hold spare rows on their own GPUs and copy their own layers' swaps over their own
    machine's host link, so the lane's spare rows are the sum and its copy traffic per step and GPU
    is the largest stage's."""
    adaptive = [s for s in stages if "adaptive.spare_hbm_bytes" in s.ledger.figures]
    if not adaptive:
        return {}
    spare = {f"stage{s.rank}_bytes": s.ledger.fig("adaptive.spare_hbm_bytes").value * len(s.gpus) for s in adaptive}
    step = {f"stage{s.rank}_bytes": s.ledger.fig("adaptive.copy_bytes_per_step").value for s in adaptive}
    return {
        "lane.adaptive.spare_hbm_bytes": Figure(
            "lane.adaptive.spare_hbm_bytes", "adaptive: spare HBM rows (all adaptive stages' GPUs)",
            sum(spare.values()), "bytes", "Σ adaptive stages (× GPUs per stage)", spare,
            "stages holding every expert in HBM run no residency runtime"),
        "lane.adaptive.copy_bytes_per_step": Figure(
            "lane.adaptive.copy_bytes_per_step", "adaptive: copies per decode step while adapting, at most "
            "(per GPU, busiest stage)", max(step.values()), "bytes", "max over adaptive stages", step,
            "each stage copies only its own MoE layers' swaps, over its own machine's host link"),
    }


# ------------------------------------------------------------------------------------------

def stage_model(model: Model, layers: StageLayers, *, last: bool, tables_in_hbm: bool
                ) -> tuple[Model, list[HostTable], dict[str, Figure]]:
    """The stage's share of the model (its MoE layers, dense share, KV rate, drafter, tables)."""
    share = layers.num_layers / model.decoder_layers
    figs: dict[str, Figure] = {}
    figs["stage.layers"] = Figure(
        "stage.layers", "decoder layers on this stage", layers.num_layers, "count",
        "end − start", {"start": layers.start, "end": layers.end, "moe_layers": len(layers.moe_layers)})
    tables = [t for t in model.host_tables if t.layer is None or layers.holds(t.layer)]
    sources = dict(model.sources)     # the stage's KV rate is its own: say so where the ledger quotes a source
    update: dict[str, Any] = {"moe_layers": list(layers.moe_layers),
                              "host_tables": [] if tables_in_hbm else tables,
                              # the offload walk over whole decoder layers spans the model, not a stage:
                              # a stage walks its routed experts only
                              "decoder_layer_bytes": None}
    if model.dense_bytes is not None:
        dense = model.dense_bytes * share
        figs["stage.dense"] = Figure(
            "stage.dense", "dense weights on this stage", dense, "bytes",
            "dense_bytes × stage_layers / decoder_layers",
            {"dense_bytes": model.dense_bytes, "stage_layers": layers.num_layers,
             "decoder_layers": model.decoder_layers},
            "approximation: per-layer share (embeddings/LM head are on the first/last stage)")
        update["dense_bytes"] = round(dense)
    if model.attention:
        groups = [g.model_copy(update={"layers": [n for n in g.layers if layers.holds(n)]})
                  for g in model.attention]
        update["attention"] = [g for g in groups if g.layers]
        update["kv_bytes_per_token"] = kv_bytes_per_token(update["attention"])
        if model.state:  # hybrids: the stage's own state layers (vLLM sizes each stage's pool alone)
            states = [g.model_copy(update={"layers": [n for n in g.layers if layers.holds(n)]}) for g in model.state]
            update["state"] = [g for g in states if g.layers]
            update["cacheless_layers"] = [n for n in model.cacheless_layers if layers.holds(n)]
        sources["kv_bytes_per_token"] = "Σ this stage's attention layers (stage.kv_bytes_per_token)"
        figs["stage.kv_bytes_per_token"] = Figure(
            "stage.kv_bytes_per_token", "KV bytes per token for this stage's layers (one rank)",
            update["kv_bytes_per_token"], "bytes/token", "Σ this stage's attention layers × bytes per token per layer",
            {"stage_layers": layers.num_layers})
    elif model.kv_bytes_per_token is not None:
        update["kv_bytes_per_token"] = max(1, round(model.kv_bytes_per_token * share))
        sources["kv_bytes_per_token"] = (f"this stage's share of the model's {model.kv_bytes_per_token:,} B per token "
                                         f"(stage.kv_bytes_per_token; the model's: "
                                         f"{model.sources.get('kv_bytes_per_token', 'no source given')})")
        figs["stage.kv_bytes_per_token"] = Figure(
            "stage.kv_bytes_per_token", "KV bytes per token for this stage's layers",
            update["kv_bytes_per_token"], "bytes/token", "kv_bytes_per_token × stage_layers / decoder_layers",
            {"kv_bytes_per_token": model.kv_bytes_per_token, "stage_layers": layers.num_layers,
             "decoder_layers": model.decoder_layers})
    else:
        assert model.kv_tokens_per_gib is not None
        update["kv_tokens_per_gib"] = model.kv_tokens_per_gib / share
        sources["kv_tokens_per_gib"] = (f"this stage's share of the model's {model.kv_tokens_per_gib:,.0f} tokens per "
                                        f"GiB (stage.kv_tokens_per_gib; the model's: "
                                        f"{model.sources.get('kv_tokens_per_gib', 'no source given')})")
        figs["stage.kv_tokens_per_gib"] = Figure(
            "stage.kv_tokens_per_gib", "KV tokens per GiB for this stage's layers",
            update["kv_tokens_per_gib"], "tokens/GiB", "kv_tokens_per_gib × decoder_layers / stage_layers",
            {"kv_tokens_per_gib": model.kv_tokens_per_gib, "stage_layers": layers.num_layers,
             "decoder_layers": model.decoder_layers},
            "every layer is taken to cache the same bytes per token (approximation)")
    if not last and model.drafter is not None:
        update["drafter"] = None
    update["sources"] = sources
    return model.model_copy(update=update), tables, figs


def _stage(recipe: Recipe, lane: Lane, whole: LaneLedger, rank: int, layers: StageLayers,
           rowmap_hot: Sequence[int] | None, rowmap_label: str | None, *, experts_in_hbm: bool,
           tables_in_hbm: bool) -> StageLedger:
    assert lane.parallel is not None
    model = recipe.model
    spec = lane.parallel.pipeline[rank]
    machine = recipe.machines[spec.machine]
    last = rank == lane.parallel.pipeline_parallel_size - 1
    if not layers.moe_layers:
        raise ValueError(f"stage {rank} ({spec.machine}) holds no MoE layer")
    smodel, tables, figs = stage_model(model, layers, last=last, tables_in_hbm=tables_in_hbm)
    tp = len(spec.gpus)
    reserve = _stage_reserve(model, whole, smodel, figs, tp, lane.reserves.hbm, last=last)
    if tables_in_hbm and tables:
        table_bytes = sum(t.bytes for t in tables)
        figs["stage.tables_in_hbm"] = Figure(
            "stage.tables_in_hbm", "host tables placed in HBM (per GPU)", table_bytes / tp, "bytes",
            "Σ stage tables / tp", {t.name + "_bytes": t.bytes for t in tables} | {"tp": tp},
            "--engram-config '{\"cpu_offload\": false}' (vLLM shards them over TP)")
        reserve += table_bytes / tp
    figs["stage.hbm_reserve"] = Figure(
        "stage.hbm_reserve", "stage HBM reserve (per GPU)", reserve, "bytes",
        ("runtime_rest + stage_dense_per_gpu (stage.dense / tp) + drafter_per_gpu (drafter / tp, last stage only)"
         if "runtime_rest_bytes" in figs["stage.hbm_reserve.parts"].operands else "lane_reserve")
        + (" + tables_in_hbm_per_gpu" if tables_in_hbm and tables else ""),
        {**figs["stage.hbm_reserve.parts"].operands,
         **({"tables_in_hbm_per_gpu_bytes": figs["stage.tables_in_hbm"].value} if "stage.tables_in_hbm" in figs else {})},
        figs["stage.hbm_reserve.parts"].note)
    del figs["stage.hbm_reserve.parts"]
    # The stage's reserves are given to its ledger as values, then labelled by what they derive from
    # (`_label_stage_reserves`): nothing was measured on a pipeline-parallel boot.
    updates: dict[str, Any] = {
        "machine": spec.machine, "gpus": list(spec.gpus), "parallel": None,
        "reserves": lane.reserves.model_copy(update={
            "hbm": HbmReserve(value=f"{round(reserve)} B", source=stage_share_source(rank)),
            # The host reserve (page cache, processes) is the lane's, back-solved against the
            # whole model's tables; every machine is charged all of it.
            "host": None if lane.reserves.host is None else HostReserve(
                value=f"{round(whole.fig('host.reserve').value)} B", source="the lane's host reserve, per machine")})}
    hot = list(rowmap_hot[model.moe_layers.index(layers.moe_layers[0]):
                         model.moe_layers.index(layers.moe_layers[-1]) + 1]) if rowmap_hot is not None else None
    label = rowmap_label
    if experts_in_hbm:
        updates["offload"] = lane.offload.model_copy(update={
            "placement": "usage-aware", "hot_experts_per_layer": model.routed_experts,
            "cold_experts_budget": None, "load_cpu_offload": None,
            # no cold bank, no residency runtime on this stage (render gives it none): nothing to swap
            "adaptive": None})
        hot, label = None, None
    if not last:
        updates["speculative"] = None
    ledger = compute_lane(smodel, machine, lane.model_copy(update=updates), rowmap_hot=hot,
                          rowmap_label=f"{label}, layers {layers.moe_layers[0]}–{layers.moe_layers[-1]}"
                          if label else None)
    _label_stage_reserves(ledger, lane, rank, figs["stage.hbm_reserve"])
    ledger.violations[:] = [replace(v, machine=v.machine or spec.machine,
                                    message=f"stage {rank} on {spec.machine}: {v.message}")
                            for v in ledger.violations]
    return StageLedger(rank, spec.machine, list(spec.gpus), layers, experts_in_hbm,
                       [t.name for t in tables], ledger, figs)


# How a stage's reserve derives from the lane's single-box one, by that one's basis (`reserve_basis`).
# Each note opens with the words `reserves.basis_of` reads, so the stage prints the single box's basis
# (back-solved, estimated, …), never "measured" for a figure that was worked out, not read.
_DERIVED_FROM = {
    "back-solved": "back-solved on one box, not measured on this pipeline",
    "estimated": "estimated, not measured",
    "measured": "measured input on one box, not on this pipeline",
    "assumed": "assumed input (not measured)",
    "declared": "declared input (not marked measured: set basis)",
}


def _label_stage_reserves(ledger: LaneLedger, lane: Lane, rank: int, stage_reserve: Figure) -> None:
    """Relabel the stage ledger's `hbm.reserve` and `host.reserve` (given to it as plain values) with
    what they derive from: the lane's single-box reserves, split or copied per stage."""
    hbm = ledger.figures["hbm.reserve"]
    kind = reserve_basis(lane.reserves.hbm)
    split = ("the lane's whole reserve, charged to every stage" if "lane_reserve_bytes" in stage_reserve.operands
             else "its rest after the lane's dense and drafter weights, paid on every GPU, + this stage's dense "
                  "share, a per-layer approximation")
    ledger.figures["hbm.reserve"] = replace(
        hbm, label="HBM reserve (non-expert, non-KV; this stage's share)",
        note=f"{_DERIVED_FROM.get(kind, _DERIVED_FROM['declared'])}: {stage_share_words(rank, kind)} "
             f"({_source(lane.reserves.hbm)}) — {split} (stage.hbm_reserve)")
    host = ledger.figures.get("host.reserve")
    if lane.reserves.host is not None and host is not None:
        kind = reserve_basis(lane.reserves.host)
        ledger.figures["host.reserve"] = replace(
            host, note=f"{_DERIVED_FROM.get(kind, _DERIVED_FROM['declared'])}: the lane's {kind} single-box host "
                       f"reserve ({_source(lane.reserves.host)}), assumed on every machine: each is charged all of it")


def _source(spec: HbmReserve | HostReserve) -> str:
    return spec.source or ("the ledger's estimate" if spec.estimated else "no source given")


def _stage_reserve(model: Model, whole: LaneLedger, smodel: Model, figs: dict[str, Figure], tp: int,
                   whole_reserve_spec: HbmReserve, *, last: bool) -> float:
    """runtime rest (whole lane's reserve − its dense − drafter) + this stage's dense + drafter."""
    measured = whole.fig("hbm.reserve").value
    if "hbm.reserve.runtime" in whole.figures:
        rest = whole.fig("hbm.reserve.runtime").value
        dense = (smodel.dense_bytes or 0) / tp
        drafter = ((model.drafter.weights or 0) / tp) if (last and model.drafter) else 0.0
        figs["stage.hbm_reserve.parts"] = Figure(
            "", "", 0, "bytes", "", {"runtime_rest_bytes": rest, "stage_dense_per_gpu_bytes": dense,
                                     "drafter_per_gpu_bytes": drafter, "tp": tp},
            f"runtime rest = the lane's {reserve_basis(whole_reserve_spec)} single-box reserve − its dense and drafter "
            "weights, paid on every GPU; stage dense: a per-layer share (stage.dense, an approximation)")
        return rest + dense + drafter
    figs["stage.hbm_reserve.parts"] = Figure(
        "", "", 0, "bytes", "", {"lane_reserve_bytes": measured},
        "the model declares no dense_bytes: every stage is charged the lane's whole reserve (conservative)")
    return measured


def _layout(recipe: Recipe, lane: Lane, whole: LaneLedger, layers: list[StageLayers], name: str, key: str,
            experts_in_hbm: bool, tables_in_hbm: bool) -> LayoutVerdict:
    rows: list[tuple[str, float, float, bool]] = []
    shortfall = need = cap = 0.0
    need_ops: dict[str, Any] = {}
    cap_ops: dict[str, Any] = {}
    short_terms: list[str] = []
    short_ops: dict[str, Any] = {}
    for rank, sl in enumerate(layers):
        stage = _stage(recipe, lane, whole, rank, sl, None, None, experts_in_hbm=experts_in_hbm,
                       tables_in_hbm=tables_in_hbm)
        hbm = [v for v in stage.ledger.violations if v.kind in ("hbm", "kv")]
        shortfall += sum(v.over_bytes or 0 for v in hbm)
        for v in hbm:
            term, ops = _shortfall_term(stage, lane, v)
            short_terms.append(term)
            short_ops.update(ops)
        gpus = len(stage.gpus)
        reserve, hot = stage.figures["stage.hbm_reserve"].value, stage.ledger.fig("hbm.hot_experts").value
        need += (reserve + hot) * gpus
        cap += stage.ledger.fig("hbm.cap").value * gpus
        need_ops.update({f"stage{rank}_reserve_bytes": reserve, f"stage{rank}_hot_experts_bytes": hot,
                         f"stage{rank}_gpus": gpus})
        cap_ops.update({f"stage{rank}_hbm_cap_bytes": stage.ledger.fig("hbm.cap").value, f"stage{rank}_gpus": gpus})
        rows.append((stage.machine, stage.ledger.fig("kv.tokens").value,
                     stage.ledger.fig("hbm.kv_pool").value, not hbm))
    fits = all(ok for *_, ok in rows)
    tables = " (host tables in HBM inside it: stage.tables_in_hbm)" if tables_in_hbm else ""
    figs = {
        f"layout.{key}.weights_and_reserves": Figure(
            f"layout.{key}.weights_and_reserves", f"{name}: weights + reserves (all stages' GPUs)", need, "bytes",
            "Σ stages (stage HBM reserve + hot experts, per GPU) × GPUs", need_ops,
            f"what-if layout; the stage reserve as stage.hbm_reserve{tables}, hot experts as hbm.hot_experts"),
        f"layout.{key}.hbm_caps": Figure(
            f"layout.{key}.hbm_caps", f"{name}: HBM caps (all stages' GPUs)", cap, "bytes",
            "Σ stages hbm_cap × GPUs", cap_ops),
    }
    if not fits:
        figs[f"layout.{key}.shortfall"] = Figure(
            f"layout.{key}.shortfall", f"{name}: short of HBM (Σ stages that do not fit, per GPU)", shortfall,
            "bytes", "Σ stages that do not fit: " + " + ".join(short_terms), short_ops,
            "what-if layout: each such stage's HBM over its cap (no room for KV), or the KV one max_model_len "
            "sequence lacks")
    return LayoutVerdict(name, experts_in_hbm, tables_in_hbm, fits, rows, shortfall, need, cap, key, figs)


def _shortfall_term(stage: StageLedger, lane: Lane, violation: Violation) -> tuple[str, dict[str, Any]]:
    """One failing stage's part of a layout's shortfall (the violation's over_bytes), as a formula
    term and its operands: past the HBM cap, the KV pool's own terms, negated; a pool short of one
    max_model_len sequence, its missing tokens × the lane's KV bytes per token."""
    r = f"stage{stage.rank}"
    pool = stage.ledger.fig("hbm.kv_pool")
    if violation.kind == "hbm" and pool.value <= 0 and "kv_cache_bytes" not in pool.operands \
            and violation.over_bytes == -pool.value:
        return f"{r}: −({pool.formula})", {f"{r}_{k}": v for k, v in pool.operands.items()}
    tokens = stage.ledger.fig("kv.tokens").value
    if violation.kind == "kv" and violation.over_bytes and sequence_tokens(lane) > tokens:
        rate = violation.over_bytes / (sequence_tokens(lane) - tokens)   # the stage's KV bytes per token (lane)
        return (f"{r}: (max_model_len in whole blocks − kv_tokens) × lane_kv_bytes_per_token",
                {f"{r}_sequence_tokens": sequence_tokens(lane), f"{r}_kv_tokens": tokens,
                 f"{r}_lane_kv_bytes_per_token": rate})
    return f"{r}_over", {f"{r}_over_bytes": violation.over_bytes}


def _recommend(lane: Lane, stages: list[StageLedger], layouts: list[LayoutVerdict]) -> str:
    fitting = [v for v in layouts if v.fits]
    offloading = [s for s in stages if not s.all_experts_in_hbm and any(s.ledger.active.cold_per_layer)]
    if not fitting:
        worst = layouts[-1]
        return (f"all-HBM does not fit ({worst.name}: {format_bytes(worst.shortfall)} short for one "
                f"max_model_len sequence); keep expert residency on the stages that offload")
    best = fitting[0]
    kv = min(t for _, t, _, _ in best.stages)
    text = f"recommended: {best.name} — fits on every stage, KV {format_tokens(kv)} tokens per stage pool"
    if offloading:
        text += ("; set all_experts_in_hbm: true on stage(s) "
                 + ", ".join(f"{s.rank} ({s.machine})" for s in offloading)
                 + " — they offload experts although all fit")
    for verdict in layouts:
        if not verdict.fits:
            text += f". Not: {verdict.name} ({format_bytes(verdict.shortfall)} short"
            text += (f"; no layer split fits it: weights + reserves {format_bytes(verdict.weights_and_reserves)}"
                     f" > HBM caps {format_bytes(verdict.hbm_cap)})" if not verdict.any_split_fits else
                     "; another layer_partition may fit it)")
    return text


def _joined(stages: list[StageLedger], attr: str) -> PlacementLedger:
    """The lane's placement across stages: per-layer hot/cold counts in layer order."""
    parts = [getattr(s.ledger, attr) for s in stages]
    hot = [h for p in parts for h in p.hot_per_layer]
    cold = [c for p in parts for c in p.cold_per_layer]
    return PlacementLedger(parts[0].placement, hot, cold, "; ".join(
        f"stage {s.rank}: {p.basis}" for s, p in zip(stages, parts)),
        sum(p.hot_bytes for p in parts), sum(p.cold_bytes for p in parts),
        dict(stages[0].ledger.active.figures))


def stage_engines(lane: Lane, ledger: MultiNodeLaneLedger) -> list[tuple[str, Lane, LaneLedger]]:
    """(machine, the lane as that stage runs it, the stage's ledger) per stage: what the machine
    checks (host memory, shared GPUs) count on each machine."""
    out = []
    for stage in ledger.stages:
        stage_lane = lane.model_copy(update={"machine": stage.machine, "gpus": list(stage.gpus),
                                             "parallel": None})
        out.append((stage.machine, stage_lane, stage.ledger))
    return out
