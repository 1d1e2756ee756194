"""The metrics thread's counter read on a GPU (``metrics.reader.CountReader``): it returns while the
step's stream is still busy (it copies on a stream of its own and waits only for that copy), and
once the step's work is done it reads the counts exactly."""

from __future__ import annotations

import sys
import threading
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


def test_a_read_does_not_wait_for_the_step_stream():
    counter = _counter()
    reader = CountReader(counter)
    step = torch.cuda.current_stream()
    torch.cuda._sleep(4_000_000_000)          # a long "step" on the step's stream (seconds of cycles)
    counter.counts.add_(1)                     # queued behind it
    done: dict[str, object] = {}

    def read() -> None:
        try:
            done["read"] = reader.read()
            done["step_busy_after_read"] = not step.query()
        except BaseException as exc:   # noqa: BLE001 - reported by the assertion below
            done["error"] = repr(exc)

    assert not step.query()                   # the "step" is running
    worker = threading.Thread(target=read)
    worker.start()
    worker.join(timeout=60)
    torch.cuda.synchronize()
    assert "error" not in done, done.get("error")
    assert "read" in done, "the read blocked behind the step's stream"
    assert done["step_busy_after_read"] is True, "the read returned only after the step's stream finished"


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
