"""Measured decode step times (measured inputs, never derived), keyed by model and machine.

The share of a step that the fetch tax takes needs a measured step time of the same model on
the same machine, at the same placement and split of the experts (the hot experts per layer of a
usage-aware lane, the --cpu-offload-gb of a positional one), concurrency and k. The field reports measured three, all at
one stream (and a fourth on another box, a calibration point only); elsewhere the share is
reported as unknown rather than guessed. This module is their one home.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipegen.common.units import GiB
from recipegen.costmodel.reports import PIN_REPORT as SEED_PIN
from recipegen.costmodel.reports import PREFETCH_REPORT as SEED_PREFETCH


@dataclass(frozen=True)
class StepTime:
    model: str
    machine: str
    placement: str       # usage-aware | positional
    split: int | None    # hot experts per layer (usage-aware), bytes offloaded at load (positional)
    streams: int
    k: int
    seconds: float
    source: str


STEP_C1_K5_USAGE_AWARE = StepTime(
    "dsv41-flash-mxfp4", "gb300-station", "usage-aware", 295, 1, 5, 0.0146,
    f"{SEED_PREFETCH}, Figures 1 and 3: 'one decode step for one user ≈ 14.6 ms' (the usage-aware "
    "295 hot / 89 cold lane)")
STEP_C1_K5_POSITIONAL = StepTime(
    "dsv41-flash-mxfp4", "gb300-station", "positional", 60 * GiB, 1, 5, 0.024,
    f"{SEED_PIN}, 'Update, September 17 afternoon': '~24 ms k=5 step' (the positional "
    "--cpu-offload-gb 60 lane)")
STEP_C1_K0_POSITIONAL = StepTime(
    "dsv41-flash-mxfp4", "gb300-station", "positional", 60 * GiB, 1, 0, 0.0111,
    f"{SEED_PIN}, 'Where the experts live today': 'our k=0 step (11.1 ms, 89.7 tok/s)' "
    "(the positional --cpu-offload-gb 60 lane, no speculation)")
# Another box (two GB300 Stations, pipeline parallel 2, every expert in HBM) and revision: a
# calibration point only, never matched to a lane.
STEP_C1_K0_ALL_HBM = StepTime(
    "dsv41-flash-mxfp4", "gb300-station-x2-pp2", "all-in-hbm", None, 1, 0, 0.0071,
    f"{SEED_PIN}, 'Where the experts live today' (141.3 tok/s)")

# The one home of measured step times: the lane cost model, the calibration pairs and the field reports'
# printed tables all read them from here.
STEP_TIMES: tuple[StepTime, ...] = (STEP_C1_K5_USAGE_AWARE, STEP_C1_K5_POSITIONAL, STEP_C1_K0_POSITIONAL,
                                    STEP_C1_K0_ALL_HBM)


def lane_split(offload: Any) -> int | None:
    """A lane's split of the experts as `StepTime.split` keys it (None: not one a step was measured at)."""
    if offload.placement == "usage-aware":
        return offload.hot_experts_per_layer
    if offload.placement == "positional":
        return offload.load_cpu_offload
    return None


def measured_step(model: str, machine: str, placement: str, split: int | None, streams: int,
                  k: int) -> StepTime | None:
    """The step measured for exactly this lane: a step of another split (another --cpu-offload-gb,
    another hot count) is another step, so it is not quoted as this lane's."""
    for step in STEP_TIMES:
        if (step.model, step.machine, step.placement, step.split, step.streams, step.k) == (
                model, machine, placement, split, streams, k):
            return step
    return None
