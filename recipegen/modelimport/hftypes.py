"""The types transformers' config classes give each config.json field, and the rules its strict validation applies.

vLLM 0.33.0 builds config.json through the transformers config class of its `model_type` (`hfdefaults`). Those
classes are `@strict(accept_kwargs=True)` dataclasses (transformers 5.20.2 configuration_utils.py,
`PreTrainedConfig`): each field the class declares is checked against its annotation when the class is built, by
huggingface_hub's strict-dataclass validator (huggingface_hub dataclasses.py `type_validator`), and a value that
does not match raises StrictDataclassFieldValidationError, so vLLM cannot load the file. A key the class does not
declare is kept as it is, unchecked. The validator's rules, mirrored by `_accepts`:

- `int` takes a JSON integer and not true / false (`_validate_simple_type` refuses a bool for int); `float` takes
  only a JSON number with a fraction or an exponent — `7` is an int and `isinstance(7, float)` is false, so
  `"swiglu_limit": 7` is refused where `7.0` is taken; `float | int` takes both (and still not true / false);
  `bool` takes only true / false (not 0 / 1); `str` only a string;
- `None` in an annotation is what lets a JSON null through: `int` refuses null, `int | None` takes it;
- `list[T]` takes a JSON array whose every entry is a T; `dict` any object; `dict[K, V]` an object whose keys
  are K (JSON keys are strings, so `dict[int, str]` takes no non-empty object) and values V; a tuple, a set,
  `PreTrainedConfig` and the `RopeParameters` TypedDict match nothing JSON gives (the last raises TypeError in
  isinstance, which the validator counts as a mismatch); `torch.dtype` is a forward reference the validator
  does not check, so `dtype` takes anything; a union takes what any member takes;
  `Literal[...]` takes one of its values (a bool only a bool, an int only an int);
- a key the class declares only through its `attribute_map` (GptOssConfig `num_experts` for `num_local_experts`)
  is not checked: `PreTrainedConfig.__post_init__` sets it with setattr, and the strict `__setattr__` looks its
  validators up by the name before `attribute_map` turns it into the field's.

`CLASSES` is that table, per class vLLM 0.33.0 reaches (`hfdefaults.CLASSES`): every declared field with its
annotation as written in transformers 5.20.2 (transformers/models/<m>/configuration_<m>.py; the fields of
`PreTrainedConfig` itself, configuration_utils.py, in `_BASE`). vLLM 0.33.0 requires
`transformers>=5.16.1,<5.21.0`. Built from the 5.16.1, 5.17.0, 5.18.0, 5.19.0, 5.20.0 and 5.20.2 wheels, the
classes give every field one annotation wherever they declare it; the releases differ only in which fields they
declare: before 5.19.0 GptOssConfig has no `swiglu_limit` / `swiglu_alpha` and the MoE classes no
`output_router_logits`, 5.16.1 has no Qwen3-VL / Qwen3.5 vision `rope_parameters` (each then unchecked there), and
5.16.1 alone declares Kimi_K25VisionConfig `max_position_embeddings: int | None`. `PreTrainedConfig`'s own fields
(`_BASE`: `transformers_version`, `is_encoder_decoder`, `chunk_size_feed_forward`, ...) are checked by 5.16.1
(with huggingface_hub 1.33.0) and not by 5.20.2 (with huggingface_hub 2.4.0). The table is the union: a value is
refused when a release in that range refuses it, as vLLM 0.33.0 with that release cannot load the file.

`ROTARY` mirrors the one class validator that refuses a size the importer reads: transformers 5.20.2
`RotaryEmbeddingConfigMixin.validate_rope` (modeling_rope_utils.py) raises "RoPE requires an even rotary
dimension" when the class's `head_dim` is odd, above 4, and fully rotated (`int(head_dim * partial_rotary_factor)
== head_dim`); the check is there from 5.18.0 on (not in 5.16.1 or 5.17.0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from recipegen.modelimport.hfdefaults import CLASSES as HF_CLASSES
from recipegen.modelimport.hfdefaults import HIDDEN_PER_HEAD, TF, Refuse
from recipegen.modelimport.hfdefaults import _show as show
from recipegen.modelimport.jsondoc import NonFinite

# `cfg` below is a recipegen.modelimport.config.Config
Config = Any

STRICT_SRC = "huggingface_hub strict dataclass validation"


@dataclass(frozen=True)
class ClassTypes:
    fields: dict[str, str]                                  # field -> annotation, as transformers writes it


# PreTrainedConfig's own fields (transformers 5.20.2 configuration_utils.py), in every class; checked by 5.16.1
_BASE = {
    "transformers_version": "str | None",
    "architectures": "list[str] | None",
    "output_hidden_states": "bool | None",
    "return_dict": "bool | None",
    "dtype": "str | torch.dtype | None",
    "chunk_size_feed_forward": "int",
    "is_encoder_decoder": "bool",
    "id2label": "dict[int, str] | dict[str, str] | None",
    "label2id": "dict[str, int] | dict[str, str] | None",
    "problem_type": "Literal['regression', 'single_label_classification', 'multi_label_classification'] | None",
}


def _cls(groups: dict[str, str]) -> ClassTypes:
    """A class's table from {annotation: "field field ..."} (its own fields; `_BASE` added)."""
    out = dict(_BASE)
    for ann, names in groups.items():
        for name in names.split():
            out[name] = ann
    return ClassTypes(out)


# The vision tower's fields Qwen3.5's and Qwen3-VL's vision configs share (Qwen3-VL adds deepstack_visual_indexes).
_QWEN_VISION = {
    "int":
        "depth hidden_size in_channels intermediate_size num_heads num_position_embeddings out_hidden_size "
        "spatial_merge_size",
    "int | list[int] | tuple[int, int]": "patch_size temporal_patch_size",
    "dict | None": "rope_parameters",
    "float": "initializer_range",
    "str": "hidden_act",
}


CLASSES: dict[str, ClassTypes] = {
    "GptOssConfig": _cls({
        "int":
            "head_dim hidden_size intermediate_size max_position_embeddings num_attention_heads num_experts_per_tok "
            "num_hidden_layers num_key_value_heads num_local_experts vocab_size",
        "float": "initializer_range rms_norm_eps router_aux_loss_coef swiglu_alpha swiglu_limit",
        "bool": "attention_bias output_router_logits tie_word_embeddings use_cache",
        "int | None": "bos_token_id pad_token_id sliding_window",
        "dict | None": "rope_parameters",
        "float | int": "attention_dropout",
        "int | list[int] | None": "eos_token_id",
        "list[str] | None": "layer_types",
        "str": "hidden_act",
    }),
    "Qwen3MoeConfig": _cls({
        "int":
            "decoder_sparse_step hidden_size intermediate_size max_position_embeddings moe_intermediate_size "
            "num_attention_heads num_experts num_experts_per_tok num_hidden_layers num_key_value_heads vocab_size",
        "bool": "attention_bias norm_topk_prob output_router_logits tie_word_embeddings use_cache use_sliding_window",
        "float": "initializer_range rms_norm_eps router_aux_loss_coef",
        "int | None": "bos_token_id pad_token_id sliding_window",
        "RopeParameters | dict | None": "rope_parameters",
        "float | int": "attention_dropout",
        "int | list[int] | None": "eos_token_id",
        "list[int] | None": "mlp_only_layers",
        "str": "hidden_act",
    }),
    "DeepseekV3Config": _cls({
        "int":
            "hidden_size intermediate_size kv_lora_rank max_position_embeddings moe_intermediate_size n_routed_experts "
            "n_shared_experts num_attention_heads num_hidden_layers num_mtp_layers qk_nope_head_dim qk_rope_head_dim "
            "vocab_size",
        "int | None":
            "bos_token_id first_k_dense_replace n_group num_experts_per_tok num_key_value_heads pad_token_id "
            "pretraining_tp q_lora_rank topk_group v_head_dim",
        "bool": "attention_bias output_router_logits tie_word_embeddings use_cache",
        "float": "initializer_range rms_norm_eps routed_scaling_factor",
        "bool | None": "norm_topk_prob rope_interleave",
        "RopeParameters | dict | None": "rope_parameters",
        "float | int | None": "attention_dropout",
        "int | list[int] | None": "eos_token_id",
        "str": "hidden_act",
    }),
    "GlmMoeDsaConfig": _cls({
        "int":
            "first_k_dense_replace head_dim hidden_size index_head_dim index_n_heads index_topk intermediate_size "
            "kv_lora_rank max_position_embeddings moe_intermediate_size n_group n_routed_experts n_shared_experts "
            "num_attention_heads num_experts_per_tok num_hidden_layers num_key_value_heads q_lora_rank qk_nope_head_dim "
            "qk_rope_head_dim topk_group v_head_dim vocab_size",
        "bool": "attention_bias mlp_bias norm_topk_prob output_router_logits tie_word_embeddings use_cache",
        "float": "initializer_range rms_norm_eps routed_scaling_factor",
        "list[str] | None": "indexer_types layer_types mlp_layer_types",
        "int | None": "bos_token_id pad_token_id",
        "dict | None": "rope_parameters",
        "float | int": "attention_dropout",
        "int | list[int] | None": "eos_token_id",
        "str": "hidden_act",
    }),
    "Glm4MoeConfig": _cls({
        "int":
            "first_k_dense_replace hidden_size intermediate_size max_position_embeddings moe_intermediate_size n_group "
            "n_routed_experts n_shared_experts num_attention_heads num_experts_per_tok num_hidden_layers "
            "num_key_value_heads num_mtp_layers topk_group vocab_size",
        "bool": "attention_bias norm_topk_prob output_router_logits tie_word_embeddings use_cache use_qk_norm",
        "float": "initializer_range rms_norm_eps routed_scaling_factor",
        "int | None": "bos_token_id pad_token_id",
        "RopeParameters | dict | None": "rope_parameters",
        "float | int": "attention_dropout",
        "int | list[int] | None": "eos_token_id",
        "str": "hidden_act",
    }),
    "MixtralConfig": _cls({
        "int":
            "hidden_size intermediate_size max_position_embeddings num_attention_heads num_experts_per_tok "
            "num_hidden_layers num_key_value_heads num_local_experts vocab_size",
        "float": "initializer_range rms_norm_eps router_aux_loss_coef router_jitter_noise",
        "int | None": "bos_token_id head_dim pad_token_id sliding_window",
        "bool": "output_router_logits tie_word_embeddings use_cache",
        "RopeParameters | dict | None": "rope_parameters",
        "float | int": "attention_dropout",
        "int | list[int] | None": "eos_token_id",
        "str": "hidden_act",
    }),
    "Qwen3NextConfig": _cls({
        "int":
            "decoder_sparse_step head_dim hidden_size intermediate_size linear_conv_kernel_dim linear_key_head_dim "
            "linear_num_key_heads linear_num_value_heads linear_value_head_dim max_position_embeddings "
            "moe_intermediate_size num_attention_heads num_experts num_experts_per_tok num_hidden_layers "
            "num_key_value_heads shared_expert_intermediate_size vocab_size",
        "bool": "attention_bias norm_topk_prob output_router_logits tie_word_embeddings use_cache",
        "float": "initializer_range rms_norm_eps router_aux_loss_coef",
        "int | None": "bos_token_id pad_token_id",
        "RopeParameters | dict | None": "rope_parameters",
        "float | int": "attention_dropout",
        "int | list[int] | None": "eos_token_id",
        "list[int] | None": "mlp_only_layers",
        "list[str] | None": "layer_types",
        "str": "hidden_act",
    }),
    "Qwen3_5MoeTextConfig": _cls({
        "int":
            "head_dim hidden_size linear_conv_kernel_dim linear_key_head_dim linear_num_key_heads linear_num_value_heads "
            "linear_value_head_dim max_position_embeddings moe_intermediate_size num_attention_heads num_experts "
            "num_experts_per_tok num_hidden_layers num_key_value_heads shared_expert_intermediate_size vocab_size",
        "bool": "attention_bias output_router_logits tie_word_embeddings use_cache",
        "float": "initializer_range rms_norm_eps router_aux_loss_coef",
        "int | None": "bos_token_id pad_token_id",
        "RopeParameters | dict | None": "rope_parameters",
        "float | int": "attention_dropout",
        "int | list[int] | None": "eos_token_id",
        "list[str] | None": "layer_types",
        "str": "hidden_act",
    }),
    "Qwen3_5MoeConfig": _cls({
        "int": "image_token_id video_token_id vision_end_token_id vision_start_token_id",
        "dict | PreTrainedConfig | None": "text_config vision_config",
        "bool": "tie_word_embeddings",
    }),
    "Qwen3_5MoeVisionConfig": _cls(_QWEN_VISION),
    "NemotronHConfig": _cls({
        "int":
            "chunk_size conv_kernel expand head_dim hidden_size intermediate_size mamba_head_dim mamba_num_heads "
            "max_position_embeddings moe_intermediate_size moe_shared_expert_intermediate_size n_group n_groups "
            "n_routed_experts n_shared_experts num_attention_heads num_experts_per_tok num_key_value_heads "
            "num_logits_to_keep num_nextn_predict_layers ssm_state_size topk_group vocab_size",
        "bool":
            "attention_bias mamba_proj_bias mlp_bias moe_shared_expert_overlap norm_topk_prob output_router_logits "
            "rescale_prenorm_residual residual_in_fp32 tie_word_embeddings use_bias use_cache use_conv_bias "
            "use_mamba_kernels",
        "float": "initializer_range layer_norm_epsilon time_step_floor time_step_max time_step_min",
        "int | None": "bos_token_id moe_latent_size pad_token_id sliding_window",
        "float | int": "attention_dropout hidden_dropout routed_scaling_factor",
        "str": "mamba_hidden_act mamba_ssm_cache_dtype mlp_hidden_act",
        "list[str] | None": "layers_block_type mtp_layers_block_type",
        "int | list[int] | None": "eos_token_id",
        "list[float] | tuple[float, ...]": "time_step_limit",
    }),
    "Llama4TextConfig": _cls({
        "int":
            "floor_scale head_dim hidden_size interleave_moe_layer_step intermediate_size intermediate_size_mlp "
            "max_position_embeddings no_rope_layer_interval num_attention_heads num_experts_per_tok num_hidden_layers "
            "num_key_value_heads num_local_experts vocab_size",
        "bool": "attention_bias attn_temperature_tuning output_router_logits tie_word_embeddings use_cache use_qk_norm",
        "float": "attn_scale initializer_range rms_norm_eps router_aux_loss_coef router_jitter_noise",
        "int | None": "attention_chunk_size bos_token_id pad_token_id",
        "list[int] | None": "moe_layers no_rope_layers",
        "RopeParameters | dict | None": "rope_parameters",
        "float | int": "attention_dropout",
        "int | list[int] | None": "eos_token_id",
        "list[str] | None": "layer_types",
        "str": "hidden_act",
    }),
    "Llama4Config": _cls({
        "int": "boi_token_index eoi_token_index image_token_index",
        "dict | PreTrainedConfig | None": "text_config vision_config",
        "bool": "tie_word_embeddings",
    }),
    "Llama4VisionConfig": _cls({
        "int":
            "hidden_size intermediate_size num_attention_heads num_channels num_hidden_layers projector_input_dim "
            "projector_output_dim vision_output_dim",
        "float": "initializer_range norm_eps pixel_shuffle_ratio",
        "float | int": "attention_dropout projector_dropout",
        "int | list[int] | tuple[int, int]": "image_size patch_size",
        "str": "hidden_act vision_feature_select_strategy",
        "RopeParameters | dict | None": "rope_parameters",
        "bool": "multi_modal_projector_bias",
    }),
    "Qwen3VLMoeTextConfig": _cls({
        "int":
            "decoder_sparse_step hidden_size intermediate_size max_position_embeddings moe_intermediate_size "
            "num_attention_heads num_experts num_experts_per_tok num_hidden_layers num_key_value_heads vocab_size",
        "bool": "attention_bias output_router_logits tie_word_embeddings use_cache",
        "float": "initializer_range rms_norm_eps router_aux_loss_coef",
        "int | None": "bos_token_id head_dim pad_token_id",
        "RopeParameters | dict | None": "rope_parameters",
        "float | int": "attention_dropout",
        "int | list[int] | None": "eos_token_id",
        "list[int] | None": "mlp_only_layers",
        "str": "hidden_act",
    }),
    "Qwen3VLMoeConfig": _cls({
        "int": "image_token_id video_token_id vision_end_token_id vision_start_token_id",
        "dict | PreTrainedConfig | None": "text_config vision_config",
        "bool": "tie_word_embeddings",
    }),
    "Qwen3VLMoeVisionConfig": _cls({**_QWEN_VISION, "list[int] | tuple[int, ...]": "deepstack_visual_indexes"}),
    "Kimi_K25Config": _cls({
        "int": "image_token_id video_token_id vision_end_token_id vision_start_token_id",
        "dict | PreTrainedConfig | None": "text_config vision_config",
        "bool": "tie_word_embeddings",
        "float": "projection_layer_norm_eps",
        "int | None": "projection_hidden_size",
    }),
    "Kimi_K25VisionConfig": _cls({
        "int":
            "hidden_size intermediate_size num_attention_heads num_hidden_layers patch_size pos_emb_height pos_emb_time "
            "pos_emb_width",
        "dict | None": "rope_parameters",
        "int | None": "max_position_embeddings",          # declared in 5.16.1 only
        "str": "hidden_act",
        "tuple[int, int] | list[int]": "merge_kernel_size",
    }),
}

# How each class's `validate_rope` finds the rotary width: `key` as config.json gives it (a null the class keeps
# as None: no check), else `fallback` as given, else `absent` — a default, HIDDEN_PER_HEAD (hidden_size //
# num_attention_heads, also for a falsy head_dim), or None (no attribute: no check); `partial`: the
# `partial_rotary_factor` the class sets when config.json gives none (1.0 otherwise).
# Classes without RoPE (NemotronHConfig) or without a text `head_dim` (the vision towers) are not listed.


@dataclass(frozen=True)
class Rotary:
    key: str
    absent: Any
    fallback: str = ""
    partial: float = 1.0
    how: str = ""


ROTARY: dict[str, Rotary] = {
    "GptOssConfig": Rotary("head_dim", 64),
    # no head_dim field: a given head_dim is set as it is (accept_kwargs), else no attribute
    "Qwen3MoeConfig": Rotary("head_dim", None),
    # __post_init__ sets head_dim = qk_rope_head_dim, then sets a given head_dim over it (an undeclared kwarg)
    "DeepseekV3Config": Rotary("head_dim", 64, fallback="qk_rope_head_dim",
                               how="DeepseekV3Config.__post_init__ sets head_dim to qk_rope_head_dim"),
    # __post_init__ sets head_dim = qk_rope_head_dim whatever config.json says
    "GlmMoeDsaConfig": Rotary("qk_rope_head_dim", 64, how="GlmMoeDsaConfig.__post_init__ sets head_dim to it"),
    "Glm4MoeConfig": Rotary("head_dim", None, partial=0.5),
    "MixtralConfig": Rotary("head_dim", None),
    "Qwen3NextConfig": Rotary("head_dim", 256, partial=0.25),
    "Qwen3_5MoeTextConfig": Rotary("head_dim", 256, partial=0.25),
    "Llama4TextConfig": Rotary("head_dim", 128),
    # __post_init__: head_dim or hidden_size // num_attention_heads
    "Qwen3VLMoeTextConfig": Rotary("head_dim", HIDDEN_PER_HEAD,
                                   how="Qwen3VLMoeTextConfig.__post_init__ sets head_dim to hidden_size // "
                                   "num_attention_heads"),
}


# --- the annotation language: NAME, NAME[ARGS], A | B, Literal['x', 'y'], ...

_TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z_][\w.]*)|(?P<str>'[^']*')|(?P<ell>\.\.\.)|(?P<op>[\[\],|]))")


@cache
def _parse(text: str) -> tuple[Any, ...]:
    """An annotation as a tree: `int | list[int] | None` -> ("union", ("int",), ("list", ("int",)), ("None",))."""
    tokens = []
    pos = 0
    while pos < len(text.rstrip()):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"annotation {text!r}: cannot read at {pos}")
        tokens.append(m.group(m.lastgroup or ""))
        pos = m.end()
    i = 0

    def union() -> tuple[Any, ...]:
        nonlocal i
        members = [term()]
        while i < len(tokens) and tokens[i] == "|":
            i += 1
            members.append(term())
        return members[0] if len(members) == 1 else ("union", *members)

    def term() -> tuple[Any, ...]:
        nonlocal i
        name = tokens[i]
        i += 1
        if i < len(tokens) and tokens[i] == "[":
            i += 1
            args: list[Any] = []
            while tokens[i] != "]":
                tok = tokens[i]
                if tok.startswith("'"):
                    args.append(tok[1:-1])
                    i += 1
                elif tok == "...":
                    args.append("...")
                    i += 1
                else:
                    args.append(union())
                if tokens[i] == ",":
                    i += 1
            i += 1
            return (name, *args)
        return (name,)

    out = union()
    if i != len(tokens):
        raise ValueError(f"annotation {text!r}: trailing {tokens[i:]}")
    return out


def _accepts(node: tuple[Any, ...], value: Any) -> bool:
    """huggingface_hub `type_validator` on a JSON value: does `value` pass `node` (a parsed annotation)?"""
    head, args = node[0], node[1:]
    if head == "union":
        return any(_accepts(a, value) for a in args)
    if head == "Any":
        return True
    if head == "None":
        return value is None
    if head == "Literal":
        return any(type(a) is type(value) and a == value for a in args)
    if head == "list":
        return isinstance(value, list) and (not args or all(_accepts(args[0], v) for v in value))
    if head == "dict":
        return isinstance(value, dict) and (not args or all(_accepts(args[0], k) and _accepts(args[1], v)
                                                             for k, v in value.items()))
    if head == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if head == "float":
        return isinstance(value, (float, NonFinite))          # JSON NaN / Infinity: a Python float
    if head == "bool":
        return isinstance(value, bool)
    if head == "str":
        return isinstance(value, str)
    if head == "torch.dtype":
        return True         # a forward reference (5.16.1 `ForwardRef('torch.dtype')`): the validator skips it
    return False        # tuple, set, PreTrainedConfig, RopeParameters: nothing JSON gives


def accepts(annotation: str, value: Any) -> bool:
    return _accepts(_parse(annotation), value)


def _json(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, (float, NonFinite)):
        return f"the number {value!r}"
    if isinstance(value, str):
        text = repr(value)
        return f"the string {text if len(text) <= 40 else text[:37] + '...'}"
    return "a list" if isinstance(value, list) else "an object"


def _why(ann: str, value: Any) -> str:
    """Which of the validator's rules refuses `value` for `ann`, where it is not plain (JSON numbers)."""
    members = {m.strip() for m in ann.split("|")}
    if isinstance(value, bool) and "int" in members:
        return "true / false is not an int there"
    if isinstance(value, int) and not isinstance(value, bool) and "float" in members and "int" not in members:
        return f"an integer is not a float there: write {value}.0"
    if isinstance(value, int) and not isinstance(value, bool) and "bool" in members:
        return "an integer is not true / false there"
    return ""


def check(cfg: Config) -> None:
    """Every field of `cfg` that its transformers class declares, against the annotation (`CLASSES`), then the
    rotary width (`ROTARY`). Nothing when the class is not known (`cfg.hf` None: the import refuses where it
    needs the class)."""
    if cfg.hf is None or cfg.hf.name not in CLASSES:
        return
    name_ = cfg.hf.name
    table = CLASSES[name_]
    file = HF_CLASSES[name_].file
    for key, value in cfg.data.items():
        ann = table.fields.get(key)
        if ann is None or accepts(ann, value):
            continue
        why = _why(ann, value)
        rule = HF_CLASSES[name_].rules.get(key)
        if value is None and rule is not None and not isinstance(rule.absent, Refuse) \
                and rule.absent is not HIDDEN_PER_HEAD:
            why = f"leave the key out ({name_} then gives {show(rule.absent)})"
        raise cfg.error(key, f"`{cfg.name(key)}` is {_json(value)}, but {TF} {name_} types `{key}` "
                        f"`{ann}`{' without None' if value is None else ''} and refuses it ({STRICT_SRC}; {file}): "
                        f"vLLM 0.33.0 cannot load this config.json{'; ' + why if why else ''}")
    _check_rotary(cfg, name_, file)


def _check_rotary(cfg: Config, name_: str, file: str) -> None:
    rot = ROTARY.get(name_)
    if rot is None:
        return
    data = cfg.data
    key = rot.key
    if key not in data and rot.fallback in data:
        key = rot.fallback
    width = data[key] if key in data else rot.absent
    src = f" ({rot.how})" if rot.how and (key == rot.fallback or not rot.fallback) else ""
    if rot.absent is HIDDEN_PER_HEAD and (width is HIDDEN_PER_HEAD or not width):           # `head_dim or hidden_size // num_attention_heads`
        hidden, heads = data.get("hidden_size"), data.get("num_attention_heads")
        width = hidden // heads if (isinstance(hidden, int) and isinstance(heads, int) and heads > 0) else None
        key = "hidden_size"
    if isinstance(width, bool) or not isinstance(width, int) or width <= 4 or width % 2 == 0:
        return
    rope = data.get("rope_scaling") or data.get("rope_parameters")
    partial: Any = rot.partial
    origin = f"{name_}'s default {rot.partial}" if rot.partial != 1.0 else "none given: 1.0"
    if isinstance(rope, dict) and "partial_rotary_factor" in rope:
        partial, origin = rope["partial_rotary_factor"], "config.json's RoPE setting"
    elif data.get("partial_rotary_factor") is not None:      # a null one is not passed on: 1.0
        partial, origin = data["partial_rotary_factor"], f"config.json `{cfg.name('partial_rotary_factor')}`"
    elif "partial_rotary_factor" in data:
        partial, origin = 1.0, f"`{cfg.name('partial_rotary_factor')}` null"
    if isinstance(partial, (int, float)) and int(width * partial) != width:
        return          # a partial rotary width: transformers rounds it and it fits the head
    shown = f"`{cfg.name(key)}` {width}" if key != "hidden_size" else (
        f"hidden_size // num_attention_heads = {width}")
    raise cfg.error(key, f"{shown} is the rotary width{src}, odd, and fully rotated (partial_rotary_factor "
                    f"{partial!r}, {origin}): {TF} {name_} refuses it — \"RoPE requires an even rotary dimension\" "
                    f"(modeling_rope_utils.py validate_rope; {file}) — so vLLM 0.33.0 cannot load this config.json")
