"""Async client for OpenAI-compatible endpoints (vLLM's `vllm serve`), on httpx.

One `EndpointClient` per endpoint keeps one connection pool for a whole run. Greedy requests
ask vLLM for the generated token ids (`return_token_ids`) so parity compares tokens, not
text; servers that do not return them are compared on text. Streaming requests count tokens
as they arrive: from the delta `token_ids` when present, else from vLLM's continuous usage
statistics, else one per non-empty chunk.
"""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx

from recipegen.acceptance.timeouts import IDENTITY_TIMEOUT_S, REQUEST_TIMEOUT_S
from recipegen.common.errors import RecipegenError, one_line


class EndpointError(RecipegenError):
    """The endpoint could not be reached or answered with an error."""


class EndpointUnreachable(EndpointError):
    """No (complete) answer: connection refused, host unreachable, a timeout or a broken connection."""


CONNECT_TIMEOUT_S = 10.0
# An HTTP error's body in a message: at most this many characters, on one line.
ERROR_BODY_CHARS = 200


def normalize_base_url(url: str) -> str:
    """`http://host:8000`, `http://host:8000/` and `http://host:8000/v1` all become `http://host:8000`."""
    url = url.strip()
    if "://" not in url:
        url = f"http://{url}"
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    parsed = httpx.URL(url)
    if not parsed.host:
        raise EndpointError(f"cannot read {url!r} as an endpoint URL (e.g. http://127.0.0.1:8000)")
    return url


@dataclass(frozen=True)
class Request:
    """One greedy generation request: a completion prompt, or chat messages (with tools)."""

    prompt: str | None = None
    messages: Sequence[dict[str, Any]] | None = None
    tools: Sequence[dict[str, Any]] | None = None
    max_tokens: int = 256
    seed: int | None = 42
    temperature: float = 0.0
    ignore_eos: bool = False

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


@dataclass(frozen=True)
class Generation:
    """What one request produced."""

    text: str
    token_ids: tuple[int, ...] | None
    finish_reason: str | None
    completion_tokens: int | None
    latency_s: float


@dataclass
class StreamStats:
    """Timings of one streamed request (monotonic clock, seconds)."""

    start: float
    end: float | None = None
    first_token: float | None = None
    tokens: int = 0
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (time, tokens in that chunk)
    finish_reason: str | None = None


class EndpointClient:
    """An OpenAI-compatible endpoint; use as `async with EndpointClient(url) as client:`."""

    def __init__(self, url: str, *, model: str | None = None, timeout_s: float = REQUEST_TIMEOUT_S,
                 max_connections: int = 64, api_key: str | None = None) -> None:
        self.base_url = normalize_base_url(url)
        self._model = model
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            base_url=self.base_url, headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s)),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))

    async def __aenter__(self) -> EndpointClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    # --- discovery ---------------------------------------------------------------------
    @property
    def model_name(self) -> str | None:
        """The model named with --model, or the one /v1/models gave; None before that."""
        return self._model

    @property
    def identity_timeout_s(self) -> float:
        """How long the identity probe waits for an answer (IDENTITY_TIMEOUT_S, or less with a shorter --timeout)."""
        return min(IDENTITY_TIMEOUT_S, self.timeout_s)

    async def get_json(self, path: str) -> Any:
        """GET `path` as part of the identity probe: a short timeout of its own (IDENTITY_TIMEOUT_S)."""
        limit = self.identity_timeout_s
        try:
            response = await self._client.get(
                path, timeout=httpx.Timeout(limit, connect=min(CONNECT_TIMEOUT_S, limit)))
        except httpx.HTTPError as exc:
            raise EndpointUnreachable(f"{self.base_url}{path}: {_describe(exc, limit, probe=True)}") from None
        if response.status_code != 200:
            raise EndpointError(self._http_error(path, response.status_code, response.reason_phrase,
                                                 response.text))
        try:
            return response.json()
        except ValueError:
            raise EndpointError(f"{self.base_url}{path}: the answer is not JSON") from None

    async def models(self) -> list[dict[str, Any]]:
        data = await self.get_json("/v1/models")
        models = data.get("data") if isinstance(data, dict) else None
        if not isinstance(models, list):
            raise EndpointError(f"{self.base_url}/v1/models: no model list in the answer")
        return [m for m in models if isinstance(m, dict)]

    async def model(self) -> str:
        """The served model name: the one given, else the endpoint's only (first) model."""
        if self._model is None:
            models = await self.models()
            if not models:
                raise EndpointError(f"{self.base_url} serves no model")
            self._model = str(models[0].get("id"))
        return self._model

    def _http_error(self, path: str, status: int, reason: str, body: str) -> str:
        """One line: the URL, the status and the start of the body; a hint when a 404 looks like a wrong URL."""
        message = f"{self.base_url}{path}: HTTP {status}{' ' + reason if reason else ''}"
        summary = error_body_summary(body)
        if summary:
            message += f": {summary}"
        base_path = httpx.URL(self.base_url).path.rstrip("/")
        if status == 404 and base_path:   # (a trailing /v1 is already gone: normalize_base_url)
            root = str(httpx.URL(self.base_url).copy_with(path="/")).rstrip("/")
            message += (f" (hint: the endpoint is the server's base URL, e.g. {root}, without a path "
                        f"such as {base_path}, unless a proxy serves it there)")
        return message

    # --- generation --------------------------------------------------------------------
    def _body(self, request: Request, model: str, *, stream: bool) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"model": model, "max_tokens": request.max_tokens,
                                "temperature": request.temperature, "return_token_ids": True}
        if request.seed is not None:
            body["seed"] = request.seed
        if request.ignore_eos:
            body["ignore_eos"] = True
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        if request.is_chat:
            body["messages"] = list(request.messages or [])
            if request.tools:
                body["tools"] = list(request.tools)
            return "/v1/chat/completions", body
        if request.prompt is None:
            raise EndpointError("a request needs a prompt or messages")
        body["prompt"] = request.prompt
        return "/v1/completions", body

    async def generate(self, request: Request) -> Generation:
        """One non-streamed greedy request."""
        path, body = self._body(request, await self.model(), stream=False)
        start = time.monotonic()
        try:
            response = await self._client.post(path, json=body)
        except httpx.HTTPError as exc:
            raise EndpointUnreachable(f"{self.base_url}{path}: {_describe(exc, self.timeout_s)}") from None
        latency = time.monotonic() - start
        if response.status_code != 200:
            raise EndpointError(self._http_error(path, response.status_code, response.reason_phrase,
                                                 response.text))
        try:
            data = response.json()
        except ValueError:
            raise EndpointError(f"{self.base_url}{path}: the answer is not JSON") from None
        choice = (data.get("choices") or [{}])[0]
        text, token_ids = _choice_output(choice, chat=request.is_chat)
        usage = data.get("usage") or {}
        return Generation(text=text, token_ids=token_ids, finish_reason=choice.get("finish_reason"),
                          completion_tokens=usage.get("completion_tokens"), latency_s=latency)

    async def stream(self, request: Request) -> StreamStats:
        """One streamed request, timing every chunk's tokens."""
        stats = StreamStats(start=time.monotonic())
        async for _ in self.stream_events(request, stats):
            pass
        return stats

    async def stream_events(self, request: Request, stats: StreamStats) -> AsyncIterator[int]:
        """Stream `request`, updating `stats` and yielding the token count of each chunk."""
        path, body = self._body(request, await self.model(), stream=True)
        usage_seen = 0
        try:
            async with self._client.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode("utf-8", "replace")
                    raise EndpointError(self._http_error(path, response.status_code, response.reason_phrase,
                                                         text))
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    now = time.monotonic()
                    try:
                        chunk = json.loads(payload)
                    except ValueError:
                        continue
                    n, usage_seen = _chunk_tokens(chunk, usage_seen, chat=request.is_chat)
                    choices = chunk.get("choices") or []
                    if choices and choices[0].get("finish_reason"):
                        stats.finish_reason = choices[0]["finish_reason"]
                    if n > 0:
                        if stats.first_token is None:
                            stats.first_token = now
                        stats.tokens += n
                        stats.arrivals.append((now, n))
                        yield n
        except httpx.HTTPError as exc:
            raise EndpointUnreachable(f"{self.base_url}{path}: {_describe(exc, self.timeout_s)}") from None
        finally:
            stats.end = time.monotonic()


def _choice_output(choice: dict[str, Any], *, chat: bool) -> tuple[str, tuple[int, ...] | None]:
    ids = choice.get("token_ids")
    token_ids = tuple(int(t) for t in ids) if isinstance(ids, list) else None
    if not chat:
        return str(choice.get("text") or ""), token_ids
    message = choice.get("message") or {}
    text = str(message.get("content") or "")
    calls = message.get("tool_calls") or []
    if calls:  # tool calls are part of the output: compare name and arguments, not random call ids
        text += "\n<tool_calls>" + json.dumps(
            [{"name": (c.get("function") or {}).get("name"), "arguments": (c.get("function") or {}).get("arguments")}
             for c in calls], sort_keys=True)
    return text, token_ids


def _chunk_tokens(chunk: dict[str, Any], usage_seen: int, *, chat: bool) -> tuple[int, int]:
    """(tokens in this chunk, completion tokens seen so far by usage statistics)."""
    choices = chunk.get("choices") or []
    usage = chunk.get("usage") or {}
    usage_total = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if choices:
        ids = choices[0].get("token_ids")
        if isinstance(ids, list):
            n = len(ids)
            return n, usage_seen + n if usage_total is None else max(usage_total, usage_seen + n)
    if isinstance(usage_total, int) and usage_total >= usage_seen:
        return usage_total - usage_seen, usage_total
    if choices:
        piece = choices[0].get("delta", {}).get("content") if chat else choices[0].get("text")
        if piece:
            return 1, usage_seen + 1
    return 0, usage_seen


def _json_error_message(data: dict[str, Any]) -> str | None:
    """The message of a JSON error body: OpenAI's `{"error": {"message": …}}`, a string `error`,
    FastAPI's `{"detail": …}` (vLLM's unknown route: `{"detail": "Not Found"}`; a validation
    error: a list of `{"msg": …}`, the first taken) or vLLM's own `{"message": …}`."""
    error, detail = data.get("error"), data.get("detail")
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        detail = detail[0].get("msg")
    for message in (error.get("message") if isinstance(error, dict) else error, detail, data.get("message")):
        if isinstance(message, str) and message.strip():
            return message
    return None


def error_body_summary(body: str, limit: int = ERROR_BODY_CHARS) -> str:
    """An HTTP error body as one short line: a JSON error's message (`_json_error_message`), an
    HTML page's text without its tags, anything else as it is; whitespace collapsed, at most
    `limit` characters."""
    text = body.strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        text = _json_error_message(data) or text
    elif text.startswith("<"):   # an HTML page (a proxy's or a static server's 404): its words
        text = html.unescape(re.sub(r"<(head|script|style)\b.*?</\1\s*>|<!--.*?-->|<[^>]*>", " ", text,
                                    flags=re.S | re.I))
    text = one_line(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _describe(exc: httpx.HTTPError, limit_s: float, *, probe: bool = False) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "connection refused or host unreachable (is the lane up? `recipegen status`)"
    if isinstance(exc, httpx.ConnectTimeout):
        return (f"no connection within {min(CONNECT_TIMEOUT_S, limit_s):g} s "
                "(ConnectTimeout; is the host reachable?)")
    if isinstance(exc, httpx.ReadTimeout) and probe:
        return (f"the server accepted the connection but sent no answer within {limit_s:g} s "
                "(still loading the model? vLLM accepts connections while it boots; else it is hung)")
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {limit_s:g} s ({type(exc).__name__}; --timeout sets the limit)"
    return f"{type(exc).__name__}: {exc}"
