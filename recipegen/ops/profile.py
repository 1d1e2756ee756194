"""`recipegen profile`: the count-only profile boot as one command.

Docker: stop the lane if it runs (same GPUs), start its `lane-<lane>-profile` service (count-only
runtime, no row map), optionally drive a prompt fixture and/or keep it serving for a while, stop
it (the runtime writes a final snapshot at shutdown), read the newest snapshot from its dump
folder, restart the lane, save the histogram as the class's profile and build the class's row
map with the lane's hot count.

Endpoint (`--endpoint URL --dump-dir DIR`): a lane started outside Docker. The window is the
difference of two cumulative snapshots: before the prompts, and one whose counter read began after
the last reply (`dumps.begun_after_trigger`); snapshots come from the runtime's timer, SIGUSR1
(`--signal-pid`), or vLLM's development `/collective_rpc` endpoint (`--rpc`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expert_residency.contract import env as runtime_env
from expert_residency.formats import Histogram, RowMap

from recipegen.common.errors import InputError, RecipegenError
from recipegen.ops import labels
from recipegen.ops.deployment import Deployment, service_profiles
from recipegen.ops.dumps import (
    Snapshot,
    difference,
    env_dump_dir,
    read_host_dir,
    snapshot_wait_s,
    snapshots,
    wait_for_snapshot,
)
from recipegen.ops.engine import list_dir, request_snapshot, service_container
from recipegen.ops.live import _asked, lane_endpoint
from recipegen.ops.prompts import drive, load_prompts

Echo = Callable[[str], None]


@dataclass(frozen=True)
class ProfileTarget:
    lane: str
    traffic_class: str
    histogram_path: Path
    rowmap_path: Path
    hot_per_layer: int


@dataclass(frozen=True)
class ProfileResult:
    histogram_path: Path
    rowmap_path: Path
    selections: int
    tokens: int
    content_hash: str
    shape_hash: str
    cold_share: float
    previous_shape_hash: str | None


def profile_target(loaded: Any, lane_name: str, traffic_class: str | None) -> ProfileTarget:
    from recipegen.ledger.budget import declared_split

    _, lane = loaded.lane_at(lane_name)
    cls_name = traffic_class or lane.active_class
    if not cls_name or cls_name not in lane.classes:
        raise InputError(f"lane {lane_name} has no class {cls_name!r} (classes: "
                         f"{', '.join(lane.classes) or 'none'})", file=str(loaded.path),
                         field=f"lanes.{lane_name}.classes")
    cls = lane.classes[cls_name]
    if lane.offload.placement != "usage-aware":
        raise InputError("profile builds a row map for a usage-aware lane; this lane is positional",
                         file=str(loaded.path), field=f"lanes.{lane_name}.offload.placement")
    missing = [f for f in ("histogram", "rowmap") if not getattr(cls, f)]
    if missing:
        raise InputError(f"class {cls_name} declares no {missing[0]} path to write (add e.g. "
                         f"`{missing[0]}: {'profiles' if missing[0] == 'histogram' else 'maps'}/"
                         f"{loaded.name}/{cls_name}.{'hist' if missing[0] == 'histogram' else 'rowmap'}`)",
                         file=str(loaded.path), field=f"lanes.{lane_name}.classes.{cls_name}")
    split = declared_split(loaded.recipe.model, lane.offload)
    return ProfileTarget(lane_name, cls_name, loaded.resolve(cls.histogram),
                         loaded.resolve(cls.rowmap), split.hot_per_layer)


def finish(loaded: Any, target: ProfileTarget, histogram: Histogram, source: str,
           echo: Echo) -> ProfileResult:
    """Save the histogram as the class's profile and build its row map (atomic writes)."""
    from recipegen.rowmap import build_top_n, check_same_geometry, cold_share
    from recipegen.rowmap.build import provenance_for

    model = loaded.recipe.model
    if histogram.num_experts != model.routed_experts or \
            list(histogram.moe_layer_indices) != list(model.moe_layers):
        raise RecipegenError(
            f"the engine counted {histogram.num_experts} experts over MoE layers "
            f"{list(histogram.moe_layer_indices)[:3]}…, but {loaded.name}'s model has "
            f"{model.routed_experts} over {list(model.moe_layers)[:3]}…: wrong model served?")
    if histogram.selections == 0:
        raise RecipegenError("the profile boot counted no selections: no traffic reached it")
    histogram.source = source
    histogram.meta = dict(histogram.meta, lane=target.lane, **{"class": target.traffic_class})
    previous_shape = None
    if target.rowmap_path.is_file():
        from expert_residency.formats import load_rowmap

        try:
            previous_shape = load_rowmap(target.rowmap_path).shape_hash()
        except Exception:
            previous_shape = None
    rowmap: RowMap = build_top_n(histogram, target.hot_per_layer, provenance_for(
        [histogram], [str(target.histogram_path.name)], "top-n", profile=source))
    check_same_geometry(rowmap, histogram)
    from expert_residency.formats import format_histogram, format_rowmap

    from recipegen.common.lock import recipe_lock, sweep_temps, write_atomically

    # the class's files are the recipe's: written under its lock, through fixed temps that a
    # profile killed at its rename leaves for the next writer to remove
    with recipe_lock(loaded.path, echo=echo):
        for path, text in ((target.histogram_path, format_histogram(histogram)),
                           (target.rowmap_path, format_rowmap(rowmap))):
            path.parent.mkdir(parents=True, exist_ok=True)
            sweep_temps(path.parent)
            write_atomically(path, text.encode("utf-8"))
    result = ProfileResult(target.histogram_path, target.rowmap_path, histogram.selections,
                           histogram.tokens, rowmap.content_hash(), rowmap.shape_hash(),
                           cold_share(rowmap, histogram), previous_shape)
    echo(f"histogram: {result.histogram_path} ({result.selections:,} selections, "
         f"{result.tokens:,} tokens)")
    echo(f"row map:   {result.rowmap_path} ({target.hot_per_layer} hot per layer, cold share "
         f"{result.cold_share:.2%} on this histogram, content {result.content_hash[:12]}, shape "
         f"{result.shape_hash[:12]}"
         + (", the previous map's bank shapes: the restart reuses the tuned kernels)"
            if previous_shape == result.shape_hash else ")"))
    return result


def profile_in_docker(dep: Deployment, lane_name: str, traffic_class: str | None, *,
                      prompts: Path | None, serve_s: float, wait_s: int, echo: Echo,
                      progress: Echo | None = None) -> ProfileResult:
    """`progress` (default: `echo`) gets the start-up phases of the profile boot and of the
    lane's restart (`ops.startup`)."""
    from recipegen.ops.lanes import _ensure_rendered
    from recipegen.ops.startup import start

    progress = progress or echo
    target = profile_target(dep.loaded, lane_name, traffic_class)
    prompt_list = load_prompts(prompts) if prompts else []
    _ensure_rendered(dep, echo)
    config = dep.project().config()
    project = config.get("name") or dep.rendering.out_dir.name
    lane_svc, prof_svc = labels.lane_service(lane_name), labels.profile_service(lane_name)
    service_profiles(config, prof_svc)  # rendered?
    client = dep.client()
    running = service_container(client, project, lane_svc)
    lane_was_up = running is not None and running.state == "running"
    if lane_was_up:
        echo(f"{lane_svc}: stopping it for the profile boot (same GPUs)")
        dep.project().stop([lane_svc])
    try:
        echo(f"{prof_svc}: starting in count-only mode")
        try:
            start(dep, prof_svc, config, wait_s=wait_s, say=progress, force_recreate=True)
        except RecipegenError:
            # it must not keep the lane's GPUs (nor restart on its own) once the lane is back
            echo(f"{prof_svc}: did not start; stopping and removing it")
            try:
                dep.project().rm([prof_svc], profiles=service_profiles(config, prof_svc))
            except RecipegenError as exc:
                echo(f"{prof_svc}: could not remove it ({exc}); stop it by hand")
            raise
        info = service_container(client, project, prof_svc)
        assert info is not None
        folder = env_dump_dir(info.env)
        if not folder:
            raise RecipegenError(f"{prof_svc} has no {runtime_env.DUMP_DIR}: re-render")
        seen = set(list_dir(client, info.id, folder))
        endpoint = lane_endpoint(dep, lane_name)
        if prompt_list:
            echo(f"{prof_svc}: driving {len(prompt_list)} prompts at {endpoint}")
            drive(endpoint, prompt_list)
        if serve_s > 0:
            echo(f"{prof_svc}: counting live traffic at {endpoint} for {serve_s:.0f} s")
            time.sleep(serve_s)
        # A snapshot now (SIGUSR1, else the timer's next one) so the counts are safe even if
        # the shutdown snapshot does not come; then stop: the final snapshot supersedes it.
        where = f"{prof_svc}:{folder}"
        read = lambda: list_dir(client, info.id, folder)  # noqa: E731
        nudge = lambda: request_snapshot(client, info.id)  # noqa: E731
        snapshot_wait = snapshot_wait_s(info.env)
        before_ask = set(read())  # snapshots of the traffic so far do not count as the answer
        echo(f"{prof_svc}: {_asked(nudge())} (at most {2 * snapshot_wait:.0f} s)")
        snap = wait_for_snapshot(read, where=where, lane=None, traffic_class=None, seen=before_ask,
                                 timeout_s=2 * snapshot_wait, nudge=nudge, nudge_every_s=5.0,
                                 complete=True)
        echo(f"{prof_svc}: stopping (the runtime writes its final snapshot)")
        dep.project().stop([prof_svc], profiles=service_profiles(config, prof_svc))
        final = snapshots({n: d for n, d in read().items() if n not in seen}, where=where)
        if final and final[-1].histogram.selections >= snap.histogram.selections:
            snap = final[-1]
        dep.project().rm([prof_svc], profiles=service_profiles(config, prof_svc))
    finally:
        if lane_was_up:
            echo(f"{lane_svc}: starting it again")
            start(dep, lane_svc, config, wait_s=wait_s, say=progress)
    source = (f"recipegen profile {dep.recipe_name} {lane_name}: count-only boot {prof_svc}, "
              f"snapshot {snap.name}" + (f", prompts {prompts.name}" if prompts else ""))
    return finish(dep.loaded, target, snap.histogram, source, echo)


def _rpc_dump(endpoint: str) -> None:
    import httpx

    try:
        reply = httpx.post(f"{endpoint}/collective_rpc", json={"method": "expert_residency_dump"},
                           timeout=120)
        reply.raise_for_status()
    except Exception as exc:
        raise RecipegenError(f"{endpoint}/collective_rpc failed ({exc}); it needs "
                             "VLLM_SERVER_DEV_MODE=1 and the runtime's worker extension") from None


def profile_endpoint(loaded: Any, lane_name: str, traffic_class: str | None, *, endpoint: str,
                     dump_dir: Path, prompts: Path | None, rpc: bool, wait_s: float,
                     echo: Echo, signal_pid: int | None = None) -> ProfileResult:
    target = profile_target(loaded, lane_name, traffic_class)
    prompt_list = load_prompts(prompts) if prompts else []
    if not prompt_list:
        raise InputError("--endpoint needs --prompts: the window is the traffic it sends",
                         field="--prompts")
    endpoint = endpoint.rstrip("/")
    read = lambda: read_host_dir(dump_dir)  # noqa: E731
    where = str(dump_dir)
    before: Snapshot | None
    request: Callable[[], None] | None = None
    if rpc:
        request = lambda: _rpc_dump(endpoint)  # noqa: E731
    elif signal_pid is not None:
        from recipegen.ops.signals import signal_catchers

        def request() -> None:
            if not signal_catchers(signal_pid):
                raise RecipegenError(f"no process in the tree of pid {signal_pid} handles SIGUSR1 "
                                     "(is the runtime counting, with EXPERT_RESIDENCY_DUMP_DIR set?)")
    if request is not None:
        seen = set(read())
        request()
        before = wait_for_snapshot(read, where=where, lane=None, traffic_class=None, seen=seen,
                                   timeout_s=wait_s)
    else:
        existing = snapshots(read(), where=where)
        before = existing[-1] if existing else None
    echo(f"driving {len(prompt_list)} prompts at {endpoint}")
    drive(endpoint, prompt_list)
    seen = set(read())  # after the prompts: a snapshot taken during them would be partial
    if request is not None:
        request()
    else:
        echo(f"waiting for the runtime's next two snapshots in {where} (the first may have been "
             f"taken during the last step; at most {wait_s:.0f} s)")
    after = wait_for_snapshot(read, where=where, lane=None, traffic_class=None, seen=seen,
                              timeout_s=wait_s, nudge=request, complete=True)
    source = (f"recipegen profile {loaded.name} {lane_name} --endpoint {endpoint}: window "
              f"{before.name if before else 'engine start'} .. {after.name}, prompts {prompts.name}")
    window = difference(after.histogram, before.histogram if before else None, source=source)
    return finish(loaded, target, window, source, echo)
