"""Plain-text renderings of the rowmap reports (pure: report in, lines out)."""

from __future__ import annotations

from collections.abc import Sequence

from expert_residency.formats import RowMap
from expert_residency.formats._io import format_index_ranges
from expert_residency.formats.report import summarize_counts

from recipegen.common.units import GiB as GIB
from recipegen.rowmap.build import TUNING_MINUTES_PER_SHAPE, BudgetBuild
from recipegen.rowmap.compare import CompareReport
from recipegen.rowmap.diff import DiffReport
from recipegen.rowmap.evaluate import EvalReport, HistogramEval
from recipegen.rowmap.skew import TOP_FRACTIONS, top_count


def pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB ({n:,} B)"


def _per_layer_line(values: Sequence[float]) -> str:
    return " ".join(f"{100 * v:.1f}" for v in values)


def eval_lines(report: EvalReport, *, per_layer: bool = False) -> list[str]:
    lines = [f"row map {report.map_name}",
             f"  content_hash {report.content_hash}",
             f"  shape_hash   {report.shape_hash}",
             f"  hot/cold per layer: {summarize_counts(report.hot_counts)} hot"]
    rows = list(report.histograms) + ([report.combined] if report.combined else [])
    lines.append("")
    lines.append(f"  {'histogram':<40} {'selections':>12} {'cold':>8} {'worst layer':>12} "
                 f"{'positional':>11} {'vLLM layer-offload':>19}")
    for h in rows:
        worst = max(h.cold_share_per_layer) if h.cold_share_per_layer else 0.0
        tag = " [synthetic]" if h.synthetic else ""
        lines.append(f"  {(h.name + tag)[-40:]:<40} {h.selections:>12,} {pct(h.cold_share):>8} "
                     f"{pct(worst):>12} {pct(h.positional_cold_share):>11} "
                     f"{pct(h.layer_positional_cold_share):>19}")
    if per_layer:
        for h in rows:
            lines.append(f"  per-layer cold % ({h.name}): {_per_layer_line(h.cold_share_per_layer)}")
    lines.append("")
    lines.append("  skew (share of selections in each layer's top experts; Gini per layer)")
    head = " ".join(f"{'top ' + str(int(round(f * 100))) + '%':>9}" for f in TOP_FRACTIONS)
    lines.append(f"  {'histogram':<40} {head} {'mean Gini':>10}")
    for h in rows:
        shares = " ".join(f"{pct(h.skew.top_shares[f]):>9}" for f in TOP_FRACTIONS)
        lines.append(f"  {h.name[-40:]:<40} {shares} {h.skew.mean_gini:>10.3f}")
    if per_layer:
        for h in rows:
            lines.append(f"  per-layer Gini ({h.name}): "
                         + " ".join(f"{g:.3f}" for g in h.skew.gini_per_layer))
    if report.leave_one_out:
        lines.append("")
        lines.append("  leave-one-out (map with these hot counts built from the other files, "
                     "measured on the held-out one)")
        for l in report.leave_one_out:
            lines.append(f"  {l.held_out[-40:]:<40} {pct(l.cold_share):>8}")
        values = [l.cold_share for l in report.leave_one_out]
        lines.append(f"  {'range':<40} {pct(min(values))} – {pct(max(values))}")
    for note in report.notes:
        lines.append(f"  note: {note}")
    lines.append("  note: cold = share of selections on the map's cold experts; positional = the same cold "
                 "count per layer taken as the highest expert ids; vLLM layer-offload = the same cold bytes "
                 "as whole layers in load order, as --cpu-offload-gb takes them")
    return lines


def top_fraction_note(num_experts: int) -> str:
    return ", ".join(f"top {int(round(f * 100))}% = {top_count(num_experts, f)} experts"
                     for f in TOP_FRACTIONS)


def compare_lines(r: CompareReport) -> list[str]:
    a, b = r.name_a, r.name_b
    w = max(10, len(a), len(b)) + 3
    lw = 30
    lines = [f"compare {a} vs {b} at {r.hot} hot per layer",
             f"  Spearman rank correlation (mean over layers): {r.mean_spearman:.3f}",
             f"  hot-set overlap: {pct(r.hot_overlap)} (unrelated rankings: "
             f"{pct(r.chance_hot_overlap)}); cold-set overlap: {pct(r.cold_overlap)}",
             "",
             f"  {'cold share':<{lw}} {'on ' + a:>{w}} {'on ' + b:>{w}}"]
    labels = {"A": f"{a}'s map", "B": f"{b}'s map",
              "merged": f"merged map ({r.merge_weighting})", "positional": "positional"}
    for key in ("A", "B", "merged", "positional"):
        s = r.cold_shares[key]
        lines.append(f"  {labels[key]:<{lw}} {pct(s[a]):>{w}} {pct(s[b]):>{w}}")
    own_a, own_b = r.cold_shares["A"][a], r.cold_shares["B"][b]
    merged_a, merged_b = r.cold_shares["merged"][a], r.cold_shares["merged"][b]
    lines.append("")
    lines.append(f"  merged map costs {a} {pct(merged_a - own_a)} and {b} "
                 f"{pct(merged_b - own_b)} more cold selections than their own maps; "
                 f"a borrowed map costs {pct(r.cold_shares['B'][a] - own_a)} / "
                 f"{pct(r.cold_shares['A'][b] - own_b)}.")
    return lines


def _mean_cold(r: DiffReport) -> float:
    """Mean cold-bank size of map B (what 'changed' is out of)."""
    return r.num_experts - sum(l.hot_b for l in r.layers) / max(len(r.layers), 1)


def diff_lines(r: DiffReport, *, per_layer: bool = True) -> list[str]:
    lines = [f"diff {r.name_a} -> {r.name_b}",
             f"  content_hash {r.content_hash_a[:16]}… -> {r.content_hash_b[:16]}… "
             f"({'equal' if r.same_content else 'differs'})",
             f"  shape_hash   {r.shape_hash_a[:16]}… -> {r.shape_hash_b[:16]}… "
             f"({'equal' if r.same_shape else 'differs'})",
             f"  {r.verdict()}",
             f"  layers changed: {r.changed_layers} of {len(r.layers)}; cold ids per layer, mean: "
             f"{r.mean_cold_changed:.1f} newly cold and {r.mean_left_cold:.1f} no longer cold, of "
             f"{_mean_cold(r):.0f} cold in {r.name_b}"]
    if per_layer:
        lines.append(f"  {'layer':>5} {'hot A':>6} {'hot B':>6} {'new cold':>9} {'left cold':>10}"
                     f" {'reordered':>9}")
        for l in r.layers:
            lines.append(f"  {l.layer:>5} {l.hot_a:>6} {l.hot_b:>6} {l.cold_changed:>9} "
                         f"{l.left_cold:>10} {'yes' if l.reordered else '':>9}")
    return lines


def show_lines(rowmap: RowMap, name: str, bytes_per_expert: int | None,
               bytes_source: str) -> list[str]:
    hot, cold = rowmap.hot_counts(), rowmap.cold_counts()
    lines = [f"row map {name}",
             f"  geometry: {len(rowmap.moe_layer_indices)} MoE layers "
             f"({format_index_ranges(rowmap.moe_layer_indices)}) × {rowmap.num_experts} experts",
             f"  hot per layer:  {summarize_counts(hot)}  (total {sum(hot):,})",
             f"  cold per layer: {summarize_counts(cold)}  (total {sum(cold):,})",
             f"  bank shapes (hot/cold experts per layer; what shape_hash hashes): "
             f"{len(rowmap.distinct_shapes())} ({', '.join(f'{h}/{c}' for h, c in rowmap.distinct_shapes())})",
             f"  content_hash {rowmap.content_hash()}",
             f"  shape_hash   {rowmap.shape_hash()}"]
    if bytes_per_expert:
        lines.append(f"  bytes per expert: {bytes_per_expert:,} ({bytes_source})")
        lines.append(f"  hot bank (HBM):   {_gib(sum(hot) * bytes_per_expert)}")
        lines.append(f"  cold bank (host): {_gib(sum(cold) * bytes_per_expert)}")
    else:
        lines.append("  bytes: give --recipe or --bytes-per-expert")
    if rowmap.provenance:
        lines.append("  provenance:")
        for key in sorted(rowmap.provenance):
            lines.append(f"    {key}: {rowmap.provenance[key]}")
    if rowmap.provenance.get("synthetic"):
        lines.append("  NOTE: built from SYNTHETIC histograms, not measured traffic")
    return lines


def budget_lines(b: BudgetBuild, in_sample: HistogramEval | None,
                 uniform_sample: HistogramEval | None,
                 same_total_sample: HistogramEval | None = None) -> list[str]:
    layers = len(b.rowmap.moe_layer_indices)
    lines = [f"cold budget {_gib(b.budget_bytes)} at {b.bytes_per_expert:,} B per expert",
             f"  budget-global: {b.cold_experts:,} cold experts ({_gib(b.cold_bytes)}), "
             f"per-layer hot {min(b.rowmap.hot_counts())}..{max(b.rowmap.hot_counts())}",
             f"  uniform:       {b.uniform_cold_per_layer} cold per layer × {layers} = "
             f"{b.uniform_cold_per_layer * layers:,} ({_gib(b.uniform_cold_bytes)})",
             f"  distinct bank sizes (one kernel tuning each, ~{TUNING_MINUTES_PER_SHAPE} min): "
             f"budget-global {b.tunings} (~{b.tunings * TUNING_MINUTES_PER_SHAPE} min), "
             f"uniform {b.uniform_tunings} (~{b.uniform_tunings * TUNING_MINUTES_PER_SHAPE} min)",
             f"  distinct layer shapes (hot/cold): budget-global {len(b.rowmap.distinct_shapes())}"
             f", uniform {len(b.uniform.distinct_shapes())}"]
    if in_sample and uniform_sample:
        lines.append(f"  cold share on the input: budget-global {pct(in_sample.cold_share)}, "
                     f"uniform {pct(uniform_sample.cold_share)}")
    if same_total_sample and uniform_sample:
        n = b.uniform_cold_per_layer * layers
        lines.append(f"  like for like ({n:,} cold experts each): budget-global "
                     f"{pct(same_total_sample.cold_share)} vs uniform "
                     f"{pct(uniform_sample.cold_share)}")
    return lines
