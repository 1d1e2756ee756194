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
              help="Write nothing; exit 1 if a committed manifest differs from what would be written "
                   "(prints `up to date: N recipes` when none does).")
def k8s(recipes: tuple[str, ...], check: bool) -> None:
    """Render the Kubernetes manifests of RECIPES' multi-node lanes (default: every recipe under
    recipes/). Every manifest is validated (kubernetes-validate for core kinds, the vendored
    LeaderWorkerSet CRD schema for the LWS) before anything is written. Each file is reported as
    `recipegen render` reports its files: new, changed, unchanged, or removed."""
    from recipegen.common.lock import recipe_lock
    from recipegen.common.units import format_count
    from recipegen.k8s.render import REMOVED, UNCHANGED, name_collisions, render_k8s, stale_files, write_k8s
    from recipegen.load.document import display_path
    from recipegen.load.recipe import load_recipe, resolve_recipe_path
    from recipegen.render.render import project_root_for

    stale_total = 0
    with_lanes = 0
    claimed: dict[str, str] = {}  # LeaderWorkerSet name -> recipe, across this run
    targets = _targets(recipes)
    for target in targets:
        with recipe_lock(resolve_recipe_path(target), echo=click.echo, readers_only=True):
            loaded = load_recipe(target)
            root = project_root_for(loaded.path)
            files = render_k8s(loaded, root)
            collisions = name_collisions(root, loaded.name, files, claimed)
            if collisions:
                raise RecipegenError("\n  ".join(collisions))
            claimed.update({f"{loaded.name}-{p.stem}": loaded.name for p in files})
            with_lanes += bool(files)
            if check:
                stale = stale_files(loaded, root, files)
                stale_total += len(stale)
                for line in stale:
                    click.echo(f"stale: {line} (run recipegen k8s {loaded.name})")
                continue
            if not files and recipes:
                click.echo(f"{loaded.name}: no lane spans machines; nothing to render")
            for path, status in write_k8s(loaded, root, files):
                if status == UNCHANGED:
                    click.echo(f"{display_path(path)}: unchanged")
                elif status == REMOVED:
                    click.echo(f"removed {display_path(path)} (no longer rendered)")
                else:
                    click.echo(f"wrote {display_path(path)}: {status}")
    if check:
        if stale_total:
            sys.exit(1)
        click.echo(f"up to date: {format_count(len(targets), 'recipe')} "
                   f"({with_lanes} with multi-node lanes)")


if __name__ == "__main__":  # until the root CLI maps `k8s` (recipegen/cli/__init__.py)
    try:
        k8s(standalone_mode=True)
    except RecipegenError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
