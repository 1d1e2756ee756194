"""The recipe's `monitoring` (docs/metrics.md): the lanes' metrics settings and the monitoring
profile's services and files, every file built as data and serialized (YAML, JSON).

- `lane_metrics`: what a residency engine needs to export the `expert_residency_*` series on its
  own `/metrics` (environment and the tmpfs for prometheus_client's multiprocess folder);
- `monitoring_project`: the `prometheus` and `grafana` services (compose profile `monitoring`),
  Prometheus' scrape configuration and drift alert, Grafana's provisioned data source and the
  dashboard (`recipegen.render.dashboard`, committed as `recipegen/data/grafana/`).
"""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from expert_residency.contract import env as runtime_env
from expert_residency.contract import metrics as m

from recipegen.common.errors import RecipegenError
from recipegen.common.generated import Flow, Plain, yaml_file
from recipegen.render.compose import Service
from recipegen.render.lanes import lane_service_name, runs_residency
from recipegen.vllm_flags.moe_backend import choose_or_auto, start_period

if TYPE_CHECKING:
    from recipegen.load.recipe import LoadedRecipe
    from recipegen.schema.lane import Lane

# Images, pinned: Prometheus of the 2.53 long-term-support line (the configuration is checked by
# the tests with Debian's promtool 2.42, whose format 2.53 reads unchanged) and the Grafana release
# whose dashboard schema grafana-foundation-sdk's 11.6 builder writes.
PROMETHEUS_IMAGE = "prom/prometheus:v2.53.3"
GRAFANA_IMAGE = "grafana/grafana:11.6.0"
MONITORING_PROFILE = "monitoring"
PROMETHEUS_SERVICE = "prometheus"
GRAFANA_SERVICE = "grafana"
PROMETHEUS_VOLUME = "prometheus-data"
LANES_JOB = "recipegen-lanes"
DATASOURCE_UID = "recipegen-prometheus"
DRIFT_ALERT = "ExpertResidencyColdShareDrift"
STALE_ALERT = "ExpertResidencyCountsStale"
DOWN_ALERT = "RecipegenLaneDown"
NOT_SERVING_ALERT = "RecipegenLaneNotServing"
# The scrape target label saying whether the lane is always on ("true") or behind a compose profile.
ALWAYS_ON_LABEL = "always_on"
# Inside the lane's container: prometheus_client's multiprocess folder, a tmpfs (empty at every
# start, as prometheus_client requires; a restarted container must not read the last run's files).
MULTIPROC_TARGET = "/run/expert-residency-metrics"
FOLDER = "monitoring"
PROMETHEUS_CONFIG = f"{FOLDER}/prometheus.yml"
PROMETHEUS_RULES = f"{FOLDER}/rules.yml"
GRAFANA_DATASOURCES = f"{FOLDER}/grafana/datasources.yml"
GRAFANA_DASHBOARDS = f"{FOLDER}/grafana/dashboards.yml"
DASHBOARD_NAME = "expert-residency.json"
GRAFANA_DASHBOARD = f"{FOLDER}/grafana/dashboards/{DASHBOARD_NAME}"
DASHBOARD_SOURCE = Path(__file__).resolve().parent.parent / "data" / "grafana" / DASHBOARD_NAME
# Kubernetes: the annotations Prometheus' common pod discovery reads.
SCRAPE_ANNOTATIONS = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")


@dataclass(frozen=True)
class LaneMetrics:
    environment: dict[str, str]
    tmpfs: tuple[str, ...]


def exports_series(loaded: LoadedRecipe, lane: Lane) -> bool:
    """Whether the lane's API-serving engine runs the residency runtime, whose worker exports the
    `expert_residency_*` series: what its compose service runs (`render.lanes.runs_residency` of stage 0: a
    usage-aware lane; on a pipeline, a first stage that holds MoE layers and keeps some experts
    cold)."""
    return runs_residency(loaded, lane, 0)


def _prediction(loaded: LoadedRecipe, lane: Lane) -> tuple[float | None, str | None]:
    """(the predicted share, None), or (None, why there is none)."""
    from recipegen.costmodel.lane import lane_cold_shares

    if not exports_series(loaded, lane):
        return None, "its engine runs no residency runtime (no expert_residency_* series)"
    share = lane_cold_shares(loaded, lane, None).get(lane.active_class) if lane.active_class else None
    if share is None or isinstance(share, str):
        return None, "no-histogram"
    if share.synthetic:
        # A generated histogram (the synthetic default of `recipegen new`, `rowmap synth`) says
        # nothing of the lane's real traffic: a baseline from it makes the alert fire on traffic
        # that is fine, or never fire at all.
        return None, "synthetic"
    pipeline = lane.parallel.pipeline if lane.parallel is not None else None
    if not pipeline or share.per_layer is None:
        return float(share.overall), None
    from recipegen.ledger.multinode import lane_stages as ledger_stages

    model = loaded.recipe.model
    first = ledger_stages(model, lane)[0]
    rows = [i for i, layer in enumerate(model.moe_layers) if first.holds(layer)]
    return share.over_layers(rows), None


def predicted_cold_share(loaded: LoadedRecipe, lane: Lane) -> float | None:
    """What `recipegen check budgets` projects for the lane's active class (its row map on its
    histogram, `costmodel.lane.lane_cold_shares`), or None when the class declares no histogram,
    or a synthetic one (generated, not measured: no baseline for the drift alert).

    A pipeline lane's series come from its first stage (the writer is global rank 0), so they
    count the MoE layers that stage holds: the prediction is taken over the same layers (None
    when it holds none, or keeps every expert in HBM and runs no runtime)."""
    return _prediction(loaded, lane)[0]


def recipe_argument(loaded: LoadedRecipe) -> str:
    """What to type on a command line for this same recipe: its bare name where that resolves
    to this file (`recipegen.load.recipe.resolve_recipe_path`, from here), else its path as
    `display_path` shows it (a recipe outside ./recipes/, whose bare name resolves elsewhere or
    nowhere)."""
    from recipegen.common.errors import InputError
    from recipegen.load.document import display_path
    from recipegen.load.recipe import resolve_recipe_path

    name = loaded.recipe.name
    try:
        if resolve_recipe_path(name).resolve() == loaded.path.resolve():
            return name
    except (InputError, OSError):
        pass
    return display_path(loaded.path)


def drift_baseline_notes(loaded: LoadedRecipe) -> list[str]:
    """One line per lane that exports residency series with monitoring on but gets no predicted
    cold share for its active class, saying why and what to do (for `recipegen render` to print):
    without the prediction the drift alert has nothing to compare the live share with and stays
    quiet. Empty when the recipe has no `monitoring`."""
    if loaded.recipe.monitoring is None:
        return []
    notes = []
    recipe = shlex.quote(recipe_argument(loaded))
    for lane in loaded.recipe.lanes:
        if not exports_series(loaded, lane):
            continue
        predicted, why = _prediction(loaded, lane)
        if predicted is not None:
            continue
        cls = lane.active_class
        profile = (f"`recipegen profile {recipe} {lane.name} --class {cls} --prompts FILE` "
                   "(or `--serve SECONDS`)")
        if why == "synthetic":
            hist = lane.classes[cls].histogram
            notes.append(
                f"lane {lane.name}: no drift alert baseline: class {cls}'s histogram ({hist}) is "
                "synthetic (generated, not measured traffic), so no predicted cold share is exported "
                f"and the cold-share drift alert stays quiet; measure the class's traffic with {profile}, "
                "then render again")
        else:
            notes.append(
                f"lane {lane.name}: no drift alert baseline: class {cls} declares no histogram, so no "
                "predicted cold share is exported and the cold-share drift alert stays quiet; measure "
                f"the class's traffic with {profile}, then render again")
    return notes


def lane_metrics(loaded: LoadedRecipe, lane: Lane) -> LaneMetrics | None:
    """The environment and tmpfs of a residency engine when the recipe turns monitoring on."""
    monitoring = loaded.recipe.monitoring
    if monitoring is None:
        return None
    environment = {runtime_env.METRICS: "on",
                   runtime_env.METRICS_INTERVAL_S: str(monitoring.scrape_interval_s),
                   runtime_env.METRICS_WINDOW_S: str(monitoring.window_s),
                   m.MULTIPROC_DIR_ENV: MULTIPROC_TARGET}
    predicted = predicted_cold_share(loaded, lane)
    if predicted is not None:
        environment[runtime_env.PREDICTED_COLD_SHARE] = repr(predicted)
    return LaneMetrics(environment, (MULTIPROC_TARGET,))


# -- the monitoring profile ------------------------------------------------------------------------

def _head_machine(lane: Lane) -> str:
    """The machine of the lane's API-serving engine (a single-node lane's, or stage 0's of a pipeline)."""
    pipeline = lane.parallel.pipeline if lane.parallel is not None else None
    return pipeline[0].machine if pipeline else lane.machine


def lane_start_period(loaded: LoadedRecipe, lane: Lane) -> str:
    """The health start period of the lane's API-serving engine, as its compose healthcheck has it
    (`vllm_flags.moe_backend.start_period`: longer where vLLM autotunes the MoE backend at boot)."""
    gpus = loaded.recipe.machines[_head_machine(lane)].gpus
    # A residency lane no backend admits is refused by the render before any rule is written.
    return start_period(choose_or_auto(loaded.recipe.model.expert_format, gpus.compute_capability, gpus.kind))


def host_port(host: str, port: int) -> str:
    """A scrape target's `host:port`: an IPv6 address in brackets (`[fd00::2]:30006`, as Prometheus
    and URLs need it), an IPv4 address or a host name as it is."""
    try:
        bracket = ipaddress.ip_address(host).version == 6
    except ValueError:
        bracket = False
    return f"[{host}]:{port}" if bracket else f"{host}:{port}"


def scrape_targets(loaded: LoadedRecipe, machine: str) -> list[tuple[str, str]]:
    """(lane, host:port) of every lane whose API-serving engine (a single-node lane, or stage 0 of
    a pipeline) runs on `machine`: the compose service `lane-<lane>` by name on the project's
    network, a multi-node head (host network) at its machine's address."""
    targets = []
    for lane in loaded.recipe.lanes:
        pipeline = lane.parallel.pipeline if lane.parallel is not None else None
        if _head_machine(lane) != machine:
            continue
        if pipeline and len(pipeline) > 1:
            address = loaded.recipe.machines[machine].address
            assert address is not None   # a multi-node lane's machines declare one (multinode.checks)
            targets.append((lane.name, host_port(address, lane.port)))
        else:
            targets.append((lane.name, f"{lane_service_name(lane.name)}:{lane.port}"))
    return targets


def always_on(lane: Lane) -> bool:
    """Whether the lane is meant to run all the time: it has no compose `profile` (a lane with one
    starts only when asked, docs/operations.md)."""
    return lane.profile is None


def prometheus_config(loaded: LoadedRecipe, machine: str) -> dict[str, Any]:
    monitoring = loaded.recipe.monitoring
    assert monitoring is not None
    lanes = {lane.name: lane for lane in loaded.recipe.lanes}
    return {
        "global": {"scrape_interval": monitoring.scrape_interval,
                   "evaluation_interval": monitoring.scrape_interval,
                   "external_labels": {"recipe": loaded.recipe.name, "machine": machine}},
        "rule_files": ["/etc/prometheus/rules.yml"],
        "scrape_configs": [{
            "job_name": LANES_JOB,
            "metrics_path": "/metrics",
            # The runtime's series carry their lane already (the same name): keep them as sent.
            "honor_labels": True,
            # `always_on`: "false" for a lane behind a compose profile (started only when asked),
            # whose `up` 0 is no outage: the lane alerts skip it; its series are scraped all the same.
            "static_configs": [{"targets": [target],
                                "labels": {"lane": lane, ALWAYS_ON_LABEL: str(always_on(lanes[lane])).lower()}}
                               for lane, target in scrape_targets(loaded, machine)],
        }],
    }


# The drift alert's two shares, looked up when the alert's text is written: the prediction the
# alert compared with, and the live share (the prediction plus the alert's value, which is live
# minus predicted). Lane and class names match the schema's [a-z0-9-] pattern.
_PREDICTED = f"{m.PREDICTED_COLD_SHARE.name}{{lane=%q,class=%q}}"
_PREDICTED_SHARE = ("{{ with printf \"" + _PREDICTED + "\" $labels.lane $labels.class | query }}"
                    "{{ . | first | value | humanizePercentage }}{{ else }}share{{ end }}")
_LIVE_SHARE = ("{{ with printf \"" + _PREDICTED + " + %v\" $labels.lane $labels.class $value | query }}"
               "{{ . | first | value | humanizePercentage }}{{ else }}a larger share{{ end }}")


def prometheus_rules(loaded: LoadedRecipe) -> dict[str, Any]:
    monitoring = loaded.recipe.monitoring
    assert monitoring is not None
    return {"groups": [{"name": "expert-residency", "rules": [{
        "alert": DRIFT_ALERT,
        "expr": m.drift_expr(monitoring.window, hold=monitoring.drift_for),
        "for": monitoring.drift_for,
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "Cold share of lane {{ $labels.lane }} above the ledger's prediction",
            "description": (
                "Over the lane's last " + monitoring.window + " with traffic (a pause of up to "
                + monitoring.drift_for + " keeps it), " + _LIVE_SHARE + " of lane {{ $labels.lane }}'s "
                "routed picks landed on experts in host memory, against the " + _PREDICTED_SHARE
                + " `recipegen check budgets` projected for class {{ $labels.class }}: "
                "{{ $value | humanizePercentage | reReplaceAll \"%$\" \"\" }} percentage points above the "
                "prediction (the alert fires when the gap stays above " + f"{m.DRIFT_TOLERANCE * 100:g}"
                + " percentage points for " + monitoring.drift_for + "). Run `recipegen "
                "drift` on the lane: it names a class whose map fits the traffic better."),
        },
    }, {
        "alert": STALE_ALERT,
        "expr": m.stale_counts_expr(monitoring.scrape_interval_s),
        "for": monitoring.window,
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "Expert residency series of lane {{ $labels.lane }} stopped updating",
            "description": (
                "The runtime last read lane {{ $labels.lane }}'s expert counter {{ $value | humanizeDuration }} "
                "ago (it reads every " + monitoring.scrape_interval + "), so its expert_residency_* series, "
                "the drift alert among them, describe the past. The lane's log says why: look for "
                "`expert_residency: metrics update failed`."),
        },
    }, *lane_availability_rules(loaded)]}]}


def lane_availability_rules(loaded: LoadedRecipe) -> list[dict[str, Any]]:
    """Two alerts per set of lanes with one boot allowance (the health start period): a lane whose
    /metrics stopped answering after it had served within that allowance (a crash, a hung engine,
    a restart), held for `window`; and one that has not answered for the whole allowance (a boot
    that never finished, or a lane down for good). A boot inside its allowance fires neither.

    Only always-on lanes (target label `always_on="true"`): a lane behind a compose profile is off
    by design until someone starts it, and its `up` 0 says nothing (no rules when every lane has one)."""
    monitoring = loaded.recipe.monitoring
    assert monitoring is not None
    by_period: dict[str, list[str]] = {}
    for lane in loaded.recipe.lanes:
        if always_on(lane):
            by_period.setdefault(lane_start_period(loaded, lane), []).append(lane.name)
    rules: list[dict[str, Any]] = []
    for period, lanes in sorted(by_period.items()):
        # Lane names match the schema's [a-z0-9-] pattern: nothing in them is a regex operator.
        up = f'up{{job="{LANES_JOB}",{ALWAYS_ON_LABEL}="true",lane=~"{"|".join(lanes)}"}}'
        rules.append({
            "alert": DOWN_ALERT,
            "expr": f"{up} == 0 and on (job, instance, lane) max_over_time({up}[{period}]) == 1",
            "for": monitoring.window,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "Lane {{ $labels.lane }} stopped answering",
                "description": (
                    "Prometheus has not reached lane {{ $labels.lane }}'s /metrics ({{ $labels.instance }}) "
                    "for " + monitoring.window + ", and it answered within the last " + period + ": the "
                    "engine crashed, hung or is restarting. `recipegen status` shows the container's state; "
                    "`docker compose logs " + lane_service_name("{{ $labels.lane }}") + "` says why."),
            },
        })
        rules.append({
            "alert": NOT_SERVING_ALERT,
            "expr": f"{up} == 0",
            "for": period,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "Lane {{ $labels.lane }} has not served for " + period,
                "description": (
                    "Prometheus has not reached lane {{ $labels.lane }}'s /metrics ({{ $labels.instance }}) "
                    "for " + period + ", the longest a boot of this lane may take (its health check's "
                    "start period): the boot never finished or the lane is down for good. "
                    "`docker compose logs " + lane_service_name("{{ $labels.lane }}") + "` says why."),
            },
        })
    return rules


def grafana_datasources(loaded: LoadedRecipe) -> dict[str, Any]:
    monitoring = loaded.recipe.monitoring
    assert monitoring is not None
    return {"apiVersion": 1, "datasources": [{
        "name": "Prometheus", "uid": DATASOURCE_UID, "type": "prometheus", "access": "proxy",
        "url": f"http://{PROMETHEUS_SERVICE}:9090", "isDefault": True, "editable": False,
        "jsonData": {"timeInterval": monitoring.scrape_interval}}]}


def grafana_dashboards() -> dict[str, Any]:
    return {"apiVersion": 1, "providers": [{
        "name": "recipegen", "folder": "recipegen", "type": "file", "disableDeletion": True,
        "allowUiUpdates": False, "options": {"path": "/var/lib/grafana/dashboards"}}]}


def dashboard_bytes() -> bytes:
    if not DASHBOARD_SOURCE.is_file():
        raise RecipegenError(f"{DASHBOARD_SOURCE} is missing (regenerate it: python -m "
                             "recipegen.render.dashboard, with recipegen[monitoring] installed)")
    return DASHBOARD_SOURCE.read_bytes()


def yaml_bytes(data: Any, what: str) -> bytes:
    """A monitoring file: serialized by PyYAML's safe dumper and read back before it is used
    (`recipegen.common.generated.yaml_file`)."""
    return yaml_file([], data, what=what, width=4096).encode("utf-8")


def _bind(source: str, target: str) -> dict[str, Any]:
    return {"type": Plain("bind"), "source": source, "target": target, "read_only": True,
            "bind": {"create_host_path": False}}


def monitoring_project(loaded: LoadedRecipe, machine: str
                       ) -> tuple[list[Service], list[str], dict[str, bytes]]:
    """The profile's services (as data: render.compose serializes them beside the lanes'), named
    volumes and files for the output folder of `machine` (nothing when the recipe has no
    `monitoring`, or no lane serves its API there)."""
    monitoring = loaded.recipe.monitoring
    if monitoring is None or not scrape_targets(loaded, machine):
        return [], [], {}
    files = {PROMETHEUS_CONFIG: yaml_bytes(prometheus_config(loaded, machine), PROMETHEUS_CONFIG),
             PROMETHEUS_RULES: yaml_bytes(prometheus_rules(loaded), PROMETHEUS_RULES),
             GRAFANA_DATASOURCES: yaml_bytes(grafana_datasources(loaded), GRAFANA_DATASOURCES),
             GRAFANA_DASHBOARDS: yaml_bytes(grafana_dashboards(), GRAFANA_DASHBOARDS),
             GRAFANA_DASHBOARD: dashboard_bytes()}
    # Not `io.recipegen.recipe`: `recipegen status` lists the containers carrying that one as lanes.
    labels = {"io.recipegen.monitoring": loaded.recipe.name}
    bind = monitoring.bind_address
    prometheus = {
        "profiles": Flow((MONITORING_PROFILE,)),
        "image": PROMETHEUS_IMAGE,
        "command": ["--config.file=/etc/prometheus/prometheus.yml",
                    "--storage.tsdb.path=/prometheus",
                    f"--storage.tsdb.retention.time={monitoring.retention}",
                    "--web.listen-address=0.0.0.0:9090"],
        "volumes": [_bind(PROMETHEUS_CONFIG, "/etc/prometheus/prometheus.yml"),
                    _bind(PROMETHEUS_RULES, "/etc/prometheus/rules.yml"),
                    {"type": Plain("volume"), "source": PROMETHEUS_VOLUME, "target": "/prometheus",
                     "read_only": False}],
        "ports": [f"{bind}:{monitoring.prometheus_port}:9090"],
        "restart": "unless-stopped",
        "labels": labels,
    }
    grafana = {
        "profiles": Flow((MONITORING_PROFILE,)),
        "image": GRAFANA_IMAGE,
        "environment": {
            # Viewing needs no login; changing anything needs the admin password (secrets.env:
            # GF_SECURITY_ADMIN_PASSWORD).
            "GF_AUTH_ANONYMOUS_ENABLED": "true",
            "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
            "GF_USERS_ALLOW_SIGN_UP": "false",
            "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH": f"/var/lib/grafana/dashboards/{DASHBOARD_NAME}",
        },
        "env_file": [{"path": "secrets.env", "required": False}],
        "volumes": [_bind(GRAFANA_DATASOURCES, "/etc/grafana/provisioning/datasources/recipegen.yml"),
                    _bind(GRAFANA_DASHBOARDS, "/etc/grafana/provisioning/dashboards/recipegen.yml"),
                    _bind(GRAFANA_DASHBOARD, f"/var/lib/grafana/dashboards/{DASHBOARD_NAME}")],
        "ports": [f"{bind}:{monitoring.grafana_port}:3000"],
        "depends_on": {PROMETHEUS_SERVICE: {"condition": Plain("service_started"), "required": True}},
        "restart": "unless-stopped",
        "labels": labels,
    }
    services = [Service(PROMETHEUS_SERVICE, prometheus,
                        {k: files[k] for k in (PROMETHEUS_CONFIG, PROMETHEUS_RULES)}),
                Service(GRAFANA_SERVICE, grafana,
                        {k: files[k] for k in (GRAFANA_DATASOURCES, GRAFANA_DASHBOARDS, GRAFANA_DASHBOARD)})]
    return services, [PROMETHEUS_VOLUME], files


def scrape_annotations(port: int) -> dict[str, str]:
    """The pod annotations that point Prometheus' Kubernetes pod discovery at a lane's `/metrics`."""
    return dict(zip(SCRAPE_ANNOTATIONS, ("true", str(port), "/metrics")))
