"""A tiny Qwen3-MoE checkpoint for real-engine tests: seeded random safetensors + WordLevel tokenizer.

Geometry (chosen for vLLM's CPU backend): hidden 64 (the CPU MoE kernel wants multiples of 32),
head_dim 32 (the CPU attention backend accepts only a fixed list starting at 32), 2 decoder layers,
both MoE, 8 routed experts, top-2, vocabulary 512 words. Random (not dummy) weights: vLLM's dummy
loader gives every same-shaped tensor the same values, so all experts would be identical.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file


@dataclass(frozen=True)
class TinyMoeGeometry:
    vocab_size: int = 512
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    num_experts: int = 8
    top_k: int = 2
    moe_intermediate_size: int = 32
    dtype_bytes: int = 2  # bfloat16

    @property
    def moe_layer_indices(self) -> tuple[int, ...]:
        return tuple(range(self.num_layers))

    @property
    def bytes_per_expert(self) -> int:
        """w13 (gate+up, 2I x H) plus w2 (H x I), in the checkpoint dtype."""
        i, h = self.moe_intermediate_size, self.hidden_size
        return (2 * i * h + h * i) * self.dtype_bytes


TINY = TinyMoeGeometry()
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "fi", "gu", "he", "jo"]


def vocabulary(size: int) -> list[str]:
    """Special tokens, then some English words, then made-up two/three-syllable words, `size` in all."""
    words = SPECIAL_TOKENS + (
        "the a of and to in is it that was for on with as by at from this be or an are not "
        "cat dog world river stone light tree house road city sea sky bird fish wind rain fire "
        "one two three four five six seven eight nine ten red green blue black white small big "
        "old new good bad fast slow hot cold day night sun moon star code plan tool call agent "
        "math number proof sum value list file test run error result answer question story poem"
    ).split()
    seen = set(words)
    for a in _SYLLABLES:
        for b in _SYLLABLES:
            for c in [""] + _SYLLABLES:
                w = a + b + c
                if w not in seen:
                    seen.add(w)
                    words.append(w)
                if len(words) >= size:
                    return words[:size]
    raise ValueError(f"cannot build {size} distinct words")


def _config(geo: TinyMoeGeometry) -> dict:
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": geo.vocab_size,
        "hidden_size": geo.hidden_size,
        "intermediate_size": 4 * geo.hidden_size,
        "moe_intermediate_size": geo.moe_intermediate_size,
        "num_hidden_layers": geo.num_layers,
        "num_attention_heads": geo.num_heads,
        "num_key_value_heads": geo.num_kv_heads,
        "head_dim": geo.head_dim,
        "num_experts": geo.num_experts,
        "num_experts_per_tok": geo.top_k,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "max_position_embeddings": 1024,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
    }


def _weights(geo: TinyMoeGeometry, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, std: float = 0.05) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    h, hd, e, i = geo.hidden_size, geo.head_dim, geo.num_experts, geo.moe_intermediate_size
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rand(geo.vocab_size, h, std=0.5)}
    for n in range(geo.num_layers):
        p = f"model.layers.{n}."
        t[p + "input_layernorm.weight"] = ones(h)
        t[p + "post_attention_layernorm.weight"] = ones(h)
        t[p + "self_attn.q_proj.weight"] = rand(geo.num_heads * hd, h)
        t[p + "self_attn.k_proj.weight"] = rand(geo.num_kv_heads * hd, h)
        t[p + "self_attn.v_proj.weight"] = rand(geo.num_kv_heads * hd, h)
        t[p + "self_attn.o_proj.weight"] = rand(h, geo.num_heads * hd)
        t[p + "self_attn.q_norm.weight"] = ones(hd)
        t[p + "self_attn.k_norm.weight"] = ones(hd)
        # A wider router makes the routing skewed, so histograms and row maps are not uniform.
        t[p + "mlp.gate.weight"] = rand(e, h, std=0.3)
        for x in range(e):
            q = f"{p}mlp.experts.{x}."
            t[q + "gate_proj.weight"] = rand(i, h, std=0.2)
            t[q + "up_proj.weight"] = rand(i, h, std=0.2)
            t[q + "down_proj.weight"] = rand(h, i, std=0.2)
    t["model.norm.weight"] = ones(h)
    t["lm_head.weight"] = rand(geo.vocab_size, h, std=0.5)
    return t


def _write_tokenizer(geo: TinyMoeGeometry, out: Path) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {w: idx for idx, w in enumerate(vocabulary(geo.vocab_size))}
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    from tokenizers.decoders import WordPiece  # joins words with spaces, no "##" pieces here

    tok.decoder = WordPiece(prefix="##", cleanup=False)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "unk_token": "<unk>",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "pad_token": "<pad>",
                "model_max_length": 1024,
                "add_bos_token": False,
            },
            indent=1,
        )
    )


def write_tiny_moe(out: Path, seed: int = 0, geo: TinyMoeGeometry = TINY) -> Path:
    """Write config.json, model.safetensors and the tokenizer files into `out`; return `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(_config(geo), indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    save_file(_weights(geo, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_tokenizer(geo, out)
    return out


if __name__ == "__main__":
    import sys

    print(write_tiny_moe(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-moe")))
