"""A lane's compose services: the names `render` gives its engines and their profile boots, and
which of its engines runs the residency runtime.

The names are built here and nowhere else, from the schema's parts (`LANE_SERVICE_PREFIX`,
`LANE_WORKER_SUFFIX`, `LANE_PROFILE_SUFFIX` in `recipegen.schema.lane`, whose lane checks refuse a
name whose longest service would not be one DNS label). This module imports no other render
module, so that every one of them (services, monitoring, compose) and ops, k8s and cli can use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipegen.schema.lane import LANE_PROFILE_SUFFIX, LANE_SERVICE_PREFIX, LANE_WORKER_SUFFIX

if TYPE_CHECKING:
    from recipegen.load.recipe import LoadedRecipe
    from recipegen.schema.lane import Lane


def lane_service_name(lane: str, rank: int = 0) -> str:
    """The compose service (and Kubernetes object) of a lane's engine: `lane-<lane>` for the
    API-serving one (rank 0; its host name on the compose network, the scrape target), and
    `lane-<lane>-worker-<rank>` for a pipeline's headless stages. The one builder of these names
    (render.services, render.monitoring, ops.labels and k8s call it)."""
    name = f"{LANE_SERVICE_PREFIX}{lane}"
    return name if rank == 0 else f"{name}{LANE_WORKER_SUFFIX}{rank}"


def profile_service_name(lane: str, rank: int = 0) -> str:
    """The count-only profile boot of the lane's engine `rank`: its service name, `-profile` after."""
    return f"{lane_service_name(lane, rank)}{LANE_PROFILE_SUFFIX}"


def runs_residency(loaded: LoadedRecipe, lane: Lane, rank: int = 0) -> bool:
    """Whether the engine of the lane's stage `rank` (the lane itself, not its count-only profile
    boot) runs the residency runtime with the active class's row map: a usage-aware lane, on a
    stage that keeps some experts out of HBM and, on a multi-node pipeline, holds MoE layers (a
    stage without any has nothing to re-home). The one owner of this rule: the compose service's
    mode (`render.services`) and `render.monitoring.exports_series` both ask it."""
    if lane.offload.placement != "usage-aware":
        return False
    pipeline = lane.parallel.pipeline if lane.parallel is not None else None
    if not pipeline:
        return True
    if pipeline[rank].all_experts_in_hbm:
        return False
    if len(pipeline) == 1:
        return True
    from recipegen.multinode.launch import lane_launches

    return bool(lane_launches(loaded.recipe, lane)[rank].layers.moe_layers)
