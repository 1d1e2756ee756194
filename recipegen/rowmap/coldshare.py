"""Cold share: the fraction of routed selections that land on a row map's cold bank.

This is the projection `check budgets` reports for a traffic class that names its histogram,
and the figure `rowmap eval/compare` print. Pure functions; callers load the files.
"""

from __future__ import annotations

import numpy as np
from expert_residency.formats import Histogram, RowMap

from recipegen.common.errors import InputError


def check_same_geometry(rowmap: RowMap, histogram: Histogram, *, map_name: str = "row map",
                        hist_name: str = "histogram") -> None:
    """Refuse a histogram whose layers or expert count differ from the map's."""
    if rowmap.num_experts != histogram.num_experts:
        raise InputError(f"{hist_name} has {histogram.num_experts} experts per layer, "
                         f"{map_name} has {rowmap.num_experts}", file=hist_name,
                         field="num_experts")
    if rowmap.moe_layer_indices != histogram.moe_layer_indices:
        raise InputError(f"{hist_name} covers MoE layers {_short(histogram.moe_layer_indices)}, "
                         f"{map_name} covers {_short(rowmap.moe_layer_indices)}",
                         file=hist_name, field="moe_layers")


def _short(layers: tuple[int, ...]) -> str:
    return f"{layers[0]}..{layers[-1]} ({len(layers)} layers)" if layers else "none"


def cold_selections_per_layer(rowmap: RowMap, histogram: Histogram) -> np.ndarray:
    """Selections per layer that land on the cold bank."""
    check_same_geometry(rowmap, histogram)
    return (histogram.counts * rowmap.cold_mask()).sum(axis=1)


def cold_share_per_layer(rowmap: RowMap, histogram: Histogram) -> np.ndarray:
    """Per MoE layer: cold selections / all selections of that layer (0 for an empty layer)."""
    cold = cold_selections_per_layer(rowmap, histogram).astype(np.float64)
    totals = histogram.counts.sum(axis=1).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(totals > 0, cold / totals, 0.0)


def cold_share(rowmap: RowMap, histogram: Histogram) -> float:
    """Cold selections / all selections, over every MoE layer (0.0 for an empty histogram)."""
    total = int(histogram.counts.sum())
    if total == 0:
        return 0.0
    return float(cold_selections_per_layer(rowmap, histogram).sum()) / total


def positional_baseline(rowmap: RowMap) -> RowMap:
    """The usage-blind map with the same per-layer hot counts: experts 0..h-1 hot."""
    hot = [list(range(n)) for n in rowmap.hot_counts()]
    cold = [list(range(n, rowmap.num_experts)) for n in rowmap.hot_counts()]
    return RowMap(rowmap.moe_layer_indices, rowmap.num_experts, hot, cold,
                  {"builder": "positional baseline"})


def layer_positional_cold_share(histogram: Histogram, cold_experts: int) -> float:
    """Cold share under vLLM's own `--cpu-offload-gb`: it walks parameters in load order and
    moves whole layers' expert tensors, so the first MoE layers go cold entirely.

    `cold_experts` experts' worth are offloaded from the first MoE layer on; a partially
    offloaded layer contributes its offloaded fraction of that layer's selections (its
    tensors hold all experts, so a partial move is usage-blind).
    """
    counts = histogram.counts.sum(axis=1).astype(np.float64)
    total = counts.sum()
    if total == 0:
        return 0.0
    e = histogram.num_experts
    full, partial = divmod(max(0, min(cold_experts, e * len(counts))), e)
    cold = counts[:full].sum() + (counts[full] * partial / e if partial else 0.0)
    return float(cold / total)
