"""Who the monitoring profile scrapes and alerts on: a multi-node head at an IPv6 address (in
brackets, scraped by a real Prometheus), lanes behind a compose profile (scraped, never paged as
down), and the lanes whose drift alert has no baseline (a synthetic or missing histogram)."""

from __future__ import annotations

import dataclasses
import http.server
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from cli_support import invoke
from expert_residency.contract import env as runtime_env
from prometheus_support import PROMTOOL, SKIP_REASON, PrometheusServer, prometheus_available, promtool_alert_test
from test_monitoring_render import measured_histogram

from recipegen.load.recipe import load_recipe
from recipegen.render import monitoring as mon

REFERENCE = "dsv41-flash-gb300"
PP2 = "dsv41-flash-gb300x2-pp2"
QWEN = "qwen3-30b-a3b-rtx4090"
needs_prometheus = pytest.mark.skipif(not prometheus_available(), reason=SKIP_REASON)


def edit_recipe(project: Path, name: str, *replacements: tuple[str, str]) -> None:
    path = project / "recipes" / f"{name}.yaml"
    text = path.read_text()
    for old, new in replacements:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path.write_text(text)


# ------------------------------------------------------------------ IPv6 targets

@pytest.mark.parametrize("host, target", [
    ("10.0.0.1", "10.0.0.1:30006"),
    ("station-a.lan", "station-a.lan:30006"),
    ("station-a", "station-a:30006"),
    ("fd00::2", "[fd00::2]:30006"),
    ("::1", "[::1]:30006"),
    ("2001:db8::10:1", "[2001:db8::10:1]:30006"),
])
def test_a_target_brackets_an_ipv6_address_only(host: str, target: str) -> None:
    assert mon.host_port(host, 30006) == target


def test_a_multi_node_head_at_an_ipv6_address_is_scraped_in_brackets(project: Path) -> None:
    edit_recipe(project, PP2, ("address: 10.0.0.1 ", "address: 'fd00::2' "))
    result = invoke("render", PP2)
    assert result.code == 0, result.output
    config = yaml.safe_load((project / "compose" / PP2 / "station-a" / mon.PROMETHEUS_CONFIG).read_text())
    (static,) = config["scrape_configs"][0]["static_configs"]
    assert static["targets"] == ["[fd00::2]:30006"]


class _Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:   # noqa: N802 (http.server's name)
        body = b"# TYPE test_probe gauge\ntest_probe 1\n"
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _V6Server(http.server.HTTPServer):
    address_family = socket.AF_INET6


@needs_prometheus
def test_a_real_prometheus_scrapes_an_ipv6_head_as_rendered(project: Path, tmp_path: Path) -> None:
    """The head's machine at ::1 and a stand-in /metrics listening there on the lane's port: the
    rendered configuration passes promtool and Prometheus reaches the target (health "up")."""
    try:
        endpoint = _V6Server(("::1", 0), _Metrics)
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    port = endpoint.server_address[1]
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    try:
        edit_recipe(project, PP2, ("address: 10.0.0.1 ", "address: '::1' "),
                    ("    port: 30006\n", f"    port: {port}\n"))
        result = invoke("render", PP2)
        assert result.code == 0, result.output
        folder = project / "compose" / PP2 / "station-a" / "monitoring"
        config = yaml.safe_load((folder / "prometheus.yml").read_text())
        config["rule_files"] = [str(folder / "rules.yml")]
        config["global"]["scrape_interval"] = "1s"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            prometheus_port = s.getsockname()[1]
        server = PrometheusServer(tmp_path / "prometheus", prometheus_port).start(config)
        try:
            deadline = time.monotonic() + 30
            target = None
            while time.monotonic() < deadline:
                targets = server.targets()
                if targets and targets[0]["health"] != "unknown":
                    target = targets[0]
                    break
                time.sleep(0.5)
            assert target is not None, server.log_text()[-2000:]
            assert target["scrapeUrl"] == f"http://[::1]:{port}/metrics"
            assert (target["health"], target["lastError"]) == ("up", ""), target
            assert target["labels"]["lane"] == "agent" and target["labels"]["always_on"] == "true"
        finally:
            server.stop()
    finally:
        endpoint.shutdown()
        endpoint.server_close()


# ------------------------------------------------------------------ lanes behind a compose profile

def _with_profile_lane():
    """The reference with a second lane, `batch`, a copy of `agent` behind the compose profile
    `batch` (port 30007): built in memory, only the monitoring files are written from it."""
    loaded = load_recipe(REFERENCE)
    agent = loaded.recipe.lanes[0]
    assert agent.profile is None
    batch = agent.model_copy(update={"name": "batch", "port": 30007, "profile": "batch"})
    recipe = loaded.recipe.model_copy(update={"lanes": [agent, batch]})
    return dataclasses.replace(loaded, recipe=recipe)


def test_every_lane_is_scraped_with_whether_it_is_always_on() -> None:
    loaded = _with_profile_lane()
    config = mon.prometheus_config(loaded, "station")
    assert config["scrape_configs"][0]["static_configs"] == [
        {"targets": ["lane-agent:30006"], "labels": {"lane": "agent", "always_on": "true"}},
        {"targets": ["lane-batch:30007"], "labels": {"lane": "batch", "always_on": "false"}}]


@needs_prometheus
def test_a_lane_behind_a_profile_never_pages_while_off(tmp_path: Path) -> None:
    """`agent` (always on) served for 10 minutes and then stopped answering; `batch` (behind a
    profile) served the same 10 minutes (a batch job) and was then off for over three hours, and
    `night` (behind a profile, never started) for the whole run. Only agent's alerts fire: "down"
    5 minutes (the window) after it stopped, "not serving" after its 180-minute allowance."""
    loaded = _with_profile_lane()
    night = loaded.recipe.lanes[1].model_copy(update={"name": "night", "port": 30008, "profile": "night"})
    loaded = dataclasses.replace(loaded, recipe=loaded.recipe.model_copy(
        update={"lanes": [*loaded.recipe.lanes, night]}))
    rules_file = tmp_path / "rules.yml"
    rules_file.write_bytes(mon.yaml_bytes(mon.prometheus_rules(loaded), "rules.yml"))
    check = subprocess.run([PROMTOOL, "check", "rules", str(rules_file)], capture_output=True, text=True)
    assert check.returncode == 0 and "SUCCESS: 4 rules found" in check.stdout, check.stdout + check.stderr
    rules = {r["alert"]: r for r in yaml.safe_load(rules_file.read_text())["groups"][0]["rules"]}

    def expected(alert: str) -> list[dict]:
        notes = {k: v.replace("{{ $labels.lane }}", "agent").replace("{{ $labels.instance }}", "lane-agent:30006")
                 for k, v in rules[alert]["annotations"].items()}
        return [{"exp_labels": {"severity": "critical", "instance": "lane-agent:30006", "job": mon.LANES_JOB,
                                "lane": "agent", "always_on": "true"}, "exp_annotations": notes}]

    minutes = 200
    served_then_off = " ".join(["1"] * 10 + ["0"] * (minutes - 10))
    series = [
        {"series": 'up{instance="lane-agent:30006",job="recipegen-lanes",lane="agent",always_on="true"}',
         "values": served_then_off},
        {"series": 'up{instance="lane-batch:30007",job="recipegen-lanes",lane="batch",always_on="false"}',
         "values": served_then_off},
        {"series": 'up{instance="lane-night:30008",job="recipegen-lanes",lane="night",always_on="false"}',
         "values": " ".join(["0"] * minutes)}]
    down = {20: True, 130: True, 185: True}          # agent: down from 10m, fires at 15m, to 189m
    not_serving = {130: False, 185: False, 195: True}  # agent: 180m of up 0 from 10m, at 190m
    checks = [{"eval_time": f"{t}m", "alertname": mon.DOWN_ALERT, "exp_alerts": expected(mon.DOWN_ALERT) if on else []}
              for t, on in down.items()]
    checks += [{"eval_time": f"{t}m", "alertname": mon.NOT_SERVING_ALERT,
                "exp_alerts": expected(mon.NOT_SERVING_ALERT) if on else []} for t, on in not_serving.items()]
    promtool_alert_test(tmp_path, rules_file, series, checks)


@needs_prometheus
def test_a_recipe_whose_only_lane_has_a_profile_renders_no_lane_alerts(project: Path) -> None:
    edit_recipe(project, QWEN, ("lanes:\n", "monitoring: {}\nlanes:\n"),
                ("    port: 8000\n", "    port: 8000\n    profile: batch\n"))
    result = invoke("render", QWEN)
    assert result.code == 0, result.output
    folder = project / "compose" / QWEN / "monitoring"
    config = yaml.safe_load((folder / "prometheus.yml").read_text())
    assert config["scrape_configs"][0]["static_configs"] == [
        {"targets": ["lane-chat:8000"], "labels": {"lane": "chat", "always_on": "false"}}]
    alerts = [r["alert"] for r in yaml.safe_load((folder / "rules.yml").read_text())["groups"][0]["rules"]]
    assert alerts == [mon.DRIFT_ALERT, mon.STALE_ALERT]
    check = subprocess.run([PROMTOOL, "check", "rules", str(folder / "rules.yml")], capture_output=True, text=True)
    assert check.returncode == 0 and "SUCCESS: 2 rules found" in check.stdout, check.stdout + check.stderr


# ------------------------------------------------------------------ the drift alert's baseline

def test_a_synthetic_histogram_gives_no_baseline_and_says_so(project: Path) -> None:
    loaded = load_recipe(REFERENCE)
    (lane,) = loaded.recipe.lanes
    assert mon.predicted_cold_share(loaded, lane) is None
    assert runtime_env.PREDICTED_COLD_SHARE not in mon.lane_metrics(loaded, lane).environment
    assert mon.drift_baseline_notes(loaded) == [
        "lane agent: no drift alert baseline: class agent's histogram (profiles/dsv41-flash/agent.hist) is "
        "synthetic (generated, not measured traffic), so no predicted cold share is exported and the "
        "cold-share drift alert stays quiet; measure the class's traffic with `recipegen profile "
        "dsv41-flash-gb300 agent --class agent --prompts FILE` (or `--serve SECONDS`), then render again"]


def test_a_class_without_a_histogram_gives_no_baseline_and_says_so(project: Path) -> None:
    edit_recipe(project, REFERENCE, ("        histogram: profiles/dsv41-flash/agent.hist\n", ""))
    loaded = load_recipe(REFERENCE)
    assert mon.predicted_cold_share(loaded, loaded.recipe.lanes[0]) is None
    (note,) = mon.drift_baseline_notes(loaded)
    assert note.startswith("lane agent: no drift alert baseline: class agent declares no histogram")
    assert "`recipegen profile dsv41-flash-gb300 agent --class agent --prompts FILE`" in note


def test_a_measured_histogram_is_the_baseline(project: Path) -> None:
    histogram = measured_histogram(project, "profiles/dsv41-flash/agent.hist")
    edit_recipe(project, REFERENCE, ("histogram: profiles/dsv41-flash/agent.hist\n", f"histogram: {histogram}\n"))
    result = invoke("render", REFERENCE)
    assert result.code == 0, result.output
    # The map's cold experts' picks over all picks, summed here from the files.
    from expert_residency.formats import load_histogram, load_rowmap

    rowmap = load_rowmap(project / "recipes/maps/dsv41-flash/agent.rowmap")
    hist = load_histogram(project / "recipes" / histogram)
    want = sum(int(hist.counts[r][e]) for r, experts in enumerate(rowmap.cold) for e in experts) / int(hist.counts.sum())
    compose = yaml.safe_load((project / "compose" / REFERENCE / "compose.yaml").read_text())
    env = compose["services"]["lane-agent"]["environment"]
    assert float(env[runtime_env.PREDICTED_COLD_SHARE]) == pytest.approx(want, rel=1e-12)
    assert mon.drift_baseline_notes(load_recipe(REFERENCE)) == []


def test_no_notes_without_monitoring_or_without_the_runtime() -> None:
    # no `monitoring`: nothing is exported, nothing to say
    assert load_recipe(QWEN).recipe.monitoring is None
    assert mon.drift_baseline_notes(load_recipe(QWEN)) == []
    # monitoring on a positional lane (no residency runtime, no expert_residency_* series)
    from recipegen.schema.monitoring import Monitoring

    loaded = load_recipe("deepseek-v3.2-h200x8")
    assert loaded.recipe.lanes[0].offload.placement == "positional"
    loaded = dataclasses.replace(loaded, recipe=loaded.recipe.model_copy(update={"monitoring": Monitoring()}))
    assert mon.drift_baseline_notes(loaded) == []


def test_a_recipe_outside_recipes_is_named_by_its_path(project: Path) -> None:
    # Its bare name resolves to recipes/<name>.yaml, another file: following a note that named it
    # would profile (and later re-render) the wrong recipe. The note names the path instead.
    import shutil

    shutil.copytree(project / "recipes", project / "elsewhere")
    outside = project / "elsewhere" / f"{REFERENCE}.yaml"
    profile = f"`recipegen profile elsewhere/{REFERENCE}.yaml agent --class agent --prompts FILE`"
    (note,) = mon.drift_baseline_notes(load_recipe(outside))
    assert profile in note, note
    assert mon.recipe_argument(load_recipe(outside)) == f"elsewhere/{REFERENCE}.yaml"
    result = invoke("render", f"elsewhere/{REFERENCE}.yaml")
    assert result.code == 0, result.output
    assert "note: lane agent: no drift alert baseline" in result.output and profile in result.output, result.output
    # ... and what it names resolves to this same file
    from recipegen.load.recipe import resolve_recipe_path

    assert resolve_recipe_path(f"elsewhere/{REFERENCE}.yaml").resolve() == outside.resolve()
    # the recipe under recipes/, named by its path or by its name, keeps the bare name
    for arg in (REFERENCE, f"recipes/{REFERENCE}.yaml"):
        (note,) = mon.drift_baseline_notes(load_recipe(arg))
        assert f"`recipegen profile {REFERENCE} agent --class agent --prompts FILE`" in note, note


def test_a_recipe_away_from_any_recipes_folder_is_named_by_its_absolute_path(
        project: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    # The current folder has no recipes/: the bare name resolves to the installed checkout's
    # recipe (the reviewer's case), another file; the note gives the path, absolute since the
    # file is outside the current folder.
    import shutil

    other = tmp_path_factory.mktemp("other")
    shutil.copytree(project / "recipes", other / "recipes")
    shutil.rmtree(project / "recipes")
    path = other / "recipes" / f"{REFERENCE}.yaml"
    (note,) = mon.drift_baseline_notes(load_recipe(path))
    assert f"`recipegen profile {path} agent --class agent --prompts FILE`" in note, note


def test_exports_series_is_what_the_head_service_runs() -> None:
    # One rule (render.lanes.runs_residency) for both: a lane's head service runs the runtime
    # with its row map (mode "residency") exactly where the monitoring render expects its series.
    from recipegen.load.recipe import list_recipes
    from recipegen.render.lanes import lane_service_name
    from recipegen.render.render import render_recipe

    seen = set()
    for path in list_recipes():
        loaded = load_recipe(path)
        rendering = render_recipe(loaded)
        services = {}
        for files in rendering.folders.values():
            services.update(yaml.safe_load(files["compose.yaml"])["services"])
        for lane in loaded.recipe.lanes:
            mode = services[lane_service_name(lane.name)]["labels"]["io.recipegen.mode"]
            assert mon.exports_series(loaded, lane) == (mode == "residency"), (path.name, lane.name, mode)
            seen.add(mode)
    assert {"residency", "off"} <= seen
