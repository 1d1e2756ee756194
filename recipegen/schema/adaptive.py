"""`offload.adaptive`: the row map follows the traffic inside a running engine (docs/adaptive.md).

The field names, defaults and ranges are the runtime's own `AdaptiveConfig`
(`expert_residency.core.adaptive_config`, torch-free): the recipe is validated against the same
class the worker parses from `EXPERT_RESIDENCY_ADAPTIVE`, so a recipe that validates boots.
"""

from __future__ import annotations

import dataclasses

from expert_residency.core.adaptive_config import AdaptiveConfig
from expert_residency.formats._io import MAX_EXPERTS
from pydantic import Field, NonNegativeInt, PositiveInt

from recipegen.schema.base import StrictModel

_D = AdaptiveConfig()  # the runtime's defaults: one source


class Adaptive(StrictModel):
    """Adaptive residency: every `interval` forwards, at a step boundary with no forward in
    flight, at most `swaps_per_layer` hot/cold swaps per MoE layer move the experts the traffic
    now uses into HBM (copies through a staging row, the map flip last; bank shapes and CUDA
    graphs stay valid). Absent: off, the boot map stays (the default). `adaptive: {}` turns it
    on with every default. Usage-aware lanes only.
    """

    interval: PositiveInt = _D.interval
    """Forwards between barriers. Each barrier costs a fixed ranking (a few hundred microseconds,
    whatever the number of layers) plus the swaps it accepts; a longer interval spreads the fixed
    part over more steps and gives each decision more picks, a shorter one follows a traffic shift
    sooner (about 80-90 decode steps to the in-domain cold share at 16, 130-175 at 32, in the
    policy simulation). The default keeps the counter and the policy within 0.5% of a one-stream
    decode step (docs/adaptive.md)."""
    swaps_per_layer: NonNegativeInt = Field(default=_D.swaps_per_layer, le=MAX_EXPERTS)
    """Most swaps (one hot expert out, one cold expert in) per MoE layer per barrier: bounds a
    barrier's host-link traffic, 2 × bytes per expert × swaps_per_layer × MoE layers (the ledger
    shows it), and so its length. 0 counts and ranks but never swaps."""
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
