"""What a recipe asks of a host, from the ledger (the single source of budget figures)."""

from __future__ import annotations

from recipegen.errors import RecipegenError
from recipegen.ops.doctor import HostRequirement


def host_requirement(recipe: str) -> HostRequirement:
    try:
        from recipegen.ledger import compute_ledger  # noqa: F401
        from recipegen.recipe_io import load_recipe  # noqa: F401
    except ImportError:
        raise RecipegenError("doctor RECIPE needs the budget ledger, which this build lacks; "
                             "run `recipegen doctor` without a recipe") from None
    raise RecipegenError("doctor RECIPE: ledger figures not wired yet")
