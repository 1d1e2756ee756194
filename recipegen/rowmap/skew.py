"""Skew and similarity statistics of routing histograms (pure numpy, no I/O)."""

from __future__ import annotations

import math

import numpy as np

# The skew table of the field report "Offload by Expert on GB300: The Skew Is Real, the Kernel
# Is Not" (undated; section "The skew is real"): share of decode selections in the top
# 25 / 50 / 73 % of experts by count.
TOP_FRACTIONS: tuple[float, ...] = (0.25, 0.50, 0.73)


def gini_per_layer(counts: np.ndarray) -> np.ndarray:
    """Gini coefficient of each layer's counts (0 = uniform, → 1 = one expert takes all).

    G = Σ_i (2i − n − 1)·x_(i) / (n·Σx) with x sorted ascending, i = 1..n; 0 for an empty layer.
    """
    x = np.sort(np.asarray(counts, dtype=np.float64), axis=1)
    n = x.shape[1]
    weights = 2.0 * np.arange(1, n + 1) - n - 1
    totals = x.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        g = (x * weights).sum(axis=1) / (n * totals)
    return np.where(totals > 0, g, 0.0)


def top_count(num_experts: int, fraction: float) -> int:
    """Experts in the top `fraction`: round half up (73% of 384 = 280.3 → 280)."""
    return int(math.floor(fraction * num_experts + 0.5))


def top_share(counts: np.ndarray, fraction: float) -> float:
    """Share of all selections that fall on each layer's top `fraction` of experts."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return 0.0
    k = top_count(counts.shape[1], fraction)
    top = -np.sort(-counts, axis=1)[:, :k]
    return float(top.sum()) / total


def rank_average(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n of a 1-D array, ties sharing their average rank (as Spearman needs)."""
    values = np.asarray(values)
    order = np.argsort(values, kind="stable")
    sorted_vals = values[order]
    ranks = np.empty(len(values), dtype=np.float64)
    # boundaries of runs of equal values
    starts = np.flatnonzero(np.r_[True, sorted_vals[1:] != sorted_vals[:-1]])
    ends = np.r_[starts[1:], len(values)]
    for s, e in zip(starts, ends):
        ranks[order[s:e]] = (s + 1 + e) / 2.0
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two equal-length vectors (Pearson of average ranks);
    NaN when either is constant."""
    ra, rb = rank_average(a), rank_average(b)
    ra -= ra.mean()
    rb -= rb.mean()
    denom = math.sqrt(float((ra * ra).sum()) * float((rb * rb).sum()))
    return float((ra * rb).sum()) / denom if denom else float("nan")


def spearman_per_layer(counts_a: np.ndarray, counts_b: np.ndarray) -> np.ndarray:
    return np.array([spearman(x, y) for x, y in zip(counts_a, counts_b)])


def top_set(counts_row: np.ndarray, n: int) -> np.ndarray:
    """The `n` highest-count expert ids of one layer; ties go to the lower id (the build rule)."""
    counts_row = np.asarray(counts_row)
    order = np.lexsort((np.arange(len(counts_row)), -counts_row))
    return np.sort(order[:n])


def top_overlap_per_layer(counts_a: np.ndarray, counts_b: np.ndarray, n: int) -> np.ndarray:
    """|top-n(A) ∩ top-n(B)| / n per layer."""
    if n == 0:
        return np.ones(len(counts_a))
    return np.array([len(np.intersect1d(top_set(x, n), top_set(y, n))) / n
                     for x, y in zip(counts_a, counts_b)])
