"""The live map's ``content_hash`` kept up to date layer by layer.

An adaptive lane's report carries the hash of the map its banks hold after every barrier. Building
the whole ``RowMap`` and encoding every layer again costs milliseconds at full depth (40 layers of
384 experts: ~5 ms on the host, on the step path); a barrier changes a few layers. ``LiveMapHash``
keeps each layer's line of the canonical encoding (``formats.hashes``) and re-encodes only the
layers marked changed; the digest is the same sha256 ``RowMap.content_hash`` gives for
``current_rowmap(layers)`` (tests/runtime/test_adaptive_livehash.py checks it after random swaps).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..formats import hashes
from .banks import ResidentLayer


class LiveMapHash:
    """Per-layer encoded lines of the live map; ``digest()`` re-encodes the layers ``mark`` ed."""

    def __init__(self, layers: Mapping[int, ResidentLayer]) -> None:
        self._layers = layers
        self._order = sorted(layers)   # current_rowmap's layer order
        experts = {layers[i].num_experts for i in self._order}
        if len(experts) != 1:
            raise ValueError(f"resident layers disagree on the number of experts: {sorted(experts)}")
        self._header = hashes.content_header(experts.pop())
        self._counts = {i: (len(layers[i].hot_experts), len(layers[i].cold_experts)) for i in self._order}
        self._lines = {i: self._line(i) for i in self._order}
        self._dirty: set[int] = set()
        self._digest = hashes.hash_lines(self._header + [self._lines[i] for i in self._order])

    def _line(self, index: int) -> str:
        layer = self._layers[index]
        return hashes.content_layer_line(index, layer.hot_experts, layer.cold_experts)

    def mark(self, indices: Iterable[int]) -> None:
        """Layers whose host mirrors changed since the last digest."""
        self._dirty.update(indices)

    def digest(self) -> str:
        """The live map's content hash. RuntimeError when a layer's bank shapes changed (a swap
        exchanges one hot expert for one cold one: the counts per bank never change)."""
        if self._dirty:
            for index in sorted(self._dirty):
                layer = self._layers[index]
                counts = (len(layer.hot_experts), len(layer.cold_experts))
                if counts != self._counts[index]:
                    raise RuntimeError(f"adaptive residency: layer {index}'s bank shapes changed from "
                                       f"{self._counts[index]} to {counts} (hot, cold experts)")
                self._lines[index] = self._line(index)
            self._dirty.clear()
            self._digest = hashes.hash_lines(self._header + [self._lines[i] for i in self._order])
        return self._digest
