"""Re-homing a whole model, layer by layer, in the order ``core.plan`` chose.

``rehome_model`` measures each layer's placement (device or host, bytes per expert), asks
``plan_rehome_order`` for an order that keeps device and host within one layer of
``max(initial, final)``, re-homes the layers in that order and returns the resident layers, the
bytes placed per layer and in total (the start-up report's figures) and the plan with its
predicted peaks. Once every layer is re-homed it returns the pinned host blocks the freed
originals leave in PyTorch's caching host allocator (``release_host_cache``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .banks import BankAllocator, BankBytes, ResidentLayer, rehome_layer, tensor_nbytes
from .devmap import check_partition
from .plan import LayerPlacement, RehomePlan, plan_rehome_order


@dataclass
class ResidencyState:
    """Result of ``rehome_model``: the resident layers and the bytes placed."""

    layers: dict[int, ResidentLayer]
    bytes_per_layer: dict[int, BankBytes]
    plan: RehomePlan
    total: BankBytes = field(default_factory=BankBytes)


def rehome_model(layer_tensors: Mapping[int, MutableMapping[str, torch.Tensor]],
                 hot_ids: Mapping[int, Sequence[int]], cold_ids: Mapping[int, Sequence[int]], *,
                 hot_alloc: BankAllocator, cold_alloc: BankAllocator,
                 on_device: Callable[[torch.Tensor], bool],
                 codes_device: torch.device | str | None = None,
                 after_layer: Callable[[ResidentLayer], Any] | None = None,
                 hot_spare: int = 0, cold_spare: int = 0, host_copies: bool = False) -> ResidencyState:
    """Re-home every layer of ``layer_tensors`` (MoE layer index → its mutable tensor mapping).

    ``hot_ids``/``cold_ids``: per MoE layer index, experts in row order (``RowMap.hot[i]`` for
    ``RowMap.moe_layer_indices[i]``; see ``rowmap_banks``). ``on_device(t)``: whether a loaded tensor
    sits in device memory, asked per tensor (a layer the loader split between device and host is
    planned with its device share). ``after_layer``: called with each finished layer (the plugin
    installs it on the module and drops its own references there, so the originals are actually
    freed before the next layer starts). ``hot_spare``/``cold_spare``/``host_copies``: every layer's
    extra rows for adaptive residency (``rehome_layer``), planned with the banks they grow.
    """
    missing = sorted(set(layer_tensors) - (set(hot_ids) & set(cold_ids)))
    if missing:
        raise ValueError(f"the row map has no entry for MoE layer(s) {missing}")
    placements = []
    for index, tensors in layer_tensors.items():
        if not tensors:
            raise ValueError(f"layer {index}: no expert tensors to re-home")
        experts = next(iter(tensors.values())).shape[0]
        try:  # every layer's map is checked before any layer is touched
            check_partition(hot_ids[index], cold_ids[index], experts)
        except ValueError as exc:
            raise ValueError(f"layer {index}: {exc}") from None
        per_expert = sum(tensor_nbytes(t) for t in tensors.values()) // experts
        if any(tensor_nbytes(t) % experts for t in tensors.values()):
            raise ValueError(f"layer {index}: a tensor's bytes are not a whole number per expert")
        device_bytes = sum(tensor_nbytes(t) for t in tensors.values() if on_device(t))
        total = per_expert * experts
        # vLLM's offloader moves whole parameters: a layer may be split between device and host.
        host_rows = len(cold_ids[index]) + cold_spare + (len(hot_ids[index]) if host_copies else 0)
        placements.append(LayerPlacement(index, device_bytes == total,
                                         per_expert * (len(hot_ids[index]) + hot_spare),
                                         per_expert * host_rows,
                                         device_bytes=device_bytes if 0 < device_bytes < total else None))
    plan = plan_rehome_order(placements)
    state = ResidencyState({}, {}, plan)
    for index in plan.order:
        layer = rehome_layer(layer_tensors[index], hot_ids[index], cold_ids[index], layer_index=index,
                             hot_alloc=hot_alloc, cold_alloc=cold_alloc, codes_device=codes_device,
                             hot_spare=hot_spare, cold_spare=cold_spare, host_copies=host_copies)
        state.layers[index] = layer
        state.bytes_per_layer[index] = layer.bank_bytes()
        state.total = state.total + state.bytes_per_layer[index]
        if after_layer is not None:
            after_layer(layer)
    release_host_cache()
    return state


def release_host_cache() -> bool:
    """Hand the caching host allocator's free pinned blocks back to the OS; True when it ran.

    Originals vLLM's ``--cpu-offload-gb`` placed in pinned host memory (``pin_memory=True``, each
    rounded up to a power of two) stay pinned in PyTorch's host cache after re-homing frees them;
    vLLM 0.33 empties that cache only at shutdown (``distributed/parallel_state.py:2586-2591``,
    ``torch.accelerator.empty_host_cache()``, PyTorch >= 2.9). Blocks in use (the banks) are not
    touched. Without the function or an accelerator (CPU builds raise there) nothing is called.
    """
    accel = getattr(torch, "accelerator", None)
    empty = getattr(accel, "empty_host_cache", None)
    if empty is None or not accel.is_available():
        return False
    empty()
    return True


def rowmap_banks(rowmap: Any) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """(hot ids, cold ids) per MoE layer index from an ``expert_residency.formats.RowMap``."""
    hot = {layer: list(ids) for layer, ids in zip(rowmap.moe_layer_indices, rowmap.hot)}
    cold = {layer: list(ids) for layer, ids in zip(rowmap.moe_layer_indices, rowmap.cold)}
    return hot, cold


def current_rowmap(layers: Mapping[int, ResidentLayer], *, provenance: dict[str, Any] | None = None) -> Any:
    """The assignment the banks hold now (after any swaps) as an ``expert_residency.formats.RowMap``
    (spare rows and host copies left out: each bank's experts in row order)."""
    from ..formats.rowmap import RowMap

    indices = sorted(layers)
    if not indices:
        raise ValueError("no resident layers")
    experts = {layers[i].num_experts for i in indices}
    if len(experts) != 1:
        raise ValueError(f"resident layers disagree on the number of experts: {sorted(experts)}")
    return RowMap(tuple(indices), experts.pop(), [layers[i].hot_experts for i in indices],
                  [layers[i].cold_experts for i in indices], dict(provenance or {}))
