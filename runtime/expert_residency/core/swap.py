"""Swaps at a barrier: exchange a hot row and a cold row of one layer through a staging buffer.

A swap of hot expert ``a`` (hot row ``rh``) with cold expert ``b`` (cold row ``rc``) runs, for
**every** tensor of the layer (weights *and* block scales, biases — the same partition always)::

    1. staging      <- hot[rh]      (device → device staging row)
    2. hot[rh]      <- cold[rc]     (host bank → device)
    3. cold[rc]     <- staging      (device → host bank)
    4. codes[a] = cold row rc, codes[b] = hot row rh     (two-element write to the device map)

Steps 1–3 are copies, step 4 the map flip, stream-ordered after the copies. Run at a barrier (no
forward in flight); no forward may run between step 1 and step 4. Before and after, every expert's
rows are unchanged bit for bit, so outputs are bit-identical. Flipping the map before (or without)
the copies points experts at each other's rows — the test suite runs that mis-ordering and checks
that it is caught.

The staging buffer holds one row of each tensor on the hot bank's device and is allocated once
(``StagingBuffer.for_layer``), so swaps allocate nothing. Swaps never change the bank shapes,
so ``shape_hash`` is unchanged and kernels tuned per shape stay valid; ``content_hash`` changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .banks import ResidentLayer


@dataclass
class StagingBuffer:
    """One row of each expert tensor, on the hot bank's device."""

    rows: dict[str, torch.Tensor]

    @classmethod
    def for_layer(cls, layer: ResidentLayer) -> StagingBuffer:
        return cls({name: torch.empty(t.shape[1:], dtype=t.dtype, device=t.device)
                    for name, t in layer.hot.tensors.items()})

    def fits(self, layer: ResidentLayer) -> bool:
        return all(name in self.rows and self.rows[name].shape == t.shape[1:]
                   and self.rows[name].dtype == t.dtype for name, t in layer.hot.tensors.items())


@dataclass
class SwapStep:
    """One ordered step of a swap (``kind`` is ``"copy"`` or ``"map"``); ``run()`` performs it."""

    kind: str
    description: str
    run: Callable[[], None]


def swap_steps(layer: ResidentLayer, hot_expert: int, cold_expert: int,
               staging: StagingBuffer) -> list[SwapStep]:
    """The ordered steps exchanging ``hot_expert`` (now hot) with ``cold_expert`` (now cold).

    Exposed so tests (and a future stream-ordered GPU variant) can see and reorder them; use
    ``swap_experts`` to run them in the one correct order.
    """
    if hot_expert not in layer.hot_ids:
        raise ValueError(f"layer {layer.layer_index}: expert {hot_expert} is not hot")
    if cold_expert not in layer.cold_ids:
        raise ValueError(f"layer {layer.layer_index}: expert {cold_expert} is not cold")
    if not staging.fits(layer):
        raise ValueError(f"layer {layer.layer_index}: staging buffer does not match the layer's tensors")
    hot_row = layer.hot_ids.index(hot_expert)
    cold_row = layer.cold_ids.index(cold_expert)
    steps: list[SwapStep] = []
    for name in layer.hot.tensors:
        hot_t, cold_t, stage = layer.hot.tensors[name], layer.cold.tensors[name], staging.rows[name]
        steps.append(SwapStep("copy", f"{name}: staging <- hot[{hot_row}]",
                              _copier(stage, hot_t, hot_row, None)))
        steps.append(SwapStep("copy", f"{name}: hot[{hot_row}] <- cold[{cold_row}]",
                              _copier(hot_t, cold_t, cold_row, hot_row)))
        steps.append(SwapStep("copy", f"{name}: cold[{cold_row}] <- staging",
                              _copier(cold_t, stage, None, cold_row)))

    def flip() -> None:
        codes = layer.row_codes
        update = torch.tensor([-cold_row - 1, hot_row], dtype=codes.dtype, device=codes.device)
        index = torch.tensor([hot_expert, cold_expert], dtype=torch.long, device=codes.device)
        codes.index_copy_(0, index, update)
        layer.hot_ids[hot_row] = cold_expert
        layer.cold_ids[cold_row] = hot_expert

    steps.append(SwapStep("map", f"codes[{hot_expert}] = cold {cold_row}, "
                                 f"codes[{cold_expert}] = hot {hot_row}", flip))
    return steps


def swap_experts(layer: ResidentLayer, pairs: Sequence[tuple[int, int]],
                 staging: StagingBuffer | None = None) -> None:
    """Swap each ``(hot_expert, cold_expert)`` pair in order, copies before each map flip."""
    staging = staging or StagingBuffer.for_layer(layer)
    for hot_expert, cold_expert in pairs:
        for step in swap_steps(layer, hot_expert, cold_expert, staging):
            step.run()


def _copier(dest: torch.Tensor, source: torch.Tensor, src_row: int | None,
            dest_row: int | None) -> Callable[[], None]:
    def run() -> None:
        target = dest if dest_row is None else dest[dest_row]
        target.copy_(source if src_row is None else source[src_row])
    return run
