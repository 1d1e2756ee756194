"""The live map of an adaptive lane, as its dumps carry it (`expert_residency.core.dump`:
`meta.live_map` and the `<stem>.rowmap` beside each histogram): what `status` and `drift` show,
and what `rowmap save-live` keeps as a class's map.

Pure reading of a dump folder's files (name → bytes); the callers fetch them (through the engine,
or from the lane's host folder).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from expert_residency.contract import env as runtime_env
from expert_residency.core.adaptive_setup import parse_adaptive_spec
from expert_residency.core.dump import LiveMap
from expert_residency.formats import FormatError, Histogram, RowMap, parse_rowmap

from recipegen.common.errors import InputError, RecipegenError
from recipegen.ops.dumps import Snapshot, snapshots


@dataclass(frozen=True)
class LiveMapView:
    """One dump's live map: the runtime's description, the map itself, and the snapshot it came with."""

    snapshot: Snapshot
    live: LiveMap
    rowmap: RowMap

    def against(self, recipe_hash: str | None) -> dict[str, Any]:
        """JSON-ready figures, the live hash set against the recipe's map for the class."""
        return {"snapshot": self.snapshot.name, "content_hash": self.live.content_hash,
                "recipe_content_hash": recipe_hash or None,
                "matches_recipe": None if not recipe_hash else recipe_hash == self.live.content_hash,
                "boot_content_hash": self.live.boot_content_hash, "shape_hash": self.live.shape_hash,
                "barriers": self.live.barriers, "swaps": self.live.swaps,
                "cold_share_now": self.live.window_cold_share, "prior": self.live.prior}


def adaptive_on(env: Mapping[str, str]) -> bool:
    """Whether a container's environment turns adaptive residency on (an unreadable value: no)."""
    try:
        return parse_adaptive_spec(env.get(runtime_env.ADAPTIVE, "")) is not None
    except ValueError:
        return False


def live_map_of(files: Mapping[str, bytes], snap: Snapshot, *, where: str) -> LiveMapView | None:
    """The live map `snap` carries (None for a dump without one); its row-map file must be in
    `files` and hold the map the histogram names."""
    try:
        live = LiveMap.from_meta(snap.histogram.meta)
    except ValueError as exc:
        raise InputError(f"dump file's live map is malformed: {exc}", file=f"{where}/{snap.name}") from None
    if live is None:
        return None
    data = files.get(live.file)
    if data is None:
        raise RecipegenError(f"{where}/{snap.name} names its live map {live.file}, which is not in "
                             "the dump folder (removed, or the runtime was stopped while writing)")
    try:
        rowmap = parse_rowmap(data.decode("utf-8"), f"{where}/{live.file}")
    except (FormatError, UnicodeDecodeError) as exc:
        raise InputError(f"live map file is not a valid row map: {exc}", file=f"{where}/{live.file}") from None
    if rowmap.content_hash() != live.content_hash:
        raise RecipegenError(f"{where}/{live.file} holds map {rowmap.content_hash()[:12]}, but its dump "
                             f"{snap.name} says the banks held {live.content_hash[:12]}: not the same write")
    return LiveMapView(snap, live, rowmap)


def latest_live_map(files: Mapping[str, bytes], *, where: str, lane: str | None = None
                    ) -> LiveMapView | None:
    """The newest snapshot's live map among `files` (None when no snapshot carries one)."""
    for snap in reversed(snapshots(dict(files), where=where, lane=lane)):
        view = live_map_of(files, snap, where=where)
        if view is not None:
            return view
    return None


def cold_share_under(view: LiveMapView, counts: Histogram) -> float:
    """The cold share of `counts` under the live map (`drift`'s formula)."""
    from recipegen.ops.drift import live_cold_share

    return live_cold_share(counts, view.rowmap, what=f"counts of {view.snapshot.name}")


def describe(view: dict[str, Any]) -> str:
    """One line for people from `LiveMapView.against`'s figures."""
    recipe = view.get("recipe_content_hash")
    same = ("" if not recipe else " = the recipe's map" if view["matches_recipe"]
            else f" ≠ the recipe's {recipe[:12]}")
    share = view.get("cold_share_now")
    now = f"cold share now {share:.2%} (last barrier's window" + (
        f", profile {view['prior']})" if view.get("prior") else ")") if share is not None else \
        "no barrier yet"
    return (f"live map {view['content_hash'][:12]}{same}; {view['swaps']} swap(s) in "
            f"{view['barriers']} barrier(s); {now}; from {view['snapshot']}")


def save_live(loaded: Any, lane_name: str, cls_name: str, files: Mapping[str, bytes], *, where: str,
              output: Any = None) -> tuple[Any, LiveMapView]:
    """Write the newest live map of `lane_name` among `files` as class `cls_name`'s map (its
    `rowmap` file in the recipe), or to `output`. Refused unless it fits the lane: the model's
    MoE layers and experts, and the lane's budget (the shape of the map it runs)."""
    from pathlib import Path

    from expert_residency.formats import save_rowmap

    recipe = loaded.recipe
    lane = next((l for l in recipe.lanes if l.name == lane_name), None)
    if lane is None:
        raise InputError(f"{recipe.name} has no lane {lane_name!r} (lanes: "
                         f"{', '.join(l.name for l in recipe.lanes)})", file=str(loaded.path), field="lanes")
    target: Path
    if output is None:
        cls = lane.classes.get(cls_name)
        if cls is None or not cls.rowmap:
            raise InputError(f"lane {lane_name} has no class {cls_name!r} with a row map (classes: "
                             f"{', '.join(lane.classes) or 'none'}); declare it in the recipe first, "
                             "or write the map elsewhere with --output", file=str(loaded.path),
                             field=f"lanes.{lane_name}.classes")
        target = loaded.resolve(cls.rowmap)
    else:
        target = Path(output)
    view = latest_live_map(files, where=where, lane=lane_name)
    if view is None:
        raise RecipegenError(f"no snapshot of lane {lane_name} in {where} carries a live map (is "
                             "offload.adaptive on for the lane, and has its runtime written a snapshot?)")
    live = view.rowmap
    model = recipe.model
    if list(live.moe_layer_indices) != list(model.moe_layers) or live.num_experts != model.routed_experts:
        raise RecipegenError(f"the live map in {view.snapshot.name} covers MoE layers "
                             f"{live.moe_layer_indices[0]}..{live.moe_layer_indices[-1]} of "
                             f"{live.num_experts} experts; {model.name} has {len(model.moe_layers)} MoE "
                             f"layers of {model.routed_experts} (a pipeline stage's dump holds its own "
                             "layers only)")
    running = loaded.rowmaps.get((lane_name, lane.active_class))
    if running is not None and live.shape_hash() != running.shape_hash():
        raise RecipegenError(f"the live map's hot/cold counts (shape {live.shape_hash()[:12]}) are not "
                             f"the lane's budget (its {lane.active_class} map, shape "
                             f"{running.shape_hash()[:12]})")
    kept = RowMap(live.moe_layer_indices, live.num_experts, live.hot, live.cold,
                  {**live.provenance, "saved_from": view.snapshot.name, "lane": lane_name,
                   "class": cls_name})
    try:
        save_rowmap(kept, target)
    except OSError as exc:
        raise InputError(f"cannot write ({exc.strerror or exc})", file=str(target)) from None
    return target, view
