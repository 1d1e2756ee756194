"""`rowmap compare`: two traffic classes' histograms side by side (pure).

The decision aid for "one map per class, or one merged map": rank correlation, top-set
overlap, and the cold share each class's map gives the other, beside a merged map.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from expert_residency.formats import Histogram, RowMap, merge_histograms

from recipegen.common.errors import InputError
from recipegen.rowmap.build import build_top_n
from recipegen.rowmap.coldshare import cold_share, positional_baseline
from recipegen.rowmap.skew import spearman_per_layer, top_overlap_per_layer


@dataclass(frozen=True)
class CompareReport:
    name_a: str
    name_b: str
    hot: int
    spearman_per_layer: list[float]
    hot_overlap: float         # mean |top-hot(A) ∩ top-hot(B)| / hot
    cold_overlap: float        # mean overlap of the cold sets / cold
    chance_hot_overlap: float  # what unrelated rankings would give: hot / experts
    # cold share[map][traffic]; maps: "A", "B", "merged", "positional"
    cold_shares: dict[str, dict[str, float]]
    merge_weighting: str

    @property
    def mean_spearman(self) -> float:
        finite = [x for x in self.spearman_per_layer if np.isfinite(x)]
        return float(np.mean(finite)) if finite else float("nan")

    def to_json(self) -> dict[str, Any]:
        return {"a": self.name_a, "b": self.name_b, "hot": self.hot,
                "mean_spearman": self.mean_spearman,
                "spearman_per_layer": self.spearman_per_layer,
                "hot_overlap": self.hot_overlap, "cold_overlap": self.cold_overlap,
                "chance_hot_overlap": self.chance_hot_overlap,
                "cold_shares": self.cold_shares, "merge_weighting": self.merge_weighting}


def _normalised(h: Histogram, total: int) -> Histogram:
    """Counts rescaled so the histogram holds `total` selections (equal-weight merging)."""
    scale = total / max(h.selections, 1)
    return Histogram(h.moe_layer_indices, h.num_experts,
                     np.rint(h.counts * scale).astype(np.int64), int(round(h.tokens * scale)),
                     source=h.source, model_revision=h.model_revision, top_k=h.top_k)


def _cold_overlap(map_a: RowMap, map_b: RowMap, cold_n: int) -> float:
    if cold_n == 0:
        return 1.0
    return float(np.mean([len(set(x) & set(y)) / cold_n for x, y in zip(map_a.cold, map_b.cold)]))


def compare(a: Histogram, b: Histogram, *, hot: int, name_a: str = "A", name_b: str = "B",
            equal_weights: bool = False) -> CompareReport:
    if not a.same_geometry(b):
        raise InputError(f"{name_a} and {name_b} have different geometry "
                         f"({len(a.moe_layer_indices)}×{a.num_experts} vs "
                         f"{len(b.moe_layer_indices)}×{b.num_experts})", field="moe_layers")
    e = a.num_experts
    if not 0 <= hot <= e:
        raise InputError(f"hot count {hot} outside 0..{e}", field="hot")
    map_a, map_b = build_top_n(a, hot), build_top_n(b, hot)
    if equal_weights:
        total = max(a.selections, b.selections)
        merged_hist = merge_histograms([_normalised(a, total), _normalised(b, total)])
    else:
        merged_hist = merge_histograms([a, b])
    merged = build_top_n(merged_hist, hot)
    positional = positional_baseline(map_a)
    shares = {label: {name_a: cold_share(m, a), name_b: cold_share(m, b)}
              for label, m in (("A", map_a), ("B", map_b), ("merged", merged),
                               ("positional", positional))}
    cold_n = e - hot
    return CompareReport(
        name_a, name_b, hot,
        [float(x) for x in spearman_per_layer(a.counts, b.counts)],
        float(np.mean(top_overlap_per_layer(a.counts, b.counts, hot))),
        _cold_overlap(map_a, map_b, cold_n),
        hot / e if e else 0.0, shares, "equal" if equal_weights else "by selections")
