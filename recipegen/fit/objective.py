"""What `fit` maximises among the placements where every budget holds: the one place a speed
figure enters the search.

Today that figure is the cost model's projected link time per decode step (`recipegen.costmodel`:
cold expert bytes read over the host link at the lane's fewest streams, from the class histogram's
cold share under the candidate's map; docs/costmodel.md section 1) — less is faster, and every
expert in HBM reads nothing. It ranks placements by what they read over the link, not by a step
time: the step-time estimate (`recipegen.costmodel` tokens per second, when it lands) replaces
`project` here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recipegen.costmodel.fetch import fetch_tax
from recipegen.costmodel.lane import unique_model_for
from recipegen.costmodel.parallel import gpu_reads
from recipegen.schema import Lane, Machine, Model


@dataclass(frozen=True)
class Projection:
    """A candidate's speed figure: `score` orders candidates (higher is faster)."""

    score: float
    text: str          # for people: the figure with its unit
    basis: str         # what it was computed from

    def to_json(self) -> dict[str, object]:
        return {"score": self.score, "text": self.text, "basis": self.basis}


def project(model: Model, machine: Machine, lane: Lane, cold_share_per_layer: Sequence[float],
            share_basis: str) -> Projection:
    """The projected link time per decode step at the lane's fewest expected streams (k from its
    speculative schedule), negated as the score."""
    streams = lane.concurrency.min
    k = 0 if lane.speculative is None else lane.speculative.k_at(streams)
    if not any(cold_share_per_layer):
        return Projection(0.0, "no link reads (every routed expert in HBM)", "nothing offloaded")
    reads = gpu_reads(model, lane)
    unique = unique_model_for(model).unique(k, streams)
    tax = fetch_tax(moe_layers=model.num_moe_layers, unique_per_layer=unique,
                    cold_share=list(cold_share_per_layer), bytes_per_expert=reads.bytes_per_expert,
                    link_bandwidth=machine.pinned_read_bandwidth)
    ms = tax.fetch_ms if reads.mode != "ep" else tax.fetch_ms / reads.gpus
    return Projection(-ms, f"{ms:,.2f} ms of link reads per decode step (C{streams} k={k})",
                      f"{share_basis}; {unique:.1f} unique experts per layer per step; "
                      f"{machine.pinned_read_bandwidth / 1e9:g} GB/s link (docs/costmodel.md)")
