"""`rowmap diff`: what changed between two row maps of one model (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from expert_residency.formats import RowMap

from recipegen.common.errors import InputError


@dataclass(frozen=True)
class LayerDiff:
    layer: int
    hot_a: int
    hot_b: int
    cold_changed: int      # ids cold in B that were not cold in A
    left_cold: int         # ids cold in A that are not cold in B
    reordered: bool        # same sets, different physical row order

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


@dataclass(frozen=True)
class DiffReport:
    name_a: str
    name_b: str
    layers: list[LayerDiff]
    content_hash_a: str
    content_hash_b: str
    shape_hash_a: str
    shape_hash_b: str
    num_experts: int

    @property
    def same_shape(self) -> bool:
        return self.shape_hash_a == self.shape_hash_b

    @property
    def same_content(self) -> bool:
        return self.content_hash_a == self.content_hash_b

    @property
    def mean_cold_changed(self) -> float:
        """Mean per layer of ids cold in B that were not cold in A."""
        return sum(l.cold_changed for l in self.layers) / len(self.layers) if self.layers else 0.0

    @property
    def mean_left_cold(self) -> float:
        """Mean per layer of ids cold in A that are not cold in B (a map with more hot rows has some
        however its cold ids are chosen)."""
        return sum(l.left_cold for l in self.layers) / len(self.layers) if self.layers else 0.0

    @property
    def changed_layers(self) -> int:
        return sum(1 for l in self.layers if l.cold_changed or l.left_cold or l.reordered
                   or l.hot_a != l.hot_b)

    def verdict(self) -> str:
        if self.same_content:
            return "identical assignment (same content_hash)"
        if self.same_shape:
            return ("same shape_hash, different content_hash: the lane restarts on the new map and "
                    "reuses its tuned kernels (same bank shapes)")
        return ("different shape_hash: the new bank shapes (hot/cold counts per layer) need kernel "
                "tuning")

    def to_json(self) -> dict[str, Any]:
        return {"a": self.name_a, "b": self.name_b, "same_shape": self.same_shape,
                "same_content": self.same_content,
                "content_hash": {"a": self.content_hash_a, "b": self.content_hash_b},
                "shape_hash": {"a": self.shape_hash_a, "b": self.shape_hash_b},
                "mean_cold_changed": self.mean_cold_changed, "mean_left_cold": self.mean_left_cold,
                "changed_layers": self.changed_layers, "verdict": self.verdict(),
                "layers": [l.to_json() for l in self.layers]}


def diff(a: RowMap, b: RowMap, *, name_a: str = "A", name_b: str = "B") -> DiffReport:
    if a.num_experts != b.num_experts or a.moe_layer_indices != b.moe_layer_indices:
        raise InputError(f"{name_a} and {name_b} are maps of different geometry "
                         f"({len(a.moe_layer_indices)} layers × {a.num_experts} vs "
                         f"{len(b.moe_layer_indices)} × {b.num_experts})", field="moe_layers")
    layers = []
    for layer, hot_a, cold_a, hot_b, cold_b in zip(a.moe_layer_indices, a.hot, a.cold, b.hot,
                                                   b.cold):
        set_a, set_b = set(cold_a), set(cold_b)
        same_sets = set_a == set_b
        layers.append(LayerDiff(layer, len(hot_a), len(hot_b), len(set_b - set_a),
                                len(set_a - set_b),
                                same_sets and (hot_a != hot_b or cold_a != cold_b)))
    return DiffReport(name_a, name_b, layers, a.content_hash(), b.content_hash(),
                      a.shape_hash(), b.shape_hash(), a.num_experts)
