"""Calibration data set: the field reports' measured pairs, and what the fetch model projects for each.

Every "after" is projected from its "before" with the same additive step model:

    step_before  = measured step time, or  streams × tokens per step per stream ÷ tok/s_before
    non-fetch    = step_before − fetch(before placement)
    step_after   = non-fetch + fetch(after placement)
    tok/s_after  = tok/s_before × step_before ÷ step_after        (acceptance unchanged)

fetch() is `fetch.fetch_tax` with the calibrated unique-experts model. Nothing here is fitted
to the pairs: the errors are what the model gets wrong. When the model's fetch for the
"before" exceeds the whole step implied by the measurement, the projection is reported as
inconsistent, with both numbers, instead of being forced.
"""

from __future__ import annotations

from dataclasses import dataclass

from recipegen.common.units import GiB
from recipegen.costmodel.fetch import fetch_tax
from recipegen.costmodel.reference import reference_machine, reference_model
from recipegen.costmodel.reports import OFFLOAD_REPORT as SEED_OFFLOAD
from recipegen.costmodel.reports import PIN_REPORT as SEED_PIN
from recipegen.costmodel.reports import PREFETCH_REPORT as SEED_PREFETCH
from recipegen.costmodel.steps import (
    STEP_C1_K0_ALL_HBM,
    STEP_C1_K0_POSITIONAL,
    STEP_C1_K5_POSITIONAL,
    STEP_C1_K5_USAGE_AWARE,
)
from recipegen.costmodel.unique_experts import UniqueExpertsModel, calibrated_model


@dataclass(frozen=True)
class Geometry:
    """What the fetch model needs of a model on a machine."""

    moe_layers: int
    routed_experts: int
    top_k: int
    bytes_per_expert: int
    link_bandwidth: float  # bytes/s, decimal

    @property
    def all_expert_bytes(self) -> int:
        return self.moe_layers * self.routed_experts * self.bytes_per_expert


def reference_geometry() -> Geometry:
    """DeepSeek-V4.1-Flash on one DGX Station GB300, as the catalog declares them (their one home)."""
    model, machine = reference_model(), reference_machine()
    return Geometry(moe_layers=model.num_moe_layers, routed_experts=model.routed_experts, top_k=model.top_k,
                    bytes_per_expert=model.expert_bytes, link_bandwidth=machine.pinned_read_bandwidth)


DSV41_GB300 = reference_geometry()


@dataclass(frozen=True)
class MeasuredInput:
    name: str
    value: float
    unit: str
    source: str


MEASURED_INPUTS: tuple[MeasuredInput, ...] = (
    MeasuredInput("step time, k=0, one stream (v12, off60)", STEP_C1_K0_POSITIONAL.seconds * 1e3, "ms",
                  f"{STEP_C1_K0_POSITIONAL.source}; {SEED_OFFLOAD}"),
    MeasuredInput("step time, one user (v15, usage-aware map)", STEP_C1_K5_USAGE_AWARE.seconds * 1e3, "ms",
                  STEP_C1_K5_USAGE_AWARE.source),
    MeasuredInput("step time, k=5, one stream (v14, positional)", STEP_C1_K5_POSITIONAL.seconds * 1e3, "ms",
                  STEP_C1_K5_POSITIONAL.source),
    MeasuredInput("step time, all experts in HBM, k=0 (catid, 2x GB300 PP2)", STEP_C1_K0_ALL_HBM.seconds * 1e3,
                  "ms", STEP_C1_K0_ALL_HBM.source),
    MeasuredInput("cold share of picks, positional off60 (v14)", 0.24, "",
                  f"{SEED_PREFETCH}, section 3 ('from about 24% to 2.7%'); ~23% in {SEED_PIN}"),
    MeasuredInput("cold share of picks, usage-aware 295/89, matching traffic (v15)", 0.027, "",
                  f"{SEED_PREFETCH}, section 3 and Figure 3; 1.55% on the profile itself in {SEED_PIN}"),
    MeasuredInput("tok/s per GiB of experts moved into HBM (v11 -> v12)", 0.76, "tok/s/GiB",
                  f"{SEED_PIN}, 'Where the experts live today': 12.7 GiB bought +9.7 tok/s single-stream"),
)


@dataclass(frozen=True)
class ThroughputPair:
    """A same-window before/after measurement."""

    name: str
    streams: int
    k: int
    before_tok_s: float
    after_tok_s: float
    before_cold_share: float
    after_cold_share: float
    source: str
    before_step_s: float | None = None   # measured step time of the "before", when the field reports give one
    after_step_s: float | None = None    # measured step time of the "after", for comparison
    before_range: tuple[float, float] | None = None
    note: str = ""


# Tokens per step per stream at k=5, derived from the C1 pair (88.74 tok/s × ~24 ms); used for
# pairs whose step time was not measured. Assumes acceptance does not change with concurrency.
C1_K5_TOKENS_PER_STEP = 88.74 * STEP_C1_K5_POSITIONAL.seconds
C1_K5_TOKENS_PER_STEP_SOURCE = "derived: 88.74 tok/s × ~24 ms (v14, C1, k=5); acceptance assumed constant across concurrency"

PAIRS: tuple[ThroughputPair, ...] = (
    ThroughputPair("C1 k=5: positional (v14) -> usage-aware 295/89 (v15)", 1, 5, 88.74, 153.28, 0.24, 0.027,
                   f"{SEED_PIN}, 'Confirmed: second pair' (four runs each, instrument spread 0.4 tok/s)",
                   before_step_s=STEP_C1_K5_POSITIONAL.seconds, after_step_s=STEP_C1_K5_USAGE_AWARE.seconds),
    ThroughputPair("C8 k=5: positional (v14) -> usage-aware (v15)", 8, 5, 305.0, 704.0, 0.24, 0.027,
                   f"{SEED_PREFETCH}, section 3 ('eight users from 305 to 704')",
                   note="k at C8 under the field reports' DSpark schedule is not stated; k=5 assumed"),
    ThroughputPair("C16 k=5: positional (v14) -> usage-aware (v15)", 16, 5, 401.5, 955.0, 0.24, 0.027,
                   f"{SEED_PIN}, 'Confirmed' (~955 on six of seven reps, one 667; v14 386-417); "
                   f"{SEED_PREFETCH} quotes 385 -> 953", before_range=(386.0, 417.0),
                   note="576 selections per layer at sixteen streams implies k=5"),
    ThroughputPair("C1 k=0: 12.7 GiB of experts moved into HBM (v11 -> v12)", 1, 0, 89.7 - 9.7, 89.7,
                   0.24 + 12.7 * GiB / DSV41_GB300.all_expert_bytes, 0.24,
                   f"{SEED_PIN}, 'Where the experts live today' (+9.7 tok/s, 0.76 tok/s per GiB); "
                   f"{SEED_OFFLOAD} quotes +14.7%",
                   after_step_s=STEP_C1_K0_POSITIONAL.seconds,
                   note="v12 is taken as the 89.7 tok/s k=0 point, so v11 = 80.0; the +14.7% quoted in "
                        "the offload report does not fit those numbers"),
    ThroughputPair("C1 k=0: positional (v12) -> every expert in HBM (catid)", 1, 0, 89.7, 141.3, 0.24, 0.0,
                   f"{SEED_PIN}, 'Where the experts live today' and 'Against the two-Station all-HBM reference'",
                   before_step_s=STEP_C1_K0_POSITIONAL.seconds, after_step_s=STEP_C1_K0_ALL_HBM.seconds,
                   note="different box (2x GB300, PP2) and checkpoint revision"),
)


@dataclass(frozen=True)
class Projection:
    pair: ThroughputPair
    unique: float
    step_before_s: float
    step_before_how: str
    fetch_before_s: float
    fetch_after_s: float
    step_after_s: float | None
    projected_tok_s: float | None

    @property
    def consistent(self) -> bool:
        return self.projected_tok_s is not None

    @property
    def error(self) -> float | None:
        """Projected ÷ measured − 1 for the "after" tok/s (None when inconsistent)."""
        if self.projected_tok_s is None:
            return None
        return self.projected_tok_s / self.pair.after_tok_s - 1.0

    def max_consistent_unique(self) -> float:
        """Unique experts per layer at which the "before" fetch alone would fill its whole step.

        A bound the measurement puts on the model: more unique experts than this cannot have
        been read over the link within the measured step.
        """
        per_unique = self.fetch_before_s / self.unique if self.unique else 0.0
        return self.step_before_s / per_unique if per_unique else float("inf")

    @property
    def step_error(self) -> float | None:
        if self.step_after_s is None or self.pair.after_step_s is None:
            return None
        return self.step_after_s / self.pair.after_step_s - 1.0


def _fetch_seconds(geometry: Geometry, unique: float, cold_share: float) -> float:
    return fetch_tax(moe_layers=geometry.moe_layers, unique_per_layer=unique, cold_share=cold_share,
                     bytes_per_expert=geometry.bytes_per_expert,
                     link_bandwidth=geometry.link_bandwidth).fetch_time.value


def project(pair: ThroughputPair, geometry: Geometry = DSV41_GB300,
            model: UniqueExpertsModel | None = None) -> Projection:
    """Project the pair's "after" from its "before"."""
    model = model or calibrated_model(geometry.routed_experts, geometry.top_k)
    unique = model.unique(pair.k, pair.streams)
    if pair.before_step_s is not None:
        step_before, how = pair.before_step_s, "measured"
    elif pair.k == 0:
        step_before, how = pair.streams / pair.before_tok_s, "streams ÷ tok/s (k=0: one token per step)"
    else:
        step_before = pair.streams * C1_K5_TOKENS_PER_STEP / pair.before_tok_s
        how = f"streams × {C1_K5_TOKENS_PER_STEP:.2f} tokens/step ÷ tok/s ({C1_K5_TOKENS_PER_STEP_SOURCE})"
    fetch_before = _fetch_seconds(geometry, unique, pair.before_cold_share)
    fetch_after = _fetch_seconds(geometry, unique, pair.after_cold_share)
    non_fetch = step_before - fetch_before
    if non_fetch <= 0:
        return Projection(pair, unique, step_before, how, fetch_before, fetch_after, None, None)
    step_after = non_fetch + fetch_after
    return Projection(pair, unique, step_before, how, fetch_before, fetch_after, step_after,
                      pair.before_tok_s * step_before / step_after)


def project_all(geometry: Geometry = DSV41_GB300) -> list[Projection]:
    model = calibrated_model(geometry.routed_experts, geometry.top_k)
    return [project(pair, geometry, model) for pair in PAIRS]


def projected_slope_per_gib(projection: Projection, moved_gib: float = 12.7) -> float:
    """tok/s gained per GiB moved into HBM, as the model projects it for the v11 -> v12 pair."""
    assert projection.projected_tok_s is not None
    return (projection.projected_tok_s - projection.pair.before_tok_s) / moved_gib
