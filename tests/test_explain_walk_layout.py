"""`check budgets --explain` figures redone from their printed operands: the positional walk's hot and
cold experts (the walk stops inside a layer, so whole counts × bytes per expert would miss), the
pipeline lane's whole-lane layouts, the concurrency warning's tokens per stream, and a stage's KV
tokens per GiB. Each recomputation is this file's own arithmetic on the printed text only.
"""

from __future__ import annotations

import json
import math
import re

import pytest
from cli_support import invoke
from test_explain_operands import ROOT, Printed, assert_reproduces, explain, figures, find_all, number

GIB = 2**30
WALK_RECIPES = ("glm-5-h200x8", "llama-4-scout-17b-16e-h100", "qwen3-235b-a22b-fp8-h200")
STREAM_RECIPES = ("dsv41-flash-gb300", "dsv41-flash-gb300-off60", "qwen3-next-80b-a3b-rtx5090")
PP = "dsv41-flash-gb300x2-pp2"


def _json(recipe: str) -> dict:
    result = invoke("check", "budgets", str(ROOT / "recipes" / f"{recipe}.yaml"), "--json")
    assert result.code in (0, 1), result.output
    return json.loads(result.output)


def _counted(fig: Printed) -> tuple[str, float] | None:
    """(count name, count) where a figure prints an expert count beside bytes_per_expert."""
    for name in ("cold_experts", "hot_experts"):
        if name in fig.operands and "bytes_per_expert" in fig.operands:
            return name, fig.op(name)
    return None


# ------------------------------------------------------------------------------------------
# the positional walk

@pytest.mark.parametrize("recipe", WALK_RECIPES)
def test_positional_walk_figures_redo_from_walk_bytes(recipe: str) -> None:
    """Every hot / cold experts figure redoes from what it prints: the walk's exact bytes, and the
    printed count × bytes_per_expert (÷ tp where printed), fractional where the walk stops in a layer."""
    figs = figures(explain(recipe))
    walked = [f for f in figs if "walk_bytes" in f.operands]
    assert walked, recipe
    fractional = 0
    for fig in walked:
        assert fig.formula.startswith(("walk bytes", "experts.total − walk bytes")), fig.formula
        walk = fig.op("walk_bytes")
        assert fig.operands["walk_bytes"].endswith(")") and " B (" in fig.operands["walk_bytes"]
        if fig.formula.startswith("walk bytes"):
            assert_reproduces(fig, walk)
            name = "cold_experts"
        else:
            assert_reproduces(fig, fig.op("experts_total_bytes") - walk)
            name = "hot_experts"
        count = fig.op(name)
        fractional += not count.is_integer()
        assert_reproduces(fig, count * fig.op("bytes_per_expert"))
    assert fractional, f"{recipe}: the walk stops inside a layer, so some count is fractional"
    # and no figure anywhere prints a count × bytes_per_expert it does not equal
    for fig in figs:
        counted = _counted(fig)
        if counted is not None:
            tp = fig.op("tp") if "tp" in fig.operands else 1
            assert_reproduces(fig, counted[1] * fig.op("bytes_per_expert") / tp)


def test_positional_walk_counts_as_printed() -> None:
    """The finding's numbers: the fractional counts the walk bytes give."""
    glm = [f for f in figures(explain("glm-5-h200x8")) if "walk_bytes" in f.operands]
    # 8 GPUs × 42 GiB walked = 336 GiB of 72 MiB experts = 4,778.67 (the walk stops after a w13)
    assert {f.operands["cold_experts"] for f in glm} == {"4778.67"}
    assert all(f.display == "336.00 GiB" for f in glm)
    qwen = figures(explain("qwen3-235b-a22b-fp8-h200"))
    hot = next(f for f in qwen if f.label == "hot experts in HBM (positional)")
    cold = next(f for f in qwen if f.label == "cold experts pinned in host (positional)")
    assert (hot.display, hot.operands["hot_experts"]) == ("95.27 GiB", "5418.67")
    assert (cold.display, cold.operands["cold_experts"]) == ("116.28 GiB", "6613.33")
    assert hot.op("hot_experts") + cold.op("cold_experts") == pytest.approx(94 * 128, abs=0.011)


# ------------------------------------------------------------------------------------------
# the pipeline lane's layouts

def _lane_figures(text: str) -> list[Printed]:
    block = text.split("\n  Lane figures:\n", 1)[1]
    return figures(block.split("\n  cost model:", 1)[0])


def _per_stage(fig: Printed, suffix: str) -> dict[int, float]:
    return {int(m.group(1)): fig.op(name) for name in fig.operands
            if (m := re.fullmatch(rf"stage(\d+)_{suffix}", name))}


def test_pipeline_layout_figures_redo_and_match_the_verdict_text() -> None:
    text = explain(PP)
    lane = _lane_figures(text)
    layouts = [line.strip() for line in text.splitlines()
               if line.startswith("    every ") and ("fits (" in line or "would not fit" in line)]
    assert len(layouts) == 2
    for line in layouts:
        name = line.split(" (this recipe)")[0].split(": ")[0]
        need = next(f for f in lane if f.label.startswith(f"{name}: weights + reserves"))
        caps = next(f for f in lane if f.label.startswith(f"{name}: HBM caps"))
        gpus = _per_stage(need, "gpus")
        reserve, hot = _per_stage(need, "reserve_bytes"), _per_stage(need, "hot_experts_bytes")
        assert set(gpus) == set(reserve) == set(hot) == {0, 1}
        assert_reproduces(need, sum((reserve[r] + hot[r]) * gpus[r] for r in gpus))
        cap = _per_stage(caps, "hbm_cap_bytes")
        assert_reproduces(caps, sum(cap[r] * _per_stage(caps, "gpus")[r] for r in cap))
        # the verdict text quotes these figures as printed
        assert f"weights + reserves {need.display} of HBM caps {caps.display}" in line
        short = [f for f in lane if f.label.startswith(f"{name}: short of HBM")]
        if "would not fit" in line:
            (fig,) = short
            over = 0.0
            for r in _per_stage(fig, "hbm_cap_bytes"):
                # −(hbm_cap − reserve − hot_experts …): every term other than the cap is taken from it
                taken = sum(fig.op(n) for n in fig.operands
                            if n.startswith(f"stage{r}_") and n.endswith("_bytes") and n != f"stage{r}_hbm_cap_bytes")
                over += taken - fig.op(f"stage{r}_hbm_cap_bytes")
            assert_reproduces(fig, over)
            assert f"would not fit, {fig.display} short" in line
            assert f"({fig.display} short; no layer split fits it: weights + reserves {need.display} > HBM caps " \
                   f"{caps.display})" in text
        else:
            assert not short


def test_pipeline_layout_figures_in_json() -> None:
    (recipe,) = _json(PP)["recipes"]
    (lane,) = recipe["lanes"]
    figs = lane["figures"]
    for layout in lane["layouts"]:
        key = {"every weight in HBM (experts and host tables)": "all_weights_in_hbm",
               "every expert in HBM, host tables in host": "experts_in_hbm"}[layout["name"]]
        assert figs[f"layout.{key}.weights_and_reserves"]["value"] == layout["weights_and_reserves_bytes"]
        assert figs[f"layout.{key}.hbm_caps"]["value"] == layout["hbm_cap_bytes"]
        if layout["fits"]:
            assert f"layout.{key}.shortfall" not in figs
        else:
            assert figs[f"layout.{key}.shortfall"]["value"] == layout["shortfall_bytes"]
            assert figs[f"layout.{key}.shortfall"]["unit"] == "bytes"


# ------------------------------------------------------------------------------------------
# the concurrency warning, a stage's tokens per GiB

@pytest.mark.parametrize("recipe", STREAM_RECIPES)
def test_tokens_per_stream_redo_and_match_the_warning(recipe: str) -> None:
    text = explain(recipe)
    (fig,) = find_all(figures(text), "KV tokens per stream at concurrency.max")
    per_stream = math.floor(fig.op("kv_tokens") / fig.op("streams"))
    assert fig.value == (per_stream, 0.5)
    (warning,) = [line for line in text.splitlines() if "fit only while they average" in line]
    streams = int(re.search(r"concurrency up to (\d+) streams", warning).group(1))
    assert streams == fig.op("streams")
    assert f"{streams} streams fit only while they average ≤ {per_stream:,} tokens each" in warning
    pool = find_all(figures(text), "KV pool in tokens")[0]
    assert_reproduces(pool, fig.op("kv_tokens"))
    (lane,) = _json(recipe)["recipes"][0]["lanes"]
    assert lane["figures"]["kv.tokens_per_stream"]["value"] == per_stream


def test_stage_kv_tokens_per_gib_prints_its_unit() -> None:
    text = explain(PP)
    stages = find_all(figures(text), "KV tokens per GiB for this stage's layers")
    assert len(stages) == 2
    for fig in stages:
        assert fig.display.endswith(" tokens/GiB"), fig.display
        assert fig.operands["kv_tokens_per_gib"].endswith(" tokens/GiB")
        value = number(fig.display)
        redone = fig.op("kv_tokens_per_gib") * fig.op("decoder_layers") / fig.op("stage_layers")
        assert abs(redone - value) <= 0.05 + 0.05 * fig.op("decoder_layers") / fig.op("stage_layers")
    (lane,) = _json(PP)["recipes"][0]["lanes"]
    for stage in lane["stages"]:
        assert stage["figures"]["stage.kv_tokens_per_gib"]["unit"] == "tokens/GiB"
