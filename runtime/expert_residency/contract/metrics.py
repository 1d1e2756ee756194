"""The Prometheus series the runtime exports: one definition for the exporter in the worker
(``expert_residency.metrics.exporter``), recipegen's rendered dashboard and alert rule, and
docs/metrics.md (``tests/test_metrics_docs.py`` holds the docs to this table).

Every series carries ``lane`` and ``class`` (the rendered ``EXPERT_RESIDENCY_LANE`` / ``_CLASS``);
per-layer series add ``layer``, the MoE layer's decoder-layer index in the model (as the row map
numbers it). Counters are cumulative since the engine started; gauges are set at each read of the
counter (every ``EXPERT_RESIDENCY_METRICS_INTERVAL_S``), not at scrape time, so
``expert_residency_counts_read_timestamp_seconds`` says how fresh they are.

The series reach the lane's own ``/metrics`` (vLLM's API server) through prometheus_client's
multiprocess folder, ``PROMETHEUS_MULTIPROC_DIR``: counters are summed over the processes that
wrote them, gauges take the most recent value (``mostrecent``), and only the lane's first
tensor-parallel rank writes (every rank counts the same picks).
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "expert_residency_"
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client's multiprocess folder (vLLM's too: ``vllm/v1/metrics/prometheus.py``); it must
be empty when the engine starts, so the renderer mounts a fresh tmpfs there."""

DEFAULT_INTERVAL_S = 15.0
DEFAULT_WINDOW_S = 300.0

LANE, CLASS, LAYER = "lane", "class", "layer"
LANE_LABELS = (LANE, CLASS)
LAYER_LABELS = (LANE, CLASS, LAYER)
MAP_LABELS = (LANE, CLASS, "content_hash", "boot_content_hash", "shape_hash")


@dataclass(frozen=True)
class Series:
    name: str
    kind: str          # "counter" | "gauge"
    labels: tuple[str, ...]
    help: str

    @property
    def base_name(self) -> str:
        """The name prometheus_client takes for a counter (it appends ``_total`` itself)."""
        return self.name[:-len("_total")] if self.kind == "counter" else self.name


PICKS = Series(
    "expert_residency_picks_total", "counter", LAYER_LABELS,
    "Routed picks of real tokens counted in this MoE layer (each token picks top-k experts; padding "
    "and warm-up rows are not counted).")
COLD_PICKS = Series(
    "expert_residency_cold_picks_total", "counter", LAYER_LABELS,
    "Picks whose expert sat in the cold bank (pinned host memory) of this MoE layer; on adaptive "
    "lanes the picks between two reads are classed by the map live at the later read.")
HOST_READ_BYTES = Series(
    "expert_residency_host_read_bytes_total", "counter", LAYER_LABELS,
    "Bytes of cold expert weights read from host memory, one expert row per cold pick over all "
    "ranks of the lane; cold picks of one expert by several tokens of a step share one read in the "
    "kernels, so above one token per step this bounds the host-link traffic from above.")
TOKENS = Series(
    "expert_residency_tokens_total", "counter", LANE_LABELS,
    "Real tokens routed through the MoE layers (prefill and decode).")
DECODE_TOKENS = Series(
    "expert_residency_decode_tokens_total", "counter", LANE_LABELS,
    "Decode tokens among them (requests with exactly one new token in the step); absent where the "
    "attention metadata does not tell.")
SWAPS = Series(
    "expert_residency_swaps_total", "counter", LANE_LABELS,
    "Hot/cold swaps adaptive residency applied (one expert in, one out each); absent on static "
    "lanes.")
SWAP_COPY_BYTES = Series(
    "expert_residency_swap_copy_bytes_total", "counter", (*LANE_LABELS, "direction"),
    "Bytes of the copies adaptive residency issued to apply its swaps, by direction: `in` host "
    "memory to HBM (an expert promoted), `out` HBM to host memory (a demoted expert copied back; "
    "none where the host keeps a copy of every hot expert). They share the host link with the cold "
    "reads; absent on static lanes.")
WINDOW_COLD_SHARE = Series(
    "expert_residency_window_cold_share", "gauge", LAYER_LABELS,
    "Cold picks / picks of this MoE layer over the last window (expert_residency_window_seconds); "
    "NaN when the layer saw no picks in it.")
WINDOW_HOT_HIT_RATIO = Series(
    "expert_residency_window_hot_hit_ratio", "gauge", LAYER_LABELS,
    "Picks served from the hot bank (HBM) / picks of this MoE layer over the last window; NaN "
    "when the layer saw no picks in it.")
LANE_WINDOW_COLD_SHARE = Series(
    "expert_residency_lane_window_cold_share", "gauge", LANE_LABELS,
    "Cold picks / picks over every MoE layer of the lane over the last window; NaN without picks.")
WINDOW_SECONDS = Series(
    "expert_residency_window_seconds", "gauge", LANE_LABELS,
    "The span the window gauges cover: EXPERT_RESIDENCY_METRICS_WINDOW_S once the engine has run "
    "that long, the time since its first read before.")
PREDICTED_COLD_SHARE = Series(
    "expert_residency_predicted_cold_share", "gauge", LANE_LABELS,
    "The cold share the recipe's ledger projects for the active class (its row map on its "
    "histogram, as `recipegen check budgets` prints it); absent when the class has no histogram.")
LIVE_MAP_INFO = Series(
    "expert_residency_live_map_info", "gauge", MAP_LABELS,
    "1 for the row map the banks hold now (its content_hash and shape_hash, and the boot map's "
    "content_hash); a map an adaptive lane swapped away from stays at 0.")
LIVE_MAP_MOVED = Series(
    "expert_residency_live_map_moved_experts", "gauge", LAYER_LABELS,
    "Experts the live map holds hot in this MoE layer that the boot map holds cold (0 on static "
    "lanes).")
COUNTS_READ_TIME = Series(
    "expert_residency_counts_read_timestamp_seconds", "gauge", LANE_LABELS,
    "Unix time of the counter read the other series come from; its age is "
    "time() - this.")
SNAPSHOT_TIME = Series(
    "expert_residency_snapshot_timestamp_seconds", "gauge", LANE_LABELS,
    "Unix time of the newest histogram snapshot written to the dump folder (what `recipegen "
    "status` and `drift` read); absent before the first.")

ALL: tuple[Series, ...] = (PICKS, COLD_PICKS, HOST_READ_BYTES, TOKENS, DECODE_TOKENS, SWAPS,
                           SWAP_COPY_BYTES, WINDOW_COLD_SHARE, WINDOW_HOT_HIT_RATIO, LANE_WINDOW_COLD_SHARE,
                           WINDOW_SECONDS, PREDICTED_COLD_SHARE, LIVE_MAP_INFO, LIVE_MAP_MOVED,
                           COUNTS_READ_TIME, SNAPSHOT_TIME)
BY_NAME = {s.name: s for s in ALL}

DRIFT_TOLERANCE = 0.02
"""Absolute rise of the lane's cold share over the predicted one before the rendered alert fires
(the same default as `recipegen drift`, ``recipegen.ops.drift.DEFAULT_TOLERANCE``)."""


def lane_cold_share_expr(window: str) -> str:
    """PromQL: the lane's cold share over ``window`` (e.g. ``"5m"``), per lane and class; no sample
    where the window saw no routed pick (not NaN: an idle lane has no share)."""
    return (f"sum by (lane, class) (rate({COLD_PICKS.name}[{window}])) / "
            f"(sum by (lane, class) (rate({PICKS.name}[{window}])) > 0)")


def drift_expr(window: str, hold: str, tolerance: float = DRIFT_TOLERANCE) -> str:
    """PromQL: the lanes whose cold share over ``window`` exceeds the ledger's prediction by more
    than ``tolerance`` (the rendered alert's expression). Each lane keeps its last share with
    traffic for up to ``hold`` while it is idle: an agent lane that pauses for minutes between
    bursts would otherwise have no sample in each pause and restart the alert's ``for:`` clock
    every time, so that it never fired however far its share drifted."""
    drift = f"({lane_cold_share_expr(window)}) - on (lane, class) {PREDICTED_COLD_SHARE.name}"
    return f"last_over_time(({drift})[{hold}:]) > {tolerance!r}"


STALE_READS = 5
"""Counter reads a lane may miss (its read interval each) before the rendered alert calls its series
stale: the reader runs off the step path and a busy step can delay one read, not five."""


def stale_counts_expr(interval_s: int) -> str:
    """PromQL: the lanes whose last counter read is older than ``STALE_READS`` read intervals (the
    rendered stale-series alert's expression; its value is the read's age in seconds)."""
    return f"time() - {COUNTS_READ_TIME.name} > {STALE_READS * interval_s}"
