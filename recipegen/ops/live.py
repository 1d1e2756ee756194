"""verify and drift against a running lane: gather what the engine says, then judge with the
pure functions in `verify` and `drift`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from expert_residency.contract import env as runtime_env
from expert_residency.formats import FormatError, find_report_lines, load_histogram, load_rowmap

from recipegen.common.errors import InputError, RecipegenError
from recipegen.ops import labels
from recipegen.ops.deployment import Deployment
from recipegen.ops.drift import DEFAULT_TOLERANCE, DriftVerdict, judge
from recipegen.ops.dumps import Snapshot, difference, env_dump_dir, snapshot_wait_s, snapshots, wait_for_snapshot
from recipegen.ops.engine import ContainerInfo, container_logs, list_dir, request_snapshot, service_container
from recipegen.ops.kvcapacity import KvCapacity, kv_from_log, kv_from_metrics
from recipegen.ops.verify import Expected, Row, compare

Echo = Callable[[str], None]


def running_lane(dep: Deployment, lane_name: str) -> ContainerInfo:
    dep.lane(lane_name)
    service = labels.lane_service(lane_name)
    project = dep.project().project_name()
    info = service_container(dep.client(), project, service)
    if info is None or info.state != "running":
        raise RecipegenError(f"{service} is not running (project {project}): "
                             f"`recipegen up {dep.rendering.recipe_arg} {lane_name}` first")
    return info


def lane_endpoint(dep: Deployment, lane_name: str) -> str:
    """The base URL of the lane's API on its machine (`http://host:port`; an IPv6 address in
    brackets, `render.monitoring.host_port`)."""
    from recipegen.render.monitoring import host_port

    lane = dep.lane(lane_name)
    address = dep.loaded.recipe.machines[lane.machine].address or "127.0.0.1"
    return f"http://{host_port(address, lane.port)}"



def _load_map(dep: Deployment, lane_name: str, cls_name: str) -> Any:
    lane = dep.lane(lane_name)
    cls = lane.classes.get(cls_name)
    if cls is None or not cls.rowmap:
        raise InputError(f"lane {lane_name} has no row map for class {cls_name!r}",
                         file=str(dep.loaded.path), field=f"lanes.{lane_name}.classes")
    path = dep.loaded.resolve(cls.rowmap)
    try:
        return load_rowmap(path)
    except FormatError as exc:
        raise InputError(str(exc), file=str(path)) from None


def kv_capacity(dep: Deployment, lane_name: str, log_text: str) -> KvCapacity | None:
    import httpx

    try:
        reply = httpx.get(f"{lane_endpoint(dep, lane_name)}/metrics", timeout=15)
        if reply.status_code == 200:
            found = kv_from_metrics(reply.text)
            if found is not None:
                return found
    except httpx.HTTPError:
        pass
    return kv_from_log(log_text)


def expected_figures(dep: Deployment, lane_name: str, cls_name: str) -> Expected:
    from recipegen.ops.ledger_view import lane_expectation

    return lane_expectation(dep.loaded, lane_name, cls_name, _load_map(dep, lane_name, cls_name))


@dataclass(frozen=True)
class VerifyOutcome:
    service: str
    traffic_class: str
    rows: list[Row]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)


def verify_lane(dep: Deployment, lane_name: str, *, bytes_tolerance: float,
                kv_tolerance: float) -> VerifyOutcome:
    info = running_lane(dep, lane_name)
    cls_name = info.labels.get(labels.CLASS) or dep.lane(lane_name).active_class or ""
    logs = container_logs(dep.client(), info.id, since=info.started_at)
    try:
        reports = find_report_lines(logs)
    except FormatError as exc:
        raise RecipegenError(f"{info.service}: unreadable start-up report in its log: {exc}") from None
    kv = kv_capacity(dep, lane_name, logs)
    rows = compare(expected_figures(dep, lane_name, cls_name), reports,
                   kv.tokens if kv else None, kv_source=kv.source if kv else "",
                   bytes_tolerance=bytes_tolerance, kv_tolerance=kv_tolerance)
    label_hash = info.labels.get(labels.CONTENT_HASH)
    if label_hash:
        seen = {r.content_hash for r in reports}
        rows.append(Row("content_hash label", label_hash[:16], ", ".join(str(s)[:16] for s in seen) or "-",
                        seen == {label_hash}, "the container's label against the runtime's report"))
    return VerifyOutcome(info.service, cls_name, rows)


def _asked(pids: list[int]) -> str:
    if not pids:
        return "no process in the container handles SIGUSR1: waiting for the runtime's timer"
    return f"asked for a snapshot (SIGUSR1 to pid {', '.join(map(str, pids))} in the container)"


def drift_lane(dep: Deployment, lane_name: str, *, wait_s: float | None,
               tolerance: float = DEFAULT_TOLERANCE, window_s: float | None = None,
               echo: Echo = print) -> DriftVerdict:
    info = running_lane(dep, lane_name)
    lane = dep.lane(lane_name)
    active = info.labels.get(labels.CLASS) or lane.active_class or ""
    folder = env_dump_dir(info.env)
    if not folder:
        raise RecipegenError(f"{info.service} has no {runtime_env.DUMP_DIR}: the runtime is not "
                             "counting; re-render and recreate the lane")
    client = dep.client()
    read = lambda: list_dir(client, info.id, folder)  # noqa: E731
    seen = set(read())
    if wait_s is None:
        # If no process answers SIGUSR1, the timer's next snapshot does: wait one interval + margin.
        wait_s = snapshot_wait_s(info.env)
    nudge = lambda: request_snapshot(client, info.id)  # noqa: E731
    echo(f"{info.service}: {_asked(nudge())}; waiting at most {wait_s:.0f} s")
    snap = wait_for_snapshot(read, where=f"{info.service}:{folder}", lane=None,
                             traffic_class=None, seen=seen, timeout_s=wait_s, nudge=nudge,
                             nudge_every_s=5.0)
    live = snap.histogram
    if window_s:
        live = _window(read(), snap, window_s, where=f"{info.service}:{folder}", echo=echo)
    maps = {name: _load_map(dep, lane_name, name) for name, c in lane.classes.items() if c.rowmap}
    if active not in maps:
        raise RecipegenError(f"{info.service} runs class {active!r}, which has no row map here")
    built, source = _built_share(dep, lane_name, active, maps[active])
    label_hash = info.labels.get(labels.CONTENT_HASH)
    if label_hash and label_hash != maps[active].content_hash():
        echo(f"note: {info.service} runs a different {active} map (content {label_hash[:12]}) than "
             f"the file now holds ({maps[active].content_hash()[:12]}); judging against the file")
    verdict = judge(live, active, maps, built_share=built, built_source=source, tolerance=tolerance)
    return _with_live_map(verdict, read(), snap, live, maps[active], where=f"{info.service}:{folder}")


def _with_live_map(verdict: DriftVerdict, files: dict[str, bytes], snap: Snapshot, counts: Any,
                   recipe_map: Any, *, where: str) -> DriftVerdict:
    """An adaptive lane's snapshot carries the map its banks hold: its hash against the recipe's,
    swaps, the runtime's cold share now, and the judged counts' cold share under it."""
    from dataclasses import replace

    from recipegen.ops.livemap import cold_share_under, live_map_of

    view = live_map_of(files, snap, where=where)
    if view is None:
        return verdict
    figures = view.against(recipe_map.content_hash())
    figures["cold_share_live_map"] = cold_share_under(view, counts)
    return replace(verdict, live_map=figures)


def _window(files: dict[str, bytes], latest: Snapshot, window_s: float, *, where: str,
            echo: Echo) -> Any:
    """Counts of the last `window_s` seconds: `latest` minus the newest snapshot of the same
    engine run at least that old (counts are cumulative since the engine started)."""
    run = latest.histogram.meta.get("started_at")
    older = [s for s in snapshots(files, where=where, lane=latest.lane,
                                  traffic_class=latest.traffic_class)
             if (latest.time - s.time).total_seconds() >= window_s
             and (run is None or s.histogram.meta.get("started_at") == run)]
    if not older:
        echo(f"note: no snapshot of this run is {window_s:.0f} s older than the latest; "
             "judging everything since the lane started")
        return latest.histogram
    base = older[-1]
    echo(f"window: {base.name} .. {latest.name}")
    return difference(latest.histogram, base.histogram, source=f"window {base.name}..{latest.name}")


def _built_share(dep: Deployment, lane_name: str, cls_name: str, rowmap: Any
                 ) -> tuple[float | None, str]:
    """The cold share the map was built for: the map on its class's histogram."""
    from recipegen.rowmap import cold_share

    cls = dep.lane(lane_name).classes[cls_name]
    if cls.histogram:
        path = dep.loaded.resolve(cls.histogram)
        if path.is_file():
            try:
                return cold_share(rowmap, load_histogram(path)), f"the map on {path.name}"
            except (FormatError, InputError, ValueError) as exc:
                return None, f"unreadable histogram {path}: {exc}"
    return None, "no histogram declared for the class"
