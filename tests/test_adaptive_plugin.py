"""Adaptive residency through the vLLM plugin's entry, without vLLM (CPU, stand-in MXFP4 layers laid
out like vLLM 0.33's ``RoutedExperts``; tests/plugin_entry_support.py).

The worker runtime builds the policy from ``EXPERT_RESIDENCY_ADAPTIVE`` after re-homing and drives
it from ``WorkerRuntime.before_forward`` — the callback vLLM's ``create_forward_context`` runs
before each forward. Claims, each able to fail:

* through swap rounds the residency entry equals the unsplit entry bit for bit (``torch.equal``)
  on every step, and the experts the traffic uses become hot (by hand: routing only onto experts
  1, 2, 4, which the boot map holds cold, with one swap per layer per barrier every 2 forwards);
* a forward context without attention metadata (profiling run, warm-up) neither ticks nor runs a
  barrier;
* a forward issued between a swap's first copy and its map flip is refused by the entry;
* a bad ``EXPERT_RESIDENCY_ADAPTIVE`` refuses the boot naming the variable and the field; the
  variable is ignored outside residency mode; the dumps and ``status`` carry the live map.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent / "runtime"))

import test_vllm_plugin_mxfp4 as mx  # noqa: E402
from expert_residency.vllm_plugin.refusal import ResidencyRefused  # noqa: E402
from expert_residency.vllm_plugin.worker_runtime import set_runtime  # noqa: E402
from plugin_entry_support import plugin_runtime, step_context  # noqa: E402
from test_vllm_plugin_graphsafe import _tensors  # noqa: E402  (stand-in MXFP4 layers)

pytestmark = pytest.mark.torch

ROWS = 4
HOT = [0, 3, 5, 6, 7]          # boot map: 5 of 8 hot; the traffic below uses 1, 2, 4 (cold)
TRAFFIC = [1, 2, 4]
SPEC = "interval=2,swaps_per_layer=1,margin=0.25,evidence=0,counts_evidence=0,prior_weight=0"


@pytest.fixture(autouse=True)
def _no_runtime_left():
    yield
    set_runtime(None)


def _adaptive(monkeypatch, spec: str = SPEC, mode: str = "residency"):
    monkeypatch.setenv("EXPERT_RESIDENCY_ADAPTIVE", spec)
    runtime, layers = plugin_runtime(_tensors(), mode, top_k=mx.TOP_K, max_num_tokens=64,
                                     hot={i: HOT for i in mx.LAYERS} if mode == "residency" else None)
    runtime._start_adaptive()
    return runtime, layers


def _step(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ROWS decode tokens, each picking all three traffic experts in a seeded order."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, mx.HIDDEN, generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.tensor(TRAFFIC)[torch.randperm(3, generator=gen)] for _ in range(ROWS)])
    weights = torch.softmax(torch.randn(ROWS, mx.TOP_K, generator=gen), dim=-1)
    return x, weights, ids.to(torch.int32)


def _forward(runtime, layers, ctx, x, weights, ids, *, barrier: bool = True):
    set_runtime(runtime)
    runtime.on_forward_context(ctx)
    if barrier:
        runtime.before_forward(ctx)
    return [layers[i].forward_modular(x, weights, ids) for i in sorted(layers)]


def _hot(runtime) -> dict[int, list[int]]:
    live = runtime.policy.live_rowmap()
    return {i: sorted(live.hot[row]) for row, i in enumerate(live.moe_layer_indices)}


def test_swap_rounds_through_the_entry_equal_unsplit_and_follow_the_traffic(monkeypatch) -> None:
    res, res_layers = _adaptive(monkeypatch)
    assert res.policy is not None and res.counter is not None  # counter started for the policy
    boot = res.policy.initial_content_hash
    ref, ref_layers = plugin_runtime(_tensors(), "unsplit", top_k=mx.TOP_K, max_num_tokens=64)
    ctx = step_context(ROWS, [1] * ROWS, "cpu")
    reports = []
    for seed in range(8):
        x, weights, ids = _step(seed)
        got = _forward(res, res_layers, ctx, x, weights, ids)
        want = _forward(ref, ref_layers, ctx, x, weights, ids, barrier=False)
        for a, b in zip(got, want):
            assert torch.equal(a, b), f"step {seed}"
            assert a.abs().sum() > 0
        if res.policy.reports and (not reports or res.policy.reports[-1] is not reports[-1]):
            reports.append(res.policy.reports[-1])
    # 8 forwards at interval 2: barriers run at the starts of forwards 3, 5, 7 (a barrier made due
    # by forward 8 waits for a 9th). Each moves one expert per layer: the traffic's three experts,
    # each counted 4 picks per forward, against hot experts counted 0.
    assert res.policy.forwards == 8 and res.policy.barriers == 3
    assert [len(r.swaps) for r in reports] == [2, 2, 2]
    assert _hot(res) == {i: [1, 2, 4, 6, 7] for i in mx.LAYERS}   # strongest first, weakest id out
    status = res.status()["adaptive"]
    assert status["swaps"] == 6 and status["live_content_hash"] != boot == status["boot_content_hash"]
    assert status["shape_hash"] == res.policy.live_rowmap().shape_hash()
    # the first barrier's window: forwards 1-2, 2 layers x 4 rows x 3 picks, all on cold experts
    assert (reports[0].window_picks, reports[0].window_cold_picks) == (48, 48)
    # then one, two of the three traffic experts are hot: the served cold share falls 1 -> 2/3 -> 1/3
    assert [r.window_cold_share for r in reports] == [1.0, 32 / 48, 16 / 48]


def test_contexts_without_attention_metadata_neither_tick_nor_barrier(monkeypatch) -> None:
    res, layers = _adaptive(monkeypatch, "interval=1,swaps_per_layer=1,margin=0,evidence=0,"
                                         "counts_evidence=0,prior_weight=0")
    dummy = SimpleNamespace(attn_metadata=None, is_padding=None, batch_descriptor=None)
    for seed in range(3):
        _forward(res, layers, dummy, *_step(seed))
    assert (res.policy.forwards, res.policy.barriers) == (0, 0)
    assert int(res.counter.counts.sum()) == 0   # and the masks counted nothing


def test_a_forward_between_a_swaps_copies_and_its_flip_is_refused(monkeypatch) -> None:
    res, layers = _adaptive(monkeypatch)
    ctx = step_context(ROWS, [1] * ROWS, "cpu")
    for seed in range(2):
        _forward(res, layers, ctx, *_step(seed))
    x, weights, ids = _step(9)

    def interleaved(steps):
        kinds = [s.kind for s in steps]
        assert kinds[-1] == "map" and set(kinds[:-1]) == {"copy"}  # the copies first, flip last
        steps[0].run()
        layers[0].forward_modular(x, weights, ids)   # a forward slipping into the barrier

    with pytest.raises(RuntimeError, match="inside a swap barrier"):
        res.policy.barrier(run=interleaved)
    assert not res.policy.in_barrier


def test_bad_spec_refuses_naming_the_variable_and_field(monkeypatch) -> None:
    with pytest.raises(ResidencyRefused, match="EXPERT_RESIDENCY_ADAPTIVE.*interval"):
        _adaptive(monkeypatch, "interval=0")
    with pytest.raises(ResidencyRefused, match="unknown field 'swaps'"):
        _adaptive(monkeypatch, "swaps=3")


def test_ignored_outside_residency_mode_and_off_by_default(monkeypatch, capsys) -> None:
    runtime, _ = _adaptive(monkeypatch, "on", mode="unsplit")
    assert runtime.policy is None and "ignored in mode unsplit" in capsys.readouterr().err
    monkeypatch.delenv("EXPERT_RESIDENCY_ADAPTIVE")
    runtime, _ = plugin_runtime(_tensors(), "residency", top_k=mx.TOP_K, max_num_tokens=64,
                                hot={i: HOT for i in mx.LAYERS})
    runtime._start_adaptive()
    assert runtime.policy is None and runtime.counter is None


def test_one_shot_dump_carries_the_live_map(monkeypatch, tmp_path) -> None:
    from expert_residency.formats import load_histogram, load_rowmap

    res, layers = _adaptive(monkeypatch)
    ctx = step_context(ROWS, [1] * ROWS, "cpu")
    for seed in range(3):
        _forward(res, layers, ctx, *_step(seed))
    path = Path(res.dump(str(tmp_path)))
    live = load_histogram(path).meta["live_map"]
    assert live["swaps"] == 2 and live["barriers"] == 1
    saved = load_rowmap(path.parent / live["file"])
    assert saved.content_hash() == live["content_hash"] == res.policy.live_rowmap().content_hash()


def test_the_step_entry_drives_the_barrier_once_per_scheduled_step(monkeypatch) -> None:
    """vLLM 0.33 calls ``init_worker_extension`` with the worker; from then on every scheduler step
    passes the wrapper first, and the forward-context callback no longer drives the barrier (0.33's
    V2 runner replays FULL graphs without a forward context). Steps that schedule no tokens do not
    count."""
    from expert_residency.vllm_plugin.worker_ext import ResidencyWorkerExtension
    from expert_residency.vllm_plugin.worker_runtime import get_runtime, reset_step_entry

    class Worker:
        """What vLLM's worker does per step: the runner creates the context, then the forward."""

        def execute_model(self, scheduler_output):
            if not scheduler_output.total_num_scheduled_tokens:
                return None
            runtime = get_runtime()
            ctx = step_context(ROWS, [1] * ROWS, "cpu")
            runtime.on_forward_context(ctx)
            runtime.before_forward(ctx)        # inert: the step entry drives the barrier
            x, weights, ids = _step(self.seed)
            self.seed += 1
            return [layers[i].forward_modular(x, weights, ids) for i in sorted(layers)]

    worker = Worker()
    worker.seed = 0
    try:
        ResidencyWorkerExtension.init_worker_extension(worker)   # as vLLM's hook(self.worker)
        wrapped = worker.execute_model
        ResidencyWorkerExtension.init_worker_extension(worker)   # idempotent
        assert worker.execute_model is wrapped
        res, layers = _adaptive(monkeypatch)
        set_runtime(res)
        for _ in range(8):
            worker.execute_model(SimpleNamespace(total_num_scheduled_tokens=ROWS))
            assert worker.execute_model(SimpleNamespace(total_num_scheduled_tokens=0)) is None
        assert (res.policy.forwards, res.policy.barriers, res.policy.swaps_done) == (8, 3, 6)
        assert _hot(res) == {i: [1, 2, 4, 6, 7] for i in mx.LAYERS}
    finally:
        reset_step_entry()
