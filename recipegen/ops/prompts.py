"""Drive a prompt fixture against a serving endpoint (OpenAI-compatible API of vLLM).

A fixture is a JSONL file (one object per line: `{"prompt": "..."}` or `{"messages": [...]}`,
optional `max_tokens`) or a plain text file (one prompt per line). Requests go one at a time:
the point is routing counts per traffic class, not load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipegen.common.errors import InputError, RecipegenError

DEFAULT_MAX_TOKENS = 64
# Request fields a fixture line may set (OpenAI API + vLLM's `ignore_eos` for fixed lengths).
PASSED_KEYS = ("prompt", "messages", "max_tokens", "temperature", "seed", "ignore_eos")


@dataclass(frozen=True)
class Prompt:
    body: dict[str, Any]
    chat: bool


# A prompt fixture is a few hundred KB; one past this is not a fixture and is not read.
MAX_PROMPTS_BYTES = 256 << 20


def _read_text(path: Path) -> str:
    """The fixture's text, read only as a regular file of bounded size (a FIFO or device named
    as the fixture is refused, never waited on)."""
    from expert_residency.formats._io import UnreadableFile, read_regular_file

    try:
        data = read_regular_file(path, limit=MAX_PROMPTS_BYTES)
    except UnreadableFile as exc:
        raise InputError(f"{exc.strerror}: not a prompt fixture", file=str(path)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError("not UTF-8 text", file=str(path), line=data.count(b"\n", 0, exc.start) + 1) from None


def load_prompts(path: Path) -> list[Prompt]:
    if not path.is_file():
        raise InputError("prompt fixture not found", file=str(path))
    prompts: list[Prompt] = []
    jsonl = path.suffix in (".jsonl", ".json")
    for number, raw in enumerate(_read_text(path).splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not jsonl:
            prompts.append(Prompt({"prompt": line, "max_tokens": DEFAULT_MAX_TOKENS}, chat=False))
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"not JSON: {exc.msg}", file=str(path), line=number) from None
        if not isinstance(item, dict) or not ({"prompt", "messages"} & item.keys()):
            raise InputError("each line needs a 'prompt' or 'messages'", file=str(path),
                             line=number, field="prompt")
        body = {k: v for k, v in item.items() if k in PASSED_KEYS}
        body.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
        prompts.append(Prompt(body, chat="messages" in body))
    if not prompts:
        raise InputError("prompt fixture has no prompts", file=str(path))
    return prompts


def served_model(endpoint: str, timeout_s: float = 30) -> str:
    import httpx

    try:
        reply = httpx.get(f"{endpoint}/v1/models", timeout=timeout_s)
        reply.raise_for_status()
        return str(reply.json()["data"][0]["id"])
    except Exception as exc:
        raise RecipegenError(f"{endpoint}/v1/models did not answer with a model: {exc}") from None


def drive(endpoint: str, prompts: list[Prompt], *, timeout_s: float = 600) -> int:
    """Send every prompt; returns the completion tokens the server reported."""
    import httpx

    model = served_model(endpoint)
    tokens = 0
    with httpx.Client(timeout=timeout_s) as client:
        for i, p in enumerate(prompts, start=1):
            path = "/v1/chat/completions" if p.chat else "/v1/completions"
            try:
                reply = client.post(f"{endpoint}{path}", json={"model": model, **p.body})
                reply.raise_for_status()
            except Exception as exc:
                raise RecipegenError(f"prompt {i} of {len(prompts)} failed at {endpoint}{path}: "
                                     f"{exc}") from None
            tokens += int((reply.json().get("usage") or {}).get("completion_tokens") or 0)
    return tokens
