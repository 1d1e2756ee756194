"""Expert parallelism inside vLLM 0.33: each rank's banks hold only its local experts.

What vLLM 0.33 gives a ``RoutedExperts`` layer under ``--enable-expert-parallel`` (source lines in
the 0.33.0 wheel, pinned by ``tests/test_vllm_plugin_ep_contracts.py``):

* ``moe_config.moe_parallel_config``: ``use_ep``, ``ep_size`` = the flattened TP size, ``ep_rank``,
  ``tp_size = 1`` (``fused_moe/config.py:1226-1245``), ``all2all_backend`` (default
  ``allgather_reducescatter``, ``config/parallel.py:220``; ``naive`` is mapped to it,
  ``:537-543``) and ``use_all2all_kernels`` = EP with DP, PCP or sequence parallel
  (``fused_moe/config.py:1035-1039``).
* ``expert_map_manager.expert_map``: ``int32[E]``, global id -> local slot or -1
  (``fused_moe/expert_map_manager.py:301-311``), registered on the layer as ``_expert_map``
  (``fused_moe/routed_experts.py:268-276``); ``local_num_experts`` rows in every expert parameter,
  in local-slot order (the loader skips ids whose slot is -1, ``routed_experts.py:727-737``).
* The router's ``topk_ids`` are **global** ids, handed to ``forward_modular``
  (``fused_moe/runner/moe_runner.py:629-643``); vLLM's own kernel receives ``layer.expert_map``
  and drops the other ranks' picks (``fused_moe_modular_method.py:110-121``); the runner then
  all-reduces the ranks' shares (``ep_size > 1``, ``runner/moe_runner.py:508-515``).

Supported here: EP without all2all kernels (DP = PCP = 1, no sequence parallel; every rank sees
every token), no EPLB, no fused shared experts, no AITER mask. With all2all kernels (DP > 1) the
dispatch/combine runs inside vLLM's modular kernel (``allgather_reducescatter`` prepare/finalize)
or, for legacy quant methods, around ``forward_modular`` (``runner/moe_runner.py:801-804``); the
runtime replaces that kernel, so it refuses those lanes rather than drop the dispatch.

The plugin (``worker_runtime``, hook in docs/parallel.md) uses three functions:
``ep_reason(module)`` at registration, ``sliced_banks`` to re-home each layer's local tensors with
the global row map sliced to its local experts (``parallel.ep.slice_rowmap``), and ``local_picks``
in the core's split forward (global ids -> local slots, foreign picks on slot 0 with weight 0), or
``local_ids`` for the fused Triton layer (foreign picks -1, skipped by the kernel). Counting
stays on the global ids: every rank sees every pick, so one rank's counter is the lane's.

No vLLM import: the facts are read from attributes, so CPU tests use stand-in layers.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..core.banks import BankAllocator, ResidentLayer, build_unsplit_layer, rehome_layer
from ..parallel.ep import (
    ExpertPlacement,
    check_expert_map,
    local_expert_rows,
    local_slots,
    slice_rowmap,
    unsupported_ep_reason,
)


@dataclass(frozen=True)
class LayerEpFacts:
    """What one vLLM 0.33 ``RoutedExperts`` layer says about its expert placement."""

    placement: ExpertPlacement
    """The rank's placement as ``parallel.ep`` checks it."""
    local_num_experts: int
    """``layer.local_num_experts`` (rows of every expert parameter)."""
    use_all2all_kernels: bool
    """``moe_parallel_config.use_all2all_kernels``: EP with DP, PCP or sequence parallel."""
    expert_map: tuple[int, ...] | None
    """The layer's canonical ``_expert_map`` as a tuple (None without EP)."""


def _attr(obj: Any, name: str, default: Any) -> Any:
    value = getattr(obj, name, default)
    return default if value is None else value


def layer_ep_facts(module: Any) -> LayerEpFacts | None:
    """The layer's EP facts, or None where the layer has no expert parallelism (TP/PP). A layer
    without vLLM's parallel config counts as no EP; the caller's local-vs-global check then still
    refuses a partial layer."""
    pc = getattr(getattr(module, "moe_config", None), "moe_parallel_config", None)
    if pc is None or not bool(_attr(pc, "use_ep", False)):
        return None
    manager = getattr(module, "expert_map_manager", None)
    raw_map = getattr(module, "_expert_map", None)
    if raw_map is None and manager is not None:
        raw_map = manager.expert_map
    expert_map = None if raw_map is None else tuple(int(v) for v in raw_map.detach().to("cpu").tolist())
    kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
    experts_cls = getattr(kernel, "fused_experts", None)
    placement = ExpertPlacement(
        ep_size=int(pc.ep_size), ep_rank=int(pc.ep_rank),
        global_num_experts=int(module.global_num_experts),
        strategy=str(_attr(module, "expert_placement_strategy", "linear")),
        all2all_backend=str(_attr(pc, "all2all_backend", "allgather_reducescatter")),
        enable_eplb=bool(_attr(pc, "enable_eplb", False)),
        num_fused_shared_experts=int(_attr(manager, "num_fused_shared_experts", 0)),
        use_expert_mask=bool(getattr(experts_cls, "consumes_expert_mask", False)),
        tp_size=int(_attr(pc, "tp_size", 1)))
    return LayerEpFacts(placement, int(module.local_num_experts),
                        bool(_attr(pc, "use_all2all_kernels", False)), expert_map)


def ep_reason(module: Any) -> str | None:
    """None when the runtime computes this layer's EP placement exactly (or there is no EP), else
    one line naming the layer."""
    facts = layer_ep_facts(module)
    if facts is None:
        return None
    name = getattr(module, "layer_name", "MoE layer")
    p = facts.placement
    reason = unsupported_ep_reason(p)
    if reason is None and facts.use_all2all_kernels:
        reason = ("expert parallel with data/context/sequence parallel: vLLM dispatches tokens between "
                  f"ranks ({p.all2all_backend}) inside the MoE kernel the runtime replaces; run EP "
                  "with --data-parallel-size 1 (every rank then sees every token)")
    if reason is None and facts.expert_map is None:
        reason = "expert parallel is on but the layer has no expert map"
    if reason is None:
        try:
            local = check_expert_map(facts.expert_map, p.global_num_experts)
        except ValueError as exc:
            reason = str(exc)
        else:
            if local != facts.local_num_experts:
                reason = (f"the expert map gives {local} local experts, the layer holds "
                          f"{facts.local_num_experts}")
    return None if reason is None else f"{name}: {reason}"


def sliced_banks(hot_ids: Mapping[int, Sequence[int]], cold_ids: Mapping[int, Sequence[int]],
                 layers: Mapping[int, Any]) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Per MoE layer index, the global row map's (hot, cold) sliced to the layer's local experts
    (local slots, physical order kept). Layers without EP keep the global lists."""
    hot: dict[int, list[int]] = {}
    cold: dict[int, list[int]] = {}
    for index, module in layers.items():
        facts = layer_ep_facts(module)
        if facts is None or facts.expert_map is None:
            hot[index], cold[index] = list(hot_ids[index]), list(cold_ids[index])
            continue
        try:
            hot[index], cold[index] = slice_rowmap(hot_ids[index], cold_ids[index], facts.expert_map)
        except ValueError as exc:
            raise ValueError(f"{getattr(module, 'layer_name', index)}: {exc}") from None
    return hot, cold


def device_expert_map(module: Any) -> torch.Tensor | None:
    """The layer's ``int32[E]`` expert map on its weights' device (None without EP): what
    ``local_picks`` indexes with the router's ids on every step (no host copy on the step)."""
    if layer_ep_facts(module) is None:
        return None
    emap = getattr(module, "_expert_map", None)
    if emap is None:
        emap = module.expert_map_manager.expert_map
    device = next((p.device for p in module.parameters(recurse=False)), emap.device)
    return emap.to(device=device, dtype=torch.int32)


def local_picks(expert_map: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Router picks in global ids -> (local slots, weights) for this rank's banks.

    A pick of another rank's expert goes to local slot 0 with weight 0 (fixed shapes, no sync,
    graph-safe); its finite row times 0 adds +0 to the fma chain, so the rank's share equals
    ``parallel.ep.ep_forward``'s (which also zeroes the row). A global id outside ``0..E-1``
    (vLLM's -1) is treated the same, never as ``expert_map[-1]``. Weights keep their dtype."""
    local = local_slots(expert_map, topk_ids)
    mine = local >= 0
    ids = torch.where(mine, local, torch.zeros_like(local)).to(topk_ids.dtype)
    weights = torch.where(mine, topk_weights, torch.zeros_like(topk_weights))
    return ids, weights


def local_ids(expert_map: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """Router picks in global ids -> local slots, -1 kept for other ranks' experts: for the fused
    Triton layer (``gpu.experts``), which skips an id outside ``0..L-1`` (adds ``fma(0, 0, acc)``,
    the same as ``parallel.ep.ep_forward``) instead of computing it on slot 0 with weight 0.
    A global id outside ``0..E-1`` gives -1 too (``parallel.ep.local_slots``: no wrap-around)."""
    return local_slots(expert_map, topk_ids).to(topk_ids.dtype)


def rehome_ep_rank(full: Mapping[str, torch.Tensor], hot_ids: Sequence[int], cold_ids: Sequence[int],
                   expert_map: Sequence[int], *, layer_index: int, hot_alloc: BankAllocator,
                   cold_alloc: BankAllocator) -> ResidentLayer:
    """One rank's banks from the full ``[E, ...]`` tensors (tests, benches): the rank's local rows
    as vLLM's loader leaves them, re-homed with the sliced row map. Inside vLLM the rank already
    holds its local rows; the plugin calls ``rehome_layer`` with ``sliced_banks``' lists."""
    local: MutableMapping[str, torch.Tensor] = {n: local_expert_rows(t, expert_map) for n, t in full.items()}
    hot, cold = slice_rowmap(hot_ids, cold_ids, expert_map)
    return rehome_layer(local, hot, cold, layer_index=layer_index, hot_alloc=hot_alloc,
                        cold_alloc=cold_alloc)


def unsplit_ep_rank(full: Mapping[str, torch.Tensor], expert_map: Sequence[int], *,
                    layer_index: int) -> ResidentLayer:
    """The per-rank reference: the rank's local experts in one bank, in local-slot order."""
    return build_unsplit_layer({n: local_expert_rows(t, expert_map) for n, t in full.items()},
                               layer_index=layer_index)
