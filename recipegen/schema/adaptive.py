"""`offload.adaptive`: the row map follows the traffic inside a running engine (docs/adaptive.md).

The field names, defaults and ranges are the runtime's own `AdaptiveConfig`
(`expert_residency.core.adaptive_config`, torch-free): the recipe is validated against the same
class the worker parses from `EXPERT_RESIDENCY_ADAPTIVE`, so a recipe that validates boots.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from expert_residency.core.adaptive_config import AdaptiveConfig
from expert_residency.formats._io import MAX_EXPERTS
from pydantic import Field, NonNegativeInt, PositiveInt

from recipegen.schema.base import StrictModel

_D = AdaptiveConfig()  # the runtime's defaults: one source


class Adaptive(StrictModel):
    """Adaptive residency: every `interval` forwards the policy ranks the experts the traffic now
    uses; the promoted ones are copied host → HBM into spare rows on a side stream while decode
    steps run (at most `copy_rows_per_layer` rows per layer and step), and the next barrier only
    flips map entries (bank shapes and CUDA graphs stay valid). Absent: off, the boot map stays
    (the default). `adaptive: {}` turns it on with every default. Usage-aware lanes only.
    """

    interval: PositiveInt = _D.interval
    """Forwards between barriers. Each barrier costs a fixed ranking (a few hundred microseconds,
    whatever the number of layers) plus the swaps it accepts; a longer interval spreads the fixed
    part over more steps and gives each decision more picks, a shorter one follows a traffic shift
    sooner (about 80-90 decode steps to the in-domain cold share at 16, 130-175 at 32, in the
    policy simulation). The default keeps the counter and the policy within 0.5% of a one-stream
    decode step (docs/adaptive.md)."""
    swaps_per_layer: NonNegativeInt = Field(default=_D.swaps_per_layer, le=MAX_EXPERTS)
    """Most swaps (one hot expert out, one cold expert in) per MoE layer per plan; they wait,
    strongest first, for copy budget and spare rows. 0 counts and ranks but never swaps."""
    spare_rows: NonNegativeInt = _D.spare_rows
    """Spare rows per MoE layer the promoted experts are copied into while steps run: that many
    expert rows of HBM (taken from the KV pool) and, with `host_copies: spare`, of pinned host
    memory (the ledger shows both). At least 1 unless `swaps_per_layer` is 0."""
    flip_interval: PositiveInt = _D.flip_interval
    """Forwards between map flips: the swaps copied so far become live (map entries only) and their
    old rows spare again, so `spare_rows` rows carry `interval / flip_interval` times as many swaps
    per plan."""
    copy_rows_per_layer: float = Field(default=_D.copy_rows_per_layer, gt=0)
    """Expert rows copied host → HBM per decode step and MoE layer while adapting (a 40-layer GPU
    copies 40 × this per step), beside the step on a side stream. The copies share the host link
    with the cold bank's reads: this bounds what adapting adds to a step and how fast a traffic
    shift is followed (docs/adaptive.md, "Copies beside the steps")."""
    host_copies: Literal["spare", "all"] = _D.host_copies  # type: ignore[assignment]
    """`spare`: `swaps_per_layer` spare host rows per layer; a demoted expert the host no longer
    holds is copied back into one (HBM → host). `all`: the host keeps a copy of every hot expert
    too, so a demotion is only a map change — at the host memory of the hot experts again."""
    rank_picks: Literal["all", "decode"] = _D.rank_picks  # type: ignore[assignment]
    """`all`: the ranking counts every pick, prefill and decode. `decode`: decode picks only (a
    long prompt then weighs nothing; the counter keeps a second count — per row on the torch path,
    per decode-only step on the fused GPU layer, where a step with a prefill row adds none)."""
    decay: float = Field(default=_D.decay, ge=0, lt=1)
    """Factor on every score at each barrier before the new window is added
    (`score = decay × score + window`): the memory is about 1 / (1 − decay) windows."""
    margin: float = Field(default=_D.margin, ge=0)
    """Hysteresis: a cold expert replaces the weakest hot one only when its score exceeds
    (1 + margin) × that hot expert's score, so alternating traffic does not thrash the map."""
    evidence: float = Field(default=_D.evidence, ge=0)
    """Noise guard while a class profile is in the ranking: the cold expert's lead must exceed
    `evidence` × √(cold + hot) (Poisson standard deviations)."""
    counts_evidence: float = Field(default=_D.counts_evidence, ge=0)
    """The same guard when the ranking rests on counts alone (no priors, `prior_weight` 0, or
    traffic no class profile explains)."""
    prior_weight: float = Field(default=_D.prior_weight, ge=0)
    """Weight of the best-fitting class profile in the ranking (0: counts only)."""
    priors: list[str] | None = None
    """Classes whose histograms are mounted as priors (the policy recognises the traffic's class
    from one window and ranks by its profile). Absent: every class of the lane that declares a
    histogram; `[]`: none (counts only)."""

    def runtime_config(self) -> AdaptiveConfig:
        """The runtime's `AdaptiveConfig` for these settings (what `render` writes)."""
        return AdaptiveConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(AdaptiveConfig)})
