"""Residency on several GPUs of one lane: vLLM 0.33's tensor parallelism (each rank's shard of every
expert, one row map for all ranks, ``parallel.tp``) and expert parallelism (the row map sliced to a
rank's local experts through vLLM's expert map, refusals where unsupported, ``parallel.ep``).

Torch only; imports nothing from recipegen or vLLM (docs/parallel.md has the vLLM lines)."""

from .ep import (
    EP_SUM_TOLERANCE,
    ExpertPlacement,
    check_expert_map,
    ep_forward,
    expert_map_for,
    local_expert_rows,
    slice_rowmap,
    unsupported_ep_reason,
)
from .tp import (
    TP_SUM_TOLERANCE,
    TensorShard,
    check_same_rowmap,
    rehome_tp_rank,
    shard_expert_tensor,
    shard_expert_tensors,
    unsplit_tp_rank,
)

__all__ = ["EP_SUM_TOLERANCE", "ExpertPlacement", "TP_SUM_TOLERANCE", "TensorShard",
           "check_expert_map", "check_same_rowmap", "ep_forward", "expert_map_for",
           "local_expert_rows", "rehome_tp_rank", "shard_expert_tensor", "shard_expert_tensors",
           "slice_rowmap", "unsplit_tp_rank", "unsupported_ep_reason"]
