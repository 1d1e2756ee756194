"""A YAML file read for validation: round-trip parsing (line numbers kept), size and alias-bomb
limits, plain conversion, and every problem as one `InputError` naming file, line and field."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from recipegen.common.errors import InputError, one_line
from recipegen.common.files import read_regular_file
from recipegen.schema import Recipe
from recipegen.schema.base import PathError, reachable_models
from recipegen.schema.patterns import pattern_hint

# Bounds on what a recipe file may be before anything walks it (the reference is ~5 KB).
MAX_RECIPE_CHARS = 1 << 20
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 64

Loc = tuple[str | int, ...]
# A problem found in a file: (field path, message); a check returns every one it finds.
Problem = tuple[Loc, str]


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------- YAML

def read_yaml_file(path: Path, *, limit: int, what: str) -> Any:
    """The round-trip document of the file at `path` (`what`: "model file", "machine file"): a
    regular file of at most `limit` bytes, UTF-8, parsed by `parse_yaml`."""
    file = display_path(path)
    raw = read_regular_file(path, limit=limit, what=what, display=file)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError("not UTF-8 text", file=file, line=raw[:exc.start].count(b"\n") + 1) from None
    return parse_yaml(text, file)


def round_trip_yaml() -> Any:
    from ruamel.yaml import YAML

    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    yaml.preserve_quotes = True
    return yaml


def parse_yaml(text: str, file: str) -> Any:
    """Round-trip parse (keeps line numbers); syntax errors and duplicate keys are InputErrors."""
    from ruamel.yaml.constructor import DuplicateKeyError
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    if len(text) > MAX_RECIPE_CHARS:
        raise InputError(f"{len(text)} characters: larger than any recipe (at most "
                         f"{MAX_RECIPE_CHARS})", file=file)
    try:
        document = round_trip_yaml().load(text)
    except RecursionError:
        raise InputError(f"nested too deeply (at most {MAX_YAML_DEPTH} levels)",
                         file=file, line=nesting_line(text)) from None
    except DuplicateKeyError as exc:
        mark = exc.problem_mark
        found = duplicate_key_at(text, mark) if mark else None
        if found is None:
            key = _duplicate_key_name(exc)
            raise InputError(f"duplicate key {key!r}", file=file,
                             line=mark.line + 1 if mark else None, field=key) from None
        loc, first_line = found
        raise InputError(f"duplicate key {str(loc[-1])!r} (first defined on line {first_line})",
                         file=file, line=mark.line + 1, field=format_loc(loc)) from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
        raise InputError(f"YAML syntax error: {problem}", file=file,
                         line=mark.line + 1 if mark else None) from None
    except YAMLError as exc:
        position = getattr(exc, "position", None)  # a ReaderError: a character YAML forbids
        line = text.count("\n", 0, position) + 1 if isinstance(position, int) else None
        character = getattr(exc, "character", None)
        what = (f"character U+{ord(character) if isinstance(character, str) else character:04X} is not "
                "allowed in YAML (control characters, NUL)") if line is not None and character is not None \
            else str(exc).splitlines()[0][:200]
        raise InputError(f"YAML error: {what}", file=file, line=line) from None
    except (ValueError, OverflowError) as exc:  # e.g. a timestamp or number ruamel cannot build
        digits = re.search(r"[0-9_]{4000,}", text)  # past Python's 4,300-digit conversion limit
        if digits is not None:
            raise InputError(f"a number of {len(digits.group(0)):,} digits: not a value any field takes",
                             file=file, line=text.count("\n", 0, digits.start()) + 1) from None
        raise InputError(f"YAML value error: {type(exc).__name__}", file=file) from None
    check_expansion(document, file)
    return document


def nesting_line(text: str) -> int | None:
    """The line where `text` first nests deeper than `MAX_YAML_DEPTH` levels (flow brackets
    outside quotes, plus block indentation in steps of two), for a parser that ran out of stack."""
    depth = 0
    quote = ""
    for number, line in enumerate(text.split("\n"), start=1):
        indent = (len(line) - len(line.lstrip(" "))) // 2
        for char in line:
            if quote:
                if char == quote:
                    quote = ""
            elif char in "\"'":
                quote = char
            elif char == "#":
                break
            elif char in "[{":
                depth += 1
                if depth + indent > MAX_YAML_DEPTH:
                    return number
            elif char in "]}":
                depth = max(0, depth - 1)
        if indent > MAX_YAML_DEPTH:
            return number
    return None


def check_expansion(document: Any, file: str) -> None:
    """Refuse a document whose aliases expand past `MAX_YAML_NODES` nodes (a few-KB alias bomb
    is a billion nodes once anything walks it) or that nests past `MAX_YAML_DEPTH` levels.

    Walks the expanded tree with an explicit stack, counting every visit, so it stops as soon
    as the budget is spent instead of expanding first.
    """
    visits = 0
    stack: list[tuple[Any, int, int | None]] = [(document, 0, None)]
    while stack:
        node, depth, line = stack.pop()
        visits += 1
        if visits > MAX_YAML_NODES or depth > MAX_YAML_DEPTH:
            what = (f"expands to more than {MAX_YAML_NODES} values (anchors and aliases "
                    "included)") if visits > MAX_YAML_NODES else \
                f"nested deeper than {MAX_YAML_DEPTH} levels"
            raise InputError(f"{what}: not a recipe", file=file, line=line)
        lc = getattr(node, "lc", None)
        here = lc.line + 1 if lc is not None and getattr(lc, "line", None) is not None else line
        if isinstance(node, dict):
            for key, value in node.items():
                stack.append((key, depth + 1, here))
                stack.append((value, depth + 1, here))
        elif isinstance(node, list):
            stack.extend((item, depth + 1, here) for item in node)


def duplicate_key_at(text: str, mark: Any) -> tuple[Loc, int] | None:
    """For the duplicate key ruamel reports at `mark`: its field path and the line of the first
    definition of the same key in the same mapping. ruamel's own marks give only the mapping's
    start, so the text is composed again (nodes; only keys are constructed, to compare them) and
    searched for the key's own mark."""
    from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode

    yaml = round_trip_yaml()
    try:
        root = yaml.compose(text)
    except Exception:  # it composed once already; any surprise keeps the plain message
        return None

    def key_of(node: Any) -> Any:
        # the constructed key, as ruamel compares them (`1` and `0x1` are the same key)
        if isinstance(node, ScalarNode) and str(node.tag).endswith(":merge"):
            return "<<"  # constructs to an object equal to nothing else
        if isinstance(node, ScalarNode):
            try:
                return yaml.constructor.construct_object(node, deep=True)
            except Exception:
                return node.value
        return id(node)

    # in document order, each node once: an alias shares its anchor's node, which is reached
    # first, so the path is where the key is written
    seen: set[int] = set()
    stack: list[tuple[Any, Loc]] = [(root, ())]
    while stack:
        node, loc = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        children: list[tuple[Any, Loc]] = []
        if isinstance(node, SequenceNode):
            children = [(item, (*loc, i)) for i, item in enumerate(node.value)]
        elif isinstance(node, MappingNode):
            for index, (key_node, value_node) in enumerate(node.value):
                start = key_node.start_mark
                if (start.line, start.column) == (mark.line, mark.column):
                    key = key_of(key_node)
                    step = str(key_node.value) if isinstance(key_node, ScalarNode) else str(key)
                    first = next((k.start_mark.line + 1 for k, _ in node.value[:index]
                                  if key_of(k) == key), None)
                    return ((*loc, step), first) if first is not None else None
                if isinstance(key_node, ScalarNode):
                    children.append((value_node, (*loc, str(key_node.value))))
        stack.extend(reversed(children))
    return None


def _duplicate_key_name(exc: Exception) -> str:
    match = re.search(r'found duplicate key "([^"]*)"', str(exc))
    return match.group(1) if match else "?"


def to_plain(node: Any) -> Any:
    """ruamel's commented containers and scalar subclasses -> plain dict/list/str/int/float/bool."""
    if isinstance(node, dict):
        # string subclasses become str; any other key (null, a number, a `? [a]` sequence) is kept
        # as it is, so validation refuses it as not a string at its own line
        return {str(k) if isinstance(k, str) else k: to_plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [to_plain(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node


def line_of(document: Any, loc: Loc) -> int | None:
    """1-based line of the deepest part of `loc` present in the document."""
    line: int | None = None
    node = document
    for step in loc:
        lc = getattr(node, "lc", None)
        if isinstance(node, dict) and step not in node:
            # validation names a key that is not a string (null, `? [a]`) by its text
            step = next((k for k in node if not isinstance(k, str) and str(k) == str(step)), step)
        if isinstance(node, dict) and step in node:
            if lc is not None:
                try:
                    line = lc.key(step)[0] + 1
                except Exception:  # ruamel keeps no position for some keys
                    pass
            node = node[step]
        elif isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
            if lc is not None:
                try:
                    line = lc.item(step)[0] + 1
                except Exception:
                    pass
            node = node[step]
        else:
            break
    if line is None and document is not None and getattr(document, "lc", None) is not None:
        line = document.lc.line + 1
    return line


# A key holding a line break, a control character, a quote or a backslash (a recipe's own, e.g.
# a class named with a newline) is printed as `["…"]` with JSON's escapes, so the path stays one
# line and reads unambiguously; any other key is printed bare (`machines.Box 1`).
_QUOTED_STEP = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\"'\\\\]")


def format_loc(loc: Iterable[str | int]) -> str:
    out = ""
    for step in loc:
        if isinstance(step, int):
            out += f"[{step}]"
        elif _QUOTED_STEP.search(str(step)):
            out += f"[{json.dumps(str(step))}]"
        else:
            out += f".{step}" if out else str(step)
    return out or "(top level)"


# ---------------------------------------------------------------- validation errors

_ALL_FIELDS: set[str] | None = None


def _all_field_names() -> set[str]:
    global _ALL_FIELDS
    if _ALL_FIELDS is None:
        _ALL_FIELDS = {name for model in reachable_models(Recipe) for name in model.model_fields}
    return _ALL_FIELDS


def describe_error(error: dict[str, Any]) -> tuple[Loc, str]:
    loc: Loc = tuple(error["loc"])
    kind = error["type"]
    ctx = error.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, PathError):
        loc = loc + tuple(cause.path)
    value = error.get("input")
    if kind == "extra_forbidden":
        name = str(loc[-1]) if loc else "?"
        # never the name itself as the hint: `source` is a reserve's field, not a machine's
        close = difflib.get_close_matches(name, sorted(_all_field_names() - {name}), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return loc, f"unknown field {name!r}{hint}"
    if kind == "missing":
        return loc, "missing required field"
    if loc == ("version",) and kind == "literal_error":
        return loc, f"unsupported schema version {value!r}: this recipegen reads version 1"
    is_key = bool(loc) and loc[-1] == "[key]"
    if is_key:
        loc = loc[:-1]
    if kind == "string_pattern_mismatch":
        # the field's own hint (recipegen.schema.patterns owns one per pattern), never another's
        what = "name" if is_key else "value"
        regex = ctx.get("pattern")
        hint = pattern_hint(regex)
        advice = f"use {hint}" if hint else "it must match the pattern"
        return loc, f"{what} {_shown(value)} is not allowed: {advice} (pattern {regex})"
    message = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix):]
    if kind not in ("value_error", "assertion_error") and isinstance(value, (str, int, float, bool)):
        message += f" (got {_shown(value)})"
    return loc, message


def _shown(value: Any) -> str:
    """A value for a message: short ones as they are, long ones cut (with their length)."""
    text = repr(value)
    if len(text) <= 80:
        return text
    size = f"{len(value):,} characters" if isinstance(value, str) else f"{len(str(value)):,} digits"
    return f"{text[:60]}… ({size})"


def validation_error(path: Path, document: Any, exc: ValidationError) -> InputError:
    """pydantic's errors for the file at `path` as one InputError, each at its line and field."""
    errors = exc.errors(include_url=False)
    # Unknown fields first: a misspelt key also shows up as a missing required one.
    errors.sort(key=lambda e: e["type"] != "extra_forbidden")
    return problems_error(path, document, [describe_error(e) for e in errors])


def problems_error(path: Path, document: Any, problems: list[Problem]) -> InputError:
    """One InputError for all problems: the first sets file/line/field, the rest are listed."""
    file = display_path(path)
    # Each message on one line: a value quoted in it (a path with a newline in it) has its line
    # breaks and control characters escaped, so it cannot print as lines of its own.
    problems = [(loc, one_line(msg)) for loc, msg in problems]
    (loc0, msg0), rest = problems[0], problems[1:]
    message = msg0
    if rest:
        from expert_residency.formats._io import comment_text

        lines = [f"  {comment_text(file)}:{line_of(document, loc) or '?'}: field '{format_loc(loc)}': {msg}"
                 for loc, msg in rest]
        message += f"\n  ({len(problems)} problems in this file; the others:)\n" + "\n".join(lines)
    return InputError(message, file=file, line=line_of(document, loc0), field=format_loc(loc0))
