"""Drift: how much live traffic lands on the cold bank, against what the map was built for.

Pure arithmetic on histograms and row maps (the caller loads them). The cold share is the
fraction of routed selections whose expert sits in the cold bank: the seeds' measure (1.55%
under the v15 map on matching traffic, ~23% under positional offload, 2.7% → 20.5% when an
agent-built map serves prose).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from expert_residency.formats import Histogram, RowMap

DEFAULT_TOLERANCE = 0.02   # absolute increase of the cold share before we call it drift


@dataclass(frozen=True)
class DriftVerdict:
    active_class: str
    live_share: float
    built_share: float | None
    built_source: str
    by_class: dict[str, float]         # live share under each class's map
    best_class: str
    tolerance: float

    @property
    def drifted(self) -> bool:
        if self.built_share is None:
            return self.best_class != self.active_class
        return self.live_share - self.built_share > self.tolerance

    @property
    def better_class(self) -> str | None:
        """A class whose map keeps clearly more of the live traffic hot, if any."""
        if self.best_class == self.active_class:
            return None
        gain = self.by_class[self.active_class] - self.by_class[self.best_class]
        return self.best_class if gain > self.tolerance / 2 else None


def cold_share(histogram: Histogram, rowmap: RowMap, *, what: str = "histogram") -> float:
    """Share of the histogram's selections that fall on the map's cold experts."""
    if histogram.num_experts != rowmap.num_experts or \
            tuple(histogram.moe_layer_indices) != tuple(rowmap.moe_layer_indices):
        raise ValueError(
            f"{what} geometry (layers {_span(histogram.moe_layer_indices)}, "
            f"{histogram.num_experts} experts) differs from the row map's "
            f"(layers {_span(rowmap.moe_layer_indices)}, {rowmap.num_experts} experts)")
    total = int(histogram.counts.sum())
    if total == 0:
        raise ValueError(f"{what} has no selections yet (no traffic since the lane started?)")
    cold = int(np.asarray(histogram.counts)[rowmap.cold_mask()].sum())
    return cold / total


def _span(indices: tuple[int, ...]) -> str:
    return f"{indices[0]}..{indices[-1]}" if indices else "none"


def judge(live: Histogram, active_class: str, maps: Mapping[str, RowMap], *,
          built_share: float | None, built_source: str,
          tolerance: float = DEFAULT_TOLERANCE) -> DriftVerdict:
    by_class = {name: cold_share(live, m, what="live histogram") for name, m in maps.items()}
    best = min(by_class, key=lambda name: (by_class[name], name != active_class, name))
    return DriftVerdict(active_class=active_class, live_share=by_class[active_class],
                        built_share=built_share, built_source=built_source, by_class=by_class,
                        best_class=best, tolerance=tolerance)
