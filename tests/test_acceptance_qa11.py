"""QA pass 11 on `parity` / `knee`: a server that accepts but never answers is reported after the
short identity timeout; HTTP error bodies are one short line (with a hint for a URL with a path);
knee takes --timeout; the reports state their settings, explain their shorthand, show the spread
beside the candidate-vs-control change and the diverging tokens themselves."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import pytest
from acceptance_support import FakeModel, serve
from cli_support import invoke

from recipegen.acceptance import client as client_module
from recipegen.acceptance.client import error_body_summary
from recipegen.acceptance.knee import KneeResult, Level, Window
from recipegen.acceptance.parity import Output, first_divergence
from recipegen.acceptance.report import identity_lines, knee_text


@contextmanager
def silent_server() -> Iterator[str]:
    """A loopback TCP server that accepts every connection and never answers; yields its URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        listener.close()


class Html404(BaseHTTPRequestHandler):
    """Answers every request with 404 and the stdlib's multi-line HTML page."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_error(404, "File not found")

    do_POST = do_GET


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


IDENTITY_S = 1.0   # the identity timeout for these tests (the real one, 30 s, patched down)


@pytest.mark.parametrize("command", [
    ["parity", "{url}", "--record", "{tmp}/r.json"],
    ["knee", "{url}", "--duration", "1s", "--warmup", "0", "--repetitions", "1", "--concurrency", "1"],
])
def test_a_server_that_never_answers_is_reported_after_the_identity_timeout(command, tmp_path, monkeypatch):
    # No --timeout: the default 600 s per request must not apply to the first requests.
    monkeypatch.setattr(client_module, "IDENTITY_TIMEOUT_S", IDENTITY_S)
    with silent_server() as url:
        start = time.monotonic()
        result = invoke(*(arg.format(url=url, tmp=tmp_path) for arg in command))
        elapsed = time.monotonic() - start
    assert result.code == 2, result.output
    assert elapsed < IDENTITY_S + 4, elapsed
    (line,) = error_lines(result.stderr)
    assert line == (f"error: {url}/v1/models: the server accepted the connection but sent no answer within "
                    f"{IDENTITY_S:g} s (still loading the model? vLLM accepts connections while it boots; "
                    "else it is hung)")
    assert result.stderr.index(f"… asking {url} what it serves") < result.stderr.index("error:")
    assert result.stdout == ""


def test_the_identity_timeout_is_short_and_never_longer_than_timeout():
    assert client_module.IDENTITY_TIMEOUT_S <= 30
    assert client_module.EndpointClient("http://127.0.0.1:9").identity_timeout_s == client_module.IDENTITY_TIMEOUT_S
    assert client_module.EndpointClient("http://127.0.0.1:9", timeout_s=2).identity_timeout_s == 2


def test_knee_takes_the_same_timeout_option_as_parity():
    helps = [invoke(cmd, "--help").stdout for cmd in ("parity", "knee")]
    blocks = []
    for text in helps:
        start = text.index("--timeout")
        end = text.index("\n  --", start + 1) if "\n  --" in text[start + 1:] else len(text)
        blocks.append(" ".join(text[start:end].split()))
    assert blocks[0] == blocks[1]
    assert "default: 600.0" in blocks[0]
    assert f"at most {client_module.IDENTITY_TIMEOUT_S:g} s" in blocks[0]


def test_knee_timeout_applies_to_the_requests(monkeypatch):
    with silent_server() as url:
        start = time.monotonic()
        result = invoke("knee", url, "--timeout", "0.5", "--duration", "1s", "--warmup", "0",
                        "--repetitions", "1", "--concurrency", "1")
    assert result.code == 2 and time.monotonic() - start < 4, result.output
    assert "sent no answer within 0.5 s" in result.stderr
    assert invoke("knee", "http://127.0.0.1:9", "--timeout", "0").code == 2   # same range check as parity


@pytest.mark.parametrize("path, requested, hint", [
    ("", "/v1/models", None),
    ("/nope", "/nope/v1/models", "without a path such as /nope"),
    # one trailing /v1 is dropped (an OpenAI base URL works as given); a second one is a path like any
    ("/v1/v1", "/v1/v1/models", "without a path such as /v1, unless a proxy serves it there)"),
])
@pytest.mark.parametrize("command", ["parity", "knee"])
def test_an_html_error_page_is_one_short_line_with_a_hint_for_a_path(command, path, requested, hint, tmp_path):
    with serve(Html404) as url:
        args = ["--record", str(tmp_path / "r.json")] if command == "parity" else ["--duration", "1s"]
        result = invoke(command, url + path, *args)
    assert result.code == 2, result.output
    (line,) = error_lines(result.stderr)
    prefix = f"error: {url}{requested}: HTTP 404 File not found: "
    assert line.startswith(prefix), line
    assert "<" not in line and "Message: File not found." in line
    body = line[len(prefix):].split(" (hint:")[0]
    assert len(body) <= client_module.ERROR_BODY_CHARS
    if hint is None:
        assert "hint" not in line
    else:
        assert hint in line


def test_error_body_summary():
    assert error_body_summary('{"object": "error", "message": "The model `x` does not exist.", "code": 404}') \
        == "The model `x` does not exist."
    assert error_body_summary('{"error": {"message": "bad\\nrequest"}}') == "bad request"
    long = error_body_summary("word \n\t " * 100)
    assert len(long) == 200 and long.endswith("…") and "\n" not in long
    assert error_body_summary("line one\nline two\x1b[31m") == "line one line two\\u001b[31m"


@pytest.mark.parametrize("body, summary", [
    ('{"detail": "Not Found"}', "Not Found"),   # FastAPI's (vLLM's) unknown route
    ('{"detail": [{"loc": ["body", "model"], "msg": "Field required", "type": "missing"}, '
     '{"loc": ["body", "x"], "msg": "second"}]}', "Field required"),   # a validation error: the first
    ('{"error": "model not loaded"}', "model not loaded"),
    ('{"error": {"message": "bad", "type": "x"}, "detail": "other"}', "bad"),
    ('{"detail": []}', '{"detail": []}'),   # nothing to read: the body as it is
])
def test_error_body_summary_reads_fastapi_and_string_errors(body, summary):
    assert error_body_summary(body) == summary


def test_error_body_summary_strips_tags_whatever_their_case():
    page = "<HTML><Head><Title>x</Title></HEAD><BODY><Script>var x=1;</SCRIPT><STYLE>p{}</style>Not &amp; found</Body></HTML>"
    assert error_body_summary(page) == "Not & found"


def test_parity_text_states_max_tokens_seed_and_temperature(tmp_path):
    fixture = tmp_path / "f.jsonl"
    fixture.write_text('{"id": "p1", "category": "agent", "prompt": "hello"}\n')
    with serve(FakeModel()) as url:
        result = invoke("parity", url, url, "--fixture", str(fixture), "--max-tokens", "12", "--seed", "7",
                        "--concurrency", "3", "--json", str(tmp_path / "r.json"))
    assert result.code == 0, result.output
    assert "each request: temperature 0 (greedy), seed 7, --max-tokens 12; --concurrency 3" in result.stdout
    settings = json.loads((tmp_path / "r.json").read_text())["settings"]
    assert settings["temperature"] == 0.0 and settings["seed"] == 7 and settings["max_tokens"] == 12


def test_divergence_shows_the_diverging_tokens_not_a_mid_token_cut():
    def out(*ids: int) -> Output:
        return Output(text="".join(f" w{i}" for i in ids), token_ids=ids)

    assert first_divergence(out(1, 2, 13, 4), out(1, 2, 19, 4)).describe() == \
        "token 2: …' w1 w2' then ' w13' vs ' w19'"
    # the documented example (docs/acceptance.md)
    text = first_divergence(Output("Lorem ipsum on the host", (1, 2, 3, 4, 5)),
                            Output("Lorem ipsum on the that", (1, 2, 3, 4, 6)))
    assert text.describe() == "token 4: …'Lorem ipsum on the' then ' host' vs ' that'"
    # one output ends where the other goes on
    assert first_divergence(out(1, 2), out(1, 2, 3)).describe() == "token 2: …' w1 w2' then '' vs ' w3'"
    # other token ids for the same text
    assert "(the same text, other token ids)" in first_divergence(Output("ab", (1, 2)), Output("ab", (3,))).describe()


def test_server_version_is_called_vllm_only_when_the_server_says_so():
    fake = {"url": "http://h:1", "models": [{"id": "m"}], "server_version": "fake-0.1"}
    assert "server version fake-0.1" in identity_lines("A", fake)[0]
    assert "vLLM" not in identity_lines("A", fake)[0]
    vllm = dict(fake, server="vLLM", server_version="0.33.0")
    assert "  vLLM 0.33.0" in identity_lines("A", vllm)[0]


def test_identity_recognises_vllm_by_its_model_cards():
    import asyncio

    from recipegen.acceptance.identity import describe_endpoint

    async def describe(url: str) -> dict:
        async with client_module.EndpointClient(url) as c:
            return await describe_endpoint(c, look_in_docker=False)

    with serve(FakeModel()) as url:
        info = asyncio.run(describe(url))
    assert "server" not in info and info["server_version"] == "fake-0.1"

    class VllmLike:   # what vLLM 0.33 answers: model cards with owned_by "vllm", /version a bare number
        base_url, model_name = "http://h:1", None

        async def models(self) -> list:
            return [{"id": "m", "object": "model", "owned_by": "vllm", "max_model_len": 4096}]

        async def get_json(self, path: str) -> dict:
            return {"version": "0.33.0"}

    info = asyncio.run(describe_endpoint(VllmLike(), look_in_docker=False))  # type: ignore[arg-type]
    assert info["server"] == "vLLM" and "  vLLM 0.33.0" in identity_lines("A", info)[0]


def window(tok_s: float, requests: int = 5) -> Window:
    return Window(index=0, start_s=0.0, duration_s=1.0, tokens=int(tok_s), tok_s=tok_s, requests=requests,
                  latency_mean_s=0.1, latency_p50_s=0.1, latency_p90_s=0.2, ttft_p50_s=0.01,
                  stream_tok_s_mean=50.0)


def level(label: str, *rates: float) -> Level:
    return Level(label=label, url="http://h:1", concurrency=8, warmup_s=0.0,
                 windows=tuple(window(r) for r in rates), requests_total=10)


def test_knee_text_explains_its_columns_and_legs_and_shows_the_spread_beside_the_change():
    result = KneeResult(levels=[level("A", 100.0, 110.0), level("B", 95.0, 105.0), level("A2", 104.0, 106.0)],
                        settings={"warmup_s": 0, "repetitions": 2, "duration_s": 1, "max_tokens": 8})
    text = knee_text(result)
    assert "req: requests that started after the warm-up and finished inside a window" in text
    assert "A2: the candidate again, after B (A B A)" in text and "B: the control (--compare)" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("  C8:"))
    # candidate pooled 100, 110, 104, 106: mean 105, spread 10/105; control 95, 105: spread 10/100
    assert line.startswith("  C8: 105.0 (spread 9.5%) vs 100.0 (spread 10.0%) tok/s: +5.0%; within the spread")
    alone = knee_text(KneeResult(levels=[level("A", 100.0)], settings={}))
    assert "leg A: the candidate (URL)" in alone and "A2" not in alone


def test_a_clear_change_is_not_called_within_the_spread():
    result = KneeResult(levels=[level("A", 200.0, 202.0), level("B", 100.0, 101.0), level("A2", 201.0, 201.0)])
    line = next(ln for ln in knee_text(result).splitlines() if ln.startswith("  C8:"))
    assert "tok/s: +100.0%; candidate drift" in line and "within the spread" not in line


def test_describe_endpoint_notes_an_unreachable_endpoint_and_raises_only_when_strict():
    import asyncio

    from recipegen.acceptance.identity import describe_endpoint

    async def describe(strict: bool) -> dict:
        async with client_module.EndpointClient("http://127.0.0.1:9") as c:
            return await describe_endpoint(c, look_in_docker=False, strict=strict)

    info = asyncio.run(describe(False))
    assert "connection refused" in info["models_error"] and "server_version" not in info
    with pytest.raises(client_module.EndpointUnreachable):
        asyncio.run(describe(True))
