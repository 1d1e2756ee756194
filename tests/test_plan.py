"""Cost model on the reference recipe: seeds' numbers through the ledger, and `recipegen plan`."""

from __future__ import annotations

import json

import pytest
from cli_support import invoke

from recipegen.common.errors import InputError
from recipegen.costmodel.fetch import fetch_tax
from recipegen.costmodel.lane import fetch_summary, unique_model_for
from recipegen.costmodel.prefetch import lane_prefetch_price
from recipegen.costmodel.seed_tables import FIGURE3_ROWS, PREFETCH_PRINTED, printed_like
from recipegen.costmodel.steps import measured_step
from recipegen.costmodel.sweep import parse_sweep, sweep_hot
from recipegen.load.recipe import load_recipe

REFERENCE = "dsv41-flash-gb300"


@pytest.fixture(scope="module")
def reference():
    return load_recipe(REFERENCE)


@pytest.mark.parametrize("row", FIGURE3_ROWS, ids=lambda r: r.label)
def test_figure3_from_the_reference_recipe(reference, row):
    model = reference.recipe.model
    machine = reference.recipe.machines["station"]
    step = measured_step(model.name, machine.name, "usage-aware", 295, 1, 5)
    tax = fetch_tax(moe_layers=model.num_moe_layers, unique_per_layer=unique_model_for(model).unique(0, 1),
                    cold_share=row.cold_share, bytes_per_expert=model.expert_bytes,
                    link_bandwidth=machine.pinned_read_bandwidth, step_time=step.seconds)
    assert model.expert_bytes == 18_800_640 and model.num_moe_layers == 40
    assert printed_like(tax.fetch_ms, row.printed_ms) == row.printed_ms
    assert printed_like(tax.share * 100, row.printed_share) == row.printed_share


def test_prefetch_price_from_the_reference_lane(reference):
    price = lane_prefetch_price(reference, "agent", 3)
    assert str(price.experts) == PREFETCH_PRINTED["experts"]
    assert printed_like(price.bank_gib, "2.1") == PREFETCH_PRINTED["bank_gib"]
    assert printed_like(price.kv_tokens_lost.value / 1e6, "1.09") == PREFETCH_PRINTED["kv_tokens_m"]
    assert printed_like(price.share_of_pool.value * 100, "43") == PREFETCH_PRINTED["share_pct"]
    # the pool it is taken from is the ledger's: 4.9 GiB, ~2.54M tokens, leaving ~1.45M (the field report 'Should a GB300 Prefetch Its Cold Experts? Mostly No, and What to Build Instead' (2026-10-23), Figure 4)
    assert printed_like(price.kv_pool_bytes / 2**30, "4.9") == PREFETCH_PRINTED["pool_gib"]
    assert printed_like(price.kv_tokens_before / 1e6, "2.54") == PREFETCH_PRINTED["pool_tokens_m"]
    assert printed_like(price.kv_tokens_after / 1e6, "1.45") == "1.45"
    assert lane_prefetch_price(reference, "agent", 0).kv_tokens_lost.value == 0


def test_unique_model_comes_from_the_catalog_points(reference):
    unique = unique_model_for(reference.recipe.model)
    assert unique.unique(5, 1) == pytest.approx(22.5) and unique.unique(5, 16) == pytest.approx(300)


def test_fetch_summary_per_class(reference):
    summary = fetch_summary(reference, "agent")
    by_name = {c.traffic_class: c for c in summary.classes}
    assert set(by_name) == {"agent", "prose", "math"} and by_name["agent"].active
    agent = by_name["agent"]
    c1 = agent.points[0]
    assert (c1.streams, c1.k) == (1, 5)  # the lane's constant k
    assert c1.tax.share == pytest.approx(c1.tax.fetch_ms / 14.6)
    assert agent.points[-1].streams == 16 and agent.points[-1].tax.share is None  # no measured C16 step
    # other classes' traffic on the active (agent) map costs far more than after a swap to their own map
    prose = by_name["prose"]
    assert prose.under_active is not None and prose.under_active.overall > 5 * prose.cold_share.overall
    text = "\n".join(summary.lines())
    assert "agent (active) on the active map" in text and "before a swap" in text
    # the reference lane follows the plan's own advice (a constant k): no speculative warning
    assert "speculative warning" not in text
    json.dumps(summary.to_json())


def test_sweep_rows_come_from_the_ledger(reference):
    sweep = sweep_hot(reference, "agent", [290, 295, 300])
    row = sweep.row(295)
    assert printed_like(row.kv_pool_bytes / 2**30, "4.9") == "4.9"
    assert printed_like(row.kv_tokens / 1e6, "2.54") == "2.54"
    assert printed_like(row.cold_bytes / 2**30, "62.33") == "62.33"
    assert not row.violations
    assert "kv" in sweep.row(300).violations  # 0.72M tokens no longer hold one 1M-token sequence
    assert sweep.row(290).points[0].tax.fetch_ms > row.points[0].tax.fetch_ms > sweep.row(300).points[0].tax.fetch_ms
    assert sweep.current_hot == 295


@pytest.mark.parametrize("text, message", [
    ("hot=300..250", "backwards"), ("hot=250..400", "exceeds"), ("cold=1..2", "hot=LOW..HIGH"),
])
def test_bad_sweep_is_an_input_error(text, message):
    with pytest.raises(InputError, match=message):
        parse_sweep(text, 384)


def test_plan_cli_table_and_plot(tmp_path):
    png = tmp_path / "sweep.png"
    result = invoke("plan", REFERENCE, "agent", "--sweep", "hot=250..384", "--plot", str(png), "--prefetch-slots", "3")
    assert result.code == 0, result.output
    line = next(l for l in result.output.splitlines() if "◀ lane now" in l)
    assert line.split()[:2] == ["295", "89"] and "2.54M" in line
    assert "120 experts = 2.10 GiB ≈ 1.09M KV tokens = 43% of the 4.90 GiB pool" in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_plan_cli_json_and_errors(tmp_path):
    result = invoke("plan", REFERENCE, "agent", "--sweep", "hot=290..300:5", "--json")
    assert result.code == 0, result.output
    data = json.loads(result.output)
    assert [r["hot_per_layer"] for r in data["sweep"]["rows"]] == list(range(290, 301))
    bad = invoke("plan", REFERENCE, "nope")
    assert bad.code == 2 and "no lane 'nope'" in bad.output and "Traceback" not in bad.output
    bad = invoke("plan", REFERENCE, "agent", "--plot", str(tmp_path / "x.png"))
    assert bad.code == 2 and "--sweep" in bad.output


def test_plan_explain_shows_every_operand():
    result = invoke("plan", REFERENCE, "agent", "--explain", "--concurrency", "1")
    assert result.code == 0, result.output
    for text in ("MoE layers = 40", "unique experts per layer = 22.5", "bytes per expert = 18,800,640 B",
                 "link bandwidth = 340 GB/s", "step time = 14.6 ms", "row map maps/dsv41-flash/agent.rowmap"):
        assert text in result.output


def test_positional_twin_reads_whole_layers_cold():
    twin = load_recipe("dsv41-flash-gb300-off60")
    summary = fetch_summary(twin, twin.recipe.lanes[0].name, streams=[1])
    (only,) = summary.classes
    point = only.points[0]
    # v14's off60: about 23% of picks cold (seeds: ~23% / 24%), against the measured ~24 ms k=5 step
    assert 0.21 < only.cold_share.overall < 0.25
    assert point.tax.share_of_step is not None and point.tax.share_of_step.operands[1].value == 24.0


def test_all_experts_in_hbm_has_no_fetch_tax():
    pp2 = load_recipe("dsv41-flash-gb300x2-pp2")
    summary = fetch_summary(pp2, "agent")
    assert summary.classes == [] and "fetch tax 0" in "\n".join(summary.lines())
