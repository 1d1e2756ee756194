"""Row maps, histograms and captures as docs/formats.md defines them, and nothing looser:
canonical integers, single spaces, each header once, bounded sizes before any allocation,
exact sums; an edited id or count line never loads with the original's hash."""

from __future__ import annotations

import numpy as np
import pytest
from expert_residency.formats import (
    FormatError,
    Histogram,
    RowMap,
    format_histogram,
    format_rowmap,
    parse_histogram,
    parse_rowmap,
)
from expert_residency.formats.histogram import merge_histograms

ROWMAP = format_rowmap(RowMap((0, 2), 4, [[3, 1], [0]], [[0, 2], [1, 2, 3]],
                              {"builder": "top-n"}))
HIST = format_histogram(Histogram((0, 2), 4, np.array([[7, 1, 0, 4], [2, 2, 5, 3]]), 6,
                                  decode_tokens=4, prefill_tokens=2, top_k=2, source="t",
                                  meta={"lane": "agent"}))


def _rowmap_error(text: str) -> FormatError:
    with pytest.raises(FormatError) as info:
        parse_rowmap(text, "x.rowmap")
    assert "x.rowmap" in str(info.value)
    return info.value


def _hist_error(text: str) -> FormatError:
    with pytest.raises(FormatError) as info:
        parse_histogram(text, "x.hist")
    assert "x.hist" in str(info.value)
    return info.value


@pytest.mark.parametrize("old,new", [
    ("layer 0 hot 2: 3 1", "layer 0 hot 2: 3 01"),        # leading zero
    ("layer 0 hot 2: 3 1", "layer 0 hot 2: 3 +1"),        # sign
    ("layer 0 hot 2: 3 1", "layer 0 hot 2: 3 0_1"),       # Python's digit separator
    ("layer 0 hot 2: 3 1", "layer 0 hot 2: 3 \u0661"),    # ARABIC-INDIC DIGIT ONE
    ("layer 0 hot 2: 3 1", "layer 0 hot 2: \uff13 1"),    # FULLWIDTH DIGIT THREE
    ("layer 0 hot 2: 3 1", "layer 0 hot 2: 3\t1"),        # tab
    ("layer 0 hot 2: 3 1", "layer 0 hot 2: 3  1"),        # two spaces
    ("layer 0 hot 2: 3 1", "layer 0 hot 2: 3 1 "),        # trailing space
    ("layer 0 hot 2: 3 1", "layer 0 hot 02: 3 1"),        # count with leading zero
    ("layer 0 hot 2: 3 1", "layer 00 hot 2: 3 1"),        # layer with leading zero
    ("layer 0 hot 2: 3 1", "layer  0 hot 2: 3 1"),
    ("layer 0 hot 2: 3 1", "layer 0 hot 2 : 3 1"),
    ("layer 0 hot 2: 3 1", "layer 0 hot 2:3 1"),
    ("layer 0 hot 2: 3 1", "layer 0 hot 2: 3 1\u2028"),
    ("layer 0 hot 2: 3 1", "layer 0 hot 2: 3 1\x00"),
    ("num_experts: 4", "num_experts: 04"),
    ("num_experts: 4", "num_experts: +4"),
    ("num_experts: 4", "num_experts:  4"),
    ("num_experts: 4", "num_experts:\t4"),
    ("num_experts: 4", "num_experts: 4\nnum_experts: 4"),   # a header twice
    ("num_experts: 4", "num_experts: 1000000000000"),
    ("num_experts: 4", "num_experts: 99999999999999999999999999999999999999"),
    ("moe_layers: 0,2", "moe_layers: 0,2\nmoe_layers: 0,2"),
    ("moe_layers: 0,2", "moe_layers: 1-300000000"),
    ("moe_layers: 0,2", "moe_layers: 0,+2"),
    ("moe_layers: 0,2", "moe_layers: 0, 2"),
    ("moe_layers: 0,2", "moe_layers: 00,2"),
    ('provenance.builder: "top-n"', 'provenance.builder: "top-n"\nprovenance.builder: "x"'),
    ('provenance.builder: "top-n"', "provenance.builder: NaN"),
    ('provenance.builder: "top-n"', "provenance.builder: Infinity"),
    ('provenance.builder: "top-n"', "provenance.builder: " + "[" * 100_000 + "]" * 100_000),
    ("content_hash: ", "content_hash: \ncontent_hash: "),
])
def test_rowmap_refuses_what_the_format_forbids(old: str, new: str) -> None:
    assert old in ROWMAP
    text = ROWMAP.replace(old, new, 1)
    if old.startswith("content_hash"):
        line = next(l for l in ROWMAP.splitlines() if l.startswith("content_hash"))
        text = ROWMAP.replace(line, line + "\n" + line)
    error = _rowmap_error(text)
    assert error.line is not None or "twice" in str(error), str(error)


@pytest.mark.parametrize("old,new", [
    ("layer 0: 7 1 0 4", "layer 0: 7 1 0 04"),
    ("layer 0: 7 1 0 4", "layer 0: 7 1 0 +4"),
    ("layer 0: 7 1 0 4", "layer 0: 7 1 0 -4"),
    ("layer 0: 7 1 0 4", "layer 0: 7 1 0 4_0"),
    ("layer 0: 7 1 0 4", "layer 0: 7 1 0 \u0664"),
    ("layer 0: 7 1 0 4", "layer 0: 7\t1 0 4"),
    ("layer 0: 7 1 0 4", "layer 0: 7 1  0 4"),
    ("layer 0: 7 1 0 4", "layer 0: 7 1 0 4 "),
    ("layer 0: 7 1 0 4", "layer 0: 7 1 0 99999999999999999999"),
    ("layer 0: 7 1 0 4", "layer 0: 7 1 0 1e3"),
    ("tokens: 6", "tokens: 06"),
    ("tokens: 6", "tokens: 6.0"),
    ("tokens: 6", "tokens: true"),
    ("tokens: 6", "tokens: 6\ntokens: 6"),
    ("tokens: 6", "tokens: 99999999999999999999999"),
    ("top_k: 2", "top_k: 2\ntop_k: 2"),
    ("top_k: 2", "top_k: 0"),          # a token picks at least one expert
    ("top_k: 2", "top_k: 5"),          # and never more than the layer's 4
    ("num_experts: 4", "num_experts: 1000000000000"),
    ("moe_layers: 0,2", "moe_layers: 1-300000000"),
    ('meta.lane: "agent"', 'meta.lane: "agent"\nmeta.lane: "agent"'),
    ('meta.lane: "agent"', "meta.lane: NaN"),
    ('source: "t"', 'source: "t"\nsource: "t"'),
])
def test_histogram_refuses_what_the_format_forbids(old: str, new: str) -> None:
    assert old in HIST
    _hist_error(HIST.replace(old, new, 1))


def test_counts_never_wrap_an_int64() -> None:
    """Two counts of 2^63-1 summed in int64 give -2: refused, never reported as a number."""
    big = 2**63 - 1
    with pytest.raises(FormatError, match="2\\^63"):
        Histogram((0,), 2, np.array([[big, big]]), 1).validate()
    text = HIST.replace("layer 0: 7 1 0 4", f"layer 0: {big} {big} 0 4")
    _hist_error(text)
    # exact at the edge: 2^62 + (2^62 - 1) = 2^63 - 1 fits, and is reported exactly
    edge = Histogram((0,), 2, np.array([[2**62, 2**62 - 1]]), 1)
    edge.validate()
    assert edge.selections == 2**63 - 1
    with pytest.raises(FormatError, match="2\\^63"):
        merge_histograms([edge, edge])


def _line_edits(line: str) -> list[str]:
    edits = {line + " ", " " + line, line.replace(" ", "  ", 1), line.replace(" ", "\t", 1)}
    for i, ch in enumerate(line):
        if ch.isdigit():
            edits |= {line[:i] + "0" + line[i:], line[:i] + "+" + line[i:],
                      line[:i] + chr(0x0660 + int(ch)) + line[i + 1:],
                      line[:i] + str((int(ch) + 1) % 10) + line[i + 1:]}
        if ch == " ":
            edits.add(line[:i] + line[i + 1:])
    edits.discard(line)
    return sorted(edits)


def test_an_edited_rowmap_never_loads_with_the_original_hash() -> None:
    """Every single edit of a line the hashes cover (geometry, ids; not comments or
    provenance, which docs/formats.md excludes) is refused or changes the content hash."""
    original = parse_rowmap(ROWMAP).content_hash()
    lines = ROWMAP.splitlines()
    tried = 0
    for index, line in enumerate(lines):
        if line.startswith(("#", "provenance.", "end", "format:")):
            continue
        for edit in _line_edits(line) + ["", line + "\n" + line]:
            text = "\n".join(lines[:index] + [edit] + lines[index + 1:]) + "\n"
            tried += 1
            try:
                loaded = parse_rowmap(text)
            except FormatError:
                continue
            assert loaded.content_hash() != original, f"edit {edit!r} of line {index + 1}"
    assert tried > 150


def test_an_edited_histogram_never_loads_with_the_original_checksum() -> None:
    original = parse_histogram(HIST)
    lines = HIST.splitlines()
    for index, line in enumerate(lines):
        if not line.startswith(("layer", "num_experts", "moe_layers", "checksum")):
            continue
        for edit in _line_edits(line) + ["", line + "\n" + line]:
            text = "\n".join(lines[:index] + [edit] + lines[index + 1:]) + "\n"
            try:
                loaded = parse_histogram(text)
            except FormatError:
                continue
            assert (loaded.checksum(), loaded.num_experts) != (original.checksum(),
                                                               original.num_experts), edit


@pytest.mark.parametrize("content", [b"", b"\n\n  \n", b"\x00" * 64, bytes(range(256)) * 4,
                                     b"format: expert-residency-rowmap/1\n" + b"\xff\xfe"])
def test_empty_or_binary_record_files_are_refused(tmp_path, content: bytes) -> None:
    from expert_residency.formats import load_histogram, load_rowmap

    path = tmp_path / "f"
    path.write_bytes(content)
    for load in (load_rowmap, load_histogram):
        with pytest.raises(FormatError):
            load(path)


def test_the_runtime_loader_is_bounded_too(tmp_path) -> None:
    """The serving container loads maps with the same reader: `1-300000000` is refused before
    a list of 300 million layers exists."""
    from expert_residency.formats import load_rowmap

    path = tmp_path / "huge.rowmap"
    path.write_text(ROWMAP.replace("moe_layers: 0,2", "moe_layers: 0-299999999"))
    with pytest.raises(FormatError, match="moe_layers|larger|more than"):
        load_rowmap(path, expected_content_hash="0" * 64)


def test_errors_do_not_echo_file_content() -> None:
    secret = "hf_SuperSecretToken0123456789"
    for text in (ROWMAP.replace("num_experts: 4", f"num_experts: 4\nHF_TOKEN={secret}"),
                 f"HF_TOKEN={secret}\n", f"format: {secret}\n"):
        assert secret not in str(_rowmap_error(text))
    assert secret not in str(_hist_error(HIST.replace("tokens: 6", f"tokens: 6\nX={secret}")))


@pytest.mark.parametrize("bad, reason", [
    ("layer 0 hot 2: 3 1 ", "a space at the end of the line"),
    ("layer 0 hot 2: 3  1", "two spaces in a row"),
    ("layer 0 hot 2: 3  1 ", "two spaces in a row"),        # the first fault is named
    ("layer 0 hot 2: 3 -1", "negative number -1"),
])
def test_a_malformed_layer_line_says_what_is_wrong(bad: str, reason: str) -> None:
    error = _rowmap_error(ROWMAP.replace("layer 0 hot 2: 3 1", bad, 1))
    assert str(error).count(reason) == 1, str(error)


def test_a_byte_order_mark_is_named(tmp_path) -> None:
    # An editor's BOM before the format line: the histogram reader (not the capture reader, which
    # said "routed_experts is not valid base64") refuses it and says what is there.
    from recipegen.common.errors import InputError
    from recipegen.rowmap.inputs import read_histograms

    path = tmp_path / "class.hist"
    path.write_text("\ufeff" + HIST, encoding="utf-8")
    with pytest.raises(InputError) as info:
        read_histograms([path], None)
    assert info.value.field == "format" and info.value.line == 1
    assert "byte-order mark" in info.value.message
    assert "byte-order mark" in str(_rowmap_error("\ufeff" + ROWMAP))
