"""Re-homing order: pure arithmetic (standard library only, importable without torch).

The engine loads with its own offloader (vLLM ``--cpu-offload-gb``: some layers' expert tensors
whole on the device, the rest whole in host memory). Re-homing then moves every layer to its row
map's banks, one layer at a time, allocating the new banks before the original is freed:

* a **device** layer (hot ``h``, cold ``c`` bytes): transient device ``+h`` and host ``+c``;
  afterwards device ``-c``, host ``+c``;
* a **host** layer: transient device ``+h`` and host ``+c``; afterwards device ``+h``, host ``-h``;
* a layer the loader **split** (``d`` bytes on the device): transient ``+h``/``+c``; afterwards
  device ``+h-d``, host ``+c-(h+c-d)``.

With ``e`` = device expert bytes minus their final value (the host is then exactly ``-e`` from its
final value: bytes are conserved), re-homing any layer at ``e`` peaks at ``e + h`` above the final
device total and ``c - e`` above the final host total. Device layers lower ``e`` by ``c``, host
layers raise it by ``h``. Doing all device layers first over-fills the host; all host layers
first over-fills the device.

``plan_rehome_order`` looks for an order in which neither memory ever exceeds
``max(initial, final) + L`` (``L`` = the largest layer's expert bytes): a depth-first search that
tries, at each step, the layers whose transient fits, the one leaving ``e`` closest to 0 first,
trying one representative of identical layers and remembering dead ends (``e`` is a function of
the set of layers left). Realistic maps resolve without backtracking; if the bound is unreachable
(or the search budget runs out) it falls back to the order with the smallest overshoot found
greedily, and the plan says so (``within_bound``). The plan carries its predicted peaks.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

SEARCH_BUDGET = 200_000


@dataclass(frozen=True)
class LayerPlacement:
    """Where one layer's full expert tensors sit before re-homing, and its bank sizes after.

    ``on_device``: the loaded layer is wholly in device memory (False: wholly in host memory).
    ``device_bytes``: for a layer the loader split — vLLM's offloader moves whole parameters, so a
    budget boundary can leave ``w13`` on the host and ``w2`` on the device — the bytes of the loaded
    layer that are in device memory (the rest are on the host); ``on_device`` is then ignored.
    """

    layer_index: int
    on_device: bool
    hot_bytes: int
    cold_bytes: int
    device_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.hot_bytes < 0 or self.cold_bytes < 0:
            raise ValueError(f"layer {self.layer_index}: negative bank bytes")
        if self.device_bytes is not None and not 0 <= self.device_bytes <= self.total_bytes:
            raise ValueError(f"layer {self.layer_index}: device_bytes {self.device_bytes} outside "
                             f"0..{self.total_bytes}")

    @property
    def total_bytes(self) -> int:
        return self.hot_bytes + self.cold_bytes

    @property
    def loaded_device_bytes(self) -> int:
        if self.device_bytes is not None:
            return self.device_bytes
        return self.total_bytes if self.on_device else 0

    @property
    def loaded_host_bytes(self) -> int:
        return self.total_bytes - self.loaded_device_bytes


@dataclass
class RehomePlan:
    """Processing order and expert-byte totals ``(device, host)``: initial, final and peak."""

    order: list[int]
    initial: tuple[int, int]
    final: tuple[int, int]
    peak: tuple[int, int]
    largest_layer_bytes: int
    within_bound: bool
    steps: list[tuple[int, int, int]] = field(default_factory=list)  # (layer, device peak, host peak)

    @property
    def device_overshoot(self) -> int:
        """Peak device expert bytes above ``max(initial, final)``."""
        return self.peak[0] - max(self.initial[0], self.final[0])

    @property
    def host_overshoot(self) -> int:
        return self.peak[1] - max(self.initial[1], self.final[1])


def step_peaks(device: int, host: int, layer: LayerPlacement) -> tuple[int, int, int, int]:
    """(device peak, host peak, device after, host after) for re-homing ``layer`` at (device, host)."""
    peak_device = device + layer.hot_bytes
    peak_host = host + layer.cold_bytes
    return (peak_device, peak_host, peak_device - layer.loaded_device_bytes,
            peak_host - layer.loaded_host_bytes)


def plan_rehome_order(layers: Sequence[LayerPlacement], *, budget: int = SEARCH_BUDGET) -> RehomePlan:
    """Order ``layers`` so device and host stay within ``max(initial, final) + L`` (see module doc)."""
    initial = (sum(l.loaded_device_bytes for l in layers), sum(l.loaded_host_bytes for l in layers))
    final = (sum(l.hot_bytes for l in layers), sum(l.cold_bytes for l in layers))
    largest = max((l.total_bytes for l in layers), default=0)
    limit = (max(initial[0], final[0]) + largest, max(initial[1], final[1]) + largest)
    order = _search(list(layers), initial, limit, budget)
    within = order is not None
    if order is None:
        order = _greedy(list(layers), initial, limit)
    return _simulate(order, initial, final, largest, within)


def _fits(device: int, host: int, layer: LayerPlacement, limit: tuple[int, int]) -> bool:
    peak_device, peak_host, _, _ = step_peaks(device, host, layer)
    return peak_device <= limit[0] and peak_host <= limit[1]


def _search(layers: list[LayerPlacement], initial: tuple[int, int], limit: tuple[int, int],
            budget: int) -> list[LayerPlacement] | None:
    groups: dict[tuple[int, int, int], list[LayerPlacement]] = {}
    for layer in layers:
        groups.setdefault((layer.loaded_device_bytes, layer.hot_bytes, layer.cold_bytes), []).append(layer)
    kinds = list(groups)
    counts = [len(groups[k]) for k in kinds]
    final_device = sum(l.hot_bytes for l in layers)
    dead: set[tuple[int, ...]] = set()
    path: list[int] = []
    visited = 0

    def dfs(device: int, host: int) -> bool:
        nonlocal visited
        if not any(counts):
            return True
        state = tuple(counts)
        if state in dead or visited >= budget:
            return False
        visited += 1
        options = []
        for i, kind in enumerate(kinds):
            if counts[i] and _fits(device, host, groups[kind][0], limit):
                _, _, d_after, h_after = step_peaks(device, host, groups[kind][0])
                options.append((abs(d_after - final_device), i, d_after, h_after))
        for _, i, d_after, h_after in sorted(options):
            counts[i] -= 1
            path.append(i)
            if dfs(d_after, h_after):
                return True
            path.pop()
            counts[i] += 1
        dead.add(state)
        return False

    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, len(layers) + 100))
    try:
        found = dfs(*initial)
    finally:
        sys.setrecursionlimit(old_limit)
    if not found:
        return None
    pools = {k: list(v) for k, v in groups.items()}
    return [pools[kinds[i]].pop(0) for i in path]


def _greedy(layers: list[LayerPlacement], initial: tuple[int, int],
            limit: tuple[int, int]) -> list[LayerPlacement]:
    device, host = initial
    final_device = sum(l.hot_bytes for l in layers)
    remaining = list(layers)
    order = []
    while remaining:
        def key(layer: LayerPlacement) -> tuple[int, int]:
            d_peak, h_peak, d_after, _ = step_peaks(device, host, layer)
            return max(d_peak - limit[0], h_peak - limit[1], 0), abs(d_after - final_device)
        best = min(remaining, key=key)
        remaining.remove(best)
        _, _, device, host = step_peaks(device, host, best)
        order.append(best)
    return order


def _simulate(order: list[LayerPlacement], initial: tuple[int, int], final: tuple[int, int],
              largest: int, within: bool) -> RehomePlan:
    device, host = initial
    peak = initial
    steps = []
    for layer in order:
        d_peak, h_peak, device, host = step_peaks(device, host, layer)
        peak = (max(peak[0], d_peak), max(peak[1], h_peak))
        steps.append((layer.layer_index, d_peak, h_peak))
    return RehomePlan([l.layer_index for l in order], initial, final, peak, largest, within, steps)
