"""Which decoder layers each pipeline stage holds: vLLM 0.33's own rule, or a declared split.

Mirrors `vllm/distributed/utils.py::get_pp_indices` (vLLM 0.33.0): without
`VLLM_PP_LAYER_PARTITION`, `num_hidden_layers // pp` layers per stage and the remainder, one layer
each, to the stages before the last (`partitions[-i] += 1` for i in 2..remainder+1) — the last
stage also carries the final norm and LM head. A declared partition must sum to the layer count.
The tests check this against the installed vLLM's function.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class PartitionError(ValueError):
    """A declared layer partition that vLLM would refuse."""


@dataclass(frozen=True)
class StageLayers:
    """Decoder layers [start, end) of one pipeline stage and the MoE layers among them."""

    rank: int
    start: int
    end: int
    moe_layers: tuple[int, ...]

    @property
    def num_layers(self) -> int:
        return self.end - self.start

    def holds(self, layer: int) -> bool:
        return self.start <= layer < self.end


def vllm_partition(num_hidden_layers: int, pp_size: int) -> list[int]:
    """Layers per stage by vLLM's default rule (no VLLM_PP_LAYER_PARTITION)."""
    if pp_size < 1:
        raise PartitionError(f"pipeline size must be at least 1, got {pp_size}")
    if num_hidden_layers < pp_size:
        raise PartitionError(f"{num_hidden_layers} decoder layers cannot fill {pp_size} pipeline stages")
    per = num_hidden_layers // pp_size
    partitions = [per] * pp_size
    remaining = num_hidden_layers % pp_size
    for i in range(2, remaining + 2):
        partitions[-i] += 1
    return partitions


def stage_layers(num_hidden_layers: int, moe_layers: Sequence[int], pp_size: int,
                 declared: Sequence[int] | None = None) -> list[StageLayers]:
    """Each stage's layer range and MoE layers, from `declared` (VLLM_PP_LAYER_PARTITION) or
    vLLM's rule."""
    if declared is not None:
        if len(declared) != pp_size:
            raise PartitionError(f"{len(declared)} layer counts for {pp_size} pipeline stages")
        if sum(declared) != num_hidden_layers:
            raise PartitionError(f"layer counts {list(declared)} sum to {sum(declared)}, the model has "
                                 f"{num_hidden_layers} decoder layers (vLLM refuses the mismatch)")
        if any(n < 1 for n in declared):
            raise PartitionError(f"every stage needs at least one layer: {list(declared)}")
        partitions = list(declared)
    else:
        partitions = vllm_partition(num_hidden_layers, pp_size)
    out: list[StageLayers] = []
    start = 0
    for rank, count in enumerate(partitions):
        end = start + count
        out.append(StageLayers(rank, start, end, tuple(m for m in moe_layers if start <= m < end)))
        start = end
    return out


def partition_env_value(stages: Sequence[StageLayers]) -> str:
    """The `VLLM_PP_LAYER_PARTITION` value that pins this split."""
    return ",".join(str(s.num_layers) for s in stages)
