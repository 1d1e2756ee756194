"""Count-only counter (exact against a recount), histogram export, and the dump folder writer."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import (  # noqa: E402
    DumpConfig,
    ExpertCounter,
    HistogramDumper,
    build_unsplit_layer,
    device_allocator,
    dump_file_name,
    host_allocator,
    parse_dump_name,
    rehome_layer,
    residency_forward,
)
from expert_residency.core.reference import swiglu_per_pick  # noqa: E402
from expert_residency.formats import load_histogram  # noqa: E402
from test_core_fixtures import (  # noqa: E402
    EXPERTS,
    clone_tensors,
    float_layer,
    hidden_states,
    random_partition,
    routing,
    single_torch_thread,  # noqa: E402,F401  (autouse)
)

pytestmark = pytest.mark.torch

LAYERS = (0, 3, 4)


def _steps(n_steps: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    for step in range(n_steps):
        tokens = int(torch.randint(1, 40, (1,), generator=g))
        per_layer = {layer: routing(seed * 1000 + step * 10 + layer, tokens)[0] for layer in LAYERS}
        mask = torch.rand(tokens, generator=g) > 0.2
        decode = torch.rand(tokens, generator=g) > 0.5
        yield per_layer, mask, decode


def test_counts_equal_a_recount():
    counter = ExpertCounter(LAYERS, EXPERTS, top_k=4)
    recount = np.zeros((len(LAYERS), EXPERTS), dtype=np.int64)
    tokens = decode_tokens = 0
    for per_layer, mask, decode in _steps(12):
        for row, layer in enumerate(LAYERS):
            counter.count(layer, per_layer[layer], token_mask=mask, decode_mask=decode)
            kept = per_layer[layer][mask].reshape(-1).numpy()
            recount[row] += np.bincount(kept, minlength=EXPERTS)
        tokens += int(mask.sum())
        decode_tokens += int((mask & decode).sum())
    counts, total, decode_total = counter.snapshot()
    assert np.array_equal(counts, recount)
    assert (total, decode_total) == (tokens, decode_tokens)
    assert counts.sum() == tokens * 4 * len(LAYERS)


def test_counts_without_masks_and_reset():
    counter = ExpertCounter((7,), 5)
    counter.count(7, torch.tensor([[0, 1], [1, 4]], dtype=torch.int32))
    counter.count(7, torch.tensor([[4, 1]], dtype=torch.int64))
    counts, tokens, decode = counter.snapshot()
    assert counts.tolist() == [[1, 3, 0, 0, 2]] and tokens == 3 and decode is None
    counter.reset()
    assert counter.snapshot()[0].sum() == 0
    with pytest.raises(ValueError, match="MoE layer 8 is not counted"):
        counter.count(8, torch.tensor([[0]]))


def test_counter_alongside_residency_counts_exactly_and_changes_nothing():
    tensors = float_layer(4, torch.bfloat16)
    hot, cold = random_partition(3, EXPERTS, 9)
    layer = rehome_layer(clone_tensors(tensors), hot, cold, layer_index=3,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    reference = build_unsplit_layer(tensors, layer_index=3)
    counter = ExpertCounter(LAYERS, EXPERTS)
    fn = swiglu_per_pick()
    recount = np.zeros(EXPERTS, dtype=np.int64)
    for seed in range(4):
        x = hidden_states(seed, 10, torch.bfloat16)
        ids, weights = routing(seed, 10, hot_ids=hot, cold_ids=cold)
        mask = torch.arange(10) < 8  # two padded tokens
        counted = residency_forward(layer, x, weights, ids, fn, counter=counter, token_mask=mask)
        assert torch.equal(counted, residency_forward(reference, x, weights, ids, fn))
        recount += np.bincount(ids[:8].reshape(-1).numpy(), minlength=EXPERTS)
    counts, tokens, _ = counter.snapshot()
    assert np.array_equal(counts[LAYERS.index(3)], recount) and tokens == 32
    assert counts[LAYERS.index(0)].sum() == 0


def test_histogram_round_trip(tmp_path):
    from expert_residency.formats import save_histogram
    counter = ExpertCounter(LAYERS, EXPERTS, top_k=4)
    for per_layer, mask, decode in _steps(5, seed=2):
        for layer in LAYERS:
            counter.count(layer, per_layer[layer], token_mask=mask, decode_mask=decode)
    h = counter.to_histogram(source="unit test", model_revision="rev1", meta={"lane": "agent"})
    save_histogram(h, tmp_path / "x.hist")
    loaded = load_histogram(tmp_path / "x.hist")
    assert np.array_equal(loaded.counts, counter.snapshot()[0])
    assert loaded.moe_layer_indices == LAYERS and loaded.tokens == h.tokens and loaded.top_k == 4
    assert loaded.decode_tokens + loaded.prefill_tokens == loaded.tokens
    assert loaded.meta["lane"] == "agent"


# ---- dump folder -------------------------------------------------------------------------

def _config(tmp_path: Path, interval: float = 0.0, **env: str) -> DumpConfig:
    environ = {"EXPERT_RESIDENCY_DUMP_DIR": str(tmp_path / "dumps"),
               "EXPERT_RESIDENCY_DUMP_INTERVAL_S": str(interval),
               "EXPERT_RESIDENCY_LANE": "agent", "EXPERT_RESIDENCY_CLASS": "prose",
               "EXPERT_RESIDENCY_MODE": "residency", **env}
    config = DumpConfig.from_env(environ)
    assert config is not None
    return config


def test_dump_config_from_env(tmp_path):
    assert DumpConfig.from_env({}) is None
    config = _config(tmp_path, 2.5)
    assert (config.folder, config.interval_s, config.lane, config.traffic_class, config.mode) == \
        (tmp_path / "dumps", 2.5, "agent", "prose", "residency")
    defaults = DumpConfig.from_env({"EXPERT_RESIDENCY_DUMP_DIR": "/x"})
    assert (defaults.interval_s, defaults.lane, defaults.traffic_class, defaults.mode) == \
        (60.0, "lane", "none", "count-only")
    with pytest.raises(ValueError, match="EXPERT_RESIDENCY_DUMP_INTERVAL_S='soon'"):
        _config(tmp_path, EXPERT_RESIDENCY_DUMP_INTERVAL_S="soon")
    assert _config(tmp_path, EXPERT_RESIDENCY_MODE="count").mode == "count-only"
    with pytest.raises(ValueError, match="EXPERT_RESIDENCY_MODE='fast'"):
        _config(tmp_path, EXPERT_RESIDENCY_MODE="fast")
    with pytest.raises(ValueError, match="EXPERT_RESIDENCY_LANE='a__b'"):
        _config(tmp_path, EXPERT_RESIDENCY_LANE="a__b")


def test_dump_names_round_trip():
    when = datetime(2026, 11, 29, 10, 36, 52, 123456, tzinfo=timezone.utc)
    name = dump_file_name("lane-a_1", "agent", "count-only", when, 7)
    assert name == "lane-a_1__agent__count-only__20261129T103652.123456Z__000007.hist"
    parsed = parse_dump_name(name)
    assert (parsed.lane, parsed.traffic_class, parsed.mode, parsed.time, parsed.seq) == \
        ("lane-a_1", "agent", "count-only", when, 7)
    assert parse_dump_name(".tmp-" + name) is None and parse_dump_name("notes.txt") is None


def _dumps(folder: Path) -> list[Path]:
    return sorted(folder.iterdir())


def test_dumper_interval_signal_and_shutdown(tmp_path):
    counter = ExpertCounter(LAYERS, EXPERTS)
    counter.count(0, torch.tensor([[1, 2]]))
    dumper = HistogramDumper(counter, _config(tmp_path, 0.2), source="test lane", model_revision="r")
    previous = signal.getsignal(signal.SIGUSR1)
    dumper.start()
    assert signal.getsignal(signal.SIGUSR1) == dumper._on_signal
    try:
        deadline = time.monotonic() + 10
        while len(dumper.written) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(dumper.written) >= 2
        counter.count(0, torch.tensor([[3, 3]]))
        before = len(dumper.written)
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not any(load_histogram(p).meta["reason"] == "signal" for p in list(dumper.written))\
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(dumper.written) > before
    finally:
        dumper.stop()
    dumper.stop()  # idempotent
    files = _dumps(tmp_path / "dumps")
    assert files == sorted(dumper.written)  # nothing else (no temp files) in the folder
    reasons = [load_histogram(p).meta["reason"] for p in files]
    assert "interval" in reasons and "signal" in reasons and reasons[-1] == "shutdown"
    assert reasons.count("shutdown") == 1
    last = load_histogram(files[-1])
    assert last.counts[0].tolist()[:4] == [0, 1, 1, 2]  # cumulative counts
    assert last.source == "test lane" and last.model_revision == "r"
    parsed = [parse_dump_name(p.name) for p in files]
    assert all(p is not None and (p.lane, p.traffic_class, p.mode) == ("agent", "prose", "residency")
               for p in parsed)
    assert [p.seq for p in parsed] == list(range(1, len(files) + 1))
    assert signal.getsignal(signal.SIGUSR1) == previous  # handler restored at stop


def test_dumper_without_interval_writes_only_on_demand(tmp_path):
    counter = ExpertCounter((1,), 4)
    dumper = HistogramDumper(counter, _config(tmp_path, 0)).start(install_signal_handler=False)
    time.sleep(0.3)
    assert dumper.written == []
    path = dumper.dump_now()
    dumper.stop()
    assert [load_histogram(p).meta["reason"] for p in _dumps(tmp_path / "dumps")] == ["manual", "shutdown"]
    assert path.parent == tmp_path / "dumps"


def test_dumper_shutdown_snapshot_at_interpreter_exit(tmp_path):
    """A process that never calls stop() still leaves its shutdown snapshot (atexit)."""
    import subprocess
    import sys
    code = ("import torch\n"
            "from expert_residency.core import ExpertCounter, HistogramDumper, DumpConfig\n"
            "c = ExpertCounter((0,), 3); c.count(0, torch.tensor([[2, 1]]))\n"
            "HistogramDumper(c, DumpConfig.from_env()).start()\n")
    env = dict(os.environ, EXPERT_RESIDENCY_DUMP_DIR=str(tmp_path / "d"), EXPERT_RESIDENCY_DUMP_INTERVAL_S="0",
               EXPERT_RESIDENCY_MODE="count-only")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    files = _dumps(tmp_path / "d")
    assert len(files) == 1
    h = load_histogram(files[0])
    assert h.meta["reason"] == "shutdown" and h.counts.tolist() == [[0, 1, 1]] and h.tokens == 1


def test_dump_names_import_without_torch():
    import subprocess
    import sys
    code = ("import sys; sys.modules['torch'] = None\n"
            "from expert_residency.core.dump import parse_dump_name, DumpConfig\n"
            "print(parse_dump_name('a__b__residency__20261129T103652.000001Z__000001.hist').lane)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "a"


def test_snapshot_mid_step_reports_the_leading_layer_tokens():
    """A dump taken between two layers of one step (dump thread vs engine) must not fail."""
    counter = ExpertCounter((0, 1), 4)
    counter.count(0, torch.tensor([[0, 1], [2, 3]]))
    counter.count(1, torch.tensor([[0, 1], [2, 3]]))
    counter.count(0, torch.tensor([[1, 2]]))  # layer 1 of this step not counted yet
    counts, tokens, _ = counter.snapshot()
    assert tokens == 3 and counts.sum(axis=1).tolist() == [6, 4]
