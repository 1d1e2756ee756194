"""Generated files as data: header comments and YAML documents serialized, then read back.

Every file recipegen generates is built as data (a header as a list of lines, the body as
mappings and lists) and serialized here; names — of files, folders, recipes, checkpoints — are
data like any other value and never pasted into the text:

- `comment_lines`: a header; each line through `comment_text` (the runtime's, shared with the row
  map and histogram writers), so a newline, carriage return, NEL, U+2028 or any control character
  in a name is written as an escape and the line stays one comment;
- `yaml_file` / `yaml_files`: a header plus one or several YAML documents (PyYAML's safe dumper:
  every string quoted as YAML needs, no anchors), then parsed back and compared with the data —
  a file whose text does not read back as exactly what was meant (an extra key, a lost comment
  line) is an internal error and is never written;
- `block_yaml`: the layout compose.yaml is written in (every string a double-quoted scalar with
  JSON's escapes, comments where the data places them), read back the same way, its comment lines
  compared too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml
from expert_residency.formats._io import comment_text

from recipegen.common.errors import RecipegenError


def comment_lines(lines: Iterable[str]) -> str:
    """`# line` per line (a bare `#` for an empty one), each line escaped by `comment_text`."""
    return "".join(f"# {comment_text(line)}\n" if line else "#\n" for line in lines)


class _Dumper(yaml.SafeDumper):
    """No `&id001` anchors: each value is written out where it is used."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


# Characters PyYAML would write raw in a plain or single-quoted scalar (with allow_unicode) that
# a reader takes for a line break or drops: NEL, U+2028, U+2029, other controls, the BOM. A
# string holding one is written double-quoted, where the emitter escapes them (\N, \L, \P, \x..).
_RAW_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")


def _represent_str(dumper: yaml.SafeDumper, data: str) -> Any:
    if _RAW_UNSAFE.search(data):
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style='"')
    return dumper.represent_str(data)


_Dumper.add_representer(str, _represent_str)


def _flow_scalars(dumper: yaml.SafeDumper, data: list[Any]) -> Any:
    flow = all(not isinstance(x, (dict, list)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


class _FlowDumper(_Dumper):
    """Lists of scalars on one line (`[a, b]`), as the model files are written."""


_FlowDumper.add_representer(list, _flow_scalars)


def _dump_options(flow_lists: bool, width: int) -> dict[str, Any]:
    return {"Dumper": _FlowDumper if flow_lists else _Dumper, "sort_keys": False,
            "allow_unicode": True, "width": width, "default_flow_style": False}


def verify_comments_and_data(text: str, header: list[str], documents: list[Any], *, what: str) -> None:
    """Refuse (internal error) a serialized file whose header is not exactly `len(header)` comment
    lines or whose YAML does not load back as `documents`."""
    lines = text.split("\n")
    if len(lines) < len(header) or not all(l.startswith("#") for l in lines[:len(header)]):
        raise RecipegenError(f"internal error: the header of {what} did not stay comments")
    try:
        loaded = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise RecipegenError(f"internal error: {what} does not parse back: {exc}") from None
    if loaded != documents:
        raise RecipegenError(f"internal error: {what} does not read back as the data it was "
                             "made from; nothing written")


def yaml_file(header: list[str], document: Any, *, what: str, flow_lists: bool = False,
              width: int = 110) -> str:
    """A header and one YAML document, checked to read back as `document`."""
    text = comment_lines(header) + yaml.dump(document, **_dump_options(flow_lists, width))
    verify_comments_and_data(text, header, [document], what=what)
    return text


def yaml_files(header: list[str], documents: list[Any], *, what: str, width: int = 100) -> str:
    """A header and several YAML documents (`---` before each), checked to read back."""
    body = yaml.dump_all(documents, explicit_start=True, **_dump_options(False, width))
    text = comment_lines(header) + body
    verify_comments_and_data(text, header, documents, what=what)
    return text


# -- the block style of compose.yaml -------------------------------------------------------------
# Compose files are written in one fixed layout (two-space block mappings, each sequence indented
# under its key, a comment where the data puts one) in which every string is a double-quoted
# scalar with JSON's escapes, unless the data marks it as one of recipegen's own bare words.


class Plain(str):
    """A string written unquoted: recipegen's own fixed words (`host`, `bind`, `15s`). Refused
    unless it is a bare word or duration that every YAML reader takes for that same string."""


class Flow(tuple):
    """A sequence of scalars written on one line: `["0"]`, `[gpu]`."""


@dataclass(frozen=True, eq=False)
class Comment:
    """A mapping key that is a `# text` line at its place (its value is None); the text goes
    through `comment_text`. Each instance is its own key, so a mapping may hold several."""

    text: str


# Keys: letters, digits, `_`, `.`, `-` (so never an anchor, a tag, a flow or block indicator).
# Written bare when they start with a letter or `_` (never a number then), else double-quoted.
KEY_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_BARE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_PLAIN_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_]*|[0-9]+(?:ms|s|m|h)")
# Words a YAML 1.1 reader (PyYAML; older Compose parsers) resolves to a boolean or null: a key or
# bare word spelled so is written quoted (an `env:` name `ON` stays the string "ON").
_YAML11_WORDS = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null"})
# What a double-quoted scalar must not carry raw: C0/C1 controls, DEL, U+2028/U+2029 (line breaks
# to YAML readers), the BOM and the non-characters, and its own quote and backslash.
_QUOTED_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\"\\\\]")
_QUOTED_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def double_quoted(text: str) -> str:
    """`text` as a YAML double-quoted scalar that every reader takes back as exactly `text`:
    quotes, backslashes and every line-breaking or control character escaped, JSON-style."""
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        raise RecipegenError(f"value {text[:40]!r}… is not valid Unicode text (lone surrogate)")
    return '"' + _QUOTED_UNSAFE.sub(
        lambda m: _QUOTED_ESCAPES.get(m.group(0), f"\\u{ord(m.group(0)):04x}"), text) + '"'


def _key(key: Any) -> str:
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        raise RecipegenError(f"{str(key)[:60]!r} cannot be a compose key: use letters, digits, "
                             "'_', '.' and '-'")
    bare = _BARE_KEY.fullmatch(key) and key.lower() not in _YAML11_WORDS
    return key if bare else double_quoted(key)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Plain):
        if not _PLAIN_PATTERN.fullmatch(value) or value.lower() in _YAML11_WORDS:
            raise RecipegenError(f"internal error: {str(value)[:60]!r} cannot be written unquoted")
        return str(value)
    if isinstance(value, str):
        return double_quoted(value)
    raise RecipegenError(f"internal error: a {type(value).__name__} cannot be written to a compose file")


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int))


def block_lines(mapping: dict[Any, Any], indent: int = 0, *, separate: bool = False) -> list[str]:
    """`mapping` as lines of block YAML at `indent` spaces. `separate`: a blank line before each
    key but the first (the top level of a compose file)."""
    pad = " " * indent
    lines: list[str] = []
    for position, (key, value) in enumerate(mapping.items()):
        if separate and position:
            lines.append("")
        if isinstance(key, Comment):
            if value is not None:
                raise RecipegenError("internal error: a comment carries no value")
            lines.append(f"{pad}# {comment_text(key.text)}")
            continue
        name = _key(key)
        if isinstance(value, Flow):
            if not all(_is_scalar(v) for v in value):
                raise RecipegenError("internal error: a one-line sequence holds scalars only")
            lines.append(f"{pad}{name}: [{', '.join(_scalar(v) for v in value)}]")
        elif isinstance(value, dict):
            if value:
                lines.append(f"{pad}{name}:")
                lines += block_lines(value, indent + 2)
            else:
                lines.append(f"{pad}{name}: {{}}")
        elif isinstance(value, (list, tuple)):
            if value:
                lines.append(f"{pad}{name}:")
                lines += _sequence_lines(value, indent + 2)
            else:
                lines.append(f"{pad}{name}: []")
        else:
            lines.append(f"{pad}{name}: {_scalar(value)}")
    return lines


def _sequence_lines(items: list[Any] | tuple[Any, ...], indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    for item in items:
        if isinstance(item, dict) and item and not isinstance(next(iter(item)), Comment):
            nested = block_lines(item, indent + 2)
            lines.append(f"{pad}- {nested[0][indent + 2:]}")
            lines += nested[1:]
        elif _is_scalar(item):
            lines.append(f"{pad}- {_scalar(item)}")
        else:
            raise RecipegenError("internal error: a sequence item is a scalar or a non-empty mapping")
    return lines


def plain_data(node: Any) -> Any:
    """What a YAML reader gives back for `node`: comments dropped, tuples as lists, markers as
    the plain strings they are."""
    if isinstance(node, dict):
        return {str(k): plain_data(v) for k, v in node.items() if not isinstance(k, Comment)}
    if isinstance(node, (list, tuple)):
        return [plain_data(v) for v in node]
    if isinstance(node, str):
        return str(node)
    return node


def block_yaml(header: list[str], document: dict[str, Any], *, what: str) -> str:
    """A header and one document in the block style, checked before it is returned: the text
    parses back as `document`, and its comment lines are exactly the header's and the data's."""
    body = block_lines(document, separate=True)
    text = comment_lines(header) + "\n".join(body) + "\n"
    verify_comments_and_data(text, header, [plain_data(document)], what=what)
    expected = comment_lines(header).splitlines() + [l for l in body if l.lstrip().startswith("#")]
    if [l for l in text.splitlines() if l.lstrip().startswith("#")] != expected:
        raise RecipegenError(f"internal error: the comments of {what} did not stay as written; "
                             "nothing written")
    return text
