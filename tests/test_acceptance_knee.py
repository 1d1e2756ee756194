"""Knee: window statistics, and the CLI against a paced loopback server (C / delay tok/s)."""

from __future__ import annotations

import json

import pytest
from acceptance_support import FakeModel, serve
from cli_support import invoke
from expert_residency.formats import StartupReport, format_report_line

from recipegen.acceptance.client import StreamStats
from recipegen.acceptance.knee import spread, window_stats


def stream(start, end, arrivals, finish="length"):
    s = StreamStats(start=start, end=end, first_token=arrivals[0][0] if arrivals else None,
                    tokens=sum(n for _, n in arrivals), arrivals=list(arrivals), finish_reason=finish)
    return s


def test_window_counts_arrivals_inside_it_and_excludes_warmup_requests():
    streams = [
        stream(0.0, 1.5, [(0.5, 1), (1.0, 1), (1.4, 1)]),            # started in warm-up
        stream(1.1, 1.9, [(1.2, 1), (1.5, 2), (1.8, 1)]),            # fully inside
        stream(1.6, 2.5, [(1.7, 1), (2.2, 1)]),                      # finishes after the window
        stream(1.2, 1.8, [(1.3, 1)], finish=None),                   # cut off, never finished
    ]
    w = window_stats(streams, index=0, start=1.0, end=2.0, measure_start=1.0, origin=0.0)
    assert w.tokens == 1 + 1 + 1 + 2 + 1 + 1 + 1  # every arrival in [1, 2)
    assert w.tok_s == pytest.approx(8.0)
    assert w.requests == 1 and w.latency_p50_s == pytest.approx(0.8)
    assert w.ttft_p50_s == pytest.approx(0.1)
    assert w.stream_tok_s_mean == pytest.approx(4 / 0.8)


def test_spread_reports_relative_range():
    s = spread([90.0, 100.0, 110.0])
    assert s.mean == 100.0 and s.relative == pytest.approx(0.2) and s.stdev == pytest.approx(10.0)


def test_knee_measures_concurrency_scaling_with_spread_and_plot(tmp_path):
    delay = 0.01  # 100 tok/s per stream
    with serve(FakeModel(token_delay_s=delay)) as url:
        result = invoke(
            "knee", url, "--concurrency", "1,2,4", "--duration", "1s", "--warmup", "0.4s",
            "--repetitions", "2", "--max-tokens", "16", "--json", str(tmp_path / "k.json"),
            "--plot", str(tmp_path / "k.png"))
    assert result.code == 0, result.output
    data = json.loads((tmp_path / "k.json").read_text())
    by_c = {lv["concurrency"]: lv for lv in data["levels"]}
    assert set(by_c) == {1, 2, 4}
    for c, level in by_c.items():
        assert len(level["windows"]) == 2
        # paced server: C streams give C / delay tok/s, less per-request overhead
        assert 0.5 * c / delay < level["tok_s"]["mean"] <= 1.05 * c / delay
        assert level["tok_s"]["relative_spread"] < 0.35
        assert all(w["requests"] > 0 and w["latency_p50_s"] > 16 * delay * 0.9 for w in level["windows"])
    assert by_c[1]["tok_s"]["mean"] < by_c[2]["tok_s"]["mean"] < by_c[4]["tok_s"]["mean"]
    png = (tmp_path / "k.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_knee_compare_runs_candidate_control_candidate(tmp_path):
    with serve(FakeModel(token_delay_s=0.005)) as fast, serve(FakeModel(token_delay_s=0.01)) as slow:
        result = invoke(
            "knee", fast, "--compare", slow, "--concurrency", "2", "--duration", "0.8s", "--warmup", "0.3s",
            "--repetitions", "1", "--max-tokens", "8", "--json", str(tmp_path / "c.json"))
    assert result.code == 0, result.output
    data = json.loads((tmp_path / "c.json").read_text())
    assert [lv["label"] for lv in data["levels"]] == ["A", "B", "A2"]
    (comparison,) = data["comparisons"]
    assert comparison["change"] > 0.4  # twice the per-stream speed, less overhead
    assert "candidate (A, A2) vs control (B)" in result.output


def test_knee_records_the_lanes_startup_report_and_hashes(tmp_path):
    report = StartupReport(rank=0, mode="residency", vllm_version="0.32.0+cpu", runtime_version="0.1.0",
                           hot_bytes=100, cold_bytes=50, hot_counts="6x2", cold_counts="2x2",
                           content_hash="c" * 64, shape_hash="s" * 64, lane="agent", traffic_class="agent")
    log = tmp_path / "lane.log"
    log.write_text("INFO starting\n(Worker pid=1) " + format_report_line(report) + "\nINFO ready\n")
    with serve(FakeModel(token_delay_s=0.002)) as url:
        result = invoke(
            "knee", url, "--concurrency", "1", "--duration", "0.3s", "--warmup", "0", "--repetitions", "1",
            "--max-tokens", "4", "--lane-log", str(log), "--json", str(tmp_path / "k.json"))
    assert result.code == 0, result.output
    endpoint = json.loads((tmp_path / "k.json").read_text())["endpoints"]["A"]
    assert endpoint["content_hashes"] == ["c" * 64] and endpoint["shape_hashes"] == ["s" * 64]
    assert endpoint["lane"] == "agent" and endpoint["server_version"] == "fake-0.1"
    assert "lane agent class agent mode residency" in result.output


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "1,x"], "--concurrency"),
    (["--concurrency", "0"], "positive"),
    (["--duration", "soon"], "--duration"),
])
def test_knee_rejects_bad_options_clearly(args, message):
    result = invoke("knee", "http://127.0.0.1:9", *args)
    assert result.code == 2 and message in result.output and "Traceback" not in result.output


def test_lane_container_is_matched_by_published_or_listening_port():
    from recipegen.acceptance.identity import _serves_port

    published = {"NetworkSettings": {"Ports": {"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "30006"}]}}}
    assert _serves_port(published, 30006) and not _serves_port(published, 8000)
    host_net = {"HostConfig": {"NetworkMode": "host"}, "Config": {"Cmd": ["model", "--port", "30007"]}}
    assert _serves_port(host_net, 30007) and not _serves_port(host_net, 30006)


def test_streamed_tokens_are_counted_from_ids_then_usage_then_chunks():
    from recipegen.acceptance.client import _chunk_tokens

    assert _chunk_tokens({"choices": [{"text": "ab", "token_ids": [1, 2]}]}, 0, chat=False) == (2, 2)
    # no ids: vLLM's continuous usage statistics give the running total
    assert _chunk_tokens({"choices": [{"text": "ab"}], "usage": {"completion_tokens": 5}}, 3, chat=False) == (2, 5)
    # nothing but text: one token per non-empty chunk
    assert _chunk_tokens({"choices": [{"delta": {"content": "x"}}]}, 4, chat=True) == (1, 5)
    assert _chunk_tokens({"choices": [{"delta": {}}]}, 4, chat=True) == (0, 4)
    # the final usage-only chunk adds nothing already counted
    assert _chunk_tokens({"choices": [], "usage": {"completion_tokens": 5}}, 5, chat=False) == (0, 5)
