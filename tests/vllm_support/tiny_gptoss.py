"""A tiny gpt-oss-architecture checkpoint for real-engine tests (BF16, random weights).

``GptOssForCausalLM`` with everything gpt-oss's experts have — expert biases (``gate_up_proj_bias``,
``down_proj_bias``), gate/up **interleaved** along ``gate_up_proj``'s last dim, SwiGLU-OAI (vLLM's
``activation="swigluoai"``) — plus its attention (q/k/v/o biases, sinks, sliding window on even
layers) and router bias, stored unquantized in BF16 (vLLM's CPU build has no MXFP4 path the
runtime could split). Geometry for the CPU backend: hidden 64, head_dim 32, 2 layers, 8 experts,
top-2, expert intermediate 64. The gate/up weights are scaled so SwiGLU-OAI's limit 7.0 clamps
some products, and the biases are large enough to matter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from vllm_support.tiny_moe import _write_tokenizer


@dataclass(frozen=True)
class TinyGptOssGeometry:
    vocab_size: int = 512
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    num_experts: int = 8
    top_k: int = 2
    intermediate_size: int = 64
    sliding_window: int = 64
    dtype_bytes: int = 2

    @property
    def bytes_per_expert(self) -> int:
        """w13 (2I x H) + w2 (H x I) + biases (2I + H), bf16."""
        i, h = self.intermediate_size, self.hidden_size
        return (3 * i * h + 2 * i + h) * self.dtype_bytes


TINY_GPTOSS = TinyGptOssGeometry()


def _config(geo: TinyGptOssGeometry) -> dict:
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "vocab_size": geo.vocab_size,
        "hidden_size": geo.hidden_size,
        "intermediate_size": geo.intermediate_size,
        "num_hidden_layers": geo.num_layers,
        "num_attention_heads": geo.num_heads,
        "num_key_value_heads": geo.num_kv_heads,
        "head_dim": geo.head_dim,
        "num_local_experts": geo.num_experts,
        "num_experts_per_tok": geo.top_k,
        "sliding_window": geo.sliding_window,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                        for i in range(geo.num_layers)],
        "max_position_embeddings": 1024,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 1.0,
                            "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                            "original_max_position_embeddings": 1024},
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "swiglu_limit": 7.0,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
    }


def _weights(geo: TinyGptOssGeometry, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, std: float = 0.05) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)

    h, hd, e, i = geo.hidden_size, geo.head_dim, geo.num_experts, geo.intermediate_size
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rand(geo.vocab_size, h, std=0.5)}
    for n in range(geo.num_layers):
        p = f"model.layers.{n}."
        t[p + "input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        t[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        for name, rows, cols in (("q_proj", geo.num_heads * hd, h), ("k_proj", geo.num_kv_heads * hd, h),
                                 ("v_proj", geo.num_kv_heads * hd, h), ("o_proj", h, geo.num_heads * hd)):
            t[p + f"self_attn.{name}.weight"] = rand(rows, cols)
            t[p + f"self_attn.{name}.bias"] = rand(rows, std=0.02)
        t[p + "self_attn.sinks"] = rand(geo.num_heads, std=0.5)
        t[p + "mlp.router.weight"] = rand(e, h, std=0.3)
        t[p + "mlp.router.bias"] = rand(e, std=0.3)
        # HF layout: gate_up_proj [E, H, 2I] with gate/up interleaved along the last dim.
        t[p + "mlp.experts.gate_up_proj"] = rand(e, h, 2 * i, std=0.6)
        t[p + "mlp.experts.gate_up_proj_bias"] = rand(e, 2 * i, std=0.5)
        t[p + "mlp.experts.down_proj"] = rand(e, i, h, std=0.1)
        t[p + "mlp.experts.down_proj_bias"] = rand(e, h, std=0.2)
    t["model.norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    t["lm_head.weight"] = rand(geo.vocab_size, h, std=0.5)
    return t


def write_tiny_gptoss(out: Path, seed: int = 0, geo: TinyGptOssGeometry = TINY_GPTOSS) -> Path:
    """Write config.json, model.safetensors and the tokenizer files into ``out``; return ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(_config(geo), indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    save_file(_weights(geo, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_tokenizer(geo, out)
    return out


if __name__ == "__main__":
    import sys

    print(write_tiny_gptoss(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-gptoss")))
