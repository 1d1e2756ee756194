"""The recipe's `monitoring`: the lanes' metrics settings, the `monitoring` compose profile
(Prometheus, Grafana, the dashboard) read back by the real Compose v2 binary, Prometheus' files
checked by Debian's promtool and loaded by a real Prometheus, the dashboard rebuilt with Grafana's
typed builder, vLLM 0.33's metric names found in its source, the Kubernetes scrape annotations, and
bad `monitoring` fields refused naming file, line and field."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from cli_support import invoke
from compose_support import needs_compose
from expert_residency.contract import env as runtime_env
from expert_residency.contract import metrics as m
from expert_residency.formats import load_histogram, load_rowmap, save_histogram
from prometheus_support import PROMTOOL, SKIP_REASON, PrometheusServer, prometheus_available, promtool_alert_test

from recipegen.k8s.render import render_k8s
from recipegen.load.recipe import load_recipe
from recipegen.render import dashboard as dash
from recipegen.render import monitoring as mon
from recipegen.render.compose_validate import compose_config_json

REPO = Path(__file__).resolve().parent.parent
REFERENCE = "dsv41-flash-gb300"
PP2 = "dsv41-flash-gb300x2-pp2"
VLLM033 = REPO / ".cache" / "vllm-0.33.0" / "vllm"
needs_prometheus = pytest.mark.skipif(not prometheus_available(), reason=SKIP_REASON)


def hand_cold_share(rowmap_path: Path, histogram_path: Path) -> float:
    """The map's cold experts' picks over all picks, summed here from the two files."""
    rowmap, hist = load_rowmap(rowmap_path), load_histogram(histogram_path)
    cold = sum(int(hist.counts[row][e]) for row, experts in enumerate(rowmap.cold) for e in experts)
    return cold / int(hist.counts.sum())


def measured_histogram(project: Path, committed: str) -> str:
    """A copy of a committed histogram (all of them are synthetic) under recipes/ of the scratch
    project, the same counts without the `synthetic` mark, as `recipegen profile` would write a
    measured one; its path relative to recipes/."""
    source = load_histogram(project / "recipes" / committed)
    assert source.meta.get("synthetic") is True, committed
    copy = committed.replace(".hist", "-measured.hist")
    save_histogram(dataclasses.replace(source, meta={k: v for k, v in source.meta.items() if k != "synthetic"}),
                   project / "recipes" / copy)
    return copy


# ------------------------------------------------------------------ compose

@needs_compose
def test_reference_rendering_carries_the_monitoring_profile(project: Path) -> None:
    result = invoke("render", REFERENCE, "--validate")
    assert result.code == 0, result.output
    folder = project / "compose" / REFERENCE
    model = compose_config_json(folder / "compose.yaml")
    services = model["services"]
    lane = services["lane-agent"]
    env = lane["environment"]
    assert env[runtime_env.METRICS] == "on"
    assert env[runtime_env.METRICS_INTERVAL_S] == "15" and env[runtime_env.METRICS_WINDOW_S] == "300"
    assert env[m.MULTIPROC_DIR_ENV] == mon.MULTIPROC_TARGET
    assert lane["tmpfs"] == [mon.MULTIPROC_TARGET]
    # The reference's histograms are synthetic (check budgets says so): no prediction is exported,
    # so the drift alert has no baseline.
    recipes = project / "recipes"
    want = hand_cold_share(recipes / "maps/dsv41-flash/agent.rowmap", recipes / "profiles/dsv41-flash/agent.hist")
    result = invoke("check", "budgets", REFERENCE)
    assert f"agent (active) on the active map: cold share {want:.2%}, synthetic histogram" in result.output
    assert runtime_env.PREDICTED_COLD_SHARE not in env
    # The profile boot stays without metrics (count-only, its own folder of dumps).
    assert runtime_env.METRICS not in services["lane-agent-profile"]["environment"]
    assert "tmpfs" not in services["lane-agent-profile"]
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert prometheus["profiles"] == grafana["profiles"] == ["monitoring"]
    assert prometheus["image"] == mon.PROMETHEUS_IMAGE and re.fullmatch(r"prom/prometheus:v\d+\.\d+\.\d+", prometheus["image"])
    assert grafana["image"] == mon.GRAFANA_IMAGE and re.fullmatch(r"grafana/grafana:\d+\.\d+\.\d+", grafana["image"])
    assert [(p["host_ip"], p["published"], p["target"]) for p in prometheus["ports"]] == [("127.0.0.1", "9090", 9090)]
    assert [(p["host_ip"], p["published"], p["target"]) for p in grafana["ports"]] == [("127.0.0.1", "3000", 3000)]
    mounts = {v["target"]: v for v in prometheus["volumes"]}
    assert Path(mounts["/etc/prometheus/prometheus.yml"]["source"]) == folder / mon.PROMETHEUS_CONFIG
    assert mounts["/prometheus"]["source"] == mon.PROMETHEUS_VOLUME and mon.PROMETHEUS_VOLUME in model["volumes"]
    mounts = {v["target"]: v for v in grafana["volumes"]}
    assert all(v["read_only"] for v in mounts.values())
    assert Path(mounts["/var/lib/grafana/dashboards/expert-residency.json"]["source"]) == folder / mon.GRAFANA_DASHBOARD
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_started"
    # Prometheus scrapes the lane's service by name, at its port; the data source points at it.
    config = yaml.safe_load((folder / mon.PROMETHEUS_CONFIG).read_text())
    (job,) = config["scrape_configs"]
    assert job["job_name"] == mon.LANES_JOB and job["metrics_path"] == "/metrics"
    # (the reference's lane has no compose profile: it is always on, and its lane alerts apply)
    assert job["static_configs"] == [{"targets": ["lane-agent:30006"], "labels": {"lane": "agent", "always_on": "true"}}]
    sources = yaml.safe_load((folder / mon.GRAFANA_DATASOURCES).read_text())["datasources"]
    assert sources[0]["uid"] == mon.DATASOURCE_UID and sources[0]["url"] == "http://prometheus:9090"
    assert (folder / mon.GRAFANA_DASHBOARD).read_bytes() == dash.DASHBOARD_FILE.read_bytes()


@needs_compose
def test_a_recipe_value_cannot_reach_the_monitoring_files_as_structure(project: Path) -> None:
    """A lane name and port are the only recipe values in prometheus.yml, both checked by the
    schema; `$` in what is written to compose is Compose's literal dollar."""
    text = (project / "recipes" / f"{REFERENCE}.yaml").read_text()
    text = text.replace("  window: 5m\n", "  window: 5m\n  bind_address: 0.0.0.0\n")
    (project / "recipes" / f"{REFERENCE}.yaml").write_text(text)
    result = invoke("render", REFERENCE, "--validate")
    assert result.code == 0, result.output
    services = compose_config_json(project / "compose" / REFERENCE / "compose.yaml")["services"]
    assert services["grafana"]["ports"][0]["host_ip"] == "0.0.0.0"
    from recipegen.render.compose import Service, hashed_service, service_text

    block = service_text(hashed_service(Service("x", {"environment": {"A": "a$b"}})))
    assert 'A: "a$$b"' in block


def test_monitoring_changes_only_what_it_adds(project: Path) -> None:
    """Without `monitoring` the lane renders exactly as before (no env, no tmpfs, no profile)."""
    path = project / "recipes" / f"{REFERENCE}.yaml"
    text = path.read_text()
    start = text.index("# The lane exports its residency")
    path.write_text(text[:start] + text[text.index("lanes:\n", start):])
    result = invoke("render", REFERENCE)
    assert result.code == 0, result.output
    compose = (project / "compose" / REFERENCE / "compose.yaml").read_text()
    assert "EXPERT_RESIDENCY_METRICS" not in compose and "tmpfs" not in compose
    assert "prometheus" not in compose and not (project / "compose" / REFERENCE / "monitoring").exists()


@pytest.mark.parametrize("edit, field", [
    ("  window: 5m\n  prometheus_port: 30006\n", "monitoring.prometheus_port"),
    ("  window: 5m\n  grafana_port: 9090\n", "monitoring.grafana_port"),
    ("  window: 1m\n  scrape_interval: 45s\n", "monitoring.window"),
    ("  window: 5m\n  bind_address: 0.0.0.0:80\n", "monitoring.bind_address"),
    ("  window: 5m\n  retention: 15\n", "monitoring.retention"),
    ("  window: 5m\n  dashboards: yes\n", "monitoring.dashboards"),
])
def test_bad_monitoring_fields_are_refused_with_file_line_and_field(project: Path, edit: str, field: str) -> None:
    path = project / "recipes" / f"{REFERENCE}.yaml"
    text = path.read_text().replace("  scrape_interval: 15s\n", "").replace("  window: 5m\n", edit)
    path.write_text(text)
    result = invoke("check", "recipe", REFERENCE)
    assert result.code == 2, result.output
    assert f"{REFERENCE}.yaml:" in result.output and field in result.output, result.output
    assert "Traceback" not in result.output


# ------------------------------------------------------------------ Prometheus' files

@needs_prometheus
def test_promtool_and_a_real_prometheus_accept_the_rendered_files(project: Path, tmp_path: Path) -> None:
    result = invoke("render", REFERENCE)
    assert result.code == 0, result.output
    folder = project / "compose" / REFERENCE / "monitoring"
    check = subprocess.run([PROMTOOL, "check", "rules", str(folder / "rules.yml")], capture_output=True, text=True)
    assert check.returncode == 0 and "SUCCESS: 4 rules found" in check.stdout, check.stdout + check.stderr
    config = yaml.safe_load((folder / "prometheus.yml").read_text())
    # The container's paths, mapped to the rendered files; everything else as rendered.
    config["rule_files"] = [str(folder / "rules.yml")]
    config["global"]["evaluation_interval"] = "1s"   # evaluated at once (rendered: the scrape interval)
    from vllm_support.server import free_port

    server = PrometheusServer(tmp_path / "prometheus", free_port())
    server.start(config)
    try:
        deadline = time.monotonic() + 30
        while not server.targets() and time.monotonic() < deadline:
            time.sleep(0.5)
        (target,) = server.targets()
        assert target["labels"]["lane"] == "agent" and target["scrapeUrl"] == "http://lane-agent:30006/metrics"
        while any(r["health"] == "unknown" for r in server.rules()) and time.monotonic() < deadline + 30:
            time.sleep(0.5)
        drift, stale, down, not_serving = server.rules()
        assert drift["name"] == mon.DRIFT_ALERT and drift["health"] == "ok"
        assert drift["query"] == m.drift_expr("5m", hold="15m") and drift["duration"] == 15 * 60
        # The reference reads its counter every 15 s: stale after five missed reads, held for the window.
        assert stale["name"] == mon.STALE_ALERT and stale["health"] == "ok"
        assert stale["query"] == f"time() - {m.COUNTS_READ_TIME.name} > 75" and stale["duration"] == 5 * 60
        # The lane alerts: down held for the window, not serving for the lane's 180-minute boot allowance.
        assert (down["name"], down["health"], down["duration"]) == (mon.DOWN_ALERT, "ok", 5 * 60)
        assert (not_serving["name"], not_serving["health"], not_serving["duration"]) == (
            mon.NOT_SERVING_ALERT, "ok", 180 * 60)
    finally:
        server.stop()


def rendered_rule(project: Path, alert: str) -> tuple[Path, dict]:
    """The reference's rendered rules file and its alert named `alert`."""
    result = invoke("render", REFERENCE)
    assert result.code == 0, result.output
    rules_file = project / "compose" / REFERENCE / "monitoring" / "rules.yml"
    (rule,) = [r for r in yaml.safe_load(rules_file.read_text())["groups"][0]["rules"] if r["alert"] == alert]
    return rules_file, rule


def _minute_counters(pattern: list[tuple[int, float]]) -> tuple[str, str]:
    """promtool input values, one sample a minute from t = 0: (picks, cold picks) counters of one
    layer, given (minutes, cold share) stretches; a share None is a pause (no picks)."""
    picks, cold, total, total_cold = [], [], 0, 0
    for minutes, share in pattern:
        for _ in range(minutes):
            picks.append(total)
            cold.append(total_cold)
            if share is not None:
                total, total_cold = total + 1000, total_cold + round(1000 * share)
    return " ".join(map(str, picks)), " ".join(map(str, cold))


@needs_prometheus
@pytest.mark.parametrize("case, pattern, firing, silent", [
    # 10% cold against the 1.5% the ledger predicted (8.5 points over): a share exists from the
    # second sample (t = 1m), so the alert is pending from 1m and fires after `drift_for` (15m).
    ("steady drift", [(60, 0.10)], [17, 30], [15]),
    # The same traffic in bursts of 5 minutes with 10-minute pauses: each pause leaves windows with
    # no picks; the last share with traffic carries through them, so it fires as steady traffic does.
    ("bursts with pauses", [(5, 0.10), (10, None)] * 4, [17, 40], [15]),
    # 3% cold: 1.5 points over the prediction, inside the 2-point tolerance: never.
    ("inside the tolerance", [(60, 0.03)], [], [17, 40]),
    # Drift for 20 minutes, then a pause longer than `drift_for`: the last share with traffic
    # (its window ends at 24m, the last one holding an increase) is kept for 15m, to 39m.
    ("a long pause ends it", [(21, 0.10), (39, None)], [20, 30, 38], [41, 55]),
])
def test_the_rendered_drift_alert_fires_as_documented(project: Path, tmp_path: Path, case: str,
                                                      pattern: list[tuple[int, float]],
                                                      firing: list[int], silent: list[int]) -> None:
    rules_file, rule = rendered_rule(project, mon.DRIFT_ALERT)
    picks, cold = _minute_counters(pattern)
    labels = 'lane="agent",class="agent",layer="3"'
    predicted = 0.015
    minutes = sum(n for n, _ in pattern)
    # The alert's text as people read it, written out here: both shares (10% live, the 1.5%
    # predicted) and the gap in percentage points (10 - 1.5 = 8.5), not a relative "8.5% more".
    annotations = {
        "summary": "Cold share of lane agent above the ledger's prediction",
        "description": (
            "Over the lane's last 5m with traffic (a pause of up to 15m keeps it), 10% of lane agent's "
            "routed picks landed on experts in host memory, against the 1.5% `recipegen check budgets` "
            "projected for class agent: 8.5 percentage points above the prediction (the alert fires when "
            "the gap stays above 2 percentage points for 15m). Run `recipegen drift` on the lane: it names "
            "a class whose map fits the traffic better.")}
    expected = [{"exp_labels": {"severity": "warning", "lane": "agent", "class": "agent"},
                 "exp_annotations": annotations}]
    tests = {"rule_files": [str(rules_file)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": f"{m.PICKS.name}{{{labels}}}", "values": picks},
            {"series": f"{m.COLD_PICKS.name}{{{labels}}}", "values": cold},
            {"series": f'{m.PREDICTED_COLD_SHARE.name}{{lane="agent",class="agent"}}',
             "values": f"{predicted}x{minutes}"}],
        "alert_rule_test": [{"eval_time": f"{t}m", "alertname": rule["alert"],
                             "exp_alerts": expected if t in firing else []}
                            for t in sorted(firing + silent)]}]}
    path = tmp_path / "alert_test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, f"{case}:\n{result.stdout}{result.stderr}"


@needs_prometheus
def test_the_rendered_stale_series_alert_fires_when_the_reads_stop(project: Path, tmp_path: Path) -> None:
    rules_file, rule = rendered_rule(project, mon.STALE_ALERT)
    # Reads every 15 s up to t = 300 s, then none: the exported read time stays 300. Its age passes
    # 75 s (five reads) at the 390 s evaluation, and the alert fires 5 minutes on, at 690 s.
    reads = "0+15x20 300x60"
    labels = 'lane="agent",class="agent",instance="lane-agent:30006",job="recipegen-lanes"'
    at_12m = 720 - 300   # the read's age at 12m: 420 s, which humanizeDuration writes "7m 0s"
    annotations = {k: v.replace("{{ $labels.lane }}", "agent").replace("{{ $value | humanizeDuration }}", "7m 0s")
                   for k, v in rule["annotations"].items()}
    assert at_12m == 420
    tests = {"rule_files": [str(rules_file)], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [{"series": f"{m.COUNTS_READ_TIME.name}{{{labels}}}", "values": reads},
                         {"series": f'{m.COUNTS_READ_TIME.name}{{lane="busy",class="agent"}}',
                          "values": "0+15x80"}],   # a lane that keeps reading: never
        "alert_rule_test": [
            {"eval_time": "6m", "alertname": rule["alert"], "exp_alerts": []},
            {"eval_time": "11m", "alertname": rule["alert"], "exp_alerts": []},
            {"eval_time": "12m", "alertname": rule["alert"], "exp_alerts": [{
                "exp_labels": {"severity": "warning", "lane": "agent", "class": "agent",
                               "instance": "lane-agent:30006", "job": "recipegen-lanes"},
                "exp_annotations": annotations}]}]}]}
    path = tmp_path / "stale_test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_prometheus
@pytest.mark.parametrize("case, up, down_firing, not_serving_firing, silent", [
    # Boots for 30 minutes, serves 30, then stops answering at 60m. "Down" is pending from 60m and
    # fires 5 minutes (the window) on; it lasts while a served sample is inside the boot allowance
    # (180m: the reference's MoE backend autotunes), to 239m. "Not serving" fires 180m after 60m.
    ("a crash after serving", [0] * 30 + [1] * 30 + [0] * 230, [65, 200, 235], [245, 280], [64]),
    # A boot of 120 minutes, inside the 180-minute allowance: neither ever fires.
    ("a long boot", [0] * 120 + [1] * 80, [], [], [60, 119, 125, 190]),
    # A boot that never finishes: "not serving" fires at the allowance, 180m; "down" never.
    ("a boot that never finishes", [0] * 200, [], [180, 199], [179]),
])
def test_the_rendered_lane_alerts_fire_as_documented(project: Path, tmp_path: Path, case: str, up: list[int],
                                                     down_firing: list[int], not_serving_firing: list[int],
                                                     silent: list[int]) -> None:
    rules_file, down = rendered_rule(project, mon.DOWN_ALERT)
    _, not_serving = rendered_rule(project, mon.NOT_SERVING_ALERT)
    assert not_serving["for"] == "180m"       # the reference lane's health start period (compose.yaml)
    labels = {"instance": "lane-agent:30006", "job": mon.LANES_JOB, "lane": "agent", "always_on": "true"}

    def expected(rule: dict) -> list[dict]:
        notes = {k: v.replace("{{ $labels.lane }}", "agent").replace("{{ $labels.instance }}", "lane-agent:30006")
                 for k, v in rule["annotations"].items()}
        return [{"exp_labels": {"severity": "critical", **labels}, "exp_annotations": notes}]

    series = [{"series": 'up{instance="lane-agent:30006",job="recipegen-lanes",lane="agent",always_on="true"}',
               "values": " ".join(map(str, up))},
              # a second target of the lane that serves throughout: each target alerts on its own
              {"series": 'up{instance="lane-chat:30007",job="recipegen-lanes",lane="agent",always_on="true"}',
               "values": " ".join(["1"] * len(up))}]
    checks = []
    for t in sorted(set(down_firing + not_serving_firing + silent)):
        checks.append({"eval_time": f"{t}m", "alertname": mon.DOWN_ALERT,
                       "exp_alerts": expected(down) if t in down_firing else []})
        checks.append({"eval_time": f"{t}m", "alertname": mon.NOT_SERVING_ALERT,
                       "exp_alerts": expected(not_serving) if t in not_serving_firing else []})
    promtool_alert_test(tmp_path, rules_file, series, checks)


def test_each_lanes_alerts_wait_its_own_boot_allowance() -> None:
    """The lane alerts' allowance is the health start period compose.yaml gives the lane's head
    (60m, or 180m where vLLM autotunes the MoE backend at boot), read from every committed
    rendering; recipes without monitoring get its defaults here."""
    from dataclasses import replace

    from recipegen.schema.monitoring import Monitoring

    periods_seen = set()
    for path in sorted(Path("recipes").glob("*.yaml")):
        loaded = load_recipe(str(path))
        if loaded.recipe.monitoring is None:
            loaded = replace(loaded, recipe=loaded.recipe.model_copy(update={"monitoring": Monitoring()}))
        rules = mon.lane_availability_rules(loaded)
        compose_files = list(Path("compose", loaded.recipe.name).glob("**/compose.yaml"))
        assert compose_files, path
        for compose_file in compose_files:
            for service in yaml.safe_load(compose_file.read_text())["services"].values():
                labels = service.get("labels", {})
                # the engines that serve a lane's API (not a count-only profile boot, not a worker)
                if "healthcheck" not in service or labels.get("io.recipegen.mode") == "count":
                    continue
                lane = labels["io.recipegen.lane"]
                periods = {r["for"] for r in rules if r["alert"] == mon.NOT_SERVING_ALERT
                           and lane in re.search(r'lane=~"([a-z0-9|-]+)"', r["expr"]).group(1).split("|")}
                assert periods == {service["healthcheck"]["start_period"]}, (compose_file, lane)
                periods_seen |= periods
    assert periods_seen == {"60m", "180m"}

# ------------------------------------------------------------------ the dashboard

def test_committed_dashboard_is_what_the_typed_builder_writes() -> None:
    pytest.importorskip("grafana_foundation_sdk")
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    text = dash.DASHBOARD_FILE.read_text()
    assert text == dash.dashboard_json(), (
        "recipegen/data/grafana/expert-residency.json is stale: python -m recipegen.render.dashboard")
    # and it reads back through the builder's typed model unchanged
    model = Dashboard.from_json(json.loads(text))
    assert json.dumps(model, cls=JSONEncoder, indent=2, sort_keys=True) + "\n" == text


def test_dashboard_panels_and_queries() -> None:
    board = json.loads(dash.DASHBOARD_FILE.read_text())
    # the heat map is repeated per lane, its title naming the lane
    panels = {p["title"].removesuffix(dash.PER_LANE): p for p in board["panels"] if p["type"] != "row"}
    queries = dash.panel_queries()
    assert set(panels) == set(queries)
    for title, panel in panels.items():
        assert panel["datasource"] == {"type": "prometheus", "uid": mon.DATASOURCE_UID}
        assert [t["expr"] for t in panel["targets"]] == [q for q, _ in queries[title]]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    hot_hit = panels["Hot-hit rate by MoE layer"]
    assert hot_hit["type"] == "heatmap" and hot_hit["options"]["calculate"] is False
    # one heat map per lane, its rows one lane's layers: lanes (of other models) are never merged
    assert hot_hit["title"] == "Hot-hit rate by MoE layer: lane $lane" and hot_hit["repeat"] == "lane"
    (expr,) = [t["expr"] for t in hot_hit["targets"]]
    assert expr.count("sum by (lane, layer) (") == 2 and "sum by (layer)" not in expr
    # No panel puts a fraction, a rate and a count on one axis: each series' unit, by query.
    units = {t["expr"]: p.get("fieldConfig", {}).get("defaults", {}).get("unit") for p in panels.values()
             for t in p["targets"]}
    kv = 'max by (lane) (vllm:kv_cache_usage_perc{lane=~"$lane"})'
    running = 'sum by (lane) (vllm:num_requests_running{lane=~"$lane"})'
    swaps = 'sum by (lane) (rate(expert_residency_swaps_total{lane=~"$lane"}[$__rate_interval]))'
    moved = 'sum by (lane) (expert_residency_live_map_moved_experts{lane=~"$lane"})'
    assert (units[kv], units[running], units[swaps], units[moved]) == ("percentunit", "short", "short", "short")
    panel_of = {t["expr"]: title for title, p in panels.items() for t in p["targets"]}
    assert len({panel_of[kv], panel_of[running], panel_of[swaps], panel_of[moved]}) == 4
    assert (panels[panel_of[kv]]["fieldConfig"]["defaults"]["min"],
            panels[panel_of[kv]]["fieldConfig"]["defaults"]["max"]) == (0, 1)
    live = panels["Cold share: live against the ledger's prediction"]["targets"]
    assert m.PREDICTED_COLD_SHARE.name in live[1]["expr"] and m.COLD_PICKS.name in live[0]["expr"]
    # A 24-column grid, no two panels overlapping.
    cells = set()
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, p["title"]
                cells.add((x, y))
    ids = [p["id"] for p in board["panels"]]
    assert len(set(ids)) == len(ids)
    (variable,) = board["templating"]["list"]
    assert variable["name"] == "lane" and mon.LANES_JOB in variable["query"]


@pytest.mark.skipif(not (VLLM033 / "v1" / "metrics" / "loggers.py").is_file(),
                    reason="vLLM 0.33.0's source is absent (scripts/fetch-vllm033-source.sh)")
def test_vllm_series_on_the_dashboard_are_vllm_033s() -> None:
    source = (VLLM033 / "v1" / "metrics" / "loggers.py").read_text()
    lines = source.splitlines()
    module = Path(dash.__file__).read_text()
    for name in dash.VLLM_SERIES:
        base = name.removesuffix("_total")
        # each constant cites the line where vLLM 0.33 names the series
        cited = re.search(re.escape(f'"{name}"') + r".*loggers\.py:(\d+)", module)
        assert cited, name
        assert f'name="{base}"' in lines[int(cited.group(1)) - 1], (name, lines[int(cited.group(1)) - 1])
    # and where /metrics is mounted: vLLM's multiprocess registry when PROMETHEUS_MULTIPROC_DIR is set
    prom = (VLLM033 / "v1" / "metrics" / "prometheus.py").read_text()
    assert 'if os.getenv("PROMETHEUS_MULTIPROC_DIR") is not None:' in prom
    assert "multiprocess.MultiProcessCollector(registry)" in prom
    mount = (VLLM033 / "entrypoints" / "serve" / "instrumentator" / "metrics.py").read_text()
    assert "registry = get_prometheus_registry()" in mount
    assert 'Mount("/metrics", make_asgi_app(registry=registry))' in mount


# ------------------------------------------------------------------ Kubernetes and several machines

def test_multi_node_head_is_scraped_at_its_address_and_annotated_for_kubernetes() -> None:
    loaded = load_recipe(PP2)
    assert mon.scrape_targets(loaded, "station-a") == [("agent", "10.0.0.1:30006")]
    assert mon.scrape_targets(loaded, "station-b") == []
    assert (REPO / "compose" / PP2 / "station-a" / mon.PROMETHEUS_CONFIG).is_file()
    assert not (REPO / "compose" / PP2 / "station-b" / "monitoring").exists()
    files = render_k8s(loaded, REPO)
    docs = [d for text in files.values() for d in yaml.safe_load_all(text.decode()) if d]
    (lws,) = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    template = lws["spec"]["leaderWorkerTemplate"]
    annotations = template["leaderTemplate"]["metadata"]["annotations"]
    assert {k: annotations[k] for k in mon.SCRAPE_ANNOTATIONS} == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "30006", "prometheus.io/path": "/metrics"}
    assert not set(mon.SCRAPE_ANNOTATIONS) & set(template["workerTemplate"]["metadata"]["annotations"])
    assert files == {p: p.read_bytes() for p in files}, "committed k8s/ is stale: recipegen k8s"


def test_a_residency_stage_gets_the_multiprocess_tmpfs_in_kubernetes_too(tmp_path: Path) -> None:
    from recipegen.k8s.manifests import _container
    from recipegen.render.compose import Mount, ServiceSpec

    spec = ServiceSpec(name="lane-x", image="i", command=("--master-addr", "a", "--node-rank", "0"),
                       environment=((m.MULTIPROC_DIR_ENV, mon.MULTIPROC_TARGET),),
                       mounts=(Mount("volume", "x-cache", "/cache", False),), device_ids=("0",), port=8000,
                       healthcheck=None, labels=(), tmpfs=(mon.MULTIPROC_TARGET,))
    container, volumes = _container(spec, recipe="r", lane="x", rank=0, leader=True, map_volume=None)
    mounted = {v["mountPath"]: v["name"] for v in container["volumeMounts"]}
    empty = {v["name"]: v for v in volumes}[mounted[mon.MULTIPROC_TARGET]]
    assert empty["emptyDir"] == {"medium": "Memory", "sizeLimit": "256Mi"}


def _pipeline_lane(stage0_in_hbm: bool, histogram: str):
    """The two-Station reference with its stages running the runtime on the one-Station agent map,
    layers split 17 / 23 (declared, so the split is the test's own), its class on `histogram`."""
    path = Path("recipes/dsv41-flash-gb300x2-pp2.yaml")
    doc = yaml.safe_load(path.read_text())
    lane = doc["lanes"][0]
    lane["offload"].update(hot_experts_per_layer=295, load_cpu_offload="60 GiB")
    for stage in lane["parallel"]["pipeline"]:
        stage["all_experts_in_hbm"] = False
    lane["parallel"]["pipeline"][0]["all_experts_in_hbm"] = stage0_in_hbm
    lane["parallel"]["layer_partition"] = [17, 23]
    lane["classes"] = {"agent": {"rowmap": "maps/dsv41-flash/agent.rowmap", "histogram": histogram}}
    lane["active_class"] = "agent"
    loaded = load_recipe(path, text=yaml.safe_dump(doc, sort_keys=False))
    return loaded, loaded.recipe.lanes[0]


def test_a_pipeline_lane_predicts_the_layers_its_series_count(project: Path) -> None:
    # The series of a pipeline lane come from stage 0 (global rank 0): decoder layers 0-16 here.
    # Its predicted share is the map's cold picks over all picks of those layers, summed by hand
    # (on a measured histogram: a synthetic one gives no prediction).
    histogram = measured_histogram(project, "profiles/dsv41-flash/agent.hist")
    rowmap = load_rowmap(Path("recipes/maps/dsv41-flash/agent.rowmap"))
    hist = load_histogram(Path("recipes") / histogram)
    rows = [r for r, layer in enumerate(hist.moe_layer_indices) if layer < 17]
    assert len(rows) == 17
    cold = sum(int(hist.counts[r][e]) for r in rows for e in rowmap.cold[r])
    picks = sum(int(hist.counts[r].sum()) for r in rows)
    loaded, lane = _pipeline_lane(stage0_in_hbm=False, histogram=histogram)
    assert mon.predicted_cold_share(loaded, lane) == pytest.approx(cold / picks, rel=1e-12)
    whole = hand_cold_share(Path("recipes/maps/dsv41-flash/agent.rowmap"), Path("recipes") / histogram)
    assert abs(cold / picks - whole) > 1e-6           # the whole lane's share would be another figure
    # the same lane on the synthetic histogram: nothing predicted
    loaded, lane = _pipeline_lane(stage0_in_hbm=False, histogram="profiles/dsv41-flash/agent.hist")
    assert mon.predicted_cold_share(loaded, lane) is None
    # a first stage with every expert in HBM runs no runtime: no series, nothing predicted
    loaded, lane = _pipeline_lane(stage0_in_hbm=True, histogram=histogram)
    assert mon.predicted_cold_share(loaded, lane) is None
    assert runtime_env.PREDICTED_COLD_SHARE not in (mon.lane_metrics(loaded, lane) or mon.LaneMetrics({}, ())).environment
