"""`recipegen rowmap save-live` on a lane without `offload.adaptive`: refused from the recipe, at the
lane's `offload` line, before any dump folder is looked for (README's example lane `agent` of the
reference recipe is not adaptive)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import invoke

RECIPE = "dsv41-flash-gb300"


def _offload_line(recipe: Path) -> int:
    return next(i for i, line in enumerate(recipe.read_text().splitlines(), 1) if line.strip() == "offload:")


def test_a_lane_without_offload_adaptive_is_refused_naming_lane_and_field(project: Path) -> None:
    recipe = project / "recipes" / f"{RECIPE}.yaml"
    maps = sorted(p.name for p in (project / "recipes" / "maps" / "dsv41-flash").iterdir())
    for extra in ((), ("--dump-dir", str(project / "dumps")), ("-o", str(project / "live.rowmap"))):
        result = invoke("rowmap", "save-live", RECIPE, "agent", "--class", "prose", *extra)
        assert result.code == 2, result.output
        assert result.stderr == (f"error: recipes/{RECIPE}.yaml:{_offload_line(recipe)}: field 'lanes[0].offload': "
                                 "lane agent has no offload.adaptive: save-live reads the live row map an "
                                 "adaptive lane writes (docs/adaptive.md)\n"), result.stderr
        assert "dump folder" not in result.output and "snapshot" not in result.output
    assert sorted(p.name for p in (project / "recipes" / "maps" / "dsv41-flash").iterdir()) == maps
    assert not (project / "live.rowmap").exists()


def test_the_library_call_refuses_it_too(project: Path) -> None:
    from recipegen.common.errors import InputError
    from recipegen.load.recipe import load_recipe
    from recipegen.ops.livemap import save_live

    with pytest.raises(InputError, match="lane agent has no offload.adaptive"):
        save_live(load_recipe(RECIPE), "agent", "prose", {}, where="dumps")
