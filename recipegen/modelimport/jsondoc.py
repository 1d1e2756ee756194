"""Reading a checkpoint's JSON files (config.json, hf_quant_config.json, the safetensors index)
as data with the line of every key, and nothing looser than JSON.

The file is opened without following it into a device or a pipe: only a regular file is read
(a FIFO would block, `/dev/zero` never ends), and only up to a size bound checked before
reading. The text is parsed here rather than by `json.loads` because a user's error needs the
line of the field, not of the file: every key and array element gets its line. A key repeated
in one object, a number longer than `MAX_NUMBER_DIGITS` and nesting deeper than `MAX_DEPTH` are
refused with the line. NaN / Infinity / -Infinity (not JSON; Python's json accepts them) are refused
with the line too, unless the caller passes `nonfinite=True`: then each parses to a `NonFinite`
marker recorded in `JsonDoc.nonfinite` with its path, and the reader refuses it where it reads the
field (config.json: `config.Config.check_fields`). transformers writes Infinity into fields no size
depends on (Nemotron-H's `time_step_limit` [0.0, Infinity]); refusing those at parse time would hide
the refusal that matters.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipegen.common.errors import InputError, one_line
from recipegen.common.files import read_regular_file

MAX_DEPTH = 64
MAX_NUMBER_DIGITS = 40          # far beyond any real size; Python's int limit is 4,300
Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class NonFinite:
    """NaN, Infinity or -Infinity where JSON allows none (parsed only with `nonfinite=True`): not a number to
    compute with; a reader of the field refuses it."""

    word: str

    def __repr__(self) -> str:
        return self.word


@dataclass
class JsonDoc:
    """Parsed JSON and the line of each key / array element, by path (`("text_config", "hidden_size")`)."""

    data: Any
    file: str
    lines: dict[Path_, int] = field(default_factory=dict)
    nonfinite: dict[Path_, str] = field(default_factory=dict)    # path -> "NaN" / "Infinity" / "-Infinity"

    def nonfinite_under(self, prefix: Path_) -> tuple[Path_, str] | None:
        """The first (by line) NaN / Infinity at or under `prefix`, or None."""
        found = [(self.line(p) or 0, p, w) for p, w in self.nonfinite.items() if p[:len(prefix)] == prefix]
        if not found:
            return None
        _, path, word = min(found, key=lambda x: x[0])
        return path, word

    def line(self, path: Path_) -> int | None:
        """The line of `path`, or of its nearest enclosing key."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None

    def error(self, message: str, path: Path_) -> InputError:
        return InputError(message, file=self.file, line=self.line(path), field=dotted(path))


def dotted(path: Path_) -> str | None:
    """("text_config", "layer_types", 3) -> 'text_config.layer_types[3]'."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def present(path: Path, what: str) -> bool:
    """Whether `path` is there. A symbolic link to nothing (or a loop) is refused, not read as absent: a dangling
    hf_quant_config.json or index would otherwise import the checkpoint as if it had none."""
    if path.is_symlink() and not path.exists():
        try:
            target = f" `{one_line(os.readlink(path))}`"    # a link's text may hold line breaks
        except OSError:
            target = ""
        raise InputError(f"{what} is a link to nothing: its target{target} does not exist (or the link loops)",
                         file=str(path))
    return path.exists()


def load_json(path: Path, *, limit: int, what: str, nonfinite: bool = False) -> JsonDoc:
    raw = read_regular_file(path, limit=limit, what=what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise InputError(f"{what} is not UTF-8 text (byte {exc.start})", file=str(path), line=line) from None
    return parse_json(text, str(path), what=what, nonfinite=nonfinite)


def parse_json(text: str, file: str, *, what: str = "JSON file", nonfinite: bool = False) -> JsonDoc:
    """`nonfinite`: NaN / Infinity parse to a `NonFinite` marker (recorded in `JsonDoc.nonfinite`) for the
    reader to refuse where it reads them, instead of a refusal here."""
    doc = JsonDoc(None, file)
    parser = _Parser(text, doc, what, nonfinite)
    doc.data = parser.document()
    return doc


_WS = " \t\n\r"
_WS_RUN = re.compile(r"[ \t\n\r]*")
_PLAIN_STRING = re.compile(r'"([^"\\\x00-\x1f]*)"')
_ESC = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class _Parser:
    def __init__(self, text: str, doc: JsonDoc, what: str, nonfinite: bool = False) -> None:
        self.s, self.i, self.line, self.doc, self.what = text, 0, 1, doc, what
        self.nonfinite = nonfinite

    # --- errors
    def fail(self, message: str, path: Path_ = ()) -> InputError:
        return InputError(f"{self.what} is not valid JSON: {message}", file=self.doc.file, line=self.line,
                          field=dotted(path))

    # --- scanning
    def ws(self) -> None:
        end = _WS_RUN.match(self.s, self.i).end()
        if end != self.i:
            self.line += self.s.count("\n", self.i, end)
            self.i = end

    def document(self) -> Any:
        if self.s.startswith("\ufeff"):
            raise self.fail("it starts with a byte-order mark")
        self.ws()
        value = self.value((), 0)
        self.ws()
        if self.i != len(self.s):
            raise self.fail("extra text after the top-level value")
        return value

    def value(self, path: Path_, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH} levels", path[:3])
        if self.i >= len(self.s):
            raise self.fail("unexpected end of file", path)
        c = self.s[self.i]
        if c == "{":
            return self.obj(path, depth)
        if c == "[":
            return self.arr(path, depth)
        if c == '"':
            return self.string(path)
        for word in ("NaN", "Infinity", "-Infinity") if c in "NI-" else ():
            if self.s.startswith(word, self.i):
                if not self.nonfinite:
                    raise self.fail(f"{word} is not a JSON number", path)
                self.i += len(word)
                self.doc.lines.setdefault(path, self.line)
                self.doc.nonfinite[path] = word
                return NonFinite(word)
        if c == "-" or c.isdigit() and c.isascii():
            return self.number(path)
        for word, val in (("true", True), ("false", False), ("null", None)):
            if self.s.startswith(word, self.i):
                self.i += len(word)
                return val
        raise self.fail(f"unexpected character {c!r}", path)

    def obj(self, path: Path_, depth: int) -> dict[str, Any]:
        self.i += 1
        out: dict[str, Any] = {}
        seen: dict[str, int] = {}
        self.ws()
        if self.s.startswith("}", self.i):
            self.i += 1
            return out
        while True:
            self.ws()
            if not self.s.startswith('"', self.i):
                raise self.fail("expected a \"key\"", path)
            key_line = self.line
            key = self.string(path)
            if key in seen:
                raise InputError(f"key {key!r} appears twice in one object (lines {seen[key]} and {key_line}); "
                                 "JSON readers disagree on which one counts", file=self.doc.file, line=key_line,
                                 field=dotted(path + (key,)))
            seen[key] = key_line
            self.doc.lines[path + (key,)] = key_line
            self.ws()
            if not self.s.startswith(":", self.i):
                raise self.fail("expected ':' after a key", path + (key,))
            self.i += 1
            self.ws()
            out[key] = self.value(path + (key,), depth + 1)
            self.ws()
            if self.s.startswith(",", self.i):
                self.i += 1
                continue
            if self.s.startswith("}", self.i):
                self.i += 1
                return out
            raise self.fail("expected ',' or '}'", path + (key,))

    def arr(self, path: Path_, depth: int) -> list[Any]:
        self.i += 1
        out: list[Any] = []
        self.ws()
        if self.s.startswith("]", self.i):
            self.i += 1
            return out
        while True:
            self.ws()
            self.doc.lines.setdefault(path + (len(out),), self.line)
            out.append(self.value(path + (len(out),), depth + 1))
            self.ws()
            if self.s.startswith(",", self.i):
                self.i += 1
                continue
            if self.s.startswith("]", self.i):
                self.i += 1
                return out
            raise self.fail("expected ',' or ']'", path)

    def string(self, path: Path_) -> str:
        plain = _PLAIN_STRING.match(self.s, self.i)
        if plain:  # no escape, no control character: the common case, in one step
            self.i = plain.end()
            return plain.group(1)
        s = self.s
        i = self.i + 1
        parts: list[str] = []
        start = i
        while True:
            if i >= len(s):
                raise self.fail("unterminated string", path)
            c = s[i]
            if c == '"':
                parts.append(s[start:i])
                self.i = i + 1
                return "".join(parts)
            if c == "\\":
                parts.append(s[start:i])
                if i + 1 >= len(s):
                    raise self.fail("unterminated string", path)
                e = s[i + 1]
                if e in _ESC:
                    parts.append(_ESC[e])
                    i += 2
                elif e == "u":
                    code = self._hex4(i + 2, path)
                    i += 6
                    if 0xD800 <= code < 0xDC00 and s.startswith("\\u", i):
                        low = self._hex4(i + 2, path)
                        if 0xDC00 <= low < 0xE000:
                            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                            i += 6
                    parts.append(chr(code))
                else:
                    raise self.fail(f"invalid escape \\{e}", path)
                start = i
                continue
            if c < " ":
                raise self.fail("a control character inside a string" + (" (a line break)" if c == "\n" else ""),
                                path)
            i += 1

    def _hex4(self, at: int, path: Path_) -> int:
        digits = self.s[at:at + 4]
        if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise self.fail("invalid \\u escape", path)
        return int(digits, 16)

    def number(self, path: Path_) -> int | float:
        s, i = self.s, self.i
        start = i
        if s[i] == "-":
            i += 1
        digits_start = i
        while i < len(s) and s[i] in "0123456789":
            i += 1
        int_part = s[digits_start:i]
        if not int_part or (len(int_part) > 1 and int_part[0] == "0"):
            raise self.fail("invalid number", path)
        is_float = False
        if i < len(s) and s[i] == ".":
            i += 1
            frac = i
            while i < len(s) and s[i] in "0123456789":
                i += 1
            if i == frac:
                raise self.fail("invalid number", path)
            is_float = True
        if i < len(s) and s[i] in "eE":
            i += 1
            if i < len(s) and s[i] in "+-":
                i += 1
            exp = i
            while i < len(s) and s[i] in "0123456789":
                i += 1
            if i == exp:
                raise self.fail("invalid number", path)
            is_float = True
        text = s[start:i]
        if len(text) > MAX_NUMBER_DIGITS:
            raise self.fail(f"a number of {len(text)} characters (at most {MAX_NUMBER_DIGITS})", path)
        self.i = i
        if is_float:
            value = float(text)
            if value in (float("inf"), float("-inf")):
                raise self.fail(f"number {text} is out of range", path)
            return value
        return int(text)
