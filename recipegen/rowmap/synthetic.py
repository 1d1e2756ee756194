"""Seeded synthetic routing histograms for the reference recipe's traffic classes.

We have no real DeepSeek-V4.1 histograms, so the example data is generated — and says so in
every file it produces (`meta.synthetic: true`, a `synthetic:` source).

Model of one class and one layer:
* Rank profile: the expert at popularity rank r (0 = most used) is picked with probability
  p(r) ∝ exp(−a·(r/E)^b), a = 4.94, b = 1.01. A power law cannot match the field reports' skew table
  (top 25/50/73% of experts → 71.4/91.8/98.7% of selections, mean Gini 0.632); this
  exponential-tailed profile gives about 71/92/98% and Gini ≈ 0.61, and ≈ 1.5% cold at 295/89.
* Each class ranks experts by its own per-layer permutation. Permutations come from Gaussian
  scores s = w·z_shared + √(1−w²)·z_class, so any two classes' ranks have Spearman ρ ≈ the
  requested correlation (field reports: agent vs prose 0.15). w² = 2·sin(π·ρ/6) (Gaussian
  rank-correlation identity).
* Counts: tokens × top_k selections per layer drawn multinomially from the permuted profile.

Everything derives from (seed, class name) through sha256, so the same command reproduces the
same files on any machine and numpy version that keeps `PCG64` stable.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np
from expert_residency.formats import Histogram

PROFILE_SCALE = 4.94
PROFILE_POWER = 1.01
DEFAULT_CORRELATION = 0.15


def rank_profile(num_experts: int, scale: float = PROFILE_SCALE,
                 power: float = PROFILE_POWER) -> np.ndarray:
    """p[r]: probability of the expert at popularity rank r, summing to 1."""
    r = np.arange(num_experts, dtype=np.float64) / num_experts
    w = np.exp(-scale * r ** power)
    return w / w.sum()


def _rng(seed: int, *labels: str) -> np.random.Generator:
    digest = hashlib.sha256("/".join([str(seed), *labels]).encode()).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))


def shared_weight(correlation: float) -> float:
    """Weight w of the shared score giving rank correlation `correlation` between classes."""
    if not 0.0 <= correlation < 1.0:
        raise ValueError("correlation must be in [0, 1)")
    return math.sqrt(2.0 * math.sin(math.pi * correlation / 6.0))


def class_ranking(seed: int, class_name: str, num_layers: int, num_experts: int,
                  correlation: float = DEFAULT_CORRELATION) -> np.ndarray:
    """`[layers, experts]`: entry [l, r] is the expert id at popularity rank r in layer l."""
    w = shared_weight(correlation)
    shared = _rng(seed, "shared").standard_normal((num_layers, num_experts))
    own = _rng(seed, "class", class_name).standard_normal((num_layers, num_experts))
    score = w * shared + math.sqrt(1.0 - w * w) * own
    return np.argsort(-score, axis=1, kind="stable")


def synthetic_histogram(seed: int, class_name: str, *, moe_layer_indices: Sequence[int],
                        num_experts: int, top_k: int, tokens: int,
                        correlation: float = DEFAULT_CORRELATION,
                        model_revision: str = "") -> Histogram:
    layers = tuple(moe_layer_indices)
    from expert_residency.formats.histogram import MAX_TOTAL

    # bounded before numpy sees them (`rowmap synth` words these for its options)
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k {top_k} is not between 1 and num_experts ({num_experts})")
    if not layers or not 0 < tokens <= MAX_TOTAL // (top_k * len(layers)):
        raise ValueError(f"{tokens} tokens x top_k {top_k} x {len(layers)} layers is no "
                         "histogram (its count total is at most 2^63 - 1)")
    ranking = class_ranking(seed, class_name, len(layers), num_experts, correlation)
    profile = rank_profile(num_experts)
    rng = _rng(seed, "counts", class_name)
    counts = np.zeros((len(layers), num_experts), dtype=np.int64)
    for row in range(len(layers)):
        by_rank = rng.multinomial(tokens * top_k, profile)
        counts[row, ranking[row]] = by_rank
    return Histogram(
        layers, num_experts, counts, tokens, top_k=top_k, model_revision=model_revision,
        source=(f"synthetic: recipegen rowmap synth, class {class_name}, seed {seed}, "
                f"p(r) ∝ exp(-{PROFILE_SCALE}·(r/{num_experts})^{PROFILE_POWER}), "
                f"class rank correlation {correlation}"),
        meta={"synthetic": True, "class": class_name, "seed": seed,
              "correlation": correlation,
              "profile": f"exp(-{PROFILE_SCALE}*(r/E)^{PROFILE_POWER})"})
