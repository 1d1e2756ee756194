"""Row-map tooling: build, evaluate, compare, diff, show, synthesize (per traffic class).

Pure logic lives in `build`, `coldshare`, `evaluate`, `compare`, `diff`, `skew`, `synthetic`;
file and capture reading in `inputs`; text rendering in `text`. The file formats themselves
belong to `expert_residency.formats` (the runtime reads them without recipegen).

For the ledger / cost model: `cold_share(rowmap, histogram) -> float` and
`cold_share_per_layer(rowmap, histogram) -> np.ndarray`, or `projected_cold_share(map_path,
hist_path)` straight from files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from recipegen.rowmap.build import build_budget_global, build_top_n, hot_count_for_cold_budget
from recipegen.rowmap.coldshare import check_same_geometry, cold_share, cold_share_per_layer, positional_baseline


@dataclass(frozen=True)
class ProjectedColdShare:
    """A class's row map measured on its histogram (what `check budgets` reports)."""

    overall: float
    per_layer: list[float]
    worst_layer: int          # MoE layer index with the highest cold share
    positional: float         # same per-layer counts, usage-blind
    synthetic: bool           # histogram is synthetic example data, not measured


def projected_cold_share(rowmap_path: str | os.PathLike[str],
                         histogram_path: str | os.PathLike[str]) -> ProjectedColdShare:
    """Load both files (InputError naming file/line/field on bad input) and project."""
    from expert_residency.formats import FormatError, load_histogram, load_rowmap

    from recipegen.rowmap.inputs import input_error
    try:
        rowmap = load_rowmap(rowmap_path)
        histogram = load_histogram(histogram_path)
    except FormatError as exc:
        raise input_error(exc) from None
    check_same_geometry(rowmap, histogram, map_name=str(rowmap_path),
                        hist_name=str(histogram_path))
    per_layer = [float(x) for x in cold_share_per_layer(rowmap, histogram)]
    worst = max(range(len(per_layer)), key=per_layer.__getitem__)
    return ProjectedColdShare(cold_share(rowmap, histogram), per_layer,
                              rowmap.moe_layer_indices[worst],
                              cold_share(positional_baseline(rowmap), histogram),
                              bool(histogram.meta.get("synthetic")))


__all__ = ["ProjectedColdShare", "build_budget_global", "build_top_n", "check_same_geometry", "cold_share",
           "cold_share_per_layer", "hot_count_for_cold_budget", "positional_baseline",
           "projected_cold_share"]
