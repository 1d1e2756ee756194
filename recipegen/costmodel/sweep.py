"""Sweep a lane's hot experts per layer: HBM ↔ KV tokens ↔ host ↔ projected fetch tax.

Every budget figure of every row comes from `recipegen.ledger.compute_lane` run on the lane
with that hot count (usage-aware, budget only); the cold share of each row is the class's
histogram under the top-N map with that many hot experts (`recipegen.rowmap.build_top_n`) —
in-sample, so optimistic for traffic the histogram did not see.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipegen.common.errors import InputError
from recipegen.costmodel.lane import ColdShare, FetchPoint, _load_histogram, fetch_points, unique_model_for

_SWEEP_RE = re.compile(r"^\s*hot\s*=\s*(\d+)\s*\.\.\s*(\d+)\s*(?::\s*(\d+))?\s*$")


def parse_sweep(text: str, num_experts: int) -> tuple[list[int], int | None]:
    """`hot=250..384` or `hot=250..384:5` -> (every hot count in range, the table step or None)."""
    match = _SWEEP_RE.match(text)
    if not match:
        raise InputError(f"cannot read {text!r}; write hot=LOW..HIGH or hot=LOW..HIGH:STEP (e.g. hot=250..384)",
                         field="--sweep")
    low, high = int(match.group(1)), int(match.group(2))
    step = int(match.group(3)) if match.group(3) else None
    if low > high:
        raise InputError(f"range {low}..{high} runs backwards", field="--sweep")
    if high > num_experts:
        raise InputError(f"hot count {high} exceeds the model's {num_experts} routed experts per layer",
                         field="--sweep")
    if step is not None and step < 1:
        raise InputError("the step must be at least 1", field="--sweep")
    return list(range(low, high + 1)), step


@dataclass(frozen=True)
class SweepRow:
    hot: int
    cold: int
    hot_bytes: float          # per GPU, ledger hbm.hot_experts
    cold_bytes: float         # lane total pinned in host, ledger placement.cold_experts
    kv_pool_bytes: float      # per GPU, ledger hbm.kv_pool
    kv_tokens: float          # ledger kv.tokens
    host_headroom: float      # ledger host.headroom
    violations: tuple[str, ...]
    cold_share: float | None
    points: tuple[FetchPoint, ...]

    def to_json(self) -> dict[str, Any]:
        return {"hot_per_layer": self.hot, "cold_per_layer": self.cold, "hbm_hot_experts_bytes": self.hot_bytes,
                "host_cold_experts_bytes": self.cold_bytes, "kv_pool_bytes": self.kv_pool_bytes,
                "kv_tokens": self.kv_tokens, "host_headroom_bytes": self.host_headroom,
                "violations": list(self.violations), "cold_share": self.cold_share,
                "fetch": [p.to_json() for p in self.points]}


@dataclass
class Sweep:
    recipe: str
    lane: str
    traffic_class: str | None
    histogram: str | None
    histogram_synthetic: bool
    current_hot: float
    max_model_len: int
    streams: list[int]
    rows: list[SweepRow] = field(default_factory=list)
    positional: bool = False
    notes: list[str] = field(default_factory=list)

    def row(self, hot: int) -> SweepRow:
        for r in self.rows:
            if r.hot == hot:
                return r
        raise KeyError(hot)

    def to_json(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "lane": self.lane, "class": self.traffic_class,
                "histogram": self.histogram, "histogram_synthetic": self.histogram_synthetic,
                "current_hot_per_layer": self.current_hot, "max_model_len": self.max_model_len,
                "streams": self.streams, "rows": [r.to_json() for r in self.rows], "notes": self.notes}


def sweep_hot(loaded: Any, lane_name: str, hot_values: Sequence[int], *, traffic_class: str | None = None,
              streams: Sequence[int] | None = None) -> Sweep:
    """The ledger and the projected fetch tax of `lane_name` at every hot count in `hot_values`."""
    from recipegen.ledger import compute_lane, compute_ledger
    from recipegen.rowmap import build_top_n, cold_share_per_layer

    recipe = loaded.recipe
    try:
        lane = recipe.lane(lane_name)
    except (KeyError, ValueError, LookupError):
        raise InputError(f"no lane {lane_name!r} in the recipe (lanes: "
                         f"{', '.join(l.name for l in recipe.lanes)})", file=str(loaded.path), field="lanes") from None
    model, machine = recipe.model, recipe.machines[lane.machine]
    points = sorted({lane.concurrency.min, lane.concurrency.max}) if streams is None else list(streams)
    current = compute_ledger(loaded).lane(lane_name)
    # A positional lane is marked where usage-aware residency would sit at its byte budget.
    hot_now = current.usage_aware.hot_per_layer
    cls_name = traffic_class or lane.active_class
    if cls_name is None and lane.classes:
        cls_name = next((n for n, c in lane.classes.items() if c.histogram), None)
    histogram, hist_file = None, None
    if cls_name is not None:
        if cls_name not in lane.classes:
            raise InputError(f"lane {lane_name} has no class {cls_name!r} (classes: "
                             f"{', '.join(lane.classes) or 'none'})", field="--class")
        hist_file = lane.classes[cls_name].histogram
        if hist_file:
            histogram = _load_histogram(Path(loaded.path).parent / hist_file)
    unique = unique_model_for(model)
    result = Sweep(recipe.name, lane.name, cls_name, hist_file,
                   bool(histogram is not None and getattr(histogram, "meta", {}).get("synthetic")),
                   sum(hot_now) / len(hot_now), lane.max_model_len, points)
    if histogram is None:
        result.notes.append("no histogram for the class: the fetch tax column is left empty "
                            "(declare `histogram:` for the class, or pass --class)")
    else:
        result.notes.append(f"cold share per row: histogram {hist_file} under the top-N map with that many hot "
                            "experts per layer (in-sample: optimistic for traffic it did not see)")
    if lane.offload.placement == "positional":
        result.positional = True
        result.notes.append("this lane is positional; the sweep shows it as if usage-aware at each hot count, "
                            "and marks the hot count its --cpu-offload-gb budget would buy")
    for h in hot_values:
        offload = lane.offload.model_copy(update={"placement": "usage-aware", "hot_experts_per_layer": h,
                                                  "cold_experts_budget": None})
        ledger = compute_lane(model, machine, lane.model_copy(update={"offload": offload}))
        share, fetch = None, ()
        if histogram is not None:
            per_layer = tuple(float(x) for x in cold_share_per_layer(build_top_n(histogram, h), histogram))
            layer_totals = histogram.counts.sum(axis=1)
            total = float(layer_totals.sum())
            share = float((layer_totals * per_layer).sum() / total) if total else 0.0
            fetch = fetch_points(loaded, lane, ColdShare(share, per_layer, f"top-{h} map on {hist_file}"),
                                 points, unique)
        result.rows.append(SweepRow(
            hot=h, cold=model.routed_experts - h, hot_bytes=ledger.fig("hbm.hot_experts").value,
            cold_bytes=ledger.fig("placement.cold_experts").value, kv_pool_bytes=ledger.fig("hbm.kv_pool").value,
            kv_tokens=ledger.fig("kv.tokens").value, host_headroom=ledger.fig("host.headroom").value,
            violations=tuple(sorted({v.kind for v in ledger.violations})), cold_share=share, points=fetch))
    return result


def table_rows(sweep: Sweep, step: int | None, max_rows: int = 28) -> list[SweepRow]:
    """The rows to print: every `step`-th (chosen to fit `max_rows` when not given), plus the ends
    and the lane's current hot count."""
    rows = sweep.rows
    if not rows:
        return []
    if step is None:
        step = max(1, -(-len(rows) // max_rows))
    first = rows[0].hot
    keep = {r.hot for r in rows if (r.hot - first) % step == 0}
    keep |= {rows[0].hot, rows[-1].hot, round(sweep.current_hot)}
    return [r for r in rows if r.hot in keep]
