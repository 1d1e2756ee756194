"""The order ``bench/gpu_residency.py`` times a step's cases in (reversed every other step): a
config compared with ``--compare`` is timed right beside the case it is compared with, so the two
swap places each step and neither always follows a different neighbour; ``usage_counter`` sits
right before ``usage_aware`` (the counter's cost is their paired difference); every case is timed
once. The expected orders are written out by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from tiers import needs_gpu_experts

pytestmark = needs_gpu_experts
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gr():
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("_gr_order_under_test", ROOT / "bench" / "gpu_residency.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = ["all_hbm", "positional", "usage_aware", "usage_counter"]


def test_compared_configs_sit_beside_their_case(gr) -> None:
    names = CASES + ["all_hbm@cap", "usage_aware@cap", "all_hbm@nopdl", "usage_aware@nopdl", "finalize_only"]
    assert gr.timing_order(names) == ["all_hbm", "all_hbm@cap", "all_hbm@nopdl", "positional", "usage_counter",
                                      "usage_aware", "usage_aware@cap", "usage_aware@nopdl", "finalize_only"]


def test_without_compared_configs_only_the_counter_moves(gr) -> None:
    assert gr.timing_order(CASES + ["finalize_only"]) == ["all_hbm", "positional", "usage_counter", "usage_aware",
                                                          "finalize_only"]


def test_a_case_without_its_base_is_still_timed(gr) -> None:
    assert gr.timing_order(["all_hbm", "odd@x", "finalize_only"]) == ["all_hbm", "finalize_only", "odd@x"]
