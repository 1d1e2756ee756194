"""Golden values for content_hash / shape_hash: stable across runs, platforms and provenance."""

from __future__ import annotations

import hashlib

from expert_residency.formats import RowMap, hashes

TINY = dict(moe_layer_indices=(0, 2), num_experts=4, hot=[[3, 1], [0]], cold=[[0, 2], [1, 2, 3]])


def test_content_encoding_is_the_documented_text() -> None:
    rm = RowMap(**TINY)
    assert hashes.content_encoding(rm.moe_layer_indices, 4, rm.hot, rm.cold) == (
        b"expert-residency/rowmap-content/v1\n"
        b"num_experts 4\n"
        b"layer 0 hot 3,1 cold 0,2\n"
        b"layer 2 hot 0 cold 1,2,3\n")
    assert hashes.shape_encoding(rm.moe_layer_indices, 4, rm.hot_counts(), rm.cold_counts()) == (
        b"expert-residency/rowmap-shape/v1\n"
        b"num_experts 4\n"
        b"layer 0 hot 2 cold 2\n"
        b"layer 2 hot 1 cold 3\n")


def test_golden_hashes_tiny() -> None:
    rm = RowMap(**TINY)
    assert rm.content_hash() == "94ec04bccbcdfeddbe3adec027618d66daccd0f8522389c83e1adc93d60902d8"
    assert rm.shape_hash() == "415d07d8c6d3e68a198f1ccf1e3929ea68c6fba1d8c03a1b94d74f59e21b340b"
    # and they are plain sha256 of the encoding, reproducible by any implementation
    assert rm.content_hash() == hashlib.sha256(
        hashes.content_encoding(rm.moe_layer_indices, 4, rm.hot, rm.cold)).hexdigest()


def test_golden_hashes_reference_positional_map() -> None:
    rm = RowMap.positional(range(40), 384, 295)
    assert rm.content_hash() == "f07d24b016187aab084162aff20b7ac189732a8d5977fda1fe0fe9e6264023ce"
    assert rm.shape_hash() == "2562b4e15beca76c350f38c4055977e704f15b192f9176df496c13c93852d052"


def test_hashes_ignore_provenance() -> None:
    a = RowMap(**TINY, provenance={"date": "2026-01-01"})
    b = RowMap(**TINY, provenance={"date": "2027-05-05", "tool": "x"})
    assert a.content_hash() == b.content_hash() and a.shape_hash() == b.shape_hash()


def test_row_order_changes_content_but_not_shape() -> None:
    a = RowMap(**TINY)
    b = RowMap((0, 2), 4, [[1, 3], [0]], [[0, 2], [1, 2, 3]])
    assert a.content_hash() != b.content_hash()
    assert a.shape_hash() == b.shape_hash()


def test_different_shape_changes_shape_hash() -> None:
    a = RowMap(**TINY)
    b = RowMap((0, 2), 4, [[3], [0]], [[0, 1, 2], [1, 2, 3]])
    assert a.shape_hash() != b.shape_hash()
