"""Contract: every line `recipegen up / swap / profile` read a lane's start from
(`recipegen.ops.startup_log`) is printed, as matched, by the file its marker names: vLLM 0.33.0
(the unpacked wheel's source, as tests/test_vllm033_contracts.py reads it), uvicorn and torch (the
versions in .venv-vllm: the 0.33 wheel ships neither) and the expert residency runtime (its own
functions). The source is parsed, not imported; string literals are compared after joining
implicit concatenation, an f-string's or %-format's placeholders standing for any text.

The figures a phase line shows are parsed from vLLM's own format strings, rendered here with
sample values: a changed format breaks this test, not a user's terminal.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest
from expert_residency.formats import StartupReport, format_report_line
from expert_residency.vllm_plugin.refusal import refusal_line
from test_vllm033_contracts import REPO, _v033_root

from recipegen.ops.startup_log import FATALS, PHASES, Marker, classify

HOLE = "\x00"   # where a placeholder was
V033 = _v033_root()
needs_033 = pytest.mark.skipif(V033 is None, reason="vllm 0.33.0 source absent: run "
                               "scripts/fetch-vllm033-source.sh or set RECIPEGEN_VLLM033_SRC")


def _site_packages() -> Path | None:
    for sp in sorted((REPO / ".venv-vllm/lib").glob("python3*/site-packages")):
        if (sp / "uvicorn").is_dir():
            return sp
    return None


SITE = _site_packages()


def _root(package: str) -> Path | None:
    if package == "vllm":
        return V033
    if package in ("uvicorn", "torch"):
        return SITE / package if SITE is not None else None
    raise AssertionError(package)


@cache
def _strings(path: Path) -> tuple[str, ...]:
    """Every string literal of a Python file: adjacent literals joined (the parser does that),
    f-string placeholders as HOLE."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts:
            found.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            found.append("".join(v.value if isinstance(v, ast.Constant) else HOLE
                                 for v in node.values))
    return tuple(found)


def _printed_by(marker: Marker) -> list[tuple[str, Path]]:
    """(package, file) of the marker's sources that can be read here."""
    out = []
    for source in marker.sources:
        if source.package in ("pytorch-c++", "expert_residency"):
            continue   # C++ (cited only) / the runtime (checked through its functions below)
        root = _root(source.package)
        if root is None:
            pytest.skip(f"{source.package} source absent here")
        out.append((source.package, root / source.path))
    return out


@needs_033
@pytest.mark.parametrize("marker", [m for m in PHASES + FATALS], ids=lambda m: m.key)
def test_each_literal_is_in_the_file_that_prints_it(marker: Marker) -> None:
    sources = _printed_by(marker)
    runtime = [s for s in marker.sources if s.package == "expert_residency"]
    assert sources or runtime, f"{marker.key}: no source that a test can read"
    for package, path in sources:
        assert path.is_file(), f"{marker.key}: {path} does not exist in this {package}"
        assert any(marker.literal in text for text in _strings(path)), \
            f"{marker.key}: {marker.literal!r} is no longer printed by {path}"


def test_the_runtime_prints_its_markers() -> None:
    report = StartupReport(rank=0, mode="count-only", vllm_version="0.33.0", runtime_version="0.1.0")
    marker = {m.key: m for m in PHASES + FATALS}
    assert marker["report"].literal in format_report_line(report)
    assert refusal_line("the row map changed").startswith(marker["refused"].literal)
    for m in PHASES + FATALS:
        for source in m.sources:
            if source.package == "expert_residency":
                assert (REPO / "runtime/expert_residency" / source.path).is_file(), source


def _format(path: Path, prefix: str) -> str:
    """The string literal of `path` that is `prefix`, else the one that starts with it."""
    if prefix in _strings(path):
        return prefix
    matches = {t for t in _strings(path) if t.startswith(prefix)}
    assert len(matches) == 1, f"{path}: {sorted(matches)} start with {prefix!r}"
    return matches.pop()


@needs_033
@pytest.mark.parametrize(("rel", "prefix", "args", "residency", "phase", "detail"), [
    ("model_executor/model_loader/default_loader.py", "Loading weights took", (301.2211,), True,
     "re-homing experts into the hot and cold banks", "weights read in 301.2 s"),
    ("model_executor/model_loader/default_loader.py", "Loading weights took", (4.0,), False,
     "finishing the model load", "weights read in 4.0 s"),
    ("v1/worker/gpu_model_runner.py", "Model loading took", ("210.4", 362.512312), True,
     "profiling memory and sizing the KV cache", "the model takes 210.4 GiB of GPU memory"),
    ("v1/core/kv_cache_utils.py", "%s KV cache size", ("GPU", "2,538,240", "1,048,576", 2.4206), True,
     "warming up: tuning kernels and compiling",
     "KV cache: 2,538,240 tokens; room for 2.42 requests of the maximum length, 1,048,576 tokens, "
     "at once"),
    ("v1/worker/gpu_model_runner.py", "Graph capturing finished", (75.4, 1.2512), True,
     "starting the API server", "graphs captured in 75 s, taking 1.25 GiB"),
    ("v1/engine/core.py", "init engine (profile, create kv cache, warmup model) took %.2f s",
     (812.441,), True, "starting the API server",
     "engine ready after 812.4 s of profiling and warm-up"),
])
def test_figures_are_read_from_vllms_own_formats(rel: str, prefix: str, args: tuple, residency: bool,
                                                 phase: str, detail: str) -> None:
    """A line as vLLM 0.33 logs it (its format, % the sample values, behind a logger prefix)."""
    assert V033 is not None
    line = "(EngineCore_DP0 pid=61) INFO 12-01 10:00:00 [x.py:1] " + _format(V033 / rel, prefix) % args
    verdict = classify(line, residency=residency)
    assert (verdict.phase, verdict.detail) == (phase, detail), line


@needs_033
def test_graph_capture_progress_bar_as_vllm_formats_it() -> None:
    desc = _format(V033 / "v1/worker/gpu_model_runner.py", "Capturing CUDA graphs ({}, {})")
    bar = desc.format("decode", "FULL") + ":  45%|####5     | 30/67 [00:10<00:12,  3.01it/s]"
    assert classify(bar).phase == "capturing CUDA graphs"


@needs_033
@pytest.mark.parametrize(("rel", "prefix", "fatal"), [
    ("v1/core/kv_cache_planning.py", "No available memory for the cache blocks",
     "no GPU memory left for the KV cache"),
    ("v1/core/kv_cache_planning.py", "To serve at least one request",
     "the KV cache cannot hold one request of the maximum length"),
    ("v1/worker/gpu_model_runner.py", "Failed to load model - not enough GPU memory",
     "out of GPU memory while loading the weights"),
    ("v1/worker/gpu_model_runner.py", "CUDA out of memory occurred when warming up sampler",
     "out of GPU memory"),
    ("v1/engine/utils.py", "Engine core initialization failed", "vLLM's engine failed to start"),
])
def test_failures_are_recognised_in_vllms_own_messages(rel: str, prefix: str, fatal: str) -> None:
    assert V033 is not None
    message = _format(V033 / rel, prefix).replace(HOLE, "7")
    assert classify("ValueError: " + message).fatal == fatal, message
