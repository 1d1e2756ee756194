"""The row map: per MoE layer, which routed experts sit in the hot (HBM) bank and which in
the cold (pinned host) bank, each list in the physical row order of its bank.

File format (text, UTF-8, one record per line; docs/formats.md is the reference)::

    # free comment lines start with '#'; blank lines are ignored
    format: expert-residency-rowmap/1
    num_experts: 384
    moe_layers: 0-39
    provenance.<key>: <JSON value>          (any number, any order)
    layer 0 hot 295: 17 3 250 ...           (ids separated by single spaces)
    layer 0 cold 89: 9 44 ...
    ...                                     (one hot and one cold line per MoE layer, in order)
    content_hash: <hex sha256>
    shape_hash: <hex sha256>
    end

The trailing hashes and `end` make truncation and corruption detectable: the loader
recomputes both hashes and refuses a file whose stored hashes disagree.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import hashes
from ._io import MAX_EXPERTS, MAX_LAYERS, atomic_write_text
from ._records import (
    RecordLines,
    check_format_line,
    end_text,
    format_header,
    format_json_fields,
    json_value,
    malformed_layer_line,
    parse_moe_layers,
    parse_num_experts,
    put_once,
    read_record_text,
)
from .errors import FormatError

ROWMAP_FORMAT = "expert-residency-rowmap"
ROWMAP_VERSION = 1
ROWMAP_FORMAT_LINE = f"{ROWMAP_FORMAT}/{ROWMAP_VERSION}"

_N = r"(?:0|[1-9][0-9]*)"
# `layer <L> <bank> <n>: <id> <id> ...`: canonical decimals, single spaces (an empty bank is
# written `layer 3 hot 0: `). Nothing else parses, so no edit of an id line loads unnoticed.
_LAYER_LINE = re.compile(rf"layer ({_N}) (hot|cold) ({_N}): ((?:{_N}(?: {_N})*)?)")
_LAYER_LIKE = re.compile(r"^layer\b")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def _layer_problem(num_experts: int, hot: list[int], cold: list[int]) -> tuple[str, str] | None:
    """First problem with one layer's assignment as (bank, message), or None if valid."""
    seen: dict[int, str] = {}
    for bank, ids in (("hot", hot), ("cold", cold)):
        for expert in ids:
            if not 0 <= expert < num_experts:
                return bank, f"expert id {expert} out of range 0..{num_experts - 1}"
            if expert in seen:
                where = "twice in the hot bank" if seen[expert] == bank == "hot" else (
                    "twice in the cold bank" if seen[expert] == bank else "in both banks")
                return bank, f"duplicate expert id {expert} ({where})"
            seen[expert] = bank
    if len(seen) != num_experts:
        missing = sorted(set(range(num_experts)) - set(seen))
        shown = ", ".join(str(m) for m in missing[:10]) + (" ..." if len(missing) > 10 else "")
        return "cold", f"{len(missing)} expert id(s) in neither bank: {shown}"
    return None


@dataclass
class RowMap:
    """One traffic class's assignment of routed experts to banks, for every MoE layer.

    `hot[i]` and `cold[i]` belong to MoE layer `moe_layer_indices[i]` (a decoder-layer index).
    """

    moe_layer_indices: tuple[int, ...]
    num_experts: int
    hot: list[list[int]]
    cold: list[list[int]]
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.moe_layer_indices = tuple(int(i) for i in self.moe_layer_indices)
        self.num_experts = int(self.num_experts)
        self.hot = [[int(i) for i in ids] for ids in self.hot]
        self.cold = [[int(i) for i in ids] for ids in self.cold]

    # -- counts and hashes -------------------------------------------------------------------
    def hot_counts(self) -> list[int]:
        return [len(ids) for ids in self.hot]

    def cold_counts(self) -> list[int]:
        return [len(ids) for ids in self.cold]

    def content_hash(self) -> str:
        return hashes.content_hash(self.moe_layer_indices, self.num_experts, self.hot, self.cold)

    def shape_hash(self) -> str:
        return hashes.shape_hash(self.moe_layer_indices, self.num_experts,
                                 self.hot_counts(), self.cold_counts())

    def is_uniform(self) -> bool:
        """True when every layer has the same hot count (one bank shape, one kernel tuning)."""
        return len(set(self.hot_counts())) <= 1

    def distinct_shapes(self) -> list[tuple[int, int]]:
        """The distinct (hot, cold) bank shapes across layers, sorted."""
        return sorted(set(zip(self.hot_counts(), self.cold_counts())))

    def cold_mask(self) -> np.ndarray:
        """Boolean `[layers, experts]`: True where the expert is in the cold bank."""
        mask = np.zeros((len(self.moe_layer_indices), self.num_experts), dtype=bool)
        for row, ids in enumerate(self.cold):
            if ids:
                mask[row, np.asarray(ids, dtype=np.int64)] = True
        return mask

    def layer_row(self, layer_index: int) -> int:
        """Position of decoder layer `layer_index` in this map's layer lists."""
        try:
            return self.moe_layer_indices.index(layer_index)
        except ValueError:
            raise FormatError(f"layer {layer_index} is not a MoE layer of this row map",
                              field="moe_layers") from None

    # -- validation --------------------------------------------------------------------------
    def validate(self, *, path: str | os.PathLike[str] | None = None) -> None:
        """Raise FormatError on wrong geometry, duplicate/missing/out-of-range ids."""
        if self.num_experts <= 0:
            raise FormatError(f"num_experts must be positive, got {self.num_experts}",
                              path=path, field="num_experts")
        if not self.moe_layer_indices:
            raise FormatError("no MoE layers", path=path, field="moe_layers")
        if any(i < 0 for i in self.moe_layer_indices):
            raise FormatError("negative layer index", path=path, field="moe_layers")
        if len(set(self.moe_layer_indices)) != len(self.moe_layer_indices):
            raise FormatError("duplicate layer index", path=path, field="moe_layers")
        n = len(self.moe_layer_indices)
        for bank, lists in (("hot", self.hot), ("cold", self.cold)):
            if len(lists) != n:
                raise FormatError(f"{len(lists)} {bank} lists for {n} MoE layers",
                                  path=path, field=bank)
        for row, layer in enumerate(self.moe_layer_indices):
            problem = _layer_problem(self.num_experts, self.hot[row], self.cold[row])
            if problem:
                bank, message = problem
                raise FormatError(message, path=path, field=f"layer {layer} {bank}")

    @classmethod
    def positional(cls, moe_layer_indices: tuple[int, ...] | list[int], num_experts: int,
                   hot_count: int, provenance: dict[str, Any] | None = None) -> RowMap:
        """The usage-blind baseline: experts 0..hot_count-1 hot in every layer (what an
        offloader that walks parameters in id order ends up with)."""
        if not 0 <= hot_count <= num_experts:
            raise FormatError(f"hot count {hot_count} outside 0..{num_experts}", field="hot")
        layers = tuple(moe_layer_indices)
        return cls(layers, num_experts,
                   [list(range(hot_count)) for _ in layers],
                   [list(range(hot_count, num_experts)) for _ in layers],
                   dict(provenance or {"builder": "positional"}))


# -- file I/O ---------------------------------------------------------------------------------
def format_rowmap(rowmap: RowMap, *, comments: list[str] | None = None) -> str:
    """The file text of `rowmap` (validated first)."""
    rowmap.validate()
    out = format_header(comments, ROWMAP_FORMAT_LINE, rowmap.num_experts, rowmap.moe_layer_indices)
    out += format_json_fields("provenance", rowmap.provenance)
    for layer, hot_ids, cold_ids in zip(rowmap.moe_layer_indices, rowmap.hot, rowmap.cold):
        out.append(f"layer {layer} hot {len(hot_ids)}: " + " ".join(map(str, hot_ids)))
        out.append(f"layer {layer} cold {len(cold_ids)}: " + " ".join(map(str, cold_ids)))
    out.append(f"content_hash: {rowmap.content_hash()}")
    out.append(f"shape_hash: {rowmap.shape_hash()}")
    return end_text(out)


def save_rowmap(rowmap: RowMap, path: str | os.PathLike[str], *,
                comments: list[str] | None = None) -> None:
    """Validate and write atomically (temp file + rename)."""
    atomic_write_text(path, format_rowmap(rowmap, comments=comments))


def parse_rowmap(text: str, path: str | os.PathLike[str] = "<row map>") -> RowMap:
    """Parse and fully validate row-map text; FormatError names path, line and field."""
    header: dict[str, tuple[str, int]] = {}
    provenance: dict[str, Any] = {}
    layer_lines: list[tuple[int, int, str, int, str]] = []  # (lineno, layer, bank, n, ids)
    trailer: dict[str, tuple[str, int]] = {}
    lines = RecordLines(text, path, not_this_kind=(
        f"not a row map: the first line must be 'format: {ROWMAP_FORMAT_LINE}'"))
    for lineno, line in lines:
        m = _LAYER_LINE.fullmatch(line)
        if m:
            if trailer:
                raise FormatError("layer line after the hashes", path=path, line=lineno)
            if len(layer_lines) >= 2 * MAX_LAYERS:
                raise FormatError(f"more than {MAX_LAYERS} layers", path=path, line=lineno)
            layer, count = int(m.group(1)), int(m.group(3))
            if count > MAX_EXPERTS:
                raise FormatError(f"more than {MAX_EXPERTS} ids", path=path, line=lineno,
                                  field=f"layer {layer} {m.group(2)}")
            layer_lines.append((lineno, layer, m.group(2), count, m.group(4)))
            continue
        if _LAYER_LIKE.match(line):
            raise malformed_layer_line(line, path, lineno, "layer <L> hot|cold <n>: <ids>")
        key, sep, value = line.partition(":")
        if not sep:
            raise FormatError("unrecognised line (neither `key: value` nor a layer line)",
                              path=path, line=lineno)
        if key != key.strip() or not value.startswith(" ") or value != " " + value.strip(" "):
            raise FormatError("write 'key: value' (one space after the colon, none elsewhere)",
                              path=path, line=lineno, field=key.strip()[:40])
        key, value = key.strip(), value.strip(" ")
        if key.startswith("provenance."):
            name = key[len("provenance."):]
            if name in provenance:
                raise FormatError(f"{key!r} given twice", path=path, line=lineno, field=key)
            provenance[name] = json_value(value, path, lineno, key)
        elif key in ("format", "num_experts", "moe_layers"):
            if layer_lines:
                raise FormatError("header line after the layer lines", path=path,
                                  line=lineno, field=key)
            put_once(header, key, value, lineno, path)
        elif key in ("content_hash", "shape_hash"):
            if not _HEX64.fullmatch(value):
                raise FormatError("expected 64 lowercase hex digits", path=path, line=lineno,
                                  field=key)
            put_once(trailer, key, value, lineno, path)
        else:
            raise FormatError(f"unknown field {key!r}", path=path, line=lineno, field=key)

    check_format_line(header, path, format_name=ROWMAP_FORMAT, version=ROWMAP_VERSION,
                      noun="row map", adjective="row-map")
    for key in ("num_experts", "moe_layers"):
        if key not in header:
            raise FormatError(f"missing '{key}:' line", path=path, field=key)
    num_experts = parse_num_experts(*header["num_experts"], path)
    layers = parse_moe_layers(*header["moe_layers"], path)

    hot: list[list[int]] = []
    cold: list[list[int]] = []
    expected = [(layer, bank) for layer in layers for bank in ("hot", "cold")]
    for position, (want_layer, want_bank) in enumerate(expected):
        if position >= len(layer_lines):
            where = "file ends" if not lines.ended else "layer lines end"
            raise FormatError(f"{where} before 'layer {want_layer} {want_bank}' "
                              f"(truncated file or missing layer)", path=path,
                              line=layer_lines[-1][0] if layer_lines else lines.last_line,
                              field=f"layer {want_layer} {want_bank}")
        ln, layer, bank, count, ids_text = layer_lines[position]
        if (layer, bank) != (want_layer, want_bank):
            raise FormatError(f"expected 'layer {want_layer} {want_bank}', found "
                              f"'layer {layer} {bank}' (layers must follow moe_layers, hot "
                              f"before cold)", path=path, line=ln, field=f"layer {layer} {bank}")
        ids = [int(t) for t in ids_text.split(" ")] if ids_text else []
        if len(ids) != count:
            raise FormatError(f"declares {count} ids but lists {len(ids)}", path=path, line=ln,
                              field=f"layer {layer} {bank}")
        (hot if bank == "hot" else cold).append(ids)
    if len(layer_lines) > len(expected):
        ln, layer, bank, _, _ = layer_lines[len(expected)]
        raise FormatError(f"layer {layer} is not in moe_layers or is listed twice", path=path,
                          line=ln, field=f"layer {layer} {bank}")
    line_of = {(layer, bank): ln for ln, layer, bank, _, _ in layer_lines}
    for row, layer in enumerate(layers):
        problem = _layer_problem(num_experts, hot[row], cold[row])
        if problem:
            bank, message = problem
            raise FormatError(message, path=path, line=line_of[(layer, bank)],
                              field=f"layer {layer} {bank}")

    rowmap = RowMap(layers, num_experts, hot, cold, provenance)
    for key in ("content_hash", "shape_hash"):
        if key not in trailer:
            raise FormatError(f"missing '{key}:' line (truncated file?)", path=path, field=key)
    lines.require_end()
    for key, actual in (("content_hash", rowmap.content_hash()),
                        ("shape_hash", rowmap.shape_hash())):
        stored, ln = trailer[key]
        if stored != actual:
            raise FormatError(f"stored {key} {stored[:16]}… does not match the recomputed "
                              f"{actual[:16]}… (file edited or corrupted)", path=path, line=ln,
                              field=key)
    return rowmap


def load_rowmap(path: str | os.PathLike[str], *,
                expected_content_hash: str | None = None) -> RowMap:
    """Read, validate and hash-check a row map file.

    With `expected_content_hash` (what rendering passed to the runtime), a map whose
    content differs is refused.
    """
    text = read_record_text(path)
    rowmap = parse_rowmap(text, path)
    if expected_content_hash is not None:
        verify_content_hash(rowmap, expected_content_hash, path=path)
    return rowmap


def verify_content_hash(rowmap: RowMap, expected: str, *,
                        path: str | os.PathLike[str] | None = None) -> None:
    actual = rowmap.content_hash()
    if actual != expected.strip().lower():
        raise FormatError(f"content_hash mismatch: expected {expected}, the map has {actual}",
                          path=path, field="content_hash")
