"""Histogram file: round trip, merge, validation errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from expert_residency.formats import (
    FormatError,
    Histogram,
    format_histogram,
    load_histogram,
    merge_histograms,
    parse_histogram,
    save_histogram,
)


def _h(**kw: object) -> Histogram:
    base = dict(moe_layer_indices=(0, 1), num_experts=3,
                counts=np.array([[5, 0, 1], [2, 2, 2]]), tokens=3, decode_tokens=2,
                prefill_tokens=1, source="unit test", model_revision="rev-a", top_k=2,
                meta={"synthetic": True, "class": "agent"})
    base.update(kw)
    return Histogram(**base)  # type: ignore[arg-type]


def test_round_trip(tmp_path: Path) -> None:
    h = _h()
    save_histogram(h, tmp_path / "a.hist")
    back = load_histogram(tmp_path / "a.hist")
    assert back.counts.tolist() == [[5, 0, 1], [2, 2, 2]] and back.counts.dtype == np.int64
    assert (back.tokens, back.decode_tokens, back.prefill_tokens, back.top_k) == (3, 2, 1, 2)
    assert (back.source, back.model_revision) == ("unit test", "rev-a")
    assert back.meta == {"synthetic": True, "class": "agent"}
    assert back.selections == 12


def test_unknown_split_is_null(tmp_path: Path) -> None:
    save_histogram(_h(decode_tokens=None, prefill_tokens=None, top_k=None), tmp_path / "a.hist")
    back = load_histogram(tmp_path / "a.hist")
    assert back.decode_tokens is None and back.prefill_tokens is None and back.top_k is None


def _err(text: str) -> FormatError:
    with pytest.raises(FormatError) as info:
        parse_histogram(text, "a.hist")
    return info.value


def test_wrong_number_of_counts() -> None:
    text = format_histogram(_h()).replace("layer 1: 2 2 2", "layer 1: 2 2")
    e = _err(text)
    assert e.field == "layer 1" and "2 counts, expected 3" in str(e) and e.line


def test_negative_and_non_integer_counts() -> None:
    assert "negative" in str(_err(format_histogram(_h()).replace("layer 1: 2 2 2",
                                                                  "layer 1: 2 -2 2")))
    assert "integers" in str(_err(format_histogram(_h()).replace("layer 1: 2 2 2",
                                                                  "layer 1: 2 x 2")))


def test_missing_layer_and_truncation() -> None:
    text = format_histogram(_h())
    e = _err("\n".join(l for l in text.split("\n") if not l.startswith("layer 1")))
    assert e.field == "layer 1"
    assert "truncated" in str(_err(text[: text.index("checksum")]))


def test_corruption_detected_by_checksum() -> None:
    e = _err(format_histogram(_h()).replace("layer 1: 2 2 2", "layer 1: 2 3 2"))
    assert e.field == "checksum"


def test_unknown_version_and_not_a_histogram() -> None:
    e = _err(format_histogram(_h()).replace("histogram/1", "histogram/9"))
    assert e.field == "format" and "unknown histogram format version" in str(e)
    assert "not a histogram" in str(_err("format: expert-residency-rowmap/1\n"))


def test_split_must_add_up() -> None:
    with pytest.raises(FormatError, match="decode_tokens \\+ prefill_tokens"):
        _h(decode_tokens=5).validate()


def test_bad_token_field() -> None:
    e = _err(format_histogram(_h()).replace("tokens: 3", "tokens: many", 1))
    assert e.field == "tokens"


def test_merge() -> None:
    m = merge_histograms([_h(), _h(counts=np.array([[1, 1, 1], [0, 0, 9]]), source="b")])
    assert m.counts.tolist() == [[6, 1, 2], [2, 2, 11]] and m.tokens == 6
    assert m.decode_tokens == 4 and m.top_k == 2 and "unit test" in m.source
    with pytest.raises(FormatError, match="different geometry"):
        merge_histograms([_h(), _h(moe_layer_indices=(0, 2))])


def test_numpy_integers_are_accepted(tmp_path: Path) -> None:
    h = _h(tokens=np.int64(3), decode_tokens=np.int64(2), prefill_tokens=np.int32(1),
           top_k=np.int64(2))
    save_histogram(h, tmp_path / "a.hist")
    back = load_histogram(tmp_path / "a.hist")
    assert (back.decode_tokens, back.prefill_tokens, back.top_k) == (2, 1, 2)
