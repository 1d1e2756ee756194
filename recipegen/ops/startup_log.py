"""What a lane's container log says about its start-up: the phase each known line begins, and the
lines that mean the start has failed. Pure: one line in, a verdict out; `ops.startup` feeds it the
log as it arrives.

Every marker is a fixed piece of text that vLLM 0.33.0, PyTorch, uvicorn or the expert residency
runtime prints, with the file that prints it (paths under the vLLM package unless said otherwise);
`tests/test_startup_log_contract.py` reads the unpacked 0.33.0 source (and the runtime's and the
CPU environment's uvicorn and torch) and fails when a literal is no longer there. A line matches a
marker when it contains the literal: logger prefixes (level, time, file, process) vary.

A vLLM 0.33 start, in log order (one API server, one engine core, one worker per GPU):
`Starting to load model` → (safetensors shard progress) → `Loading weights took` → the runtime
re-homes the experts and logs its start-up report, inside the loader → `Model loading took` →
memory profiling and `Available KV cache memory` → `GPU KV cache size: N tokens, Maximum
concurrency …` → warm-up, kernel tuning → `Capturing CUDA graphs` (progress bar) → `Graph
capturing finished` → `init engine (profile, create kv cache, warmup model) took` → uvicorn's
`Application startup complete.` → the health check passes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from expert_residency.formats import FormatError, parse_report_line
from expert_residency.formats.report import REPORT_TAG
from expert_residency.vllm_plugin.refusal import REFUSAL_TAG

from recipegen.common.units import GiB
from recipegen.ops.kvcapacity import kv_from_log


@dataclass(frozen=True)
class Source:
    """Where a literal is printed: `package` is `vllm`, `uvicorn`, `torch`, `expert_residency`
    (checked by the contract test) or `pytorch-c++` (PyTorch's C++ source, cited only)."""

    package: str
    path: str


@dataclass(frozen=True)
class Marker:
    key: str
    literal: str                 # the fixed text a line must contain
    sources: tuple[Source, ...]
    phase: str = ""              # the phase this line begins (in plain words)
    fatal: str = ""              # for a failure: what went wrong, in plain words
    rank: int = 0                # failures: a more specific reason outranks a generic one


# Start-up phases in the order vLLM goes through them. A line of an earlier (or the same) phase
# than the current one does not move the display back: every worker logs the same lines.
PHASES: tuple[Marker, ...] = (
    Marker("load", "Starting to load model",
           (Source("vllm", "v1/worker/gpu_model_runner.py"),
            Source("vllm", "v1/worker/cpu_model_runner.py")),
           phase="loading weights"),
    Marker("weights", "Loading weights took",
           (Source("vllm", "model_executor/model_loader/default_loader.py"),),
           phase="finishing the model load"),   # residency lanes: "re-homing", see phase_after
    Marker("report", REPORT_TAG + " v",
           (Source("expert_residency", "formats/report.py"),
            Source("expert_residency", "vllm_plugin/worker_runtime.py")),
           phase="finishing the model load"),
    Marker("loaded", "Model loading took",
           (Source("vllm", "v1/worker/gpu_model_runner.py"),
            Source("vllm", "v1/worker/gpu/model_runner.py")),
           phase="profiling memory and sizing the KV cache"),
    Marker("kv", "KV cache size: ",
           (Source("vllm", "v1/core/kv_cache_utils.py"),),
           phase="warming up: tuning kernels and compiling"),
    Marker("graphs", "Capturing CUDA graphs",
           (Source("vllm", "v1/worker/gpu_model_runner.py"),
            Source("vllm", "v1/worker/gpu/cudagraph_utils.py")),
           phase="capturing CUDA graphs"),
    Marker("graphs_done", "Graph capturing finished",
           (Source("vllm", "v1/worker/gpu_model_runner.py"),
            Source("vllm", "v1/worker/gpu/model_runner.py")),
           phase="starting the API server"),
    Marker("engine", "init engine (profile, create kv cache, warmup model) took",
           (Source("vllm", "v1/engine/core.py"),),
           phase="starting the API server"),
    Marker("api", "Application startup complete.",
           (Source("uvicorn", "lifespan/on.py"),),
           phase="API server up; waiting for the health check"),
)

RE_HOMING = "re-homing experts into the hot and cold banks"

# Lines that mean the start has failed: the wait stops instead of running to its timeout.
FATALS: tuple[Marker, ...] = (
    Marker("refused", REFUSAL_TAG + ":",
           (Source("expert_residency", "vllm_plugin/refusal.py"),),
           fatal="the expert residency runtime refused to start", rank=3),
    Marker("oom_load", "Failed to load model - not enough GPU memory",
           (Source("vllm", "v1/worker/gpu_model_runner.py"),),
           fatal="out of GPU memory while loading the weights", rank=3),
    Marker("kv_none", "No available memory for the cache blocks",
           (Source("vllm", "v1/core/kv_cache_planning.py"),),
           fatal="no GPU memory left for the KV cache", rank=3),
    Marker("kv_short", "larger than the available KV cache memory",
           (Source("vllm", "v1/core/kv_cache_planning.py"),),
           fatal="the KV cache cannot hold one request of the maximum length", rank=3),
    # PyTorch's allocator: "CUDA out of memory. Tried to allocate …" (c10/cuda/
    # CUDACachingAllocator.cpp); vLLM re-raises it as "CUDA out of memory occurred when warming
    # up sampler / pooler …" (v1/worker/gpu_model_runner.py).
    Marker("oom", "CUDA out of memory",
           (Source("pytorch-c++", "c10/cuda/CUDACachingAllocator.cpp"),
            Source("vllm", "v1/worker/gpu_model_runner.py")),
           fatal="out of GPU memory", rank=2),
    # "CUDA error: <cudaGetErrorString>" (c10/cuda/CUDAException.cpp, torch/cuda/_utils.py);
    # only as a raised exception's message (`…Error: CUDA error: …`), not in a warning's prose.
    Marker("cuda_error", "CUDA error: ",
           (Source("pytorch-c++", "c10/cuda/CUDAException.cpp"),
            Source("torch", "cuda/_utils.py")),
           fatal="a CUDA error", rank=2),
    Marker("engine_failed", "EngineCore failed to start.",
           (Source("vllm", "v1/engine/core.py"),),
           fatal="vLLM's engine failed to start", rank=1),
    Marker("engine_init", "Engine core initialization failed",
           (Source("vllm", "v1/engine/utils.py"),),
           fatal="vLLM's engine failed to start", rank=1),
)

_CUDA_ERROR_RAISED = re.compile(r"\w(?:Error|Exception): CUDA error: ")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_SECONDS = re.compile(r"took ([\d.]+) (?:seconds|secs|s)\b")
_MODEL_GIB = re.compile(r"Model loading took ([\d.]+) GiB")
_GRAPHS = re.compile(r"Graph capturing finished in (\d+) secs, took ([\d.]+) GiB")
_PROGRESS = re.compile(r"(\d{1,3})%")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class Verdict:
    """What one log line means: a phase begins (`phase`, with `detail`), the start failed
    (`fatal`), or nothing (both empty)."""

    key: str = ""
    phase: str = ""
    detail: str = ""
    fatal: str = ""
    rank: int = 0
    order: int = -1       # index in PHASES (phases only)


def clean(line: str, limit: int = 400) -> str:
    """A log line fit for a terminal: colour codes and control characters removed, trimmed."""
    text = _CONTROL.sub("", _ANSI.sub("", line)).strip()
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _fatal(line: str) -> Marker | None:
    best: Marker | None = None
    for marker in FATALS:
        if marker.literal not in line:
            continue
        if marker.key == "cuda_error" and not _CUDA_ERROR_RAISED.search(line):
            continue
        if best is None or marker.rank > best.rank:
            best = marker
    return best


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / GiB:,.2f} GiB"


def describe_report(line: str) -> str:
    """The runtime's start-up report in plain words (or why it could not be read)."""
    try:
        report = parse_report_line(line)
    except FormatError as exc:
        return f"the runtime's start-up report is unreadable: {exc}"
    if report is None:
        return ""
    world = f" of {report.world_size}" if report.world_size else ""
    words = f"the runtime's start-up report: rank {report.rank}{world}, mode {report.mode}"
    if report.mode == "residency":
        words += (f", hot bank {_gib(report.hot_bytes)} in GPU memory, cold bank "
                  f"{_gib(report.cold_bytes)} in pinned host memory")
    if report.content_hash:
        words += f", row map content hash {report.content_hash[:12]}"
    return words


def _detail(key: str, line: str) -> str:
    if key == "weights":
        m = _SECONDS.search(line)
        return f"weights read in {float(m.group(1)):,.1f} s" if m else ""
    if key == "loaded":
        m = _MODEL_GIB.search(line)
        return f"the model takes {m.group(1)} GiB of GPU memory" if m else ""
    if key == "kv":
        kv = kv_from_log(line)
        words = f"KV cache: {kv.tokens:,} tokens" if kv else ""
        m = _CONCURRENCY.search(line)
        if m:
            words += (f"; room for {m.group(2)} requests of the maximum length, {m.group(1)} "
                      "tokens, at once")
        return words
    if key == "graphs_done":
        m = _GRAPHS.search(line)
        return f"graphs captured in {m.group(1)} s, taking {m.group(2)} GiB" if m else ""
    if key == "engine":
        m = _SECONDS.search(line)
        return f"engine ready after {float(m.group(1)):,.1f} s of profiling and warm-up" if m else ""
    return ""


def classify(line: str, *, residency: bool = False) -> Verdict:
    """The meaning of one log line. `residency`: the lane runs the runtime in residency mode, so
    the time between vLLM's "Loading weights took" and the start-up report is re-homing."""
    marker = _fatal(line)
    if marker is not None:
        return Verdict(key=marker.key, fatal=marker.fatal, rank=marker.rank)
    for order, marker in enumerate(PHASES):
        if marker.literal in line:
            phase = marker.phase
            if marker.key == "weights" and residency:
                phase = RE_HOMING
            detail = describe_report(line) if marker.key == "report" else _detail(marker.key, line)
            return Verdict(key=marker.key, phase=phase, detail=detail, order=order)
    return Verdict()


def progress_percent(line: str) -> int | None:
    """A progress bar's percentage (tqdm: `Capturing CUDA graphs (decode, FULL):  45%|…`)."""
    m = _PROGRESS.search(line)
    if m and ("|" in line or "Completed" in line):
        value = int(m.group(1))
        return value if value <= 100 else None
    return None
