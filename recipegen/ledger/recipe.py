"""The ledger of a whole recipe: every lane (one machine, or one ledger per stage of a lane over
several machines) and the budgets lanes share (a machine's host memory, a GPU used by two lanes)."""

from __future__ import annotations

from typing import Any

from recipegen.common.units import format_bytes
from recipegen.ledger.lane import compute_lane
from recipegen.ledger.multinode import MultiNodeLaneLedger, compute_multinode_lane, stage_engines
from recipegen.ledger.result import LaneLedger, RecipeLedger, Violation
from recipegen.schema import Lane, Recipe


def compute_ledger(loaded: Any) -> RecipeLedger:
    """The ledger of a `LoadedRecipe` (its `.recipe`, `.path` and the row maps it read)."""
    recipe: Recipe = loaded.recipe
    lanes: list[LaneLedger] = []
    for lane in recipe.lanes:
        rowmap = None
        rowmap_file = None
        if lane.active_class is not None:
            rowmap = loaded.rowmaps.get((lane.name, lane.active_class))
            rowmap_file = lane.classes[lane.active_class].rowmap
        if lane.parallel is not None:  # a lane over several machines: one ledger per stage
            lanes.append(compute_multinode_lane(
                recipe, lane, rowmap_hot=rowmap.hot_counts() if rowmap is not None else None,
                rowmap_label=(f"row map {rowmap_file} (class {lane.active_class})"
                              if rowmap is not None else None)))
            continue
        lanes.append(compute_lane(recipe.model, recipe.machines[lane.machine], lane,
                                  rowmap_hot=rowmap.hot_counts() if rowmap is not None else None,
                                  rowmap_label=(f"row map {rowmap_file} (class {lane.active_class})"
                                                if rowmap is not None else None),
                                  rowmap_hot_ids=rowmap.hot if rowmap is not None else None))
    return RecipeLedger(recipe.name, str(loaded.path), lanes, machine_checks(recipe, lanes))


def concurrent_total(members: list[tuple[Lane, LaneLedger]], key: str) -> float:
    """Figure `key` over lanes sharing a machine, as they can be up together: every always-on
    lane plus the largest lane with a compose profile (those come up one at a time)."""
    always = sum(g.fig(key).value for l, g in members if l.profile is None)
    optional = [g.fig(key).value for l, g in members if l.profile is not None]
    return always + (max(optional) if optional else 0)


def machine_checks(recipe: Recipe, lanes: list[LaneLedger]) -> list[Violation]:
    """Budgets shared by lanes: host memory of a machine, and GPUs used by more than one lane.

    Lanes with a compose profile are not always on: they count one at a time (the largest).
    """
    out: list[Violation] = []
    by_machine: dict[str, list[tuple[Lane, LaneLedger]]] = {}
    for lane, ledger in zip(recipe.lanes, lanes):
        if isinstance(ledger, MultiNodeLaneLedger):  # a lane over several machines: each stage on its own
            for machine_name, stage_lane, stage_ledger in stage_engines(lane, ledger):
                by_machine.setdefault(machine_name, []).append((stage_lane, stage_ledger))
            continue
        by_machine.setdefault(lane.machine, []).append((lane, ledger))
    for name, members in by_machine.items():
        if len(members) < 2:
            continue
        machine = recipe.machines[name]
        always = [(l, g) for l, g in members if l.profile is None]
        host = concurrent_total(members, "host.total")
        if host > machine.host_memory:
            over = host - machine.host_memory
            out.append(Violation(
                "machine-host", f"lanes on machine {name!r} together use {format_bytes(host)} of host "
                f"memory, {format_bytes(over)} over {format_bytes(machine.host_memory)}",
                "give lanes a compose profile so they are not up together, or raise their hot experts",
                over, machine=name))
        gpu_util: dict[int, list[tuple[str, float]]] = {}
        for lane, _ in always:
            share = lane.gpu_memory_utilization if lane.gpu_memory_utilization is not None else \
                (lane.kv_cache_bytes or 0) / machine.gpus.usable
            for gpu in lane.gpus:
                gpu_util.setdefault(gpu, []).append((lane.name, share))
        for gpu, users in sorted(gpu_util.items()):
            if len(users) > 1 and sum(u for _, u in users) > 1.0:
                out.append(Violation(
                    "gpu-shared", f"GPU {gpu} of {name!r} is shared by always-on lanes "
                    + ", ".join(f"{n} ({u:.2f})" for n, u in users)
                    + f" whose utilisations sum to {sum(u for _, u in users):.2f} > 1",
                    "lower their gpu_memory_utilization, or give all but one a compose profile",
                    machine=name))
    return out
