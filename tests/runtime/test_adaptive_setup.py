"""Configuring the adaptive policy from the environment: the parameter spec and the class priors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from expert_residency.core.adaptive import AdaptiveConfig  # noqa: E402
from expert_residency.core.adaptive_setup import (  # noqa: E402
    ENV_ADAPTIVE,
    ENV_PRIORS,
    adaptive_from_env,
    format_adaptive_spec,
    parse_adaptive_spec,
    priors_from_env,
    priors_from_histograms,
)
from expert_residency.formats import Histogram, save_histogram  # noqa: E402

pytestmark = pytest.mark.torch

PROFILES = Path(__file__).resolve().parents[2] / "recipes" / "profiles" / "dsv41-flash"


@pytest.mark.parametrize("text", ["", "  ", "off", "OFF", "0", "false", "no"])
def test_off_by_default(text):
    assert parse_adaptive_spec(text) is None
    assert adaptive_from_env({}) is None


def test_on_means_defaults_and_a_spec_sets_fields():
    assert parse_adaptive_spec("on") == AdaptiveConfig()
    config = parse_adaptive_spec(" interval=8 , swaps_per_layer=4,decay=0.8,margin=1,evidence=2,"
                                 "counts_evidence=3,prior_weight=0 ")
    assert config == AdaptiveConfig(interval=8, swaps_per_layer=4, decay=0.8, margin=1.0, evidence=2.0,
                                    counts_evidence=3.0, prior_weight=0.0)
    assert adaptive_from_env({ENV_ADAPTIVE: "interval=32"}) == AdaptiveConfig(interval=32)


def test_spec_round_trips():
    config = AdaptiveConfig(interval=24, swaps_per_layer=3, spare_rows=2, flip_interval=6, copy_rows_per_layer=0.75,
                            host_copies="all", rank_picks="decode", decay=0.75, margin=0.3, evidence=1.25,
                            counts_evidence=2.0, prior_weight=4.0)
    text = format_adaptive_spec(config)
    assert text == ("interval=24,swaps_per_layer=3,spare_rows=2,flip_interval=6,copy_rows_per_layer=0.75,"
                    "host_copies=all,rank_picks=decode,decay=0.75,margin=0.3,evidence=1.25,counts_evidence=2.0,"
                    "prior_weight=4.0")
    assert parse_adaptive_spec(text) == config
    assert format_adaptive_spec(None) == "off" and parse_adaptive_spec("off") is None


@pytest.mark.parametrize("text, message", [
    ("interval", "'interval' is not name=value"),
    ("interval=", "'interval=' is not name=value"),
    ("period=16", "unknown field 'period'"),
    ("interval=8,interval=16", "'interval' given twice"),
    ("interval=2.5", "'interval' = '2.5' is not an integer"),
    ("decay=fast", "'decay' = 'fast' is not a number"),
    ("decay=1.0", "decay must be in [0, 1)"),
    ("swaps_per_layer=-1", "swaps_per_layer must be an integer >= 0"),
    ("copy_rows_per_layer=0", "copy_rows_per_layer must be a finite number > 0"),
    ("copy_rows_per_layer=inf", "copy_rows_per_layer must be a finite number > 0"),
    ("host_copies=some", "host_copies must be one of spare, all"),
    ("rank_picks=prefill", "rank_picks must be one of all, decode"),
    ("spare_rows=0", "spare_rows must be an integer >= 1"),
    ("flip_interval=0", "flip_interval must be an integer >= 1"),
])
def test_bad_specs_name_the_variable_and_the_field(text, message):
    with pytest.raises(ValueError) as err:
        parse_adaptive_spec(text)
    assert ENV_ADAPTIVE in str(err.value) and message in str(err.value)


def _layer_counts(path: Path, layer: int) -> list[int]:
    """The raw counts of one layer, read from the file's text (not through the format reader)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(f"layer {layer}:"):
            return [int(v) for v in line.split(":", 1)[1].split()]
    raise AssertionError(f"no layer {layer} in {path}")


def test_priors_from_the_class_histograms():
    paths = [PROFILES / "agent.hist", PROFILES / "prose.hist"]
    priors = priors_from_histograms(paths, (7, 3), 384)
    assert sorted(priors) == ["agent", "prose"]  # named by meta.class
    for name in priors:
        table = priors[name]
        assert table.shape == (2, 384) and table.dtype == np.float64
        for row, layer in enumerate((7, 3)):  # rows follow the worker's layer order
            counts = _layer_counts(PROFILES / f"{name}.hist", layer)
            assert table[row, 11] == counts[11] / sum(counts)
            assert abs(table[row].sum() - 1.0) < 1e-12
    env = {ENV_PRIORS: f"{paths[0]}, {paths[1]}"}
    assert {k: v.tolist() for k, v in priors_from_env((7, 3), 384, env).items()} == \
        {k: v.tolist() for k, v in priors.items()}
    assert priors_from_env((7, 3), 384, {}) == {}


def test_prior_errors(tmp_path):
    with pytest.raises(ValueError, match="384 experts, the model has 256"):
        priors_from_histograms([PROFILES / "agent.hist"], (0,), 256)
    with pytest.raises(ValueError, match=r"no counts for MoE layer\(s\) \[40\]"):
        priors_from_histograms([PROFILES / "agent.hist"], (0, 40), 384)
    with pytest.raises(ValueError, match="two histograms for class 'agent'"):
        priors_from_histograms([PROFILES / "agent.hist", PROFILES / "agent.hist"], (0,), 384)


def test_a_layer_without_counts_gets_a_uniform_row(tmp_path):
    counts = np.array([[3, 1, 0, 0], [0, 0, 0, 0]], dtype=np.int64)
    path = tmp_path / "tiny.hist"
    save_histogram(Histogram((0, 1), 4, counts, tokens=2, source="test"), path)
    priors = priors_from_histograms([path], (0, 1), 4)
    assert list(priors) == ["tiny"]  # no meta.class: the file's stem
    assert priors["tiny"].tolist() == [[0.75, 0.25, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]]
