"""Pin boot on the real vLLM CPU engine with the row map built from the count-only profile.

* residency (hot/cold banks, split invoke, one fp32-fma finalize) is token-identical — and
  logprob-identical — to the same plugin in ``unsplit`` mode (every expert in one bank, same
  per-pick kernel, same finalize): the bit-exactness claim, end to end;
* plain vLLM without the plugin is compared as measured (see ``test_stock_vllm_agreement``);
* the start-up report's bank bytes match the ledger for the tiny model (recipegen's verify
  comparison: map counts × bytes per expert);
* a second map for the same class with a different ``shape_hash`` swaps by restart.

The servers are booted by the session's boot plan (``vllm_support.shared``); the unsplit and the
two residency servers are shared with other modules, which send their own requests to them
(after this module's prompts where the counts must be those prompts' alone).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from expert_residency.formats import StartupReport, find_report_lines, load_histogram, load_rowmap
from vllm_support.agreement import TINY_MOE_LOGPROB_TOLERANCE, assert_greedy_agreement, greedy_agreement, top1_margins
from vllm_support.prompts import MAX_TOKENS, PROMPTS
from vllm_support.server import WARM_KERNELS, VllmServer, compiled_kernels, completion_logprobs, completion_token_ids
from vllm_support.shared import Boot, SharedBoot, SharedContext, register_boot, residency_env, shared_job
from vllm_support.tiny_moe import TINY
from vllm_support.tiny_recipe import write_tiny_recipe

from recipegen.load.recipe import load_recipe
from recipegen.ops.ledger_view import lane_expectation
from recipegen.ops.verify import compare

pytestmark = pytest.mark.vllm

LOGPROB_TOLERANCE = TINY_MOE_LOGPROB_TOLERANCE


@dataclass
class Run:
    tokens: list[list[int]]
    logprobs: list[list[float]]
    margins: list[list[float]]      # per prompt and position: best − second-best logprob
    reports: list[StartupReport]
    status: list[Any]
    log: str
    prompt_tokens: list[int]


def _complete(server: VllmServer) -> list[dict[str, Any]]:
    # Two alternatives per position: stock's top-1 margin (the chosen token's logprob is the
    # same whatever the count asked for).
    return [server.complete(p, MAX_TOKENS, logprobs=2) for p in PROMPTS]


def _run(responses: list[dict[str, Any]], status: list[Any], log: str) -> Run:
    return Run([completion_token_ids(r) for r in responses],
               [completion_logprobs(r) for r in responses], [top1_margins(r) for r in responses],
               find_report_lines(log), status, log,
               [int(r["usage"]["prompt_tokens"]) for r in responses])


def _prompts_then_status(server: VllmServer, ctx: SharedContext) -> tuple[list, list]:
    """The prompts, then the runtime's status (its counts: these prompts' picks only)."""
    return _complete(server), server.collective_rpc("expert_residency_status")


def _prompts(server: VllmServer, ctx: SharedContext) -> tuple[list, list]:
    return _complete(server), []


# The unsplit reference and residency with the count profile's hot-5 map (first: its counts must
# be these prompts' alone) and hot-6 map: boots shared with other modules (vllm_support.shared).
shared_job("unsplit", "parity")(_prompts_then_status)
shared_job("residency-hot5", "parity", first=True)(_prompts_then_status)
shared_job("residency-hot6", "parity")(_prompts_then_status)
# This module's own: plain vLLM (no runtime environment: the plugin is inert), and unsplit and
# residency through vLLM's modular kernel per bank (the generic path GPU backends would use).
register_boot(Boot("stock", lambda ctx: {}))
shared_job("stock", "parity")(_prompts)
register_boot(Boot("unsplit-modular", lambda ctx: {
    "EXPERT_RESIDENCY_MODE": "unsplit", "EXPERT_RESIDENCY_PER_PICK": "modular"}))
shared_job("unsplit-modular", "parity")(_prompts_then_status)
register_boot(Boot("residency-hot5-modular", lambda ctx: {
    **residency_env(ctx.maps()["hot5"]), "EXPERT_RESIDENCY_PER_PICK": "modular",
    "EXPERT_RESIDENCY_DUMP_DIR": str(ctx.dump_dir), "EXPERT_RESIDENCY_DUMP_INTERVAL_S": "0",
    "EXPERT_RESIDENCY_LANE": "tiny", "EXPERT_RESIDENCY_CLASS": "mixed"}, uses_maps=True))
shared_job("residency-hot5-modular", "parity")(_prompts_then_status)


@pytest.fixture(scope="module")
def maps(tiny_maps) -> dict[str, Path]:
    return tiny_maps


def _boot_run(plan: dict[str, SharedBoot], boot: str) -> Run:
    return _run(*plan[boot].result("parity"), plan[boot].log)


@pytest.fixture(scope="module")
def runs(engine_plan) -> dict[str, Run]:
    """Unsplit, residency (hot 5), residency (hot 6), stock vLLM."""
    return {key: _boot_run(engine_plan, boot) for key, boot in (
        ("unsplit", "unsplit"), ("hot5", "residency-hot5"), ("hot6", "residency-hot6"),
        ("stock", "stock"))}


@pytest.fixture(scope="module")
def modular_runs(engine_plan) -> dict[str, Run]:
    """Unsplit and residency through vLLM's modular kernel per bank. Its own fixture: a failure
    there fails the one test that reads it, not every test of the module."""
    return {"unsplit-modular": _boot_run(engine_plan, "unsplit-modular"),
            "hot5-modular": _boot_run(engine_plan, "residency-hot5-modular")}


def test_residency_is_token_identical_to_unsplit(runs) -> None:
    assert runs["hot5"].tokens == runs["unsplit"].tokens
    # Stronger than tokens: the logprobs of the chosen tokens are bit-identical too.
    assert runs["hot5"].logprobs == runs["unsplit"].logprobs


def test_split_actually_used_both_banks(runs, maps) -> None:
    """The prompts route picks to cold experts too, so both banks' per-pick calls ran."""
    rowmap = load_rowmap(maps["hot5"])
    status = runs["hot5"].status[0]
    assert status["mode"] == "residency" and status["moe_layers"] == [0, 1]
    assert runs["hot5"].reports[0].cold_counts_list() == rowmap.cold_counts() == [3, 3]
    for layer, counts in enumerate(status["counts"]):
        assert sum(counts[e] for e in rowmap.cold[layer]) > 0
        assert sum(counts[e] for e in rowmap.hot[layer]) > 0
    # Counting alongside residency sees every routed token: prompt + completion - 1 each.
    assert status["tokens"] == sum(runs["hot5"].prompt_tokens) + sum(
        len(t) - 1 for t in runs["hot5"].tokens)


def test_startup_report_bytes_match_the_ledger(runs, maps, tmp_path: Path) -> None:
    """The ledger of a recipe for the tiny model (inline geometry, the class's map) predicts the
    bank bytes the workers report; compared with `recipegen verify`'s own comparison."""
    for key, hot in (("hot5", 5), ("hot6", 6)):
        rowmap = load_rowmap(maps[key])
        recipe = write_tiny_recipe(tmp_path / key, maps[key], hot_per_layer=hot)
        expected = lane_expectation(load_recipe(str(recipe)), "tiny", "mixed", rowmap)
        # The CPU engine's KV pool is the test server's --kv-cache-memory-bytes, not the ledger's
        # HBM arithmetic.
        expected = dataclasses.replace(expected, kv_tokens=None)
        reports = runs[key].reports
        assert len(reports) == 1, "one start-up report line per worker"
        rows = compare(expected, reports, None)
        assert all(row.ok for row in rows), [row for row in rows if not row.ok]
        r = reports[0]
        # Exact, not just within verify's tolerance: the banks hold exactly the map's rows.
        assert (r.hot_bytes, r.cold_bytes) == (expected.hot_bytes, expected.cold_bytes)
        assert expected.hot_bytes == sum(rowmap.hot_counts()) * TINY.bytes_per_expert
        assert r.traffic_class == "mixed" and r.rowmap_path == str(maps[key])


def test_other_shape_same_class_swaps_by_restart(runs, maps) -> None:
    a, b = load_rowmap(maps["hot5"]), load_rowmap(maps["hot6"])
    assert a.shape_hash() != b.shape_hash()
    ra, rb = runs["hot5"].reports[0], runs["hot6"].reports[0]
    assert (ra.shape_hash, rb.shape_hash) == (a.shape_hash(), b.shape_hash())
    assert ra.traffic_class == rb.traffic_class == "mixed"
    assert rb.hot_counts_list() == [6, 6]
    assert runs["hot6"].tokens == runs["unsplit"].tokens
    assert runs["hot6"].logprobs == runs["unsplit"].logprobs


def test_interval_snapshots_alongside_residency(runs, engine_plan) -> None:
    dumps = sorted(engine_plan["residency-hot6"].dump_dir.glob("tiny__mixed__residency__*.hist"))
    reasons = [load_histogram(p).meta["reason"] for p in dumps]
    assert "interval" in reasons, reasons
    # Counts only grow; the last file (written at or before shutdown) holds every routed token.
    tokens = [load_histogram(p).tokens for p in dumps]
    assert tokens == sorted(tokens)


def test_unsplit_reports_all_experts_hot(runs) -> None:
    r = runs["unsplit"].reports[0]
    assert r.hot_counts_list() == [TINY.num_experts] * TINY.num_layers
    assert r.cold_bytes == 0
    assert r.hot_bytes == TINY.num_experts * TINY.num_layers * TINY.bytes_per_expert


def test_stock_vllm_agreement(runs, count_profile, tmp_path_factory) -> None:
    """Plain `vllm serve` (no runtime env: the plugin is inert) against the runtime.

    Count-only mode runs vLLM's own kernel, so it must agree exactly with stock. The split path
    rounds each pick row to bf16 before the fp32 fma finalize, while vLLM's CPU kernel
    accumulates the weighted picks inside the kernel, so split vs stock logprobs differ by
    rounding: what must hold is `vllm_support.agreement` (logprobs within ``LOGPROB_TOLERANCE``
    on agreeing tokens; a token differs only where stock's top-1 margin is below twice the
    largest difference). The figures are written to stock_agreement.json and printed.
    """
    stock, split = runs["stock"], runs["hot5"]
    assert not stock.reports, "the plugin must be inert without EXPERT_RESIDENCY_MODE"
    assert count_profile.token_ids == stock.tokens
    agreement = greedy_agreement(stock.tokens, stock.logprobs, stock.margins, split.tokens,
                                 split.logprobs)
    measured = {**agreement.as_dict(), "logprobs_bit_identical": split.logprobs == stock.logprobs}
    out = tmp_path_factory.mktemp("agreement") / "stock_agreement.json"
    out.write_text(json.dumps(measured, indent=1))
    print("residency vs stock vLLM:", json.dumps(measured))
    assert_greedy_agreement(agreement, LOGPROB_TOLERANCE)


def test_modular_kernel_path_is_bit_identical_too(runs, modular_runs) -> None:
    """Per-pick through `FusedMoEKernel.apply` (prepare → CPU experts → finalize) instead of the
    CPU experts directly: split vs unsplit identical, and identical to the direct path."""
    runs = {**runs, **modular_runs}
    for key in ("unsplit-modular", "hot5-modular"):
        assert "via FusedMoEKernel.apply" in runs[key].reports[0].extra["per_pick"]
    # The per-pick function is the CPU experts class vLLM itself chose on this CPU (it logs
    # "Using <class> MoE backend"; CPUUnquantizedExperts or, on some x86 CPUs,
    # X86CPUUnquantizedExperts), not a fixed name.
    chosen = re.findall(r"Using (\w+) MoE backend", runs["stock"].log)
    assert chosen and runs["unsplit"].reports[0].extra["per_pick"] == chosen[-1]
    assert runs["hot5-modular"].tokens == runs["unsplit-modular"].tokens == runs["unsplit"].tokens
    assert runs["hot5-modular"].logprobs == runs["unsplit-modular"].logprobs
    assert runs["unsplit-modular"].logprobs == runs["unsplit"].logprobs


def test_no_server_compiled_in_its_request_path(runs, modular_runs, engine_plan) -> None:
    """vLLM's logprobs helper was compiled once, before any server (``warm_compile_cache``): no
    server of the plan compiled a kernel of its own (the cache holds only the warm-up's) or built
    inductor's precompiled header in its TMPDIR, as each did at its first completion before —
    where, under memory pressure, the compiler's peak got the worker OOM-killed and that
    completion answered 500."""
    assert compiled_kernels() == WARM_KERNELS != set()
    for name, boot in engine_plan.items():
        assert not list((boot.log_path.parent / "tmp").glob("torchinductor_*")), name
