"""What `fit` maximises among the placements where every budget holds, and the speed `compare`
tabulates: the one place a speed figure enters the search.

The figure is the decode estimate of `recipegen.costmodel.lane_estimate.estimate_lane`
(docs/costmodel.md, 'Decode speed'): output tokens per second at the lane's fewest expected
streams (the speed one user sees), with the band its validation justifies. For a usage-aware
candidate it is asked at the candidate's hot count (the class histogram's least-used experts cold,
as the fitted map has them, on the histogram the written class will have: the seeded synthetic
default where the fit makes one), for a positional one at the ledger's walk, and for every expert
in HBM as such.

Where the estimate cannot be computed for a model, the cost model's projected link time per
decode step stands in (cold expert bytes over the host link, docs/costmodel.md section 1),
labelled so: it ranks placements by what they read over the link, not by a step time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipegen.common.errors import RecipegenError
from recipegen.common.units import format_count
from recipegen.costmodel.fetch import fetch_tax
from recipegen.costmodel.lane import unique_model_for
from recipegen.costmodel.parallel import gpu_reads
from recipegen.ledger.result import LaneLedger, RecipeLedger
from recipegen.load.recipe import LoadedRecipe
from recipegen.schema import Lane, Machine, Model, Recipe, TrafficClass

ESTIMATE = "estimate"          # Projection.kind: tokens/s of the decode estimate
LINK_READS = "link reads"      # Projection.kind: the stand-in (negated ms of link reads per step)


@dataclass(frozen=True)
class Projection:
    """A candidate's speed figure: `score` orders candidates (higher is faster)."""

    score: float
    text: str          # for people: the figure with its unit
    basis: str         # what it was computed from
    kind: str = ESTIMATE
    tokens_per_s: float | None = None
    band: tuple[float, float] | None = None
    tensor_parallel_caveat: str = ""   # what a TP > 1 figure leaves out ("" on one GPU)

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "score": self.score, "text": self.text, "basis": self.basis,
                "tokens_per_s": self.tokens_per_s, "tokens_per_s_band": list(self.band) if self.band else None,
                "tensor_parallel_caveat": self.tensor_parallel_caveat or None}


@dataclass(frozen=True)
class Context:
    """What the estimate needs beyond the candidate: the recipe (model and lane classes), where it
    lives (its histograms are read relative to it), and the lane's classes and active class as a
    usage-aware fit writes them (`recipegen.fit.rowmaps.usage_aware_classes`), so that a candidate
    is estimated on the histogram the written recipe's class will have. A positional or all-in-HBM
    fit leaves the classes' histograms as they are: those candidates are estimated on the lane's own."""

    recipe: Recipe | None
    path: Path | None
    usage_aware_classes: Mapping[str, TrafficClass] | None = None
    active_class: str | None = None


def speed(ctx: Context, model: Model, machine: Machine, lane: Lane, ledger: LaneLedger, placement: str,
          hot: int | None, cold_share_per_layer: Sequence[float], share_basis: str) -> Projection:
    """The candidate's speed: the decode estimate, else the link-read stand-in."""
    if ctx.recipe is not None and ctx.path is not None:
        try:
            return _estimate(ctx, machine, lane, ledger, placement, hot)
        except (RecipegenError, ValueError, KeyError, ZeroDivisionError) as exc:
            fallback = link_reads(model, machine, lane, cold_share_per_layer, share_basis)
            return Projection(fallback.score, fallback.text, f"{fallback.basis}; the decode estimate is not available "
                              f"for this lane ({type(exc).__name__}: {str(exc)[:120]})", LINK_READS)
    return link_reads(model, machine, lane, cold_share_per_layer, share_basis)


def _estimate(ctx: Context, machine: Machine, lane: Lane, ledger: LaneLedger, placement: str,
              hot: int | None) -> Projection:
    from recipegen.costmodel.lane_estimate import estimate_lane, tp_caveat, validation_band_text

    assert ctx.recipe is not None and ctx.path is not None
    if placement == "usage-aware" and ctx.usage_aware_classes is not None:
        lane = lane.model_copy(update={"classes": dict(ctx.usage_aware_classes), "active_class": ctx.active_class})
    recipe = ctx.recipe.model_copy(update={"lanes": [lane], "machines": {**ctx.recipe.machines, lane.machine: machine}})
    loaded: Any = LoadedRecipe(recipe=recipe, path=ctx.path)
    streams = lane.concurrency.min
    if placement == "all in HBM":
        est = estimate_lane(loaded, lane.name, placement="all-in-hbm", streams=[streams])
    elif placement == "usage-aware":
        est = estimate_lane(loaded, lane.name, placement="usage-aware", hot_per_layer=hot, streams=[streams])
    else:
        est = estimate_lane(loaded, lane.name, placement="positional", streams=[streams],
                            ledger=RecipeLedger(recipe.name, str(ctx.path), [ledger], []))
    point = est.point(streams)
    lo, hi = point.tokens_per_s_band
    terms = point.terms
    cold = f", cold experts {terms.cold_experts * 1e3:.2f} ms" if terms.cold_experts else ""
    tp = est.tensor_parallel_size
    return Projection(point.tokens_per_s, f"{point.tokens_per_s:,.1f} tok/s at {format_count(streams, 'stream')} "
                      f"({validation_band_text(lo, hi, tp)})",
                      f"decode estimate (docs/costmodel.md 'Decode speed'): step {terms.total * 1e3:.2f} ms{cold}, "
                      f"{est.context:,} tokens of KV per sequence", ESTIMATE, point.tokens_per_s, (lo, hi),
                      tp_caveat(tp))


def link_reads(model: Model, machine: Machine, lane: Lane, cold_share_per_layer: Sequence[float],
               share_basis: str) -> Projection:
    """The projected link time per decode step at the lane's fewest expected streams (k from its
    speculative schedule), negated as the score."""
    streams = lane.concurrency.min
    k = 0 if lane.speculative is None else lane.speculative.k_at(streams)
    if not any(cold_share_per_layer):
        return Projection(0.0, "no link reads (every routed expert in HBM)", "nothing offloaded", LINK_READS)
    reads = gpu_reads(model, lane)
    unique = unique_model_for(model).unique(k, streams)
    tax = fetch_tax(moe_layers=model.num_moe_layers, unique_per_layer=unique,
                    cold_share=list(cold_share_per_layer), bytes_per_expert=reads.bytes_per_expert,
                    link_bandwidth=machine.pinned_read_bandwidth)
    ms = tax.fetch_ms if reads.mode != "ep" else tax.fetch_ms / reads.gpus
    spec = f", {k} speculative tokens" if k else ""
    return Projection(-ms, f"{ms:,.2f} ms of link reads per decode step ({format_count(streams, 'stream')}{spec})",
                      f"{share_basis}; {unique:.1f} unique experts per layer per step; "
                      f"{machine.pinned_read_bandwidth / 1e9:g} GB/s link (docs/costmodel.md)", LINK_READS)
