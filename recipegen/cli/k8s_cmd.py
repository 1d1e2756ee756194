"""`recipegen k8s`: Kubernetes manifests (LeaderWorkerSet + Service) of the multi-node lanes of
recipes, `k8s/<recipe>/<lane>.yaml`, validated against real schemas (thin layer over recipegen.k8s)."""

from __future__ import annotations

import sys

import click

from recipegen.common.errors import RecipegenError


def _targets(recipes: tuple[str, ...]) -> list[str]:
    if recipes:
        return list(recipes)
    from recipegen.load.recipe import list_recipes

    return [str(p) for p in list_recipes()]


@click.command()
@click.argument("recipes", nargs=-1)
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 if a committed manifest differs from what would be written.")
def k8s(recipes: tuple[str, ...], check: bool) -> None:
    """Render the Kubernetes manifests of RECIPES' multi-node lanes (default: every recipe under
    recipes/). Every manifest is validated (kubernetes-validate for core kinds, the vendored
    LeaderWorkerSet CRD schema for the LWS) before anything is written."""
    from recipegen.k8s.render import render_k8s, stale_files, write_files
    from recipegen.load.document import display_path
    from recipegen.load.recipe import load_recipe
    from recipegen.render.render import project_root_for

    stale_total = 0
    for target in _targets(recipes):
        loaded = load_recipe(target)
        files = render_k8s(loaded, project_root_for(loaded.path))
        if not files:
            if recipes:
                click.echo(f"{loaded.name}: no lane spans machines; nothing to render")
            continue
        if check:
            stale = stale_files(files)
            stale_total += len(stale)
            for path in stale:
                click.echo(f"stale: {display_path(path)} (run recipegen k8s {loaded.name})")
            continue
        for path in write_files(files):
            click.echo(f"wrote {display_path(path)}")
    if check and stale_total:
        sys.exit(1)


if __name__ == "__main__":  # until the root CLI maps `k8s` (recipegen/cli/__init__.py)
    try:
        k8s(standalone_mode=True)
    except RecipegenError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
