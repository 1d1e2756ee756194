"""The live map of an adaptive lane, as its dumps carry it (`expert_residency.core.dump`:
`meta.live_map` and the `<stem>.rowmap` beside each histogram): what `status` and `drift` show,
and what `rowmap save-live` keeps as a class's map.

Pure reading of a dump folder's files (name → bytes); the callers fetch them (through the engine,
or from the lane's host folder).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from expert_residency.contract import env as runtime_env
from expert_residency.core.adaptive_setup import parse_adaptive_spec
from expert_residency.core.dump import LiveMap
from expert_residency.formats import FormatError, Histogram, RowMap, parse_rowmap

from recipegen.common.errors import InputError, RecipegenError
from recipegen.common.units import format_count
from recipegen.ops.dumps import Snapshot, snapshots


@dataclass(frozen=True)
class LiveMapView:
    """One dump's live map: the runtime's description, the map itself, and the snapshot it came with."""

    snapshot: Snapshot
    live: LiveMap
    rowmap: RowMap

    def against(self, recipe_hash: str | None) -> dict[str, Any]:
        """JSON-ready figures, the live hash set against the recipe's map for the class.

        `verified` names the figures recomputed or cross-checked here (`live_map_of`);
        `reported` those taken on the runtime's word (nothing here can recompute a window's cold
        share or which profile the policy chose) — printed as the runtime's report."""
        return {"snapshot": self.snapshot.name, "content_hash": self.live.content_hash,
                "recipe_content_hash": recipe_hash or None,
                "matches_recipe": None if not recipe_hash else recipe_hash == self.live.content_hash,
                "boot_content_hash": self.live.boot_content_hash, "shape_hash": self.live.shape_hash,
                "barriers": self.live.barriers, "swaps": self.live.swaps,
                "cold_share_now": self.live.window_cold_share, "prior": self.live.prior,
                "verified": list(VERIFIED), "reported": list(REPORTED)}


# What `live_map_of` checks of a dump's live map, and what it can only pass on as reported.
VERIFIED = ("content_hash: recomputed from the map file",
            "shape_hash: recomputed from the map file",
            "file: the snapshot's own live-map name",
            "boot_content_hash, barriers, swaps: equal in the histogram's meta and the map file's "
            "provenance, swaps within barriers × MoE layers × experts")
REPORTED = ("cold_share_now", "prior")


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
    problems = _live_map_problems(snap, live, rowmap)
    if problems:
        raise InputError("the dump's live map contradicts itself: " + "; ".join(problems) +
                         " (edited, or not written by the runtime); nothing of it is reported",
                         file=f"{where}/{snap.name}")
    return LiveMapView(snap, live, rowmap)


def _live_map_problems(snap: Snapshot, live: LiveMap, rowmap: RowMap) -> list[str]:
    """Every figure of `meta.live_map` that can be checked, checked: the map's shape hash
    (recomputed), its file name (the snapshot's own), and the counters the runtime writes twice
    (the histogram's meta and the map's provenance, `expert_residency.core.dump._save_live_map`)."""
    from expert_residency.core.dump import live_map_file_name

    problems = []
    if rowmap.shape_hash() != live.shape_hash:
        problems.append(f"meta.live_map.shape_hash {live.shape_hash[:12]} but the map's is "
                        f"{rowmap.shape_hash()[:12]}")
    if live.file != live_map_file_name(snap.name):
        problems.append(f"meta.live_map.file {live.file[:60]!r} is not this snapshot's live map "
                        f"({live_map_file_name(snap.name)})")
    prov = rowmap.provenance
    for key in ("boot_content_hash", "barriers", "swaps"):
        if key in prov and prov[key] != getattr(live, key):
            problems.append(f"meta.live_map.{key} {str(getattr(live, key))[:16]} but the map file's "
                            f"provenance says {str(prov[key])[:16]}")
    ceiling = live.barriers * len(rowmap.moe_layer_indices) * rowmap.num_experts
    if live.swaps > ceiling:
        problems.append(f"{format_count(live.swaps, 'swap')} in {format_count(live.barriers, 'barrier')} over "
                        f"{len(rowmap.moe_layer_indices)} layers of {rowmap.num_experts} experts: more "
                        f"than the {ceiling} possible")
    if live.prior is not None and (not isinstance(live.prior, str) or not _NAME.fullmatch(live.prior)):
        problems.append("meta.live_map.prior is not a profile name")
    return problems


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a class, a histogram stem, "mixture"


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
    now = f"cold share now {share:.2%} (the runtime's report of its last barrier's window" + (
        f", profile {view['prior']})" if view.get("prior") else ")") if share is not None else \
        "no barrier yet"
    return (f"live map {view['content_hash'][:12]}{same}; {format_count(view['swaps'], 'swap')} in "
            f"{format_count(view['barriers'], 'barrier')}; {now}; from {view['snapshot']}")


def adaptive_lane(loaded: Any, lane_name: str) -> Any:
    """The recipe's lane `lane_name`, which must be adaptive: only an adaptive lane's runtime writes
    a live row map into its snapshots (docs/adaptive.md). Checked before any dump is read, so a
    lane without `offload.adaptive` is refused at its line, not as a missing dump folder."""
    index, lane = loaded.lane_at(lane_name)
    if lane.offload.adaptive is None:
        raise loaded.error(f"lane {lane_name} has no offload.adaptive: save-live reads the live row map an "
                           "adaptive lane writes (docs/adaptive.md)", ("lanes", index, "offload"))
    return lane


def save_live(loaded: Any, lane_name: str, cls_name: str, files: Mapping[str, bytes], *, where: str,
              output: Any = None) -> tuple[Any, LiveMapView]:
    """Write the newest live map of `lane_name` among `files` as class `cls_name`'s map (its
    `rowmap` file in the recipe), or to `output`. Refused unless it fits the lane: the model's
    MoE layers and experts, and the lane's budget (the shape of the map it runs)."""
    from pathlib import Path

    from expert_residency.formats import format_rowmap

    from recipegen.common.files import output_target
    from recipegen.common.lock import sweep_temps, write_atomically

    recipe = loaded.recipe
    lane = adaptive_lane(loaded, lane_name)
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
    adaptive = lane.offload.adaptive
    if adaptive is not None:
        cap = view.live.barriers * len(live.moe_layer_indices) * adaptive.swaps_per_layer
        if view.live.swaps > cap:
            raise RecipegenError(f"{view.snapshot.name} reports {format_count(view.live.swaps, 'swap')} in "
                                 f"{format_count(view.live.barriers, 'barrier')}, more than the lane's "
                                 f"offload.adaptive.swaps_per_layer {adaptive.swaps_per_layer} allows "
                                 f"over {len(live.moe_layer_indices)} MoE layers ({cap}): not this "
                                 "lane's runtime, or edited; not saved")
    running = loaded.rowmaps.get((lane_name, lane.active_class))
    if running is not None and live.shape_hash() != running.shape_hash():
        raise RecipegenError(f"the live map's hot/cold counts (shape {live.shape_hash()[:12]}) are not "
                             f"the lane's budget (its {lane.active_class} map, shape "
                             f"{running.shape_hash()[:12]})")
    kept = RowMap(live.moe_layer_indices, live.num_experts, live.hot, live.cold,
                  {**live.provenance, "saved_from": view.snapshot.name, "lane": lane_name,
                   "class": cls_name})
    # The class's file replaces a regular file only, as every output does: a link to another map
    # (inside the project) would be replaced by this one, not written through.
    output_target(target, "--output" if output is not None else f"lanes.{lane_name}.classes.{cls_name}.rowmap")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep_temps(target.parent)  # what a save-live killed at its rename left
        write_atomically(target, format_rowmap(kept).encode("utf-8"))
    except OSError as exc:
        raise InputError(f"cannot write ({exc.strerror or exc})", file=str(target)) from None
    return target, view
