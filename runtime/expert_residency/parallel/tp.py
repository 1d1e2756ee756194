"""Tensor parallelism: each rank's shard of a layer's routed experts, laid out as vLLM 0.33 loads it.

vLLM 0.33 shards every routed expert along its intermediate dimension (docs/parallel.md):

* ``w13`` (gate_up, "MergedColumnParallel"): rows of the gate half and of the up half, rank ``r``
  holding rows ``r*Ip .. (r+1)*Ip - 1`` of **each** half, gate block first
  (``fused_moe/routed_experts.py:529-578``, ``SHARD_ID_TO_SHARDED_DIM = {"w1": 0, "w2": 1, "w3": 0}``
  at ``:796``). gpt-oss's interleaved ``[g0, u0, g1, u1, ...]`` rows are sliced as one contiguous run
  of ``2*Ip`` rows instead (``models/gpt_oss.py:577-586``).
* ``w2`` (down, "RowParallel"): columns ``r*Ip .. (r+1)*Ip - 1`` (``routed_experts.py:580-603``).
* Scales follow their weight with the same proportional slice: MXFP4 ue8m0 scales one byte per 32
  values (``w2_weight_scale`` columns in units of ``Ip/32``), FP8 128x128 block scales one entry per
  block (``Ip/128`` rows per half / columns).
* ``w13_bias`` like the w13 rows; ``w2_bias`` whole on rank 0 and zero on the others, so the
  all-reduce adds it once (``models/gpt_oss.py:705-714``).
* Padding: where the backend rounds ``Ip`` up (MXFP4, ``fused_moe/oracle/mxfp4.py:837-917``) the
  parameter is ``torch.zeros`` and the checkpoint slice lands in the first ``Ip`` rows of each half /
  columns (``routed_experts.py:544-578``); the pad is zero weights, zero scales, so it adds nothing.

The row map is the same for every rank: TP does not change expert ids, only what each expert's
rows hold, so ``rehome_tp_rank`` splits each rank's shard with the one global partition. Split ==
unsplit bit for bit holds per rank (same per-pick arithmetic on the same shard). The sum over ranks
matches a single-rank layer only within rounding: each rank rounds its partial ``w2`` product and its
finalize to the pick/output dtype before the all-reduce adds them (``TP_SUM_TOLERANCE``).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

import torch

from ..core.banks import BankAllocator, ResidentLayer, build_unsplit_layer, rehome_layer

W13_PREFIX, W2_PREFIX = "w13_", "w2_"
W13_BIAS, W2_BIAS = "w13_bias", "w2_bias"

TP_SUM_TOLERANCE = (
    "per element |sum_r y_r - y| <= 2^-8 * (sum_r (sum_k w_k |q_rk| + |y_r|) + sum_k w_k |q_k| + |y|"
    " + (TP - 1) * sum_r |y_r|): every bf16 pick row q and rank output y_r is rounded once (unit"
    " roundoff 2^-9, doubled for slack), and TP - 1 bf16 additions in the all-reduce; the fp32"
    " reductions inside a rank differ only in length (Ip instead of I) and are far below that")
"""Why and how far the summed TP output may differ from the single-rank layer (tests use it)."""


@dataclass(frozen=True)
class TensorShard:
    """One rank's place in vLLM's MoE tensor-parallel group (``FusedMoEParallelConfig``)."""

    tp_size: int
    """``tp_size`` of the MoE layer (vLLM flattens TP x DP x PCP into it when EP is off,
    ``fused_moe/config.py:1106-1114``)."""
    tp_rank: int
    """This rank, ``0 .. tp_size-1``."""
    intermediate_size: int
    """The checkpoint's per-expert intermediate size ``I`` (``moe_intermediate_size``)."""
    padded_intermediate: int | None = None
    """The per-rank parameter width vLLM allocates when its backend rounds ``Ip`` up (MXFP4);
    None = ``I / tp_size`` exactly."""
    interleaved_gate_up: bool = False
    """gpt-oss: w13 rows are ``[g0, u0, g1, u1, ...]`` and a rank takes one contiguous run."""
    rank_zero_w2_bias: bool = True
    """``w2_bias`` whole on rank 0, zero elsewhere (vLLM's rule, so the all-reduce adds it once)."""

    def __post_init__(self) -> None:
        if self.tp_size < 1 or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank {self.tp_rank} is not in 0..{self.tp_size - 1} (tp_size {self.tp_size})")
        if self.intermediate_size < 1 or self.intermediate_size % self.tp_size:
            # vLLM asserts the same (fused_moe/config.py:1351-1353).
            raise ValueError(f"intermediate_size {self.intermediate_size} is not divisible by tp_size "
                             f"{self.tp_size} (vLLM asserts intermediate_size % tp_size == 0)")
        if self.padded_intermediate is not None and self.padded_intermediate < self.per_rank:
            raise ValueError(f"padded_intermediate {self.padded_intermediate} < the per-rank width {self.per_rank}")

    @property
    def per_rank(self) -> int:
        """``Ip`` = ``I / tp_size``: checkpoint values of the intermediate dim per rank."""
        return self.intermediate_size // self.tp_size

    @property
    def width(self) -> int:
        """The rank's parameter width along the intermediate dim (``Ip`` or the padded width)."""
        return self.padded_intermediate or self.per_rank


def _padded_len(name: str, length: int, shard: TensorShard) -> int:
    """Entries of a rank's slice of ``length`` once its width is padded (same ratio for every
    tensor: a packed, MX-scale or block-scale dim pads by whole entries or not at all)."""
    scaled = length * shard.width
    if scaled % shard.per_rank:
        raise ValueError(f"{name}: padding {shard.per_rank} -> {shard.width} intermediate values is not a "
                         f"whole number of entries along a dim of {length} per rank")
    return scaled // shard.per_rank


def _slice_len(name: str, dim_size: int, total: int, shard: TensorShard) -> tuple[int, int]:
    """(start, length) of rank ``shard.tp_rank`` along a dim of ``dim_size`` covering ``total``
    intermediate values; refuses a slice that would cut a quantization block."""
    if dim_size % shard.tp_size:
        raise ValueError(
            f"{name}: {dim_size} entries along the intermediate dim do not split into {shard.tp_size} "
            f"equal shards (each rank's {shard.per_rank} values would cut a quantization block; vLLM "
            "pads or refines such shards, fused_moe/oracle/fp8.py:308-352, which the runtime does not do)")
    per = dim_size // shard.tp_size
    return shard.tp_rank * per, per


def _padded(part: torch.Tensor, dim: int, length: int) -> torch.Tensor:
    if part.shape[dim] == length:
        return part.contiguous()
    shape = list(part.shape)
    shape[dim] = length
    out = torch.zeros(shape, dtype=part.dtype, device=part.device)
    out.narrow(dim, 0, part.shape[dim]).copy_(part)
    return out


def shard_expert_tensor(name: str, full: torch.Tensor, shard: TensorShard) -> torch.Tensor:
    """Rank ``shard.tp_rank``'s copy of one full expert tensor (dim 0 = experts), as vLLM holds it."""
    i_total = shard.intermediate_size
    if name == W2_BIAS:
        if shard.tp_rank == 0 or not shard.rank_zero_w2_bias:
            return full.clone()
        return torch.zeros_like(full)
    if name.startswith(W13_PREFIX):
        dim = 1
        size = full.shape[dim]
        if shard.interleaved_gate_up:
            start, length = _slice_len(name, size, 2 * i_total, shard)
            part = full.narrow(dim, start, length)
            return _padded(part, dim, _padded_len(name, length, shard))
        if size % 2:
            raise ValueError(f"{name}: {size} rows along dim 1 is not a gate half plus an up half")
        half = size // 2
        start, length = _slice_len(name, half, i_total, shard)
        width = _padded_len(name, length, shard)
        gate = _padded(full.narrow(dim, start, length), dim, width)
        up = _padded(full.narrow(dim, half + start, length), dim, width)
        return torch.cat([gate, up], dim=dim).contiguous()
    if name.startswith(W2_PREFIX):
        dim = full.dim() - 1   # w2 [E, H, I...]: the intermediate dim is the last one
        if full.dim() < 3:
            raise ValueError(f"{name}: expected [experts, hidden, intermediate...], got {tuple(full.shape)}")
        start, length = _slice_len(name, full.shape[dim], i_total, shard)
        return _padded(full.narrow(dim, start, length), dim, _padded_len(name, length, shard))
    raise ValueError(f"{name}: not a w13_*/w2_* expert tensor; the runtime does not know how vLLM shards it")


def shard_expert_tensors(full: Mapping[str, torch.Tensor], shard: TensorShard) -> dict[str, torch.Tensor]:
    """Every tensor of one layer sharded for one rank (fresh tensors; ``full`` is untouched)."""
    if shard.padded_intermediate not in (None, shard.per_rank):
        for name, _t in full.items():
            if "scale_inv" in name:
                raise ValueError(f"{name}: padding an FP8 block-scaled shard (vLLM fills pad scales with 1, "
                                 "fused_moe/routed_experts.py:384-414) is not reproduced by the runtime")
    return {name: shard_expert_tensor(name, t, shard) for name, t in full.items()}


def rehome_tp_rank(full: Mapping[str, torch.Tensor], hot_ids: Sequence[int], cold_ids: Sequence[int],
                   shard: TensorShard, *, layer_index: int, hot_alloc: BankAllocator,
                   cold_alloc: BankAllocator) -> ResidentLayer:
    """Hot and cold banks of one rank's shard, split by the global row map (the same on every rank).

    Inside vLLM the rank already holds its shard (the loader sliced it); there the plugin calls
    ``core.banks.rehome_layer`` on the layer's own tensors with the same ``hot_ids``/``cold_ids``.
    This builds the shard from the full tensors first (tests, benches, operators' checks)."""
    tensors: MutableMapping[str, torch.Tensor] = shard_expert_tensors(full, shard)
    return rehome_layer(tensors, hot_ids, cold_ids, layer_index=layer_index,
                        hot_alloc=hot_alloc, cold_alloc=cold_alloc)


def unsplit_tp_rank(full: Mapping[str, torch.Tensor], shard: TensorShard, *,
                    layer_index: int) -> ResidentLayer:
    """The per-rank bit-identity reference: the rank's whole shard in one bank, in id order."""
    return build_unsplit_layer(shard_expert_tensors(full, shard), layer_index=layer_index)


def check_same_rowmap(per_rank: Sequence[tuple[Sequence[int], Sequence[int]]]) -> None:
    """ValueError unless every rank's (hot_ids, cold_ids) are identical: under TP one map serves all
    ranks (a rank with another partition would read a different expert's rows for one id)."""
    if not per_rank:
        return
    first = (list(per_rank[0][0]), list(per_rank[0][1]))
    for rank, (hot, cold) in enumerate(per_rank[1:], start=1):
        if (list(hot), list(cold)) != first:
            raise ValueError(f"tensor-parallel rank {rank} was given another row map than rank 0; under "
                             "TP every rank must use the same hot/cold partition and row order")
