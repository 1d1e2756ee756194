"""Where users see the decode estimate: `recipegen plan` and `recipegen check budgets`."""

from __future__ import annotations

import json

import pytest
from cli_support import invoke

from recipegen.common.errors import InputError
from recipegen.costmodel.lane_estimate import (
    FAR_BELOW,
    all_hbm_context,
    alternatives,
    band_text,
    default_streams,
    estimate_lane,
)
from recipegen.ledger import compute_ledger
from recipegen.load.recipe import load_recipe


def test_plan_json_carries_tokens_per_s_per_concurrency_with_its_band():
    result = invoke("plan", "dsv41-flash-gb300", "agent", "--json")
    assert result.code == 0, result.output
    data = json.loads(result.output)["estimate"]
    assert set(data["tokens_per_s"]) == {"1", "2", "4", "8", "16"}
    for streams, value in data["tokens_per_s"].items():
        lo, hi = data["tokens_per_s_band"][streams]
        assert lo < value < hi
    # one stream: 2.13 tokens per step (k=5, the reference DSpark acceptance) over the step's terms
    c1 = data["points"][0]
    assert c1["tokens_per_s"] == pytest.approx(c1["tokens_per_step"] / (c1["terms"]["step_ms"] / 1e3))
    assert c1["tokens_per_step"] == pytest.approx(2.13, abs=0.005)
    assert [a["name"] for a in data["alternatives"]] == ["positional"]


@pytest.mark.parametrize("lo, hi, text", [
    (22.4992, 29.4817, "22.4–29.5"),     # one decimal below 100 tok/s, each end rounded outwards
    (61.0, 80.0, "61.0–80.0"),           # an exact end stays put
    (152.3, 199.6, "152–200"),           # whole tok/s from 100 up
    (1499.2, 2000.4, "1,499–2,001"),
])
def test_a_printed_band_holds_the_computed_one(lo: float, hi: float, text: str) -> None:
    assert band_text(lo, hi) == text
    low, high = (float(x.replace(",", "")) for x in text.split("–"))
    assert low <= lo and high >= hi


def test_plan_prints_the_estimate_and_the_other_placement():
    result = invoke("plan", "gpt-oss-120b-l40s", "chat", "--context", "1024")
    assert result.code == 0, result.output
    out = result.output
    assert "decode speed estimate · lane chat" in out and "1,024 tokens of KV per sequence" in out
    assert "C1 k=0:" in out and "C2 k=0:" in out
    assert "instead, usage-aware residency at the same host budget" in out


def test_plan_options_change_the_estimate():
    def c1(*args):
        out = invoke("plan", "dsv41-flash-gb300", "agent", "--json", "--concurrency", "1", *args)
        assert out.code == 0, out.output
        return json.loads(out.output)["estimate"]["points"][0]
    base, longer, sure = c1(), c1("--context", "262144"), c1("--acceptance", "0.9")
    assert longer["terms"]["attention_ms"] > base["terms"]["attention_ms"]
    # α = 0.9, k = 5: (1 - 0.9^6) / 0.1 tokens per step
    assert sure["tokens_per_step"] == pytest.approx((1 - 0.9 ** 6) / 0.1)
    bad = invoke("plan", "dsv41-flash-gb300", "agent", "--acceptance", "1.5")
    assert bad.code == 2


def test_plan_class_estimates_that_class_and_refuses_an_unknown_one():
    bad = invoke("plan", "dsv41-flash-gb300", "agent", "--class", "nope")
    assert bad.code == 2 and "--class" in bad.output and "agent, prose, math" in bad.output
    assert "Traceback" not in bad.output
    out = invoke("plan", "dsv41-flash-gb300", "agent", "--class", "prose")
    assert out.code == 0, out.output
    assert "class prose on its own histogram and row map" in out.output
    assert "histogram profiles/dsv41-flash/prose.hist" in out.output and "agent.hist" not in out.output.split("fetch tax")[0]
    # the alternatives are estimated for the same class
    loaded = load_recipe("dsv41-flash-gb300")
    (positional,) = [a for a in alternatives(loaded, "agent", traffic_class="prose") if a.name == "positional"]
    assert any("prose.hist" in n for n in positional.estimate.notes)


def test_the_alternatives_share_the_lanes_context_and_acceptance():
    loaded = load_recipe("dsv41-flash-gb300")
    (long,) = [a for a in alternatives(loaded, "agent", streams=[1, 16], context=262_144, acceptance=0.7)
               if a.name == "positional"]
    direct = estimate_lane(loaded, "agent", placement="positional", streams=[1, 16], context=262_144, acceptance=0.7)
    (short,) = [a for a in alternatives(loaded, "agent", streams=[1, 16]) if a.name == "positional"]
    assert long.estimate.tokens_per_s == direct.tokens_per_s
    assert long.estimate.context == 262_144 and long.estimate.tokens_per_s[16] != short.estimate.tokens_per_s[16]
    assert "--cpu-offload-gb 60 alone" in long.description      # the flag it is, not 'the same budget'


def test_streams_whose_kv_exceeds_the_pool_are_named():
    loaded = load_recipe("dsv41-flash-gb300")
    pool = compute_ledger(loaded).lane("agent").usage_aware.figures["kv.tokens"].value
    context = 1_048_576
    assert 2 * context <= pool < 3 * context        # two full sequences fit, three do not
    est = estimate_lane(loaded, "agent", streams=[1, 2, 3], context=context)
    (warning,) = [w for w in est.warnings if "exceeds the KV pool" in w]
    assert warning.startswith("at C3 the streams' KV")
    assert not any("exceeds the KV pool" in w for w in estimate_lane(loaded, "agent", streams=[1, 2],
                                                                      context=context).warnings)


def test_a_placement_that_leaves_no_kv_is_not_offered():
    # the reference lane with a 2 GiB load-time offload: vLLM's flag alone would keep ~266 GiB of
    # experts in HBM, more than the 243 GiB cap, so the positional column has no KV pool
    loaded = load_recipe("dsv41-flash-gb300")
    lane = loaded.recipe.lanes[0]
    loaded.recipe.lanes[0] = lane.model_copy(update={"offload": lane.offload.model_copy(
        update={"load_cpu_offload": 2 * 1024 ** 3})})
    ledger = compute_ledger(loaded)
    positional = ledger.lane("agent").positional
    assert positional is not None and positional.figures["hbm.kv_pool"].value < 0
    assert "positional" not in [a.name for a in alternatives(loaded, "agent", ledger=ledger)]
    from recipegen.ledger.report_lane import render_lane
    text = render_lane(ledger.lane("agent"))
    assert "positional at --cpu-offload-gb 2 (the lane's load offload): does not fit" in text
    assert "shown for comparison only" in text
    # the reference itself (60 GiB) fits both ways and says nothing of the kind
    assert "does not fit" not in render_lane(compute_ledger(load_recipe("dsv41-flash-gb300")).lane("agent"))



def test_a_lane_without_a_positional_placement_says_why_its_column_is_empty():
    from recipegen.ledger.report_lane import render_lane
    lane = compute_ledger(load_recipe("deepseek-v3-fp8-h200x8")).lane("chat")
    assert lane.positional is None and lane.placement == "usage-aware"
    text = render_lane(lane)
    assert "positional: — the lane loads every routed expert into HBM (no --cpu-offload-gb at load)" in text
    assert "no positional placement to compare" not in render_lane(
        compute_ledger(load_recipe("dsv41-flash-gb300")).lane("agent"))


def test_a_measured_share_prints_as_a_percentage_like_every_other_share():
    from recipegen.ledger.report_lane import render_lane
    text = render_lane(compute_ledger(load_recipe("dsv41-flash-gb300")).lane("agent"), explain=True)
    # the recipe's measured positional cold-pick share (0.23 in the field report) as % not a fraction
    assert "share of routed picks on host experts (measured) = 23%" in text

def test_check_budgets_warns_about_a_far_faster_placement_but_keeps_its_verdict():
    plain = invoke("check", "budgets", "gpt-oss-120b-l40s")
    assert "decode speed estimate · lane chat" in plain.output
    assert "warning: estimated" in plain.output and "below usage-aware residency at the same host budget" in plain.output
    data = json.loads(invoke("check", "budgets", "gpt-oss-120b-l40s", "--json").output)
    lane = data["recipes"][0]["lanes"][0]
    assert lane["ok"] == data["ok"]                     # the verdict is the ledger's alone
    assert lane["estimate"]["warnings"] and lane["estimate"]["tokens_per_s"]["1"] > 0
    # no warning where nothing computable is faster by FAR_BELOW
    quiet = invoke("check", "budgets", "dsv41-flash-gb300")
    assert "decode speed estimate · lane agent" in quiet.output and "warning: estimated" not in quiet.output


def test_a_warning_means_the_alternative_is_that_much_faster():
    loaded = load_recipe("gpt-oss-120b-l40s")
    base = estimate_lane(loaded, "chat")
    (usage,) = [a for a in alternatives(loaded, "chat") if a.name == "usage-aware"]
    assert usage.estimate.tokens_per_s[1] >= FAR_BELOW * base.tokens_per_s[1]
    # the same bytes moved: positional reads whole layers over PCIe, usage-aware only the cold tail
    assert usage.estimate.point(1).terms.cold_bytes < base.point(1).terms.cold_bytes


def test_all_in_hbm_alternative_at_a_shorter_context():
    loaded = load_recipe("deepseek-v3-fp8-h200x8")
    lane = loaded.recipe.lanes[0]
    # every expert fits beside the KV of one 65,536-token sequence on 8 x H200 (the lane offloads
    # some anyway): the alternative keeps the lane's context
    assert all_hbm_context(loaded, lane.name) == lane.max_model_len == 65_536
    names = {a.name: a for a in alternatives(loaded, lane.name, ledger=compute_ledger(loaded))}
    assert "max_model_len 65,536" in names["all-in-hbm"].description
    assert names["all-in-hbm"].estimate.point(1).terms.cold_experts == 0
    # at 1M tokens it does not fit: the longest context that does is offered, halved from 1M
    loaded.recipe.lanes[0] = lane.model_copy(update={"max_model_len": 1_048_576})
    shorter = all_hbm_context(loaded, lane.name)
    assert shorter is not None and 65_536 <= shorter < 1_048_576 and 1_048_576 % shorter == 0


def test_fit_and_compare_api_what_ifs():
    loaded = load_recipe("qwen3-30b-a3b-rtx4090")
    more_hot = estimate_lane(loaded, "chat", hot_per_layer=60, streams=[1])
    now = estimate_lane(loaded, "chat", streams=[1])
    assert more_hot.tokens_per_s[1] > now.tokens_per_s[1]
    assert more_hot.hot_per_layer == "60" and now.hot_per_layer == "20"
    with pytest.raises(InputError, match="hot experts per layer"):
        estimate_lane(loaded, "chat", hot_per_layer=129)
    assert default_streams(16) == [1, 2, 4, 8, 16] and default_streams(6) == [1, 2, 4, 6]
    assert default_streams(1) == [1]


def test_positional_fetch_line_reads_as_words():
    result = invoke("check", "budgets", "qwen3-next-80b-a3b-rtx5090")
    assert result.code == 0, result.output
    out = result.output
    # 128 GiB of 3 GiB layers: 42 whole layers, then the 43rd's 2 GiB w13 reaches the budget
    assert ("the experts of 42 of 48 MoE layers (and part of 1 more) sit in host memory (vLLM's "
            "--cpu-offload-gb walk takes whole layers in load order; the router's choices play no part), so "
            f"all traffic reads {(42 + 2 / 3) / 48:.2%} of its routed picks over the link; C1 k=0:") in out
    assert "(all traffic) (active)" not in out and "on the active map" not in out


@pytest.mark.parametrize("recipe", ["qwen3-30b-a3b-rtx4090", "qwen3-vl-30b-a3b-rtx5090", "llama-4-scout-17b-16e-h100",
                                    "gpt-oss-120b-l40s"])
def test_one_token_cold_reads_agree_with_the_fetch_arithmetic(recipe):
    """At one stream and k = 0 two modules count a step's cold experts their own way — the fetch
    tax as the field reports do (top_k picks × the layer's cold share), the decode estimate from
    each cold expert's chance to be touched — and must agree: for one token both are exact."""
    from recipegen.costmodel.lane import fetch_summary

    loaded = load_recipe(recipe)
    lane = loaded.recipe.lanes[0]
    estimate = estimate_lane(loaded, lane.name, streams=[1], k=0)
    fetch = fetch_summary(loaded, lane.name, streams=[1])
    (active,) = [c for c in fetch.classes if c.active]
    assert active.points[0].k == 0
    fetch_bytes = active.points[0].tax.cold_bytes.value
    assert fetch_bytes > 0
    assert estimate.point(1).terms.cold_bytes == pytest.approx(fetch_bytes, rel=1e-6)


def test_the_positional_column_counts_the_part_layer_its_walk_offloads():
    from recipegen.ledger.report_lane import render_lane
    # Qwen3-VL on an RTX 5090 at --cpu-offload-gb 26: a layer's routed experts are 128 x 9,437,184 B =
    # 1.125 GiB; 23 whole layers are 25.875 GiB, under 26, so the walk also takes layer 24's w13
    # (2/3 of it, 0.75 GiB) before it stops: 26.625 GiB in host. (The committed recipe loads with 28
    # since the RTX 5090's driver reservation and the worker's CUDA context are counted: there the walk
    # takes 24 whole layers, 27.0 GiB, then layer 25's w13 (27.75, still under 28) and w2 (28.125), so
    # 25 whole layers; the part layer is checked on a copy at 26.)
    loaded = load_recipe("qwen3-vl-30b-a3b-rtx5090")
    lane = loaded.recipe.lanes[0]
    loaded.recipe.lanes[0] = lane.model_copy(update={"offload": lane.offload.model_copy(
        update={"load_cpu_offload": 26 * 1024 ** 3})})
    lane = compute_ledger(loaded).lane("chat")
    assert lane.positional is not None and lane.positional.figures["host.cold_experts"].value == 26.625 * 2**30
    assert "all 128 cold in 23 layers + 0.75 GiB of the next" in render_lane(lane)
    committed = compute_ledger(load_recipe("qwen3-vl-30b-a3b-rtx5090")).lane("chat")
    assert committed.positional.figures["host.cold_experts"].value == 25 * 1.125 * 2**30
    assert "all 128 cold in 25 layers" in render_lane(committed)
