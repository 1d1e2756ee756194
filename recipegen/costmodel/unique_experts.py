"""Unique routed experts touched per MoE layer per decode step (pure arithmetic).

One stream: a measured input. A verify window of k draft tokens plus one target token
routes (k+1)·top_k picks per layer, but consecutive tokens of one stream share experts, so
the field reports measured far fewer unique experts than picks: k0 6.0, k1 10.1, k3 16.8, k5 22.5,
k7 27.4 (DeepSeek-V4.1-Flash, 384 experts, top-6; the field report "vLLM: Pin Hot Experts",
2026-09-17, section "What the router already told us"; read from the catalog model
`dsv41-flash-mxfp4`, their one home). Independent draws from a histogram overestimate these
(36 uniform picks give 34.4 unique, not 22.5) — see `independent_draws_unique`.

The model. A layer with N experts and top-m routing that sees t "effective independent
tokens" touches  u = N · (1 − (1 − m/N)^t)  unique experts (each token's m picks are
distinct; different effective tokens are independent). At one stream, t₁(k) is read back
from the measured table (so the table is reproduced exactly where it was measured); between
and beyond measured k it follows the power law t₁(k) = (1+k)^γ fitted to the table.

Cross-stream diversity. S concurrent streams contribute t(S, k) = t₁(k) · (1 + D·(S − 1))
effective tokens: each further stream adds D times the first stream's effective tokens.
D = 1 would mean streams are independent copies of one stream; D is calibrated to the
the field reports' one concurrent point, ~300 of 384 unique experts per layer at sixteen streams and
k=5 ("Pin Hot Experts", "What it would honestly buy": "576 selections per layer dedup
to ~300 unique experts"). One point fixes one parameter, so the error there is zero by
construction; the calibrated D > 1 says sixteen streams are more diverse than sixteen
independent copies of one stream (the field reports' ~300 equals 576 independent uniform picks,
298.5). That is a property of the calibration point, stated rather than hidden.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from recipegen.costmodel.reference import reference_model
from recipegen.costmodel.reports import PIN_REPORT as SEED_PIN_HOT


def _reference_points() -> tuple[tuple[int, int, float], ...]:
    """The measured (streams, k, unique experts per layer) points, from the catalog's reference
    model (their one home; each carries its source there)."""
    return tuple((u.streams, int(u.k or 0), u.experts_per_layer) for u in reference_model().unique_experts)


_REFERENCE = _reference_points()

# Measured input (from the catalog): unique experts per MoE layer per step at one stream, by k.
ONE_STREAM_UNIQUE: dict[int, float] = {k: u for s, k, u in _REFERENCE if s == 1}
ONE_STREAM_SOURCE = f"{SEED_PIN_HOT}, 'What the router already told us' (DSv4.1-Flash, 384 experts, top-6)"


# The geometry those points were measured on.
ONE_STREAM_EXPERTS, ONE_STREAM_TOP_K = reference_model().routed_experts, reference_model().top_k

# Measured input (from the catalog): the first point at more than one stream.
CONCURRENT_POINT_STREAMS, CONCURRENT_POINT_K, CONCURRENT_POINT_UNIQUE = next(
    (s, k, u) for s, k, u in _REFERENCE if s > 1)
CONCURRENT_POINT_SOURCE = (f"{SEED_PIN_HOT}, 'What it would honestly buy': 576 selections per layer "
                           "dedup to ~300 unique experts at sixteen streams")


def unique_from_effective_tokens(effective_tokens: float, num_experts: int, top_k: int) -> float:
    """N · (1 − (1 − m/N)^t): unique experts touched by t independent tokens of m distinct picks."""
    if effective_tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** effective_tokens)


def effective_tokens_from_unique(unique: float, num_experts: int, top_k: int) -> float:
    """Inverse of `unique_from_effective_tokens`."""
    if not 0 < unique < num_experts:
        raise ValueError(f"unique experts {unique} must lie strictly between 0 and {num_experts}")
    return math.log(1.0 - unique / num_experts) / math.log(1.0 - top_k / num_experts)


def independent_draws_unique(picks: int, num_experts: int) -> float:
    """Unique experts from `picks` independent uniform draws — the naive model the field reports' table refutes."""
    return num_experts * (1.0 - (1.0 - 1.0 / num_experts) ** picks)


def histogram_draws_unique(counts: Sequence[Sequence[float]], picks: int) -> float:
    """Mean over layers of Σ_e 1 − (1 − p_e)^picks, p_e = the expert's share of its layer's picks:
    unique experts from `picks` independent draws that follow a histogram's skew."""
    total = 0.0
    for row in counts:
        layer_sum = float(sum(row))
        if layer_sum > 0:
            total += sum(1.0 - (1.0 - c / layer_sum) ** picks for c in row)
    return total / len(counts) if len(counts) else 0.0


@dataclass(frozen=True)
class UniqueExpertsModel:
    """Calibrated unique-experts model; build it with `calibrated_model()`."""

    num_experts: int
    top_k: int
    one_stream_tokens: dict[int, float]  # measured k -> effective tokens t1(k)
    gamma: float                          # power-law exponent for unmeasured k
    diversity: float                      # D, cross-stream diversity

    def effective_tokens(self, k: int, streams: int = 1) -> float:
        if k < 0:
            raise ValueError(f"draft length k must be >= 0, got {k}")
        if streams < 1:
            raise ValueError(f"streams must be >= 1, got {streams}")
        t1 = self.one_stream_tokens.get(k)
        if t1 is None:
            t1 = (1 + k) ** self.gamma
        return t1 * (1.0 + self.diversity * (streams - 1))

    def unique(self, k: int, streams: int = 1) -> float:
        """Expected unique experts per MoE layer per decode step at draft length k and `streams`."""
        return unique_from_effective_tokens(self.effective_tokens(k, streams), self.num_experts, self.top_k)

    def power_law_unique(self, k: int) -> float:
        """One-stream unique experts from the fitted power law alone (for the fit's error table)."""
        return unique_from_effective_tokens((1 + k) ** self.gamma, self.num_experts, self.top_k)


def fit_gamma(one_stream_tokens: dict[int, float]) -> float:
    """Least squares through the origin of ln t1(k) on ln(1+k) over the measured k > 0."""
    xs = [math.log(1 + k) for k in one_stream_tokens if k > 0]
    ys = [math.log(t) for k, t in one_stream_tokens.items() if k > 0]
    return sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)


SEED_POINTS: tuple[tuple[int, int, float], ...] = _REFERENCE


def calibrated_model(num_experts: int = ONE_STREAM_EXPERTS, top_k: int = ONE_STREAM_TOP_K,
                     points: Sequence[tuple[int, int | None, float]] | None = None) -> UniqueExpertsModel:
    """The model calibrated on measured (streams, k, unique experts per layer) points.

    Without `points`, the field reports' measurements (384 experts, top-6). Points at one stream give
    the one-stream table; the first point at more than one stream calibrates D (with none,
    D = 1: independent streams). Points are measured on the model's own router; when a
    catalog model declares none, the field reports' effective-token counts (a property of how
    consecutive tokens share routing) are reused as they are, which is an assumption.
    """
    pts = list(SEED_POINTS if points is None else points)
    if points is None:
        measured_n, measured_m = ONE_STREAM_EXPERTS, ONE_STREAM_TOP_K
    else:
        measured_n, measured_m = num_experts, top_k
    tokens = {int(k or 0): effective_tokens_from_unique(u, measured_n, measured_m)
              for s, k, u in pts if s == 1}
    if 0 not in tokens:
        tokens[0] = 1.0  # one token's top_k picks are distinct: exactly top_k unique experts
    if len(tokens) < 2:
        raise ValueError("the unique-experts model needs at least one measured one-stream point with k > 0")
    gamma = fit_gamma(tokens)
    diversity = 1.0
    concurrent = [(s, int(k or 0), u) for s, k, u in pts if s > 1]
    if concurrent:
        streams, k, unique = concurrent[0]
        t1 = tokens.get(k, (1 + k) ** gamma)
        t_point = effective_tokens_from_unique(unique, measured_n, measured_m)
        diversity = (t_point / t1 - 1.0) / (streams - 1)
    return UniqueExpertsModel(num_experts=num_experts, top_k=top_k, one_stream_tokens=tokens,
                              gamma=gamma, diversity=diversity)


@dataclass(frozen=True)
class CalibrationPoint:
    streams: int
    k: int
    measured: float
    model: float
    power_law: float | None
    source: str

    @property
    def error(self) -> float:
        return self.model / self.measured - 1.0


def unique_calibration_points(model: UniqueExpertsModel | None = None) -> list[CalibrationPoint]:
    """The model (and the bare power law) against every measured point, for the docs' error table."""
    model = model or calibrated_model()
    points = [CalibrationPoint(1, k, u, model.unique(k), model.power_law_unique(k), ONE_STREAM_SOURCE)
              for k, u in ONE_STREAM_UNIQUE.items()]
    points.append(CalibrationPoint(CONCURRENT_POINT_STREAMS, CONCURRENT_POINT_K, CONCURRENT_POINT_UNIQUE,
                                   model.unique(CONCURRENT_POINT_K, CONCURRENT_POINT_STREAMS), None,
                                   CONCURRENT_POINT_SOURCE))
    return points
