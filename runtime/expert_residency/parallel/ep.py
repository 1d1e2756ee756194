"""Expert parallelism: the global row map sliced to one rank's local experts through vLLM's expert map.

Under EP vLLM 0.33 gives each rank whole experts and no TP inside the MoE layer (``tp_size=1``,
``ep_size`` = the flattened TP x DP x PCP size, ``fused_moe/config.py:1226-1245``). Which global
experts a rank holds is ``determine_expert_map`` (``fused_moe/expert_map_manager.py:22-113``):
``base = E // ep_size``, the first ``E % ep_size`` ranks hold one more;

* ``linear``: rank ``r`` holds the contiguous run starting at ``r*base + min(r, E % ep_size)``;
* ``round_robin``: rank ``r`` holds ``r, r + ep_size, r + 2*ep_size, ...`` (vLLM falls back to
  linear unless the model has expert groups and there is no EPLB, ``:116-149``).

``expert_map[g]`` is the local slot of global expert ``g`` or -1; the rank's expert tensors have
``local_num_experts`` rows in local-slot order. The router still produces global ids, and vLLM's
kernels drop picks whose map entry is -1 (another rank computes them; the combine adds them up).

``slice_rowmap`` keeps the global map's hot/cold split and physical order for the local experts
and renames them to local slots, so each rank re-homes its local tensors with ``rehome_layer``;
``ep_forward`` maps the router's global ids to local slots and zeroes the other ranks' picks before
the finalize. Split == unsplit bit for bit on each rank; the sum over ranks matches one rank holding
every expert within ``EP_SUM_TOLERANCE``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..core.banks import ResidentLayer
from ..core.devmap import lookup_routed
from ..core.fma_finalize import finalize
from ..core.split import PerPickExpertFn, split_invoke

LINEAR, ROUND_ROBIN = "linear", "round_robin"

# all2all backends whose dispatch hands a rank only its own tokens' picks, or remaps ids to
# physical slots with routing tables (fused_moe/config.py:1035-1071): not what ep_forward sees.
SUPPORTED_ALL2ALL = ("allgather_reducescatter", "naive")

EP_SUM_TOLERANCE = (
    "per element |sum_r y_r - y| <= 2^-8 * (sum_r |y_r| + |y| + (EP - 1) * sum_r |y_r|): the pick rows "
    "are bit-identical (whole experts), each rank's fma chain covers only its picks and is rounded "
    "once to bf16 (unit roundoff 2^-9, doubled for slack), then EP - 1 bf16 additions")
"""Why and how far the summed EP output may differ from a single rank holding every expert."""


@dataclass(frozen=True)
class ExpertPlacement:
    """What vLLM decided about one rank's experts (``RoutedExperts`` / ``FusedMoEParallelConfig``)."""

    ep_size: int
    """``ep_size`` of the MoE layer (``moe_parallel_config.ep_size``)."""
    ep_rank: int
    """This rank (``moe_parallel_config.ep_rank``)."""
    global_num_experts: int
    """Logical routed experts of the layer (the row map's ``num_experts``)."""
    strategy: str = LINEAR
    """``expert_placement_strategy`` after vLLM's fallback: ``linear`` or ``round_robin``."""
    all2all_backend: str = "allgather_reducescatter"
    """``parallel_config.all2all_backend``."""
    enable_eplb: bool = False
    """``--enable-eplb``: vLLM moves experts between ranks at run time."""
    num_redundant_experts: int = 0
    """EPLB's redundant (physical) experts."""
    num_fused_shared_experts: int = 0
    """Shared experts fused into the routed tensors (AITER), appended after the routed ones."""
    use_expert_mask: bool = False
    """AITER's 0/1 ``expert_mask`` in place of the -1/slot map."""
    tp_size: int = 1
    """MoE-layer TP; vLLM sets 1 when EP is on (``fused_moe/config.py:1229-1233``)."""


def unsupported_ep_reason(p: ExpertPlacement) -> str | None:
    """None when ``slice_rowmap``/``ep_forward`` compute this placement exactly, else one line."""
    if p.ep_size < 1 or not 0 <= p.ep_rank < p.ep_size:
        return f"ep_rank {p.ep_rank} is not in 0..{p.ep_size - 1}"
    if p.enable_eplb or p.num_redundant_experts:
        return ("EPLB: vLLM moves experts between ranks and adds redundant physical experts at run time; "
                "the runtime's banks and row map would go stale (run without --enable-eplb)")
    if p.num_fused_shared_experts:
        return ("shared experts fused into the routed tensors (AITER): their rows are not in the row map; "
                "keep the shared experts unfused")
    if p.use_expert_mask:
        return "AITER's 0/1 expert mask in place of vLLM's -1/slot expert map is not read by the runtime"
    if p.tp_size != 1:
        return (f"MoE tensor parallel {p.tp_size} together with expert parallel: vLLM does not combine them "
                "inside one MoE layer (it sets tp_size=1 under EP), so the runtime refuses it")
    if p.all2all_backend not in SUPPORTED_ALL2ALL:
        return (f"all2all backend {p.all2all_backend!r}: its dispatch hands each rank only the picks of its "
                "experts (or remaps ids through routing tables), which the runtime's EP path does not read; "
                f"use one of {', '.join(SUPPORTED_ALL2ALL)}")
    if p.strategy not in (LINEAR, ROUND_ROBIN):
        return f"expert placement strategy {p.strategy!r} (vLLM 0.33 knows linear and round_robin)"
    return None


def expert_map_for(p: ExpertPlacement) -> list[int]:
    """vLLM 0.33's ``determine_expert_map`` for one rank (global id -> local slot, -1 elsewhere);
    a plain list (the contract test compares it with vLLM's own function)."""
    e, size, rank = p.global_num_experts, p.ep_size, p.ep_rank
    base, remainder = divmod(e, size)
    local = base + 1 if rank < remainder else base
    expert_map = [-1] * e
    if p.strategy == LINEAR:
        start = rank * base + min(rank, remainder)
        for slot in range(local):
            expert_map[start + slot] = slot
    elif p.strategy == ROUND_ROBIN:
        for slot, g in enumerate(range(rank, e, size)):
            expert_map[g] = slot
    else:
        raise ValueError(f"expert placement strategy {p.strategy!r}: expected linear or round_robin")
    return expert_map


def check_expert_map(expert_map: Sequence[int], num_experts: int) -> int:
    """Local expert count of a -1/slot map over ``num_experts`` global ids (ValueError if malformed)."""
    if len(expert_map) != num_experts:
        raise ValueError(f"expert map has {len(expert_map)} entries but the row map has {num_experts} experts "
                         "(fused shared or redundant experts are not supported)")
    slots = sorted(int(v) for v in expert_map if int(v) != -1)
    if any(int(v) < -1 for v in expert_map) or slots != list(range(len(slots))):
        raise ValueError("expert map is not global id -> local slot 0..L-1 (each once) or -1")
    if not slots:
        raise ValueError("expert map gives this rank no experts")
    return len(slots)


def slice_rowmap(hot_ids: Sequence[int], cold_ids: Sequence[int], expert_map: Sequence[int] | torch.Tensor
                 ) -> tuple[list[int], list[int]]:
    """One layer's global (hot, cold) row order -> this rank's (hot, cold) in local slots.

    The hot/cold decision and the physical row order of the global map are kept; experts of other
    ranks are dropped. The result partitions ``0..L-1`` (``core.devmap.check_partition``)."""
    if isinstance(expert_map, torch.Tensor):
        expert_map = [int(v) for v in expert_map.detach().to("cpu").tolist()]
    num_experts = len(hot_ids) + len(cold_ids)
    check_expert_map(expert_map, num_experts)
    hot = [int(expert_map[g]) for g in hot_ids if int(expert_map[g]) >= 0]
    cold = [int(expert_map[g]) for g in cold_ids if int(expert_map[g]) >= 0]
    return hot, cold


def local_expert_rows(full: torch.Tensor, expert_map: Sequence[int]) -> torch.Tensor:
    """The rank's ``[L, ...]`` tensor in local-slot order from a global ``[E, ...]`` one (what vLLM's
    loader leaves in the parameter: global expert g at row ``expert_map[g]``)."""
    local = check_expert_map(expert_map, full.shape[0])
    order = [0] * local
    for g, slot in enumerate(expert_map):
        if slot >= 0:
            order[slot] = g
    return full[order].contiguous()


def local_slots(expert_map: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """Global ``topk_ids [T, K]`` -> local slots (``expert_map``'s dtype), -1 for other ranks' picks
    and for ids outside ``0..E-1`` (looked up as id 0, so ``expert_map[-1]`` never wraps around to
    the last expert). Fixed shapes, no sync."""
    local, valid = lookup_routed(expert_map, topk_ids)
    return torch.where(valid, local, torch.full_like(local, -1))


def ep_forward(layer: ResidentLayer, hidden_states: torch.Tensor, topk_weights: torch.Tensor,
               topk_ids: torch.Tensor, expert_map: torch.Tensor, per_pick_fn: PerPickExpertFn, *,
               pick_dtype: torch.dtype | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """This rank's share ``[T, H]`` of the routed-expert output for global ``topk_ids``.

    ``expert_map``: vLLM's ``int32[E]`` on the device of ``topk_ids`` (``RoutedExperts.expert_map``).
    Picks of other ranks compute on local slot 0 (fixed shapes, no sync) and are then zeroed, with a
    zero weight, so the fma chain adds exactly +0 for them (no counting here: every rank sees all
    picks, so one rank's counter of global ids is the lane's). A global id outside ``0..E-1``
    (vLLM's -1) is nobody's pick: the same +0, never ``expert_map[-1]``'s expert."""
    local = local_slots(expert_map, topk_ids)
    mine = local >= 0
    ids = torch.where(mine, local, torch.zeros_like(local))
    pick_out = split_invoke(layer, hidden_states, ids, per_pick_fn, out_dtype=pick_dtype)
    pick_out = torch.where(mine.unsqueeze(-1), pick_out, torch.zeros_like(pick_out))
    weights = torch.where(mine, topk_weights.float(), torch.zeros_like(topk_weights, dtype=torch.float32))
    return finalize(pick_out, weights, out_dtype or hidden_states.dtype)
