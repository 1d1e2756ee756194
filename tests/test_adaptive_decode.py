"""Decode-only ranking (``rank_picks: decode``): the counter's second count, per row and per step,
by hand; the policy ranking the decode picks where prefill picks point elsewhere; the plugin
counting them through the step masks on the per-pick path and around a fused layer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent / "runtime"))

import test_vllm_plugin_mxfp4 as mx  # noqa: E402
from expert_residency.core import ExpertCounter  # noqa: E402
from expert_residency.core.adaptive import AdaptiveConfig, AdaptivePolicy  # noqa: E402
from expert_residency.vllm_plugin.worker_runtime import set_runtime  # noqa: E402
from plugin_entry_support import plugin_runtime, step_context  # noqa: E402
from test_vllm_plugin_graphsafe import _tensors  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _no_runtime_left():
    yield
    set_runtime(None)


def test_counter_counts_decode_rows_by_hand():
    counter = ExpertCounter((0,), 8, top_k=2)
    counter.enable_decode_counts()
    ids = torch.tensor([[1, 2], [1, 3], [4, 5], [6, -1]], dtype=torch.int32)
    valid = torch.tensor([True, True, True, False])       # row 3 is padding
    decode = torch.tensor([False, True, True, True])      # rows 1, 2 decode (3 is padding anyway)
    counter.count(0, ids, token_mask=valid, decode_rows=decode)
    assert counter.counts[0].tolist() == [0, 2, 1, 1, 1, 1, 0, 0]
    assert counter.decode_counts[0].tolist() == [0, 1, 0, 1, 1, 1, 0, 0]
    counter.reset()
    assert not counter.decode_counts.any()


def test_counter_per_step_adds_only_decode_only_steps():
    counter = ExpertCounter((0, 1), 4, top_k=1)
    counter.enable_decode_counts()
    for flag, picks in ((1, [0, 1]), (0, [2, 2]), (1, [3, 3])):
        counter.open_step()
        for layer, e in zip((0, 1), picks):   # "the kernels count in place"
            counter.counts[layer, e] += 1
        counter.close_step(torch.tensor([flag]))
    assert counter.counts.tolist() == [[1, 0, 1, 1], [0, 1, 1, 1]]
    assert counter.decode_counts.tolist() == [[1, 0, 0, 1], [0, 1, 0, 1]]   # the mixed step left out


def _engine(rank: str):
    from test_adaptive_policy import LAYERS, Engine

    engine = Engine(AdaptiveConfig(interval=1, swaps_per_layer=1, decay=0.5, margin=0.0, evidence=0.0,
                                   counts_evidence=0.0, rank_picks=rank))
    return engine, LAYERS


@pytest.mark.parametrize("rank", ["all", "decode"])
def test_the_policy_ranks_the_picks_it_is_told_to(rank):
    """A long prompt picks cold expert A 12 times; 3 decode tokens pick cold expert B: counting all
    picks promotes A, counting decode picks promotes B."""
    engine, layers = _engine(rank)
    cold, hot = engine.split[3].cold_experts, engine.split[3].hot_experts
    a, b = cold[0], cold[1]
    prompt = torch.tensor([[a] + hot[:3]] * 12, dtype=torch.int32)
    decode = torch.tensor([[b] + hot[3:6]] * 3, dtype=torch.int32)
    ids = torch.cat([prompt, decode])
    rows = torch.tensor([False] * 12 + [True] * 3)
    engine.counter.count(3, ids, decode_rows=rows)
    report = engine.policy.barrier()
    assert [s.promote for s in report.swaps] == ([a] if rank == "all" else [b])
    assert report.window_picks == (15 if rank == "all" else 3) * 4
    assert engine.full_check()


def _runtime(monkeypatch, spec: str):
    monkeypatch.setenv("EXPERT_RESIDENCY_ADAPTIVE", spec)
    runtime, layers = plugin_runtime(_tensors(), "residency", top_k=mx.TOP_K, max_num_tokens=64,
                                     hot={i: [0, 3, 5, 6, 7] for i in mx.LAYERS})
    runtime._start_adaptive()
    set_runtime(runtime)
    return runtime, layers


def _step(runtime, layers, lengths, rows, seed):
    ctx = step_context(rows, lengths, "cpu")
    runtime.on_forward_context(ctx)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, mx.HIDDEN, generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(8, generator=gen)[:mx.TOP_K] for _ in range(rows)]).to(torch.int32)
    w = torch.softmax(torch.randn(rows, mx.TOP_K, generator=gen), dim=-1)
    for i in sorted(layers):
        layers[i].forward_modular(x, w, ids)
    return ids


SPEC = "interval=64,swaps_per_layer=1,rank_picks=decode,prior_weight=0"


def test_plugin_counts_decode_rows_on_the_per_pick_path(monkeypatch):
    runtime, layers = _runtime(monkeypatch, SPEC)
    assert not runtime.fused and runtime.counter.decode_counts is not None
    # a 3-token prompt chunk, two decode tokens, a 0-length request, padding
    ids = _step(runtime, layers, [3, 1, 1, 0], 7, seed=1)
    want = torch.zeros(8, dtype=torch.int64)
    for row in (3, 4):
        for e in ids[row].tolist():
            want[e] += 1
    for row in range(len(mx.LAYERS)):
        assert torch.equal(runtime.counter.decode_counts[row], want)
    assert int(runtime.counter.counts[0].sum()) == 5 * mx.TOP_K


def test_plugin_counts_decode_only_steps_around_a_fused_layer(monkeypatch):
    """A stand-in for the fused GPU layer (it counts every real pick in place, as the kernels do):
    the per-step hook adds a decode-only step's picks and none of a step with a prefill row."""
    runtime, layers = _runtime(monkeypatch, SPEC)

    class CountingFused:
        def forward(self, layer, x, w, ids, *, counter=None, token_mask=None):
            if counter is not None:
                counter.count(layer.layer_index, ids, token_mask=token_mask)
            return torch.zeros_like(x)

    runtime.fused = {i: CountingFused() for i in layers}
    mixed = _step(runtime, layers, [2, 1], 4, seed=2)
    assert not runtime.counter.decode_counts.any() and int(runtime.counter.counts[0].sum()) == 3 * mx.TOP_K
    decode = _step(runtime, layers, [1, 1], 4, seed=3)
    want = torch.zeros(8, dtype=torch.int64)
    for row in (0, 1):
        for e in decode[row].tolist():
            want[e] += 1
    for row in range(len(mx.LAYERS)):
        assert torch.equal(runtime.counter.decode_counts[row], want)
    assert mixed.shape == decode.shape


def test_the_decode_count_exists_only_where_the_ranking_asks_for_it(monkeypatch):
    runtime, _ = _runtime(monkeypatch, "interval=64,swaps_per_layer=1")
    assert runtime.counter.decode_counts is None and runtime.policy.config.rank_picks == "all"
    policy = AdaptivePolicy(runtime.counter, dict(runtime.state.layers),
                            AdaptiveConfig(interval=64, swaps_per_layer=1, rank_picks="decode"))
    assert runtime.counter.decode_counts is not None and policy._counts() is runtime.counter.decode_counts


def test_start_up_report_counts_experts_and_names_the_spare_rows(monkeypatch):
    """The report's hot / cold bytes and counts are the experts' (what the ledger's figures and
    `recipegen verify` compare); the spare rows' bytes come apart, one row per spare row."""
    runtime, _ = _runtime(monkeypatch, "interval=64,swaps_per_layer=1,spare_rows=2")
    runtime._emit_report()
    report = runtime.report
    layer = next(iter(runtime.state.layers.values()))
    row = layer.bank_bytes().hot // len(layer.hot_ids)
    layers = len(runtime.state.layers)
    assert report.hot_counts_list() == [5] * layers and report.cold_counts_list() == [3] * layers
    assert report.hot_bytes == 5 * row * layers and report.cold_bytes == 3 * row * layers
    assert report.extra["adaptive_spare_hbm_bytes"] == report.extra["adaptive_spare_host_bytes"] == 2 * row * layers
