"""The ``expert_residency_*`` Prometheus series (``contract.metrics``), updated by a background thread.

Every ``interval_s`` the thread reads the counter off the step path (``reader.CountReader``), takes
the map the banks hold (the boot map, or an adaptive lane's live map under its lock), accounts the
read (``figures.Tally``) and sets the series. prometheus_client writes them to its multiprocess
folder when ``PROMETHEUS_MULTIPROC_DIR`` is set (the rendered lanes), where vLLM's API server reads
them into the lane's ``/metrics`` beside its own; without it they live in ``registry`` only (tests).
Nothing here runs on the step path, and a failed update is logged and retried at the next tick.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge

from ..contract import metrics as m
from .figures import Tally, moved_experts


@dataclass(frozen=True)
class LaneFacts:
    """What the exporter knows of its lane once the banks are installed."""

    lane: str
    traffic_class: str
    layer_indices: tuple[int, ...]       # the counter's row order (model decoder-layer indices)
    num_experts: int
    row_bytes: Sequence[int]             # per layer: bytes over every rank per cold-expert pick
    predicted_cold_share: float | None = None


def cold_mask_for(rowmap: Any, layer_indices: Sequence[int]) -> np.ndarray:
    """The map's cold mask with rows in the counter's layer order."""
    mask = np.asarray(rowmap.cold_mask(), dtype=bool)
    order = [rowmap.moe_layer_indices.index(i) for i in layer_indices]
    return mask[order]


class MetricsExporter:
    def __init__(self, facts: LaneFacts, read: Callable[[], Any], *, interval_s: float, window_s: float,
                 live_map: Callable[[], Any] | None = None, boot_map: Any | None = None,
                 swaps: Callable[[], int] | None = None,
                 swap_copy_bytes: Callable[[], dict[str, int]] | None = None,
                 snapshot_time: Callable[[], float | None] | None = None,
                 registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.time) -> None:
        self.facts = facts
        self._read = read
        self.interval_s = float(interval_s)
        self._live_map = live_map
        self._swaps = swaps
        self._swap_copy_bytes = swap_copy_bytes
        self._snapshot_time = snapshot_time
        self.registry = registry if registry is not None else CollectorRegistry()
        layers = len(facts.layer_indices)
        self.tally = Tally(layers, facts.num_experts, np.asarray(facts.row_bytes, dtype=np.int64),
                           window_s, clock())
        self._boot_cold = (cold_mask_for(boot_map, facts.layer_indices) if boot_map is not None
                           else np.zeros((layers, facts.num_experts), dtype=bool))
        self._boot_hash = boot_map.content_hash() if boot_map is not None else ""
        self._metrics = {s.name: self._make(s) for s in m.ALL}
        lane = (facts.lane, facts.traffic_class)
        self._layer_labels = [(*lane, str(i)) for i in facts.layer_indices]
        self._lane_labels = lane
        self._sent = {name: np.zeros(layers, dtype=np.int64)
                      for name in (m.PICKS.name, m.COLD_PICKS.name, m.HOST_READ_BYTES.name)}
        self._sent_tokens = self._sent_decode = self._sent_swaps = 0
        self._sent_copy_bytes = {"in": 0, "out": 0}
        self._info_labels: tuple[str, ...] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.updates = 0
        self.last_error: str | None = None
        if facts.predicted_cold_share is not None:
            self._gauge(m.PREDICTED_COLD_SHARE).labels(*lane).set(facts.predicted_cold_share)

    def _make(self, series: m.Series) -> Any:
        if series.kind == "counter":
            return Counter(series.base_name, series.help, series.labels, registry=self.registry)
        # One process writes each series; "mostrecent" keeps the last value across restarts of it.
        return Gauge(series.name, series.help, series.labels, registry=self.registry,
                     multiprocess_mode="mostrecent")

    def _gauge(self, series: m.Series) -> Any:
        return self._metrics[series.name]

    # -- one update ------------------------------------------------------------------------------

    def update(self) -> None:
        """Read the counter and set every series (the thread calls this; tests call it directly)."""
        with self._lock:
            read = self._read()
            rowmap = self._live_map() if self._live_map is not None else None
            cold = (cold_mask_for(rowmap, self.facts.layer_indices) if rowmap is not None
                    else np.zeros_like(self._boot_cold))
            tally = self.tally
            tally.add(read, cold)
            for series, totals in ((m.PICKS, tally.picks), (m.COLD_PICKS, tally.cold),
                                   (m.HOST_READ_BYTES, tally.host_bytes)):
                sent = self._sent[series.name]
                counter = self._metrics[series.name]
                for row, labels in enumerate(self._layer_labels):
                    # Touch every child, so a layer without picks yet is exported at 0.
                    counter.labels(*labels).inc(float(totals[row] - sent[row]))
                sent[:] = totals
            lane = self._lane_labels
            self._metrics[m.TOKENS.name].labels(*lane).inc(float(tally.tokens - self._sent_tokens))
            self._sent_tokens = tally.tokens
            if tally.decode_tokens is not None:
                self._metrics[m.DECODE_TOKENS.name].labels(*lane).inc(
                    float(tally.decode_tokens - self._sent_decode))
                self._sent_decode = tally.decode_tokens
            if self._swaps is not None:
                swaps = int(self._swaps())
                self._metrics[m.SWAPS.name].labels(*lane).inc(float(max(0, swaps - self._sent_swaps)))
                self._sent_swaps = max(swaps, self._sent_swaps)
            if self._swap_copy_bytes is not None:
                copied = self._swap_copy_bytes()
                for direction, sent in self._sent_copy_bytes.items():
                    total = int(copied[direction])
                    self._metrics[m.SWAP_COPY_BYTES.name].labels(*lane, direction).inc(float(max(0, total - sent)))
                    self._sent_copy_bytes[direction] = max(total, sent)
            window = tally.window()
            for row, labels in enumerate(self._layer_labels):
                self._gauge(m.WINDOW_COLD_SHARE).labels(*labels).set(float(window.cold_share[row]))
                self._gauge(m.WINDOW_HOT_HIT_RATIO).labels(*labels).set(float(window.hot_hit_ratio[row]))
            self._gauge(m.LANE_WINDOW_COLD_SHARE).labels(*lane).set(window.lane_cold_share)
            self._gauge(m.WINDOW_SECONDS).labels(*lane).set(window.span_s)
            if rowmap is not None:
                self._set_map(rowmap, cold)
            self._gauge(m.COUNTS_READ_TIME).labels(*lane).set(read.time)
            snapshot = self._snapshot_time() if self._snapshot_time is not None else None
            if snapshot is not None:
                self._gauge(m.SNAPSHOT_TIME).labels(*lane).set(snapshot)
            self.updates += 1

    def _set_map(self, rowmap: Any, cold: np.ndarray) -> None:
        info = self._gauge(m.LIVE_MAP_INFO)
        labels = (*self._lane_labels, rowmap.content_hash(), self._boot_hash or rowmap.content_hash(),
                  rowmap.shape_hash())
        if labels != self._info_labels:
            if self._info_labels is not None:
                info.labels(*self._info_labels).set(0)   # multiprocess files cannot drop a series
            info.labels(*labels).set(1)
            self._info_labels = labels
        moved = moved_experts(cold, self._boot_cold)
        for row, layer_labels in enumerate(self._layer_labels):
            self._gauge(m.LIVE_MAP_MOVED).labels(*layer_labels).set(float(moved[row]))

    # -- the thread --------------------------------------------------------------------------------

    def start(self) -> MetricsExporter:
        self.update()  # every series exists (at 0) from the start
        self._thread = threading.Thread(target=self._run, name="expert-residency-metrics", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.update()
                self.last_error = None
            except Exception as exc:  # a failed read must not stop serving; the next tick retries
                self.last_error = f"{type(exc).__name__}: {exc}"
                print(f"expert_residency: metrics update failed: {self.last_error}", file=sys.stderr,
                      flush=True)
