"""Public configs the importer wrongly refused, read as vLLM 0.33 reads them (each fixture's SOURCE.md says where its
config.json is from: AIConfigurator commit 095f58a). Expected figures are derived here by hand from the config.

1. Qwen/Qwen3-Coder-480B-A35B-Instruct carries `qkv_bias` false, `use_qk_norm` true and `shared_expert_intermediate_size`
   0. vLLM 0.33's Qwen3-MoE builds q/k/v biases from `attention_bias` and never reads qkv_bias
   (model_executor/models/qwen3_moe.py:376, :289), always builds the per-head q/k RMSNorm (:326-327) and builds a shared
   expert only when shared_expert_intermediate_size is above 0 (:177-201): each is accepted with the value that matches
   what vLLM builds and refused otherwise.
2. nvidia/Qwen3.5-122B-A10B-NVFP4 carries `vision_config.dtype` (transformers 5 writes it). vLLM builds the whole model,
   tower included, in one dtype (model_loader/base_loader.py:73) taken from the root `dtype`, then text_config's, and
   from vision_config's only when neither is given (transformers_utils/model_arch_config_convertor.py:210-217): accepted
   when it is that dtype.
3. Nemotron-H configs written by transformers hold `time_step_limit` [0.0, Infinity]; vLLM 0.33 never reads the field.
   NaN / Infinity stay refused wherever the importer reads them and in every other field, except there, and only after
   the fields are checked — so NVIDIA-Nemotron-3-Super's real blocker (`moe_latent_size`) is what the user sees.
4. nvidia/GLM-5-NVFP4 and nvidia/DeepSeek-V3.2-NVFP4's hf_quant_config.json name `kv_cache_quant_algo` FP8, an fp8 cache
   on DeepSeek sparse attention. What vLLM 0.33 stores depends on the GPU's backend: FLASHMLA_SPARSE (Hopper, SM120)
   keeps `fp8_ds_mla`, 512 fp8 values + 4 fp32 scales + 64 bf16 RoPE values = 656 B per token per layer
   (model_executor/layers/attention/mla_attention.py:359-376, :1386), while the SM100 family's preferred
   FLASHINFER_MLA_SPARSE keeps plain fp8, (512 + 64) x 1 B (platforms/cuda.py:96-106). The model file records fp8 and
   the ledger sizes each machine's pool by its backend.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from recipegen.common.errors import InputError
from recipegen.ledger import compute_lane
from recipegen.modelimport import import_model
from recipegen.modelimport.jsondoc import NonFinite, parse_json

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "hf_configs"
CODER = "qwen3-coder-480b-a35b-instruct"
QWEN35_NVFP4 = "qwen3.5-122b-a10b-nvfp4"
SUPER = "nemotron-3-super-120b-a12b-nvfp4"


def _copy(tmp_path: Path, fixture: str, edit=None, text_edit=None) -> Path:
    folder = tmp_path / fixture
    folder.mkdir(parents=True)
    text = (FIX / fixture / "config.json").read_text()
    if edit is not None:
        cfg = json.loads(text)
        edit(cfg)
        text = json.dumps(cfg, indent=2)
    if text_edit is not None:
        text = text_edit(text)
    (folder / "config.json").write_text(text)
    return folder


def _line(folder: Path, needle: str) -> int:
    return next(i for i, s in enumerate((folder / "config.json").read_text().splitlines(), 1) if needle in s)


# --- 1. Qwen3-Coder-480B-A35B-Instruct

def test_qwen3_coder_480b_imports_with_hand_figures() -> None:
    m, text = import_model(FIX / CODER)
    h, vocab, layers, experts, top_k, inter = 6144, 151936, 62, 160, 8, 2560
    heads, kv_heads, hd = 96, 8, 128
    # bf16 experts: w13 [2 × 2560, 6144] + w2 [6144, 2560], two bytes each.
    assert m.expert_bytes == (2 * inter * h + h * inter) * 2 == 3 * 2560 * 6144 * 2 == 94_371_840
    # 62 full-attention layers × K and V × 8 KV heads × 128 × bf16.
    assert m.kv_bytes_per_token == layers * 2 * kv_heads * hd * 2 == 253_952
    assert (m.num_moe_layers, m.routed_experts) == (62, 160)
    # Parameters by hand: untied embeddings + head, final norm; per layer two norms, q/k/v/o without biases, the
    # q/k RMSNorm, the router; 160 experts; no shared expert.
    attn = heads * hd * h + 2 * kv_heads * hd * h + h * heads * hd + 2 * hd
    layer = 2 * h + attn + experts * h
    outside = 2 * vocab * h + h
    expert = 3 * inter * h
    total = outside + layers * (layer + experts * expert)
    assert total == 480_154_875_392       # "480B"; the Hugging Face Hub's safetensors count as public listings quote it
    assert round((outside + layers * (layer + top_k * expert)) / 1e9) == 35          # "A35B" active per token
    assert m.dense_bytes == 2 * (outside + layers * layer)
    assert m.dense_bytes + layers * experts * m.expert_bytes == 2 * total
    doc = yaml.safe_load(text)
    attn_src = doc["attention"][0]["layers"]["source"]
    assert "`qkv_bias` false read" in attn_src and "qwen3_moe.py:376" in attn_src
    assert "`use_qk_norm` true read" in attn_src and "qwen3_moe.py:326-327" in attn_src
    assert doc["shared_experts"]["value"] == 0
    assert "`shared_expert_intermediate_size` 0" in doc["shared_experts"]["source"]
    assert "qwen3_moe.py:177-201" in doc["shared_experts"]["source"]


@pytest.mark.parametrize("field, value, expect", [
    ("qkv_bias", True, "builds q/k/v biases from `attention_bias`"),
    ("use_qk_norm", False, "always builds and applies the per-head q/k RMSNorm"),
    ("shared_expert_intermediate_size", 2560, "builds a shared expert"),
])
def test_qwen3_moe_refuses_what_vllm_does_not_build(tmp_path: Path, field: str, value: object, expect: str) -> None:
    folder = _copy(tmp_path, CODER, edit=lambda c: c.__setitem__(field, value))
    with pytest.raises(InputError) as e:
        import_model(folder)
    assert e.value.field == field and expect in e.value.message
    assert e.value.line == _line(folder, f'"{field}"')


def test_qwen3_moe_qkv_bias_follows_attention_bias(tmp_path: Path) -> None:
    # Both true: vLLM builds the biases (from attention_bias), and so does the import: 62 × (96 + 2 × 8) × 128 values.
    plain, _ = import_model(FIX / CODER)
    both = _copy(tmp_path, CODER, edit=lambda c: c.update(qkv_bias=True, attention_bias=True))
    m, _ = import_model(both)
    assert m.dense_bytes - plain.dense_bytes == 62 * (96 + 2 * 8) * 128 * 2


# --- 2. Qwen3.5-122B-A10B-NVFP4: vision_config.dtype

def test_qwen35_nvfp4_imports_with_its_vision_dtype() -> None:
    m, text = import_model(FIX / QWEN35_NVFP4)
    h, inter = 3072, 1024
    # NVFP4 experts: e2m1 values (2 per byte) + one e4m3 scale per 16 + fp32 global/input scales, w13 2 + 2, w2 1 + 1.
    values = 2 * inter * h + h * inter
    assert m.expert_bytes == values // 2 + values // 16 + 4 * (4 + 2) == 5_308_440
    assert (m.num_moe_layers, m.routed_experts) == (48, 256)
    # kv_cache_scheme FP8: the 12 full-attention layers (every 4th of 48) × K and V × 2 KV heads × 256 × 1 B.
    assert m.kv_bytes_per_token == 12 * 2 * 2 * 256 == 12_288
    # The vision tower (left bf16 by `ignore`), Qwen3_VisionTransformer of vision_config: width 1152, MLP 4304, 27
    # blocks, Conv3d patch 3 × 2 × 16 × 16, 2304 positions, merger 2 × 2 → 4608 → text width 3072, no deepstack.
    hv, iv, depth, mm, out = 1152, 4304, 27, 1152 * 4, 3072
    block = 4 * hv + (3 * hv * hv + 3 * hv) + (hv * hv + hv) + (iv * hv + iv) + (hv * iv + hv)
    tower = hv * 3 * 2 * 16 * 16 + hv + 2304 * hv + depth * block + 2 * hv + (mm * mm + mm) + (out * mm + out)
    assert m.encoder_bytes == 2 * tower == 902_581_728
    doc = yaml.safe_load(text)
    assert "`vision_config.dtype` bfloat16 read" in doc["encoder_bytes"]["source"]
    assert "base_loader.py:73" in doc["encoder_bytes"]["source"]


def test_vision_dtype_other_than_the_model_dtype_is_refused(tmp_path: Path) -> None:
    folder = _copy(tmp_path, QWEN35_NVFP4, edit=lambda c: c["vision_config"].__setitem__("dtype", "float32"))
    with pytest.raises(InputError) as e:
        import_model(folder)
    assert e.value.field == "vision_config.dtype" and "one model dtype" in e.value.message
    lines = (folder / "config.json").read_text().splitlines()
    assert '"dtype": "float32"' in lines[e.value.line - 1]


# --- 3. NaN / Infinity: refused where read, the real refusal first

def test_nemotron_super_reports_its_real_blocker_not_infinity() -> None:
    assert "Infinity" in (FIX / SUPER / "config.json").read_text().splitlines()[61]      # time_step_limit, line 62
    with pytest.raises(InputError) as e:
        import_model(FIX / SUPER)
    assert e.value.field == "moe_latent_size" and e.value.line == 34
    assert "not a field the importer reads" in e.value.message and "Infinity" not in str(e.value)


def test_infinity_in_time_step_limit_changes_nothing(tmp_path: Path) -> None:
    plain, plain_text = import_model(FIX / "nemotron-3-nano-30b-a3b")
    folder = _copy(tmp_path, "nemotron-3-nano-30b-a3b", text_edit=lambda t: t.replace(
        '"max_position_embeddings": 262144,', '"max_position_embeddings": 262144,\n    "time_step_limit": [\n'
        '        0.0,\n        Infinity\n    ],', 1))
    m, _ = import_model(folder)
    assert m == plain


@pytest.mark.parametrize("old, new, field", [
    ('"max_position_embeddings": 40960', '"max_position_embeddings": Infinity', "max_position_embeddings"),
    ('"rope_scaling": null', '"rope_scaling": {"rope_type": "yarn",\n  "factor": -Infinity}', "rope_scaling.factor"),
    ('"mlp_only_layers": []', '"mlp_only_layers": [1,\n  NaN]', "mlp_only_layers[1]"),
])
def test_nonfinite_in_a_read_field_is_refused_with_its_line(tmp_path: Path, old: str, new: str, field: str) -> None:
    folder = _copy(tmp_path, "qwen3-30b-a3b", text_edit=lambda t: t.replace(old, new, 1))
    word = next(w for w in ("-Infinity", "Infinity", "NaN") if w in new)
    with pytest.raises(InputError) as e:
        import_model(folder)
    assert e.value.field == field and f"{word} is not a JSON number in a field the importer reads" in e.value.message
    assert word in (folder / "config.json").read_text().splitlines()[e.value.line - 1]


def test_nonfinite_in_an_unread_field_is_refused_after_the_fields(tmp_path: Path) -> None:
    # rms_norm_eps changes no size, but a NaN there is still JSON that readers disagree on — refused, with its line,
    # once no field is refused.
    folder = _copy(tmp_path, "qwen3-30b-a3b", text_edit=lambda t: t.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN'))
    with pytest.raises(InputError) as e:
        import_model(folder)
    assert e.value.field == "rms_norm_eps" and "NaN is not a JSON number" in e.value.message
    assert e.value.line == _line(folder, "rms_norm_eps")
    # time_step_limit is accepted only where nothing reads it: in a Qwen3-MoE config it is an unread field.
    folder = _copy(tmp_path / "b", "qwen3-30b-a3b", text_edit=lambda t: t.replace(
        '"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e-06, "time_step_limit": [0.0, Infinity]'))
    with pytest.raises(InputError) as e:
        import_model(folder)
    assert e.value.field == "time_step_limit" and "not a field the importer reads" in e.value.message


def test_other_json_files_still_refuse_nonfinite_at_parse() -> None:
    with pytest.raises(InputError, match="Infinity is not a JSON number"):
        parse_json('{"a": [0.0, Infinity]}', "hf_quant_config.json")
    with pytest.raises(InputError, match="-Infinity is not a JSON number"):
        parse_json('{"a": -Infinity}', "x.json")
    doc = parse_json('{"a": [0.0,\n Infinity], "b": NaN}', "config.json", nonfinite=True)
    assert doc.data == {"a": [0.0, NonFinite("Infinity")], "b": NonFinite("NaN")}
    assert doc.nonfinite == {("a", 1): "Infinity", ("b",): "NaN"} and doc.line(("a", 1)) == 2


def test_sparse_mla_with_an_fp8_cache_imports_and_each_machine_sizes_it(tmp_path: Path) -> None:
    from test_ledger_state import lane, machine

    folder = tmp_path / "glm-5-nvfp4"
    folder.mkdir()
    (folder / "config.json").write_bytes((FIX / "glm-5" / "config.json").read_bytes())
    (folder / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.39.0"},
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
                         "exclude_modules": ["lm_head"]}}))
    model, text = import_model(folder)
    assert {g.kv_dtype for g in model.attention} == {"fp8"}
    # GLM-5: 78 layers of MLA, kv_lora_rank 512 + rope 64 at 1 B, and the indexer key 128 + 4 B
    assert model.kv_bytes_per_token == 78 * (576 + 132)
    source = yaml.safe_load(text)["kv_bytes_per_token"]["source"]
    assert "656 B per token per layer" in source and "per machine" in source
    # The checkpoint's scheme is fp8_e4m3 to vLLM: plain fp8 on Hopper and the SM100 family (FlashInfer's
    # sparse backends), fp8_ds_mla on SM120, and on Hopper where the lane names `--kv-cache-dtype fp8`
    # (FLASHMLA_SPARSE takes that spelling, not fp8_e4m3).
    def per_sequence(cc: str, *extra: str) -> float:
        return compute_lane(model, machine(cc), lane(tp=8, kv="20 GiB", extra=list(extra))).fig(
            "kv.bytes_per_sequence").value

    assert per_sequence("9.0") == per_sequence("10.0") == 78 * (576 + 132) * 32768
    assert per_sequence("12.0") == 78 * (512 + 4 * 4 + 64 * 2 + 132) * 32768
    assert per_sequence("9.0", "--kv-cache-dtype", "fp8") == 78 * (512 + 4 * 4 + 64 * 2 + 132) * 32768
    assert per_sequence("9.0", "--kv-cache-dtype", "fp8_e4m3") == 78 * (576 + 132) * 32768
