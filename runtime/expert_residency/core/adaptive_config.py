"""The adaptive policy's parameters and the bytes they allow, without torch.

Kept apart from ``core.adaptive`` (which needs torch) so that whatever validates a recipe or prices
it in a ledger — where torch is not installed — reads the same class, the same checks and the same
formulas as the runtime. ``core.adaptive`` re-exports ``AdaptiveConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass

HOST_COPIES = ("spare", "all")
RANK_PICKS = ("all", "decode")


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
    """Most swaps (one hot expert out, one cold expert in) per MoE layer per plan (a plan every
    ``interval`` forwards). Its swaps wait, strongest first, for copy budget and spare rows."""

    spare_rows: int = 4
    """Spare HBM rows per MoE layer the promoted experts are copied into while steps run (and,
    unless ``host_copies`` is ``all``, as many spare host rows for demoted experts the host no
    longer holds): the swaps of one layer in flight between two flips. Each costs one expert row
    of HBM per layer (taken from the KV pool)."""

    flip_interval: int = 8
    """Forwards between map flips: every ``flip_interval`` forwards the transfers whose copies were
    issued become live (one batched write of map entries; no ranking) and their old rows spare
    again, so ``spare_rows`` rows per layer carry ``interval / flip_interval`` times as many swaps
    per plan."""

    copy_rows_per_layer: float = 0.4
    """Expert rows copied host → HBM per decode step, per MoE layer on the GPU (in quarters of a
    row: 40 layers at 0.4 copy 16 rows a step), on a side stream beside the step. The copies share
    the host link with the cold bank's reads, whose volume also scales with the layers: this bounds
    what adapting adds to a step (rows × expert bytes ÷ link bandwidth) and how fast a shift is
    followed (a shift moves a number of experts per layer)."""

    host_copies: str = "spare"
    """``spare``: the host bank gets ``swaps_per_layer`` spare rows; a demoted expert the host does
    not still hold is copied back into one (HBM → host, the link direction the cold reads do not
    use). ``all``: the host bank keeps a copy of every expert (a hot expert's bytes stay on the
    host), so a demotion is only a map change — at the host memory of every hot expert again."""

    rank_picks: str = "all"
    """Which picks the ranking counts: ``all`` (prefill and decode alike) or ``decode`` (decode
    tokens only: the map pays off on decode, and one long prompt weighs as much as thousands of
    one-stream decode steps). With ``decode`` the plugin counts a second ``[L, E]`` count: per row
    on the torch path; per step on the fused GPU layer, where a step with any prefill row adds
    none of its picks (``core.counter``)."""

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
        if not (isinstance(self.spare_rows, int) and self.spare_rows >= (1 if self.swaps_per_layer else 0)):
            raise ValueError(f"adaptive spare_rows must be an integer >= 1 (>= 0 when swaps_per_layer is 0), "
                             f"got {self.spare_rows!r}")
        if not (isinstance(self.flip_interval, int) and self.flip_interval >= 1):
            raise ValueError(f"adaptive flip_interval must be an integer >= 1 forward, got {self.flip_interval!r}")
        if not (isinstance(self.copy_rows_per_layer, (int, float)) and 0.0 < float(self.copy_rows_per_layer) < float("inf")):
            raise ValueError(f"adaptive copy_rows_per_layer must be a finite number > 0, got {self.copy_rows_per_layer!r}")
        if self.host_copies not in HOST_COPIES:
            raise ValueError(f"adaptive host_copies must be one of {', '.join(HOST_COPIES)}, got {self.host_copies!r}")
        if self.rank_picks not in RANK_PICKS:
            raise ValueError(f"adaptive rank_picks must be one of {', '.join(RANK_PICKS)}, got {self.rank_picks!r}")
        if not 0.0 <= float(self.decay) < 1.0:
            raise ValueError(f"adaptive decay must be in [0, 1), got {self.decay!r}")
        for name in ("margin", "evidence", "counts_evidence", "prior_weight"):
            value = float(getattr(self, name))
            if not 0.0 <= value < float("inf"):
                raise ValueError(f"adaptive {name} must be a finite number >= 0, got {getattr(self, name)!r}")


def barrier_link_bytes(config: AdaptiveConfig, bytes_per_expert: int, moe_layers: int) -> int:
    """Most expert bytes one plan moves over the host link: every layer swapping
    ``swaps_per_layer`` pairs, each moving one expert row in and (``host_copies: spare``) one out.
    The copies run beside the steps, ``copy_rows_per_layer`` rows in per step."""
    ways = 1 if config.host_copies == "all" else 2
    return ways * int(bytes_per_expert) * config.swaps_per_layer * int(moe_layers)


def spare_hbm_bytes(config: AdaptiveConfig, bytes_per_expert: int, moe_layers: int) -> int:
    """Device bytes of the spare HBM rows: ``spare_rows`` expert rows per MoE layer (none when the
    policy never swaps)."""
    rows = config.spare_rows if config.swaps_per_layer else 0
    return int(bytes_per_expert) * rows * int(moe_layers)


def spare_host_bytes(config: AdaptiveConfig, bytes_per_expert: int, moe_layers: int, hot_per_layer: int) -> int:
    """Host bytes beyond the cold bank's experts: ``spare_rows`` spare rows per layer, or with
    ``host_copies: all`` a copy of every hot expert (``hot_per_layer`` rows per layer)."""
    if not config.swaps_per_layer:
        return 0
    rows = int(hot_per_layer) if config.host_copies == "all" else config.spare_rows
    return int(bytes_per_expert) * rows * int(moe_layers)


def copy_bytes_per_step(config: AdaptiveConfig, bytes_per_expert: int, moe_layers: int) -> int:
    """Most bytes the copies add to the host link (host → HBM) per decode step while adapting."""
    return int(round(config.copy_rows_per_layer * int(moe_layers) * int(bytes_per_expert)))


def staging_bytes(bytes_per_expert: int, row_layouts: int = 1) -> int:
    """Device bytes of the staging rows: one expert row per distinct row layout (a model whose MoE
    layers share one expert shape and dtype set needs one)."""
    return int(bytes_per_expert) * int(row_layouts)
