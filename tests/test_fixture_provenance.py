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


# --- the families added with the architecture table (docs/models.md, "Fixture provenance"): totals
# published for the real checkpoints — the Hugging Face Hub's safetensors parameter count of the
# checkpoint, llama.cpp's GGUF parameter count, or a public safetensors inventory — against the
# import, with the tensors the checkpoint holds beyond the decoder layers counted by hand here.

def _params(name: str, fp32: int = 0) -> tuple[int, object]:
    """Parameters of the imported decoder + encoder: bf16 bytes / 2, `fp32` of them stored as fp32."""
    m, _ = import_model(FIX / name)
    dense = (m.dense_bytes - 4 * fp32) // 2 + fp32
    return dense + m.num_moe_layers * m.routed_experts * (m.expert_bytes // 2), m


def test_qwen3_next_80b_a3b_parameter_count() -> None:
    h = 2048
    total, m = _params("qwen3-next-80b-a3b-thinking", fp32=36 * 32)          # A_log [32] of 36 GDN layers
    # GGUF general.parameter_count of this architecture (Qwen3-Coder-Next): the 48 decoder layers.
    assert total == 79_674_391_296
    # The checkpoint's MTP layer: fc [h, 2h], two pre-fc norms, one gated-attention layer with its MoE,
    # its two layer norms and a final norm.
    attn = h * 16 * 256 * 2 + 2 * h * 2 * 256 + 16 * 256 * h + 2 * 256
    moe = 512 * h + 512 * 3 * h * 512 + 3 * h * 512 + h
    mtp = 2 * h * h + 2 * h + attn + moe + 2 * h + h
    assert mtp == 1_650_471_424
    assert total + mtp == 81_324_862_720                                   # Hugging Face Hub count


def test_qwen3_5_35b_a3b_parameter_count() -> None:
    h = 2048
    total, m = _params("qwen3.5-35b-a3b", fp32=30 * 32)
    attn = h * 16 * 256 * 2 + 2 * h * 2 * 256 + 16 * 256 * h + 2 * 256
    moe = 256 * h + 256 * 3 * h * 512 + 3 * h * 512 + h
    mtp = 2 * h * h + 2 * h + attn + moe + 2 * h + h                        # mtp_num_hidden_layers 1
    assert total + mtp == 35_951_822_704                                   # Hugging Face Hub count


def test_nemotron_3_nano_parameter_count() -> None:
    # e_score_correction_bias [128] of 23 MoE layers and A [64] of 23 Mamba layers are fp32 in vLLM.
    total, m = _params("nemotron-3-nano-30b-a3b", fp32=23 * 128 + 23 * 64)
    assert total == 31_577_940_288                                         # llama.cpp n_params of the GGUF


def test_llama4_parameter_counts() -> None:
    scout, _ = _params("llama-4-scout-17b-16e-instruct")
    maverick, _ = _params("llama-4-maverick-17b-128e-instruct")
    assert (scout, maverick) == (108_641_793_536, 401_583_781_376)        # Hugging Face Hub counts


def test_qwen3_vl_30b_a3b_parameter_count() -> None:
    total, _ = _params("qwen3-vl-30b-a3b-instruct")
    assert total == 31_070_754_032


def test_glm5_parameter_count() -> None:
    h = 6144
    # fp32 in vLLM: e_score_correction_bias [256] of 75 MoE layers, the indexer's k_norm weight + bias [128].
    total, m = _params("glm-5", fp32=75 * 256 + 78 * 256)
    assert total == 743_911_218_432                                        # the 78 decoder layers: "744B"
    # GLM-5's MTP layer: one decoder layer (MLA + indexer + MoE) with enorm, hnorm, eh_proj [h, 2h] and
    # shared_head.norm, no embedding or head of its own.
    heads, qr, kvr, nope, rope, vh = 64, 2048, 512, 192, 64, 256
    attn = (qr * h + qr + heads * (nope + rope) * qr + (kvr + rope) * h + kvr + heads * (nope + vh) * kvr
            + h * heads * vh)
    indexer = 32 * 128 * qr + 128 * h + 2 * 128 + 32 * h
    moe = 256 * h + 256 + 256 * 3 * 2048 * h + 3 * 2048 * h
    mtp = attn + indexer + moe + 2 * h + 2 * h + 2 * h * h + h
    assert total + mtp == 753_864_139_008                                  # Hugging Face Hub count


def test_deepseek_v32_parameter_counts_and_vllm_bytes() -> None:
    m, _ = import_model(FIX / "deepseek-v3.2")
    h, vocab, layers = 7168, 129280, 61
    blocks = lambda rows, cols: -(-rows // 128) * -(-cols // 128)        # noqa: E731
    def lin(rows: int, cols: int) -> tuple[int, int]:                    # (weights, fp32 block scales)
        return rows * cols, blocks(rows, cols)
    parts = [lin(1536, h), lin(128 * 192, 1536), lin(576, h), lin(128 * 256, 512), lin(h, 128 * 128),
             lin(64 * 128, 1536), lin(128, h)]                           # MLA + indexer wq_b, wk (FP8 in the checkpoint)
    attn_w, attn_s = sum(p[0] for p in parts), sum(p[1] for p in parts)
    attn_other = 1536 + 512 + 64 * h + 2 * 128                           # norms, weights_proj (bf16), k_norm
    expert_w, expert_s = 3 * 2048 * h, 3 * blocks(2048, h)
    dense_w, dense_s = 3 * 18432 * h, 3 * blocks(18432, h)
    layer_norms = 2 * h
    moe_other = 256 * h + 256                                            # router + e_score_correction_bias
    def model_elems(n_moe_layers: int, scales: bool) -> int:
        per_attn = attn_w + attn_other + (attn_s if scales else 0)
        per_moe = moe_other + 257 * (expert_w + (expert_s if scales else 0))    # 256 routed + 1 shared
        return (layers * (per_attn + layer_norms) + 3 * (dense_w + (dense_s if scales else 0))
                + n_moe_layers * per_moe + 2 * vocab * h + h)
    # MTP layer: a full MoE layer + enorm, hnorm, eh_proj [h, 2h] (bf16: no block scales), shared_head norm, and
    # an embedding and head of its own.
    def mtp(scales: bool) -> int:
        return (attn_w + attn_other + (attn_s if scales else 0) + layer_norms + moe_other
                + 257 * (expert_w + (expert_s if scales else 0)) + 2 * h + 2 * h * h + h + 2 * vocab * h)
    assert model_elems(58, True) + mtp(True) == 685_396_921_376           # V3.2-Exp / -Speciale (HF): + fp32 scales
    assert model_elems(58, False) + mtp(False) == 685_355_329_792         # V3.2 (HF): ue8m0 scales, not tallied
    # vLLM's bytes: FP8 weights + fp32 block scales, the indexer's wk + weights_proj fused unquantized (bf16),
    # k_norm fp32, routers bf16 with fp32 correction biases, norms and embeddings bf16.
    wk_bytes = 128 * h * 2 - (128 * h + blocks(128, h) * 4)              # bf16 in vLLM, FP8 + scale in the file
    vllm_attn = attn_w + attn_s * 4 + wk_bytes + (1536 + 512) * 2 + 64 * h * 2 + 2 * 128 * 4
    vllm_dense = (layers * (vllm_attn + layer_norms * 2) + 3 * (dense_w + dense_s * 4)
                  + 58 * (256 * h * 2 + 256 * 4 + expert_w + expert_s * 4) + 2 * vocab * h * 2 + h * 2)
    assert m.dense_bytes == vllm_dense and m.expert_bytes == expert_w + expert_s * 4


def test_kimi_k25_parameter_count() -> None:
    m, _ = import_model(FIX / "kimi-k2.5")
    kimi_k2, _ = import_model(FIX / "kimi-k2-instruct")
    # Same text geometry as Kimi-K2-Instruct (1,026,408,232,448 parameters, the listing above), bf16 dense layers
    # (compressed-tensors `ignore`), int4 experts; plus MoonViT and the projector, bf16.
    assert m.encoder_bytes // 2 == 1_026_879_376_368 - 1_026_408_232_448   # a public safetensors inventory
    assert m.num_moe_layers * m.routed_experts == kimi_k2.num_moe_layers * kimi_k2.routed_experts == 60 * 384
