"""The metrics exporter on real runtime parts (a CPU ExpertCounter, real row maps, an AdaptivePolicy
over re-homed banks) and the real prometheus_client, in-process and in its multiprocess mode (the
files vLLM's API server reads): every figure against hand arithmetic."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
prometheus_client = pytest.importorskip("prometheus_client")

from expert_residency.contract import env  # noqa: E402
from expert_residency.contract import metrics as m  # noqa: E402
from expert_residency.core import ExpertCounter, device_allocator, host_allocator, rehome_layer  # noqa: E402
from expert_residency.core.adaptive import AdaptiveConfig, AdaptivePolicy, Swap, spare_rows_needed  # noqa: E402
from expert_residency.formats import RowMap  # noqa: E402
from expert_residency.metrics.config import metrics_from_env  # noqa: E402
from expert_residency.metrics.exporter import LaneFacts, MetricsExporter  # noqa: E402
from expert_residency.metrics.figures import CounterRead, Tally  # noqa: E402
from expert_residency.metrics.reader import CountReader  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from test_core_fixtures import float_layer  # noqa: E402

pytestmark = pytest.mark.torch

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
LAYERS = (3, 7)          # decoder-layer indices, not 0..L-1
EXPERTS = 8
HOT = ([0, 1, 2, 3, 4], [2, 3, 4, 5, 6])
COLD = tuple([e for e in range(EXPERTS) if e not in h] for h in HOT)


def rowmap() -> RowMap:
    return RowMap(LAYERS, EXPERTS, [list(h) for h in HOT], [list(c) for c in COLD], {"source": "test"})


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def samples(registry) -> dict[tuple[str, tuple], float]:
    """name and sorted labels → value, parsed from the text exposition (what Prometheus reads)."""
    text = prometheus_client.generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def layer_key(name: str, layer: int) -> tuple[str, tuple]:
    return (name, (("class", "mixed"), ("lane", "tiny"), ("layer", str(layer))))


def lane_key(name: str) -> tuple[str, tuple]:
    return (name, (("class", "mixed"), ("lane", "tiny")))


def copy_key(direction: str) -> tuple[str, tuple]:
    return (m.SWAP_COPY_BYTES.name, (("class", "mixed"), ("direction", direction), ("lane", "tiny")))


def exporter_for(counter, clock, *, row_bytes=(100, 300), window_s=60.0, predicted=None, **kw):
    facts = LaneFacts("tiny", "mixed", LAYERS, EXPERTS, row_bytes, predicted)
    return MetricsExporter(facts, CountReader(counter, clock=clock).read, interval_s=1.0,
                           window_s=window_s, clock=clock, **kw)


def test_counts_cold_picks_bytes_and_tokens_by_hand():
    counter = ExpertCounter(LAYERS, EXPERTS, top_k=2)
    clock = Clock()
    boot = rowmap()
    ex = exporter_for(counter, clock, live_map=lambda: boot, boot_map=boot, predicted=0.25)
    # layer 3: picks 0,5 | 6,1 | 7,7(second 7 is the same expert twice: counted twice)
    counter.count(3, torch.tensor([[0, 5], [6, 1], [7, 7]]))
    # layer 7: picks 7,5 | 1,2 | 0,3 ; -1 (unrouted) counts for no expert
    counter.count(7, torch.tensor([[7, 5], [1, 2], [0, -1]]))
    clock.t += 10
    ex.update()
    got = samples(ex.registry)
    # layer 3 cold = {5,6,7}: picks 5,6,7,7 → 4 of 6; layer 7 cold = {0,1,7}: picks 7,1,0 → 3 of 5
    assert got[layer_key(m.PICKS.name, 3)] == 6 and got[layer_key(m.PICKS.name, 7)] == 5
    assert got[layer_key(m.COLD_PICKS.name, 3)] == 4 and got[layer_key(m.COLD_PICKS.name, 7)] == 3
    assert got[layer_key(m.HOST_READ_BYTES.name, 3)] == 4 * 100
    assert got[layer_key(m.HOST_READ_BYTES.name, 7)] == 3 * 300
    assert got[lane_key(m.TOKENS.name)] == 3
    assert got[layer_key(m.WINDOW_COLD_SHARE.name, 3)] == 4 / 6
    assert got[layer_key(m.WINDOW_HOT_HIT_RATIO.name, 7)] == 1 - 3 / 5
    assert got[lane_key(m.LANE_WINDOW_COLD_SHARE.name)] == 7 / 11
    assert got[lane_key(m.WINDOW_SECONDS.name)] == 10
    assert got[lane_key(m.PREDICTED_COLD_SHARE.name)] == 0.25
    assert got[lane_key(m.COUNTS_READ_TIME.name)] == clock.t
    info = [k for k in got if k[0] == m.LIVE_MAP_INFO.name]
    assert len(info) == 1 and got[info[0]] == 1
    assert dict(info[0][1])["content_hash"] == boot.content_hash() == dict(info[0][1])["boot_content_hash"]
    assert dict(info[0][1])["shape_hash"] == boot.shape_hash()
    # Cumulative: a second step adds to the counters; the window keeps both reads.
    counter.count(3, torch.tensor([[0, 1]]))     # 2 hot picks
    clock.t += 10
    ex.update()
    got = samples(ex.registry)
    assert got[layer_key(m.PICKS.name, 3)] == 8 and got[layer_key(m.COLD_PICKS.name, 3)] == 4
    assert got[layer_key(m.WINDOW_COLD_SHARE.name, 3)] == 4 / 8
    assert got[lane_key(m.TOKENS.name)] == 4


def test_padding_rows_are_not_counted():
    counter = ExpertCounter(LAYERS, EXPERTS, top_k=2)
    clock = Clock()
    ex = exporter_for(counter, clock, live_map=rowmap, boot_map=rowmap())
    counter.count(3, torch.tensor([[5, 6], [5, 6]]), token_mask=torch.tensor([True, False]))
    ex.update()
    got = samples(ex.registry)
    assert got[layer_key(m.PICKS.name, 3)] == 2 and got[layer_key(m.COLD_PICKS.name, 3)] == 2
    assert got[lane_key(m.TOKENS.name)] == 1


def test_window_drops_reads_older_than_the_window():
    tally = Tally(1, 2, np.array([1]), window_s=30, start_time=0)
    cold = np.array([[False, True]])
    for t, counts in ((10, [1, 1]), (20, [2, 1]), (40, [4, 1]), (60, [4, 5])):
        tally.add(CounterRead(t, np.array([counts]), 0, None), cold)
    # At t=60 the base is the newest read at least 30 s old: t=20 (picks 3, cold 1).
    window = tally.window()
    assert window.span_s == 40
    assert window.cold_share[0] == (5 - 1) / (9 - 3)
    assert window.lane_cold_share == (5 - 1) / (9 - 3)
    assert (tally.picks[0], tally.cold[0], tally.host_bytes[0]) == (9, 5, 5)


def test_an_empty_window_is_nan_and_a_counter_reset_keeps_the_series_growing():
    tally = Tally(1, 2, np.array([7]), window_s=5, start_time=0)
    cold = np.array([[True, False]])
    tally.add(CounterRead(1, np.array([[3, 1]]), 2, 2), cold)
    tally.add(CounterRead(10, np.array([[3, 1]]), 2, 2), cold)
    assert math.isnan(tally.window().cold_share[0]) and math.isnan(tally.window().lane_cold_share)
    tally.add(CounterRead(11, np.array([[1, 0]]), 1, 1), cold)   # reset, then one new cold pick
    assert (tally.picks[0], tally.cold[0], tally.host_bytes[0], tally.tokens, tally.decode_tokens) == (5, 4, 28, 3, 3)


def test_adaptive_swaps_live_map_and_moved_experts():
    # An adaptive lane's layers carry spare rows (the plugin re-homes them with spare_rows_needed's
    # figures); the swaps land in them, so the spare rows must not show in the live map's figures.
    config = AdaptiveConfig(interval=1000)
    hot_spare, cold_spare = spare_rows_needed(config, 0)
    assert hot_spare > 0 and cold_spare > 0
    layers = {}
    for row, index in enumerate(LAYERS):
        layers[index] = rehome_layer(float_layer(20 + row, torch.bfloat16, experts=EXPERTS), HOT[row], COLD[row],
                                     layer_index=index, hot_alloc=device_allocator("cpu"),
                                     cold_alloc=host_allocator(), hot_spare=hot_spare, cold_spare=cold_spare)
    counter = ExpertCounter(LAYERS, EXPERTS, top_k=2)
    policy = AdaptivePolicy(counter, layers, config)
    boot = rowmap()
    assert policy.initial_content_hash == boot.content_hash()
    clock = Clock()
    ex = exporter_for(counter, clock, live_map=policy.live_rowmap, boot_map=boot,
                      swaps=lambda: policy.swaps_done, swap_copy_bytes=lambda: dict(policy.copied_bytes))
    counter.count(3, torch.tensor([[7, 0]]))
    ex.update()
    assert samples(ex.registry)[copy_key("in")] == 0 and samples(ex.registry)[copy_key("out")] == 0
    # Two swaps in layer 7: cold 0 and 1 in, hot 5 and 6 out.
    policy.apply([Swap(7, 0, 5), Swap(7, 1, 6)])
    live = policy.live_rowmap()
    assert live.content_hash() != boot.content_hash()
    counter.count(7, torch.tensor([[0, 1], [5, 6]]))   # now 0, 1 hot; 5, 6 cold
    clock.t += 5
    ex.update()
    got = samples(ex.registry)
    assert got[lane_key(m.SWAPS.name)] == 2
    # Each swap copies the promoted expert's row in and, with no host copy of the hot experts, the
    # demoted one's row out: one row = every expert tensor's row, summed here from the shapes.
    row = sum(math.prod(t.shape[1:]) * t.element_size()
              for t in float_layer(0, torch.bfloat16, experts=EXPERTS).values())
    assert got[copy_key("in")] == 2 * row and got[copy_key("out")] == 2 * row
    assert got[layer_key(m.LIVE_MAP_MOVED.name, 7)] == 2 and got[layer_key(m.LIVE_MAP_MOVED.name, 3)] == 0
    assert got[layer_key(m.COLD_PICKS.name, 7)] == 2     # 5 and 6, classed by the live map
    infos = {dict(k[1])["content_hash"]: v for k, v in got.items() if k[0] == m.LIVE_MAP_INFO.name}
    assert infos == {boot.content_hash(): 0, live.content_hash(): 1}
    assert all(dict(k[1])["boot_content_hash"] == boot.content_hash()
               for k in got if k[0] == m.LIVE_MAP_INFO.name)


def test_the_thread_updates_on_its_own():
    counter = ExpertCounter(LAYERS, EXPERTS, top_k=2)
    facts = LaneFacts("tiny", "mixed", LAYERS, EXPERTS, (1, 1))
    ex = MetricsExporter(facts, CountReader(counter).read, interval_s=0.05, window_s=1.0).start()
    try:
        counter.count(3, torch.tensor([[1, 2]]))
        deadline = __import__("time").monotonic() + 10
        while samples(ex.registry).get(layer_key(m.PICKS.name, 3)) != 2:
            assert __import__("time").monotonic() < deadline, "the thread never exported the picks"
            __import__("time").sleep(0.05)
    finally:
        ex.stop()
    assert ex.updates >= 2 and ex.last_error is None


def test_multiprocess_files_reach_another_processs_collector(tmp_path: Path):
    """How the series reach the lane's /metrics: the exporter in one process (PROMETHEUS_MULTIPROC_DIR
    set before prometheus_client is imported, as in vLLM's worker), the API server's
    MultiProcessCollector in another — here this test process, reading the same folder."""
    folder = tmp_path / "multiproc"
    folder.mkdir()
    script = textwrap.dedent(f"""
        import torch
        from expert_residency.core import ExpertCounter
        from expert_residency.formats import RowMap
        from expert_residency.metrics.exporter import LaneFacts, MetricsExporter
        from expert_residency.metrics.reader import CountReader
        counter = ExpertCounter({LAYERS!r}, {EXPERTS}, top_k=2)
        boot = RowMap({LAYERS!r}, {EXPERTS}, {[list(h) for h in HOT]!r}, {[list(c) for c in COLD]!r}, {{}})
        ex = MetricsExporter(LaneFacts("tiny", "mixed", {LAYERS!r}, {EXPERTS}, (100, 300), 0.5),
                             CountReader(counter).read, interval_s=1, window_s=60,
                             live_map=lambda: boot, boot_map=boot)
        counter.count(3, torch.tensor([[5, 0], [6, 7]]))
        ex.update()
        counter.count(7, torch.tensor([[0, 2]]))
        ex.update()
    """)
    environ = {**os.environ, m.MULTIPROC_DIR_ENV: str(folder), "PYTHONPATH": str(RUNTIME)}
    proc = subprocess.run([sys.executable, "-c", script], env=environ, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name.split("_")[0] for p in folder.iterdir()) == ["counter", "gauge"]
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(folder))
    got = samples(registry)
    assert got[layer_key(m.PICKS.name, 3)] == 4 and got[layer_key(m.COLD_PICKS.name, 3)] == 3
    assert got[layer_key(m.PICKS.name, 7)] == 2 and got[layer_key(m.COLD_PICKS.name, 7)] == 1
    assert got[layer_key(m.HOST_READ_BYTES.name, 7)] == 300
    assert got[lane_key(m.PREDICTED_COLD_SHARE.name)] == 0.5
    assert got[lane_key(m.LANE_WINDOW_COLD_SHARE.name)] == 4 / 6


def test_settings_from_the_environment(tmp_path: Path):
    folder = str(tmp_path)
    assert metrics_from_env({}) is None and metrics_from_env({env.METRICS: "off"}) is None
    config = metrics_from_env({env.METRICS: "on", m.MULTIPROC_DIR_ENV: folder,
                               env.METRICS_INTERVAL_S: "2", env.METRICS_WINDOW_S: "60",
                               env.PREDICTED_COLD_SHARE: "0.0155"})
    assert (config.interval_s, config.window_s, config.predicted_cold_share, config.multiproc_dir) == (
        2.0, 60.0, 0.0155, folder)
    bad = [({env.METRICS: "maybe"}, env.METRICS),
           ({env.METRICS: "on"}, m.MULTIPROC_DIR_ENV),
           ({env.METRICS: "on", m.MULTIPROC_DIR_ENV: folder + "/missing"}, "is not a folder"),
           ({env.METRICS: "on", m.MULTIPROC_DIR_ENV: folder, env.METRICS_INTERVAL_S: "0"}, env.METRICS_INTERVAL_S),
           ({env.METRICS: "on", m.MULTIPROC_DIR_ENV: folder, env.METRICS_INTERVAL_S: "nan"}, env.METRICS_INTERVAL_S),
           ({env.METRICS: "on", m.MULTIPROC_DIR_ENV: folder, env.METRICS_INTERVAL_S: "30",
             env.METRICS_WINDOW_S: "10"}, env.METRICS_WINDOW_S),
           ({env.METRICS: "on", m.MULTIPROC_DIR_ENV: folder, env.PREDICTED_COLD_SHARE: "1.5"},
            env.PREDICTED_COLD_SHARE),
           ({env.METRICS: "on", m.MULTIPROC_DIR_ENV: folder, env.PREDICTED_COLD_SHARE: "nan"},
            env.PREDICTED_COLD_SHARE)]
    for environ, named in bad:
        with pytest.raises(ValueError, match=named):
            metrics_from_env(environ)


def test_the_plugin_refuses_bad_metrics_settings_naming_the_variable(tmp_path: Path):
    """`load_settings` runs in vLLM's API server at register(): a refusal there stops `vllm serve`
    before any engine process starts (docs/plugin.md)."""
    from expert_residency.vllm_plugin.settings import SettingsError, load_settings

    base = {env.MODE: "count", env.METRICS: "on"}
    with pytest.raises(SettingsError, match=m.MULTIPROC_DIR_ENV):
        load_settings(base)
    settings = load_settings({**base, m.MULTIPROC_DIR_ENV: str(tmp_path)})
    assert settings.metrics is not None and settings.metrics.multiproc_dir == str(tmp_path)
    assert load_settings({env.MODE: "count"}).metrics is None


def test_host_bytes_per_cold_pick_come_from_the_row_shape_on_every_rank() -> None:
    """Each layer's bytes per cold pick: one expert row (every tensor's row, summed by hand from
    the shapes), × TP for a tensor-parallel lane, × 1 under expert parallelism (one rank reads the
    whole row) — also for a layer whose cold bank holds no expert on this rank (under expert
    parallelism its cold experts may sit on other ranks), and 0 for a layer not re-homed."""
    from types import SimpleNamespace

    from expert_residency.vllm_plugin.metrics_hook import row_bytes

    tensors = float_layer(0, torch.bfloat16)
    by_hand = sum(math.prod(t.shape[1:]) * t.element_size() for t in tensors.values())
    everything = list(range(next(iter(tensors.values())).shape[0]))

    def module(cold: list[int], expert_parallel: bool) -> SimpleNamespace:
        hot = [e for e in everything if e not in cold]
        resident = rehome_layer({n: t.clone() for n, t in tensors.items()}, hot, cold, layer_index=0,
                                hot_alloc=host_allocator(), cold_alloc=host_allocator())
        return SimpleNamespace(_er_resident=resident, _er_expert_map=[0] if expert_parallel else None)

    layers = {0: module([5, 6], False), 1: module([], True), 2: module([7], True), 3: SimpleNamespace()}
    assert row_bytes(layers, tp=4) == [4 * by_hand, by_hand, by_hand, 0]
