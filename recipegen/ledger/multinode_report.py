"""The human ledger of a lane over several machines: one ledger per machine, then the lane."""

from __future__ import annotations

from recipegen.common.units import format_bytes, format_count, format_tokens
from recipegen.ledger.adaptive import size_text
from recipegen.ledger.multinode import MultiNodeLaneLedger
from recipegen.ledger.report_lane import render_lane, verdict_lines
from recipegen.ledger.reserves import basis_of


def _derived(stage, key: str) -> str:
    """What a stage's reserve derives from, in the words of the basis its figure carries."""
    kind = basis_of(stage.ledger.fig(key))
    if key == "hbm.reserve":
        how = ("all of it" if "lane_reserve_bytes" in stage.figures["stage.hbm_reserve"].operands
               else "its rest after the lane's dense and drafter weights + this stage's dense share")
        return f"derived from the lane's {kind} single-box reserve: {how}"
    return f"the lane's {kind} single-box host reserve, assumed on every machine"


def render_multinode_lane(lane: MultiNodeLaneLedger, *, explain: bool = False) -> str:
    out: list[str] = []
    for stage in lane.stages:
        sl = stage.layers
        moe = f"MoE {sl.moe_layers[0]}–{sl.moe_layers[-1]}" if sl.moe_layers else "no MoE layer"
        out.append(f"  machine {stage.machine} · stage {stage.rank} ({stage.role}) · GPU "
                   f"{','.join(map(str, stage.gpus))} · layers {sl.start}–{sl.end - 1} ({moe})"
                   + (" · every expert in HBM" if stage.all_experts_in_hbm else ""))
        f = stage.figures
        parts = [f"stage reserve {format_bytes(f['stage.hbm_reserve'].value)} ({_derived(stage, 'hbm.reserve')})"]
        if "stage.dense" in f:
            parts.append(f"of which dense share {format_bytes(f['stage.dense'].value / len(stage.gpus))} "
                         "(a per-layer approximation)")
        if "host.reserve" in stage.ledger.figures and stage.ledger.fig("host.reserve").value:
            parts.append(f"host reserve {format_bytes(stage.ledger.fig('host.reserve').value)} "
                         f"({_derived(stage, 'host.reserve')})")
        if "stage.tables_in_hbm" in f:
            parts.append(f"host tables in HBM {format_bytes(f['stage.tables_in_hbm'].value)}")
        parts.append("host tables here: " + (", ".join(stage.tables) or "none"))
        out.append("    " + "; ".join(parts))
        body = render_lane(stage.ledger, explain=explain)
        out.extend("  " + line for line in body.splitlines())
        if explain:
            out.append("    Stage shares:")
            for fig in f.values():
                out.extend("      " + line for line in fig.explain().splitlines())
    fig = lane.figures
    out.append(f"  lane summary: pipeline {lane.pipeline_parallel_size} × tensor parallel "
               f"{lane.tensor_parallel_size}; KV {fig['kv.tokens'].display()} (smallest stage) → "
               f"{format_count(int(fig['kv.full_sequences'].value), 'full max_model_len sequence')}; experts in HBM "
               f"{format_bytes(fig['lane.hbm.hot_experts'].value)}, pinned in host "
               f"{format_bytes(fig['lane.host.cold_experts'].value)}; host tables {format_bytes(fig['lane.host_tables'].value)}")
    if "lane.adaptive.spare_hbm_bytes" in fig:
        out.append(f"  adaptive residency: spare rows {size_text(fig['lane.adaptive.spare_hbm_bytes'].value)} "
                   f"of HBM over the adaptive stages' GPUs; copies beside the steps at most "
                   f"{size_text(fig['lane.adaptive.copy_bytes_per_step'].value)} per step and GPU over "
                   "the busiest stage's host link")
    if lane.layouts:
        # What-ifs beside the recipe's own layout: a layout that would not fit is information for
        # choosing, not a failed budget (the verdict at the end is the recipe's layout's).
        own_experts = all(stage.all_experts_in_hbm for stage in lane.stages)
        own_tables = any("stage.tables_in_hbm" in stage.figures for stage in lane.stages)
        out.append("  whole-lane layouts compared (what-ifs; the verdict below is for this recipe's layout):")
    for verdict in lane.layouts:
        stages = ", ".join(f"{m} KV {format_bytes(pool)} = {format_tokens(t)} tokens" if ok else
                           f"{m} over its HBM cap by {format_bytes(-pool)}, no room for KV"
                           for m, t, pool, ok in verdict.stages)
        mine = (verdict.experts_in_hbm, verdict.tables_in_hbm) == (own_experts, own_tables)
        out.append(f"    {verdict.name}{' (this recipe)' if mine else ''}: "
                   + (f"fits ({stages})" if verdict.fits else
                      f"would not fit, {format_bytes(verdict.shortfall)} short ({stages})")
                   + f"; weights + reserves {format_bytes(verdict.weights_and_reserves)} of HBM caps {format_bytes(verdict.hbm_cap)}")
    if explain:
        # the lane's own figures (the summary's and the layouts' numbers), not the head stage's it carries too
        head = lane.stages[0].ledger.figures if lane.stages else {}
        own = [f for key, f in fig.items() if head.get(key) is not f]
        if own:
            out.append("  Lane figures:")
            for f in own:
                out.extend("    " + line for line in f.explain().splitlines())
    for f in lane.stage_fetch:
        out.append(f"  cost model: stage {f.rank} ({f.machine}) at {format_count(f.streams, 'stream')}, k={f.k}: "
                   f"{f.cold_bytes_per_step / 1e6:,.1f} MB from host per step = {f.fetch_ms:.2f} ms "
                   f"({f.basis})")
    out.append(f"  {lane.recommendation}")
    for note in lane.notes[:1]:
        out.append(f"  note: {note}")
    out += verdict_lines(lane.ok, lane.violations, holds="every budget holds on every machine")
    return "\n".join(out)
