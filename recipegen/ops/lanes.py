"""up / swap / status: start lanes behind their health checks, swap a lane's class with
rollback, and report what runs against the rendering.

Lanes start one after another: vLLM engines starting together on a shared GPU count each
other's memory during start-up profiling (anchors: production-stack#1047, vllm#17979).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from recipegen.common.errors import InputError, RecipegenError
from recipegen.load.recipe import LoadedRecipe
from recipegen.ops import labels
from recipegen.ops.compose import ComposeError
from recipegen.ops.deployment import Deployment, dependency_order, lane_services, rendered_label, service_profiles
from recipegen.ops.engine import ContainerInfo, find_containers, service_container
from recipegen.ops.startup import StartupFailed, start

Echo = Callable[[str], None]
DEFAULT_WAIT_S = 3 * 3600  # a cold boot with kernel tuning takes over an hour (field reports: ~75 min)


@dataclass(frozen=True)
class Started:
    service: str
    seconds: float
    container: str
    traffic_class: str
    health: str


def _ensure_rendered(dep: Deployment, echo: Echo) -> None:
    from recipegen.common.lock import recipe_lock

    with recipe_lock(dep.loaded.path, echo=echo, readers_only=True):  # read and rendered as one
        dep.rendering.reload()
        first = not dep.rendering.compose_file.is_file()
        reasons = dep.rendering.stale_reasons()
        if reasons:
            dep.rendering.render()
            why = "first render" if first else (
                f"it was stale: {reasons[0]}" + (f" and {len(reasons) - 1} more" if len(reasons) > 1 else ""))
            echo(f"rendered {dep.rendering.out_dir} ({why})")


def _start(dep: Deployment, service: str, config: dict[str, Any], wait_s: int,
           progress: Echo) -> Started:
    t0 = time.monotonic()
    start(dep, service, config, wait_s=wait_s, say=progress)
    seconds = time.monotonic() - t0
    info = service_container(dep.client(), config.get("name") or dep.rendering.out_dir.name, service)
    if info is None:
        raise RecipegenError(f"{service}: compose reported success but no container exists")
    return Started(service, seconds, info.id[:12], info.labels.get(labels.CLASS, ""), info.health)


def up(dep: Deployment, lanes: list[str], *, wait_s: int = DEFAULT_WAIT_S,
       echo: Echo = print, progress: Echo | None = None) -> list[Started]:
    """Render if stale, then `up -d --wait` each lane's service in dependency order. `progress`
    (default: `echo`) gets the start-up phases, heartbeats and Compose's own lines
    (`ops.startup`)."""
    progress = progress or echo
    unknown = [name for name in lanes if name not in dep.lane_names()]
    if unknown:   # every unknown name at once, not the first only
        raise dep.loaded.no_lane_error(unknown, "LANES")
    dep.client()  # a clear error now if the engine is not reachable, before rendering
    _ensure_rendered(dep, echo)
    config = dep.project().config()
    services: list[str] = []
    for name in lanes or dep.lane_names():
        here = lane_services(config, name)
        if not here:
            if lanes:
                echo(f"lane {name}: no service in {dep.rendering.compose_file} (it runs on "
                     "another machine)")
            continue
        if not lanes and any(service_profiles(config, s) for s in here):
            continue  # not always on: started only when named
        services += here
    if not services:
        raise InputError("no lane to start here: name lanes (lanes with a compose profile start "
                         "only when named)", file=str(dep.loaded.path), field="lanes")
    started: list[Started] = []
    for service in dependency_order(config, services):
        echo(f"{service}: starting (waits for its health check, at most {wait_s} s)")
        try:
            result = _start(dep, service, config, wait_s, progress)
        except ComposeError as exc:
            done = ", ".join(s.service for s in started) or "none"
            compose = f"docker compose -f {dep.rendering.compose_file}"
            head = str(exc) if isinstance(exc, StartupFailed) else \
                f"{service} did not become healthy: {exc}"
            raise RecipegenError(f"{head}\nlanes already up: {done}; the container is left as "
                                 f"it is: its whole log: `{compose} logs {service}`; stop its "
                                 f"restarts: `{compose} stop {service}`") from None
        echo(f"{service}: {result.health} after {result.seconds:.1f} s "
             f"(class {result.traffic_class or '-'}, container {result.container})")
        started.append(result)
    return started


@dataclass(frozen=True)
class SwapResult:
    lane: str
    previous_class: str
    new_class: str
    ok: bool
    downtime_s: float
    rolled_back: bool
    message: str


def swap(dep: Deployment, lane_name: str, new_class: str, *, wait_s: int = DEFAULT_WAIT_S,
         echo: Echo = print, progress: Echo | None = None) -> SwapResult:
    """Write active_class, re-render, recreate exactly that service, wait for health — one
    transaction with `render --class` (recipegen.render.swap): on any failure (render, Compose,
    health) the recipe, the rendering and the service are restored. The recipe's lock is held
    throughout, from reading the class it swaps from to the health verdict."""
    from recipegen.common.lock import recipe_lock

    with recipe_lock(dep.loaded.path, echo=echo):
        dep.rendering.reload()  # what the recipe says now that no other writer can change it
        return _swap(dep, lane_name, new_class, wait_s=wait_s, echo=echo, progress=progress or echo)


def refuse_unswappable(loaded: LoadedRecipe, lane_name: str, new_class: str, recipe_arg: str) -> None:
    """InputError at its line unless `swap` can serve `new_class` on `lane_name`: the lane has that
    class and runs on one machine. Checked before the machine is resolved (`--machine`), which a
    multi-node lane's swap could not use anyway."""
    index, lane = loaded.lane_at(lane_name)
    if new_class not in lane.classes:
        raise loaded.error(f"lane {lane_name} has no class {new_class!r} (classes: "
                           f"{', '.join(lane.classes) or 'none'})", ("lanes", index, "classes"))
    if lane.parallel is not None and len(lane.parallel.pipeline) > 1:
        # Every stage's engine belongs to one vLLM group: a class swap restarts the lane on every
        # machine, which one machine's compose project cannot do (nor roll back).
        machines = ", ".join(stage.machine for stage in lane.parallel.pipeline)
        raise loaded.error(f"lane {lane_name} spans machines ({machines}); swap recreates one machine's "
                           f"service, and a pipeline-parallel lane restarts on every machine at once: "
                           f"`recipegen render {recipe_arg} --class {lane_name}={new_class}`, then "
                           f"`recipegen up {recipe_arg} --machine <machine>` on each of {machines} "
                           f"(docs/multinode.md)", ("lanes", index, "parallel"))


def _swap(dep: Deployment, lane_name: str, new_class: str, *, wait_s: int, echo: Echo,
          progress: Echo) -> SwapResult:
    lane = dep.lane(lane_name)
    refuse_unswappable(dep.loaded, lane_name, new_class, dep.rendering.recipe_arg)
    dep.client()
    previous = lane.active_class or ""
    if not previous:
        raise InputError(f"lane {lane_name} has no active_class to come back to if the swap "
                         f"fails; set it with `recipegen render {dep.rendering.recipe_arg} "
                         f"--class {lane_name}={new_class}` and `recipegen up`",
                         file=str(dep.loaded.path), field=f"lanes.{lane_name}.active_class")
    service = labels.lane_service(lane_name)
    if previous == new_class:
        _ensure_rendered(dep, echo)
        return SwapResult(lane_name, previous, new_class, True, 0.0, False,
                          f"{service} already serves class {new_class}; nothing to swap")
    _ensure_rendered(dep, echo)  # the baseline we can come back to
    from recipegen.render.swap import swap_classes

    project_name = dep.project().config().get("name") or dep.rendering.out_dir.name
    clock: dict[str, float] = {}

    def apply() -> None:
        """Recreate exactly the lane's service on the new rendering and wait for health."""
        dep.rendering.reload()
        config = dep.project().config()
        echo(f"{service}: active_class {previous} -> {new_class}; recreating {service} only")
        clock["t0"] = time.monotonic()
        try:
            start(dep, service, config, wait_s=wait_s, say=progress)
            info = service_container(dep.client(), config.get("name") or project_name, service)
            if info is None or info.health not in ("healthy", "none") or info.state != "running":
                raise ComposeError(f"{service} is {info.state if info else 'missing'}"
                                   f"/{info.health if info else '-'} after the swap")
        except ComposeError as exc:
            echo(f"{service}: class {new_class} did not become healthy within "
                 f"{time.monotonic() - clock['t0']:.1f} s: {exc}")
            raise

    def restore() -> None:
        """The recipe and rendering are back on the previous class: bring its service back."""
        dep.rendering.reload()
        if "t0" not in clock:
            return  # failed before the service was touched: it still runs the previous class
        echo(f"{service}: rolling back to class {previous}")
        clock["t1"] = time.monotonic()
        config = dep.project().config()
        try:
            start(dep, service, config, wait_s=wait_s, say=progress)
        except ComposeError as exc2:
            raise RecipegenError(
                f"swap of {service} to {new_class} failed and the rollback to {previous} failed "
                f"too: {exc2}\nthe recipe and rendering are back on {previous}; inspect with "
                f"`docker compose -f {dep.rendering.compose_file} logs {service}`") from None

    try:
        swap_classes(dep.loaded.path, [(lane_name, new_class)], apply=apply, restore=restore,
                     echo=echo)
    except ComposeError:
        t0 = clock.get("t0", time.monotonic())
        downtime = time.monotonic() - t0
        return SwapResult(lane_name, previous, new_class, False, downtime, True,
                          f"swap to {new_class} failed; rolled back: {service} healthy again on "
                          f"class {previous} after {time.monotonic() - clock.get('t1', t0):.1f} s "
                          f"(lane down for {downtime:.1f} s in all)")
    dep.rendering.reload()
    downtime = time.monotonic() - clock["t0"]
    return SwapResult(lane_name, previous, new_class, True, downtime, False,
                      f"{service} serves class {new_class}: healthy after {downtime:.1f} s "
                      f"(downtime, from stopping the old container to the new one's first "
                      f"healthy check)")


@dataclass(frozen=True)
class LaneStatus:
    recipe: str
    lane: str
    service: str
    traffic_class: str
    content_hash: str
    shape_hash: str
    config_hash: str
    state: str
    health: str
    uptime_s: float | None
    container: str
    rendering: str        # current / stale / not rendered / unknown recipe
    detail: str
    live_map: dict | None = None   # an adaptive lane's live map from its newest dump (`ops.livemap`)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _RecipeView:
    config: dict[str, Any] | None        # compose config of the rendering on disk
    fresh: dict[str, str]                # service → config hash of a fresh render
    problem: str = ""                    # why a fresh render is not available


def _recipe_views(projects: set[tuple[str, str]],
                  load: Callable[[str, str], Deployment | None]
                  ) -> dict[tuple[str, str], _RecipeView]:
    """(recipe, compose project) → what its rendering says."""
    out: dict[tuple[str, str], _RecipeView] = {}
    for name in sorted(projects):
        dep = load(*name)
        if dep is None or not dep.rendering.compose_file.is_file():
            out[name] = _RecipeView(None, {})
            continue
        try:
            fresh, problem = dep.rendering.fresh_config_hashes(), ""
        except RecipegenError as exc:
            fresh, problem = {}, f"the recipe does not render now: {exc}"
        out[name] = _RecipeView(dep.project().config(), fresh, problem)
    return out


def status(client: Any, *, recipe: str | None,
           load: Callable[[str, str], Deployment | None]) -> list[LaneStatus]:
    """Every container with recipegen labels (of one recipe, or all), judged per service: it is
    `current` when its config hash is the rendered one and a fresh render of the recipe (with
    its row maps as they are now) would not change that service."""
    filters = [labels.RECIPE] if recipe is None else [f"{labels.RECIPE}={recipe}"]
    containers = find_containers(client, filters)
    views = _recipe_views({(c.labels[labels.RECIPE], c.project) for c in containers}, load)
    return [_with_live_map(client, c, _lane_status(c, views.get((c.labels[labels.RECIPE], c.project),
                                                                _RecipeView(None, {}))))
            for c in containers]


def _with_live_map(client: Any, c: ContainerInfo, lane: LaneStatus) -> LaneStatus:
    """A running adaptive lane: its newest dump's live map against the map it booted with (the
    recipe's, by the content-hash label). Read from the dump folder as it is (no new snapshot
    asked for); a folder that cannot be read is said in the figures, not raised."""
    from dataclasses import replace

    from recipegen.ops.dumps import env_dump_dir
    from recipegen.ops.engine import list_dir
    from recipegen.ops.livemap import adaptive_on, latest_live_map

    folder = env_dump_dir(c.env)
    if c.state != "running" or not folder or not adaptive_on(c.env):
        return lane
    where = f"{c.service}:{folder}"
    try:
        view = latest_live_map(list_dir(client, c.id, folder), where=where, lane=lane.lane or None)
    except RecipegenError as exc:
        return replace(lane, live_map={"error": str(exc)})
    if view is None:
        return replace(lane, live_map={"error": f"no snapshot in {where} carries a live map yet"})
    return replace(lane, live_map=view.against(c.labels.get(labels.CONTENT_HASH)))


def _lane_status(c: ContainerInfo, view: _RecipeView) -> LaneStatus:
    have = c.labels.get(labels.CONFIG_HASH, "")
    config = view.config
    if config is None:
        verdict, detail = "unknown", "recipe or rendering not found here"
    elif c.service not in config.get("services", {}):
        verdict, detail = "stale", "service no longer rendered (`docker compose down --remove-orphans`)"
    elif (rendered_label(config, c.service, labels.CONFIG_HASH) or "") != have:
        verdict, detail = "stale", "container differs from the rendering: `recipegen up` recreates it"
    elif view.problem:
        verdict, detail = "stale", view.problem
    elif view.fresh.get(c.service, "") != have:
        verdict, detail = "stale", ("the recipe or its row map changed since the last render: "
                                    "`recipegen up` re-renders and recreates it")
    else:
        verdict, detail = "current", ""
    return LaneStatus(
        recipe=c.labels.get(labels.RECIPE, ""), lane=c.labels.get(labels.LANE, ""),
        service=c.service, traffic_class=c.labels.get(labels.CLASS, ""),
        content_hash=c.labels.get(labels.CONTENT_HASH, ""),
        shape_hash=c.labels.get(labels.SHAPE_HASH, ""), config_hash=have, state=c.state,
        health=c.health, uptime_s=c.uptime_s(), container=c.id[:12], rendering=verdict,
        detail=detail)
