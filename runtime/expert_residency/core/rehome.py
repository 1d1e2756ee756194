"""Re-homing a whole model, layer by layer, alternating so memory never spikes.

The engine loads with its own offloader (vLLM ``--cpu-offload-gb``: some layers' expert tensors
whole on the device, some whole in host memory). Re-homing then moves every layer to its row
map's banks:

* a layer on the **device** frees its cold rows' device bytes and adds them on the host;
* a layer on the **host** adds its hot rows' bytes on the device and frees them on the host.

Doing all device layers first over-fills the host; all host layers first over-fills the device.
``plan_rehome_order`` (pure arithmetic, no torch) orders the layers greedily so that after every
step the device and host totals stay within one layer's expert bytes of ``max(initial, final)``,
counting each layer's transient (the new bank allocated before the original is freed). The plan
carries the predicted peaks; ``rehome_model`` executes it and returns the bytes placed per layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, MutableMapping, Sequence

import torch

from .banks import BankAllocator, BankBytes, ResidentLayer, rehome_layer, tensor_nbytes


@dataclass(frozen=True)
class LayerPlacement:
    """Where one layer's full expert tensors sit before re-homing, and its bank sizes after."""

    layer_index: int
    on_device: bool
    hot_bytes: int
    cold_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.hot_bytes + self.cold_bytes


@dataclass
class RehomePlan:
    """Processing order and predicted expert-byte totals (device, host) before/after/peak."""

    order: list[int]
    initial: tuple[int, int]
    final: tuple[int, int]
    peak: tuple[int, int]
    largest_layer_bytes: int

    @property
    def device_overshoot(self) -> int:
        """Peak device expert bytes above ``max(initial, final)``."""
        return self.peak[0] - max(self.initial[0], self.final[0])

    @property
    def host_overshoot(self) -> int:
        return self.peak[1] - max(self.initial[1], self.final[1])


def step_peaks(device: int, host: int, layer: LayerPlacement) -> tuple[int, int, int, int]:
    """(device peak, host peak, device after, host after) for re-homing ``layer`` from (device, host).

    ``rehome_layer`` allocates both banks of a tensor before freeing it; at layer granularity the
    worst case is both banks of the whole layer allocated while the original still exists.
    """
    peak_device = device + layer.hot_bytes
    peak_host = host + layer.cold_bytes
    if layer.on_device:
        return peak_device, peak_host, device - layer.cold_bytes, host + layer.cold_bytes
    return peak_device, peak_host, device + layer.hot_bytes, host - layer.hot_bytes


def plan_rehome_order(layers: Sequence[LayerPlacement]) -> RehomePlan:
    """Greedy order: at each step take the next device-resident or host-resident layer, whichever
    gives the smaller worst overshoot of its step; ties go to the one moving the device total
    towards its final value. Layers of one kind keep their relative order."""
    device = sum(l.total_bytes for l in layers if l.on_device)
    host = sum(l.total_bytes for l in layers if not l.on_device)
    initial = (device, host)
    final = (sum(l.hot_bytes for l in layers), sum(l.cold_bytes for l in layers))
    ceiling = (max(initial[0], final[0]), max(initial[1], final[1]))
    queues = {True: [l for l in layers if l.on_device], False: [l for l in layers if not l.on_device]}
    order: list[int] = []
    peak = initial
    while queues[True] or queues[False]:
        candidates = []
        for kind in (True, False):
            if queues[kind]:
                d_peak, h_peak, d_after, h_after = step_peaks(device, host, queues[kind][0])
                overshoot = max(d_peak - ceiling[0], h_peak - ceiling[1])
                towards = abs(d_after - final[0])
                candidates.append((overshoot, towards, kind))
        _, _, kind = min(candidates)
        layer = queues[kind].pop(0)
        d_peak, h_peak, device, host = step_peaks(device, host, layer)
        peak = (max(peak[0], d_peak), max(peak[1], h_peak))
        order.append(layer.layer_index)
    largest = max((l.total_bytes for l in layers), default=0)
    return RehomePlan(order, initial, final, peak, largest)


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
                 after_layer: Callable[[ResidentLayer], Any] | None = None) -> ResidencyState:
    """Re-home every layer of ``layer_tensors`` (MoE layer index → its mutable tensor mapping).

    ``hot_ids``/``cold_ids``: per MoE layer index, experts in row order (``RowMap.hot[i]`` for
    ``RowMap.moe_layer_indices[i]``; see ``rowmap_banks``). ``on_device(t)``: whether a loaded tensor
    sits in device memory (decides the layer's kind for the ordering). ``after_layer``: called with
    each finished layer (the plugin installs it on the module and drops its own references there,
    so the originals are actually freed before the next layer starts).
    """
    placements = []
    for index, tensors in layer_tensors.items():
        experts = next(iter(tensors.values())).shape[0]
        per_expert = sum(tensor_nbytes(t) for t in tensors.values()) // experts
        if any(tensor_nbytes(t) % experts for t in tensors.values()):
            raise ValueError(f"layer {index}: a tensor's bytes are not a whole number per expert")
        device_flags = {on_device(t) for t in tensors.values()}
        if len(device_flags) != 1:
            raise ValueError(f"layer {index}: expert tensors are split between device and host")
        placements.append(LayerPlacement(index, device_flags.pop(), per_expert * len(hot_ids[index]),
                                         per_expert * len(cold_ids[index])))
    plan = plan_rehome_order(placements)
    state = ResidencyState({}, {}, plan)
    for index in plan.order:
        layer = rehome_layer(layer_tensors[index], hot_ids[index], cold_ids[index], layer_index=index,
                             hot_alloc=hot_alloc, cold_alloc=cold_alloc, codes_device=codes_device)
        state.layers[index] = layer
        state.bytes_per_layer[index] = layer.bank_bytes()
        state.total = state.total + state.bytes_per_layer[index]
        if after_layer is not None:
            after_layer(layer)
    return state


def rowmap_banks(rowmap: Any) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """(hot ids, cold ids) per MoE layer index from an ``expert_residency.formats.RowMap``."""
    hot = {layer: list(ids) for layer, ids in zip(rowmap.moe_layer_indices, rowmap.hot)}
    cold = {layer: list(ids) for layer, ids in zip(rowmap.moe_layer_indices, rowmap.cold)}
    return hot, cold
