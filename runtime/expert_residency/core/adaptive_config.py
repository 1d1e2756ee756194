"""The adaptive policy's parameters and the bytes they allow, without torch.

Kept apart from ``core.adaptive`` (which needs torch) so that whatever validates a recipe or prices
it in a ledger — where torch is not installed — reads the same class, the same checks and the same
formulas as the runtime. ``core.adaptive`` re-exports ``AdaptiveConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdaptiveConfig:
    """Parameters of the policy (the future recipe field ``offload.adaptive``)."""

    interval: int = 32
    """Forwards between barriers. Each barrier costs a fixed ranking (a few hundred microseconds
    of device and host work, whatever the number of layers) plus the swaps it accepts; a longer
    interval spreads the fixed part over more steps and gives each decision more picks, a shorter
    one follows a shift sooner. 32 keeps the policy and the counter within 0.5% of a one-stream
    decode step (docs/adaptive.md, "The policy's share of a step")."""

    swaps_per_layer: int = 16
    """Most swaps (one hot expert out, one cold expert in) per MoE layer per barrier: bounds the
    host-link traffic and the barrier's length (2 × expert bytes × swaps per layer × layers)."""

    decay: float = 0.9
    """Factor applied to every score at each barrier before the new window is added
    (``score = decay * score + window``): the memory is ``1 / (1 - decay)`` windows."""

    margin: float = 0.5
    """Hysteresis: a cold expert replaces the weakest hot one only when its decayed score exceeds
    ``(1 + margin)`` times that hot expert's score."""

    evidence: float = 1.5
    """Noise guard while a class profile is in the ranking: the cold expert's lead must also exceed
    ``evidence`` standard deviations of a Poisson count, ``cold - hot > evidence * sqrt(cold + hot)``
    (on the blended scores). The relative margin alone lets a cold expert seen twice displace a hot
    one seen once; at one stream per step most experts near the hot/cold boundary are seen a
    handful of times per window."""

    counts_evidence: float = 2.5
    """The same guard when the ranking rests on counts alone (no profiles, ``prior_weight`` 0, or
    the counts fit the window better than every profile): counts carry more noise than a profile,
    and at 1.5 an in-domain lane kept undoing its own swaps in the simulation."""

    prior_weight: float = 16.0
    """Weight of the best-fitting class profile (``AdaptivePolicy.priors``) in the ranking:
    ``ranked = score + prior_weight * layer_total * p_class``. 0 ranks on counts alone. The class
    (or the mixture of all classes) is chosen per barrier by the likelihood of the last window."""

    def __post_init__(self) -> None:
        if not (isinstance(self.interval, int) and self.interval >= 1):
            raise ValueError(f"adaptive interval must be an integer >= 1 forward, got {self.interval!r}")
        if not (isinstance(self.swaps_per_layer, int) and self.swaps_per_layer >= 0):
            raise ValueError(f"adaptive swaps_per_layer must be an integer >= 0, got {self.swaps_per_layer!r}")
        if not 0.0 <= float(self.decay) < 1.0:
            raise ValueError(f"adaptive decay must be in [0, 1), got {self.decay!r}")
        for name in ("margin", "evidence", "counts_evidence", "prior_weight"):
            value = float(getattr(self, name))
            if not 0.0 <= value < float("inf"):
                raise ValueError(f"adaptive {name} must be a finite number >= 0, got {getattr(self, name)!r}")


def barrier_link_bytes(config: AdaptiveConfig, bytes_per_expert: int, moe_layers: int) -> int:
    """Most expert bytes one barrier moves over the host link: every layer swapping
    ``swaps_per_layer`` pairs, each moving one expert row in and one out."""
    return 2 * int(bytes_per_expert) * config.swaps_per_layer * int(moe_layers)


def staging_bytes(bytes_per_expert: int, row_layouts: int = 1) -> int:
    """Device bytes of the staging rows: one expert row per distinct row layout (a model whose MoE
    layers share one expert shape and dtype set needs one)."""
    return int(bytes_per_expert) * int(row_layouts)
