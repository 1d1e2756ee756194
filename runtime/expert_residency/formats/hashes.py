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


def _ids(ids: Sequence[int]) -> str:
    return ",".join(str(int(i)) for i in ids)


def content_encoding(moe_layer_indices: Sequence[int], num_experts: int,
                     hot: Sequence[Sequence[int]], cold: Sequence[Sequence[int]]) -> bytes:
    lines = [CONTENT_TAG, f"num_experts {int(num_experts)}"]
    for layer, hot_ids, cold_ids in zip(moe_layer_indices, hot, cold, strict=True):
        lines.append(f"layer {int(layer)} hot {_ids(hot_ids)} cold {_ids(cold_ids)}")
    return ("\n".join(lines) + "\n").encode("ascii")


def shape_encoding(moe_layer_indices: Sequence[int], num_experts: int,
                   hot_counts: Sequence[int], cold_counts: Sequence[int]) -> bytes:
    lines = [SHAPE_TAG, f"num_experts {int(num_experts)}"]
    for layer, n_hot, n_cold in zip(moe_layer_indices, hot_counts, cold_counts, strict=True):
        lines.append(f"layer {int(layer)} hot {int(n_hot)} cold {int(n_cold)}")
    return ("\n".join(lines) + "\n").encode("ascii")


def content_hash(moe_layer_indices: Sequence[int], num_experts: int,
                 hot: Sequence[Sequence[int]], cold: Sequence[Sequence[int]]) -> str:
    """Hex sha256 of `content_encoding`: changes whenever any id moves bank or row."""
    return hashlib.sha256(content_encoding(moe_layer_indices, num_experts, hot, cold)).hexdigest()


def shape_hash(moe_layer_indices: Sequence[int], num_experts: int,
               hot_counts: Sequence[int], cold_counts: Sequence[int]) -> str:
    """Hex sha256 of `shape_encoding`: equal for two maps whose banks have equal shapes."""
    return hashlib.sha256(
        shape_encoding(moe_layer_indices, num_experts, hot_counts, cold_counts)).hexdigest()
