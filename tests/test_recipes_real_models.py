"""The committed recipes for public models: each checks green, and the runtime's refusal of a lane
it cannot split is named."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.common.units import GiB
from recipegen.ledger import compute_ledger
from recipegen.load.recipe import load_recipe

REPO = Path(__file__).resolve().parent.parent


NEW_FAMILIES = ["qwen3-next-80b-a3b-rtx5090", "nemotron-3-nano-30b-a3b-rtx4090", "deepseek-v3.2-h200x8",
                "llama-4-scout-17b-16e-h100", "qwen3-vl-30b-a3b-rtx5090", "qwen3.5-35b-a3b-rtx5090",
                "glm-5-h200x8", "qwen3-235b-a22b-nvfp4-b200"]


@pytest.mark.parametrize("name", ["gpt-oss-120b-l40s", "qwen3-30b-a3b-rtx4090", "qwen3-235b-a22b-fp8-h200",
                                  *NEW_FAMILIES])
def test_recipe_is_green(name: str) -> None:
    ledger = compute_ledger(load_recipe(REPO / "recipes" / f"{name}.yaml"))
    assert ledger.ok, [v.message for v in ledger.violations]
    assert ledger.lanes[0].fig("kv.full_sequences").value >= 1


def test_gpt_oss_window_layers_make_room_on_48_gb() -> None:
    lane = compute_ledger(load_recipe(REPO / "recipes" / "gpt-oss-120b-l40s.yaml")).lanes[0]
    # 18 full layers x 2048 B x 131,072 + 18 sliding layers x 2048 B x 128 per sequence.
    assert lane.fig("kv.bytes_per_sequence").value == 18 * 2048 * 131072 + 18 * 2048 * 128
    # Every layer at full length would be 9 GiB a sequence: the pool would hold one, not two.
    assert lane.fig("hbm.kv_pool").value // (36 * 2048 * 131072) == 1
    assert lane.fig("kv.full_sequences").value == 2


def test_gpt_oss_usage_aware_passes_the_runtime_check_with_a_caveat_off_hopper() -> None:
    # gpt-oss's MXFP4 experts (biases, SwiGLU-OAI) are in the runtime's capability table; on an
    # L40S (compute capability 8.9) the split was not verified, which the lane says as a note.
    from recipegen.ledger import compute_lane
    from recipegen.schema.lane import Offload
    loaded = load_recipe(REPO / "recipes" / "gpt-oss-120b-l40s.yaml")
    recipe = loaded.recipe
    lane = recipe.lanes[0].model_copy(update={"offload": Offload(
        placement="usage-aware", hot_experts_per_layer=50, load_cpu_offload="38 GiB")})
    got = compute_lane(recipe.model, recipe.machines["box"], lane)
    assert not [v for v in got.violations if v.kind == "runtime"]
    assert any("mxfp4 split is not verified on compute capability 8.9" in str(n) for n in got.notes)


def test_qwen3_235b_tp8_replicates_kv_heads() -> None:
    # Qwen3-235B-A22B at TP=8 on a DGX H200: 4 KV heads -> 1 per GPU (replicated), 94 layers:
    # 2 * 1 * 128 * 2 B * 94 = 48,128 B per token per GPU.
    from recipegen.catalog import catalog_entry
    from recipegen.ledger import compute_lane
    from recipegen.schema import Lane, Machine, Model
    model = Model.model_validate(catalog_entry("models", "qwen3-235b-a22b"))
    machine = Machine.model_validate(catalog_entry("machines", "h200-sxm-x8"))
    lane = Lane.model_validate({
        "name": "l", "machine": "m", "gpus": list(range(8)), "port": 8000, "image": "vllm/vllm-openai:v0.33.0",
        "kv_cache_bytes": "100 GiB", "max_model_len": 32768, "concurrency": {"max": 8},
        "offload": {"placement": "positional", "load_cpu_offload": "0 GiB"},
        "reserves": {"hbm": {"value": "10 GiB", "source": "test"}}})
    got = compute_lane(model, machine, lane)
    assert got.fig("kv.tokens").value == pytest.approx(100 * GiB / 48_128)   # 2.23M, not 4.46M


def _variant(tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = (REPO / "recipes" / f"{name}.yaml").read_text()
    assert old in text
    for folder in ("maps", "profiles"):  # the recipe's row maps, at the same relative paths
        shutil.copytree(REPO / "recipes" / folder, tmp_path / folder)
    path = tmp_path / "variant.yaml"
    path.write_text(text.replace(old, new).replace(f"name: {name}", "name: variant"))
    return path


def test_qwen3_235b_fp8_on_the_125_gib_h200_box_is_red_at_load(tmp_path: Path) -> None:
    # On h200-pcie (125.87 GiB host) the 107 GiB --cpu-offload-gb the HBM needs pins every offloaded
    # parameter at the next power of two: per layer w13 = 128 x 3072 x 4096 B = 1.5 GiB -> 2 GiB,
    # w2 0.75 GiB -> 1 GiB (+ small scales), so the load needs far more host than the box has.
    path = _variant(tmp_path, "qwen3-235b-a22b-fp8-h200", "catalog: h200-sxm-x8", "catalog: h200-pcie")
    path.write_text(path.read_text().replace("load_cpu_offload: 116 GiB", "load_cpu_offload: 107 GiB")
                    .replace("value: 64 GiB", "value: 12 GiB"))
    ledger = compute_ledger(load_recipe(path))
    kinds = {v.kind for v in ledger.violations}
    # A positional lane keeps the load's pinned blocks for the whole run, so the final host verdict
    # already counts them (reported once, as the final-state violation).
    assert "host" in kinds
    assert ledger.lanes[0].fig("load.host_peak").value > 47 * 3 * GiB   # >= 47 whole layers at 3 GiB pinned
    assert ledger.lanes[0].fig("host.cold_pinned").value > 47 * 3 * GiB


def test_qwen3_30b_on_a_64_gib_desktop_is_red_at_load(tmp_path: Path) -> None:
    path = _variant(tmp_path, "qwen3-30b-a3b-rtx4090", "value: 96 GiB", "value: 64 GiB")
    ledger = compute_ledger(load_recipe(path))
    assert [v.kind for v in ledger.violations] == ["load-host"]


# --- the families the importer reads beyond the catalog: one recipe each (recipes/models/ are their
# imports from tests/fixtures/hf_configs/). Expected figures are hand arithmetic from each config.json.

def _lane(name: str):
    return compute_ledger(load_recipe(REPO / "recipes" / f"{name}.yaml")).lanes[0]


def _model(name: str):
    return load_recipe(REPO / "recipes" / f"{name}.yaml").recipe.model


@pytest.mark.parametrize("fixture, checkpoint", [
    ("qwen3-next-80b-a3b-thinking", "Qwen/Qwen3-Next-80B-A3B-Thinking"),
    ("nemotron-3-nano-30b-a3b", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"),
    ("deepseek-v3.2", "deepseek-ai/DeepSeek-V3.2"),
    ("llama-4-scout-17b-16e-instruct", "meta-llama/Llama-4-Scout-17B-16E-Instruct"),
    ("qwen3-vl-30b-a3b-instruct", "Qwen/Qwen3-VL-30B-A3B-Instruct"),
    ("qwen3.5-35b-a3b", "Qwen/Qwen3.5-35B-A3B"),
    ("glm-5", "zai-org/GLM-5"),
    ("qwen3-235b-a22b-nvfp4", "nvidia/Qwen3-235B-A22B-NVFP4"),
])
def test_model_files_are_the_import_of_their_fixture(fixture: str, checkpoint: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    out = tmp_path / f"{fixture}.yaml"
    result = invoke("model", "import", f"tests/fixtures/hf_configs/{fixture}",
                    "--checkpoint", checkpoint, "-o", str(out))
    assert result.code == 0, result.output
    assert out.read_text() == (REPO / "recipes" / "models" / f"{fixture}.yaml").read_text()


def test_llama4_scout_on_one_h100() -> None:
    model = _model("llama-4-scout-17b-16e-h100")
    # text_config: interleave_moe_layer_step 1 -> every one of the 48 layers is MoE; 16 experts, top-1.
    assert model.moe_layers == list(range(48)) and model.routed_experts == 16 and model.top_k == 1
    # w13 2 x 8192 x 5120 + w2 5120 x 8192, bf16.
    expert = (2 * 8192 * 5120 + 5120 * 8192) * 2
    assert model.expert_bytes == expert == 251_658_240
    # Non-routed: one shared expert per layer (intermediate_size 8192, gate/up/down) and the vision
    # model + projector (871,932,416 parameters) in bf16.
    assert model.encoder_bytes == 871_932_416 * 2
    assert "shared_experts 12,079,595,520" in model.sources["dense_bytes"]
    assert 48 * 3 * 5120 * 8192 * 2 == 12_079_595_520
    # Layers: no_rope_layers absent -> every 4th layer is NoPE, full attention; the others chunked.
    kinds = {g.kind: g for g in model.attention}
    assert kinds["full"].layers == [i for i in range(48) if (i + 1) % 4 == 0]
    assert len(kinds["chunked"].layers) == 36 and kinds["chunked"].chunk == 8192
    assert model.kv_token_bytes == 48 * 2 * 8 * 128 * 2 == 196_608    # uncapped, one rank
    lane = _lane("llama-4-scout-17b-16e-h100")
    per_layer = 2 * 8 * 128 * 2                                       # 4,096 B per token per layer
    assert lane.fig("kv.layers[1].bytes_per_token").value == per_layer
    # 12 full layers hold all 131,072 tokens; 36 chunked layers chunk + max_num_batched_tokens
    # (8,192 + 8,192, vLLM's default on a GPU of >= 70 GiB).
    per_seq = 12 * per_layer * 131072 + 36 * per_layer * (8192 + 8192)
    assert lane.fig("kv.bytes_per_sequence").value == per_seq == int(8.25 * GiB)
    pool = lane.fig("hbm.kv_pool").value
    assert lane.fig("kv.full_sequences").value == pool // per_seq == 3
    assert pool // (48 * per_layer * 131072) == 1                   # uncapped: 24 GiB a sequence, 1 fits
    # 2 hot / 14 cold per layer.
    assert lane.fig("hbm.hot_experts").value == 2 * 48 * expert == int(22.5 * GiB)
    assert lane.fig("host.cold_experts").value == 14 * 48 * expert
    # --cpu-offload-gb 124 at load: 3.75 GiB a layer (w13 2.5 + w2 1.25), the walk stops past the
    # budget: 33 whole layers (123.75 GiB) and layer 34's w13 (126.25 GiB), pinned at powers of two
    # (4 + 2 GiB a layer, 4 GiB the lone w13).
    w13 = 16 * 2 * 8192 * 5120 * 2                                  # 2.5 GiB: 16 experts' gate and up
    assert lane.fig("load.host_experts_initial").value == 33 * 16 * expert + w13 == int(126.25 * GiB)
    assert lane.fig("load.host_pinned_initial").value == 33 * 6 * GiB + 4 * GiB


def test_qwen3_vl_on_one_rtx5090_counts_the_vision_tower() -> None:
    model = _model("qwen3-vl-30b-a3b-rtx5090")
    expert = (2 * 768 * 2048 + 2048 * 768) * 2                     # 9,437,184 B (text_config)
    assert model.expert_bytes == expert and model.num_moe_layers == 48 and model.routed_experts == 128
    # The vision tower as vLLM 0.33 builds it (vision_config: depth 27, hidden 1152, intermediate 4304,
    # patch 16, temporal 2, 2304 position embeddings, out 2048, deepstack layers 8 / 16 / 24):
    patch = 1152 * (3 * 2 * 16 * 16) + 1152                         # Conv3d with bias
    pos = 2304 * 1152
    block = (2 * 2 * 1152                                           # two LayerNorms
             + 3 * 1152 * 1152 + 3 * 1152 + 1152 * 1152 + 1152        # qkv, proj (biases)
             + 4304 * 1152 + 4304 + 1152 * 4304 + 1152)               # fc1, fc2 (biases)
    merger = 4608 * 4608 + 4608 + 2048 * 4608 + 2048                 # fc1 [4h, 4h], fc2 [out, 4h]
    vision = patch + pos + 27 * block + (2 * 1152 + merger) + 3 * (2 * 4608 + merger)
    assert vision == 538_631_408                                     # the published 31,070,754,032 − the text model's
    assert model.encoder_bytes == vision * 2
    lane = _lane("qwen3-vl-30b-a3b-rtx5090")
    # Loaded (no --language-model-only): in the HBM reserve's weights.
    assert lane.fig("hbm.reserve.dense").value == model.dense_bytes
    assert model.dense_bytes - vision * 2 == 3_082_186_752           # Qwen3-30B-A3B's own non-routed bytes
    # KV: 48 layers x 2 x 4 KV heads x 128 x 2 B = 98,304 B per token, 3 GiB per 32,768 tokens.
    assert model.kv_token_bytes == 98_304
    assert lane.fig("kv.bytes_per_sequence").value == 48 * 2 * 4 * 128 * 2 * 32768 == 3 * GiB
    assert lane.fig("kv.full_sequences").value == 2
    # re-fitted at 34 hot / 94 cold once CUDA's total (31.84 GiB less the 500 MiB driver reservation)
    # replaced nvidia-smi's: 36 hot left 1 sequence of KV and a load peak over 31.35 GiB
    assert lane.fig("hbm.hot_experts").value == 34 * 48 * expert
    assert lane.fig("host.cold_experts").value == 94 * 48 * expert


def test_qwen35_hybrid_pool_on_one_rtx5090() -> None:
    model = _model("qwen3.5-35b-a3b-rtx5090")
    assert model.expert_bytes == (2 * 512 * 2048 + 2048 * 512) * 2 == 6_291_456
    lane = _lane("qwen3.5-35b-a3b-rtx5090")
    # Gated DeltaNet state per layer: conv (4 − 1) x (2 x 16 x 128 + 32 x 128) bf16 + recurrent
    # 32 heads x 128 x 128 in fp32 (text_config.mamba_ssm_dtype).
    state = 3 * (2 * 16 * 128 + 32 * 128) * 2 + 32 * 128 * 128 * 4
    assert lane.fig("kv.state_bytes_per_sequence_per_layer").value == state == 2_146_304
    assert sum(len(g.layers) for g in model.state) == 30             # full_attention_interval 4: 10 attention
    assert model.state_bytes_per_sequence == 30 * state == 64_389_120
    assert model.kv_token_bytes == 10 * 2 * 2 * 256 * 2 == 20_480
    # Attention 2 x 2 KV heads x 256 x 2 B = 2,048 B per token per layer; GDN checkpoints: align 64;
    # block = 64 x ceil(2,146,304 / (64 x 2,048)) = 64 x 17 = 1,088 tokens, page 1,088 x 2,048.
    assert lane.fig("kv.block_tokens").value == 64 * math.ceil(state / (64 * 2048)) == 1088
    page = 1088 * 2048
    assert lane.fig("kv.page_bytes").value == page == 2_228_224
    block = 10 * page                                                 # groups of 10 layers
    assert lane.fig("kv.bytes_per_block").value == block
    assert lane.fig("kv.state_blocks_per_sequence").value == 3
    per_seq = (math.ceil(131072 / 1088) + 3 * 3) * block              # (121 + 9) blocks
    assert lane.fig("kv.bytes_per_sequence").value == per_seq
    pool = lane.fig("hbm.kv_pool").value
    assert lane.fig("kv.full_sequences").value == pool // per_seq == 2
    assert lane.fig("kv.max_sequences").value == int(pool // block) // 10
    # --language-model-only: the vision tower (Qwen3-VL's without deepstack mergers) is not built.
    assert model.encoder_bytes == 446_571_248 * 2
    assert lane.fig("hbm.reserve.dense").value == model.dense_bytes - model.encoder_bytes
    # re-fitted at 71 hot (73 before the 500 MiB driver reservation): the largest count leaving 2 sequences
    assert lane.fig("hbm.hot_experts").value == 71 * 40 * 6_291_456


def test_glm5_on_8x_h200_counts_the_indexer_and_offloads_per_gpu() -> None:
    model = _model("glm-5-h200x8")
    # first_k_dense_replace 3: 75 MoE layers of 256 experts (w13 4096 x 6144 + w2 6144 x 2048, bf16).
    expert = (2 * 2048 * 6144 + 6144 * 2048) * 2
    assert model.expert_bytes == expert == 75_497_472 and model.num_moe_layers == 75
    lane = _lane("glm-5-h200x8")
    assert lane.fig("parallel.expert_shard_bytes").value == expert / 8
    # Every GPU caches the latent (512 + 64) x 2 B and the indexer key 128 + 4 B on all 78 layers.
    assert model.kv_token_bytes == 78 * (576 * 2 + 128 + 4) == 100_152
    per_seq = 78 * (576 * 2 + 128 + 4) * 131072
    assert lane.fig("kv.bytes_per_sequence").value == per_seq
    pool = lane.fig("hbm.kv_pool").value
    assert lane.fig("kv.full_sequences").value == pool // per_seq == 2
    assert pool // (78 * 576 * 2 * 131072) == 2                      # the latent alone: 10.97 GiB, still 2
    assert per_seq / (78 * 576 * 2 * 131072) == pytest.approx(1.1146, abs=1e-4)
    assert lane.fig("hbm.hot_experts").value == 134 * 75 * expert / 8
    assert lane.fig("host.cold_experts").value == 122 * 75 * expert
    # --cpu-offload-gb 41 per GPU: a layer's shards are 1.5 GiB (w13) + 0.75 GiB (w2); 18 layers
    # (40.5 GiB) < 41, layer 19's w13 ends the walk at 42 GiB on each of the 8 GPUs, pinned at
    # 2 + 1 GiB a layer and 2 GiB the lone w13.
    assert lane.fig("load.host_experts_initial").value == 8 * int((18 * 2.25 + 1.5) * GiB)
    assert lane.fig("load.host_pinned_initial").value == 8 * (18 * 3 + 2) * GiB


def test_nvfp4_qwen3_235b_on_one_b200() -> None:
    from recipegen.ledger import compute_lane
    from recipegen.schema.lane import Offload
    model = _model("qwen3-235b-a22b-nvfp4-b200")
    # hf_quant_config.json: NVFP4, group 16. w13 3072 x 4096 and w2 4096 x 1536 as e2m1 (2 per byte)
    # + one e4m3 scale per 16 values, + fp32 weight_scale_2 and input_scale: 2 + 2 for w13, 1 + 1 for w2.
    values = 3072 * 4096 + 4096 * 1536
    expert = values // 2 + values // 16 + 6 * 4
    assert model.expert_bytes == expert == 10_616_856
    assert (values * 2) / expert == pytest.approx(3.556, abs=1e-3)   # vs bf16
    lane = _lane("qwen3-235b-a22b-nvfp4-b200")
    assert lane.fig("hbm.hot_experts").value == 94 * 128 * expert   # every expert in HBM
    assert lane.fig("host.cold_experts").value == 0
    # kv_cache_quant_algo FP8: 94 layers x 2 x 4 KV heads x 128 x 1 B, 40,960 tokens a sequence.
    assert model.kv_token_bytes == 94 * 2 * 4 * 128 * 1 == 96_256       # half of bf16's
    per_seq = 94 * 2 * 4 * 128 * 40960
    assert lane.fig("kv.bytes_per_sequence").value == per_seq
    assert lane.fig("kv.full_sequences").value == lane.fig("hbm.kv_pool").value // per_seq == 9
    # Usage-aware residency on the same B200 is refused by name (no NVFP4 kernel in the runtime).
    loaded = load_recipe(REPO / "recipes" / "qwen3-235b-a22b-nvfp4-b200.yaml")
    recipe = loaded.recipe
    ua = recipe.lanes[0].model_copy(update={"offload": Offload(placement="usage-aware", hot_experts_per_layer=100)})
    got = compute_lane(recipe.model, recipe.machines["dgx"], ua)
    refusals = [v for v in got.violations if v.kind == "runtime"]
    assert refusals and "NVFP4" in refusals[0].message
