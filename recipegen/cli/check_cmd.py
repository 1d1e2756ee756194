"""`recipegen check recipe` and `recipegen check budgets`: validate recipes, show the budget ledger.

Exit codes: 0 all valid / all budgets hold; 1 a budget is exceeded; 2 an invalid recipe.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from recipegen.common.errors import RecipegenError

EXIT_OK, EXIT_OVER_BUDGET, EXIT_INVALID = 0, 1, 2


@click.group()
def check() -> None:
    """Validate recipes and their budgets before anything boots."""


def _targets(recipes: tuple[str, ...]) -> list[str]:
    if recipes:
        return list(recipes)
    from recipegen.load.recipe import list_recipes, recipe_search_dirs

    found = [str(p) for p in list_recipes()]
    if not found:
        raise RecipegenError(f"no recipes found under {recipe_search_dirs()[0]}")
    return found


@check.command("recipe")
@click.argument("recipes", nargs=-1)
def check_recipe(recipes: tuple[str, ...]) -> None:
    """Validate RECIPES (paths or names under recipes/; default: all of them).

    Every problem is reported with file, line and field; exit 2 if any recipe is invalid.
    """
    from recipegen.load.document import display_path
    from recipegen.load.recipe import load_recipe
    from recipegen.render.render import refuse_shared_name
    from recipegen.render.services import hub_checkpoint_note

    failed = 0
    for target in _targets(recipes):
        try:
            loaded = load_recipe(target)
            refuse_shared_name(loaded)   # two recipes of one name would render into one folder
        except RecipegenError as exc:
            click.echo(f"error: {exc}", err=True)
            failed += 1
            continue
        r = loaded.recipe
        lanes = "; ".join(
            f"lane {lane.name} ({lane.offload.placement}"
            + (f", class {lane.active_class} of {'/'.join(lane.classes)}" if lane.active_class else "")
            + f", {lane.machine} GPU {','.join(map(str, lane.gpus))}, port {lane.port})"
            for lane in r.lanes)
        click.echo(f"ok  {display_path(loaded.path)}: {r.name}, model {r.model.name}; {lanes}")
        note = hub_checkpoint_note(r)   # `checkpoints/x` reads as a repo id too: say which it is
        if note:
            click.echo(f"  note: {note}")
    if failed:
        sys.exit(EXIT_INVALID)


@check.command("budgets")
@click.argument("recipes", nargs=-1)
@click.option("--explain", is_flag=True, help="Print every figure with its formula and operands.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable ledger (bytes and GiB).")
@click.option("--lane", "lanes", multiple=True, help="Only these lanes (repeatable).")
def check_budgets(recipes: tuple[str, ...], explain: bool, as_json: bool, lanes: tuple[str, ...]) -> None:
    """Compute the HBM / host / KV ledger of RECIPES (default: every recipe under recipes/).

    Exit 0 when every budget holds, 1 when one is exceeded (the output says which, by how much and
    what to change), 2 for an invalid recipe.
    """
    from recipegen.cli.output import ExplainedEcho
    from recipegen.ledger import compute_ledger
    from recipegen.load.document import display_path
    from recipegen.load.recipe import load_recipe

    say = ExplainedEcho()  # the text report, its shorthand explained at the end
    worst = EXIT_OK
    results: list[dict[str, Any]] = []
    for target in _targets(recipes):
        try:
            loaded = load_recipe(target)
        except RecipegenError as exc:
            worst = max(worst, EXIT_INVALID)
            if as_json:
                results.append({"path": target, "ok": False, "error": str(exc)})
            else:
                click.echo(f"error: {exc}", err=True)
            continue
        unknown = [name for name in dict.fromkeys(lanes) if name not in {l.name for l in loaded.recipe.lanes}]
        if unknown and recipes:
            raise loaded.no_lane_error(unknown, "--lane")
        ledger = compute_ledger(loaded)
        if lanes:
            ledger.lanes = [l for l in ledger.lanes if l.lane in lanes]
        if any(hasattr(l, "stages") for l in ledger.lanes):  # lanes over several machines
            from recipegen.costmodel.stages import attach_stage_fetch
            attach_stage_fetch(loaded, ledger)
        if not ledger.ok:
            worst = max(worst, EXIT_OVER_BUDGET)
        fetch = _fetch_summaries(loaded, ledger)
        speed = _speed(loaded, ledger)
        if as_json:
            recipe_json = ledger.to_json()
            for lane_json in recipe_json["lanes"]:
                if lane_json["lane"] in fetch:
                    lane_json["fetch"] = fetch[lane_json["lane"]].to_json()
                if lane_json["lane"] in speed:
                    estimate, others, warnings = speed[lane_json["lane"]]
                    lane_json["estimate"] = {"tokens_per_s": {str(s): v for s, v in estimate.tokens_per_s.items()},
                                             "tokens_per_s_band": {str(p.streams): list(p.tokens_per_s_band)
                                                                   for p in estimate.points},
                                             "alternatives": [a.to_json() for a in others],
                                             "warnings": warnings,
                                             "tensor_parallel_caveat": estimate.tensor_parallel_caveat}
            results.append(recipe_json)
        else:
            from recipegen.ledger.report import render_ledger

            say(render_ledger(ledger, display_path(loaded.path), explain=explain))
            for lane_name, summary in fetch.items():
                say(f"projected fetch tax · lane {lane_name} (recipegen plan for operands)")
                say("\n".join(f"  {line}" for line in summary.lines()))
            for lane_name, (estimate, _others, warnings) in speed.items():
                per = ", ".join(f"C{p.streams} {p.tokens_per_s:,.1f} tok/s ({estimate.band_text(p)})"
                                for p in estimate.points[:1] + estimate.points[1:][-1:])
                say(f"decode speed estimate · lane {lane_name}: {per}, {estimate.label or estimate.placement} "
                    "(recipegen plan for the terms)")
                for warning in warnings:
                    say(f"  warning: {warning} (the memory verdict above is unchanged)")
    if as_json:
        click.echo(json.dumps({"ok": worst == EXIT_OK, "recipes": results}, indent=2))
    else:
        say.finish()
    if worst:
        sys.exit(worst)


def _speed(loaded: Any, ledger: Any) -> dict[str, Any]:
    """Per single-machine lane: (decode estimate, alternatives, warnings where one is far faster)."""
    from recipegen.costmodel.lane_estimate import alternatives, estimate_lane, speed_warnings

    out = {}
    for lane in ledger.lanes:
        if hasattr(lane, "stages"):
            continue
        try:
            estimate = estimate_lane(loaded, lane.lane, ledger=ledger)
            others = alternatives(loaded, lane.lane, ledger=ledger)
        except RecipegenError as exc:   # the memory check stands without it
            click.echo(f"decode speed estimate · lane {lane.lane}: not computed ({exc})", err=True)
            continue
        out[lane.lane] = (estimate, others, speed_warnings(estimate, others))
    return out


def _fetch_summaries(loaded: Any, ledger: Any) -> dict[str, Any]:
    """Per single-machine lane: projected cold share and fetch time per class (cost model).

    Lanes over several machines get theirs per stage inside the ledger (costmodel.stages).
    """
    from recipegen.costmodel import fetch_summary

    return {lane.lane: fetch_summary(loaded, lane.lane, ledger=ledger)
            for lane in ledger.lanes if not hasattr(lane, "stages")}

