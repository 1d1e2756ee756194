"""The metrics' arithmetic over successive counter reads: pure numpy, no clock, no I/O.

The counter (``core.ExpertCounter``) holds cumulative picks per (MoE layer, expert). Each read's
increase over the previous read is classed by the cold mask of the map the banks hold at that read
(on a static lane the boot map, so the cumulative cold picks equal the counts summed over the map's
cold experts exactly; on an adaptive lane a swap between two reads classes that interval's picks by
the later map). Host bytes are cold picks times the layer's bytes per cold expert row.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CounterRead:
    """One read of the counter: unix ``time``, ``counts`` int64 ``[layers, experts]``, tokens."""

    time: float
    counts: np.ndarray
    tokens: int
    decode_tokens: int | None


@dataclass(frozen=True)
class Window:
    span_s: float
    cold_share: np.ndarray      # float [layers], NaN where the layer had no picks in the window
    hot_hit_ratio: np.ndarray   # 1 - cold_share
    lane_cold_share: float      # NaN without picks


class Tally:
    """Cumulative per-layer picks, cold picks and host bytes, plus the window over recent reads."""

    def __init__(self, layers: int, experts: int, row_bytes: np.ndarray, window_s: float,
                 start_time: float) -> None:
        self.row_bytes = np.asarray(row_bytes, dtype=np.int64).reshape(layers)
        self.window_s = float(window_s)
        self.last = np.zeros((layers, experts), dtype=np.int64)
        self.picks = np.zeros(layers, dtype=np.int64)
        self.cold = np.zeros(layers, dtype=np.int64)
        self.host_bytes = np.zeros(layers, dtype=np.int64)
        self.tokens = 0
        self.decode_tokens: int | None = None
        self._last_tokens, self._last_decode = 0, None
        self.time = float(start_time)
        self._history: deque[tuple[float, np.ndarray, np.ndarray]] = deque(
            [(self.time, self.picks.copy(), self.cold.copy())])

    def add(self, read: CounterRead, cold_mask: np.ndarray) -> None:
        """Account one read; ``cold_mask`` bool ``[layers, experts]`` of the map live at the read."""
        counts = np.asarray(read.counts, dtype=np.int64)
        if counts.shape != self.last.shape:
            raise ValueError(f"counter read of shape {counts.shape}, expected {self.last.shape}")
        # After a reset of the counter (the worker extension's) every count is new since the reset;
        # the exported series keep growing.
        reset = not (counts >= self.last).all() or read.tokens < self._last_tokens
        delta = counts if reset else counts - self.last
        cold_delta = (delta * np.asarray(cold_mask, dtype=bool)).sum(axis=1)
        self.picks += delta.sum(axis=1)
        self.cold += cold_delta
        self.host_bytes += cold_delta * self.row_bytes
        self.tokens += int(read.tokens) - (0 if reset else self._last_tokens)
        if read.decode_tokens is not None:
            before = 0 if reset or self._last_decode is None else self._last_decode
            self.decode_tokens = (self.decode_tokens or 0) + int(read.decode_tokens) - before
        self._last_tokens, self._last_decode = int(read.tokens), read.decode_tokens
        self.last = counts.copy()
        self.time = float(read.time)
        self._history.append((self.time, self.picks.copy(), self.cold.copy()))
        # Keep the newest read at least window_s old as the base, and everything after it.
        while len(self._history) > 1 and self._history[1][0] <= self.time - self.window_s:
            self._history.popleft()

    def window(self) -> Window:
        base_time, base_picks, base_cold = self._history[0]
        picks = (self.picks - base_picks).astype(np.float64)
        cold = (self.cold - base_cold).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(picks > 0, cold / np.where(picks > 0, picks, 1.0), np.nan)
        total = float(picks.sum())
        lane = float(cold.sum()) / total if total > 0 else float("nan")
        return Window(self.time - base_time, share, 1.0 - share, lane)


def moved_experts(live_cold: np.ndarray, boot_cold: np.ndarray) -> np.ndarray:
    """Per layer: experts hot in the live map that the boot map holds cold (int ``[layers]``)."""
    return (np.asarray(boot_cold, dtype=bool) & ~np.asarray(live_cold, dtype=bool)).sum(axis=1)
