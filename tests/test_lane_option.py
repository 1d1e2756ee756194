"""A lane name the recipe does not have: one refusal, whichever command took it (`LoadedRecipe.lane_at`
/ `no_lane_error`): the recipe's file, the argument or option that named it as the field, and the
recipe's lanes."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.common.errors import InputError
from recipegen.load.recipe import load_recipe

RECIPE = "dsv41-flash-gb300"
NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def _refusal(field: str, names: str = "lane 'nope'") -> str:
    return f"error: recipes/{RECIPE}.yaml: field '{field}': the recipe has no {names} (lanes: agent)\n"


def test_check_budgets_names_the_option_and_the_lanes(project: Path) -> None:
    result = invoke("check", "budgets", RECIPE, "--lane", "nope")
    assert (result.code, result.stderr) == (2, _refusal("--lane")), result.output
    result = invoke("check", "budgets", RECIPE, "--lane", "nope", "--lane", "agent", "--lane", "x")
    assert (result.code, result.stderr) == (2, _refusal("--lane", "lanes 'nope', 'x'")), result.output
    assert invoke("check", "budgets", RECIPE, "--lane", "agent").code == 0


@pytest.mark.parametrize("args, field", [
    (("plan", RECIPE, "nope"), "LANE"),
    (("fit", RECIPE, "nope", "--dry-run"), "LANE"),
    (("profile", RECIPE, "nope", "--serve", "5"), "LANE"),
    (("swap", RECIPE, "nope", "--class", "prose"), "LANE"),
    (("up", RECIPE, "nope"), "LANES"),
    (("verify", RECIPE, "nope"), "LANE"),
    (("drift", RECIPE, "nope"), "LANE"),
    (("rowmap", "save-live", RECIPE, "nope", "--class", "prose"), "LANE"),
    (("render", RECIPE, "--class", "nope=prose"), "--class"),
])
def test_every_command_that_takes_a_lane_refuses_alike(project: Path, args: tuple[str, ...], field: str) -> None:
    recipe_before = (project / "recipes" / f"{RECIPE}.yaml").read_bytes()
    result = invoke(*args, env=NO_DOCKER)
    assert (result.code, result.stderr) == (2, _refusal(field)), result.output
    assert (project / "recipes" / f"{RECIPE}.yaml").read_bytes() == recipe_before
    assert not (project / "compose").exists()


def test_up_names_every_unknown_lane(project: Path) -> None:
    result = invoke("up", RECIPE, "nope", "agent", "nope2", env=NO_DOCKER)
    assert (result.code, result.stderr) == (2, _refusal("LANES", "lanes 'nope', 'nope2'")), result.output


def test_the_resolver_itself(project: Path) -> None:
    loaded = load_recipe(RECIPE)
    assert loaded.lane_at("agent")[1].name == "agent"
    with pytest.raises(InputError) as caught:
        loaded.lane_at("nope", option="--lane")
    assert (caught.value.field, caught.value.file) == ("--lane", f"recipes/{RECIPE}.yaml")
    assert caught.value.message == "the recipe has no lane 'nope' (lanes: agent)"
