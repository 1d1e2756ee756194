"""A lane whose placement keeps every routed expert in HBM is called "all in HBM" by `plan` and
`check budgets` (fetch tax header, decode estimate), as the ledger table and `new` / `fit` do; other
lanes keep their placement's name. The expected name is read from the ledger's own placement (its
cold experts per layer), not from the printing code."""

from __future__ import annotations

import json

import pytest
from cli_support import invoke

from recipegen.ledger import compute_ledger
from recipegen.load.recipe import load_recipe

# two lanes with nothing cold (positional at 0 GiB to vLLM), one positional, one usage-aware
RECIPES = ["qwen3-235b-a22b-nvfp4-b200", "deepseek-v3.2-h200x8", "gpt-oss-120b-l40s", "qwen3-vl-30b-a3b-rtx5090"]


def _expected(recipe: str) -> tuple[str, str, str]:
    """(lane, the placement the recipe declares, the name people should read)."""
    loaded = load_recipe(recipe)
    lane = compute_ledger(loaded).lanes[0]
    cold = sum(lane.active.cold_per_layer)
    return lane.lane, lane.placement, ("all in HBM" if cold == 0 else lane.placement)


def test_the_recipes_cover_both_cases():
    names = [_expected(r)[2] for r in RECIPES]
    assert names.count("all in HBM") == 2 and "positional" in names and "usage-aware" in names
    # the two all-in-HBM lanes are declared positional: the old label
    assert all(_expected(r)[1] == "positional" for r, n in zip(RECIPES, names) if n == "all in HBM")


@pytest.mark.parametrize("recipe", RECIPES)
def test_check_budgets_names_the_placement_as_the_ledger_table_does(recipe):
    lane, _, name = _expected(recipe)
    result = invoke("check", "budgets", recipe)
    assert result.code == 0, result.output
    lines = result.output.splitlines()
    header = next(l for l in lines if l.startswith(f"lane {lane} · "))
    assert header.endswith(f" · {name}")
    fetch = next(l for l in lines if "fetch tax (cold expert reads" in l)
    assert fetch.endswith(f"per decode step; {name}):"), fetch
    speed = next(l for l in lines if l.startswith(f"decode speed estimate · lane {lane}:"))
    assert speed.endswith(f", {name} (recipegen plan for the terms)"), speed


@pytest.mark.parametrize("recipe", RECIPES)
def test_plan_names_the_placement_as_the_ledger_table_does(recipe):
    lane, placement, name = _expected(recipe)
    result = invoke("plan", recipe, lane)
    assert result.code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1].startswith(f"  {name} ("), lines[1]
    fetch = next(l for l in lines if "fetch tax (cold expert reads" in l)
    assert fetch.endswith(f"per decode step; {name}):"), fetch
    data = json.loads(invoke("plan", recipe, lane, "--json").output)
    # JSON keeps the placement computed and adds the name people read
    assert data["estimate"]["placement"] == placement and data["estimate"]["placement_label"] == name
    assert data["fetch"]["placement"] == placement and data["fetch"]["placement_label"] == name
