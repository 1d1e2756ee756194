"""What `model import` takes for a field config.json leaves out.

vLLM 0.33.0 builds config.json through the transformers config class of its `model_type` (AutoConfig, vLLM's own
registry first: deepseek_v32 and kimi_k2 are DeepseekV3Config); a field the file omits takes that class's default, a
JSON null reaches the class as None (refused where the field is typed without None). vLLM 0.33.0 requires
transformers>=5.16.1,<5.21.0; the defaults below were read from transformers 5.20.2 (models/<type>/configuration_
<type>.py) and are the same in 5.16.1. Expected figures are hand arithmetic from each fixture's config.json and those
defaults:

- Qwen3MoeConfig num_key_value_heads 4: Qwen3-30B-A3B without it caches 48 layers × 2 × 4 × 128 × 2 B = 98,304 B
  per token, not the 786,432 B of 32 "multi-head" KV heads.
- MixtralConfig 8 KV heads; GptOssConfig head_dim 64 and sliding_window 128 with layer_types alternating sliding
  (even) and full (odd), which is also what vLLM builds whatever layer_types says (gpt_oss.py:175).
- DeepseekV3Config first_k_dense_replace 3, n_shared_experts 1, q_lora_rank 1536 (DeepSeek-V3's own values);
  Glm4MoeConfig first_k_dense_replace 1, n_shared_experts 1 (GLM-4.5-Air's own); Glm4MoeConfig declares no
  head_dim and vLLM reads config.head_dim (glm4_moe.py:344): refused.
- Qwen3NextConfig / Qwen3_5MoeTextConfig: 2 KV heads, head_dim 256, shared_expert_intermediate_size 512.
- NemotronHConfig: 8 KV heads, head_dim 128, n_shared_experts 1. Llama4TextConfig: attention_chunk_size 8192.
- Qwen3VLMoeTextConfig: 16 KV heads; Qwen3VLMoeVisionConfig deepstack_visual_indexes [8, 16, 24].
- tie_word_embeddings: vLLM copies a multimodal wrapper's root value into its text config (config/vllm.py:1011-1015,
  VllmConfig.with_hf_config: Qwen3-VL, Llama-4, Kimi-K2.5; Kimi_K25Config defaults it to true, which vLLM then undoes
  when the checkpoint has an lm_head: refused when absent); Qwen3.5 reads text_config's (qwen3_5.py:332, :353).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_support import invoke

from recipegen.common.errors import InputError
from recipegen.modelimport import import_model
from recipegen.modelimport.families import FAMILIES
from recipegen.modelimport.hfdefaults import CLASSES, ROOT
from recipegen.modelimport.write import describe_difference

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "hf_configs"
DROP = object()


def _variant(tmp_path: Path, fixture: str, root: dict | None = None, text: dict | None = None,
             vision: dict | None = None, name: str = "v") -> Path:
    """A copy of a fixture's config.json with fields set (None: JSON null) or removed (DROP)."""
    cfg = json.loads((FIX / fixture / "config.json").read_text())
    for section, edits in ((cfg, root), (cfg.get("text_config"), text), (cfg.get("vision_config"), vision)):
        for key, value in (edits or {}).items():
            if value is DROP:
                section.pop(key, None)
            else:
                section[key] = value
    folder = tmp_path / name / fixture
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def _import(folder: Path):
    model, text = import_model(folder, name="m")
    return model, yaml.safe_load(text)


def _fixture(fixture: str):
    return _import(FIX / fixture)


def _refusal(folder: Path) -> str:
    with pytest.raises(InputError) as err:
        import_model(folder, name="m")
    return str(err.value)


# --- finding 2: num_key_value_heads, and the other fields the importer used to default silently

def test_qwen3_moe_without_kv_heads_takes_qwen3moeconfigs_4(tmp_path: Path) -> None:
    m, doc = _import(_variant(tmp_path, "qwen3-30b-a3b", {"num_key_value_heads": DROP}))
    assert m.attention[0].kv_heads == 4
    assert m.kv_bytes_per_token == 48 * 2 * 4 * 128 * 2 == 98_304
    src = doc["attention"][0]["kv_heads"]["source"]
    assert "transformers 5.20.2 Qwen3MoeConfig default 4" in src and "configuration_qwen3_moe.py" in src
    # the KV projections are sized by the same 4 heads: the whole model is the fixture's
    assert m.dense_bytes == _fixture("qwen3-30b-a3b")[0].dense_bytes


def test_a_null_kv_head_count_is_refused_where_transformers_refuses_it(tmp_path: Path) -> None:
    msg = _refusal(_variant(tmp_path, "qwen3-30b-a3b", {"num_key_value_heads": None}))
    assert "num_key_value_heads" in msg and "null" in msg and "Qwen3MoeConfig" in msg and "gives 4" in msg


def test_without_model_type_a_default_cannot_be_told_and_is_refused(tmp_path: Path) -> None:
    # refused at model_type itself: transformers' AutoConfig cannot pick the config class without it
    msg = _refusal(_variant(tmp_path, "qwen3-30b-a3b", {"num_key_value_heads": DROP, "model_type": DROP}))
    assert "field 'model_type'" in msg and "has no `model_type`" in msg and "AutoConfig" in msg
    assert msg.rstrip().endswith("uses: qwen3_moe")


def test_mixtral_and_gpt_oss_heads_and_head_dim(tmp_path: Path) -> None:
    mix, doc = _import(_variant(tmp_path, "mixtral-8x7b-v0.1", {"num_key_value_heads": DROP}))
    assert mix.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131_072            # not 32 KV heads: 524,288
    assert "MixtralConfig default 8" in doc["attention"][0]["kv_heads"]["source"]
    oss, doc = _import(_variant(tmp_path, "gpt-oss-120b", {"head_dim": DROP}, name="oss"))
    assert [g.head_dim for g in oss.attention] == [64, 64]                       # not 2880 / 64 = 45
    assert oss.kv_bytes_per_token == 36 * 2 * 8 * 64 * 2 == 73_728
    assert "GptOssConfig default 64" in doc["attention"][0]["head_dim"]["source"]


def test_gpt_oss_sliding_layers_are_vllms_even_layers(tmp_path: Path) -> None:
    m, doc = _import(_variant(tmp_path, "gpt-oss-120b", {"sliding_window": DROP, "layer_types": DROP}))
    sliding = next(g for g in m.attention if g.kind == "sliding")
    assert sliding.layers == list(range(0, 36, 2)) and sliding.window == 128     # GptOssConfig default window
    assert "GptOssConfig default 128" in doc["attention"][0]["window"]["source"]
    # vLLM gives even layers the window whatever layer_types lists (gpt_oss.py:175): another layout is refused
    swapped = ["full_attention", "sliding_attention"] * 18
    msg = _refusal(_variant(tmp_path, "gpt-oss-120b", {"layer_types": swapped}, name="swap"))
    assert "layer_types[0]" in msg and "gpt_oss.py:175" in msg
    # every entry sliding: vLLM sets the model-level window, so odd layers slide too (engine/arg_utils.py:2288-2294)
    m, _ = _import(_variant(tmp_path, "gpt-oss-120b", {"layer_types": ["sliding_attention"] * 36}, name="all"))
    assert [(g.kind, len(g.layers)) for g in m.attention] == [("sliding", 36)]
    # a null window: GptOssConfig keeps None, vLLM gives no layer a window
    m, _ = _import(_variant(tmp_path, "gpt-oss-120b", {"sliding_window": None, "layer_types": DROP}, name="null"))
    assert [(g.kind, len(g.layers)) for g in m.attention] == [("full", 36)]
    msg = _refusal(_variant(tmp_path, "gpt-oss-120b", {"tie_word_embeddings": True}, name="tie"))
    assert "tie_word_embeddings" in msg and "lm_head" in msg


def test_deepseek_defaults_are_deepseekv3configs(tmp_path: Path) -> None:
    fixture, _ = _fixture("deepseek-v3")
    m, doc = _import(_variant(tmp_path, "deepseek-v3", {"first_k_dense_replace": DROP, "n_shared_experts": DROP,
                                                        "q_lora_rank": DROP, "moe_layer_freq": DROP}))
    assert m.moe_layers == list(range(3, 61)) and m.shared_experts == 1          # not 61 MoE layers, no shared
    assert m.dense_bytes == fixture.dense_bytes                                  # q_a / q_b at rank 1536 as given
    assert "DeepseekV3Config default 3" in doc["moe_layers"]["source"]
    assert "DeepseekV3Config default 1" in doc["shared_experts"]["source"]


def test_deepseek_query_lora_absent_is_1536_and_null_is_none(tmp_path: Path) -> None:
    bf16 = {"quantization_config": DROP}
    given, _ = _import(_variant(tmp_path, "deepseek-v3", bf16, name="given"))
    absent, _ = _import(_variant(tmp_path, "deepseek-v3", {**bf16, "q_lora_rank": DROP}, name="absent"))
    null, doc = _import(_variant(tmp_path, "deepseek-v3", {**bf16, "q_lora_rank": None}, name="null"))
    assert absent.dense_bytes == given.dense_bytes
    # null: no query LoRA. q_proj [128 × (128 + 64), 7168] replaces q_a [1536, 7168] + its norm [1536] + q_b
    # [24576, 1536], on each of the 61 layers, bf16.
    q_proj = 128 * 192 * 7168
    lora = 1536 * 7168 + 1536 + 128 * 192 * 1536
    assert null.dense_bytes - given.dense_bytes == 61 * (q_proj - lora) * 2 == 15_542_854_656
    # GlmMoeDsaConfig types q_lora_rank as int: a null cannot be loaded
    assert "q_lora_rank" in _refusal(_variant(tmp_path, "glm-5", {"q_lora_rank": None}, name="glm5"))


def test_glm45_defaults_and_the_head_dim_vllm_needs(tmp_path: Path) -> None:
    fixture, _ = _fixture("glm-4.5-air")
    m, doc = _import(_variant(tmp_path, "glm-4.5-air", {"first_k_dense_replace": DROP, "n_shared_experts": DROP,
                                                        "num_key_value_heads": DROP}))
    assert m.moe_layers == list(range(1, 46)) and m.shared_experts == 1
    assert m.dense_bytes == fixture.dense_bytes and m.kv_bytes_per_token == fixture.kv_bytes_per_token
    assert "Glm4MoeConfig default 1" in doc["moe_layers"]["source"]
    msg = _refusal(_variant(tmp_path, "glm-4.5-air", {"head_dim": DROP}, name="hd"))
    assert "head_dim" in msg and "glm4_moe.py:344" in msg and "Glm4MoeConfig" in msg


def test_qwen3_next_and_qwen35_text_defaults(tmp_path: Path) -> None:
    nxt, _ = _fixture("qwen3-next-80b-a3b-thinking")
    m, doc = _import(_variant(tmp_path, "qwen3-next-80b-a3b-thinking", {
        "num_key_value_heads": DROP, "head_dim": DROP, "shared_expert_intermediate_size": DROP}))
    assert m.kv_bytes_per_token == 12 * 2 * 2 * 256 * 2 == 24_576               # not 16 heads of 128: 98,304
    assert m.shared_experts == 1 and m.dense_bytes == nxt.dense_bytes          # the 512-wide shared expert
    assert "Qwen3NextConfig default 512" in doc["shared_experts"]["source"]
    q35, _ = _fixture("qwen3.5-35b-a3b")
    m, _ = _import(_variant(tmp_path, "qwen3.5-35b-a3b", text={"num_key_value_heads": DROP, "head_dim": DROP},
                            name="q35"))
    assert m.kv_bytes_per_token == 10 * 2 * 2 * 256 * 2 == 20_480
    assert m.dense_bytes == q35.dense_bytes


def test_nemotron_h_defaults(tmp_path: Path) -> None:
    fixture, _ = _fixture("nemotron-3-nano-30b-a3b")
    m, _ = _import(_variant(tmp_path, "nemotron-3-nano-30b-a3b", {"n_shared_experts": DROP, "head_dim": DROP}))
    assert m.shared_experts == 1 and m.dense_bytes == fixture.dense_bytes       # head_dim 128, not 2688 / 32 = 84
    m, doc = _import(_variant(tmp_path, "nemotron-3-nano-30b-a3b", {"num_key_value_heads": DROP}, name="kv"))
    assert m.kv_bytes_per_token == 6 * 2 * 8 * 128 * 2 == 24_576               # 6 attention layers, 8 KV heads
    assert "NemotronHConfig default 8" in doc["attention"][0]["kv_heads"]["source"]
    # a window is every attention layer's own (nemotron_h.py:478-488)
    m, _ = _import(_variant(tmp_path, "nemotron-3-nano-30b-a3b", {"sliding_window": 4096}, name="sw"))
    assert [(g.kind, g.window) for g in m.attention] == [("sliding", 4096)]


def test_llama4_chunk_and_qwen3_vl_defaults(tmp_path: Path) -> None:
    scout, _ = _fixture("llama-4-scout-17b-16e-instruct")
    m, doc = _import(_variant(tmp_path, "llama-4-scout-17b-16e-instruct", text={"attention_chunk_size": DROP}))
    assert [(g.kind, g.chunk) for g in m.attention] == [(g.kind, g.chunk) for g in scout.attention]
    assert ("chunked", 8192) in [(g.kind, g.chunk) for g in m.attention]
    vl, _ = _fixture("qwen3-vl-30b-a3b-instruct")
    m, _ = _import(_variant(tmp_path, "qwen3-vl-30b-a3b-instruct", text={"num_key_value_heads": DROP},
                            vision={"deepstack_visual_indexes": DROP}, name="vl"))
    assert m.kv_bytes_per_token == 48 * 2 * 16 * 128 * 2 == 393_216            # Qwen3VLMoeTextConfig: 16
    assert m.encoder_bytes == vl.encoder_bytes                                  # the three deepstack mergers


def test_tie_word_embeddings_is_read_where_vllm_reads_it(tmp_path: Path) -> None:
    # Qwen3-VL: the root's value reaches the language model (with_hf_config), text_config's does not
    vl, _ = _fixture("qwen3-vl-30b-a3b-instruct")
    m, _ = _import(_variant(tmp_path, "qwen3-vl-30b-a3b-instruct", text={"tie_word_embeddings": True}))
    assert m.dense_bytes == vl.dense_bytes
    # Qwen3.5: text_config's (absent: Qwen3_5MoeTextConfig's false) decides, the root's is not read
    q35, _ = _fixture("qwen3.5-35b-a3b")
    m, _ = _import(_variant(tmp_path, "qwen3.5-35b-a3b", {"tie_word_embeddings": True}, name="q35"))
    assert m.dense_bytes == q35.dense_bytes
    m, _ = _import(_variant(tmp_path, "qwen3.5-35b-a3b", text={"tie_word_embeddings": True}, name="q35t"))
    assert q35.dense_bytes - m.dense_bytes == 248_320 * 2048 * 2               # the LM head, bf16
    # Kimi-K2.5: Kimi_K25Config defaults it to true and vLLM unties when the checkpoint has an lm_head: refused
    msg = _refusal(_variant(tmp_path, "kimi-k2.5", {"tie_word_embeddings": DROP}, name="kimi"))
    assert "tie_word_embeddings" in msg and "Kimi_K25Config" in msg


def test_qwen3_moe_use_sliding_window_slides_every_layer(tmp_path: Path) -> None:
    m, doc = _import(_variant(tmp_path, "qwen3-30b-a3b", {"use_sliding_window": True, "sliding_window": DROP}))
    assert [(g.kind, len(g.layers), g.window) for g in m.attention] == [("sliding", 48, 4096)]
    assert "Qwen3MoeConfig default 4096" in doc["attention"][0]["window"]["source"]


def test_a_composite_model_type_under_a_text_architecture_is_refused(tmp_path: Path) -> None:
    cfg = json.loads((FIX / "qwen3.5-35b-a3b" / "config.json").read_text())
    text = dict(cfg["text_config"], architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe")
    folder = tmp_path / "q35text"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(text))
    msg = _refusal(folder)
    assert "model_type" in msg and "text_config" in msg
    (folder / "config.json").write_text(json.dumps(dict(text, model_type="qwen3_5_moe_text")))
    assert import_model(folder, name="m")[0].kv_bytes_per_token == 10 * 2 * 2 * 256 * 2


def test_every_accepted_model_type_has_its_transformers_class() -> None:
    for fam in FAMILIES.values():
        for mtype in fam.model_types:
            assert ROOT[mtype] in CLASSES, mtype


# --- finding 16: the summary line says what the per-token KV figure assumes

def test_summary_line_names_the_sliding_layers_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    result = invoke("model", "import", "tests/fixtures/hf_configs/gpt-oss-120b", "-o", str(tmp_path / "g.yaml"))
    assert result.code == 0, result.output
    assert "KV 73,728 B per token at full length; 18 sliding layers hold at most 128 tokens" in result.output
    result = invoke("model", "import", "tests/fixtures/hf_configs/qwen3-30b-a3b", "-o", str(tmp_path / "q.yaml"))
    assert "KV 98,304 B per token\n" in result.output and "full length" not in result.output


# --- finding 15: what differs between a model file and a fresh import of it

def test_describe_difference_names_a_checkpoint_force_would_drop() -> None:
    committed = (REPO / "recipes" / "models" / "qwen3-vl-30b-a3b-instruct.yaml").read_text()
    _, fresh = import_model(FIX / "qwen3-vl-30b-a3b-instruct", name="qwen3-vl-30b-a3b-instruct")
    text = describe_difference(committed, fresh)
    assert "checkpoint (the file: Qwen/Qwen3-VL-30B-A3B-Instruct; this import: none)" in text
    assert "description" in text and "--force would drop the file's checkpoint" in text
    assert describe_difference(committed, committed.replace("# Generated by", "# generated by")).startswith("only")
