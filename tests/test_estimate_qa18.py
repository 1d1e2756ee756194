"""QA18 (the planner's consistency sweep): every decode-speed figure `plan` and `check budgets` print
carries its validation band, in text and in --json; a positional lane says where its experts sit;
a warning prints as a warning; speculation slower than none is said; the band's header says it is
rounded outward and holds at the stated acceptance.

Expected bands are computed here from the point figure and the band multipliers the lane's own JSON
shows at the same concurrency (same machine, no unmeasured kernels on these lanes), and printed
with this file's own outward rounding."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
from cli_support import CliResult, invoke

from recipegen.costmodel.lane_estimate import Alternative, estimate_lane, speed_warnings
from recipegen.ledger import compute_ledger
from recipegen.load.recipe import load_recipe

REPO = Path(__file__).resolve().parent.parent


def run(*args: str, code: int = 0) -> CliResult:
    result = invoke(*args)
    assert result.code == code, result.output
    return result


def plan_json(*args: str) -> dict:
    return json.loads(run("plan", *args, "--json").stdout)["estimate"]


def printed_band(lo: float, hi: float) -> str:
    """A band as people read it: low end down, high end up; 0.1 tok/s below 100 tok/s, whole above."""
    if hi < 100:
        low, high = math.floor(lo * 10 + 1e-9) / 10, math.ceil(hi * 10 - 1e-9) / 10
        return f"{low:,.1f}–{high:,.1f}"
    return f"{math.floor(lo + 1e-9):,.0f}–{math.ceil(hi - 1e-9):,.0f}"


def multipliers(estimate: dict) -> dict[str, tuple[float, float]]:
    """Per concurrency, the lane's band ÷ its point figure (the validation's multipliers there)."""
    out = {}
    for s, v in estimate["tokens_per_s"].items():
        lo, hi = estimate["tokens_per_s_band"][s]
        out[s] = (lo / v, hi / v)
    for p in estimate["points"]:
        assert p["terms"]["unmeasured_ms"] == 0      # else the band's low end would differ per placement
    return out


# --- 1. the alternatives and check budgets carry their bands ------------------------------------

def test_plan_prints_each_alternative_with_its_band_in_text_and_json():
    data = plan_json("dsv41-flash-gb300-off60")
    mult = multipliers(data)
    (alt,) = data["alternatives"]
    assert alt["name"] == "usage-aware"
    assert set(alt["tokens_per_s_band"]) == set(alt["tokens_per_s"]) == set(data["tokens_per_s"])
    expected = []
    for s, v in alt["tokens_per_s"].items():
        lo, hi = v * mult[s][0], v * mult[s][1]
        assert alt["tokens_per_s_band"][s] == pytest.approx([lo, hi])
        expected.append(f"C{s} {v:,.1f} ({printed_band(lo, hi)})")
    text = run("plan", "dsv41-flash-gb300-off60").stdout
    assert f"  instead, usage-aware residency at the same host budget: {', '.join(expected)} tok/s" in text.splitlines()


def test_every_instead_line_has_a_band_at_every_concurrency():
    for recipe in ("dsv41-flash-gb300", "gpt-oss-120b-l40s", "deepseek-v3-fp8-h200x8"):
        lines = [l for l in run("plan", recipe).stdout.splitlines() if l.startswith("  instead, ")]
        assert lines, recipe
        for line in lines:
            figures = re.findall(r"C\d+ [\d,.]+( \([\d,.]+–[\d,.]+\))?", line.split(": ", 1)[1])
            assert figures and all(figures), line


def test_check_budgets_json_estimate_carries_the_band():
    data = json.loads(run("check", "budgets", "dsv41-flash-gb300", "--json").stdout)
    estimate = data["recipes"][0]["lanes"][0]["estimate"]
    mult = multipliers(plan_json("dsv41-flash-gb300", "agent"))
    assert set(estimate["tokens_per_s_band"]) == set(estimate["tokens_per_s"])
    for s, v in estimate["tokens_per_s"].items():
        assert estimate["tokens_per_s_band"][s] == pytest.approx([v * mult[s][0], v * mult[s][1]])
    for alt in estimate["alternatives"]:
        for s, v in alt["tokens_per_s"].items():
            assert alt["tokens_per_s_band"][s] == pytest.approx([v * mult[s][0], v * mult[s][1]])
    # the text prints the same band the JSON carries
    text = run("check", "budgets", "dsv41-flash-gb300").stdout
    lo, hi = estimate["tokens_per_s_band"]["1"]
    assert f"C1 {estimate['tokens_per_s']['1']:,.1f} tok/s (validation band {printed_band(lo, hi)})" in text


def test_check_budgets_warning_carries_both_bands(project: Path):
    off60 = project / "recipes" / "dsv41-flash-gb300-off60.yaml"
    text = off60.read_text().replace("load_cpu_offload: 60 GiB", "load_cpu_offload: 150 GiB")
    (project / "recipes" / "off150.yaml").write_text(text.replace("name: dsv41-flash-gb300-off60", "name: off150"))
    # over its host budget (exit 1): the speed figures are printed all the same
    estimate = json.loads(run("check", "budgets", "off150", "--json", code=1).stdout)["recipes"][0]["lanes"][0][
        "estimate"]
    (alt,) = [a for a in estimate["alternatives"] if a["name"] == "usage-aware"]
    ours, theirs = estimate["tokens_per_s"]["1"], alt["tokens_per_s"]["1"]
    assert theirs / ours >= 1.5
    ours_band, theirs_band = estimate["tokens_per_s_band"]["1"], alt["tokens_per_s_band"]["1"]
    assert ours_band[1] < theirs_band[0]                       # these two do not overlap
    expected = (f"estimated {ours:,.1f} tok/s at C1, {theirs / ours:.1f}x below usage-aware residency at the same "
                f"host budget ({theirs:,.1f} tok/s); validation bands {printed_band(*ours_band)} and "
                f"{printed_band(*theirs_band)} tok/s do not overlap")
    assert estimate["warnings"] == [expected]
    assert f"  warning: {expected} (the memory verdict above is unchanged)" in run(
        "check", "budgets", "off150", code=1).stdout.splitlines()


def test_a_speed_warning_whose_bands_overlap_says_the_band_does_not_support_it():
    loaded = load_recipe("dsv41-flash-gb300")
    base = estimate_lane(loaded, "agent", streams=[1, 16])
    # an alternative as fast at one stream and 1.6x faster at sixteen, where the band is [0.83, 1.58]
    scaled = [dataclasses.replace(p, tokens_per_step=p.tokens_per_step * (1.6 if p.streams == 16 else 1.0))
              for p in base.points]
    alt = Alternative("what-if", "a what-if", dataclasses.replace(base, points=scaled))
    (warning,) = speed_warnings(base, [alt])
    lo16, hi16 = base.point(16).tokens_per_s_band
    assert warning.startswith(f"estimated {base.tokens_per_s[16]:,.1f} tok/s at C16, 1.6x below a what-if")
    assert warning.endswith(f"validation bands {printed_band(lo16, hi16)} and {printed_band(lo16 * 1.6, hi16 * 1.6)} "
                            "tok/s overlap, so the validation does not support the 1.6x: the two may run at the "
                            "same speed")


# --- 2. where a lane's experts sit, in words and in JSON ----------------------------------------

def _host_layers(recipe: str) -> tuple[int, int, int]:
    loaded = load_recipe(recipe)
    lane = compute_ledger(loaded).lanes[0]
    n = loaded.recipe.model.routed_experts
    cold = lane.positional.cold_per_layer
    return sum(1 for c in cold if c == n), sum(1 for c in cold if 0 < c < n), len(cold)


def test_a_positional_lane_says_which_layers_sit_in_host_memory():
    whole, partial, total = _host_layers("dsv41-flash-gb300-off60")
    # the ledger's walk; the field report's "roughly the first nine MoE layers' worth of experts in Grace"
    assert (whole, partial, total) == (9, 0, 40)
    text = run("plan", "dsv41-flash-gb300-off60").stdout
    assert text.splitlines()[1].startswith(f"  positional (whole MoE layers: the experts of {whole} of {total} MoE "
                                           "layers in host memory), 4,096 tokens of KV per sequence")
    assert "0–384" not in text
    data = plan_json("dsv41-flash-gb300-off60")
    assert data["hot_experts_per_layer"] is None and data["hot_per_layer"] == "0–384"
    assert data["moe_layers_in_host_memory"] == {"whole": whole, "partial": partial, "moe_layers": total}
    assert data["residency"] == f"whole MoE layers: the experts of {whole} of {total} MoE layers in host memory"
    # a layer the walk cut through is named as such
    whole, partial, total = _host_layers("qwen3-next-80b-a3b-rtx5090")
    assert partial == 1
    line = run("plan", "qwen3-next-80b-a3b-rtx5090").stdout.splitlines()[1]
    assert line.startswith(f"  positional (whole MoE layers: the experts of {whole} of {total} MoE layers (and part "
                           "of 1 more) in host memory)")


def test_hot_experts_per_layer_is_an_int_where_one_count_holds():
    loaded = load_recipe("dsv41-flash-gb300")
    (hot,) = set(compute_ledger(loaded).lane("agent").usage_aware.hot_per_layer)
    data = plan_json("dsv41-flash-gb300", "agent")
    assert data["hot_experts_per_layer"] == hot == 295 and isinstance(data["hot_experts_per_layer"], int)
    assert data["moe_layers_in_host_memory"] is None
    # a positional lane with nothing cold: every expert in HBM
    routed = load_recipe("qwen3-235b-a22b-nvfp4-b200").recipe.model.routed_experts
    data = plan_json("qwen3-235b-a22b-nvfp4-b200")
    assert data["placement_label"] == "all in HBM" and data["hot_experts_per_layer"] == routed
    # the attribute fit and the tests read keeps its text
    assert estimate_lane(loaded, "agent", streams=[1]).hot_per_layer == "295"


# --- 3. a warning prints as a warning -------------------------------------------------------------

def test_kv_over_the_pool_is_a_warning_in_text_and_json():
    loaded = load_recipe("dsv41-flash-gb300")
    pool = compute_ledger(loaded).lane("agent").usage_aware.figures["kv.tokens"].value
    context = 1_048_576
    over = [s for s in (1, 2, 4, 8, 16) if s * context > pool]
    assert over and over[0] > 1          # one stream fits, some concurrency does not: both sides are tested
    head = f"at C{', C'.join(map(str, over))} the streams' KV ({context:,} tokens each) exceeds the KV pool"
    text = run("plan", "dsv41-flash-gb300", "agent", "--context", str(context)).stdout
    assert "note: warning:" not in text
    assert [l for l in text.splitlines() if l.startswith(f"  warning: {head}")]
    data = plan_json("dsv41-flash-gb300", "agent", "--context", str(context))
    assert [w for w in data["warnings"] if w.startswith(head)]
    assert not [n for n in data["notes"] if "exceeds the KV pool" in n]
    assert plan_json("dsv41-flash-gb300", "agent")["warnings"] == []


# --- 4. speculation slower than none ---------------------------------------------------------------

def test_an_acceptance_that_makes_speculation_slower_than_none_draws_a_warning(project: Path):
    recipe = (project / "recipes" / "dsv41-flash-gb300.yaml").read_text()
    plain = re.sub(r"\n    speculative:\n.*?(?=\n    reserves:)", "", recipe, flags=re.S)
    assert "speculative:" not in plain
    (project / "recipes" / "dsv41-k0.yaml").write_text(plain.replace("name: dsv41-flash-gb300\n", "name: dsv41-k0\n"))
    k0 = plan_json("dsv41-k0", "agent")
    spec = plan_json("dsv41-flash-gb300", "agent", "--acceptance", "0.0")
    c1 = spec["points"][0]
    assert (c1["streams"], c1["k"]) == (1, 5) and c1["tokens_per_step"] == pytest.approx(1.0)
    assert k0["points"][0]["k"] == 0 and k0["tokens_per_s"]["1"] > spec["tokens_per_s"]["1"]
    figures = (f"C1 k=5 {spec['tokens_per_s']['1']:,.1f} tok/s ({printed_band(*spec['tokens_per_s_band']['1'])}) "
               f"against k=0 {k0['tokens_per_s']['1']:,.1f} ({printed_band(*k0['tokens_per_s_band']['1'])})")
    (warning,) = [w for w in spec["warnings"] if w.startswith("speculation is estimated slower than none")]
    assert "at acceptance 0.0000" in warning and figures in warning
    assert warning.endswith("without speculation (k=0) it is faster at that acceptance")
    text = run("plan", "dsv41-flash-gb300", "agent", "--acceptance", "0.0").stdout
    assert [l for l in text.splitlines() if l.startswith("  warning: speculation is estimated slower") and figures in l]
    # the estimate itself keeps the lane's k
    assert [p["k"] for p in spec["points"]] == [5] * len(spec["points"])


def test_at_the_lanes_own_acceptance_speculation_draws_no_warning():
    data = plan_json("dsv41-flash-gb300", "agent")
    assert not [w for w in data["warnings"] if "speculation" in w]
    assert data["tokens_per_s"]["1"] > plan_json("dsv41-flash-gb300", "agent", "--acceptance", "0.0")["tokens_per_s"]["1"]
    # a lane without speculation has nothing to compare
    assert not [n for n in plan_json("gpt-oss-120b-l40s")["notes"] if "k=0" in n]
    # off60's k=0 estimate is a little above its k=5 one (103.5 against 102.0 at C1), inside each other's
    # bands: the validation cannot tell them apart, so nothing is said either way
    off60 = plan_json("dsv41-flash-gb300-off60", "agent")
    assert not [w for w in off60["warnings"] + off60["notes"] if "k=0" in w]


# --- 5. what the band is ---------------------------------------------------------------------------

def test_the_header_says_the_band_is_rounded_outward_and_holds_at_the_stated_acceptance():
    head = run("plan", "dsv41-flash-gb300", "agent").stdout.splitlines()[0]
    assert "in parentheses the band the validation justifies, rounded outward" in head
    assert "it holds at the draft acceptance stated below: traffic whose drafts are accepted more or less often " \
           "runs outside it" in head
    # no speculation: the acceptance plays no part, the header does not mention it
    plain = run("plan", "gpt-oss-120b-l40s").stdout
    assert "rounded outward" in plain.splitlines()[0] and "acceptance" not in plain.splitlines()[0]
    # the header explains the band, so the shorthand block does not repeat the glossary's entry
    assert "validation band:" not in plain


def test_costmodel_quotes_what_plan_and_check_budgets_print(project: Path):
    doc = re.sub(r"\s+", " ", (REPO / "docs" / "costmodel.md").read_text(encoding="utf-8"))
    off60 = run("plan", "dsv41-flash-gb300-off60").stdout
    instead = re.search(r"instead, usage-aware residency at the same host budget: (C1 \S+ \(\S+\), C2 \S+ \(\S+\))", off60)
    assert instead and f"usage-aware residency at the same host budget: {instead[1]}, … tok/s" in doc
    c1 = re.search(r"C1 k=5: (\S+) tok/s (\(\S+\))", off60)
    assert c1 and f"ran 129.8 tok/s (\"vLLM: Pin Hot Experts\", held-out workloads) against {c1[1]} {c1[2]} " \
                  "estimated at C1" in doc
    line = re.search(r"(C1 k=5 \S+ tok/s \(\S+\) against k=0 \S+ \(\S+\))",
                     run("plan", "dsv41-flash-gb300", "agent", "--acceptance", "0.0").stdout)
    assert line and line[1] in doc
    positional = re.search(r"positional \(whole MoE layers: [^)]*\)", off60)
    assert positional and positional[0] in doc
    text = (project / "recipes" / "dsv41-flash-gb300-off60.yaml").read_text()
    (project / "recipes" / "off150.yaml").write_text(
        text.replace("load_cpu_offload: 60 GiB", "load_cpu_offload: 150 GiB").replace(
            "name: dsv41-flash-gb300-off60", "name: off150"))
    warning = re.search(r"warning: (estimated .*? do not overlap)", run("check", "budgets", "off150", code=1).stdout)
    assert warning and warning[1] in doc


def test_a_tensor_parallel_lane_says_beside_its_bands_what_they_leave_out():
    # the QA saw `plan` print a bare "(847–1,166)" on a TP-8 lane's step line, the caveat only in a note
    # further down; the lane's line above its bands now says it, as `new` and `compare` do on theirs
    data = plan_json("deepseek-v3-fp8-h200x8")
    assert data["tensor_parallel_caveat"] and "8 GPUs" in data["tensor_parallel_caveat"]
    placement_line = run("plan", "deepseek-v3-fp8-h200x8").stdout.splitlines()[1]
    assert placement_line.endswith(f"; {data['tensor_parallel_caveat']}:"), placement_line
    one_gpu = run("plan", "gpt-oss-120b-l40s").stdout.splitlines()[1]
    assert one_gpu.endswith("tokens of KV per sequence:") and "all-reduces" not in one_gpu
