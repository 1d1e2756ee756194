"""Canonical encodings and sha256 hashes of a row map's assignment and of its bank shapes.

Both encodings are plain ASCII text, one record per line, "\\n" after every line (including
the last), decimal integers without sign or leading zeros, no spaces other than the single
separators shown. docs/formats.md states them for other implementations; golden values
live in tests/test_formats_hashes.py.

content encoding::

    expert-residency/rowmap-content/v1
    num_experts <E>
    layer <index> hot <id>,<id>,... cold <id>,<id>,...     (one line per MoE layer, file order)

shape encoding::

    expert-residency/rowmap-shape/v1
    num_experts <E>
    layer <index> hot <hot count> cold <cold count>          (one line per MoE layer, file order)

An empty id list encodes as the empty string, so a layer with no hot experts reads
``layer 3 hot  cold 0,1,...`` (two spaces).
Provenance never enters either encoding, so re-building a map from the same counts on another
day gives the same hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

CONTENT_TAG = "expert-residency/rowmap-content/v1"
SHAPE_TAG = "expert-residency/rowmap-shape/v1"


_DECIMAL = {i: str(i) for i in range(4096)}
"""Decimal text of the expert ids every model has (a lookup is ~4x faster than ``str(int(i))``:
a live map's lines are encoded again on a decode step's path)."""


def _ids(ids: Sequence[int]) -> str:
    try:
        return ",".join([_DECIMAL[i] for i in ids])
    except (KeyError, TypeError):   # an id past the table (or not hashable as an int)
        return ",".join(str(int(i)) for i in ids)


def content_header(num_experts: int) -> list[str]:
    """The content encoding's first two lines."""
    return [CONTENT_TAG, f"num_experts {int(num_experts)}"]


def content_layer_line(layer: int, hot_ids: Sequence[int], cold_ids: Sequence[int]) -> str:
    """One layer's line of the content encoding (a live map re-encodes only the layers it changed)."""
    return f"layer {int(layer)} hot {_ids(hot_ids)} cold {_ids(cold_ids)}"


def _encode(lines: Sequence[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode("ascii")


def hash_lines(lines: Sequence[str]) -> str:
    """Hex sha256 of encoding lines, each followed by "\\n"."""
    return hashlib.sha256(_encode(lines)).hexdigest()


def content_encoding(moe_layer_indices: Sequence[int], num_experts: int,
                     hot: Sequence[Sequence[int]], cold: Sequence[Sequence[int]]) -> bytes:
    lines = content_header(num_experts)
    for layer, hot_ids, cold_ids in zip(moe_layer_indices, hot, cold, strict=True):
        lines.append(content_layer_line(layer, hot_ids, cold_ids))
    return _encode(lines)


def shape_encoding(moe_layer_indices: Sequence[int], num_experts: int,
                   hot_counts: Sequence[int], cold_counts: Sequence[int]) -> bytes:
    lines = [SHAPE_TAG, f"num_experts {int(num_experts)}"]
    for layer, n_hot, n_cold in zip(moe_layer_indices, hot_counts, cold_counts, strict=True):
        lines.append(f"layer {int(layer)} hot {int(n_hot)} cold {int(n_cold)}")
    return _encode(lines)


def content_hash(moe_layer_indices: Sequence[int], num_experts: int,
                 hot: Sequence[Sequence[int]], cold: Sequence[Sequence[int]]) -> str:
    """Hex sha256 of `content_encoding`: changes whenever any id moves bank or row."""
    return hashlib.sha256(content_encoding(moe_layer_indices, num_experts, hot, cold)).hexdigest()


def shape_hash(moe_layer_indices: Sequence[int], num_experts: int,
               hot_counts: Sequence[int], cold_counts: Sequence[int]) -> str:
    """Hex sha256 of `shape_encoding`: equal for two maps whose banks have equal shapes."""
    return hashlib.sha256(
        shape_encoding(moe_layer_indices, num_experts, hot_counts, cold_counts)).hexdigest()
