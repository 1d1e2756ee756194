"""``StepBarrier``: the barrier runs between forwards, every ``interval`` real forwards, never for
dummy forwards or during graph capture, and the split layer stays bit-identical throughout."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core.adaptive import AdaptiveConfig  # noqa: E402
from expert_residency.core.adaptive_step import StepBarrier  # noqa: E402
from test_adaptive_policy import LAYERS, Engine, class_probs, hot_mass, sample_ids  # noqa: E402
from test_core_fixtures import single_torch_thread  # noqa: E402,F401  (autouse)

pytestmark = pytest.mark.torch


class Recorder:
    """Wraps the policy's barrier to log when it runs relative to the forwards."""

    def __init__(self, engine: Engine, events: list[str]) -> None:
        self.engine, self.events = engine, events
        original = engine.policy.barrier

        def barrier(**kwargs):
            events.append("barrier")
            return original(**kwargs)

        engine.policy.barrier = barrier  # type: ignore[method-assign]


def test_barrier_every_interval_real_forwards_between_forwards():
    engine = Engine(AdaptiveConfig(interval=3, swaps_per_layer=2, decay=0.5, margin=0.25, evidence=0.0,
                                   counts_evidence=0.0))
    events: list[str] = []
    Recorder(engine, events)
    capturing = {"now": False}
    step = StepBarrier(engine.policy, capturing=lambda: capturing["now"])
    g = torch.Generator().manual_seed(3)
    probs = class_probs("prose")
    # a schedule of forward starts: real traffic, a profiling dummy, a capture, more traffic
    schedule = ["real"] * 4 + ["dummy"] * 2 + ["capture"] * 3 + ["real"] * 8
    for i, kind in enumerate(schedule):
        capturing["now"] = kind == "capture"
        step.before_forward(real=kind != "dummy")
        events.append(f"forward {i} {kind}")
        ids = {index: sample_ids(probs[row], 8, g) for row, index in enumerate(LAYERS)}
        assert engine.forward(ids, seed=i, count=kind == "real"), f"split != unsplit at forward {i}"
    # 12 real forwards at interval 3: barriers before real forwards 4, 7 and 10 (the 4th, 7th and
    # 10th); the one due after the 12th runs at the next forward start
    forwards = [e for e in events if e.startswith("forward")]
    assert len(forwards) == len(schedule)
    barrier_positions = [i for i, e in enumerate(events) if e == "barrier"]
    assert len(barrier_positions) == 3 == engine.policy.barriers
    real_before = [sum(1 for e in events[:p] if e.endswith("real")) for p in barrier_positions]
    assert real_before == [3, 6, 9]
    # each barrier sits right before a real forward, never before a dummy or a captured one
    assert all(events[p + 1].endswith("real") for p in barrier_positions)
    assert step.skipped_in_capture == 3 and step.due
    assert engine.policy.forwards == 12
    assert engine.full_check()


def test_the_map_follows_a_shift_through_the_step_barrier():
    engine = Engine(AdaptiveConfig(interval=2, swaps_per_layer=2, decay=0.5, margin=0.25, evidence=0.0,
                                   counts_evidence=0.0))
    reports = []
    step = StepBarrier(engine.policy, on_report=reports.append)
    g = torch.Generator().manual_seed(11)
    prose = class_probs("prose")
    before = hot_mass(engine.split, prose)
    for i in range(24):
        step.before_forward(real=True)
        ids = {index: sample_ids(prose[row], 8, g) for row, index in enumerate(LAYERS)}
        assert engine.forward(ids, seed=100 + i)
    assert len(reports) == 11 and sum(len(r.swaps) for r in reports) >= 2
    assert hot_mass(engine.split, prose) > before
    assert engine.full_check()
