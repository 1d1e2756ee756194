"""The imported geometry against totals published for the real checkpoints (not by this project).

The config.json fixtures are checked against public copies (docs/models.md, "Fixture provenance");
these tests check what the importer derives from them against independently published totals:

- keras-team/keras-hub `keras_hub/src/models/qwen3_moe/qwen3_moe_presets.py` (commit 79c5664):
  Qwen3-30B-A3B has 30,532,122,624 parameters, Qwen3-235B-A22B 235,093,634,560.
- keras-team/keras-hub `keras_hub/src/models/mixtral/mixtral_presets.py` (commit d11ecb3):
  Mixtral-8x7B-v0.1 has 46,702,792,704 parameters.
- the GGUF metadata `general.parameter_count` of gpt-oss-120b / gpt-oss-20b as `ollama show` prints
  it: 116,829,156,672 and 20,914,757,184.
- a public tensor listing of moonshotai/Kimi-K2-Instruct's safetensors (shape and dtype of every
  tensor; 1,026,470,731,056 elements in all): the bytes below are that listing's shapes × dtype
  sizes, summed by hand.
"""

from __future__ import annotations

from pathlib import Path

from recipegen.modelimport import import_model

FIX = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf_configs"


def _bf16_parameters(name: str) -> int:
    m, _ = import_model(FIX / name)
    # bf16 checkpoints: two bytes per parameter, dense and routed alike.
    return (m.dense_bytes + m.num_moe_layers * m.routed_experts * m.expert_bytes) // 2


def test_qwen3_parameter_counts_match_the_published_ones() -> None:
    assert _bf16_parameters("qwen3-30b-a3b") == 30_532_122_624
    assert _bf16_parameters("qwen3-235b-a22b") == 235_093_634_560
    assert _bf16_parameters("mixtral-8x7b-v0.1") == 46_702_792_704


def test_gpt_oss_parameter_counts_match_the_published_ones() -> None:
    # Dense parts are bf16; an expert is w13 [5760, 2880] + w2 [2880, 2880] values (MXFP4 in the
    # checkpoint, counted here as parameters) plus its bf16 biases 5760 + 2880.
    expert = 5760 * 2880 + 2880 * 2880 + 5760 + 2880
    for name, layers, experts, published in (("gpt-oss-120b", 36, 128, 116_829_156_672),
                                             ("gpt-oss-20b", 24, 32, 20_914_757_184)):
        m, _ = import_model(FIX / name)
        assert (m.num_moe_layers, m.routed_experts) == (layers, experts)
        assert m.dense_bytes // 2 + layers * experts * expert == published


def test_kimi_k2_bytes_match_the_public_tensor_listing() -> None:
    m, _ = import_model(FIX / "kimi-k2-instruct")
    h, vocab, layers = 7168, 163840, 61
    fp32 = 4
    # Per layer, from the listing: FP8 e4m3 weights (1 B) with fp32 weight_scale_inv, bf16 norms.
    attention = (
        576 * h + 5 * 56 * fp32            # kv_a_proj_with_mqa [576, 7168], scale [5, 56]
        + 16384 * 512 + 128 * 4 * fp32     # kv_b_proj [16384, 512], scale [128, 4]
        + 7168 * 8192 + 56 * 64 * fp32     # o_proj [7168, 8192], scale [56, 64]
        + 1536 * h + 12 * 56 * fp32        # q_a_proj [1536, 7168], scale [12, 56]
        + 12288 * 1536 + 96 * 12 * fp32    # q_b_proj [12288, 1536], scale [96, 12]
        + 1536 * 2 + 512 * 2               # q_a_layernorm [1536], kv_a_layernorm [512]
    )
    expert = 3 * 2048 * h + 3 * 16 * 56 * fp32          # gate/up [2048, 7168], down [7168, 2048]
    router = 384 * h * 2 + 384 * fp32                   # gate.weight bf16, e_score_correction_bias fp32
    dense_mlp = 3 * 18432 * h + 3 * 144 * 56 * fp32     # layer 0's gate/up/down
    norms = (2 * layers + 1) * h * 2                     # input/post-attention per layer + final norm
    embeddings_and_head = 2 * vocab * h * 2
    rotary_inv_freq = layers * 56 * 2                    # self_attn.rotary_emb.inv_freq [56] bf16, per layer
    listing_total = (embeddings_and_head + norms + layers * attention + 60 * (router + expert)
                     + 60 * 384 * expert + dense_mlp + rotary_inv_freq)
    assert listing_total == 1_029_173_256_720            # ≈ 958.49 GiB, as the listing sums
    assert m.expert_bytes == expert
    # Geometry counts every tensor but the rotary inv_freq buffers, which vLLM's loader skips
    # (vllm/model_executor/models/deepseek_v2.py:1650).
    assert m.dense_bytes + 60 * 384 * m.expert_bytes == listing_total - rotary_inv_freq
