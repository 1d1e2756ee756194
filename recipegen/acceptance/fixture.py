"""Parity fixtures: JSON Lines of prompts, one object per line.

    {"id": "agent-01", "category": "agent", "prompt": "..."}                  # /v1/completions
    {"id": "tool-01", "category": "tool", "messages": [...], "tools": [...]}   # /v1/chat/completions

`id` is unique; `category` groups the report; exactly one of `prompt` and `messages`.
Lines that are empty or start with `#` are skipped. The default fixture (50 prompts in the
the field reports' categories: 8 agent, 8 prose, 10 code, 10 math, 8 non-English, 6 tool/structured;
written for this project) ships in the package.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from recipegen.common.errors import InputError

DEFAULT_FIXTURE_NAME = "parity-default.jsonl"


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    prompt: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    tools: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True)
class Fixture:
    name: str
    prompts: tuple[Prompt, ...]

    def categories(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for p in self.prompts:
            counts[p.category] = counts.get(p.category, 0) + 1
        return counts


def default_fixture_text() -> str:
    return resources.files("recipegen").joinpath("fixtures", DEFAULT_FIXTURE_NAME).read_text(encoding="utf-8")


MAX_FIXTURE_BYTES = 256 << 20


def load_fixture(path: str | Path | None = None) -> Fixture:
    """The fixture at `path`, or the packaged default."""
    if path is None:
        return parse_fixture(default_fixture_text(), f"<default fixture {DEFAULT_FIXTURE_NAME}>")
    from expert_residency.formats._io import read_regular_file

    p = Path(path)
    try:
        # a regular file of bounded size only: a FIFO or device is refused, not waited on
        text = read_regular_file(p, limit=MAX_FIXTURE_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise InputError("fixture file not found", file=str(p)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read fixture: {exc}", file=str(p)) from None
    return parse_fixture(text, str(p))


def parse_fixture(text: str, name: str) -> Fixture:
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"not a JSON object: {exc.msg} (column {exc.colno})", file=name, line=number) from None
        if not isinstance(item, dict):
            raise InputError("each line must be a JSON object", file=name, line=number)
        unknown = sorted(set(item) - {"id", "category", "prompt", "messages", "tools"})
        if unknown:
            raise InputError(f"unknown key(s) {', '.join(unknown)}", file=name, line=number, field=unknown[0])
        pid = item.get("id")
        if not isinstance(pid, str) or not pid:
            raise InputError("missing or empty id", file=name, line=number, field="id")
        if pid in seen:
            raise InputError(f"id {pid!r} already used on line {seen[pid]}", file=name, line=number, field="id")
        seen[pid] = number
        category = item.get("category", "uncategorised")
        if not isinstance(category, str) or not category:
            raise InputError("category must be a non-empty string", file=name, line=number, field="category")
        prompt, messages, tools = item.get("prompt"), item.get("messages"), item.get("tools")
        if (prompt is None) == (messages is None):
            raise InputError("give exactly one of prompt and messages", file=name, line=number, field="prompt")
        if prompt is not None and (not isinstance(prompt, str) or not prompt):
            raise InputError("prompt must be a non-empty string", file=name, line=number, field="prompt")
        if messages is not None:
            if not isinstance(messages, list) or not messages or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
                raise InputError("messages must be a non-empty list of objects with a role", file=name,
                                 line=number, field="messages")
        if tools is not None:
            if messages is None:
                raise InputError("tools need chat messages", file=name, line=number, field="tools")
            if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
                raise InputError("tools must be a list of objects", file=name, line=number, field="tools")
        prompts.append(Prompt(id=pid, category=category, prompt=prompt,
                              messages=tuple(messages) if messages is not None else None,
                              tools=tuple(tools) if tools is not None else None))
    if not prompts:
        raise InputError("the fixture has no prompts", file=name)
    return Fixture(name=name, prompts=tuple(prompts))
