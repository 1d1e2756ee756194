"""A small OpenAI-compatible server for the acceptance tests (loopback only, stdlib).

A deterministic "model": the tokens of a completion are a hash chain of (weight seed, prompt,
position), so two servers with one weight seed agree token for token and a server with another
weight seed diverges (from `diverge_from` on). Prompts containing a `jitter` marker get one
token flipped on every third call (serving nondeterminism). Streamed tokens are paced by
`token_delay_s` per request, so C concurrent streams produce C / token_delay_s tok/s.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class FakeModel:
    weight_seed: int = 0
    diverge_from: int = 3          # with another weight seed, tokens before this index still agree
    jitter: tuple[str, ...] = ()   # prompt substrings whose output flips one token on every third call
    token_delay_s: float = 0.0
    with_token_ids: bool = True
    name: str = "fake-moe"
    calls: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def tokens(self, prompt: str, n: int) -> list[int]:
        out = []
        for i in range(n):
            seed = self.weight_seed if i >= self.diverge_from else 0
            digest = hashlib.sha256(f"{seed}|{prompt}|{i}".encode()).digest()
            out.append(int.from_bytes(digest[:4], "little") % 500)
        if any(marker in prompt for marker in self.jitter):
            with self.lock:
                count = self.calls[prompt] = self.calls.get(prompt, 0) + 1
            if count % 3 == 0 and n > 2:
                out[n // 2] = (out[n // 2] + 1) % 500
        return out


def _text(token: int) -> str:
    return f" w{token}"


def make_handler(model: FakeModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args: Any) -> None:  # keep test output clean
            pass

        def _json(self, status: int, payload: Any) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": model.name, "root": "/models/fake",
                                                             "max_model_len": 4096}]})
            elif self.path == "/version":
                self._json(200, {"version": "fake-0.1"})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._json(404, {"error": "not found"})
                return
            if body.get("model") != model.name:
                self._json(404, {"error": f"model {body.get('model')!r} not served"})
                return
            chat = self.path.endswith("chat/completions")
            prompt = json.dumps(body["messages"]) if chat else str(body.get("prompt"))
            n = int(body.get("max_tokens", 16))
            tokens = model.tokens(prompt, n)
            ids = model.with_token_ids and body.get("return_token_ids")
            if body.get("stream"):
                self._stream(tokens, ids, chat)
                return
            time.sleep(model.token_delay_s * n)
            text = "".join(_text(t) for t in tokens)
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            if ids:
                choice["token_ids"] = tokens
            self._json(200, {"id": "x", "choices": [choice],
                             "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}})

        def _stream(self, tokens: list[int], ids: bool, chat: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            try:
                for i, token in enumerate(tokens):
                    time.sleep(model.token_delay_s)
                    last = i == len(tokens) - 1
                    choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
                    if chat:
                        choice["delta"] = {"content": _text(token)}
                    else:
                        choice["text"] = _text(token)
                    if ids:
                        choice["token_ids"] = [token]
                    chunk = {"choices": [choice], "usage": {"completion_tokens": i + 1}}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped listening (end of a knee window)

    return Handler


@contextmanager
def serve(model: FakeModel | type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Run a loopback HTTP server on a free port; yields its base URL. `model`: the fake model
    (served by `make_handler`), or a request handler class of the test's own."""
    handler = model if isinstance(model, type) else make_handler(model)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
