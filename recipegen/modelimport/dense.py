"""Non-routed weight bytes from geometry: embeddings, LM head, attention, norms, routers, shared
experts and dense MLP layers — what stays in HBM beside the routed experts.

Used when no safetensors index gives the checkpoint's size. Linear layers of an FP8 block
checkpoint are counted as one byte per value plus one fp32 scale per block; embeddings, the LM
head, norms and routers stay bf16 (they are not quantized in the public FP8 checkpoints). MTP
(next-token-prediction) layers are not counted: vLLM loads them only for speculative decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from recipegen.modelimport.config import Config
from recipegen.modelimport.geometry import Format


@dataclass
class DenseBytes:
    """Bytes per part, in the checkpoint's storage."""

    parts: dict[str, int] = field(default_factory=dict)
    moe_layer: int = 0      # non-routed bytes of one MoE decoder layer (attention, norms, router, shared)
    dense_layer: int = 0    # one dense decoder layer (attention, norms, MLP)
    replicated: int = 0     # of the total: held whole on every TP rank (norms, routers, MLA q_a/kv_a, row biases)
    kv_projections: int = 0  # of the total: GQA k/v projections (each rank max(1, kv_heads // tp) heads)
    kv_heads: int | None = None

    def add(self, name: str, n: int) -> None:
        self.parts[name] = self.parts.get(name, 0) + n

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def summary(self) -> str:
        return ", ".join(f"{k} {v:,}" for k, v in self.parts.items())


def _linear(rows: int, cols: int, fmt: Format) -> int:
    """Bytes of one [rows, cols] linear weight in the checkpoint's dense-layer format."""
    if fmt.dense_fp8_block and fmt.scale is not None:
        br, bc = fmt.scale["block"]
        return rows * cols + (-(-rows // br)) * (-(-cols // bc)) * 4
    return rows * cols * 2


def dense_bytes(cfg: Config, fmt: Format, moe_layers: list[int], layers: int) -> DenseBytes:
    h = cfg.need("hidden_size")
    vocab = cfg.need("vocab_size")
    experts = cfg.need("num_local_experts", "num_experts", "n_routed_experts")
    out = DenseBytes()
    out.add("embeddings", vocab * h * 2)
    if not cfg.get("tie_word_embeddings", default=False):
        out.add("lm_head", vocab * h * 2)
    out.add("norms", (2 * layers + 1) * h * 2)
    out.replicated += (2 * layers + 1) * h * 2
    heads = cfg.need("num_attention_heads")
    arch = (cfg.get("architectures") or [""])[0]
    per_layer_attn = 0
    replicated_attn = 0     # per layer, held whole on every TP rank
    kv_attn = 0             # per layer, GQA k/v projections
    if cfg.has("kv_lora_rank"):
        rank, rope = cfg.need("kv_lora_rank"), cfg.need("qk_rope_head_dim")
        nope, v = cfg.need("qk_nope_head_dim"), cfg.need("v_head_dim")
        q_rank = cfg.get("q_lora_rank")
        if q_rank:
            per_layer_attn += _linear(q_rank, h, fmt) + q_rank * 2 + _linear(heads * (nope + rope), q_rank, fmt)
            replicated_attn += _linear(q_rank, h, fmt) + q_rank * 2   # q_a + its norm: disable_tp
        else:
            per_layer_attn += _linear(heads * (nope + rope), h, fmt)
        per_layer_attn += _linear(rank + rope, h, fmt) + rank * 2
        replicated_attn += _linear(rank + rope, h, fmt) + rank * 2    # kv_a_proj_with_mqa + kv_a norm
        per_layer_attn += _linear(heads * (nope + v), rank, fmt) + _linear(h, heads * v, fmt)
    else:
        kv = cfg.get("num_key_value_heads") or heads
        hd = cfg.get("head_dim") or h // heads
        per_layer_attn += _linear(heads * hd, h, fmt) + 2 * _linear(kv * hd, h, fmt) + _linear(h, heads * hd, fmt)
        kv_attn += 2 * _linear(kv * hd, h, fmt)
        if cfg.get("attention_bias", default=False):
            per_layer_attn += (heads * hd + 2 * kv * hd) * 2
            kv_attn += 2 * kv * hd * 2
            if arch == "GptOssForCausalLM":  # o_proj has a bias too (whole on every rank), one sink per head
                per_layer_attn += h * 2 + heads * 2
                replicated_attn += h * 2
        if arch == "Qwen3MoeForCausalLM" or cfg.get("use_qk_norm", default=False):
            per_layer_attn += 2 * hd * 2
            replicated_attn += 2 * hd * 2
        out.kv_heads = kv
    out.add("attention", per_layer_attn * layers)
    out.replicated += replicated_attn * layers
    out.kv_projections += kv_attn * layers
    norms = 2 * h * 2
    n_moe = len(moe_layers)
    router = h * experts * 2
    if arch == "GptOssForCausalLM":
        router += experts * 2
    if cfg.get("topk_method") == "noaux_tc" or arch in ("DeepseekV3ForCausalLM", "Glm4MoeForCausalLM"):
        router += experts * 4  # e_score_correction_bias, fp32
    out.add("routers", router * n_moe)
    out.replicated += router * n_moe
    shared = cfg.get("n_shared_experts") or 0
    shared_bytes = 0
    if shared:
        inter = cfg.need("moe_intermediate_size") * shared
        shared_bytes = 2 * _linear(inter, h, fmt) + _linear(h, inter, fmt)
    elif cfg.get("shared_expert_intermediate_size"):  # Qwen2-MoE style: one shared expert + its gate
        inter = cfg.need("shared_expert_intermediate_size")
        shared_bytes = 2 * _linear(inter, h, fmt) + _linear(h, inter, fmt) + h * 2
        out.replicated += h * 2 * n_moe   # shared_expert_gate: a ReplicatedLinear
    if shared_bytes:
        out.add("shared_experts", shared_bytes * n_moe)
    out.moe_layer = per_layer_attn + norms + router + shared_bytes
    dense_layers = layers - n_moe
    if dense_layers:
        inter = cfg.need("intermediate_size")
        mlp = 2 * _linear(inter, h, fmt) + _linear(h, inter, fmt)
        out.add("dense_mlp", mlp * dense_layers)
        out.dense_layer = per_layer_attn + norms + mlp
    return out
