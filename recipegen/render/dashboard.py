"""The Grafana dashboard the monitoring profile provisions, built with Grafana's own typed builder
(`grafana-foundation-sdk`, the 11.6 schema; an optional dependency: `pip install
'recipegen[monitoring]'`).

The dashboard is the same for every recipe (a `lane` variable picks the lane), so it is generated
once and committed as `recipegen/data/grafana/expert-residency.json`, which `recipegen render`
copies into each rendering without needing the builder; `tests/test_monitoring_render.py`
rebuilds it and fails when the committed file differs. Regenerate after a change here:

    python -m recipegen.render.dashboard
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from expert_residency.contract import metrics as m

from recipegen.render.monitoring import DATASOURCE_UID, LANES_JOB

DASHBOARD_FILE = Path(__file__).resolve().parent.parent / "data" / "grafana" / "expert-residency.json"
DASHBOARD_UID = "recipegen-expert-residency"
LANE = 'lane=~"$lane"'
RATE = "$__rate_interval"
HOT_HIT = "Hot-hit rate by MoE layer"
PER_LANE = ": lane $lane"
"""The title suffix of a panel repeated once per lane (the heat map: layers of different lanes,
often of different models, are not comparable rows)."""

# vLLM 0.33's own series (vllm/v1/metrics/loggers.py; tests/test_monitoring_render.py finds each
# name there): token throughput, requests, KV cache use, and the latency histograms.
VLLM_GENERATION_TOKENS = "vllm:generation_tokens_total"     # loggers.py:799 "vllm:generation_tokens"
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens_total"             # loggers.py:748 "vllm:prompt_tokens"
VLLM_RUNNING = "vllm:num_requests_running"                  # loggers.py:528
VLLM_WAITING = "vllm:num_requests_waiting"                  # loggers.py:538
VLLM_KV_USAGE = "vllm:kv_cache_usage_perc"                  # loggers.py:620
VLLM_TTFT = "vllm:time_to_first_token_seconds"              # loggers.py:931
VLLM_ITL = "vllm:inter_token_latency_seconds"               # loggers.py:941
VLLM_E2E = "vllm:e2e_request_latency_seconds"               # loggers.py:961
VLLM_SERIES = (VLLM_GENERATION_TOKENS, VLLM_PROMPT_TOKENS, VLLM_RUNNING, VLLM_WAITING, VLLM_KV_USAGE,
               VLLM_TTFT, VLLM_ITL, VLLM_E2E)


def _rate(series: m.Series | str, by: str) -> str:
    name = series.name if isinstance(series, m.Series) else series
    return f"sum by ({by}) (rate({name}{{{LANE}}}[{RATE}]))"


def panel_queries() -> dict[str, list[tuple[str, str]]]:
    """Panel title → [(PromQL, legend)]: the dashboard's every query, in one table (the tests run
    each against a real Prometheus)."""
    # "> 0" on the picks: a window without traffic has no share (not 0 / 0 = NaN).
    cold_share = f"{_rate(m.COLD_PICKS, 'lane, class')} / ({_rate(m.PICKS, 'lane, class')} > 0)"
    # By lane and layer: layer 3 of one model is not layer 3 of another (the panel is also repeated
    # per lane, so each heat map holds one lane's layers).
    hot_hit = f"1 - ({_rate(m.COLD_PICKS, 'lane, layer')} / ({_rate(m.PICKS, 'lane, layer')} > 0))"
    quantile = "histogram_quantile({q}, sum by (le, lane) (rate({name}_bucket{{{lane}}}[{rate}])))"
    return {
        "Cold share: live against the ledger's prediction": [
            (cold_share, "{{lane}} {{class}}: live"),
            (f"{m.PREDICTED_COLD_SHARE.name}{{{LANE}}}", "{{lane}} {{class}}: predicted (ledger)")],
        HOT_HIT: [(hot_hit, "{{layer}}")],
        "Host-link bytes per second (cold expert reads)": [
            (_rate(m.HOST_READ_BYTES, "lane"), "{{lane}}: cold reads"),
            (_rate(m.SWAP_COPY_BYTES, "lane, direction"), "{{lane}}: swap copies {{direction}}")],
        "Swaps per second (adaptive residency)": [(_rate(m.SWAPS, "lane"), "{{lane}}: swaps")],
        "Experts moved off the boot map (adaptive residency)": [
            (f"sum by (lane) ({m.LIVE_MAP_MOVED.name}{{{LANE}}})", "{{lane}}: experts moved")],
        "Snapshot age": [
            (f"time() - {m.SNAPSHOT_TIME.name}{{{LANE}}}", "{{lane}}: histogram dump"),
            (f"time() - {m.COUNTS_READ_TIME.name}{{{LANE}}}", "{{lane}}: counter read")],
        "Live row map": [
            (f"{m.LIVE_MAP_INFO.name}{{{LANE}}} == 1", "{{content_hash}}")],
        "Tokens per second (vLLM)": [
            (_rate(VLLM_GENERATION_TOKENS, "lane"), "{{lane}}: generated"),
            (_rate(VLLM_PROMPT_TOKENS, "lane"), "{{lane}}: prompt")],
        "Latency (vLLM)": [
            (quantile.format(q=q, name=name, lane=LANE, rate=RATE), f"{{{{lane}}}}: {label} p{int(q * 100)}")
            for name, label in ((VLLM_TTFT, "time to first token"), (VLLM_ITL, "inter-token"),
                                (VLLM_E2E, "end to end"))
            for q in (0.5, 0.99)],
        "Requests (vLLM)": [
            (f"sum by (lane) ({VLLM_RUNNING}{{{LANE}}})", "{{lane}}: running"),
            (f"sum by (lane) ({VLLM_WAITING}{{{LANE}}})", "{{lane}}: waiting")],
        "KV cache use (vLLM)": [
            (f"max by (lane) ({VLLM_KV_USAGE}{{{LANE}}})", "{{lane}}: KV cache used")],
    }


def build_dashboard() -> Any:
    """The dashboard object (grafana_foundation_sdk's typed model)."""
    from grafana_foundation_sdk.builders import dashboard, heatmap, prometheus, stat, table, timeseries
    from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

    source = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
    queries = panel_queries()

    def targets(title: str, *, instant: bool = False, as_table: bool = False) -> list[Any]:
        out = []
        for n, (expr, legend) in enumerate(queries[title]):
            q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + n))
            # A table panel shows a series' labels as columns only from a query in table format.
            q = q.format(PromQueryFormat.TABLE) if as_table else q
            out.append(q.instant() if instant else q.range())
        return out

    def series_panel(title: str, unit: str, description: str, *, width: int = 12, axis: str = "") -> Any:
        panel = (timeseries.Panel().title(title).description(description).datasource(source)
                 .targets(targets(title)).unit(unit).height(8).span(width))
        return panel.axis_label(axis) if axis else panel

    lane = (dashboard.QueryVariable("lane").label("Lane").datasource(source)
            .query(f'label_values(up{{job="{LANES_JOB}"}}, lane)').refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC).include_all(True).all_value(".+"))
    board = (dashboard.Dashboard("Expert residency").uid(DASHBOARD_UID).tags(["recipegen", "vllm"])
             .description("Per-lane expert residency (the expert_residency_* series of the runtime, "
                          "docs/metrics.md) beside vLLM's own throughput and latency.")
             .refresh("30s").time("now-1h", "now").with_variable(lane).readonly())
    ids = iter(range(1, 100))
    board = board.with_row(dashboard.Row("Residency").id(next(ids)))
    title = "Cold share: live against the ledger's prediction"
    board = board.with_panel(series_panel(
        title, "percentunit", "Share of routed picks served from pinned host memory, per lane and "
        "class, against what `recipegen check budgets` projected for the active class (none where "
        "the class's histogram is synthetic or missing). The rendered alert fires when the live share "
        f"stays more than {m.DRIFT_TOLERANCE * 100:g} percentage points above the prediction for `drift_for`.")
        .min(0).id(next(ids)))
    board = board.with_panel(series_panel(
        "Host-link bytes per second (cold expert reads)", "Bps",
        "Cold-bank expert bytes read from host memory per second, counted per cold pick over all "
        "ranks: above one token per step an upper bound of the link's traffic (docs/metrics.md). "
        "On adaptive lanes also the swaps' copies: in = host to HBM, out = HBM to host.").id(next(ids)))
    board = board.with_panel(
        heatmap.Panel().id(next(ids)).title(HOT_HIT + PER_LANE).description(
            "Per MoE layer (rows, by decoder-layer index) and time: the share of picks the hot bank "
            "(HBM) served. One heat map per lane: layers of different lanes (often different models) "
            "are not comparable.").datasource(source).targets(targets(HOT_HIT))
        .calculate(False).unit("percentunit").repeat("lane").repeat_direction("h")
        .max_per_row(2).height(8).span(24))
    board = board.with_panel(series_panel(
        "Swaps per second (adaptive residency)", "short",
        "Hot/cold swaps adaptive residency applies, per second. Empty on static lanes.",
        width=8, axis="swaps per second").min(0).id(next(ids)))
    board = board.with_panel(series_panel(
        "Experts moved off the boot map (adaptive residency)", "short",
        "How many experts the live map holds hot that the boot map holds cold, summed over the MoE "
        "layers (a count, not a rate). 0 on static lanes.", width=8, axis="experts").min(0).id(next(ids)))
    title = "Snapshot age"
    board = board.with_panel(
        stat.Panel().id(next(ids)).title(title).description(
            "Seconds since the newest histogram dump (what `recipegen status` / `drift` read) and "
            "since the counter read behind these series.").datasource(source)
        .targets(targets(title, instant=True)).unit("s").height(8).span(8))
    title = "Live row map"
    board = board.with_panel(
        table.Panel().id(next(ids)).title(title).description(
            "The row map the banks hold (content and shape hash; on adaptive lanes the boot map's "
            "hash beside it).").datasource(source).targets(targets(title, instant=True, as_table=True))
        .height(6).span(24))
    board = board.with_row(dashboard.Row("vLLM").id(next(ids)))
    board = board.with_panel(series_panel("Tokens per second (vLLM)", "short",
                                          "vLLM's generated and prompt tokens per second.",
                                          width=6, axis="tokens per second").id(next(ids)))
    board = board.with_panel(series_panel("Latency (vLLM)", "s",
                                          "vLLM's time to first token, inter-token latency and "
                                          "end-to-end latency, median and 99th percentile.",
                                          width=6).id(next(ids)))
    board = board.with_panel(series_panel("Requests (vLLM)", "short",
                                          "Requests running and waiting.", width=6,
                                          axis="requests").min(0).id(next(ids)))
    board = board.with_panel(series_panel("KV cache use (vLLM)", "percentunit",
                                          "The used share of vLLM's KV cache (vLLM exports it as a "
                                          "fraction, 0 to 1).", width=6)
                             .min(0).max(1).id(next(ids)))
    return board.build()


def dashboard_json() -> str:
    """The dashboard as the committed file holds it."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    return json.dumps(build_dashboard(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main() -> None:
    DASHBOARD_FILE.parent.mkdir(parents=True, exist_ok=True)
    DASHBOARD_FILE.write_text(dashboard_json(), encoding="utf-8")
    print(f"wrote {DASHBOARD_FILE}")


if __name__ == "__main__":
    main()
