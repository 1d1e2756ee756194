"""knee's text report prints the per-request decode rate (`tok/s/req`) beside ttft, with its legend
line, as docs/acceptance.md says; --json keeps its per-window `stream_tok_s_mean` and gains nothing."""

from __future__ import annotations

import json
from pathlib import Path

from acceptance_support import FakeModel, serve
from cli_support import invoke

from recipegen.acceptance.knee import KneeResult, Level, Window
from recipegen.acceptance.report import knee_json, knee_text

HEADER = ("leg  conc tok/s mean      min      max  spread p50 lat ms p90 lat ms  ttft ms tok/s/req   req")
LEGEND = ("tok/s/req: the per-request decode rate, each request's output tokens ÷ its latency (time to "
          "first token included), averaged over the requests counted in req")


def window(rate: float | None, requests: int) -> Window:
    return Window(index=0, start_s=0.0, duration_s=1.0, tokens=100, tok_s=100.0, requests=requests,
                  latency_mean_s=0.1, latency_p50_s=0.1, latency_p90_s=0.2, ttft_p50_s=0.01,
                  stream_tok_s_mean=rate)


def result(*windows: Window) -> KneeResult:
    level = Level(label="A", url="http://h:1", concurrency=8, warmup_s=0.0, windows=windows, requests_total=10)
    return KneeResult(levels=[level], settings={"warmup_s": 0, "repetitions": len(windows), "duration_s": 1,
                                                "max_tokens": 8})


def test_the_column_is_the_request_weighted_mean_of_the_windows() -> None:
    # 3 requests at 50 tok/s and 1 at 90: every request's rate, averaged, is 60.0
    text = knee_text(result(window(50.0, 3), window(90.0, 1)))
    lines = text.splitlines()
    assert HEADER in lines
    row = lines[lines.index(HEADER) + 1]
    assert row == "A       8      100.0    100.0    100.0    0.0%        100        200       10      60.0     4"
    assert LEGEND in lines


def test_no_rate_prints_a_dash() -> None:
    lines = knee_text(result(window(None, 0))).splitlines()
    assert lines[lines.index(HEADER) + 1].split()[-2:] == ["-", "0"]


def test_json_is_unchanged() -> None:
    data = knee_json(result(window(50.0, 3), window(90.0, 1)))
    level = data["levels"][0]
    assert [w["stream_tok_s_mean"] for w in level["windows"]] == [50.0, 90.0]
    assert set(level) == {"label", "url", "concurrency", "warmup_s", "windows", "requests_total", "tok_s"}
    assert "decode_rate" not in json.dumps(data)


def test_knee_against_the_fake_server_prints_the_rate(tmp_path: Path) -> None:
    out = tmp_path / "k.json"
    with serve(FakeModel(token_delay_s=0.005)) as url:
        run = invoke("knee", url, "--concurrency", "2", "--duration", "0.6s", "--warmup", "0.2s",
                     "--repetitions", "1", "--max-tokens", "8", "--json", str(out))
    assert run.code == 0, run.output
    lines = run.stdout.splitlines()
    assert HEADER in lines and LEGEND in lines
    cells = lines[lines.index(HEADER) + 1].split()
    rate = float(cells[-2])
    # the text column is the JSON's per-window rate (one window here), rounded as printed
    assert rate == round(json.loads(out.read_text())["levels"][0]["windows"][0]["stream_tok_s_mean"], 1)
    assert rate > 0
