"""A MoE model's geometry from its `config.json`: layers, experts, tensors, format, attention.

Every figure is returned as `{value, source}` naming the config.json field(s) it came from (or
the vLLM 0.33 source line where vLLM fixes a value the config does not carry). The field names
probed are those of the public configs of gpt-oss, Qwen3-MoE, DeepSeek-V3 / Kimi-K2, GLM-4.5
and Mixtral; a config without one of them fails naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipegen.common.errors import InputError
from recipegen.modelimport.config import Config

# gpt-oss's swigluoai constants are set by vLLM, not the config (expert_residency.contract.expert_formats);
# vllm/model_executor/models/gpt_oss.py:399-400 (has_bias=True, swigluoai).
GPT_OSS_BIAS_SOURCE = "vLLM 0.33.0 vllm/model_executor/models/gpt_oss.py:399 (FusedMoE has_bias=True)"

ROUTED_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")
TOP_K_FIELDS = ("num_experts_per_tok", "experts_per_token")
MOE_INTER_FIELDS = ("moe_intermediate_size",)


def sourced(value: Any, source: str) -> dict[str, Any]:
    return {"value": value, "source": source}


@dataclass(frozen=True)
class Format:
    """The routed experts' storage, from `quantization_config` (or the model dtype)."""

    dtype: str                      # ExpertTensor dtype
    scale: dict[str, Any] | None    # ExpertTensor scale layout, or None
    source: str
    dense_fp8_block: bool           # dense linear layers are FP8 with the same block scales


def expert_format(cfg: Config) -> Format:
    q = cfg.get("quantization_config")
    if q is None:
        dtype = cfg.get("torch_dtype", "dtype", default="bfloat16")
        name = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype)
        if name is None:
            raise InputError(f"unknown torch_dtype {dtype!r} (bfloat16, float16, float32)", file=cfg.file,
                             field="torch_dtype")
        src = f"config.json `torch_dtype` {dtype}" if cfg.has("torch_dtype") else "no quantization_config: bf16"
        return Format(name, None, src, False)
    if not isinstance(q, dict):
        raise InputError("expected an object", file=cfg.file, field="quantization_config")
    method = q.get("quant_method")
    if method == "mxfp4":
        return Format("mxfp4", None, "config.json `quantization_config.quant_method` mxfp4 (e2m1 values, one "
                      "ue8m0 scale per 32)", False)
    if method == "fp8":
        block = q.get("weight_block_size")
        if block is None:
            return Format("fp8", None, "config.json `quantization_config.quant_method` fp8 (per-tensor scale)",
                          False)
        if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) for b in block)):
            raise InputError(f"expected [rows, cols], got {block!r}", file=cfg.file,
                             field="quantization_config.weight_block_size")
        return Format("fp8", {"dtype": "fp32", "block": list(block)},
                      f"config.json `quantization_config` fp8 {q.get('fmt', 'e4m3')}, `weight_block_size` "
                      f"{block} (one fp32 scale per block)", True)
    if method == "compressed-tensors":
        for name, group in (q.get("config_groups") or {}).items():
            weights = (group or {}).get("weights") or {}
            if weights.get("num_bits") == 4 and weights.get("type") == "int" and weights.get("group_size"):
                size = weights["group_size"]
                return Format("int4", {"dtype": "bf16", "block": [size]},
                              f"config.json `quantization_config.config_groups.{name}.weights` int4, "
                              f"group_size {size} (one bf16 scale per group)", False)
        raise InputError("compressed-tensors scheme without an int4 group (num_bits 4, type int, group_size) "
                         "the importer knows", file=cfg.file, field="quantization_config.config_groups")
    raise InputError(f"quant_method {method!r} is not one the importer reads (mxfp4, fp8, compressed-tensors "
                     "int4)", file=cfg.file, field="quantization_config.quant_method")


def moe_layer_indices(cfg: Config, layers: int) -> tuple[list[int], str]:
    """MoE decoder layers and the rule that picked them."""
    if cfg.has("first_k_dense_replace"):
        k = cfg.need("first_k_dense_replace")
        freq = cfg.get("moe_layer_freq", default=1)
        idx = [i for i in range(k, layers) if (i - k) % freq == 0] if isinstance(freq, int) else list(range(k, layers))
        return idx, f"config.json `first_k_dense_replace` {k}" + (f", `moe_layer_freq` {freq}" if cfg.has("moe_layer_freq") else "")
    if cfg.has("decoder_sparse_step", "mlp_only_layers"):
        step = cfg.get("decoder_sparse_step", default=1) or 1
        dense = set(cfg.get("mlp_only_layers", default=[]) or [])
        idx = [i for i in range(layers) if i not in dense and (i + 1) % step == 0]
        return idx, f"config.json `decoder_sparse_step` {step}, `mlp_only_layers` {sorted(dense)}"
    return list(range(layers)), "every decoder layer is MoE (no first_k_dense_replace / mlp_only_layers)"


def attention_groups(cfg: Config, layers: int, kv_dtype: str) -> list[dict[str, Any]]:
    """Attention per decoder layer (full / sliding / MLA) with the fields it came from."""
    if cfg.has("kv_lora_rank"):
        rank = cfg.need("kv_lora_rank")
        rope = cfg.need("qk_rope_head_dim", what="MLA caches the RoPE key beside the latent")
        return [{"kind": "mla", "layers": sourced(f"0-{layers - 1}", "config.json `kv_lora_rank` (every layer MLA)"),
                 "kv_lora_rank": sourced(rank, "config.json `kv_lora_rank`"),
                 "rope_head_dim": sourced(rope, "config.json `qk_rope_head_dim`"),
                 "kv_dtype": kv_dtype}]
    heads = cfg.need("num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads") or heads
    kv_src = "config.json `num_key_value_heads`" if cfg.get("num_key_value_heads") else \
        "config.json `num_attention_heads` (no num_key_value_heads: multi-head)"
    if cfg.get("head_dim"):
        head_dim, hd_src = cfg.need("head_dim"), "config.json `head_dim`"
    else:
        hidden = cfg.need("hidden_size")
        head_dim, hd_src = hidden // heads, "config.json `hidden_size` / `num_attention_heads`"
    base = {"kv_heads": sourced(kv_heads, kv_src), "head_dim": sourced(head_dim, hd_src), "kv_dtype": kv_dtype}
    kinds: list[str]
    window = cfg.get("sliding_window")
    if isinstance(cfg.get("layer_types"), list):
        types = cfg.need("layer_types", kind=list)
        if len(types) != layers:
            raise InputError(f"{len(types)} entries for {layers} layers", file=cfg.file, field="layer_types")
        kinds = []
        for t in types:
            if t not in ("sliding_attention", "full_attention"):
                raise InputError(f"layer type {t!r} (known: sliding_attention, full_attention)", file=cfg.file,
                                 field="layer_types")
            kinds.append("sliding" if t == "sliding_attention" else "full")
        rule = "config.json `layer_types`"
    elif window and cfg.get("use_sliding_window", default=True):
        first = cfg.get("max_window_layers", default=0) if cfg.has("use_sliding_window") else 0
        kinds = ["sliding" if i >= first else "full" for i in range(layers)]
        rule = "config.json `sliding_window`" + (", `max_window_layers`" if first else "")
    else:
        kinds = ["full"] * layers
        rule = "config.json `sliding_window` null" if cfg.has("sliding_window") else "no sliding_window"
    out = []
    for kind in ("sliding", "full"):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        if not idx:
            continue
        group: dict[str, Any] = {"kind": kind, "layers": sourced(index_ranges(idx), rule), **base}
        if kind == "sliding":
            if not isinstance(window, int):
                raise InputError("sliding layers need an integer window", file=cfg.file, field="sliding_window")
            group["window"] = sourced(window, "config.json `sliding_window`")
        out.append(group)
    return out


def index_ranges(idx: list[int]) -> str | list[int]:
    """[3, 4, 5] -> "3-5" (the schema reads ranges); a non-contiguous list stays a list."""
    if idx == list(range(idx[0], idx[-1] + 1)):
        return f"{idx[0]}-{idx[-1]}"
    return idx
