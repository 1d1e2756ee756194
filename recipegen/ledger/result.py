"""What the ledger returns: figures per lane and placement, violations, and the recipe's verdict.

Plain data with `to_json`; no formula lives here (the formulas are in `lane`, `placements`,
`reserves`, `load` and `verdict`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recipegen.common.units import GiB
from recipegen.ledger.figures import Figure
from recipegen.schema import Model

USAGE_AWARE, POSITIONAL = "usage-aware", "positional"


@dataclass(frozen=True)
class Violation:
    """A budget that does not hold: which, by how much, and what to change."""

    kind: str          # hbm | kv | host | load-hbm | load-host | reserve | gpu-shared | machine-host | parallel | runtime | attention
    message: str
    suggestion: str
    over_bytes: float | None = None
    lane: str | None = None
    machine: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "message": self.message, "suggestion": self.suggestion}
        if self.over_bytes is not None:
            out["over_bytes"] = self.over_bytes
            out["over_gib"] = self.over_bytes / GiB
        if self.lane:
            out["lane"] = self.lane
        if self.machine:
            out["machine"] = self.machine
        return out


@dataclass
class PlacementLedger:
    """One way of placing the lane's experts, with what it leaves for KV."""

    placement: str
    hot_per_layer: list[int]
    cold_per_layer: list[int]
    basis: str               # where the counts come from
    hot_bytes: int           # routed-expert bytes in HBM (lane total)
    cold_bytes: int          # routed-expert bytes pinned in host
    figures: dict[str, Figure] = field(default_factory=dict)
    dense_host_bytes: float = 0   # non-routed bytes --cpu-offload-gb moved to host at load (stay there)

    def counts_label(self) -> str:
        return f"{span(self.hot_per_layer)} hot / {span(self.cold_per_layer)} cold per layer"

    @property
    def fits(self) -> bool:
        """Whether its KV pool holds one max_model_len sequence (a comparison column may not)."""
        return self.figures["kv.full_sequences"].value >= 1

    @property
    def kv_pool_shortfall(self) -> float:
        """Bytes the KV pool is below zero (0 when there is a pool): the hot experts alone overfill the cap."""
        return max(0.0, -self.figures["hbm.kv_pool"].value)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"placement": self.placement, "basis": self.basis,
                               "hot_per_layer": compact(self.hot_per_layer),
                               "cold_per_layer": compact(self.cold_per_layer),
                               "figures": {k: f.to_json() for k, f in self.figures.items()}}
        if "kv.full_sequences" in self.figures and "hbm.kv_pool" in self.figures:
            # a negative figures.hbm.kv_pool is a shortfall, not a pool: say so rather than leave a reader the sign
            out.update(fits=self.fits, kv_pool_shortfall_bytes=self.kv_pool_shortfall,
                       kv_pool_shortfall_gib=self.kv_pool_shortfall / GiB)
        return out


@dataclass
class LaneLedger:
    lane: str
    machine: str
    gpus: list[int]
    placement: str
    figures: dict[str, Figure]
    usage_aware: PlacementLedger
    positional: PlacementLedger | None
    violations: list[Violation]
    notes: list[str]

    @property
    def ok(self) -> bool:
        return not self.violations

    def fig(self, key: str) -> Figure:
        return self.figures[key]

    @property
    def active(self) -> PlacementLedger:
        """The lane's own placement."""
        if self.placement == POSITIONAL:
            assert self.positional is not None
            return self.positional
        return self.usage_aware

    def to_json(self) -> dict[str, Any]:
        return {"lane": self.lane, "machine": self.machine, "gpus": self.gpus,
                "placement": self.placement, "placement_label": placement_label(self), "ok": self.ok,
                "figures": {k: f.to_json() for k, f in self.figures.items()},
                "usage_aware": self.usage_aware.to_json(),
                "positional": self.positional.to_json() if self.positional else None,
                "violations": [v.to_json() for v in self.violations], "notes": self.notes}


def placement_label(lane: LaneLedger) -> str:
    """The lane's placement as a user reads it: "all in HBM" where nothing is cold (a lane with no
    offload is positional at 0 GiB to vLLM, which says nothing useful). The one owner of that name:
    the ledger table, `plan`, and every --json that carries `placement_label`."""
    return "all in HBM" if not any(lane.active.cold_per_layer) else lane.placement


@dataclass
class RecipeLedger:
    recipe: str
    path: str
    lanes: list[LaneLedger]
    machine_violations: list[Violation]

    @property
    def violations(self) -> list[Violation]:
        return [v for lane in self.lanes for v in lane.violations] + self.machine_violations

    @property
    def ok(self) -> bool:
        return not self.violations

    def lane(self, name: str) -> LaneLedger:
        for lane in self.lanes:
            if lane.lane == name:
                return lane
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "path": self.path, "ok": self.ok,
                "lanes": [lane.to_json() for lane in self.lanes],
                "machine_violations": [v.to_json() for v in self.machine_violations]}


def n_total_bytes(model: Model) -> int:
    """`experts.total`: the schema owns the figure (`Model.routed_expert_bytes`)."""
    return model.routed_expert_bytes


def src_note(sources: dict[str, str], key: str) -> str:
    return f"source: {sources[key]}" if key in sources else ""


def rounded(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(x, 3)


def span(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}–{hi}"


def compact(values: list[int]) -> list[int] | int:
    return values[0] if len(set(values)) == 1 else values
