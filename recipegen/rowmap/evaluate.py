"""`rowmap eval`: how a row map does on histograms, plus skew and leave-one-out (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from expert_residency.formats import Histogram, RowMap, merge_histograms

from recipegen.rowmap.build import build_top_n
from recipegen.rowmap.coldshare import (
    check_same_geometry,
    cold_share,
    cold_share_per_layer,
    layer_positional_cold_share,
    positional_baseline,
)
from recipegen.rowmap.skew import TOP_FRACTIONS, gini_per_layer, top_share


@dataclass(frozen=True)
class Skew:
    gini_per_layer: list[float]
    top_shares: dict[float, float]  # fraction of experts -> share of selections

    @property
    def mean_gini(self) -> float:
        return float(np.mean(self.gini_per_layer)) if self.gini_per_layer else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"mean_gini": self.mean_gini, "gini_per_layer": self.gini_per_layer,
                "top_shares": {f"{int(round(f * 100))}%": s for f, s in self.top_shares.items()}}


def skew_of(histogram: Histogram) -> Skew:
    return Skew([float(g) for g in gini_per_layer(histogram.counts)],
                {f: top_share(histogram.counts, f) for f in TOP_FRACTIONS})


@dataclass(frozen=True)
class HistogramEval:
    name: str
    selections: int
    tokens: int
    cold_share: float
    cold_share_per_layer: list[float]
    positional_cold_share: float        # same per-layer counts, cold = highest ids
    layer_positional_cold_share: float  # vLLM's offloader: whole layers in load order
    skew: Skew
    synthetic: bool

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "selections": self.selections, "tokens": self.tokens,
                "cold_share": self.cold_share, "cold_share_per_layer": self.cold_share_per_layer,
                "positional_cold_share": self.positional_cold_share,
                "layer_positional_cold_share": self.layer_positional_cold_share,
                "skew": self.skew.to_json(), "synthetic": self.synthetic}


@dataclass(frozen=True)
class LeaveOneOut:
    held_out: str
    cold_share: float  # of a map built (same per-layer hot counts) from all the others


@dataclass(frozen=True)
class EvalReport:
    map_name: str
    content_hash: str
    shape_hash: str
    hot_counts: list[int]
    histograms: list[HistogramEval]
    combined: HistogramEval | None
    leave_one_out: list[LeaveOneOut] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"map": self.map_name, "content_hash": self.content_hash,
                "shape_hash": self.shape_hash, "hot_counts": self.hot_counts,
                "histograms": [h.to_json() for h in self.histograms],
                "combined": self.combined.to_json() if self.combined else None,
                "leave_one_out": [{"held_out": l.held_out, "cold_share": l.cold_share}
                                  for l in self.leave_one_out],
                "notes": self.notes}


def evaluate_on(rowmap: RowMap, histogram: Histogram, name: str) -> HistogramEval:
    check_same_geometry(rowmap, histogram, hist_name=name)
    return HistogramEval(
        name=name, selections=histogram.selections, tokens=histogram.tokens,
        cold_share=cold_share(rowmap, histogram),
        cold_share_per_layer=[float(x) for x in cold_share_per_layer(rowmap, histogram)],
        positional_cold_share=cold_share(positional_baseline(rowmap), histogram),
        layer_positional_cold_share=layer_positional_cold_share(
            histogram, sum(rowmap.cold_counts())),
        skew=skew_of(histogram), synthetic=bool(histogram.meta.get("synthetic")))


def leave_one_out(rowmap: RowMap, histograms: Sequence[Histogram],
                  names: Sequence[str]) -> list[LeaveOneOut]:
    """For each profile: build a map with this map's per-layer hot counts from all the other
    profiles pooled, and measure it on the held-out one (the field reports' 1.6–1.7% check)."""
    if len(histograms) < 2:
        return []
    out = []
    for i, held in enumerate(histograms):
        rest = merge_histograms([h for j, h in enumerate(histograms) if j != i])
        trial = build_top_n(rest, rowmap.hot_counts())
        out.append(LeaveOneOut(names[i], cold_share(trial, held)))
    return out


def consistency_notes(rowmap: RowMap, histograms: Sequence[Histogram],
                      names: Sequence[str]) -> list[str]:
    """Things worth a second look that are not errors: another checkpoint revision, counts
    that do not add up to tokens × top_k."""
    notes = []
    map_rev = rowmap.provenance.get("model_revision")
    for h, name in zip(histograms, names):
        if isinstance(map_rev, str) and map_rev and h.model_revision and \
                h.model_revision != map_rev:
            notes.append(f"{name}: model revision {h.model_revision!r}, the map was built on "
                         f"{map_rev!r}")
        if h.top_k and h.tokens:
            sums = h.counts.sum(axis=1)
            expected = h.tokens * h.top_k
            if (sums != expected).any():
                notes.append(f"{name}: per-layer selections {int(sums.min()):,}..{int(sums.max()):,}"
                             f" differ from tokens × top_k = {expected:,} (partial counts?)")
    return notes


def evaluate(rowmap: RowMap, histograms: Sequence[Histogram], names: Sequence[str],
             map_name: str) -> EvalReport:
    evals = [evaluate_on(rowmap, h, n) for h, n in zip(histograms, names)]
    combined = None
    if len(histograms) > 1:
        combined = evaluate_on(rowmap, merge_histograms(histograms), "all (pooled)")
    return EvalReport(map_name, rowmap.content_hash(), rowmap.shape_hash(),
                      rowmap.hot_counts(), evals, combined,
                      leave_one_out(rowmap, histograms, names),
                      consistency_notes(rowmap, histograms, names))
