"""Cost model: reproduces the seeds' arithmetic at their printed precision (explicit geometry)."""

from __future__ import annotations

import dataclasses

import pytest

from recipegen.costmodel.calibration import DSV41_GB300, PAIRS, project, project_all, projected_slope_per_gib
from recipegen.costmodel.fetch import fetch_tax
from recipegen.costmodel.seed_tables import FIGURE3_ROWS, FIGURE3_STEP_S, printed_like
from recipegen.costmodel.unique_experts import (
    ONE_STREAM_UNIQUE,
    calibrated_model,
    independent_draws_unique,
    unique_calibration_points,
)

GiB = 2**30
G = DSV41_GB300


@pytest.mark.parametrize("row", FIGURE3_ROWS, ids=lambda r: r.label)
def test_figure3_rows_at_printed_precision(row):
    model = calibrated_model()
    tax = fetch_tax(moe_layers=G.moe_layers, unique_per_layer=model.unique(k=0, streams=1),
                    cold_share=row.cold_share, bytes_per_expert=G.bytes_per_expert,
                    link_bandwidth=G.link_bandwidth, step_time=FIGURE3_STEP_S)
    assert printed_like(tax.fetch_ms, row.printed_ms) == row.printed_ms
    assert printed_like(tax.share * 100, row.printed_share) == row.printed_share


def test_figure3_is_layers_times_picks_times_share_times_bytes_over_decimal_bandwidth():
    tax = fetch_tax(moe_layers=40, unique_per_layer=6, cold_share=0.24, bytes_per_expert=18_800_640,
                    link_bandwidth=340e9)
    assert tax.cold_bytes.value == pytest.approx(40 * 6 * 0.24 * 18_800_640)
    assert tax.fetch_time.value == pytest.approx(40 * 6 * 0.24 * 18_800_640 / 340e9)
    assert tax.share_of_step is None
    # a GiB-based bandwidth would give a different (wrong) figure: the seeds divide by 10^9
    assert tax.fetch_ms != pytest.approx(40 * 6 * 0.24 * 18_800_640 / (340 * GiB) * 1e3, rel=1e-3)
    assert "cold share" in tax.cold_bytes.explain()


def test_per_layer_cold_shares_sum_layer_by_layer():
    shares = [0.0] * 30 + [1.0] * 10
    tax = fetch_tax(moe_layers=40, unique_per_layer=6, cold_share=shares, bytes_per_expert=100,
                    link_bandwidth=1e9)
    assert tax.cold_bytes.value == pytest.approx(10 * 6 * 100)
    with pytest.raises(ValueError, match="40 MoE layers"):
        fetch_tax(moe_layers=40, unique_per_layer=6, cold_share=[0.1] * 39, bytes_per_expert=1, link_bandwidth=1)
    with pytest.raises(ValueError, match="between 0 and 1"):
        fetch_tax(moe_layers=40, unique_per_layer=6, cold_share=1.5, bytes_per_expert=1, link_bandwidth=1)


def test_unique_experts_reproduces_measured_table_and_concurrent_point():
    model = calibrated_model()
    for k, measured in ONE_STREAM_UNIQUE.items():
        assert model.unique(k) == pytest.approx(measured, abs=1e-9)
    assert model.unique(5, 16) == pytest.approx(300.0, abs=1e-9)
    for point in unique_calibration_points(model):
        assert abs(point.error) < 1e-9
        if point.power_law is not None:  # the power law alone stays within 1.5% of every measured point
            assert abs(point.power_law / point.measured - 1) < 0.015


def test_unique_experts_is_monotone_and_bounded():
    model = calibrated_model()
    for streams in (1, 2, 4, 8, 16, 64):
        values = [model.unique(k, streams) for k in range(0, 9)]
        assert values == sorted(values)
        assert all(v <= 384 for v in values)
    assert [model.unique(5, s) for s in (1, 2, 4, 8, 16)] == sorted(model.unique(5, s) for s in (1, 2, 4, 8, 16))
    # interpolation between measured k stays between its neighbours
    assert model.unique(3) < model.unique(4) < model.unique(5)
    assert model.diversity > 1.0  # stated in the docs: the ~300 point implies more than independent streams


def test_independent_draws_from_a_skewed_histogram_still_overestimate_one_stream(repo_root):
    from expert_residency.formats import load_histogram

    from recipegen.costmodel.unique_experts import histogram_draws_unique

    counts = load_histogram(repo_root / "recipes/profiles/dsv41-flash/agent.hist").counts.tolist()
    assert histogram_draws_unique([[1.0] * 384], 36) == pytest.approx(independent_draws_unique(36, 384))
    skewed = histogram_draws_unique(counts, 36)
    assert ONE_STREAM_UNIQUE[5] * 1.2 < skewed < independent_draws_unique(36, 384)
    # and at 576 picks the skew keeps the union far below the seeds' uniform ~300
    assert histogram_draws_unique(counts, 576) < 250


def test_independent_draws_overestimate_one_stream_table():
    # 36 picks (k=5, top-6) drawn independently give ~34 unique experts; the router measured 22.5
    assert independent_draws_unique(36, 384) > 1.5 * ONE_STREAM_UNIQUE[5]
    # the seeds' ~300 at sixteen streams is what 576 independent uniform picks give
    assert independent_draws_unique(576, 384) == pytest.approx(300, abs=2)


def test_calibration_pairs_project_with_errors_shown_not_hidden():
    projections = {p.pair.name: p for p in project_all()}
    c1 = projections[PAIRS[0].name]
    assert c1.fetch_before_s * 1e3 == pytest.approx(40 * 22.5 * 0.24 * 18_800_640 / 340e9 * 1e3)
    assert c1.projected_tok_s == pytest.approx(158.9, abs=0.1)
    assert c1.error == pytest.approx(0.037, abs=0.001)       # +3.7% on 153.28
    assert c1.step_error == pytest.approx(-0.082, abs=0.001)  # 13.4 ms projected vs 14.6 measured
    # at eight and sixteen streams the model's positional fetch exceeds the step implied by the
    # measurement: reported as inconsistent, never forced
    for pair in PAIRS[1:3]:
        p = projections[pair.name]
        assert not p.consistent and p.error is None
        assert p.fetch_before_s > p.step_before_s
        assert p.max_consistent_unique() < p.unique
    slope_pair = projections[PAIRS[3].name]
    assert projected_slope_per_gib(slope_pair) == pytest.approx(0.33, abs=0.01)  # measured 0.76
    hbm = projections[PAIRS[4].name]
    assert hbm.error == pytest.approx(-0.11, abs=0.01)


def test_projection_needs_no_tuning_parameters():
    """Nothing is fitted to the pairs: a pair's projection reads its "before" and the two
    placements, never what was measured "after". Moving the measured "after" (tok/s and step
    time) moves the error and leaves the projection where it was; a model tuned to the pairs
    would follow the measurement."""
    for pair in PAIRS:
        base = project(pair)
        moved = project(dataclasses.replace(
            pair, after_tok_s=pair.after_tok_s * 1.5,
            after_step_s=None if pair.after_step_s is None else pair.after_step_s * 0.5))
        assert (moved.unique, moved.fetch_before_s, moved.fetch_after_s, moved.step_after_s,
                moved.projected_tok_s) == (base.unique, base.fetch_before_s, base.fetch_after_s,
                                           base.step_after_s, base.projected_tok_s)
        if base.consistent:
            assert moved.error == pytest.approx((base.error + 1) / 1.5 - 1)
    # ... while the "before" is an input: doubling its tok/s (k=0, no measured step) doubles the
    # projected "after" (same step ratio), by hand: tok/s_after = tok/s_before × step_before ÷ step_after
    slope = next(p for p in PAIRS if p.before_step_s is None and p.k == 0)
    faster = project(dataclasses.replace(slope, before_tok_s=slope.before_tok_s * 2))
    half_step = 1 / (slope.before_tok_s * 2)
    fetch_before, fetch_after = faster.fetch_before_s, faster.fetch_after_s
    assert faster.projected_tok_s == pytest.approx(
        slope.before_tok_s * 2 * half_step / (half_step - fetch_before + fetch_after))


def test_hot_read_time_uses_hbm_bandwidth_for_the_rest_of_the_step_bytes():
    tax = fetch_tax(moe_layers=40, unique_per_layer=22.5, cold_share=0.027, bytes_per_expert=18_800_640,
                    link_bandwidth=340e9, hbm_bandwidth=4.2e12)
    expected = 40 * 22.5 * (1 - 0.027) * 18_800_640 / 4.2e12
    assert tax.hot_read_time.value == pytest.approx(expected)
    assert "HBM bandwidth = 4,200 GB/s" in tax.hot_read_time.explain()


def test_docs_calibration_table_matches_the_code(repo_root):
    """docs/costmodel.md quotes the model's figures; recalibrating must update them."""
    doc = (repo_root / "docs" / "costmodel.md").read_text()
    model = calibrated_model()
    assert f"γ = {model.gamma:.3f}" in doc and f"D = {model.diversity:.2f}" in doc
    projections = project_all()
    c1, _, _, slope, hbm = projections
    for text in (f"{c1.projected_tok_s:.1f} tok/s", f"{c1.error:+.1%}", f"{c1.fetch_before_s * 1e3:.2f} → "
                 f"{c1.fetch_after_s * 1e3:.2f} ms", f"{projected_slope_per_gib(slope):.2f} tok/s per GiB",
                 f"{hbm.projected_tok_s:.1f} tok/s", f"{slope.error:+.1%}".replace("-", "−"),
                 f"{hbm.error:+.1%}".replace("-", "−")):
        assert text in doc, text
    for p in projections[1:3]:
        assert f"{p.fetch_before_s * 1e3:.1f}" in doc and f"≤ {p.max_consistent_unique():.0f}" in doc
