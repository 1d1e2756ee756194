"""The `vllm serve` flags a vLLM version accepts, and a checker for a rendered argv (the
`--moe-backend` value a lane gets is chosen in `recipegen.vllm_flags.moe_backend`).

The table is generated from vLLM's source by `recipegen.vllm_flags.generate` and committed
under `recipegen/data/vllm_flags/vllm-<version>.json`; regenerate it with
`python -m recipegen.vllm_flags.generate <vllm package folder> --out <that file>`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

TARGET_VLLM_VERSION = "0.33.0"

# Kinds that take no value on the command line.
_NO_VALUE_KINDS = {"bool", "bool_negated", "switch"}


@dataclass(frozen=True)
class FlagTable:
    vllm_version: str
    flags: dict[str, dict[str, Any]]
    source_sha256: dict[str, str]

    def __contains__(self, flag: str) -> bool:
        return flag in self.flags

    def kind(self, flag: str) -> str:
        return str(self.flags[flag]["kind"])

    def choices(self, flag: str) -> list[str] | None:
        choices = self.flags[flag].get("choices")
        return list(choices) if choices is not None else None


@lru_cache(maxsize=4)
def load_flag_table(vllm_version: str = TARGET_VLLM_VERSION) -> FlagTable:
    """The committed flag table for `vllm_version` (a LookupError when none is committed)."""
    name = f"vllm-{vllm_version}.json"
    resource = resources.files("recipegen") / "data" / "vllm_flags" / name
    if not resource.is_file():
        raise LookupError(f"no vLLM flag table for version {vllm_version} ({name})")
    data = json.loads(resource.read_text(encoding="utf-8"))
    return FlagTable(data["vllm_version"], data["flags"], data["source_sha256"])


def argv_problems(argv: list[str], table: FlagTable) -> list[str]:
    """What is wrong with `vllm serve <argv>` for this table: unknown flags, missing values,
    values outside a flag's choices, values given to on/off flags. Empty when fine.

    Only the canonical spellings count (no `--flag_name` or `--flag.key` forms): the renderer
    writes canonical flags, and a stricter check catches typos in templates.
    """
    problems: list[str] = []
    i = 0
    positional_seen = False
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-"):
            if i == 0 and not positional_seen:
                positional_seen = True  # the model tag
                i += 1
                continue
            problems.append(f"unexpected value {token!r} (no flag takes it)")
            i += 1
            continue
        flag, eq, inline_value = token.partition("=")
        if flag not in table:
            problems.append(f"{flag}: not a `vllm serve` flag in vLLM {table.vllm_version}")
            i += 1
            while i < len(argv) and not argv[i].startswith("-"):
                i += 1  # its value(s), whatever they were meant to be
            continue
        kind = table.kind(flag)
        values: list[str] = []
        if eq:
            values = [inline_value]
            i += 1
        elif kind in _NO_VALUE_KINDS:
            i += 1
        else:
            j = i + 1
            while j < len(argv) and not (argv[j].startswith("-") and argv[j] != "-"
                                         and not _is_number(argv[j])):
                values.append(argv[j])
                j += 1
                if kind != "list":
                    break
            i = j
        if kind in _NO_VALUE_KINDS and values:
            problems.append(f"{flag} takes no value (got {values[0]!r})")
        elif kind not in _NO_VALUE_KINDS and kind != "optional_value" and not values:
            problems.append(f"{flag} needs a value")
        choices = table.choices(flag)
        if choices is not None:
            for value in values:
                if value not in choices:
                    problems.append(f"{flag} {value!r}: not one of {', '.join(choices)}")
        if kind in ("int", "float"):
            for value in values:
                if not _is_number(value, integer=(kind == "int")):
                    problems.append(f"{flag} {value!r}: not a number")
        if kind == "json":
            allowed = table.flags[flag].get("fields")
            for value in values:
                if not value.startswith("{"):
                    continue
                try:
                    parsed = json.loads(value)
                except json.JSONDecodeError as exc:
                    problems.append(f"{flag}: invalid JSON ({exc})")
                    continue
                if allowed and isinstance(parsed, dict):
                    for key in sorted(set(parsed) - set(allowed)):
                        problems.append(f"{flag}: {key!r} is not a field of "
                                        f"{table.flags[flag].get('config', 'its config')}")
    return problems


def _is_number(text: str, integer: bool = False) -> bool:
    try:
        int(text) if integer else float(text)
    except ValueError:
        return False
    return True
