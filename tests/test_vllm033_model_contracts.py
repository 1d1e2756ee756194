"""The vLLM 0.33.0 source lines the ledger and the importer cite, pinned: each cited line range must
still say what the ledger assumes (read from the unpacked 0.33.0 source, never imported)."""

from __future__ import annotations

import pytest
from vllm033_source import vllm033_source

SRC = vllm033_source("model_executor/layers/fused_moe/oracle/mxfp4.py")
pytestmark = pytest.mark.skipif(SRC is None, reason="vLLM 0.33.0 source not unpacked (scripts/fetch-vllm033-source.sh)")


def lines(path: str, first: int, last: int) -> str:
    assert SRC is not None
    text = (SRC / path).read_text(encoding="utf-8").splitlines()
    return "\n".join(text[first - 1:last])


@pytest.mark.parametrize("path, first, last, needles", [
    # KV heads per rank: replicated when TP exceeds them; MLA caches one latent head.
    ("config/model.py", 1673, 1683, ["if self.use_mla:", "return 1",
                                     "max(1, total_num_kv_heads // parallel_config.tensor_parallel_size)"]),
    # Sliding-window layers hold the window (+ in-flight tokens) per request.
    ("v1/kv_cache_interface.py", 918, 944, ["self.sliding_window - 1", "max_model_len", "cdiv(num_tokens, self.block_size) + 1"]),
    # The --cpu-offload-gb walk: per parameter, dense ones too, until the budget is reached.
    ("model_executor/offloader/uva.py", 74, 125, ["for name, p in module.named_parameters():",
                                                 "if self.cpu_offload_bytes >= self.cpu_offload_max_bytes:",
                                                 "self.cpu_offload_bytes += p.data.numel() * p.data.element_size()"]),
    ("model_executor/offloader/uva.py", 102, 113, ["if self.cpu_offload_params:", 'f".{param}." in f".{prefix}{name}."']),
    # --cpu-offload-gb is per GPU: each worker's offloader counts its own (sharded) parameters.
    ("config/offload.py", 23, 25, ["cpu_offload_gb: float", "The space in GiB to offload to CPU, per GPU."]),
    # MXFP4 backend order for gpt-oss and the padding per backend.
    ("model_executor/layers/fused_moe/oracle/mxfp4.py", 402, 431, ["FLASHINFER_TRTLLM_MXFP4_BF16", "Mxfp4MoeBackend.TRITON,",
                                                                  "Mxfp4MoeBackend.MARLIN,", "is_device_capability_family(120)"]),
    ("model_executor/layers/fused_moe/oracle/mxfp4.py", 865, 873, ["round_up(intermediate_size, 128)",
                                                                  "round_up(hidden_size, 256)", "TRTLLM_BACKENDS"]),
    ("model_executor/layers/fused_moe/oracle/mxfp4.py", 915, 916, ["intermediate_size = round_up(intermediate_size, 64)"]),
    ("model_executor/layers/fused_moe/experts/gpt_oss_triton_kernels_moe.py", 41, 53, ["(9, 0) <= (cap.major, cap.minor) < (13, 0)"]),
    ("model_executor/layers/fused_moe/experts/marlin_moe.py", 592, 594, ["has_device_capability((7, 5))"]),
    ("model_executor/layers/quantization/utils/humming/priority.py", 11, 11, ["frozenset({90})"]),
    # gpt-oss: swigluoai with alpha 1.702 / limit 7, expert biases.
    ("model_executor/layers/quantization/mxfp4.py", 428, 430, ["gemm1_alpha=1.702", "swiglu_limit=7.0"]),
    ("model_executor/models/gpt_oss.py", 399, 400, ["has_bias=True", 'activation="swigluoai"']),
    ("model_executor/layers/fused_moe/oracle/unquantized.py", 385, 397, ["FLASHINFER_TRTLLM", "round_up(intermediate_size, 128)"]),
    ("config/cache.py", 44, 67, ['"fp8_e4m3",', '"fp8_e5m2",', '"bfloat16",']),
    # max_model_len: x rope factor except pre-scaled (YaRN-style) types; a longer one is refused.
    ("config/model.py", 2599, 2634, ['"yarn",', '"longrope",', "derived_max_model_len *= scaling_factor"]),
    ("config/model.py", 2657, 2684, ["elif max_model_len > derived_max_model_len:", "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
                                     "model_max_length"]),
    # --- model import: the families as vLLM 0.33 builds them (recipegen/modelimport/families.py)
    ("model_executor/models/qwen3_next.py", 489, 495, ["(self.layer_idx + 1) % config.decoder_sparse_step == 0",
                                                       "mlp_only_layers"]),
    ("model_executor/models/qwen3_next.py", 668, 668, ["layer_type=config.layer_types[extract_layer_index(prefix)]"]),
    ("model_executor/models/qwen3_next.py", 315, 324, ['getattr(config, "attn_output_gate", True)',
                                                       "self.total_num_heads * (1 + self.attn_output_gate)"]),
    ("model_executor/models/qwen3_5.py", 171, 176, ['config.model_type == "qwen3_5_moe_text"',
                                                    "Qwen3NextSparseMoeBlock"]),
    ("model_executor/models/nemotron_h.py", 591, 615, ["config.hybrid_override_pattern[layer_idx]",
                                                       "len(config.hybrid_override_pattern)"]),
    ("model_executor/models/nemotron_h.py", 229, 245, ['ckpt_names=("up_proj", "down_proj", None)',
                                                       "activation_without_mul(config.mlp_hidden_act)"]),
    ("model_executor/models/nemotron_h.py", 732, 732, ["is_non_gated_moe = True"]),
    ("model_executor/layers/fused_moe/activation.py", 45, 45, ['RELU2_NO_MUL = "relu2_no_mul"']),
    ("models/deepseek_v32/__init__.py", 17, 21, ["DeepseekV32ForCausalLM as GlmMoeDsaForCausalLM"]),
    ("models/deepseek_v32/attention.py", 71, 100, ["self.wq_b = ReplicatedLinear(", "quant_config=None,",
                                                   "disable_tp=True", 'LayerNorm(self.head_dim, eps=1e-6, '
                                                   'dtype=torch.float32)',
                                                   "head_dim=self.head_dim + self.head_dim // self.quant_block_size * 4",
                                                   "dtype=torch.uint8"]),
    ("models/deepseek_v32/attention.py", 166, 176, ['getattr(config, "index_topk_freq", 1)', "index_topk_pattern"]),
    ("model_executor/models/deepseek_v2.py", 1293, 1297, ["layer_idx >= config.first_k_dense_replace",
                                                          "layer_idx % moe_layer_freq == 0"]),
    ("model_executor/models/glm4_moe.py", 353, 356, ["layer_idx >= config.first_k_dense_replace"]),
    ("model_executor/models/llama4.py", 340, 343, ["(self.layer_idx + 1) % config.interleave_moe_layer_step == 0"]),
    ("model_executor/models/llama4.py", 184, 186, ["self.nope = self.no_rope_layers[self.layer_idx] == 0"]),
    ("model_executor/models/llama4.py", 251, 263, ["ChunkedLocalAttention if use_chunked_local_attn else Attention"]),
    ("model_executor/models/kimi_k25.py", 387, 390, ["compressed_tensors.CompressedTensorsConfig", "return None"]),
    ("model_executor/models/config.py", 89, 101, ['cache_config.cache_dtype = "fp8_e4m3"',
                                                  "is_device_capability_family(100)"]),
    # --- vision towers: loaded unless every modality limit is 0
    ("model_executor/models/interfaces.py", 347, 367, ["def _mark_tower_model(",
                                                       "`--limit-mm-per-prompt`\n        is set to zero"]),
    ("model_executor/models/qwen3_5.py", 736, 743, ["self._mark_tower_model(vllm_config", "Qwen3_VisionTransformer("]),
    ("model_executor/models/qwen3_vl.py", 640, 655, ["self.deepstack_merger_list = nn.ModuleList(",
                                                     "use_postshuffle_norm=True"]),
    ("model_executor/models/kimi_k25.py", 349, 370, ['self._mark_tower_model(vllm_config, "vision_chunk")',
                                                     "MoonViT3dPretrainedModel("]),
    ("model_executor/models/mllama4.py", 488, 495, ["self.positional_embedding_vlm = nn.Parameter(",
                                                    "self.layernorm_pre = nn.LayerNorm"]),
    # --- state per sequence: shapes, dtypes, the defaults the config asks for
    ("model_executor/layers/mamba/mamba_utils.py", 98, 111, ['if mamba_ssm_cache_dtype == "auto":',
                                                             "temporal_state_dtype = conv_state_dtype"]),
    ("model_executor/layers/mamba/mamba_utils.py", 186, 212, ["conv_dim = intermediate_size + 2 * n_groups * state_size",
                                                              "conv_kernel - 1 + num_spec",
                                                              "(divide(num_heads, tp_world_size), head_dim, state_size)"]),
    ("model_executor/layers/mamba/mamba_utils.py", 261, 294, ["return tp_size - ngroups",
                                                              "conv_dim = head_k_dim * num_k_heads * 2 + head_v_dim * "
                                                              "num_v_heads", "head_v_dim,\n            head_k_dim,"]),
    ("model_executor/models/config.py", 953, 978, ['getattr(hf_text_config, "mamba_ssm_dtype", None)']),
    ("model_executor/models/config.py", 812, 839, ['DEFAULT_MAMBA_SSM_CACHE_DTYPE: "MambaDType" = "float32"',
                                                   '"mamba_ssm_cache_dtype"']),
    # --- one pool for attention and state: pages, groups, blocks per sequence
    ("config/cache.py", 257, 257, ["enable_prefix_caching: bool = True"]),
    ("config/model.py", 2277, 2279, ['if attn_type == "hybrid":', "return True"]),
    ("model_executor/models/config.py", 763, 779, ['cache_config.mamba_cache_mode = "align"']),
    ("v1/kv_cache_interface.py", 1135, 1141, ["2 + self.num_speculative_blocks + self.num_prefill_checkpoint_blocks",
                                              "1 + self.num_speculative_blocks"]),
    ("platforms/interface.py", 1089, 1103, ["get_mamba_prefill_checkpoint_alignment(vllm_config) or 1",
                                            "kernel_block_alignment_size * attn_page_size_1_token"]),
    ("v1/attention/backends/flash_attn.py", 357, 367, ["return [MultipleOf(16)]"]),
    ("v1/attention/backends/gdn_attn.py", 34, 34, ["FLASHINFER_GDN_CHECKPOINT_ALIGNMENT = 64"]),
    ("model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py", 243, 268, ["is_device_capability(90)",
                                                                           "get_cuda_runtime_major() >= 13"]),
    ("v1/core/kv_cache_planning.py", 524, 552, ["if max_num_layers < min_num_layers * 1.5:",
                                                "num_groups = cdiv(len(layers), group_size)"]),
    ("v1/core/kv_cache_utils.py", 1061, 1093, ["max_memory_usage_bytes(vllm_config)",
                                               "kv_cache_config.num_blocks / num_blocks_per_request"]),
    ("v1/kv_cache_interface.py", 861, 888, ["self.attention_chunk_size + max_in_flight_tokens, max_model_len"]),
    # --- ModelOpt NVFP4 and compressed-tensors int4: what vLLM allocates per expert; the KV dtype it picks
    ("transformers_utils/config.py", 951, 964, ['"hf_quant_config.json"', "if quantization_config is None"]),
    ("transformers_utils/model_arch_config_convertor.py", 248, 268, ['quant_cfg["quant_method"] = "modelopt_fp4"']),
    ("utils/torch_utils.py", 452, 460, ['quant_method.startswith("modelopt")', "kv_cache_quant_algo"]),
    ("model_executor/layers/quantization/modelopt.py", 926, 1026, [
        "w13_num_shards = 2 if self.moe.is_act_and_mul else 1", "hidden_size // 2",
        "hidden_size // self.quant_config.group_size", "torch.empty(num_experts, w13_num_shards, dtype=torch.float32)",
        'layer.register_parameter("w2_weight_scale_2", w2_weight_scale_2)', 'register_parameter("w13_input_scale"',
        'register_parameter("w2_input_scale"']),
    ("model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/compressed_tensors_moe_wna16.py",
     345, 355, ["torch.empty(num_experts, 2)", '"w2_weight_shape"']),
])
def test_cited_lines(path: str, first: int, last: int, needles: list[str]) -> None:
    text = lines(path, first, last)
    for needle in needles:
        assert needle in text, f"vllm/{path}:{first}-{last} no longer has {needle!r}"
