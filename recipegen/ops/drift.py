"""Drift: how much live traffic lands on the cold bank, against what the map was built for.

Pure arithmetic on histograms and row maps (the caller loads them). The cold share is the
fraction of routed selections whose expert sits in the cold bank: the field reports' measure (1.55%
under the v15 map on matching traffic, ~23% under positional offload, 2.7% → 20.5% when an
agent-built map serves prose).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from expert_residency.formats import Histogram, RowMap

from recipegen.common.errors import RecipegenError

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
    live_map: dict | None = None       # an adaptive lane's live map (`ops.livemap`), else None

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


def live_cold_share(histogram: Histogram, rowmap: RowMap, *, what: str = "live histogram") -> float:
    """`recipegen.rowmap`'s cold share (the one formula), refusing an empty histogram: a share of
    nothing would read as a perfect fit."""
    from recipegen.rowmap import check_same_geometry, cold_share

    check_same_geometry(rowmap, histogram, hist_name=what)
    if int(histogram.counts.sum()) == 0:
        raise RecipegenError(f"{what} has no selections yet (no traffic since the lane started?)")
    return cold_share(rowmap, histogram)


def judge(live: Histogram, active_class: str, maps: Mapping[str, RowMap], *,
          built_share: float | None, built_source: str,
          tolerance: float = DEFAULT_TOLERANCE) -> DriftVerdict:
    by_class = {name: live_cold_share(live, m) for name, m in maps.items()}
    best = min(by_class, key=lambda name: (by_class[name], name != active_class, name))
    return DriftVerdict(active_class=active_class, live_share=by_class[active_class],
                        built_share=built_share, built_source=built_source, by_class=by_class,
                        best_class=best, tolerance=tolerance)
