"""The cost model per pipeline stage: cold-expert bytes each stage reads from its own machine's host
memory per decode step, and what that costs over its GPU↔host link.

Each stage reads only its own layers' cold experts, over its own machine's link, so the lane's
fetch is the sum over stages (stages run one after another for a token: their fetch times add).
A stage that keeps every expert in HBM reads nothing. Same formulas as the single-machine lane
(`recipegen.costmodel.fetch.fetch_tax`), applied to the stage's MoE layers and its machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from recipegen.costmodel.fetch import fetch_tax
from recipegen.costmodel.lane import ColdShare, _k_at, lane_cold_shares, unique_model_for


@dataclass(frozen=True)
class StageFetch:
    rank: int
    machine: str
    streams: int
    k: int
    cold_bytes_per_step: float
    fetch_ms: float
    basis: str

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "machine": self.machine, "streams": self.streams, "k": self.k,
                "cold_bytes_per_step": self.cold_bytes_per_step, "fetch_ms": self.fetch_ms,
                "basis": self.basis}


def stage_fetch(loaded: Any, ledger_lane: Any, *, streams: Sequence[int] | None = None) -> list[StageFetch]:
    """Per stage and concurrency: host bytes per decode step for the lane's active class."""
    recipe = loaded.recipe
    lane = recipe.lane(ledger_lane.lane)
    model = recipe.model
    points = sorted({lane.concurrency.min, lane.concurrency.max}) if streams is None else list(streams)
    unique = unique_model_for(model)
    shares: dict[str, ColdShare | str] = {}
    if lane.active_class is not None:
        shares = lane_cold_shares(loaded, lane, ledger_lane)
    share = shares.get(lane.active_class or "")
    out: list[StageFetch] = []
    for stage in ledger_lane.stages:
        machine = recipe.machines[stage.machine]
        layers = list(stage.layers.moe_layers)
        cold = stage.ledger.active.cold_per_layer
        for s in points:
            k = _k_at(lane, s)
            if not any(cold):
                out.append(StageFetch(stage.rank, stage.machine, s, k, 0.0, 0.0,
                                      "every expert of this stage in HBM: nothing read from host"))
                continue
            if isinstance(share, ColdShare) and share.per_layer is not None:
                index = [model.moe_layers.index(layer) for layer in layers]
                stage_share: float | list[float] = [share.per_layer[i] for i in index]
                basis = f"{share.basis}, layers {layers[0]}–{layers[-1]}"
            else:
                # No histogram: usage-blind share (cold experts per layer ÷ routed experts).
                stage_share = [c / model.routed_experts for c in cold]
                basis = (f"no cold share from a histogram ({share or 'no active class'}): usage-blind, "
                         "cold experts ÷ routed experts per layer")
            tax = fetch_tax(moe_layers=len(layers), unique_per_layer=unique.unique(k, s),
                            cold_share=stage_share, bytes_per_expert=model.expert_bytes,
                            link_bandwidth=machine.pinned_read_bandwidth)
            out.append(StageFetch(stage.rank, stage.machine, s, k, tax.cold_bytes.value, tax.fetch_ms, basis))
    return out


def attach_stage_fetch(loaded: Any, ledger: Any) -> None:
    """Fill `stage_fetch` of every multi-node lane of a RecipeLedger (shown by check budgets)."""
    for lane in ledger.lanes:
        if hasattr(lane, "stages"):
            lane.stage_fetch = stage_fetch(loaded, lane)
