"""A pipeline stage's slice of a row map: the MoE layers that stage holds, nothing else.

Under pipeline parallel each vLLM worker builds only its stage's MoE layers, and the residency
runtime refuses a map that does not cover exactly the layers it found (`vllm_plugin/checks.py
geometry_reason`). So every machine mounts its own slice: same ids and row order per layer,
provenance kept, plus where it was cut from. Its own content and shape hashes follow from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def slice_rowmap(rowmap: Any, moe_layers: Sequence[int], *, stage: int, source: str = "") -> Any:
    """The row map restricted to `moe_layers` (which it must all cover)."""
    from expert_residency.formats import RowMap

    wanted = list(moe_layers)
    index = {layer: i for i, layer in enumerate(rowmap.moe_layer_indices)}
    missing = [layer for layer in wanted if layer not in index]
    if missing:
        raise ValueError(f"row map has no MoE layer {missing[0]} (it covers "
                         f"{rowmap.moe_layer_indices[0]}-{rowmap.moe_layer_indices[-1]})")
    provenance = dict(rowmap.provenance)
    provenance.update({"pipeline_stage": stage, "sliced_from_content_hash": rowmap.content_hash()})
    if source:
        provenance["sliced_from"] = source
    sliced = RowMap(moe_layer_indices=tuple(wanted), num_experts=rowmap.num_experts,
                    hot=[list(rowmap.hot[index[layer]]) for layer in wanted],
                    cold=[list(rowmap.cold[index[layer]]) for layer in wanted],
                    provenance=provenance)
    sliced.validate()
    return sliced


def slice_text(rowmap: Any, moe_layers: Sequence[int], *, stage: int, source: str = "") -> tuple[Any, bytes]:
    """The slice and its file bytes (deterministic: same map, same slice, same bytes)."""
    from expert_residency.formats.rowmap import format_rowmap

    sliced = slice_rowmap(rowmap, moe_layers, stage=stage, source=source)
    comments = [f"pipeline stage {stage}'s slice (MoE layers {moe_layers[0]}-{moe_layers[-1]}) of "
                f"{source or 'a row map'}, written by `recipegen render`"]
    return sliced, format_rowmap(sliced, comments=comments).encode("utf-8")
