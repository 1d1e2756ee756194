"""The decode estimate per layer kind on the committed hybrid recipes (Gated DeltaNet, Mamba-2,
DeepSeek sparse attention) and the non-routed weights a load walk leaves in host memory.

Expected figures are hand arithmetic on the public configs' shapes (the recipes' header comments
carry the same numbers), not read back from the code under test.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.costmodel.lane_estimate import (
    BAND_ONE_STREAM,
    _launches,
    estimate_lane,
)
from recipegen.ledger import compute_lane
from recipegen.load.recipe import load_recipe

GiB = 2**30


def test_qwen3_next_gated_deltanet_state_is_read_and_written_every_step():
    loaded = load_recipe("qwen3-next-80b-a3b-rtx5090")
    est = estimate_lane(loaded, "chat", streams=[1, 2])
    # Qwen3-Next-80B-A3B: conv (4 - 1) x (2 x 16 x 128 + 32 x 128) x 2 B = 49,152 B, recurrent
    # 32 x 128 x 128 x 2 B = 1,048,576 B: 1,097,728 B per sequence per layer, 36 layers
    per_sequence = 36 * 1_097_728
    for streams in (1, 2):
        terms = est.point(streams).terms
        assert terms.state_bytes == 2 * streams * per_sequence
        assert terms.state == pytest.approx(terms.state_bytes / 1792e9)      # RTX 5090: 1,792 GB/s
        # 12 full-attention layers x 2 KV heads x 256 x (K and V) x 2 B at 4,096 tokens per sequence
        assert terms.kv_bytes == streams * 12 * 4096 * 2048
    assert any("36 Gated DeltaNet layers" in n and "lower bound" in n for n in est.notes)
    # the band's low end allows the never-measured kernels twice their time
    p = est.point(1)
    assert p.band[0] == pytest.approx(BAND_ONE_STREAM[0] / (1 + p.terms.unmeasured / p.terms.total))
    assert p.band[0] < BAND_ONE_STREAM[0]


def test_qwen3_next_launches_add_up_from_its_blocks():
    model = load_recipe("qwen3-next-80b-a3b-rtx5090").recipe.model
    # 36 GDN layers (3 GEMMs, 3 small) + 12 attention layers (2 GEMMs, 1 small); every layer MoE
    # with a shared expert (router + 2 GEMMs, 4 small) and two norms
    gemms, small, how = _launches(model)
    assert gemms == 36 * 3 + 12 * 2 + 48 * (1 + 2)
    assert small == 36 * 3 + 12 * 1 + 48 * 4 + 48 * 2
    assert how == "a mixer and an MLP per layer"


def test_nemotron_h_one_block_per_layer_and_mamba2_state():
    loaded = load_recipe("nemotron-3-nano-30b-a3b-rtx4090")
    model = loaded.recipe.model
    gemms, small, how = _launches(model)
    # 23 Mamba-2 blocks (2 GEMMs, 3 small), 6 attention blocks (2, 1), 23 MoE blocks with a shared
    # expert (1 + 2, 4); one norm per block
    assert gemms == 23 * 2 + 6 * 2 + 23 * 3
    assert small == 23 * 3 + 6 * 1 + 23 * 4 + 52
    assert how == "one block per layer (23 mamba2, 6 attention, 23 MoE)"
    est = estimate_lane(loaded, "chat", streams=[1])
    terms = est.point(1).terms
    # Mamba-2: conv (4 - 1) x (64 x 64 + 2 x 8 x 128) x 2 B = 36,864 B, SSM 64 x 64 x 128 x 4 B
    # (fp32, the config's mamba_ssm_cache_dtype) = 2,097,152 B: 2,134,016 B, 23 layers
    assert terms.state_bytes == 2 * 23 * 2_134_016
    assert any("23 Mamba-2 layers" in n for n in est.notes)
    assert any("relu2 experts without a gate" in n for n in est.notes)
    # an up [1856, 2688] + down [2688, 1856] bf16 expert: 2 x 1856 x 2688 x 2 B
    assert model.expert_bytes == 19_955_712


def test_deepseek_v32_sparse_attention_reads_top_k_latents():
    loaded = load_recipe("deepseek-v3.2-h200x8")
    est = estimate_lane(loaded, "chat", streams=[1, 2], context=131072)
    for streams in (1, 2):
        terms = est.point(streams).terms
        # per GPU (MLA caches the latent on every rank): 61 layers; each query token reads 2,048
        # latents of (512 + 64) x 2 B; the indexer scans all 131,072 keys of 128 + 4 B per sequence
        assert terms.kv_bytes == 61 * streams * (2048 * 1152 + 131072 * 132)
    assert any("at most 2,048 tokens (index_topk)" in n for n in est.notes)
    # without the indexer's top-k, 131,072 latents per query token would be ~64x the latent bytes
    assert est.point(1).terms.kv_bytes < 61 * 131072 * 1152 / 5


def _write(tmp_path: Path, source: str, old: str, new: str) -> Path:
    text = (Path("recipes") / f"{source}.yaml").read_text()
    assert old in text
    out = tmp_path / f"{source}.yaml"
    out.write_text(text.replace(old, new, 1))
    for sub in ("maps", "profiles", "models"):
        shutil.copytree(Path("recipes", sub), tmp_path / sub)   # a link out of the project is refused
    return out


def test_weights_the_load_walk_leaves_in_host_memory_are_read_every_step(tmp_path):
    # Without --cpu-offload-params experts the walk meets each layer's non-routed tensors first
    # (vLLM 0.33 offloader/uva.py): Qwen3-Next's layers hold 75,837,888 B (GDN) or 62,927,872 B
    # (attention, every fourth) besides 512 experts x (2 MiB w13 + 1 MiB w2) = 3 GiB.
    path = _write(tmp_path, "qwen3-next-80b-a3b-rtx5090", "    extra_args: [--cpu-offload-params, experts]\n", "")
    budget, total, dense = 128 * GiB, 0, 0
    for layer in range(48):
        for size, is_dense in (((62_927_872 if layer % 4 == 3 else 75_837_888), True), (2 * GiB, False),
                               (1 * GiB, False)):
            if total >= budget:
                break
            total += size
            dense += size if is_dense else 0
    assert dense > 40 * 62_927_872
    est = estimate_lane(load_recipe(str(path)), "chat", streams=[1])
    terms = est.point(1).terms
    assert terms.host_dense_bytes == dense
    assert terms.host_dense == pytest.approx(dense / 64e9)                  # PCIe Gen5 x16 reads: 64 GB/s
    assert any("non-routed weights in host memory" in n for n in est.notes)
    # the committed recipe offloads experts only: nothing else crosses the link
    committed = estimate_lane(load_recipe("qwen3-next-80b-a3b-rtx5090"), "chat", streams=[1])
    assert committed.point(1).terms.host_dense == 0


def test_the_lanes_kv_cache_dtype_sets_the_bytes_each_token_reads(tmp_path):
    """The decode estimate reads KV at the lane's cache dtype, as the ledger sizes the pool: half the
    bytes for an fp8 cache on Qwen3-Next's full-attention layers, and fp8_ds_mla's 656 B latent on
    DeepSeek-V3.2 on Hopper (512 fp8 + 4 fp32 scales + 64 bf16 RoPE values; vLLM's FLASHMLA_SPARSE)."""
    path = _write(tmp_path, "qwen3-next-80b-a3b-rtx5090", "    extra_args: [--cpu-offload-params, experts]\n",
                  "    extra_args: [--cpu-offload-params, experts, --kv-cache-dtype, fp8]\n")
    est = estimate_lane(load_recipe(str(path)), "chat", streams=[1, 2])
    for streams in (1, 2):
        # 12 full-attention layers x 2 KV heads x 256 x (K and V) x 1 B at 4,096 tokens per sequence
        assert est.point(streams).terms.kv_bytes == streams * 12 * 4096 * 1024
    assert any("KV read at the lane's fp8 cache (the model's own: bf16)" in n for n in est.notes)

    ds = tmp_path / "ds"
    ds.mkdir()
    path = _write(ds, "deepseek-v3.2-h200x8", "    max_model_len: 131072\n",
                  "    max_model_len: 131072\n    extra_args: [--kv-cache-dtype, fp8]\n")
    loaded = load_recipe(str(path))
    est = estimate_lane(loaded, "chat", streams=[1, 2], context=131072)
    for streams in (1, 2):
        assert est.point(streams).terms.kv_bytes == 61 * streams * (2048 * (512 + 4 * 4 + 64 * 2) + 131072 * 132)
    # the pool the ledger gives the same lane holds sequences at the same bytes per token per layer
    ledger = compute_lane(loaded.recipe.model, loaded.recipe.machines["dgx"], loaded.recipe.lanes[0])
    assert ledger.fig("kv.bytes_per_sequence").value == 61 * (656 + 132) * 131072


def test_plan_json_carries_the_new_terms():
    result = invoke("plan", "nemotron-3-nano-30b-a3b-rtx4090", "chat", "--json", "--concurrency", "2")
    assert result.code == 0, result.output
    terms = json.loads(result.output)["estimate"]["points"][0]["terms"]
    assert terms["state_bytes"] == 2 * 2 * 23 * 2_134_016
    assert terms["unmeasured_ms"] == pytest.approx(terms["state_ms"])
