"""`recipegen model import` of the families added with the architecture table: one test per family
on its public config.json (tests/fixtures/hf_configs/, provenance in docs/models.md), every figure
hand arithmetic from the model's geometry as vLLM 0.33 builds it, written out here; configs outside
the table, or carrying a field the family does not read, are refused naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_support import invoke

from recipegen.common.errors import InputError
from recipegen.modelimport import import_model
from recipegen.schema import Model

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "hf_configs"


def _copy(tmp_path: Path, fixture: str, **changes: object) -> Path:
    folder = tmp_path / fixture
    folder.mkdir()
    for f in (FIX / fixture).iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    if changes:
        cfg = json.loads((folder / "config.json").read_text())
        for key, value in changes.items():
            node = cfg
            *path, last = key.split(".")
            for part in path:
                node = node[part]
            if value is None:
                node.pop(last)
            else:
                node[last] = value
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


# --- Qwen3-Next: 3 Gated DeltaNet layers per gated full-attention layer

def test_qwen3_next_hybrid_layers_state_and_kv() -> None:
    m, text = import_model(FIX / "qwen3-next-80b-a3b-thinking")
    assert (m.decoder_layers, m.num_moe_layers, m.routed_experts, m.top_k, m.shared_experts) == (48, 48, 512, 10, 1)
    assert m.expert_bytes == 3 * 2048 * 512 * 2                      # bf16 w13 [1024, 2048] + w2 [2048, 512]
    full = [i for i in range(48) if (i + 1) % 4 == 0]                # full_attention_interval 4
    assert [g.kind for g in m.attention] == ["full"] and m.attention[0].layers == full
    # KV only in the 12 full layers: 2 × 2 KV heads × 256 × 2 B = 2,048 B per layer per token.
    assert m.kv_bytes_per_token == 12 * 2 * 2 * 256 * 2 == 24_576
    (gdn,) = m.state
    assert gdn.kind == "gdn" and gdn.layers == [i for i in range(48) if i not in full]
    # conv: 3 × (2·16·128 + 32·128) × 2 B; recurrent: 32 × 128 × 128 × 2 B (bf16: no mamba_ssm_dtype).
    per_layer = 3 * 8192 * 2 + 32 * 128 * 128 * 2
    assert gdn.bytes_per_sequence_per_layer(1) == per_layer == 1_097_728
    assert m.state_bytes_per_sequence == 36 * per_layer == 39_518_208          # 37.7 MiB
    # TP 2: heads and channels halve.
    assert gdn.bytes_per_sequence_per_layer(2) == 3 * 4096 * 2 + 16 * 128 * 128 * 2
    assert "qwen3_next.py" in yaml.safe_load(text)["attention"][0]["layers"]["source"]


def test_qwen3_next_dense_bytes_from_its_layers() -> None:
    m, _ = import_model(FIX / "qwen3-next-80b-a3b-thinking")
    h, vocab = 2048, 151936
    attn = (16 * 256 * 2) * h + 2 * (2 * 256) * h + h * 16 * 256 + 2 * 256     # q doubled by the output gate
    gdn = (2 * 2048 + 2 * 4096) * h + 64 * h + 8192 * 4 + 32 + 128 + h * 4096   # + A_log fp32 below
    moe = 512 * h + 3 * h * 512 + h                                             # router, shared expert, its gate
    params = 2 * vocab * h + (2 * 48 + 1) * h + 12 * attn + 36 * gdn + 48 * moe
    assert m.dense_bytes == params * 2 + 36 * 32 * 4                            # A_log is fp32 in vLLM


def test_qwen3_5_moe_through_text_config_with_vision_and_fp32_state() -> None:
    m, _ = import_model(FIX / "qwen3.5-35b-a3b")
    assert (m.decoder_layers, m.num_moe_layers, m.routed_experts, m.top_k) == (40, 40, 256, 8)
    (gdn,) = m.state
    # mamba_ssm_dtype float32 in text_config: the recurrent state is fp32.
    assert gdn.ssm_dtype == "fp32" and gdn.bytes_per_sequence_per_layer(1) == 3 * 8192 * 2 + 32 * 128 * 128 * 4
    assert m.kv_bytes_per_token == 10 * 2 * 2 * 256 * 2
    hv, iv, out = 1152, 4304, 2048
    vision = (hv * 3 * 2 * 16 * 16 + hv + 2304 * hv
              + 27 * (4 * hv + 3 * hv * hv + 3 * hv + hv * hv + hv + iv * hv + iv + hv * iv + hv)
              + 2 * hv + 4 * hv * 4 * hv + 4 * hv + out * 4 * hv + out)
    assert vision == 446_571_248 and m.encoder_bytes == vision * 2


def test_unknown_linear_attention_field_in_a_known_family_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        import_model(_copy(tmp_path, "qwen3-30b-a3b", linear_num_value_heads=32))
    assert "linear_num_value_heads" in str(err.value) and "Qwen3MoeForCausalLM" in str(err.value)
    (tmp_path / "b").mkdir()
    with pytest.raises(InputError, match="layer_types"):
        import_model(_copy(tmp_path / "b", "qwen3-30b-a3b", layer_types=["linear_attention"] * 48))


def test_unknown_architecture_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        import_model(_copy(tmp_path, "mixtral-8x7b-v0.1", architectures=["Jamba2ForCausalLM"]))
    assert "Jamba2ForCausalLM" in str(err.value) and "MixtralForCausalLM" in str(err.value)


# --- Nemotron-H: the layer pattern, relu2 experts without a gate, Mamba-2 state

def test_nemotron_h_pattern_relu2_experts_and_mamba_state() -> None:
    m, _ = import_model(FIX / "nemotron-3-nano-30b-a3b")
    pattern = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
    assert m.decoder_layers == 52 and m.moe_layers == [i for i, c in enumerate(pattern) if c == "E"]
    assert (m.routed_experts, m.top_k, m.shared_experts) == (128, 6, 1)
    # up [1856, 2688] + down [2688, 1856], bf16: no gate rows.
    assert m.expert_bytes == 2 * 1856 * 2688 * 2 == 19_955_712
    assert m.activation is not None and m.activation.kind == "relu2_no_mul"
    assert m.attention[0].layers == [i for i, c in enumerate(pattern) if c == "*"]
    assert m.kv_bytes_per_token == 6 * 2 * 2 * 128 * 2
    (mamba,) = m.state
    # conv: 3 × (64·64 + 2·8·128) × 2 B; SSM: 64 × 64 × 128 × 4 B (mamba_ssm_cache_dtype float32).
    assert mamba.bytes_per_sequence_per_layer(1) == 3 * 6144 * 2 + 64 * 64 * 128 * 4 == 2_134_016
    assert m.state_bytes_per_sequence == 23 * 2_134_016


def test_nemotron_pattern_and_layer_count_must_agree(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        import_model(_copy(tmp_path, "nemotron-3-nano-30b-a3b", num_hidden_layers=50))
    assert "num_hidden_layers" in str(err.value) and "hybrid_override_pattern" in str(err.value)


def test_latent_moe_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="moe_latent_size"):
        import_model(_copy(tmp_path, "nemotron-3-nano-30b-a3b", moe_latent_size=1024))


# --- DeepSeek sparse attention: the indexer's cache and weights

def test_deepseek_v32_indexer_cache_and_weights() -> None:
    v3, _ = import_model(FIX / "deepseek-v3")
    v32, _ = import_model(FIX / "deepseek-v3.2")
    assert v32.expert_bytes == v3.expert_bytes
    # The indexer caches 128 fp8 values + one fp32 scale per token per layer: 132 B.
    assert v32.kv_bytes_per_token == 61 * ((512 + 64) * 2 + 132) == 78_324
    assert v32.kv_bytes_per_token / v3.kv_bytes_per_token == pytest.approx(1.1146, abs=1e-4)
    # Per layer: wq_b FP8 [8192, 1536] + 64 × 12 fp32 block scales; wk + weights_proj bf16 (vLLM fuses them
    # unquantized) [128 + 64, 7168]; k_norm weight + bias fp32 [128].
    indexer = 8192 * 1536 + 64 * 12 * 4 + (128 + 64) * 7168 * 2 + 2 * 128 * 4
    assert v32.dense_bytes - v3.dense_bytes == 61 * indexer


def test_glm5_is_deepseek_sparse_attention() -> None:
    m, _ = import_model(FIX / "glm-5")
    assert (m.decoder_layers, m.num_moe_layers, m.routed_experts) == (78, 75, 256)
    assert m.kv_bytes_per_token == 78 * ((512 + 64) * 2 + 132)
    assert m.expert_bytes == 3 * 6144 * 2048 * 2


def test_indexer_layer_pattern_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="index_topk_freq"):
        import_model(_copy(tmp_path, "deepseek-v3.2", index_topk_freq=4))


# --- Llama-4: interleaving, shared expert, chunked attention, the vision tower

def test_llama4_maverick_interleaved_moe_and_chunked_attention() -> None:
    m, _ = import_model(FIX / "llama-4-maverick-17b-128e-instruct")
    assert m.moe_layers == list(range(1, 48, 2)) and m.routed_experts == 128 and m.top_k == 1
    assert m.shared_experts == 1 and m.expert_bytes == 3 * 5120 * 8192 * 2
    kinds = {g.kind: g for g in m.attention}
    assert kinds["full"].layers == list(range(3, 48, 4))                  # NoPE every 4th layer
    assert kinds["chunked"].chunk == 8192 and len(kinds["chunked"].layers) == 36
    assert m.encoder_bytes == 871_932_416 * 2


def test_llama4_scout_every_layer_moe() -> None:
    m, _ = import_model(FIX / "llama-4-scout-17b-16e-instruct")
    assert m.num_moe_layers == 48 and m.routed_experts == 16


def test_llama4_moe_layers_disagreeing_with_the_step_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="moe_layers"):
        import_model(_copy(tmp_path, "llama-4-maverick-17b-128e-instruct", **{"text_config.moe_layers": [0, 1]}))


# --- Qwen3-VL-MoE and Kimi-K2.5 through their text config

def test_qwen3_vl_moe_text_is_qwen3_30b_a3b() -> None:
    vl, _ = import_model(FIX / "qwen3-vl-30b-a3b-instruct")
    text, _ = import_model(FIX / "qwen3-30b-a3b")
    assert (vl.num_moe_layers, vl.routed_experts, vl.expert_bytes, vl.kv_bytes_per_token) == \
        (text.num_moe_layers, text.routed_experts, text.expert_bytes, text.kv_bytes_per_token)
    assert vl.dense_bytes - text.dense_bytes == vl.encoder_bytes == 538_631_408 * 2


def test_kimi_k25_int4_experts_and_moonvit() -> None:
    m, _ = import_model(FIX / "kimi-k2.5")
    # int4 g32: w13 4096×7168/2 + 4096·224 bf16 scales, w2 7168×2048/2 + 7168·64 scales, and vLLM's
    # w13/w2 weight_shape [2] bf16.
    assert m.expert_bytes == 4096 * 7168 // 2 + 4096 * 224 * 2 + 7168 * 2048 // 2 + 7168 * 64 * 2 + 8
    assert m.encoder_bytes == 471_143_920 * 2
    assert m.kv_bytes_per_token == 61 * 576 * 2


# --- ModelOpt NVFP4

def test_nvfp4_from_hf_quant_config_experts_and_fp8_kv() -> None:
    nv, _ = import_model(FIX / "qwen3-235b-a22b-nvfp4")
    bf16, _ = import_model(FIX / "qwen3-235b-a22b")
    values = 3 * 4096 * 1536
    # e2m1 values 2 per byte + one e4m3 scale per 16 + fp32 w13 (2 + 2) and w2 (1 + 1) global/input scales.
    assert nv.expert_bytes == values // 2 + values // 16 + 6 * 4 == 10_616_856
    assert bf16.expert_bytes / nv.expert_bytes == pytest.approx(3.5555, abs=1e-3)
    assert nv.expert_format == "nvfp4"
    assert all(g.kv_dtype == "fp8" for g in nv.attention)
    assert nv.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token


def test_nvfp4_nemotron_non_gated_scalars() -> None:
    m, _ = import_model(FIX / "nemotron-3-nano-30b-a3b-nvfp4")
    values = 2 * 1856 * 2688
    assert m.expert_bytes == values // 2 + values // 16 + 4 * 4


def test_unknown_modelopt_algorithm_is_refused(tmp_path: Path) -> None:
    folder = _copy(tmp_path, "qwen3-235b-a22b-nvfp4")
    q = json.loads((folder / "hf_quant_config.json").read_text())
    q["quantization"]["quant_algo"] = "W4A8_AWQ"
    (folder / "hf_quant_config.json").write_text(json.dumps(q))
    with pytest.raises(InputError) as err:
        import_model(folder)
    assert "hf_quant_config.json" in str(err.value) and "quant_algo" in str(err.value)


def test_every_new_fixture_validates_as_a_model() -> None:
    for name in ("qwen3-next-80b-a3b-thinking", "qwen3.5-35b-a3b", "qwen3.5-122b-a10b", "nemotron-3-nano-30b-a3b",
                 "deepseek-v3.2", "glm-5", "llama-4-scout-17b-16e-instruct", "qwen3-vl-30b-a3b-instruct",
                 "kimi-k2.5", "qwen3-235b-a22b-nvfp4"):
        m, text = import_model(FIX / name)
        assert Model.model_validate(yaml.safe_load(text)).name == m.name


def test_import_summary_names_expert_bytes_moe_layers_kv_and_state(tmp_path: Path) -> None:
    out = tmp_path / "m.yaml"
    result = invoke("model", "import", str(FIX / "qwen3-next-80b-a3b-thinking"), "-o", str(out))
    assert result.code == 0, result.output
    assert "(48 MoE)" in result.output and "6,291,456 B per expert" in result.output
    assert "KV 24,576 B per token" in result.output and "state 39,518,208 B per sequence" in result.output
    plain = invoke("model", "import", str(FIX / "qwen3-30b-a3b"), "-o", str(tmp_path / "q.yaml"))
    assert "KV 98,304 B per token" in plain.output and "state" not in plain.output
