"""Reading a lane's `extra_args` the way vLLM 0.33's `vllm serve` reads its command line.

`FlexibleArgumentParser.parse_args` (vllm/utils/argparse_utils.py:313-512 in 0.33.0) rewrites the
arguments before argparse sees them: in `--name` and `--name=value` every `_` before the first
`.` becomes `-` (lines 373-394), `-O<level>` becomes `--optimization-level <level>` (lines
395-407), and `--flag.key value` pieces are merged into one JSON value of `--flag` (lines 440-504).
argparse then applies the short aliases (`-tp`, `-dp`, …), reads `--no-<flag>` of a boolean as
False (`BooleanOptionalAction`), takes one value per flag (`nargs="+"` flags: every value up to the
next flag) and, when a flag is given twice, keeps the last.

`parse_args` implements exactly that reading over the generated flag table
(`recipegen/data/vllm_flags/vllm-<version>.json`), so what the ledger budgets is what vLLM runs:
the ledger asks it for a flag's value in any spelling (`value`, `on`, `values`). It refuses what it
does not read the same way — a flag given twice (vLLM would silently keep the last), `-O` and
`--flag.key` forms (write the canonical flag with one value), a spelling outside the table — each
as a problem naming the argument.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from recipegen.vllm_flags import FlagTable, load_flag_table

NO_VALUE_KINDS = ("bool", "bool_negated", "switch")
_NUMBER = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def is_number(text: str, *, integer: bool = False) -> bool:
    try:
        int(text) if integer else float(text)
    except ValueError:
        return False
    return True


def _looks_like_flag(token: str) -> bool:
    """argparse's test: a token starting with '-' is an option unless it is a negative number
    (the parser has no option that looks like one) or a lone '-'."""
    return token.startswith("-") and token != "-" and not _NUMBER.fullmatch(token)


@dataclass(frozen=True)
class Given:
    """One flag as vLLM reads it."""

    canonical: str              # the flag's canonical spelling, e.g. "--kv-cache-dtype"
    spelled: str                # as written, e.g. "--kv_cache_dtype=fp8"
    index: int                  # position of the flag in the argument list
    kind: str                   # the table's kind (bool, bool_negated, int, choice, list, ...)
    values: tuple[str, ...] = ()

    @property
    def on(self) -> bool:
        """For an on/off flag: whether it is on (`--x` on, `--no-x` off)."""
        return self.kind != "bool_negated"

    @property
    def value(self) -> str | None:
        """The value of a one-value flag (None for on/off flags)."""
        return self.values[0] if self.values else None


@dataclass
class ParsedArgs:
    """A command line as vLLM reads it: every flag (one each) and what is wrong with the line."""

    given: dict[str, Given] = field(default_factory=dict)   # canonical -> the flag
    problems: list[tuple[int, str]] = field(default_factory=list)   # (argument index, message)

    def get(self, canonical: str) -> Given | None:
        return self.given.get(canonical)

    def value(self, canonical: str) -> str | None:
        given = self.given.get(canonical)
        return None if given is None else given.value

    def values(self, canonical: str) -> tuple[str, ...]:
        given = self.given.get(canonical)
        return () if given is None else given.values

    def on(self, canonical: str, default: bool = False) -> bool:
        given = self.given.get(canonical)
        return default if given is None else given.on

    def integer(self, canonical: str, default: int) -> int:
        text = self.value(canonical)
        return int(text) if text is not None and is_number(text, integer=True) else default


def _vllm_spelling(flag: str) -> str:
    """vLLM's rewrite of a `--` flag name: `_` → `-` from after `--` to the first `.`."""
    head, dot, tail = flag[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def parse_args(argv: list[str], table: FlagTable | None = None, *, positional_first: bool = False,
               canonical_only: bool = False, allow_repeats: bool = False) -> ParsedArgs:
    """Read `argv` as `vllm serve` does (see the module docstring).

    `positional_first`: `argv[0]` may be the model tag. `canonical_only`: take each flag as
    written (the renderer's own argv, which uses canonical spellings only), no vLLM rewriting.
    `allow_repeats`: a flag may be given again, the last one counting (the renderer appends the
    profile boot's flags last on purpose); otherwise a repeat is a problem.
    """
    table = table or load_flag_table()
    out = ParsedArgs()
    problem = out.problems.append
    i = 0
    while i < len(argv):
        token = argv[i]
        if not _looks_like_flag(token):
            if i == 0 and positional_first:
                i += 1
                continue
            problem((i, f"unexpected value {token[:60]!r} (no flag takes it)"))
            i += 1
            continue
        flag, eq, inline_value = token.partition("=")
        start = i
        name = flag
        if not canonical_only:
            if re.fullmatch(r"-O.*", flag):
                problem((i, f"{flag}: vLLM reads -O forms as --optimization-level; write "
                            "--optimization-level N"))
                i = _skip_values(argv, i + 1)
                continue
            if flag.startswith("--"):
                name = _vllm_spelling(flag)
                if "." in name:
                    base = name.partition(".")[0]
                    problem((i, f"{flag}: vLLM merges `{base}.<key> VALUE` pieces into {base}'s JSON; "
                                f"write {base} once with its whole JSON value"))
                    i = _skip_values(argv, i + (1 if eq else 2))
                    continue
        if name not in table:
            problem((i, f"{flag}: not a `vllm serve` flag in vLLM {table.vllm_version}"))
            i = _skip_values(argv, i + 1)
            continue
        info = table.flags[name]
        kind = str(info["kind"])
        canonical = str(info.get("canonical") or name)
        values: list[str] = []
        if eq:
            values = [inline_value]
            i += 1
        elif kind in NO_VALUE_KINDS:
            i += 1
        else:
            j = i + 1
            while j < len(argv) and not _looks_like_flag(argv[j]):
                values.append(argv[j])
                j += 1
                if kind != "list":
                    break
            i = j
        if kind in NO_VALUE_KINDS and values:
            problem((start, f"{flag} takes no value (got {values[0][:40]!r})"))
            continue
        if kind not in NO_VALUE_KINDS and kind != "optional_value" and not values:
            problem((start, f"{flag} needs a value"))
            continue
        problems_before = len(out.problems)
        _check_values(flag, name, kind, values, table, lambda m, s=start: problem((s, m)))
        if len(out.problems) > problems_before:
            continue
        previous = out.given.get(canonical)
        if previous is not None and not allow_repeats:
            problem((start, f"{flag}: {canonical} is already given as {previous.spelled[:40]!r} "
                            f"(argument {previous.index + 1}); vLLM would silently keep the last — "
                            "give it once"))
            continue
        out.given[canonical] = Given(canonical, token, start, kind, tuple(values))
    return out


def _skip_values(argv: list[str], i: int) -> int:
    while i < len(argv) and not _looks_like_flag(argv[i]):
        i += 1  # its value(s), whatever they were meant to be
    return i


def _check_values(flag: str, name: str, kind: str, values: list[str], table: FlagTable,
                  problem: object) -> None:
    report = problem  # a callable taking the message
    choices = table.choices(name)
    if choices is not None:
        for value in values:
            if value not in choices:
                report(f"{flag} {value[:40]!r}: not one of {', '.join(choices)}")  # type: ignore[operator]
    if kind in ("int", "float"):
        for value in values:
            if not is_number(value, integer=(kind == "int")):
                report(f"{flag} {value[:40]!r}: not a number")  # type: ignore[operator]
    if kind == "json":
        allowed = table.flags[name].get("fields")
        for value in values:
            if not value.startswith("{"):
                continue
            try:
                parsed = json.loads(value)
            except (json.JSONDecodeError, RecursionError) as exc:
                report(f"{flag}: invalid JSON ({getattr(exc, 'msg', 'nested too deeply')})")  # type: ignore[operator]
                continue
            if allowed and isinstance(parsed, dict):
                for key in sorted(set(parsed) - set(allowed)):
                    report(f"{flag}: {str(key)[:40]!r} is not a field of "  # type: ignore[operator]
                           f"{table.flags[name].get('config', 'its config')}")
