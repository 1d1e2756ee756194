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
  line) is an internal error and is never written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
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
