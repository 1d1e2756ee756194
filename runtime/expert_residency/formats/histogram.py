"""The routing histogram: selections per (MoE layer, routed expert) with token counts.

File format (text, UTF-8; docs/formats.md is the reference)::

    # comment lines start with '#'
    format: expert-residency-histogram/1
    num_experts: 384
    moe_layers: 0-39
    tokens: 143333                 (tokens routed through every MoE layer)
    decode_tokens: null            (JSON integer or null when unknown)
    prefill_tokens: null
    top_k: 6                       (JSON integer or null)
    source: "<JSON string>"
    model_revision: "<JSON string>"
    meta.<key>: <JSON value>       (any number: lane, class, mode, synthetic, ...)
    layer 0: c0 c1 ... c383        (one line per MoE layer, in moe_layers order)
    ...
    checksum: <hex sha256 of the counts encoding>
    end
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._io import MAX_LAYERS, atomic_write_text, parse_decimal
from ._records import (
    RecordLines,
    check_format_line,
    end_text,
    format_header,
    format_json_fields,
    json_text,
    json_value,
    malformed_layer_line,
    parse_moe_layers,
    parse_num_experts,
    put_once,
    read_record_text,
)
from .errors import FormatError

HISTOGRAM_FORMAT = "expert-residency-histogram"
HISTOGRAM_VERSION = 1
HISTOGRAM_FORMAT_LINE = f"{HISTOGRAM_FORMAT}/{HISTOGRAM_VERSION}"
COUNTS_TAG = "expert-residency/histogram-counts/v1"

_N = r"(?:0|[1-9][0-9]*)"
# `layer <L>: <count> <count> ...`: canonical decimals separated by single spaces.
_LAYER_LINE = re.compile(rf"layer ({_N}): ({_N}(?: {_N})*)")
_LAYER_LIKE = re.compile(r"^layer\b")
_HEX64 = re.compile(r"[0-9a-f]{64}")
# Every count and the total of all counts fit an int64, so no sum of counts anywhere (numpy
# sums in int64) can wrap: a histogram past that is refused, not summed modulo 2^64.
MAX_TOTAL = 2**63 - 1
_OPTIONAL_INTS = ("decode_tokens", "prefill_tokens", "top_k")


@dataclass
class Histogram:
    """Routing counts `counts[row, expert]` for MoE layer `moe_layer_indices[row]`."""

    moe_layer_indices: tuple[int, ...]
    num_experts: int
    counts: np.ndarray
    tokens: int
    decode_tokens: int | None = None
    prefill_tokens: int | None = None
    source: str = ""
    model_revision: str = ""
    top_k: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.moe_layer_indices = tuple(int(i) for i in self.moe_layer_indices)
        self.num_experts = int(self.num_experts)
        self.counts = np.asarray(self.counts, dtype=np.int64)
        self.tokens = int(self.tokens)
        # numpy integers (from counters) become plain ints; anything else is left for validate()
        for name in _OPTIONAL_INTS:
            value = getattr(self, name)
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                setattr(self, name, int(value))

    @property
    def selections(self) -> int:
        """Total (token, layer, pick) selections counted (exact: Python integers)."""
        return exact_total(self.counts)

    def layer_row(self, layer_index: int) -> int:
        try:
            return self.moe_layer_indices.index(layer_index)
        except ValueError:
            raise FormatError(f"layer {layer_index} is not in this histogram",
                              field="moe_layers") from None

    def checksum(self) -> str:
        return hashlib.sha256(counts_encoding(self.moe_layer_indices, self.counts)).hexdigest()

    def validate(self, *, path: str | os.PathLike[str] | None = None) -> None:
        if self.num_experts <= 0:
            raise FormatError("num_experts must be positive", path=path, field="num_experts")
        if not self.moe_layer_indices or len(set(self.moe_layer_indices)) != len(
                self.moe_layer_indices) or min(self.moe_layer_indices) < 0:
            raise FormatError("layer list must be non-empty, unique and non-negative",
                              path=path, field="moe_layers")
        want = (len(self.moe_layer_indices), self.num_experts)
        if self.counts.shape != want:
            raise FormatError(f"counts have shape {self.counts.shape}, expected {want}",
                              path=path, field="counts")
        if (self.counts < 0).any():
            row, expert = np.argwhere(self.counts < 0)[0]
            raise FormatError(f"negative count for expert {expert}", path=path,
                              field=f"layer {self.moe_layer_indices[row]}")
        if exact_total(self.counts) > MAX_TOTAL:
            raise FormatError(f"counts sum to more than 2^63 - 1 ({MAX_TOTAL}): no capture has "
                              "that many selections", path=path, field="counts")
        if not 0 <= self.tokens <= MAX_TOTAL:
            raise FormatError("must be non-negative and below 2^63", path=path, field="tokens")
        for name in _OPTIONAL_INTS:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or not 0 <= value <= MAX_TOTAL):
                raise FormatError("must be a non-negative integer or null", path=path,
                                  field=name)
        if self.top_k is not None and not 1 <= self.top_k <= self.num_experts:
            # each token picks at least one expert and never more than the layer holds
            raise FormatError(f"top_k {self.top_k} is not between 1 and num_experts ({self.num_experts})",
                              path=path, field="top_k")
        if self.decode_tokens is not None and self.prefill_tokens is not None and \
                self.decode_tokens + self.prefill_tokens != self.tokens:
            raise FormatError(f"decode_tokens + prefill_tokens = "
                              f"{self.decode_tokens + self.prefill_tokens} but tokens = "
                              f"{self.tokens}", path=path, field="tokens")

    def same_geometry(self, other: Histogram) -> bool:
        return (self.moe_layer_indices == other.moe_layer_indices
                and self.num_experts == other.num_experts)


def exact_total(counts: np.ndarray) -> int:
    """The sum of all counts as a Python integer (numpy's int64 sum wraps past 2^63)."""
    return sum(int(v) for v in np.asarray(counts).ravel().tolist())


def counts_encoding(moe_layer_indices: Sequence[int], counts: np.ndarray) -> bytes:
    """ASCII: tag line, then `layer <i> <c0>,<c1>,...` per layer, each line ending in "\\n"."""
    lines = [COUNTS_TAG]
    for layer, row in zip(moe_layer_indices, np.asarray(counts, dtype=np.int64)):
        lines.append(f"layer {int(layer)} " + ",".join(map(str, row.tolist())))
    return ("\n".join(lines) + "\n").encode("ascii")


def merge_histograms(histograms: Iterable[Histogram], *, source: str | None = None) -> Histogram:
    """Sum counts and tokens of histograms with one geometry (a pooled profile)."""
    items = list(histograms)
    if not items:
        raise FormatError("no histograms to merge")
    first = items[0]
    for other in items[1:]:
        if not first.same_geometry(other):
            raise FormatError(f"cannot merge histograms of different geometry "
                              f"({first.source!r} vs {other.source!r})", field="moe_layers")

    def _sum(name: str) -> int | None:
        values = [getattr(h, name) for h in items]
        return None if any(v is None for v in values) else int(sum(values))

    if sum(h.selections for h in items) > MAX_TOTAL:
        raise FormatError("the merged counts would sum past 2^63 - 1", field="counts")
    top_ks = {h.top_k for h in items}
    revisions = {h.model_revision for h in items}
    return Histogram(first.moe_layer_indices, first.num_experts,
                     np.sum([h.counts for h in items], axis=0), sum(h.tokens for h in items),
                     decode_tokens=_sum("decode_tokens"), prefill_tokens=_sum("prefill_tokens"),
                     source=source if source is not None else
                     "merged: " + " + ".join(h.source or "?" for h in items),
                     model_revision=revisions.pop() if len(revisions) == 1 else "mixed",
                     top_k=top_ks.pop() if len(top_ks) == 1 else None,
                     meta={"merged_from": [h.source for h in items]})


def format_histogram(h: Histogram, *, comments: list[str] | None = None) -> str:
    h.validate()
    out = format_header(comments, HISTOGRAM_FORMAT_LINE, h.num_experts, h.moe_layer_indices)
    out.append(f"tokens: {h.tokens}")
    for name in _OPTIONAL_INTS:
        out.append(f"{name}: {json.dumps(getattr(h, name))}")
    out.append(f"source: {json_text(h.source)}")
    out.append(f"model_revision: {json_text(h.model_revision)}")
    out += format_json_fields("meta", h.meta)
    for layer, row in zip(h.moe_layer_indices, h.counts):
        out.append(f"layer {layer}: " + " ".join(map(str, row.tolist())))
    out.append(f"checksum: {h.checksum()}")
    return end_text(out)


def save_histogram(h: Histogram, path: str | os.PathLike[str], *,
                   comments: list[str] | None = None) -> None:
    """Validate and write atomically (temp file + rename)."""
    atomic_write_text(path, format_histogram(h, comments=comments))


def parse_histogram(text: str, path: str | os.PathLike[str] = "<histogram>") -> Histogram:
    header: dict[str, tuple[str, int]] = {}
    meta: dict[str, Any] = {}
    rows: list[tuple[int, int, str]] = []
    checksum: tuple[str, int] | None = None
    lines = RecordLines(text, path, not_this_kind=(
        f"not a histogram: the first line must be 'format: {HISTOGRAM_FORMAT_LINE}'"))
    for lineno, line in lines:
        m = _LAYER_LINE.fullmatch(line)
        if m:
            if len(rows) >= MAX_LAYERS:
                raise FormatError(f"more than {MAX_LAYERS} layers", path=path, line=lineno)
            rows.append((lineno, int(m.group(1)), m.group(2)))
            continue
        if _LAYER_LIKE.match(line):
            raise malformed_layer_line(line, path, lineno, "layer <L>: <counts>")
        key, sep, value = line.partition(":")
        if not sep:
            raise FormatError("unrecognised line (neither `key: value` nor a layer line)",
                              path=path, line=lineno)
        if key != key.strip() or not value.startswith(" ") or value != " " + value.strip(" "):
            raise FormatError("write 'key: value' (one space after the colon, none elsewhere)",
                              path=path, line=lineno, field=key.strip()[:40])
        key, value = key.strip(), value.strip(" ")
        if key.startswith("meta."):
            if key[5:] in meta:
                raise FormatError(f"{key!r} given twice", path=path, line=lineno, field=key)
            meta[key[5:]] = json_value(value, path, lineno, key)
        elif key == "checksum":
            if checksum is not None:
                raise FormatError("'checksum' given twice", path=path, line=lineno,
                                  field=key)
            if not _HEX64.fullmatch(value):
                raise FormatError("expected 64 lowercase hex digits", path=path, line=lineno,
                                  field=key)
            checksum = (value, lineno)
        elif key in ("format", "num_experts", "moe_layers", "tokens", "source",
                     "model_revision", *_OPTIONAL_INTS):
            if rows:
                raise FormatError("header line after the layer lines", path=path,
                                  line=lineno, field=key)
            put_once(header, key, value, lineno, path)
        else:
            raise FormatError(f"unknown field {key!r}", path=path, line=lineno, field=key)

    check_format_line(header, path, format_name=HISTOGRAM_FORMAT, version=HISTOGRAM_VERSION,
                      noun="histogram", adjective="histogram")
    for key in ("num_experts", "moe_layers", "tokens"):
        if key not in header:
            raise FormatError(f"missing '{key}:' line", path=path, field=key)

    def _int(key: str, *, optional: bool = False) -> int | None:
        if key not in header:
            return None
        value, ln = header[key]
        if value == "null" and optional:
            return None
        try:
            return parse_decimal(value, limit=MAX_TOTAL)
        except ValueError:
            raise FormatError(f"expected a non-negative decimal integer below 2^63"
                              f"{' or null' if optional else ''}", path=path, line=ln,
                              field=key) from None

    def _str(key: str) -> str:
        if key not in header:
            return ""
        value, ln = header[key]
        parsed = json_value(value, path, ln, key)
        if not isinstance(parsed, str):
            raise FormatError("expected a JSON string", path=path, line=ln, field=key)
        return parsed

    num_experts = parse_num_experts(*header["num_experts"], path)
    layers = parse_moe_layers(*header["moe_layers"], path)
    counts = np.zeros((len(layers), num_experts), dtype=np.int64)
    for position, want in enumerate(layers):
        if position >= len(rows):
            raise FormatError(f"no counts for layer {want} (truncated file or missing layer)",
                              path=path, line=rows[-1][0] if rows else lines.last_line,
                              field=f"layer {want}")
        ln, layer, values = rows[position]
        if layer != want:
            raise FormatError(f"expected layer {want}, found layer {layer} (layers must "
                              f"follow moe_layers)", path=path, line=ln, field=f"layer {layer}")
        tokens = values.split(" ")
        if len(tokens) != num_experts:
            raise FormatError(f"{len(tokens)} counts, expected {num_experts}", path=path,
                              line=ln, field=f"layer {layer}")
        if any(len(t) > 19 or int(t) > MAX_TOTAL for t in tokens):
            raise FormatError("a count above 2^63 - 1", path=path, line=ln,
                              field=f"layer {layer}")
        counts[position] = np.array([int(t) for t in tokens], dtype=np.int64)
    if len(rows) > len(layers):
        ln, layer, _ = rows[len(layers)]
        raise FormatError(f"layer {layer} is not in moe_layers or is listed twice", path=path,
                          line=ln, field=f"layer {layer}")
    hist = Histogram(layers, num_experts, counts, _int("tokens") or 0,
                     decode_tokens=_int("decode_tokens", optional=True),
                     prefill_tokens=_int("prefill_tokens", optional=True),
                     top_k=_int("top_k", optional=True),
                     source=_str("source"), model_revision=_str("model_revision"), meta=meta)
    if checksum is None:
        raise FormatError("missing 'checksum:' line (truncated file?)", path=path,
                          field="checksum")
    lines.require_end()
    if checksum[0] != hist.checksum():
        raise FormatError("checksum does not match the counts (file edited or corrupted)",
                          path=path, line=checksum[1], field="checksum")
    hist.validate(path=path)
    return hist


def load_histogram(path: str | os.PathLike[str]) -> Histogram:
    text = read_record_text(path)
    return parse_histogram(text, path)
