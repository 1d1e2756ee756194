"""Building row maps from histograms (pure; no I/O).

Rules (docs/formats.md "Building a row map"):

* Top-N per layer: rank experts by count, descending; equal counts rank the lower expert id
  first. The first N are hot.
* Budget-global: the cold bank holds the largest whole number of experts whose bytes fit the
  budget, chosen across all layers as the least-used (layer, expert) pairs: ascending count,
  then descending expert id, then descending layer position (exactly the reverse of the hot
  preference), so per-layer hot counts vary.
* Row order inside each bank: ascending expert id. Small changes in counts then do not
  reshuffle rows, and the map diffs cleanly.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from expert_residency.formats import Histogram, RowMap

from recipegen import __version__
from recipegen.common.errors import InputError

# Seeds 000 ("two FlashInfer autotune runs, ~75 minutes each on first boot"): every distinct
# bank size is another kernel tuning.
TUNING_MINUTES_PER_SHAPE = 75


def hot_preference_order(counts_row: np.ndarray) -> np.ndarray:
    """Expert ids, most preferred for the hot bank first (count desc, id asc)."""
    counts_row = np.asarray(counts_row)
    return np.lexsort((np.arange(len(counts_row)), -counts_row))


def _split_layer(counts_row: np.ndarray, n_hot: int) -> tuple[list[int], list[int]]:
    order = hot_preference_order(counts_row)
    return sorted(order[:n_hot].tolist()), sorted(order[n_hot:].tolist())


def build_date() -> str:
    """UTC build time; SOURCE_DATE_EPOCH (the reproducible-builds convention) pins it."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = (_dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc) if epoch and epoch.isdigit()
            else _dt.datetime.now(_dt.timezone.utc))
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def provenance_for(histograms: Sequence[Histogram], names: Sequence[str], builder: str,
                   **extra: Any) -> dict[str, Any]:
    revisions = sorted({h.model_revision for h in histograms if h.model_revision})
    prov: dict[str, Any] = {
        "builder": builder,
        "histograms": list(names),
        "selections": int(sum(h.selections for h in histograms)),
        "tokens": int(sum(h.tokens for h in histograms)),
        "date": build_date(),
        "tool": f"recipegen {__version__}",
        "model_revision": revisions[0] if len(revisions) == 1 else (revisions or ""),
    }
    if any(h.meta.get("synthetic") for h in histograms):
        prov["synthetic"] = True
    prov.update(extra)
    return prov


def build_top_n(histogram: Histogram, hot: int | Sequence[int],
                provenance: dict[str, Any] | None = None) -> RowMap:
    """Per layer, the `hot` most-selected experts go to the hot bank (one count or per layer)."""
    n_layers, e = histogram.counts.shape
    per_layer = [int(hot)] * n_layers if isinstance(hot, (int, np.integer)) else [int(h) for h in hot]
    if len(per_layer) != n_layers:
        raise InputError(f"{len(per_layer)} hot counts for {n_layers} MoE layers", field="hot")
    for n in per_layer:
        if not 0 <= n <= e:
            raise InputError(f"hot count {n} outside 0..{e}", field="hot")
    hot_ids, cold_ids = [], []
    for row, n in zip(histogram.counts, per_layer):
        h, c = _split_layer(row, n)
        hot_ids.append(h)
        cold_ids.append(c)
    return RowMap(histogram.moe_layer_indices, e, hot_ids, cold_ids, dict(provenance or {}))


@dataclass(frozen=True)
class BudgetBuild:
    """A budget-global map and what it costs in kernel shapes against the uniform default."""

    rowmap: RowMap
    uniform: RowMap
    global_same_total: RowMap  # budget-global with the uniform map's total cold count
    budget_bytes: int
    bytes_per_expert: int
    cold_experts: int          # largest whole count whose bytes fit the budget
    uniform_cold_per_layer: int

    @property
    def cold_bytes(self) -> int:
        return self.cold_experts * self.bytes_per_expert

    @property
    def uniform_cold_bytes(self) -> int:
        return self.uniform_cold_per_layer * len(self.uniform.moe_layer_indices) * \
            self.bytes_per_expert

    @staticmethod
    def bank_sizes(rowmap: RowMap) -> list[int]:
        """Distinct bank sizes over both banks of all layers: one kernel tuning each."""
        return sorted({n for n in rowmap.hot_counts() + rowmap.cold_counts() if n > 0})

    @property
    def tunings(self) -> int:
        return len(self.bank_sizes(self.rowmap))

    @property
    def uniform_tunings(self) -> int:
        return len(self.bank_sizes(self.uniform))


def build_global(histogram: Histogram, cold_total: int,
                 provenance: dict[str, Any] | None = None) -> RowMap:
    """`cold_total` least-used (layer, expert) pairs across all layers go cold.

    Global rank, coldest first: ascending count, then descending expert id, then descending
    layer position — the exact reverse of the per-layer hot preference.
    """
    n_layers, e = histogram.counts.shape
    cold_total = max(0, min(int(cold_total), n_layers * e))
    layer_pos = np.repeat(np.arange(n_layers), e)
    expert = np.tile(np.arange(e), n_layers)
    order = np.lexsort((-layer_pos, -expert, histogram.counts.ravel()))
    cold_mask = np.zeros(n_layers * e, dtype=bool)
    cold_mask[order[:cold_total]] = True
    cold_mask = cold_mask.reshape(n_layers, e)
    return RowMap(histogram.moe_layer_indices, e,
                  [np.flatnonzero(~m).tolist() for m in cold_mask],
                  [np.flatnonzero(m).tolist() for m in cold_mask], dict(provenance or {}))


def build_budget_global(histogram: Histogram, cold_budget_bytes: int, bytes_per_expert: int,
                        provenance: dict[str, Any] | None = None) -> BudgetBuild:
    """Variable hot count per layer under one cold-bank byte budget, plus the uniform map
    that the same budget gives (its per-layer count = the budget's whole count ÷ layers) and
    a global map holding exactly the uniform map's total, for a like-for-like comparison."""
    if bytes_per_expert <= 0:
        raise InputError("bytes per expert must be positive", field="bytes_per_expert")
    if cold_budget_bytes < 0:
        raise InputError("the cold budget must not be negative", field="cold_budget")
    n_layers, e = histogram.counts.shape
    cold_total = min(cold_budget_bytes // bytes_per_expert, n_layers * e)
    prov = dict(provenance or {})
    rowmap = build_global(histogram, cold_total, prov)
    per_layer = int(cold_total // n_layers)
    uniform = build_top_n(histogram, e - per_layer, dict(prov, builder="top-n"))
    same_total = build_global(histogram, per_layer * n_layers, prov)
    return BudgetBuild(rowmap, uniform, same_total, int(cold_budget_bytes), int(bytes_per_expert),
                       int(cold_total), per_layer)


def hot_count_for_cold_budget(cold_budget_bytes: int, bytes_per_expert: int, num_layers: int,
                              num_experts: int) -> int:
    """Uniform hot count per layer for a cold-bank budget: the largest whole per-layer cold
    count whose bytes fit (docs/design.md: 62.33 GiB → 88 cold, 62.34 GiB → 89)."""
    cold = min(cold_budget_bytes // (bytes_per_expert * num_layers), num_experts)
    return num_experts - int(cold)
