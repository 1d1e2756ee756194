"""Cold reads of a lane of several GPUs: what each GPU reads from host memory per decode step.

- Tensor parallel (TP): every rank holds its 1/TP shard of every expert, cold ones included
  (docs/parallel.md), and reads only that shard of each cold pick, over its own host link, while
  the other ranks read theirs. Per-GPU fetch = lane cold bytes / TP over one link.
- Expert parallel (EP, `--enable-expert-parallel`): a rank holds whole experts (vLLM's expert map,
  `recipegen.ledger.parallel.ep_local_experts`) and reads only the cold picks of its own experts.
  The step waits for the slowest rank (the all-reduce after the experts), so the projection is
  the rank whose expected cold share (its cold experts' selections ÷ all selections, from the row
  map and histogram) is largest. That is the largest expectation, not the expectation of the
  largest: per-step fluctuations make the real straggler somewhat slower.

`ONE_LINK_PER_GPU` is the assumption every per-GPU figure rests on: the machine catalog does not
say how many GPUs share a host link (a PCIe switch's uplink to the CPU); where two GPUs share one,
their reads at the same time take up to twice as long.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from recipegen.ledger.parallel import ep_local_experts, ep_placement_strategy, expert_parallel

ONE_LINK_PER_GPU = ("assumed: one host link per GPU, none shared (the machine catalog does not say how many "
                    "GPUs share a PCIe switch's uplink; if two share one, their reads at the same time take up "
                    "to twice as long)")
"""Printed wherever a per-GPU fetch figure is shown."""


@dataclass(frozen=True)
class GpuReads:
    """How the lane's cold reads fall on its GPUs."""

    mode: str
    """`one` (a single GPU), `tp` or `ep`."""
    gpus: int
    """GPUs of the lane, each reading over its own link."""
    bytes_per_expert: float
    """Bytes one GPU reads of one cold pick: the whole expert (one GPU, EP) or its 1/TP shard."""

    def header(self, link_gb_s: float) -> str:
        if self.mode == "tp":
            return (f"per GPU: each of the {self.gpus} TP ranks reads its 1/{self.gpus} shard of every cold pick "
                    f"({self.bytes_per_expert:,.0f} B) over its own {link_gb_s:g} GB/s link, at the same time")
        if self.mode == "ep":
            return (f"per GPU: each of the {self.gpus} EP ranks reads the cold picks of its own experts over its "
                    f"own {link_gb_s:g} GB/s link; the step waits for the rank with the largest cold share")
        return ""


def gpu_reads(model: Any, lane: Any) -> GpuReads:
    """The lane's split of cold reads over its GPUs."""
    gpus = lane.tensor_parallel_size
    e = model.expert_bytes
    if gpus == 1:
        return GpuReads("one", 1, e)
    if expert_parallel(lane):
        return GpuReads("ep", gpus, e)
    return GpuReads("tp", gpus, e / gpus)


def ep_rank_cold_shares(counts: Sequence[Sequence[float]], cold_ids: Sequence[Sequence[int]],
                        routed_experts: int, ep: int, strategy: str) -> list[tuple[float, ...]]:
    """Per EP rank, per MoE layer: selections of the rank's cold experts ÷ all selections of the layer
    (0 for an empty layer). `counts[l][g]`: the histogram; `cold_ids[l]`: the row map's cold experts."""
    out = []
    for rank in range(ep):
        mine = set(ep_local_experts(rank, routed_experts, ep, strategy))
        shares = []
        for row, cold in zip(counts, cold_ids):
            total = float(sum(row))
            shares.append(sum(float(row[g]) for g in cold if g in mine) / total if total else 0.0)
        out.append(tuple(shares))
    return out


def fullest_rank(per_rank: Sequence[Sequence[float]]) -> tuple[int, tuple[float, ...]]:
    """The rank with the largest total cold share (first of equals) and its per-layer shares."""
    totals = [sum(s) for s in per_rank]
    rank = max(range(len(per_rank)), key=lambda r: (totals[r], -r))
    return rank, tuple(per_rank[rank])


def lane_ep_shares(model: Any, lane: Any, rowmap: Any, histogram: Any) -> list[tuple[float, ...]] | None:
    """Per-rank cold shares of an EP lane from its row map and histogram (None for other lanes)."""
    if lane.tensor_parallel_size == 1 or not expert_parallel(lane):
        return None
    return ep_rank_cold_shares(histogram.counts.tolist(), rowmap.cold, model.routed_experts,
                               lane.tensor_parallel_size, ep_placement_strategy(lane))
