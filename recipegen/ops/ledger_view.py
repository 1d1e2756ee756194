"""The ledger's figures that verify and doctor compare against (no formula lives here: every
number comes from `recipegen.ledger`)."""

from __future__ import annotations

from typing import Any

from recipegen.common.errors import RecipegenError
from recipegen.ops.doctor import HostRequirement
from recipegen.ops.verify import Expected


def lane_expectation(loaded: Any, lane_name: str, cls_name: str, rowmap: Any) -> Expected:
    """The ledger for `lane_name` serving `cls_name` (the class the container runs, which may
    differ from the recipe's active_class while a swap is pending)."""
    from recipegen.ledger import compute_lane

    recipe = loaded.recipe
    lane = next(l for l in recipe.lanes if l.name == lane_name)
    if lane.offload.placement != "usage-aware":
        raise RecipegenError(f"lane {lane_name} uses positional offload: there is no residency "
                             "report to verify (vLLM's own --cpu-offload-gb places the experts)")
    lane = lane.model_copy(update={"active_class": cls_name})
    ledger = compute_lane(recipe.model, recipe.machines[lane.machine], lane,
                          rowmap_hot=rowmap.hot_counts(),
                          rowmap_label=f"row map of class {cls_name}")
    placement = ledger.usage_aware
    kv = ledger.figures.get("kv.tokens")
    kernels = ledger.figures.get("hbm.runtime_workspace.kernels")
    counter = ledger.figures.get("hbm.runtime_workspace.counter")
    return Expected(hot_bytes=int(placement.hot_bytes), cold_bytes=int(placement.cold_bytes),
                    kv_tokens=int(round(kv.value)) if kv is not None else None,
                    workspace_bytes=int(kernels.value) if kernels is not None else None,
                    counter_bytes=int(counter.value) if counter is not None else None,
                    hot_counts=list(rowmap.hot_counts()), cold_counts=list(rowmap.cold_counts()),
                    content_hash=rowmap.content_hash(), shape_hash=rowmap.shape_hash(),
                    traffic_class=cls_name)


def host_requirement(recipe: str) -> HostRequirement:
    """Host memory and pinned bytes the recipe's lanes plan for, over the machine they share
    (lanes with a compose profile count one at a time, the largest — as the ledger's machine
    check counts them), and the GPUs they use."""
    from recipegen.ledger import compute_ledger, concurrent_total
    from recipegen.load.recipe import load_recipe

    loaded = load_recipe(recipe)
    ledger = compute_ledger(loaded)
    lanes = list(zip(loaded.recipe.lanes, ledger.lanes))
    machines = sorted({l.machine for l, _ in lanes})
    if len(machines) > 1:
        raise RecipegenError(f"{loaded.name} spans machines {', '.join(machines)}: run doctor on "
                             "each machine with a recipe of its lanes")
    host = concurrent_total(lanes, "host.total")
    pinned = concurrent_total(lanes, "host.cold_experts")
    gpus = len({gpu for l, _ in lanes for gpu in l.gpus})
    images, paths = _rendered_needs(loaded)
    return HostRequirement(loaded.name, int(host), int(pinned), gpus, images, paths,
                           machine=loaded.recipe.machines[machines[0]])


def _rendered_needs(loaded: Any) -> tuple[list[str], list[str]]:
    """Images and must-exist bind sources of the rendered services, as compose resolves them
    (environment interpolated): from a fresh render, so doctor works before `render`. Compose
    omits `create_host_path: false` from its JSON, and false is the long syntax's default."""
    import tempfile
    from pathlib import Path

    from recipegen.ops.compose import ComposeProject
    from recipegen.render.render import COMPOSE_FILE, render_recipe

    rendering = render_recipe(loaded)
    images: set[str] = set()
    paths: set[str] = set()
    for out_dir, files in rendering.folders.items():
        # compose resolves relative sources against the project folder: stage the file there
        # (name-spaced, removed after) so no generated file is touched
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", dir=out_dir, prefix=".doctor-", suffix=".yaml") as f:
            f.write(files[COMPOSE_FILE])
            f.flush()
            config = ComposeProject(out_dir, [Path(f.name)]).config()
        for svc in (config.get("services") or {}).values():
            if svc.get("image"):
                images.add(str(svc["image"]))
            for vol in svc.get("volumes") or []:
                if vol.get("type") == "bind" and not (vol.get("bind") or {}).get("create_host_path"):
                    # `config` prints a literal `$` as `$$` (recipegen escapes recipe values)
                    paths.add(str(vol["source"]).replace("$$", "$"))
    return sorted(images), sorted(paths)
