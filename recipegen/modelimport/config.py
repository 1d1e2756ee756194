"""A Hugging Face `config.json` read against a typed schema before any arithmetic.

`FIELDS` is the one table of the config fields the importer understands: each with its type,
its bounds and what it means. A family (`families.FAMILIES`) names the fields it reads; every
field a config carries must be one of them, one the family knows does not change the
arithmetic (`families.Family.ignored`), or one of `COMMON_IGNORED` (token ids, dropout, training
settings, generation defaults) — anything else is refused naming it, because a field the
importer does not read may change the layer layout or the sizes (a layer pattern, linear
attention, Mamba or indexer settings). Values are checked before they reach arithmetic: type
(a JSON true is not 1; 2.0 is not an integer), range (no zero heads, no 10^9 layers), list
lengths; two spellings of one quantity (`num_experts` / `num_local_experts`) must agree.
NaN / Infinity (not JSON) are refused in any field the importer reads, and in any other field
after the fields themselves are checked — so the refusal that matters comes first — except in
`NONFINITE_UNREAD`, fields no size depends on where transformers writes Infinity.
Every error names the file, the line and the field as the config spells it
(`text_config.num_hidden_layers`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipegen.common.errors import InputError
from recipegen.modelimport.jsondoc import JsonDoc, Path_, dotted, load_json

MAX_CONFIG_BYTES = 4 * 2**20         # the largest public config.json (an exclude list) is < 100 KB

_MISSING = object()


@dataclass(frozen=True)
class Field:
    """One config field: JSON type, bounds and meaning (quoted in errors)."""

    kind: str                     # "int", "num", "bool", "str", "int_list", "str_list", "obj", "str_or_null"
    meaning: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    max_len: int = 0              # lists: most elements
    min_len: int = 0              # lists: fewest elements


_LAYERS = 4096                    # more decoder layers than any published model, by far
_WIDTH = 1 << 18                  # hidden / intermediate widths
_HEADS = 4096
_EXPERTS = 1 << 16

FIELDS: dict[str, Field] = {
    "num_hidden_layers": Field("int", "decoder layers", 1, _LAYERS),
    "hidden_size": Field("int", "model width", 1, _WIDTH),
    "vocab_size": Field("int", "vocabulary size", 1, 1 << 24),
    "intermediate_size": Field("int", "dense MLP (or expert) intermediate width", 1, _WIDTH),
    "intermediate_size_mlp": Field("int", "dense MLP intermediate width (Llama-4)", 1, _WIDTH),
    "moe_intermediate_size": Field("int", "routed expert intermediate width", 1, _WIDTH),
    "shared_expert_intermediate_size": Field("int", "shared expert intermediate width (0: none)", 0, _WIDTH),
    "moe_shared_expert_intermediate_size": Field("int", "shared expert intermediate width", 1, _WIDTH),
    "num_attention_heads": Field("int", "query heads", 1, _HEADS),
    "num_key_value_heads": Field("int", "KV heads", 1, _HEADS),
    "head_dim": Field("int", "per-head dimension", 1, 1 << 16),
    "num_local_experts": Field("int", "routed experts per MoE layer", 1, _EXPERTS),
    "num_experts": Field("int", "routed experts per MoE layer", 1, _EXPERTS),
    "n_routed_experts": Field("int", "routed experts per MoE layer", 1, _EXPERTS),
    "num_experts_per_tok": Field("int", "routed experts picked per token", 1, _EXPERTS),
    "experts_per_token": Field("int", "routed experts picked per token", 1, _EXPERTS),
    "n_shared_experts": Field("int", "shared experts per MoE layer", 0, 64),
    "first_k_dense_replace": Field("int", "leading dense decoder layers", 0, _LAYERS),
    "moe_layer_freq": Field("int", "one MoE layer every N layers after the dense ones", 1, _LAYERS),
    "decoder_sparse_step": Field("int", "one MoE layer every N layers", 1, _LAYERS),
    "mlp_only_layers": Field("int_list", "dense decoder layers", 0, _LAYERS - 1, max_len=_LAYERS),
    "interleave_moe_layer_step": Field("int", "one MoE layer every N layers", 1, _LAYERS),
    "num_nextn_predict_layers": Field("int", "MTP layers after the decoder layers", 0, 16),
    "mtp_num_hidden_layers": Field("int", "MTP layers after the decoder layers", 0, 16),
    "kv_lora_rank": Field("int", "MLA latent width", 1, _WIDTH),
    "q_lora_rank": Field("int", "MLA query latent width", 1, _WIDTH),
    "qk_rope_head_dim": Field("int", "MLA RoPE key width", 1, 1 << 16),
    "qk_nope_head_dim": Field("int", "MLA non-RoPE key width", 1, 1 << 16),
    "v_head_dim": Field("int", "MLA value head width", 1, 1 << 16),
    "qk_head_dim": Field("int", "MLA query/key head width (nope + rope)", 1, 1 << 16),
    "index_n_heads": Field("int", "sparse-attention indexer heads", 1, _HEADS),
    "index_head_dim": Field("int", "sparse-attention indexer head width", 128, 1 << 14),
    "index_topk": Field("int", "tokens the indexer selects", 1, 1 << 31),
    "sliding_window": Field("int", "sliding-window length in tokens", 1, 1 << 31),
    "max_window_layers": Field("int", "layers before sliding-window layers", 0, _LAYERS),
    "use_sliding_window": Field("bool", "sliding window on"),
    "layer_types": Field("str_list", "attention kind per decoder layer", max_len=_LAYERS,
                         choices=("full_attention", "sliding_attention", "linear_attention")),
    "full_attention_interval": Field("int", "one full-attention layer every N layers", 1, _LAYERS),
    "hybrid_override_pattern": Field("str", "layer kinds, one character per layer (M Mamba-2, E MoE, "
                                     "* attention, - MLP)"),
    "linear_num_key_heads": Field("int", "Gated DeltaNet key heads", 1, _HEADS),
    "linear_num_value_heads": Field("int", "Gated DeltaNet value heads", 1, _HEADS),
    "linear_key_head_dim": Field("int", "Gated DeltaNet key head width", 1, 1 << 14),
    "linear_value_head_dim": Field("int", "Gated DeltaNet value head width", 1, 1 << 14),
    "linear_conv_kernel_dim": Field("int", "Gated DeltaNet convolution width", 1, 64),
    "attn_output_gate": Field("bool", "gated attention (query projection doubled)"),
    "mamba_num_heads": Field("int", "Mamba-2 heads", 1, _HEADS),
    "mamba_head_dim": Field("int", "Mamba-2 head width", 1, 1 << 14),
    "n_groups": Field("int", "Mamba-2 B/C groups", 1, _HEADS),
    "ssm_state_size": Field("int", "Mamba-2 state width", 1, 1 << 14),
    "conv_kernel": Field("int", "Mamba-2 convolution width", 1, 64),
    "use_conv_bias": Field("bool", "Mamba-2 convolution bias"),
    "use_bias": Field("bool", "Mamba-2 projection bias"),
    "mamba_proj_bias": Field("bool", "Mamba-2 projection bias"),
    "mlp_bias": Field("bool", "MLP biases"),
    "mamba_ssm_cache_dtype": Field("str", "Mamba-2 SSM state dtype", choices=("float32", "bfloat16", "float16")),
    "mamba_ssm_dtype": Field("str", "linear-attention state dtype", choices=("float32", "bfloat16", "float16")),
    "mlp_hidden_act": Field("str", "expert activation", choices=("relu2",)),
    "hidden_act": Field("str", "activation", choices=("silu",)),
    "attention_bias": Field("bool", "attention projection biases"),
    "use_qk_norm": Field("bool", "per-head q/k RMSNorm"),
    "qkv_bias": Field("bool", "q/k/v projection biases"),
    "attention_chunk_size": Field("int", "chunked local attention length in tokens", 1, 1 << 31),
    "no_rope_layers": Field("int_list", "1 = RoPE (chunked) layer, 0 = NoPE (global) layer", 0, 1,
                            max_len=_LAYERS),
    "tie_word_embeddings": Field("bool", "LM head shares the embeddings"),
    "max_position_embeddings": Field("int", "longest context the checkpoint declares", 1, 1 << 31),
    "model_max_length": Field("int", "longest context (tokenizer-style field)", 1, 1 << 31),
    "torch_dtype": Field("str", "weight dtype", choices=("bfloat16", "float16", "float32")),
    "dtype": Field("str", "weight dtype", choices=("bfloat16", "float16", "float32")),
    "swiglu_limit": Field("num", "SwiGLU clamp limit", 0, 1e6),
    "topk_method": Field("str", "routing method", choices=("noaux_tc", "greedy", "group_limited_greedy")),
    "rope_scaling": Field("obj", "RoPE scaling"),
    "rope_parameters": Field("obj", "RoPE parameters"),
    "quantization_config": Field("obj", "quantization"),
    "text_config": Field("obj", "the language model's config"),
    "vision_config": Field("obj", "the vision tower's config"),
    "model_type": Field("str", "model type"),
    # vision towers (vision_config)
    "depth": Field("int", "vision blocks", 1, 1024),
    "in_channels": Field("int", "image channels", 1, 16),
    "num_channels": Field("int", "image channels", 1, 16),
    "temporal_patch_size": Field("int", "frames per patch", 1, 64),
    "patch_size": Field("int", "patch side in pixels", 1, 1024),
    "image_size": Field("int", "image side in pixels", 1, 1 << 16),
    "num_position_embeddings": Field("int", "vision position embeddings", 1, 1 << 20),
    "out_hidden_size": Field("int", "vision output width", 1, _WIDTH),
    "spatial_merge_size": Field("int", "patches merged per side", 1, 64),
    "deepstack_visual_indexes": Field("int_list", "vision blocks feeding deepstack mergers", 0, 1023, max_len=1024),
    "projector_input_dim": Field("int", "projector input width", 1, _WIDTH),
    "projector_output_dim": Field("int", "projector output width", 1, _WIDTH),
    "vision_output_dim": Field("int", "vision output width", 1, _WIDTH),
    "multi_modal_projector_bias": Field("bool", "projector biases"),
    "vt_hidden_size": Field("int", "vision width", 1, _WIDTH),
    "vt_intermediate_size": Field("int", "vision MLP width", 1, _WIDTH),
    "vt_num_hidden_layers": Field("int", "vision blocks", 1, 1024),
    "init_pos_emb_height": Field("int", "vision position grid height", 1, 4096),
    "init_pos_emb_width": Field("int", "vision position grid width", 1, 4096),
    "merge_kernel_size": Field("int_list", "patches merged (height, width)", 1, 64, max_len=2, min_len=2),
    "text_hidden_size": Field("int", "the language model's width", 1, _WIDTH),
    "mm_hidden_size": Field("int", "vision width seen by the projector", 1, _WIDTH),
    "moe_layers": Field("int_list", "MoE decoder layers", 0, _LAYERS - 1, max_len=_LAYERS),
    "architectures": Field("str_list", "model class", max_len=4),
}

# Alternative spellings of one quantity: a config giving two of them must give one value.
ALIASES: tuple[tuple[str, ...], ...] = (
    ("num_local_experts", "num_experts", "n_routed_experts"),
    ("num_experts_per_tok", "experts_per_token"),
    ("torch_dtype", "dtype"),
)

# Fields of every Hugging Face config that do not change sizes: token ids, dropout, init,
# training losses, generation defaults, bookkeeping (transformers' PretrainedConfig attributes).
COMMON_IGNORED = frozenset({
    "_name_or_path", "_attn_implementation", "_attn_implementation_autoset", "add_cross_attention",
    "auto_map", "bad_words_ids", "begin_suppress_tokens", "bos_token_id", "chunk_size_feed_forward",
    "cross_attention_hidden_size", "decoder_start_token_id", "diversity_penalty", "do_sample",
    "early_stopping", "encoder_no_repeat_ngram_size", "eos_token_id", "exponential_decay_length_penalty",
    "finetuning_task", "forced_bos_token_id", "forced_eos_token_id", "id2label", "initializer_range",
    "is_decoder", "is_encoder_decoder", "label2id", "length_penalty", "max_length", "min_length",
    "no_repeat_ngram_size", "num_beam_groups", "num_beams", "num_return_sequences", "output_attentions",
    "output_hidden_states", "output_scores", "pad_token_id", "prefix", "problem_type", "pruned_heads",
    "remove_invalid_values", "repetition_penalty", "return_dict", "return_dict_in_generate", "sep_token_id",
    "suppress_tokens", "task_specific_params", "temperature", "tf_legacy_loss", "tie_encoder_decoder",
    "tokenizer_class", "top_k", "top_p", "torchscript", "transformers_version", "typical_p", "use_bfloat16",
    "use_cache", "attention_dropout", "hidden_dropout", "router_aux_loss_coef", "output_router_logits",
    "rms_norm_eps", "layer_norm_epsilon", "norm_eps", "rope_theta", "partial_rotary_factor",
    "norm_topk_prob", "routed_scaling_factor", "scoring_func", "n_group", "topk_group", "aux_loss_alpha",
    "seq_aux", "ep_size", "pretraining_tp", "router_jitter_noise", "ignore_index", "num_logits_to_keep",
})


# Fields where a NaN / Infinity is accepted because nothing reads them for a size, with why: vLLM 0.33 never reads
# `time_step_limit` (no occurrence under vllm/), and transformers' NemotronHConfig writes its default
# (0.0, float("inf")) as [0.0, Infinity]. Only when the family does not read the field (`check_fields`).
NONFINITE_UNREAD: dict[str, str] = {
    "time_step_limit": "Mamba-2 dt clamp; transformers' NemotronHConfig default (0.0, inf); vLLM 0.33 never reads it",
}

# Sections whose fields are checked by their own `check_fields` (build.read_config), not as one value.
_SECTIONS = frozenset({"text_config", "vision_config"})


class Config:
    """A config.json (or its `text_config`), every field checked against `FIELDS` on reading."""

    def __init__(self, doc: JsonDoc, base: Path_ = ()) -> None:
        self.doc, self.base = doc, base
        node: Any = doc.data
        for part in base:
            node = node[part]
        if not isinstance(node, dict):
            raise doc.error("expected a JSON object", base)
        self.data: dict[str, Any] = node
        # the transformers config class vLLM builds this object through (`hfdefaults`), or why it is not known;
        # set by build.read_config for the root, passed on to text_config / vision_config by `section`
        self.hf: Any = None
        self.hf_why = "the importer has not resolved its config class"

    @classmethod
    def read(cls, path: Path) -> Config:
        doc = load_json(path, limit=MAX_CONFIG_BYTES, what="config.json", nonfinite=True)
        if not isinstance(doc.data, dict):
            raise InputError("a config.json is a JSON object", file=doc.file, line=1)
        return cls(doc)

    @property
    def file(self) -> str:
        return self.doc.file

    def section(self, name: str) -> Config:
        """The object under `name`; a refusal naming it (never a KeyError) when it is missing or not an object."""
        if not isinstance(self.data.get(name), dict):
            got = "missing" if self.data.get(name) is None else f"not an object, got {_short(self.data[name])}"
            raise InputError(f"`{self.name(name)}` is {got}", file=self.file,
                             line=self.doc.line(self.base + (name,)) if name in self.data else None,
                             field=self.name(name))
        child = Config(self.doc, self.base + (name,))
        # the sub-config's class: what the parent's class builds it as (hfdefaults.HFClass.child)
        child.hf, child.hf_why = self.hf.child(name, child) if self.hf is not None else (None, self.hf_why)
        return child

    def name(self, field: str) -> str:
        """The field as the config spells it, e.g. `text_config.num_hidden_layers`."""
        return dotted(self.base + (field,)) or field

    def error(self, field: str, message: str) -> InputError:
        return self.doc.error(message, self.base + (field,))

    # --- whole-config checks
    def check_fields(self, reads: set[str], ignored: set[str], arch: str) -> None:
        """Every field is one the family reads (and of the right type) or one that changes no size; then no
        NaN / Infinity outside `NONFINITE_UNREAD` (after the fields, so an unread field is what is refused first)."""
        for key, value in self.data.items():
            if key in reads:
                if key not in _SECTIONS:
                    self._refuse_nonfinite(key, read=True)
                self._check(key, value)
            elif key not in ignored and key not in COMMON_IGNORED:
                known = ", ".join(sorted(reads - {"architectures", "model_type"})) or "none"
                raise self.error(key, f"not a field the importer reads for {arch}: it may change the layer layout "
                                 "or the sizes, and an import that ignored it could be wrong (fields read for "
                                 f"{arch}: {known})")
        for group in ALIASES:
            given = [(n, self.data[n]) for n in group if n in self.data and self.data[n] is not None]
            if len({repr(v) for _, v in given}) > 1:
                (a, va), (b, vb) = given[0], given[1]
                raise self.error(b, f"{self.name(a)} is {va!r} but {self.name(b)} is {vb!r}: two spellings of "
                                 f"one quantity ({FIELDS[a].meaning}) disagree")
        for key in self.data:
            if key not in reads and key not in NONFINITE_UNREAD:
                self._refuse_nonfinite(key, read=False)

    def _refuse_nonfinite(self, key: str, *, read: bool) -> None:
        found = self.doc.nonfinite_under(self.base + (key,))
        if found is not None:
            path, word = found
            raise self.doc.error(f"{word} is not a JSON number" + (" in a field the importer reads" if read else "")
                                 + " (Python's json accepts it, other JSON readers refuse it: JSON that readers "
                                 "disagree on)", path)

    def typed(self, key: str, spec: Field) -> Any:
        """`key` checked against `spec` as the config fields are (`_check`): for values read outside `FIELDS`
        (quantization settings), so a `true` or `16.0` where an integer belongs is refused here too. None when
        absent or null."""
        value = self.data.get(key)
        self._check(key, value, spec)
        return value

    def _check(self, key: str, value: Any, spec: Field | None = None) -> None:
        spec = spec or FIELDS[key]
        if value is None and spec.kind not in ("int_list", "str_list"):
            return  # JSON null: the field is absent (Hugging Face writes null for unset fields)
        kind = spec.kind
        if kind == "int":
            self._int(key, value, spec)
        elif kind == "num":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise self.error(key, f"expected a number ({spec.meaning}), got {value!r}")
            self._bounds(key, value, spec)
        elif kind == "bool":
            if not isinstance(value, bool):
                raise self.error(key, f"expected true or false ({spec.meaning}), got {value!r}")
        elif kind == "str":
            if not isinstance(value, str):
                raise self.error(key, f"expected a string ({spec.meaning}), got {value!r}")
            if spec.choices and value not in spec.choices:
                raise self.error(key, f"{value!r} is not one the importer reads ({', '.join(spec.choices)})")
        elif kind == "obj":
            if not isinstance(value, dict):
                raise self.error(key, f"expected an object ({spec.meaning}), got {_short(value)}")
        elif kind in ("int_list", "str_list"):
            if value is None:
                return
            if not isinstance(value, list):
                raise self.error(key, f"expected a list ({spec.meaning}), got {_short(value)}")
            if len(value) > spec.max_len:
                raise self.error(key, f"{len(value):,} entries (at most {spec.max_len:,})")
            if len(value) < spec.min_len:
                exact = "exactly" if spec.min_len == spec.max_len else "at least"
                raise self.error(key, f"{len(value):,} entr{'y' if len(value) == 1 else 'ies'} ({exact} "
                                 f"{spec.min_len:,}: {spec.meaning})")
            for i, item in enumerate(value):
                where = self.base + (key, i)
                if kind == "int_list":
                    if isinstance(item, bool) or not isinstance(item, int) or \
                            (spec.lo is not None and item < spec.lo) or (spec.hi is not None and item > spec.hi):
                        raise self.doc.error(f"expected an integer in [{spec.lo:g}, {spec.hi:g}] ({spec.meaning}), "
                                             f"got {item!r}", where)
                elif not isinstance(item, str) or (spec.choices and item not in spec.choices):
                    raise self.doc.error(f"{item!r} is not one the importer reads"
                                         + (f" ({', '.join(spec.choices)})" if spec.choices else " (a string)"),
                                         where)

    def _int(self, key: str, value: Any, spec: Field) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected an integer ({spec.meaning}), got {_short(value)}")
        self._bounds(key, value, spec)
        return value

    def _bounds(self, key: str, value: float, spec: Field) -> None:
        if spec.lo is not None and value < spec.lo:
            raise self.error(key, f"{value} is below {spec.lo:g} ({spec.meaning})")
        if spec.hi is not None and value > spec.hi:
            raise self.error(key, f"{value:,} is more than {spec.hi:,.0f} ({spec.meaning}): not a real model")

    # --- reading (after check_fields)
    def has(self, *names: str) -> bool:
        return any(self.data.get(n) is not None for n in names)

    def get(self, *names: str, default: Any = None) -> Any:
        for n in names:
            if self.data.get(n) is not None:
                return self.data[n]
        return default

    def field(self, *names: str) -> str | None:
        """Which of `names` is given (as the config spells it)."""
        for n in names:
            if self.data.get(n) is not None:
                return self.name(n)
        return None

    def need(self, *names: str, what: str = "") -> Any:
        """The first of `names` given; an error naming them all otherwise."""
        for n in names:
            if self.data.get(n) is not None:
                return self.data[n]
        looked = " or ".join(f"`{self.name(n)}`" for n in names)
        null = next((n for n in names if n in self.data), None)
        if null is not None:    # the key is there, with null: name it and its line
            raise self.error(null, f"`{self.name(null)}` is null, and the importer needs a value for {looked}"
                             f"{' — ' + what if what else ''}")
        meaning = what or (FIELDS[names[0]].meaning if names[0] in FIELDS else "")
        raise InputError(f"missing {looked}{' — ' + meaning if meaning else ''}: {self._no_default_why()}; write the "
                         "checkpoint's value", file=self.file,
                         line=self.doc.line(self.base) if self.base else None, field=self.name(names[0]))

    def _no_default_why(self) -> str:
        """Why a field `need` asks for is not taken from the transformers config class vLLM builds the file through
        (docs/models.md, "Fields config.json leaves out"): those are the model's geometry, and a class default is a
        placeholder size, not the checkpoint's."""
        cls = getattr(self.hf, "name", None)
        whose = f"transformers' {cls}" if cls else "the transformers config class"
        return (f"the importer does not take {whose} default for the model's geometry (a layer count, a width, a "
                "head or expert count, a layer layout, an activation constant): a class default is a placeholder, not "
                "this checkpoint's value (docs/models.md, \"Fields config.json leaves out\")")

    def src(self, *names: str) -> str:
        """'config.json `a` × `b`' (the first given spelling of each)."""
        return "config.json " + " × ".join(f"`{self.field(n) or self.name(n)}`" for n in names)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
