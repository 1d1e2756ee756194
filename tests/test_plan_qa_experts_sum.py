"""The decode estimate's routed-experts term adds up as printed: "hot a + cold b" only where the two
run one after the other (a positional lane; a usage-aware lane on a GPU of compute capability 10.x,
one launch per bank), and elsewhere "hot a and cold b overlapped", with the rule beside it.

The expected combination is read from the recipe (placement, the GPU's compute capability), not
from the estimate; the printed figures are parsed and the stated arithmetic checked on them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.load.recipe import load_recipe

# (recipe, lane): usage-aware on an RTX 5090 and on 8 × H200 (overlapped), positional on an L40S and
# usage-aware on a GB300 (one after the other).
LANES = [("qwen3-vl-30b-a3b-rtx5090", "chat"), ("deepseek-v3-fp8-h200x8", "chat"),
         ("gpt-oss-120b-l40s", "chat"), ("dsv41-flash-gb300", "agent")]
ROUNDING = 0.015   # two printed figures rounded to 0.01 ms each, against a third
STEP = re.compile(r"step (\d+\.\d+) ms = experts (\d+\.\d+) \(([^)]*)\) (\+ [^;]*); ")


def _serial(recipe: str, lane: str) -> bool:
    loaded = load_recipe(recipe)
    spec = loaded.recipe.lane(lane)
    cc = str(loaded.recipe.machines[spec.machine].gpus.compute_capability or "")
    return spec.offload.placement == "positional" or cc.startswith("10.")


def _plan(recipe: str, lane: str, *args: str) -> str:
    result = invoke("plan", recipe, lane, *args)
    assert result.code == 0, result.output
    return result.output


@pytest.mark.parametrize(("recipe", "lane"), LANES)
def test_experts_term_adds_up_as_printed(recipe, lane):
    text = _plan(recipe, lane)
    steps = [m for line in text.splitlines() if (m := STEP.search(line))]
    assert steps, text
    serial = _serial(recipe, lane)
    for m in steps:
        step, experts, inner, rest = float(m[1]), float(m[2]), m[3], m[4]
        # the step's own sum: experts + every other printed term
        others = [float(x) for x in re.findall(r"\+ [a-z ]+ (\d+\.\d+)", rest)]
        assert abs(experts + sum(others) - step) <= ROUNDING * (len(others) + 1), m[0]
        hot = float(re.search(r"hot (\d+\.\d+)", inner)[1])
        cold_m = re.search(r"cold (\d+\.\d+)", inner)
        assert cold_m, inner   # every lane here has cold experts
        cold = float(cold_m[1])
        if serial:
            assert re.fullmatch(r"hot \d+\.\d+ \+ cold \d+\.\d+", inner), inner
            assert abs(hot + cold - experts) <= ROUNDING, m[0]
        else:
            assert "+ cold" not in inner, f"a printed sum that does not add up: {m[0]}"
            assert "overlapped" in inner and "longer" in inner and "shorter" in inner, inner
            # per layer max(h, c) + ½ min(h, c), averaged: at least that of the totals, at most their sum
            assert max(hot, cold) + 0.5 * min(hot, cold) - ROUNDING <= experts <= hot + cold + ROUNDING, m[0]
            assert experts < hot + cold - ROUNDING, m[0]
    notes = [line for line in text.splitlines() if line.strip().startswith("note: experts:")]
    assert len(notes) == 1, text
    assert ("one after the other" in notes[0]) == serial, notes[0]


@pytest.mark.parametrize(("recipe", "lane"), LANES[::3])
def test_json_keeps_the_expert_terms_and_says_how_they_combine(recipe, lane):
    data = json.loads(_plan(recipe, lane, "--json"))
    serial = _serial(recipe, lane)
    for point in data["estimate"]["points"]:
        terms = point["terms"]
        for key in ("experts_ms", "hot_experts_ms", "cold_experts_ms", "step_ms"):
            assert key in terms
        assert terms["experts_combined"] == ("in sequence" if serial else "overlapped")
        if serial:
            assert terms["experts_ms"] == pytest.approx(terms["hot_experts_ms"] + terms["cold_experts_ms"])
        else:
            assert terms["experts_ms"] < terms["hot_experts_ms"] + terms["cold_experts_ms"]


def test_docs_quote_the_printed_terms():
    """docs/costmodel.md quotes one step line of each kind as `plan` prints it at C1."""
    doc = re.sub(r"\s+", " ", (Path(__file__).resolve().parent.parent / "docs" / "costmodel.md").read_text())
    for recipe, lane in (("dsv41-flash-gb300", "agent"), ("qwen3-vl-30b-a3b-rtx5090", "chat")):
        line = next(l for l in _plan(recipe, lane).splitlines() if l.strip().startswith("C1 k="))
        quoted = re.search(r"experts \d+\.\d+ \([^)]*\)", line)[0]
        assert f"`recipegen plan {recipe} {lane}` at C1: \"{quoted}\"" in doc, quoted
