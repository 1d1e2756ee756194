"""Row-map file: round trip, validation errors with file/line/field, atomic save."""

from __future__ import annotations

from pathlib import Path

import pytest
from expert_residency.formats import (
    FormatError,
    RowMap,
    format_rowmap,
    load_rowmap,
    parse_rowmap,
    save_rowmap,
    verify_content_hash,
)


def _tiny(**prov: object) -> RowMap:
    return RowMap((0, 2), 4, [[3, 1], [0]], [[0, 2], [1, 2, 3]], dict(prov))


def test_round_trip_keeps_order_and_provenance(tmp_path: Path) -> None:
    rm = _tiny(histograms=["a.hist"], selections=123, synthetic=True)
    path = tmp_path / "m.rowmap"
    save_rowmap(rm, path, comments=["SYNTHETIC example"])
    text = path.read_text()
    assert text.startswith("# SYNTHETIC example\nformat: expert-residency-rowmap/1\n")
    back = load_rowmap(path)
    assert back == rm
    assert back.hot == [[3, 1], [0]] and back.provenance["selections"] == 123
    assert [p.name for p in tmp_path.iterdir()] == ["m.rowmap"]  # no temp file left


def test_reference_geometry_round_trip(tmp_path: Path) -> None:
    rm = RowMap.positional(range(40), 384, 295)
    save_rowmap(rm, tmp_path / "r.rowmap")
    back = load_rowmap(tmp_path / "r.rowmap")
    assert back.hot_counts() == [295] * 40 and back.cold_counts() == [89] * 40
    assert back.content_hash() == rm.content_hash()


def _text() -> str:
    return format_rowmap(_tiny())


def _err(text: str) -> FormatError:
    with pytest.raises(FormatError) as info:
        parse_rowmap(text, "m.rowmap")
    return info.value


def _line_of(text: str, prefix: str) -> int:
    return next(i for i, l in enumerate(text.split("\n"), 1) if l.startswith(prefix))


def test_duplicate_id_names_line_and_field() -> None:
    text = _text().replace("layer 0 cold 2: 0 2", "layer 0 cold 2: 0 3")
    e = _err(text)
    assert (e.path, e.line, e.field) == ("m.rowmap", _line_of(text, "layer 0 cold"),
                                         "layer 0 cold")
    assert "duplicate expert id 3" in str(e) and "m.rowmap:" in str(e)


def test_out_of_range_id() -> None:
    e = _err(_text().replace("layer 2 hot 1: 0", "layer 2 hot 1: 4"))
    assert e.field == "layer 2 hot" and "out of range" in str(e)


def test_missing_id() -> None:
    e = _err(_text().replace("layer 2 cold 3: 1 2 3", "layer 2 cold 2: 1 2"))
    assert e.field == "layer 2 cold" and "neither bank: 3" in str(e)


def test_count_disagrees_with_ids() -> None:
    e = _err(_text().replace("layer 2 cold 3: 1 2 3", "layer 2 cold 4: 1 2 3"))
    assert "declares 4 ids but lists 3" in str(e)


def test_missing_layer() -> None:
    text = "\n".join(l for l in _text().split("\n") if not l.startswith("layer 2"))
    e = _err(text)
    assert e.field == "layer 2 hot" and "missing layer" in str(e)


def test_wrong_geometry_num_experts() -> None:
    e = _err(_text().replace("num_experts: 4", "num_experts: 5"))
    assert "neither bank: 4" in str(e)


def test_truncated_file() -> None:
    text = _text()
    e = _err(text[: text.index("shape_hash")])
    assert "truncated" in str(e)
    e = _err(text[: text.index("layer 2 cold")])
    assert "truncated" in str(e)


def test_corrupted_file_hash_mismatch() -> None:
    # swap two rows in the hot bank: still a valid assignment, but not what was hashed
    text = _text().replace("layer 0 hot 2: 3 1", "layer 0 hot 2: 1 3")
    e = _err(text)
    assert e.field == "content_hash" and "does not match" in str(e)


def test_unknown_format_version() -> None:
    e = _err(_text().replace("expert-residency-rowmap/1", "expert-residency-rowmap/2"))
    assert e.field == "format" and e.line == 1 and "unknown row-map format version" in str(e)


def test_not_a_rowmap() -> None:
    assert "first line must be" in str(_err("hello: world\n"))
    assert "unrecognised line" in str(_err(_text().replace("end\n", "garbage\nend\n")))


def test_bad_provenance_json() -> None:
    text = _text().replace("moe_layers: 0,2", "moe_layers: 0,2\nprovenance.date: not json")
    e = _err(text)
    assert e.field == "provenance.date" and e.line == 4


def test_expected_content_hash(tmp_path: Path) -> None:
    rm = _tiny()
    save_rowmap(rm, tmp_path / "m.rowmap")
    assert load_rowmap(tmp_path / "m.rowmap", expected_content_hash=rm.content_hash()) == rm
    with pytest.raises(FormatError, match="content_hash mismatch"):
        load_rowmap(tmp_path / "m.rowmap", expected_content_hash="0" * 64)
    with pytest.raises(FormatError, match="content_hash mismatch"):
        verify_content_hash(rm, "ab" * 32)


def test_missing_file_and_binary_file(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="no such file"):
        load_rowmap(tmp_path / "nope.rowmap")
    (tmp_path / "b.rowmap").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(FormatError, match="not UTF-8"):
        load_rowmap(tmp_path / "b.rowmap")


def test_validate_in_memory() -> None:
    with pytest.raises(FormatError, match="layer 0 hot"):
        RowMap((0,), 3, [[0, 0]], [[1, 2]]).validate()
    with pytest.raises(FormatError, match="1 cold lists for 2"):
        RowMap((0, 1), 3, [[0], [0]], [[1, 2]]).validate()
    with pytest.raises(FormatError, match="duplicate layer"):
        RowMap((1, 1), 2, [[0], [0]], [[1], [1]]).validate()
    with pytest.raises(FormatError):
        save_rowmap(RowMap((0,), 3, [[0]], [[1]]), "/nonexistent-never-written.rowmap")


def test_helpers() -> None:
    rm = _tiny()
    assert rm.cold_mask().tolist() == [[True, False, True, False], [False, True, True, True]]
    assert rm.distinct_shapes() == [(1, 3), (2, 2)] and not rm.is_uniform()
    assert rm.layer_row(2) == 1
