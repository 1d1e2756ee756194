"""up / status / swap / verify / drift / profile against a real Docker engine.

One private dockerd (tests/docker_support), the busybox stand-in tagged as the rendered image
`vllm/vllm-openai:v0.33.0`, and a two-lane variant of the reference recipe rendered by the real
`recipegen render`, started by the real Compose v2 binary with a test override that only drops
what the stand-in/sandbox cannot do (GPU reservation, bridge network, memlock ulimit) and shortens
the health-check interval. The commands run as a user runs them: `python -m recipegen …`.

The tests build on each other in file order (a lane must be up before it is swapped); each
asserts its own preconditions so a failure points at the step that broke.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from docker_support.fixtures import docker_engine  # noqa: F401
from docker_support.project import TestProject, make_project
from docker_support.standin import build_standin_image
from expert_residency.formats import (
    Histogram,
    format_report_line,
    load_histogram,
    load_rowmap,
    report_for_rowmap,
    save_histogram,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

IMAGE = "vllm/vllm-openai:v0.33.0"
WRONG_KV_TOKENS = 2_000_000     # the prose lane's stand-in reports this instead of the ledger's
# What the agent lane's stand-in reports as vLLM's KV capacity, by hand and not from the ledger:
# the reference lane's measured 4.9 GiB pool × 0.518M tokens per GiB (the field report "Should a
# GB300 Prefetch Its Cold Experts? Mostly No, and What to Build Instead", 2026-10-23, section 4)
# = 2,538,200 tokens, in whole 256-token blocks. verify must find the ledger agreeing with it.
AGENT_KV_TOKENS = 2_538_200 // 256 * 256


class Ops:
    """Runs `python -m recipegen` in the test project against the private engine."""

    def __init__(self, project: TestProject, env: dict[str, str], override: Path) -> None:
        self.project, self.env, self.override = project, env, override

    def __call__(self, *args: str, override: bool = False, extra: list[Path] | None = None,
                 timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "recipegen", *args]
        if override:
            argv += ["-f", str(self.override)]
            for e in extra or []:
                argv += ["-f", str(e)]
        return subprocess.run(argv, cwd=self.project.root, env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def status(self) -> dict[str, dict]:
        result = self("status", "opstest", "--json")
        assert result.returncode == 0, result.stderr
        return {s["service"]: s for s in json.loads(result.stdout)}


def _write_standin_data(project: TestProject) -> None:
    """What the stand-in prints and dumps, computed from the project's own files: a residency
    report per class from that class's row map (as the runtime would), vLLM's KV capacity per
    lane (AGENT_KV_TOKENS, worked out by hand; the prose lane wrong on purpose), and live
    counters."""
    from recipegen.load.recipe import load_recipe

    loaded = load_recipe(project.recipe)
    data = project.standin_dir
    for (lane, cls), rowmap in loaded.rowmaps.items():
        if lane != "agent":
            continue
        report = report_for_rowmap(rowmap, rank=0, mode="residency", vllm_version="0.33.0",
                                   runtime_version="0.1.0",
                                   bytes_per_expert=loaded.recipe.model.expert_bytes,
                                   world_size=1, lane=lane, traffic_class=cls)
        (data / f"report-{cls}.txt").write_text(
            "INFO 11-29 10:00:00 [worker_runtime.py:88] " + format_report_line(report) + "\n")
    (data / "kv_tokens-lane-agent").write_text(str(AGENT_KV_TOKENS))
    (data / "kv_tokens-lane-prose").write_text(str(WRONG_KV_TOKENS))
    profiles = project.root / "recipes" / "profiles" / "dsv41-flash"
    # live counters: the math lane class sees prose traffic (a mismatch), prose sees its own
    (data / "live-math.hist").write_bytes((profiles / "prose.hist").read_bytes())
    # the prose lane: a long history of prose traffic (snapshot 1), then agent traffic arrives
    # (snapshot 2 = the same history + the agent histogram): cumulative still fits, the window not
    prose, agent = load_histogram(profiles / "prose.hist"), load_histogram(profiles / "agent.hist")
    history = Histogram(prose.moe_layer_indices, prose.num_experts, prose.counts * 20,
                        tokens=prose.tokens * 20, top_k=prose.top_k, source="stand-in")
    save_histogram(history, data / "live-prose.hist")
    save_histogram(Histogram(prose.moe_layer_indices, prose.num_experts,
                             history.counts + agent.counts, tokens=history.tokens + agent.tokens,
                             top_k=prose.top_k, source="stand-in"), data / "live-prose-2.hist")
    (data / "live-agent.hist").write_bytes((profiles / "agent.hist").read_bytes())
    (data / "count.hist").write_bytes((profiles / "math.hist").read_bytes())


@pytest.fixture(scope="module")
def ops(docker_engine, tmp_path_factory):  # noqa: F811
    import docker

    project = make_project(tmp_path_factory.mktemp("ops") / "proj")
    client = docker.DockerClient(base_url=docker_engine.host)
    build_standin_image(client, [IMAGE])
    _write_standin_data(project)
    env = docker_engine.env()
    env["RECIPEGEN_MODELS_DIR"] = str(project.root / "models")
    runner = Ops(project, env, project.write_override())
    yield runner
    compose = project.out_dir / "compose.yaml"
    if compose.is_file():
        from recipegen.ops.compose import ComposeProject

        ComposeProject(project.out_dir, [compose, runner.override], env=env).down(timeout_s=5)
    client.close()


def _container(env: dict[str, str], service: str):
    import docker

    client = docker.DockerClient(base_url=env["DOCKER_HOST"])
    found = client.containers.list(all=True, filters={"label": [
        "com.docker.compose.project=opstest", f"com.docker.compose.service={service}"]})
    assert len(found) == 1, [c.name for c in found]
    return found[0]


def test_up_starts_two_lanes_in_order_behind_health_checks(ops):
    result = ops("up", "opstest", "agent", "prose", override=True)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "rendered" in out                      # the project had never been rendered
    assert out.index("lane-agent: starting") < out.index("lane-agent: healthy") \
        < out.index("lane-prose: starting") < out.index("lane-prose: healthy")
    agent, prose = _container(ops.env, "lane-agent"), _container(ops.env, "lane-prose")
    assert agent.attrs["State"]["Health"]["Status"] == "healthy"
    assert prose.attrs["State"]["Health"]["Status"] == "healthy"
    # one after another: prose started only once agent had passed a health check
    agent_healthy = min(h["End"] for h in agent.attrs["State"]["Health"]["Log"] if h["ExitCode"] == 0)
    assert prose.attrs["State"]["StartedAt"] > agent_healthy[:26] or \
        prose.attrs["State"]["StartedAt"] > agent.attrs["State"]["StartedAt"]
    # the rendered healthcheck ran (python3 … urlopen) and the rendered argv reached the engine
    assert "--port" in prose.attrs["Args"] and str(ops.project.ports["prose"]) in prose.attrs["Args"]


def test_up_again_is_a_no_op_for_current_lanes(ops):
    before = _container(ops.env, "lane-agent").id
    result = ops("up", "opstest", "agent", override=True)
    assert result.returncode == 0, result.stderr
    assert "rendered" not in result.stdout
    assert _container(ops.env, "lane-agent").id == before


def test_status_reports_healthy_current_lanes_with_their_hashes(ops):
    lanes = ops.status()
    assert set(lanes) == {"lane-agent", "lane-prose"}
    agent_map = load_rowmap(ops.project.root / "recipes/maps/dsv41-flash/agent.rowmap")
    prose_map = load_rowmap(ops.project.root / "recipes/maps/dsv41-flash/prose.rowmap")
    for service, cls, rowmap in (("lane-agent", "agent", agent_map), ("lane-prose", "prose", prose_map)):
        s = lanes[service]
        assert (s["health"], s["state"], s["rendering"]) == ("healthy", "running", "current")
        assert s["traffic_class"] == cls
        assert s["content_hash"] == rowmap.content_hash()
        assert s["shape_hash"] == rowmap.shape_hash()
        assert s["uptime_s"] is not None and s["uptime_s"] >= 0
    text = ops("status")
    row = next(line for line in text.stdout.splitlines() if line.startswith("lane-agent "))
    assert row.split()[-1] == "current", row
    # the table's shorthand is explained under it
    assert "content / shape hash: sha256 of a row map's assignment" in text.stdout
    assert "RENDERING: current when the container runs its service as rendered now" in text.stdout


def test_verify_agrees_with_the_ledger(ops):
    result = ops("verify", "opstest", "agent")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "agrees with the ledger" in result.stdout
    assert "206.61 GiB" in result.stdout and "62.33 GiB" in result.stdout
    doc = json.loads(ops("verify", "opstest", "agent", "--json").stdout)
    kv = next(r for r in doc["rows"] if r["figure"] == "KV cache tokens")
    assert kv["ok"] and kv["observed"] == f"{AGENT_KV_TOKENS:,}", kv


def test_verify_fails_on_a_wrong_kv_figure(ops):
    result = ops("verify", "opstest", "prose", "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    failed = {r["figure"] for r in doc["rows"] if not r["ok"]}
    # the prose lane's stand-in reports no residency line and a KV pool 21% short
    assert "KV cache tokens" in failed
    kv = next(r for r in doc["rows"] if r["figure"] == "KV cache tokens")
    assert kv["observed"] == f"{WRONG_KV_TOKENS:,}" and "metrics" in kv["note"]


def test_swap_recreates_only_that_container_with_new_hashes(ops):
    agent_before, prose_before = _container(ops.env, "lane-agent"), _container(ops.env, "lane-prose")
    result = ops("swap", "opstest", "agent", "--class", "math", "--json", override=True)
    assert result.returncode == 0, result.stdout + result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["ok"] and not outcome["rolled_back"]
    assert (outcome["previous_class"], outcome["new_class"]) == ("agent", "math")
    assert outcome["downtime_s"] > 0 and "downtime" in outcome["message"]
    agent_after, prose_after = _container(ops.env, "lane-agent"), _container(ops.env, "lane-prose")
    assert agent_after.id != agent_before.id
    assert prose_after.id == prose_before.id
    assert prose_after.attrs["State"]["StartedAt"] == prose_before.attrs["State"]["StartedAt"]
    math_map = load_rowmap(ops.project.root / "recipes/maps/dsv41-flash/math.rowmap")
    labels = agent_after.labels
    assert labels["io.recipegen.class"] == "math"
    assert labels["io.recipegen.content-hash"] == math_map.content_hash()
    assert labels["io.recipegen.config-hash"] != agent_before.labels["io.recipegen.config-hash"]
    assert "active_class: math" in ops.project.recipe.read_text()
    assert agent_after.attrs["State"]["Health"]["Status"] == "healthy"
    assert ops.status()["lane-agent"]["rendering"] == "current"


def test_failing_swap_rolls_back_class_rendering_and_service(ops, tmp_path):
    failing = tmp_path / "fail.yaml"
    failing.write_text('services:\n  lane-agent:\n    environment:\n'
                       '      STANDIN_FAIL_CLASSES: "prose"\n')
    recipe_before = ops.project.recipe.read_text()
    compose_before = (ops.project.out_dir / "compose.yaml").read_bytes()
    prose_before = _container(ops.env, "lane-prose").id
    result = ops("swap", "opstest", "agent", "--class", "prose", "--wait-timeout", "20",
                 override=True, extra=[failing])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "rolled back" in result.stdout and "class math" in result.stdout
    assert ops.project.recipe.read_text() == recipe_before
    assert (ops.project.out_dir / "compose.yaml").read_bytes() == compose_before
    agent = _container(ops.env, "lane-agent")
    assert agent.labels["io.recipegen.class"] == "math"
    assert agent.attrs["State"]["Health"]["Status"] == "healthy"
    assert _container(ops.env, "lane-prose").id == prose_before


def test_drift_flags_a_mismatched_counter_and_names_the_better_class(ops):
    # lane agent serves the math map; its (stand-in) counter sees prose traffic
    result = ops("drift", "opstest", "agent", "--wait", "30", "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert doc["class"] == "math" and doc["drifted"]
    assert doc["better_class"] == "prose"
    assert doc["by_class"]["prose"] < doc["built_share"] + 0.02 < doc["live_share"]
    text = ops("drift", "opstest", "agent", "--wait", "30")
    assert "DRIFT" in text.stdout and "recipegen swap opstest agent --class prose" in text.stdout
    # the dump the runtime wrote on SIGUSR1 landed in the lane's host folder
    assert list((ops.project.out_dir / "dumps" / "agent").glob("agent__math__residency__*.hist"))


def test_drift_quiet_when_traffic_matches_the_map(ops):
    result = ops("drift", "opstest", "prose", "--wait", "30", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert not doc["drifted"] and doc["better_class"] is None
    assert doc["live_share"] == pytest.approx(doc["built_share"])


def test_drift_window_sees_recent_traffic_that_the_cumulative_counter_hides(ops):
    import time

    time.sleep(1.2)  # snapshot names have one-second resolution in the stand-in
    result = ops("drift", "opstest", "prose", "--wait", "30", "--window", "1", "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert doc["drifted"] and doc["better_class"] == "agent"
    # everything since start (history + the new agent traffic) would still pass
    prose_map = load_rowmap(ops.project.root / "recipes/maps/dsv41-flash/prose.rowmap")
    cumulative = load_histogram(ops.project.standin_dir / "live-prose-2.hist")
    from recipegen.rowmap import cold_share

    assert cold_share(prose_map, cumulative) - doc["built_share"] < 0.02 < doc["live_share"] - doc["built_share"]


def test_profile_boot_produces_a_histogram_and_a_map(ops, tmp_path):
    prompts = tmp_path / "prose.jsonl"
    prompts.write_text('{"prompt": "Write a paragraph about rivers."}\n'
                       '{"messages": [{"role": "user", "content": "And about lakes?"}]}\n')
    hist_path = ops.project.root / "recipes/profiles/dsv41-flash/prose.hist"
    map_path = ops.project.root / "recipes/maps/dsv41-flash/prose.rowmap"
    old_map = load_rowmap(map_path)
    prose_before = _container(ops.env, "lane-prose").id
    result = ops("profile", "opstest", "prose", "--class", "prose", "--prompts", str(prompts),
                 override=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "stopping it for the profile boot" in result.stdout
    counted = load_histogram(ops.project.standin_dir / "count.hist")
    saved = load_histogram(hist_path)
    assert np.array_equal(saved.counts, counted.counts)
    assert "count-only boot lane-prose-profile" in saved.source
    new_map = load_rowmap(map_path)
    assert new_map.hot_counts() == [295] * 40
    for row, (hot, cold) in enumerate(zip(new_map.hot, new_map.cold)):
        assert counted.counts[row, hot].min() >= counted.counts[row, cold].max()
    assert new_map.content_hash() != old_map.content_hash()
    assert new_map.shape_hash() == old_map.shape_hash()      # same shape: kernels reused
    assert "the previous map's bank shapes: the restart reuses the tuned kernels" in result.stdout
    # the lane is back, and its rendering is now stale: its class has a new map
    prose = _container(ops.env, "lane-prose")
    assert prose.id == prose_before and prose.attrs["State"]["Health"]["Status"] == "healthy"
    lanes = ops.status()
    assert lanes["lane-prose"]["rendering"] == "stale"
    assert "changed since the last render" in lanes["lane-prose"]["detail"]
    # the agent lane serves math, whose map did not change: it stays current
    assert lanes["lane-agent"]["rendering"] == "current"
    # `up` re-renders and recreates it with the new map
    result = ops("up", "opstest", "prose", override=True)
    assert result.returncode == 0, result.stderr
    lanes = ops.status()
    assert lanes["lane-prose"]["rendering"] == "current"
    assert lanes["lane-prose"]["content_hash"] == new_map.content_hash()


def test_multi_machine_recipe_runs_per_machine_folder(ops, tmp_path):
    """A lane spanning two boxes renders compose/<recipe>/<machine>/: `--machine` picks the
    folder of the box the engine runs on (both boxes share this one engine here)."""
    import re
    import shutil

    from docker_support.project import REPO, free_port

    root = tmp_path / "pp"
    (root / "recipes").mkdir(parents=True)
    text = (REPO / "recipes" / "dsv41-flash-gb300x2-pp2.yaml").read_text()
    port = free_port()
    (root / "recipes" / "pp.yaml").write_text(
        re.sub(r"(?m)^    port: \d+", f"    port: {port}",
               re.sub(r"(?m)^name: .*$", "name: pp", text, count=1)))
    shutil.copytree(ops.project.root / "models", root / "models")
    base = ("    deploy: !reset {}\n    network_mode: host\n    ports: !reset []\n"
            "    ulimits: !reset {}\n")
    overrides = {"station-a": root / "head.yaml", "station-b": root / "worker.yaml"}
    overrides["station-a"].write_text(f"services:\n  lane-agent:\n{base}"
                                      "    healthcheck:\n      interval: 1s\n")
    overrides["station-b"].write_text(f"services:\n  lane-agent-worker-1:\n{base}")
    env = dict(ops.env, RECIPEGEN_MODELS_DIR=str(root / "models"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "recipegen", *args], cwd=root, env=env,
                              capture_output=True, text=True, timeout=300)

    refused = run("up", "pp")
    assert refused.returncode == 2 and "--machine" in refused.stderr
    head = run("up", "pp", "--machine", "station-a", "-f", str(overrides["station-a"]))
    assert head.returncode == 0, head.stdout + head.stderr
    assert "lane-agent: healthy" in head.stdout
    worker = run("up", "pp", "agent", "-f", str(overrides["station-b"]), "--machine", "station-b")
    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert "lane-agent-worker-1: none" in worker.stdout     # headless: no health check, running
    assert (root / "compose/pp/station-a/compose.yaml").is_file()
    lanes = {s["service"]: s for s in json.loads(run("status", "pp", "--json").stdout)}
    assert set(lanes) == {"lane-agent", "lane-agent-worker-1"}
    assert lanes["lane-agent"]["health"] == "healthy"
    assert lanes["lane-agent-worker-1"]["state"] == "running"
    assert {s["rendering"] for s in lanes.values()} == {"current"}
    from recipegen.ops.compose import ComposeProject

    for machine in ("station-a", "station-b"):
        folder = root / "compose/pp" / machine
        ComposeProject(folder, [folder / "compose.yaml", overrides[machine]], env=env).down(timeout_s=5)
