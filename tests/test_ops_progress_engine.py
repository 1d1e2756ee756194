"""Start-up progress of `up`, `swap` and `profile` against a real Docker engine.

The same private dockerd and busybox stand-in as tests/test_ops_engine.py. The stand-in plays a
script of start-up lines (STANDIN_PHASES): the lines vLLM 0.33, uvicorn and the runtime print,
written here by hand from their source (tests/test_startup_log_contract.py pins the fixed parts
to that source), with pauses between them. The agent lane's image is served by a registry on
loopback (tests/docker_support/registry.py), so the first `up` really pulls it through Compose.

No assertion on how fast anything is, only bounds a broken implementation cannot meet: a
failure must end the wait long before its timeout (600 s asked, 150 s allowed), and with a 1 s
heartbeat no 8 s silence may reach the terminal.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from docker_support.fixtures import docker_engine  # noqa: F401
from docker_support.project import TestProject, make_project
from docker_support.registry import LocalRegistry
from docker_support.standin import build_standin_image
from expert_residency.formats import (
    StartupReport,
    format_report_line,
    load_histogram,
    load_rowmap,
    report_for_rowmap,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

IMAGE = "vllm/vllm-openai:v0.33.0"
SILENT_S = 8          # the warm-up says nothing for this long
HEARTBEAT_S = 1       # RECIPEGEN_HEARTBEAT_S for these tests
ENGINE = "(EngineCore_DP0 pid=61) "


def _boot_script(report_line: str, *, silent_s: float) -> str:
    """A start as vLLM 0.33 logs it (file:line tags from the 0.33.0 source), the runtime's
    report in the middle; tqdm bars as carriage-return updates."""
    return "\n".join([
        "say INFO 12-01 10:00:01 [utils.py:325] vLLM API server version 0.33.0",
        f"say {ENGINE}INFO 12-01 10:00:05 [gpu_model_runner.py:4979] Starting to load model "
        "/models/dsv41-flash-mxfp4...",
        f"bar {ENGINE}Loading safetensors checkpoint shards:  50% Completed | 23/46 [00:01<00:01, 20.0it/s]",
        "sleep 1",
        f"bar {ENGINE}Loading safetensors checkpoint shards: 100% Completed | 46/46 [00:02<00:00, 20.0it/s]",
        f"say {ENGINE}INFO 12-01 10:05:01 [default_loader.py:507] Loading weights took 301.22 seconds",
        "sleep 1",
        f"err {report_line}",
        # the engine copies stdout and stderr separately: a second between the runtime's line
        # (stderr) and vLLM's next (stdout) keeps their order in the log
        "sleep 1",
        f"say {ENGINE}INFO 12-01 10:06:02 [gpu_model_runner.py:5089] Model loading took 210.4 GiB "
        "memory and 362.512312 seconds",
        f"say {ENGINE}INFO 12-01 10:06:40 [gpu_worker.py:773] Available KV cache memory: 4.9 GiB",
        f"say {ENGINE}INFO 12-01 10:06:40 [kv_cache_utils.py:1149] GPU KV cache size: 2,538,240 "
        "tokens, Maximum concurrency for 1,048,576 tokens per request: 2.42x",
        f"sleep {silent_s}",
        f"bar {ENGINE}Capturing CUDA graphs (decode, FULL):  50%|#####     | 34/67 [00:01<00:01, 30.1it/s]",
        "sleep 1",
        f"bar {ENGINE}Capturing CUDA graphs (decode, FULL): 100%|##########| 67/67 [00:02<00:00, 30.1it/s]",
        f"say {ENGINE}INFO 12-01 10:20:01 [gpu_model_runner.py:6517] Graph capturing finished in "
        "75 secs, took 1.25 GiB",
        f"say {ENGINE}INFO 12-01 10:20:02 [core.py:413] init engine (profile, create kv cache, "
        "warmup model) took 812.44 s",
        "say (APIServer pid=1) INFO:     Started server process [1]",
        "say (APIServer pid=1) INFO:     Application startup complete.",
    ]) + "\n"


OOM_SCRIPT = "\n".join([
    f"say {ENGINE}INFO 12-01 10:00:05 [gpu_model_runner.py:4979] Starting to load model /models/x...",
    "sleep 1",
    # logger.exception("EngineCore failed to start.") (v1/engine/core.py), then its traceback
    f"say {ENGINE}ERROR 12-01 10:00:09 [core.py:1584] EngineCore failed to start.",
    f"say {ENGINE}ERROR 12-01 10:00:09 [core.py:1584] Traceback (most recent call last):",
    f'say {ENGINE}ERROR 12-01 10:00:09 [core.py:1584]   File "/usr/local/lib/python3.12/dist-packages/'
    'vllm/v1/worker/gpu_worker.py", line 402, in determine_available_memory',
    f"say {ENGINE}ERROR 12-01 10:00:09 [core.py:1584] torch.OutOfMemoryError: CUDA out of memory. "
    "Tried to allocate 7.50 GiB. GPU 0 has a total capacity of 139.72 GiB of which 2.06 GiB is free.",
    # a wedged engine: the process stays, nothing serves; only the log says it is over
    "hang",
]) + "\n"


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: list[tuple[float, str]]    # (seconds since the command started, line)
    seconds: float

    @property
    def err(self) -> str:
        return "\n".join(line for _, line in self.stderr)


class Ops:
    def __init__(self, project: TestProject, env: dict[str, str], override: Path) -> None:
        self.project, self.env, self.override = project, env, override

    def __call__(self, *args: str, extra: Path | None = None, timeout: float = 700) -> Run:
        """`python -m recipegen ARGS -f override [-f extra]`, stderr read line by line as it comes."""
        argv = [sys.executable, "-m", "recipegen", *args, "-f", str(self.override)]
        if extra is not None:
            argv += ["-f", str(extra)]
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=self.project.root, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, bufsize=1)
        lines: list[tuple[float, str]] = []
        out: list[str] = []

        def read_err() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append((time.monotonic() - t0, line.rstrip("\n")))

        def read_out() -> None:
            assert proc.stdout is not None
            out.append(proc.stdout.read())

        readers = [threading.Thread(target=read_err), threading.Thread(target=read_out)]
        for r in readers:
            r.start()
        try:
            rc = proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
            for r in readers:
                r.join(timeout=10)
        return Run(rc, "".join(out), lines, time.monotonic() - t0)

    def extra(self, name: str, text: str) -> Path:
        path = self.project.root / f"{name}.yaml"
        path.write_text(text)
        return path


_LINE = re.compile(r"^(lane-[\w-]+) \(((?:\d+ h )?(?:\d+ min )?\d+ s|\d+ h \d+ min)\): (.*)$")


def _seconds(text: str) -> int:
    total = 0
    for value, unit in re.findall(r"(\d+) (h|min|s)", text):
        total += int(value) * {"h": 3600, "min": 60, "s": 1}[unit]
    return total


def _progress(run: Run, service: str) -> list[tuple[float, int, str]]:
    """(arrival, elapsed the line states, message) of `service`'s progress lines, in order."""
    found = []
    for arrived, line in run.stderr:
        m = _LINE.match(line)
        if m and m.group(1) == service:
            found.append((arrived, _seconds(m.group(2)), m.group(3)))
    return found


def _index(lines: list[tuple[float, int, str]], prefix: str) -> int:
    for i, (_, _, text) in enumerate(lines):
        if text.startswith(prefix):
            return i
    raise AssertionError(f"no progress line starting {prefix!r} in:\n" + "\n".join(t for _, _, t in lines))


@pytest.fixture(scope="module")
def ops(docker_engine, tmp_path_factory):  # noqa: F811
    import docker

    project = make_project(tmp_path_factory.mktemp("progress") / "proj")
    client = docker.DockerClient(base_url=docker_engine.host)
    build_standin_image(client, [IMAGE])
    registry = LocalRegistry("recipegen-test/vllm-openai", "v0.33.0", pace_s=3).start()
    from recipegen.load.recipe import load_recipe

    loaded = load_recipe(project.recipe)
    agent_map = load_rowmap(project.root / "recipes/maps/dsv41-flash/agent.rowmap")
    report = report_for_rowmap(agent_map, rank=0, mode="residency", vllm_version="0.33.0",
                               runtime_version="0.1.0", bytes_per_expert=loaded.recipe.model.expert_bytes,
                               world_size=1, lane="agent", traffic_class="agent")
    data = project.standin_dir
    (data / "phases-boot.txt").write_text(_boot_script(format_report_line(report), silent_s=SILENT_S))
    (data / "phases-quick.txt").write_text(_boot_script(format_report_line(report), silent_s=0))
    (data / "phases-oom.txt").write_text(OOM_SCRIPT)
    counting = StartupReport(rank=0, mode="count-only", vllm_version="0.33.0", runtime_version="0.1.0",
                             world_size=1, lane="agent", traffic_class="agent")
    (data / "phases-count.txt").write_text(_boot_script(format_report_line(counting), silent_s=0))
    (data / "count.hist").write_bytes((project.root / "recipes/profiles/dsv41-flash/math.hist").read_bytes())
    env = docker_engine.env()
    env["RECIPEGEN_MODELS_DIR"] = str(project.root / "models")
    env["RECIPEGEN_HEARTBEAT_S"] = str(HEARTBEAT_S)
    runner = Ops(project, env, project.write_override())
    runner.registry, runner.report = registry, report  # type: ignore[attr-defined]
    yield runner
    compose = project.out_dir / "compose.yaml"
    if compose.is_file():
        from recipegen.ops.compose import ComposeProject

        ComposeProject(project.out_dir, [compose, runner.override], env=env).down(timeout_s=5)
    registry.stop()
    client.close()


def _phases_override(ops: Ops, name: str, phases: dict[str, str], *, fail: str = "") -> Path:
    body = ["services:"]
    for service, script in phases.items():
        body += [f"  {service}:", f"    image: {ops.registry.image}", "    environment:",  # type: ignore[attr-defined]
                 f'      STANDIN_PHASES: "{script}"']
        if fail:
            body.append(f'      STANDIN_FAIL_CLASSES: "{fail}"')
    return ops.extra(name, "\n".join(body) + "\n")


def test_up_pulls_through_compose_then_shows_each_phase_with_heartbeats(ops):
    extra = _phases_override(ops, "boot", {"lane-agent": "boot"})
    run = ops("up", "opstest", "agent", "--wait-timeout", "600", extra=extra)
    assert run.returncode == 0, run.stdout + run.err
    assert "lane-agent: healthy after" in run.stdout          # the summary stays on stdout
    lines = _progress(run, "lane-agent")
    texts = [t for _, _, t in lines]
    # Compose's own pull lines, passed through: the image is pulled from the registry
    assert any(t.startswith("Compose:") and t.rstrip().endswith("Pulling") for t in texts), texts
    assert any(t.startswith("Compose:") and "Downloading [" in t for t in texts), texts
    assert any(t.startswith("Compose:") and t.rstrip().endswith("Pulled") for t in texts), texts
    assert any(p.startswith("GET /v2/recipegen-test/vllm-openai/blobs/") for p in ops.registry.pulls)
    # the phases, in order, each once
    order = ["container started; vLLM is starting",
             "loading weights",
             "re-homing experts into the hot and cold banks (weights read in 301.2 s)",
             "the runtime's start-up report: rank 0 of 1, mode residency",
             "profiling memory and sizing the KV cache (the model takes 210.4 GiB of GPU memory)",
             "warming up: tuning kernels and compiling (KV cache: 2,538,240 tokens; room for 2.42 "
             "requests of the maximum length, 1,048,576 tokens, at once)",
             "capturing CUDA graphs",
             "starting the API server (graphs captured in 75 s, taking 1.25 GiB)",
             "engine ready after 812.4 s of profiling and warm-up",
             "API server up; waiting for the health check",
             "healthy"]
    at = [_index(lines, p) for p in order]
    assert at == sorted(at), list(zip(order, at))
    pulled = max(i for i, t in enumerate(texts) if t.startswith("Compose:") and "Pulled" in t)
    assert pulled < at[0]
    for phase in order[1:]:
        assert sum(t.startswith(phase) for t in texts) == 1, phase
    report = ops.report
    report_line = texts[at[3]]
    assert f"hot bank {report.hot_bytes / 2**30:,.2f} GiB in GPU memory" in report_line
    assert f"cold bank {report.cold_bytes / 2**30:,.2f} GiB in pinned host memory" in report_line
    assert f"row map content hash {report.content_hash[:12]}" in report_line
    # elapsed times: never backwards, and the silent warm-up shows in them
    elapsed = [lines[i][1] for i in at]
    assert elapsed == sorted(elapsed), elapsed
    assert elapsed[6] - elapsed[5] >= SILENT_S - 1, elapsed
    # heartbeats during the silent warm-up: the phase, the time in it growing, the last line
    beats = [(e, t) for _, e, t in lines[at[5] + 1:at[6]] if t.startswith("still warming up: tuning kernels")]
    assert len(beats) >= SILENT_S // 2, texts[at[5]:at[6] + 1]
    in_phase = [_seconds(t.split(": ", 1)[1].split(" in this phase")[0]) for _, t in beats]
    assert in_phase == sorted(in_phase) and in_phase[-1] >= SILENT_S // 2, in_phase
    assert "last log line: " in beats[0][1] and "Maximum concurrency" in beats[0][1]
    # the cadence as the terminal saw it: no gap longer than a few heartbeats, from the first
    # line to "healthy" (an 8 s silence without the heartbeat)
    arrivals = [a for a, _, _ in lines]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert max(gaps) < SILENT_S - 2, max(gaps)


def test_fatal_line_stops_the_wait_long_before_its_timeout_and_prints_the_tail(ops):
    extra = _phases_override(ops, "oom", {"lane-prose": "oom"})
    run = ops("up", "opstest", "prose", "--wait-timeout", "600", extra=extra)
    assert run.returncode == 2, run.stdout + run.err
    assert run.seconds < 150, run.seconds                    # asked to wait up to 600 s
    err = run.err
    # the specific cause outranks the generic "EngineCore failed to start." printed before it
    assert "lane-prose did not start: out of GPU memory; its log says: " in err
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.50 GiB" in err
    lines = _progress(run, "lane-prose")
    failed = _index(lines, "start-up failed: out of GPU memory")
    assert _index(lines, "loading weights") < failed
    tail = [line for _, line in run.stderr if line.startswith("  | ")]
    assert any("EngineCore failed to start." in t for t in tail)
    assert any("Traceback (most recent call last):" in t for t in tail)
    assert any("torch.OutOfMemoryError" in t for t in tail)
    assert "stop its restarts" in err and "logs lane-prose" in err
    # the failure was seen in the log, not by Compose giving up: the container still runs
    import docker

    client = docker.DockerClient(base_url=ops.env["DOCKER_HOST"])
    found = client.containers.list(filters={"label": ["com.docker.compose.project=opstest",
                                                       "com.docker.compose.service=lane-prose"]})
    assert len(found) == 1 and found[0].status == "running"
    found[0].stop(timeout=1)
    client.close()


def test_swap_to_a_refused_class_stops_quickly_and_rolls_back(ops):
    base = _phases_override(ops, "quick", {"lane-agent": "quick"})
    run = ops("up", "opstest", "agent", "--wait-timeout", "600", extra=base)
    assert run.returncode == 0, run.stdout + run.err
    failing = _phases_override(ops, "refuse", {"lane-agent": "quick"}, fail="math")
    run = ops("swap", "opstest", "agent", "--class", "math", "--wait-timeout", "600", extra=failing)
    assert run.returncode == 1, run.stdout + run.err
    assert run.seconds < 150, run.seconds
    assert "rolled back" in run.stdout and "class agent" in run.stdout
    err = run.err
    assert "start-up failed: the expert residency runtime refused to start: EXPERT_RESIDENCY_REFUSED: " \
        "row map /etc/expert-residency/agent-math.rowmap has content_hash" in err
    assert any(line.startswith("  | EXPERT_RESIDENCY_REFUSED: ") for _, line in run.stderr)
    # the rollback's own start, with its phases, ends healthy
    lines = _progress(run, "lane-agent")
    failed = _index(lines, "start-up failed")
    rest = lines[failed + 1:]
    assert _index(rest, "re-homing experts") < _index(rest, "healthy")
    assert "active_class: agent" in ops.project.recipe.read_text()


def test_profile_shows_the_profile_boot_and_the_lane_restart(ops, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Write about rivers."}\n')
    extra = _phases_override(ops, "profile", {"lane-agent": "quick", "lane-agent-profile": "count"})
    run = ops("profile", "opstest", "agent", "--class", "agent", "--prompts", str(prompts), extra=extra)
    assert run.returncode == 0, run.stdout + run.err
    counted = load_histogram(ops.project.standin_dir / "count.hist")
    saved = load_histogram(ops.project.root / "recipes/profiles/dsv41-flash/agent.hist")
    assert (saved.counts == counted.counts).all()
    boot = _progress(run, "lane-agent-profile")
    # count-only: no re-homing, vLLM finishes loading the model itself
    assert _index(boot, "loading weights") < _index(boot, "finishing the model load (weights read in")
    assert _index(boot, "the runtime's start-up report: rank 0 of 1, mode count-only") < _index(boot, "healthy")
    assert not any(t.startswith("re-homing") for _, _, t in boot)
    restart = _progress(run, "lane-agent")
    assert _index(restart, "re-homing experts") < _index(restart, "healthy")


def test_a_followed_log_survives_silence_and_a_cut_stream_resumes_without_loss_or_repeat(docker_engine):  # noqa: F811
    """vLLM can be silent for minutes: the engine client's 2 s socket timeout here must not end
    the follow (the docker SDK lifts it for streams). A stream cut anyway (here: closed under the
    reader) resumes after the newest entry read, nothing lost or read twice."""
    import queue

    import docker
    from docker_support.standin import STANDIN_TAG

    from recipegen.ops.startup import _Boot, _LogFollower

    build_standin_image(docker.DockerClient(base_url=docker_engine.host), [])
    client = docker.DockerClient(base_url=docker_engine.host, timeout=2)
    script = "for i in 1 2 3; do echo line-$i; echo err-$i >&2; sleep 5; done; echo last"
    container = client.containers.run(STANDIN_TAG, entrypoint=["/bin/sh", "-c", script], detach=True,
                                      network_mode="none")
    try:
        state = client.api.inspect_container(container.id)["State"]
        events: queue.Queue = queue.Queue()
        follower = _LogFollower(client, _Boot(container.id, state["StartedAt"], None), events)
        follower.start()
        seen, deadline, cut = [], time.monotonic() + 120, False
        while time.monotonic() < deadline:
            kind, _, text = events.get(timeout=deadline - time.monotonic())
            if kind == "log_end":
                break
            seen.append(text)
            if not cut and {"line-2", "err-2"} <= set(seen):
                follower._stream.close()     # the stream ends; the follower is not stopping
                cut = True
        assert cut
        assert sorted(seen) == sorted([f"line-{i}" for i in (1, 2, 3)] + [f"err-{i}" for i in (1, 2, 3)]
                                      + ["last"]), seen
        assert seen[-1] == "last"
    finally:
        container.remove(force=True)
        client.close()
