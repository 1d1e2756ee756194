"""`recipegen model import`: config.json fixtures (written from the public configs) -> model files.

Expected figures are hand arithmetic from each model's published geometry, written out here.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_support import invoke

from recipegen.catalog import catalog_entry
from recipegen.common.errors import InputError
from recipegen.load.recipe import load_recipe
from recipegen.modelimport import import_model
from recipegen.schema import Model

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "hf_configs"


def test_gpt_oss_120b_geometry_format_biases_activation_attention() -> None:
    m, text = import_model(FIX / "gpt-oss-120b")
    assert (m.decoder_layers, m.num_moe_layers, m.routed_experts, m.top_k) == (36, 36, 128, 4)
    # w13 5760x2880 + w2 2880x2880 MXFP4: values/2 + one ue8m0 byte per 32, plus bf16 biases 5760 + 2880.
    w13 = 5760 * 2880 // 2 + 5760 * 2880 // 32
    w2 = 2880 * 2880 // 2 + 2880 * 2880 // 32
    assert m.expert_bytes == w13 + w2 + (5760 + 2880) * 2 == 13_236_480
    assert m.expert_biases and m.expert_format == "mxfp4"
    assert m.activation is not None and (m.activation.kind, m.activation.alpha, m.activation.limit) == \
        ("swigluoai", 1.702, 7.0)
    kinds = {g.kind: g for g in m.attention}
    assert kinds["sliding"].layers == list(range(0, 36, 2)) and kinds["sliding"].window == 128
    assert kinds["full"].layers == list(range(1, 36, 2))
    assert m.kv_bytes_per_token == 36 * 2 * 8 * 64 * 2  # every layer uncapped, one rank
    doc = yaml.safe_load(text)
    assert doc["routed_experts"]["source"] == "config.json `num_local_experts`"
    assert "mxfp4.py:428" in doc["activation"]["source"]


def test_qwen3_235b_fp8_block_scales_and_bf16() -> None:
    fp8, _ = import_model(FIX / "qwen3-235b-a22b-fp8")
    bf16, _ = import_model(FIX / "qwen3-235b-a22b")
    values = 3 * 4096 * 1536
    # (24*32 + 32*12) 128x128 blocks, one fp32 scale each = 4,608 B.
    assert fp8.expert_bytes == values + 4608 and fp8.expert_format == "fp8-block"
    assert bf16.expert_bytes == 2 * values
    assert fp8.kv_bytes_per_token == 94 * 2 * 4 * 128 * 2


def test_deepseek_v3_mla_dense_layers_shared_expert() -> None:
    m, text = import_model(FIX / "deepseek-v3")
    assert m.moe_layers == list(range(3, 61)) and m.routed_experts == 256 and m.shared_experts == 1
    assert [g.kind for g in m.attention] == ["mla"] and m.kv_bytes_per_token == 61 * (512 + 64) * 2
    # FP8 w13 4096x7168 + w2 7168x2048 with 128x128 fp32 scales: (32*56 + 56*16) * 4 = 10,752 B.
    assert m.expert_bytes == 3 * 7168 * 2048 + 10_752
    assert "first_k_dense_replace" in yaml.safe_load(text)["moe_layers"]["source"]


@pytest.mark.parametrize("name, layers, experts, top_k, per_expert, kv", [
    ("qwen3-30b-a3b", 48, 128, 8, 3 * 2048 * 768 * 2, 48 * 2 * 4 * 128 * 2),
    ("kimi-k2-instruct", 60, 384, 8, 3 * 7168 * 2048 + 10_752, 61 * 576 * 2),
    ("glm-4.5-air", 45, 128, 8, 3 * 4096 * 1408 * 2, 46 * 2 * 8 * 128 * 2),
    ("mixtral-8x7b-v0.1", 32, 8, 2, 3 * 4096 * 14336 * 2, 32 * 2 * 8 * 128 * 2),
    ("gpt-oss-20b", 24, 32, 4, 13_236_480, 24 * 2 * 8 * 64 * 2),
])
def test_other_fixtures(name: str, layers: int, experts: int, top_k: int, per_expert: int, kv: int) -> None:
    m, _ = import_model(FIX / name)
    assert (m.num_moe_layers, m.routed_experts, m.top_k, m.expert_bytes, m.kv_bytes_per_token) == \
        (layers, experts, top_k, per_expert, kv)


def test_unknown_architecture_is_refused_and_a_missing_field_is_named(tmp_path: Path) -> None:
    cfg = json.loads((FIX / "mixtral-8x7b-v0.1" / "config.json").read_text())
    cfg["architectures"] = ["SomethingNewForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError) as err:
        import_model(tmp_path)
    text = str(err.value)
    assert "config.json" in text and "SomethingNewForCausalLM" in text and "MixtralForCausalLM" in text
    cfg["architectures"] = ["MixtralForCausalLM"]
    del cfg["num_local_experts"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError) as err:
        import_model(tmp_path)
    assert "num_local_experts" in str(err.value) and "n_routed_experts" in str(err.value)


def test_unknown_quantization_is_named(tmp_path: Path) -> None:
    cfg = json.loads((FIX / "qwen3-30b-a3b" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="quantization_config.quant_method"):
        import_model(tmp_path)


def _shard(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    header, offset = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * offset)


def test_safetensors_index_and_shard_headers_split_experts_from_dense(tmp_path: Path) -> None:
    cfg = json.loads((FIX / "mixtral-8x7b-v0.1" / "config.json").read_text())
    cfg.update(num_hidden_layers=1, num_local_experts=2, vocab_size=8, hidden_size=64, intermediate_size=32,
               num_attention_heads=4, num_key_value_heads=2)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    tensors = {"model.embed_tokens.weight": ("BF16", [8, 64], 1024),
               "model.layers.0.self_attn.q_proj.weight": ("BF16", [64, 64], 8192),
               "model.layers.0.block_sparse_moe.experts.0.w1.weight": ("BF16", [32, 64], 4096),
               "model.layers.0.block_sparse_moe.experts.1.w1.weight": ("BF16", [32, 64], 4096)}
    _shard(tmp_path / "model-00001-of-00001.safetensors", tensors)
    index = {"metadata": {"total_size": 17408}, "weight_map": {n: "model-00001-of-00001.safetensors" for n in tensors}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    m, text = import_model(tmp_path)
    assert m.dense_bytes == 1024 + 8192        # every tensor not under .experts., from the header
    assert m.total_bytes == 17408
    doc = yaml.safe_load(text)
    assert "shard header" in doc["dense_bytes"]["source"]
    # Geometry: 2 experts x (w13 64x64 + w2 64x32) bf16 = 24,576 B; the headers hold 8,192 (w1 only).
    assert "8,192 B of routed experts, the geometry 24,576 B" in doc["dense_bytes"]["source"]


def test_catalog_models_are_the_import_of_their_fixture() -> None:
    out = subprocess.run([sys.executable, "-m", "recipegen.modelimport.catalog", "--check"], cwd=REPO,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for name in ("gpt-oss-120b", "qwen3-235b-a22b-fp8", "deepseek-v3", "kimi-k2-instruct"):
        Model.model_validate(catalog_entry("models", name))


def test_recipe_references_a_model_file(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    _, text = import_model(FIX / "qwen3-30b-a3b", name="q30")
    (tmp_path / "models" / "q30.yaml").write_text(text)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "version: 1\nname: r\nmodel: {file: models/q30.yaml}\nmachines:\n  box: {catalog: rtx-4090}\n"
        "lanes:\n  - name: a\n    machine: box\n    gpus: [0]\n    port: 8000\n    image: vllm/vllm-openai:v0.33.0\n"
        "    gpu_memory_utilization: 0.9\n    max_model_len: 8192\n    concurrency: {max: 1}\n"
        "    offload: {placement: positional, load_cpu_offload: 40 GiB}\n"
        "    reserves: {hbm: {value: 3 GiB, source: test}}\n")
    loaded = load_recipe(recipe)
    assert loaded.recipe.model.name == "q30" and loaded.recipe.model.routed_experts == 128
    (tmp_path / "models" / "q30.yaml").write_text(text.replace("value: 128\n", "value: -1\n", 1))
    with pytest.raises(InputError) as err:
        load_recipe(recipe)
    assert "q30.yaml" in str(err.value) and "routed_experts" in str(err.value)


def test_cli_writes_the_model_file_and_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "m.yaml"
    args = ["model", "import", str(FIX / "glm-4.5-air"), "-o", str(out), "--checkpoint", "zai-org/GLM-4.5-Air"]
    result = invoke(*args)
    assert result.code == 0, result.output
    doc = yaml.safe_load(out.read_text())
    assert doc["checkpoint"] == "zai-org/GLM-4.5-Air" and doc["moe_layers"]["value"] == "1-45"
    again = invoke(*args)
    assert again.code == 2 and "--force" in again.output
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"architectures": ["X"], "num_hidden_layers": 2}')
    result = invoke("model", "import", str(bad), "-o", "-")
    assert result.code == 2 and "architecture 'X'" in result.output and "Traceback" not in result.output


def test_index_without_shards_takes_dense_bytes_from_total_size(tmp_path: Path) -> None:
    cfg = json.loads((FIX / "mixtral-8x7b-v0.1" / "config.json").read_text())
    cfg.update(num_hidden_layers=1, num_local_experts=2, vocab_size=8, hidden_size=64, intermediate_size=32,
               num_attention_heads=4, num_key_value_heads=2)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    # One MoE layer, 2 experts of 3 * 64 * 32 bf16 = 12,288 B: 24,576 B of experts.
    names = ["model.embed_tokens.weight", "model.layers.0.block_sparse_moe.experts.0.w1.weight"]
    index = {"metadata": {"total_size": 24_576 + 5_000}, "weight_map": {n: "absent.safetensors" for n in names}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    m, text = import_model(tmp_path)
    assert m.dense_bytes == 5_000 and m.total_bytes == 29_576
    assert "metadata.total_size" in yaml.safe_load(text)["dense_bytes"]["source"]
    index["metadata"]["total_size"] = 100
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InputError, match="smaller than the routed experts"):
        import_model(tmp_path)


def test_float32_config_is_counted_as_vllm_loads_it(tmp_path: Path) -> None:
    # vLLM 0.33's --dtype auto (what a rendered lane runs) downcasts a float32 model to bf16 on compute capability
    # 8.0 and later (config/model.py _resolve_auto_dtype): 2 B per weight and per KV value, not 4.
    bf16, _ = import_model(FIX / "qwen3-30b-a3b")
    cfg = json.loads((FIX / "qwen3-30b-a3b" / "config.json").read_text())
    assert cfg["torch_dtype"] == "bfloat16"
    cfg["torch_dtype"] = "float32"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m, text = import_model(tmp_path)
    assert m.expert_bytes == 3 * 2048 * 768 * 2 == bf16.expert_bytes
    assert m.kv_bytes_per_token == 48 * 2 * 4 * 128 * 2 == bf16.kv_bytes_per_token
    assert m.dense_bytes == bf16.dense_bytes
    doc = yaml.safe_load(text)
    source = " ".join(doc["expert_tensors"]["source"].split())
    assert [t["dtype"] for t in doc["expert_tensors"]["value"]] == ["bf16", "bf16"]
    assert "`torch_dtype` float32; loaded as bf16" in source and "config/model.py:2440-2442" in source
    # An index beside it sizes the stored float32 tensors: its figures would double the dense bytes, so the
    # geometry is used and the source says why.
    index = {"metadata": {"total_size": 4 * (bf16.dense_bytes + 48 * 128 * bf16.expert_bytes) // 2},
             "weight_map": {"model.embed_tokens.weight": "absent.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    m2, text2 = import_model(tmp_path)
    assert m2.dense_bytes == bf16.dense_bytes
    assert "not used: it sizes the stored float32 tensors" in yaml.safe_load(text2)["dense_bytes"]["source"]


def test_compressed_tensors_int4_groups(tmp_path: Path) -> None:
    # Kimi-K2-Thinking's published scheme: int4 symmetric weights, group_size 32, on Kimi-K2 geometry.
    cfg = json.loads((FIX / "kimi-k2-instruct" / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": {
            "num_bits": 4, "type": "int", "symmetric": True, "group_size": 32, "strategy": "group"}}}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m, _ = import_model(tmp_path)
    # w13 4096x7168: 4096*7168/2 B + 4096*(7168/32) bf16 scales; w2 7168x2048: 7168*2048/2 + 7168*64*2;
    # plus vLLM's w13_weight_shape and w2_weight_shape, [2] each in the model dtype (4 B each).
    assert m.expert_bytes == 4096 * 7168 // 2 + 4096 * 224 * 2 + 7168 * 2048 // 2 + 7168 * 64 * 2 + 8 == 24_772_616
    assert m.expert_format == "int4"


def test_a_shared_expert_field_qwen3_moe_does_not_read_is_refused(tmp_path: Path) -> None:
    # vLLM 0.33's Qwen3-MoE has no shared expert (qwen3_moe.py): a config that declares one is not
    # the model vLLM would build, so the importer refuses it instead of guessing either way.
    cfg = json.loads((FIX / "qwen3-30b-a3b" / "config.json").read_text())
    cfg["shared_expert_intermediate_size"] = 512
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError) as err:
        import_model(tmp_path)
    assert "shared_expert_intermediate_size" in str(err.value) and "Qwen3MoeForCausalLM" in str(err.value)


def test_max_model_len_beyond_the_checkpoint_is_an_error(tmp_path: Path) -> None:
    # Qwen3-30B-A3B's config.json: max_position_embeddings 40960.
    (tmp_path / "models").mkdir()
    _, text = import_model(FIX / "qwen3-30b-a3b", name="q30")
    (tmp_path / "models" / "q30.yaml").write_text(text)
    recipe = tmp_path / "r.yaml"
    body = ("version: 1\nname: r\nmodel: {file: models/q30.yaml}\nmachines:\n  box: {catalog: rtx-4090}\n"
            "lanes:\n  - name: a\n    machine: box\n    gpus: [0]\n    port: 8000\n"
            "    image: vllm/vllm-openai:v0.33.0\n    gpu_memory_utilization: 0.9\n    max_model_len: 65536\n"
            "    concurrency: {max: 1}\n    offload: {placement: positional, load_cpu_offload: 40 GiB}\n"
            "    reserves: {hbm: {value: 3 GiB, source: test}}\n")
    recipe.write_text(body)
    with pytest.raises(InputError) as err:
        load_recipe(recipe)
    assert "max_model_len" in str(err.value) and "40,960" in str(err.value) and ":13:" in str(err.value)
    recipe.write_text(body + "    env: {VLLM_ALLOW_LONG_MAX_MODEL_LEN: '1'}\n")
    assert load_recipe(recipe).recipe.lanes[0].max_model_len == 65536


def test_context_length_follows_vllms_rope_rule(tmp_path: Path) -> None:
    # gpt-oss: YaRN, max_position_embeddings is already the scaled 131,072 (not x 32).
    assert import_model(FIX / "gpt-oss-120b")[0].max_position_embeddings == 131072
    # A linear / dynamic factor multiplies it (vLLM's _get_and_verify_max_len).
    cfg = json.loads((FIX / "qwen3-30b-a3b" / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "dynamic", "factor": 2.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert import_model(tmp_path)[0].max_position_embeddings == 40960 * 2
