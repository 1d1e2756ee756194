"""Count-only profile boot on the real vLLM CPU engine: serve → fixed prompts → histogram →
`recipegen rowmap build`.

Accounting (documented in docs/plugin.md): with prefix caching off every prompt token is
prefilled once and every generated token except the last is fed back once, so each MoE layer
routes Σ(prompt + completion − 1) tokens, each to top-k experts:
picks = tokens × MoE layers × top-k; decode tokens = Σ(completion − 1); prefill = Σ prompt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from expert_residency.formats import find_report_lines, load_histogram, load_rowmap
from vllm_support.tiny_moe import TINY

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]


def _expected_tokens(responses: list[dict]) -> tuple[int, int, int]:
    prompt = sum(r["usage"]["prompt_tokens"] for r in responses)
    completion = sum(r["usage"]["completion_tokens"] for r in responses)
    decode = completion - len(responses)
    return prompt + decode, decode, prompt


def test_histogram_total_equals_routed_picks(count_profile) -> None:
    tokens, decode, prefill = _expected_tokens(count_profile.responses)
    h = load_histogram(count_profile.manual_dump)
    assert h.moe_layer_indices == TINY.moe_layer_indices
    assert h.num_experts == TINY.num_experts and h.top_k == TINY.top_k
    assert h.tokens == tokens
    assert (h.decode_tokens, h.prefill_tokens) == (decode, prefill)
    # Every layer routes every token to exactly top-k experts.
    assert h.counts.sum(axis=1).tolist() == [tokens * TINY.top_k] * TINY.num_layers
    assert int(h.counts.sum()) == tokens * TINY.num_layers * TINY.top_k
    # Real routing is skewed (random router), not uniform: the map has something to choose.
    assert h.counts.max() > 2 * h.counts.min()


def test_histogram_matches_independent_router_recount(count_profile) -> None:
    """vLLM's own router capture seam, hooked by a separate test extension after start-up,
    counts the same picks as the runtime's counter in the expert container."""
    h = load_histogram(count_profile.manual_dump)
    recount = np.array([count_profile.recount[str(i)] for i in h.moe_layer_indices], dtype=np.int64)
    np.testing.assert_array_equal(h.counts, recount)
    # ... and the live status over collective_rpc agrees with the file.
    assert count_profile.status["counts"] == h.counts.tolist()
    assert count_profile.status["tokens"] == h.tokens


def test_shutdown_dump_is_written_with_the_same_counts(count_profile) -> None:
    assert count_profile.returncode == 0
    assert len(count_profile.shutdown_dumps) == 1, count_profile.log[-2000:]
    last = load_histogram(count_profile.shutdown_dumps[0])
    manual = load_histogram(count_profile.manual_dump)
    assert last.meta["reason"] == "shutdown" and manual.meta["reason"] == "manual"
    assert last.meta["lane"] == "tiny" and last.meta["class"] == "mixed"
    np.testing.assert_array_equal(last.counts, manual.counts)
    assert count_profile.shutdown_dumps[0].name.startswith("tiny__mixed__count-only__")


def test_sigusr1_to_the_worker_writes_a_snapshot(count_profile) -> None:
    assert len(count_profile.signal_dumps) == 1, "no dump after SIGUSR1 to the worker"
    h = load_histogram(count_profile.signal_dumps[0])
    assert h.meta["reason"] == "signal" and h.meta["pid"] == count_profile.status["pid"]
    np.testing.assert_array_equal(h.counts, load_histogram(count_profile.manual_dump).counts)


def test_startup_report_line_for_count_mode(count_profile) -> None:
    reports = find_report_lines(count_profile.log)
    assert len(reports) == 1
    r = reports[0]
    assert r.mode == "count-only" and r.vllm_version.startswith("0.32.0")
    assert r.hot_counts_list() == [TINY.num_experts] * TINY.num_layers
    assert r.hot_bytes == TINY.num_experts * TINY.num_layers * TINY.bytes_per_expert
    assert r.cold_bytes == 0 and r.content_hash is None


def test_plugin_found_from_directory_not_installed(count_profile) -> None:
    """The entry point came from runtime/expert_residency-0.1.0.dist-info on PYTHONPATH."""
    # Without the caller's PYTHONPATH (a shell that put runtime/ on it would show the folder).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    pip = subprocess.run([str(REPO / ".venv-vllm/bin/python"), "-m", "pip", "show",
                          "expert_residency"], capture_output=True, text=True, env=env)
    assert pip.returncode != 0, "the runtime must not be pip-installed in .venv-vllm"
    assert "Injected <class 'recount_ext.RecountWorkerExtension'>" in count_profile.log
    assert "EXPERT_RESIDENCY_REPORT" in count_profile.log


def test_rowmap_build_on_the_profile(count_profile, tmp_path: Path) -> None:
    out = tmp_path / "tiny.rowmap"
    proc = subprocess.run([sys.executable, "-m", "recipegen", "rowmap", "build",
                           str(count_profile.shutdown_dumps[0]), "--hot", "5", "-o", str(out),
                           "--json"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    rowmap = load_rowmap(out)
    assert rowmap.moe_layer_indices == TINY.moe_layer_indices
    assert rowmap.hot_counts() == [5, 5] and rowmap.cold_counts() == [3, 3]
    assert summary["content_hash"] == rowmap.content_hash()
    counts = load_histogram(count_profile.shutdown_dumps[0]).counts
    for layer, hot in enumerate(rowmap.hot):
        # The hot bank holds the five most-picked experts of the layer.
        assert min(counts[layer][hot]) >= max(counts[layer][rowmap.cold[layer]])
