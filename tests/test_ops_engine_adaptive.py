"""An adaptive lane against a real Docker engine: the rendered service carries the adaptive
settings and its class histograms as priors; `status`, `drift` and `rowmap save-live` read the
live map its dumps carry.

Same private dockerd and busybox stand-in as tests/test_ops_engine.py; the stand-in dumps a
histogram written by the runtime's own dump writer (`HistogramDumper` with a live-map source)
and the live map beside it, as the runtime does, each under its own snapshot's name.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from docker_support.fixtures import docker_engine  # noqa: F401
from docker_support.project import make_project
from docker_support.standin import build_standin_image
from expert_residency.core.dump import DumpConfig, HistogramDumper
from expert_residency.formats import load_histogram, load_rowmap
from live_map_support import FixedCounter, FixedLivePolicy, exchanged_map

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

IMAGE = "vllm/vllm-openai:v0.33.0"


@pytest.fixture(scope="module")
def lane(docker_engine, tmp_path_factory):  # noqa: F811
    import docker

    project = make_project(tmp_path_factory.mktemp("adaptive") / "proj")
    text = project.recipe.read_text()
    anchor = "      hot_experts_per_layer: 295"
    first = text.index(anchor) + len(anchor)
    first = text.index("\n", first) + 1
    project.recipe.write_text(text[:first] + "      adaptive: {swaps_per_layer: 4, priors: [prose, math]}\n"
                              + text[first:])
    profiles = project.root / "recipes" / "profiles" / "dsv41-flash"
    agent = load_rowmap(project.root / "recipes" / "maps" / "dsv41-flash" / "agent.rowmap")
    live = exchanged_map(agent, layers=3, pairs=2, barriers=4)
    written = tmp_path_factory.mktemp("dump")
    path = HistogramDumper(FixedCounter(load_histogram(profiles / "prose.hist")),
                           DumpConfig(written, 0.0, "agent", "agent", "residency"),
                           live_map=FixedLivePolicy(live, window_cold_share=0.0234, prior="prose")).dump_now()
    data = project.standin_dir
    (data / "live-agent.hist").write_bytes(path.read_bytes())
    # the stand-in writes both under its own snapshot's name, with that snapshot's meta
    (data / "livemap-agent.rowmap").write_bytes((written / (path.name[:-len(".hist")] + ".rowmap")).read_bytes())
    (data / "kv_tokens-lane-agent").write_text("2538240")

    client = docker.DockerClient(base_url=docker_engine.host)
    build_standin_image(client, [IMAGE])
    env = docker_engine.env()
    env["RECIPEGEN_MODELS_DIR"] = str(project.root / "models")
    override = project.write_override()

    def ops(*args: str, with_override: bool = False) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "recipegen", *args] + (["-f", str(override)] if with_override else [])
        return subprocess.run(argv, cwd=project.root, env=env, capture_output=True, text=True, timeout=300)

    up = ops("up", "opstest", "agent", with_override=True)
    assert up.returncode == 0, up.stdout + up.stderr
    yield project, ops, client, agent, live
    from recipegen.ops.compose import ComposeProject

    ComposeProject(project.out_dir, [project.out_dir / "compose.yaml", override], env=env).down(timeout_s=5)
    client.close()


def test_the_running_lane_gets_the_settings_and_the_priors(lane):
    project, ops, client, *_ = lane
    found = client.containers.list(filters={"label": ["com.docker.compose.project=opstest",
                                                       "com.docker.compose.service=lane-agent"]})
    assert len(found) == 1
    container = found[0]
    env = dict(item.split("=", 1) for item in container.attrs["Config"]["Env"])
    assert env["EXPERT_RESIDENCY_ADAPTIVE"].startswith("interval=32,swaps_per_layer=4,")  # default interval
    priors = env["EXPERT_RESIDENCY_ADAPTIVE_PRIORS"].split(",")
    assert priors == ["/etc/expert-residency/agent-prose.hist", "/etc/expert-residency/agent-math.hist"]
    from recipegen.ops.engine import list_dir

    mounted = list_dir(client, container.id, "/etc/expert-residency", keep=None)
    profiles = project.root / "recipes" / "profiles" / "dsv41-flash"
    assert mounted["agent-prose.hist"] == (profiles / "prose.hist").read_bytes()
    assert mounted["agent-math.hist"] == (profiles / "math.hist").read_bytes()


def test_drift_shows_the_live_map(lane):
    project, ops, _client, agent, live = lane
    result = ops("drift", "opstest", "agent", "--wait", "30", "--json")
    assert result.returncode == 1, result.stdout + result.stderr   # prose traffic on the agent map: drift
    doc = json.loads(result.stdout)
    figures = doc["live_map"]
    assert figures["content_hash"] == live.content_hash()
    assert figures["recipe_content_hash"] == agent.content_hash() and figures["matches_recipe"] is False
    assert (figures["swaps"], figures["barriers"], figures["cold_share_now"]) == (6, 4, 0.0234)
    from recipegen.rowmap import cold_share

    traffic = load_histogram(project.root / "recipes" / "profiles" / "dsv41-flash" / "prose.hist")
    assert figures["cold_share_live_map"] == pytest.approx(cold_share(live, traffic))
    text = ops("drift", "opstest", "agent", "--wait", "30")
    assert f"live map {live.content_hash()[:12]} ≠ the recipe's {agent.content_hash()[:12]}" in text.stdout
    assert "cold share now 2.34%" in text.stdout and "6 swaps in 4 barriers" in text.stdout
    # the live map landed in the lane's host dump folder beside the histogram
    assert list((project.out_dir / "dumps" / "agent").glob("agent__agent__residency__*.rowmap"))


def test_status_shows_the_live_map(lane):
    _project, ops, _client, agent, live = lane
    result = ops("status", "opstest", "--json")
    assert result.returncode == 0, result.stderr
    lanes = {s["service"]: s for s in json.loads(result.stdout)}
    figures = lanes["lane-agent"]["live_map"]
    assert figures["content_hash"] == live.content_hash() and figures["swaps"] == 6
    assert figures["recipe_content_hash"] == agent.content_hash()
    text = ops("status", "opstest")
    assert f"lane-agent: live map {live.content_hash()[:12]}" in text.stdout


def test_save_live_from_the_lanes_dump_folder(lane):
    project, ops, _client, _agent, live = lane
    result = ops("rowmap", "save-live", "opstest", "agent", "--class", "math")
    assert result.returncode == 0, result.stdout + result.stderr
    saved = load_rowmap(project.root / "recipes" / "maps" / "dsv41-flash" / "math.rowmap")
    assert saved.content_hash() == live.content_hash()
    assert saved.provenance["builder"] == "adaptive" and saved.provenance["class"] == "math"
    check = ops("check", "budgets", "opstest")
    assert check.returncode == 0, check.stdout + check.stderr
