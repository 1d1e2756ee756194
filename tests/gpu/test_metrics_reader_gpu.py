"""The metrics thread's counter read on a GPU (``metrics.reader.CountReader``): it returns while the
step's stream is still busy (it copies on a stream of its own and waits only for that copy), and
once the step's work is done it reads the counts exactly."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (pinned buffers, a side stream)", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))

from expert_residency.core import ExpertCounter  # noqa: E402
from expert_residency.metrics.reader import CountReader  # noqa: E402

pytestmark = pytest.mark.gpu

LAYERS = (1, 4, 9)
EXPERTS = 16


def _counter() -> ExpertCounter:
    return ExpertCounter(LAYERS, EXPERTS, device="cuda")


SLEEP_CYCLES = 500_000_000
"""Cycles per sleep kernel (~0.25 s on the H200): a long busy step is several launches."""


def _busy_for(seconds: float) -> int:
    """Queue sleep kernels that keep the current stream busy about ``seconds`` (their rate measured
    here, after a first launch that loads the kernel); returns the launches queued."""
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(SLEEP_CYCLES)
    torch.cuda.synchronize()
    launches = max(1, round(seconds / max(time.perf_counter() - t0, 1e-6)))
    for _ in range(launches):
        torch.cuda._sleep(SLEEP_CYCLES)
    return launches


@pytest.mark.parametrize("step_stream", ["default", "side"])
def test_a_read_does_not_wait_for_the_step_stream(step_stream):
    """The step's work on the thread's default stream (legacy) or on a stream of its own."""
    counter = _counter()
    reader = CountReader(counter)
    reader.read()                              # first use of the thread's CUDA state and the copy path
    counter.counts.add_(0)                     # the add kernel's first launch loads its module,
    torch.cuda.synchronize()                   # which waited for the busy device (seen on the H200)
    step = torch.cuda.current_stream() if step_stream == "default" else torch.cuda.Stream()
    t0 = time.perf_counter()
    with torch.cuda.stream(step):
        launches = _busy_for(3.0)              # a long "step" on the step's stream (~3 s)
        busy_after_sleep = not step.query()
        counter.counts.add_(1)                 # queued behind it
    busy_after_add = not step.query()
    done: dict[str, object] = {}

    def read() -> None:
        try:
            start = time.perf_counter()
            done["read"] = reader.read()
            done["read_s"] = time.perf_counter() - start
            done["step_busy_after_read"] = not step.query()
        except BaseException as exc:   # noqa: BLE001 - reported by the assertion below
            done["error"] = repr(exc)

    worker = threading.Thread(target=read)
    worker.start()
    worker.join(timeout=60)
    torch.cuda.synchronize()
    step_s = time.perf_counter() - t0
    facts = (f"read {done.get('read_s')} s, step {step_s:.2f} s ({launches} sleeps of {SLEEP_CYCLES} cycles), "
             f"{step}, busy after the sleeps {busy_after_sleep}, after the add {busy_after_add}")
    assert busy_after_sleep and busy_after_add, f"the step's stream was idle at once: {facts}"
    assert "error" not in done, done.get("error")
    assert "read" in done, f"the read blocked behind the step's stream: {facts}"
    assert done["step_busy_after_read"] is True, f"the read returned only after the step's stream finished: {facts}"
    assert (done["read"].counts == 0).all(), facts   # the add queued behind the step is not in it yet
    assert done["read_s"] < step_s / 4, facts


def test_after_the_step_the_read_is_exact():
    counter = _counter()
    reader = CountReader(counter)
    g = torch.Generator(device="cuda").manual_seed(7)
    counts = torch.randint(0, 1_000_000, (len(LAYERS), EXPERTS), generator=g, device="cuda", dtype=torch.int64)
    counter.counts.copy_(counts)
    counter.tokens.fill_(12_345)
    counter.decode_tokens.fill_(678)
    torch.cuda.synchronize()
    read = reader.read()
    assert (read.counts == counts.cpu().numpy()).all()
    assert read.tokens == 12_345
    assert read.decode_tokens == 678
