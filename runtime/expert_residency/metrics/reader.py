"""Reading the usage counter off the step path, for the metrics thread.

The counts live on the device (``core.ExpertCounter``: the step's kernels add to them, in-kernel on
the fused CUDA layer). A read here never waits for the step's stream: on a GPU the copy is issued
on a stream of its own (PyTorch's pool streams do not synchronise with the legacy default stream)
into pinned host buffers allocated once, and only this thread waits for that copy's event. Kernels
still in flight when the copy runs may be missing from the read; the next read has them. On the
CPU a read is a plain copy (counts are int64: never torn). The step thread is never blocked, and
nothing here is called from a forward.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .figures import CounterRead


class CountReader:
    def __init__(self, counter: Any, *, clock: Callable[[], float] = time.time) -> None:
        self.counter = counter
        self._clock = clock
        device = counter.counts.device
        self._cuda = device.type == "cuda"
        sources = (counter.counts, counter.tokens, counter.decode_tokens)
        if self._cuda:
            self._stream = torch.cuda.Stream(device=device)
            self._event = torch.cuda.Event()
            self._host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in sources)
        self._sources = sources

    def read(self) -> CounterRead:
        when = self._clock()
        if self._cuda:
            with torch.cuda.stream(self._stream):
                for host, source in zip(self._host, self._sources):
                    host.copy_(source, non_blocking=True)
                self._event.record(self._stream)
            self._event.synchronize()   # this thread only
            counts, tokens, decode = (h.numpy().copy() for h in self._host)
        else:
            counts, tokens, decode = (t.detach().numpy().copy() for t in self._sources)
        # Every layer sees every token; a read during a step can find later layers one step behind.
        total = int(tokens.max()) if tokens.size else 0
        known = bool(getattr(self.counter, "_decode_known", True))
        return CounterRead(when, np.asarray(counts, dtype=np.int64), total,
                           int(decode.max()) if known and decode.size else None)
