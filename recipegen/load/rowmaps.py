"""Read a lane's row maps and check them against the recipe (the map is the truth, the budget
must agree): geometry and per-layer counts vs the declared budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recipegen.common.units import format_count
from recipegen.ledger.budget import declared_split
from recipegen.load.document import Problem
from recipegen.schema import Recipe


def read_lane_rowmaps(recipe: Recipe, lane_index: int, base_dir: Path) -> tuple[dict[str, Any], list[Problem]]:
    """Row maps of a usage-aware lane's classes, by class, plus every problem found."""
    lane = recipe.lanes[lane_index]
    if lane.offload.placement != "usage-aware":
        return {}, []
    from expert_residency.formats import FormatError, load_rowmap  # local: numpy, only for usage-aware lanes

    model = recipe.model
    split = declared_split(model, lane.offload)
    maps: dict[str, Any] = {}
    problems: list[Problem] = []
    for name, cls in lane.classes.items():
        if cls.rowmap is None:
            continue
        loc = ("lanes", lane_index, "classes", name, "rowmap")
        try:
            rowmap = load_rowmap(base_dir / cls.rowmap)
        except FormatError as exc:
            problems.append((loc, f"row map {cls.rowmap} is unreadable: {exc}"))
            continue
        if rowmap.num_experts != model.routed_experts:
            problems.append((loc, f"row map {cls.rowmap} has {rowmap.num_experts} experts per layer; "
                             f"model {model.name} has {model.routed_experts}"))
            continue
        if tuple(rowmap.moe_layer_indices) != tuple(model.moe_layers):
            problems.append((loc, f"row map {cls.rowmap} covers MoE layers "
                             f"{_ranges(rowmap.moe_layer_indices)}; model {model.name} has "
                             f"{_ranges(model.moe_layers)}"))
            continue
        hot = rowmap.hot_counts()
        if split.declared == "hot_experts_per_layer":
            wrong = [(layer, n) for layer, n in zip(rowmap.moe_layer_indices, hot)
                     if n != split.hot_per_layer]
            if wrong:
                layer, n = wrong[0]
                problems.append((loc, f"row map {cls.rowmap} disagrees with the budget "
                                 f"(offload.hot_experts_per_layer = {split.hot_per_layer}): layer "
                                 f"{layer} has {n} hot ({format_count(len(wrong), 'layer')} differ{'s' if len(wrong) == 1 else ''}). The map is the "
                                 "truth: rebuild it for this budget or change the budget"))
                continue
        else:
            want = split.hot_per_layer * len(hot)
            if sum(hot) != want:
                problems.append((loc, f"row map {cls.rowmap} holds {sum(hot)} hot experts in all, "
                                 f"but offload.cold_experts_budget buys {split.cold_per_layer} cold "
                                 f"per layer ({want} hot in all): rebuild the map or change the budget"))
                continue
        maps[name] = rowmap
    return maps, problems


def _ranges(indices: Any) -> str:
    values = list(indices)
    if values and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}-{values[-1]}"
    return ",".join(str(v) for v in values)
