"""Parsing and writing pieces shared by the line-oriented record formats (row map, histogram).

Both files are UTF-8 text: comment and blank lines, a `format: <name>/<version>` first
line, header/JSON fields, per-layer lines, a hash trailer and a final `end`. The parts that
are the same in both live here so that the two formats cannot drift apart.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from ._io import (
    MAX_EXPERTS,
    MAX_LAYER_INDEX,
    MAX_LAYERS,
    UnreadableFile,
    comment_text,
    format_index_ranges,
    parse_decimal,
    parse_index_ranges,
    read_regular_file,
)
from .errors import FormatError

_JSON_KEY = re.compile(r"[A-Za-z0-9_.\-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]")
MAX_RECORD_BYTES = 64 << 20  # a 40 x 384 histogram is ~100 KB


def put_once(fields: dict[str, tuple[str, int]], key: str, value: str, lineno: int,
             path: str | os.PathLike[str]) -> None:
    """Record a header field; a field given twice is refused (which one would count?)."""
    if key in fields:
        raise FormatError(f"{key!r} given twice (first on line {fields[key][1]})", path=path,
                          line=lineno, field=key)
    fields[key] = (value, lineno)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def json_value(value: str, path: str | os.PathLike[str], lineno: int, key: str) -> Any:
    """One strict JSON value (no NaN/Infinity, bounded nesting) or FormatError."""
    try:
        return json.loads(value, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else (
            "nested too deeply" if isinstance(exc, RecursionError) else str(exc))
        raise FormatError(f"value is not JSON ({reason})", path=path, line=lineno,
                          field=key) from None


def read_record_text(path: str | os.PathLike[str]) -> str:
    """The file's text; FormatError (naming the path) when it is missing or not UTF-8."""
    try:
        # a regular file, bounded before reading: a FIFO would block the reader (the runtime's
        # priors at boot), /dev/zero would never end
        data = read_regular_file(path, limit=MAX_RECORD_BYTES)
        if not data.strip():
            raise FormatError("empty file", path=path)
        return data.decode("utf-8")
    except FileNotFoundError:
        raise FormatError("no such file", path=path) from None
    except UnicodeDecodeError:
        raise FormatError("not UTF-8 text (corrupted file?)", path=path) from None
    except IsADirectoryError:
        raise FormatError("a folder, not a file", path=path) from None
    except UnreadableFile as exc:
        raise FormatError(f"{exc.strerror}: not a row map or histogram", path=path) from None
    except OSError as exc:
        raise FormatError(f"cannot read ({exc.strerror})", path=path) from None


# Characters json.dumps(ensure_ascii=False) leaves raw that the line reader refuses (they break
# or hide a line): C1 controls with DEL, U+2028/U+2029 and the BOM. Written as \uXXXX escapes,
# so a file name or label holding one reads back as itself.
_JSON_RAW_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff]")


def json_text(value: Any) -> str:
    """`value` as one line of JSON (sorted keys, non-ASCII kept, unsafe characters escaped)."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return _JSON_RAW_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


def format_json_fields(prefix: str, fields: Mapping[str, Any]) -> list[str]:
    """`<prefix>.<key>: <JSON>` lines, sorted by key; keys must be `[A-Za-z0-9_.-]+`."""
    out: list[str] = []
    for key in sorted(fields):
        if not _JSON_KEY.fullmatch(key):
            raise FormatError(f"{prefix} key {key!r} must be [A-Za-z0-9_.-]+",
                              field=f"{prefix}.{key}")
        out.append(f"{prefix}.{key}: {json_text(fields[key])}")
    return out


def format_header(comments: list[str] | None, format_line: str, num_experts: int,
                  moe_layer_indices: tuple[int, ...]) -> list[str]:
    """The opening lines both formats share: `# comments`, format, num_experts, moe_layers."""
    # comments carry names (files, lanes, classes): escaped so none can break its line
    out = [f"# {comment_text(c)}" if c else "#" for c in (comments or [])]
    out += [f"format: {format_line}",
            f"num_experts: {num_experts}",
            f"moe_layers: {format_index_ranges(moe_layer_indices)}"]
    return out


def end_text(lines: list[str]) -> str:
    """The file text: the lines, the closing `end`, a final newline."""
    return "\n".join([*lines, "end"]) + "\n"


class RecordLines:
    """The content lines `(lineno, line)` of a record file, checked as they stream.

    Comment and blank lines are skipped; the first content line must be the `format:`
    line; `end` closes the file (not yielded) and anything after it is refused. After
    iterating, `ended` says whether `end` was seen and `last_line` is the file's last
    line number (where a truncated file's error points).
    """

    def __init__(self, text: str, path: str | os.PathLike[str], *, not_this_kind: str) -> None:
        self._text = text
        self._path = path
        self._not_this_kind = not_this_kind  # message when the first line is not 'format:'
        self.ended = False
        self.last_line = 0

    def __iter__(self) -> Iterator[tuple[int, str]]:
        seen_format = False
        for lineno, raw in enumerate(self._text.split("\n"), start=1):
            self.last_line = lineno
            line = raw.rstrip("\r")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if self.ended:
                raise FormatError("content after 'end'", path=self._path, line=lineno)
            bad = _CONTROL.search(line)
            if bad:
                raise FormatError(f"control character {bad.group(0)!r} (tabs included) in a "
                                  "content line; fields are separated by single spaces",
                                  path=self._path, line=lineno)
            if not seen_format and not line.startswith("format:"):
                bom = " (it starts with a byte-order mark, U+FEFF: save it as UTF-8 without one)" \
                    if line.startswith("\ufeff") else ""
                raise FormatError(self._not_this_kind + bom, path=self._path, line=lineno,
                                  field="format")
            seen_format = True
            if line == "end":
                self.ended = True
                continue
            yield lineno, line

    def require_end(self) -> None:
        if not self.ended:
            raise FormatError("missing final 'end' line (truncated file?)", path=self._path,
                              line=self.last_line)


def check_format_line(header: Mapping[str, tuple[str, int]], path: str | os.PathLike[str], *,
                      format_name: str, version: int, noun: str, adjective: str) -> None:
    """The `format:` header names `format_name` at `version`, or FormatError.

    `noun`/`adjective` word the messages ("row map"/"row-map", "histogram"/"histogram").
    """
    if "format" not in header:
        raise FormatError(f"missing 'format:' line (not a {noun}?)", path=path, field="format")
    fmt, fmt_line = header["format"]
    name, _, found_version = fmt.partition("/")
    if name != format_name:
        shown = repr(fmt) if re.fullmatch(r"[a-z0-9-]{1,40}/[0-9]{1,4}", fmt) else "(not a format name)"
        raise FormatError(f"not a {noun}: format {shown}", path=path, line=fmt_line,
                          field="format")
    if found_version != str(version):
        found_version = found_version if re.fullmatch(r"[0-9]{1,4}", found_version) else "?"
        raise FormatError(f"unknown {adjective} format version {found_version!r} (this runtime "
                          f"reads version {version})", path=path, line=fmt_line,
                          field="format")


def malformed_layer_line(line: str, path: str | os.PathLike[str], lineno: int,
                         form: str) -> FormatError:
    """The error for a `layer …` line that is not in canonical form, saying what is wrong."""
    head, _, numbers = line.partition(":")
    named = re.fullmatch(r"layer (0|[1-9][0-9]*)((?: hot| cold)?).*", head)
    field = f"layer {named.group(1)}{named.group(2)}" if named else "layer"
    tokens = numbers[1:].split(" ") if numbers.startswith(" ") else [numbers]
    bad = next((t for t in tokens if not _DECIMAL.fullmatch(t)), None) if numbers.strip(" ") \
        else None
    if bad is not None and bad.startswith("-") and bad[1:].isdigit():
        reason = f"negative number {bad}"
    elif bad == "" and "" not in tokens[:-1]:      # the only empty token is after the last space
        reason = "a space at the end of the line"
    elif bad == "":
        reason = "two spaces in a row"
    elif bad is not None:
        reason = f"{bad[:20]!r} is not a plain decimal integer (no sign, no leading zeros)"
    else:
        reason = "malformed layer line"
    return FormatError(f"{reason}: write '{form}', integers separated by single spaces",
                       path=path, line=lineno, field=field)


_DECIMAL = re.compile(r"0|[1-9][0-9]*")


def parse_num_experts(value: str, lineno: int, path: str | os.PathLike[str]) -> int:
    """The `num_experts:` value: a canonical positive decimal, at most `MAX_EXPERTS`."""
    try:
        n = parse_decimal(value, limit=MAX_EXPERTS)
    except ValueError as exc:
        raise FormatError(f"{exc} (a positive integer, at most {MAX_EXPERTS})", path=path,
                          line=lineno, field="num_experts") from None
    if n <= 0:
        raise FormatError("must be positive", path=path, line=lineno, field="num_experts")
    return n


def parse_moe_layers(value: str, lineno: int, path: str | os.PathLike[str]) -> tuple[int, ...]:
    """The `moe_layers:` value: a non-empty list of unique non-negative layer indices."""
    try:
        layers = parse_index_ranges(value, max_index=MAX_LAYER_INDEX, max_count=MAX_LAYERS)
    except ValueError as exc:
        raise FormatError(f"bad layer list ({exc})", path=path, line=lineno,
                          field="moe_layers") from None
    if not layers or len(set(layers)) != len(layers) or min(layers) < 0:
        raise FormatError("layer list must be non-empty, unique and non-negative", path=path,
                          line=lineno, field="moe_layers")
    return layers
