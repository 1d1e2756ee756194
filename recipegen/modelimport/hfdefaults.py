"""What a config field is when config.json leaves it out (or writes null), for the config classes vLLM 0.33.0 reads.

vLLM does not read config.json as a plain dictionary: `HFConfigParser.parse` builds it with
`AutoConfig.from_pretrained` (vLLM 0.33.0 vllm/transformers_utils/config.py:425-446), i.e. through the
transformers config class registered for its `model_type` — vLLM's own registry first, where `deepseek_v32` and
`kimi_k2` are transformers' DeepseekV3Config (:133, :141). Those classes are dataclasses: a field config.json omits
takes the class default (Qwen3MoeConfig's `num_key_value_heads` is 4, not the query heads), and a JSON null is
handed to the class as None, which a field typed `int` refuses (huggingface_hub's `@strict`), so vLLM cannot
load the file. A field the class does not declare is left unset; then the vLLM model code decides (a
`getattr(config, name, default)`, or an AttributeError: vLLM fails).

`CLASSES` records, per class (`HFClass.rules`), what the importer needs of every field it would otherwise have to
guess: the class default, what a null becomes, or why the import must refuse. `given(cfg, key)` returns the
config's own value or that rule's value, each with a source naming the class, its file and the transformers
version.

Version: vLLM 0.33.0's wheel (METADATA) requires `transformers<5.21.0,>=5.16.1`. Every rule below was read from
transformers 5.20.2 (the newest release in that range) and checked against 5.16.1 by building each class from
both wheels, with each field absent and null: the two agree on every field here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# `cfg` below is a recipegen.modelimport.config.Config (not imported: config.py asks HFClass.child for its sections)
Config = Any

TF = "transformers 5.20.2"
V = "vLLM 0.33.0 vllm/"


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


STRICT = _Marker("STRICT")                    # null: the class types the field without None and refuses it
HIDDEN_PER_HEAD = _Marker("HIDDEN_PER_HEAD")  # hidden_size // num_attention_heads


@dataclass(frozen=True)
class Refuse:
    """The import cannot state the figure: `why` (completed with the field's name by `given`)."""

    why: str


@dataclass(frozen=True)
class Rule:
    """One field of one class: what it is when config.json omits it (`absent`) and when it writes null (`null`).

    `absent` / `null`: a value, `HIDDEN_PER_HEAD`, a `Refuse`, or (null only) `STRICT`. `how` / `null_how`
    say where the value comes from when it is not the class's own field default (a field the class does not
    declare, read by vLLM with a default; a default applied in `__post_init__`): templates with `{cls}` (version
    and class), `{file}` and `{value}` filled in; without `{value}` the value is appended."""

    absent: Any
    null: Any = STRICT
    how: str = ""
    null_how: str = ""


@dataclass(frozen=True)
class HFClass:
    name: str
    module: str                                   # transformers/models/<module>/configuration_<module>.py
    rules: dict[str, Rule]
    sub: dict[str, str] = field(default_factory=dict)  # sub-config key -> class name (AUTO: by its model_type)

    @property
    def file(self) -> str:
        return f"transformers/models/{self.module}/configuration_{self.module}.py"

    def child(self, key: str, child: Config) -> tuple[HFClass | None, str]:
        """The class this one builds its sub-config `key` (text_config, vision_config) as, or None and why."""
        spec = self.sub.get(key)
        if spec is None:
            return None, f"{TF} {self.name} builds no `{key}` sub-config ({self.file})"
        if spec == AUTO_DEEPSEEK:
            # Kimi_K25Config builds text_config with AutoConfig by its model_type (absent: deepseek_v3; kimi_k2 is
            # rewritten to deepseek_v3); a null or "" one cannot be resolved ("Cannot resolve `text_config`") and
            # an unknown one is refused ("Unrecognized model type for subconfig"; configuration_utils.py
            # SubConfigSpec): vLLM cannot load the file. Any other builds a class the importer does not read.
            if "model_type" in child.data and child.data["model_type"] not in ("deepseek_v3", "kimi_k2"):
                mtype = child.data["model_type"]
                name = child.name("model_type")
                raise child.error("model_type", f"`{name}` is {'null' if mtype is None else repr(mtype)}: {TF} "
                                  f"{self.name} builds `{key}` through AutoConfig by this model_type ({self.file}; "
                                  "absent, it is deepseek_v3, and kimi_k2 is read as deepseek_v3), which refuses a "
                                  "null, an empty or an unknown one (vLLM 0.33.0 cannot load this config.json) and "
                                  "builds another class's fields and defaults for any other, where the importer "
                                  "reads DeepseekV3Config's; give deepseek_v3 or kimi_k2, or leave it out")
            return CLASSES["DeepseekV3Config"], ""
        return CLASSES[spec], ""


AUTO_DEEPSEEK = "AutoConfig (model_type, default deepseek_v3)"

_UNDECLARED = "{cls} declares no such field and vLLM 0.33.0 reads "
_NONE_KEPT = "{cls} keeps None and vLLM 0.33.0 reads it as "

_MOE_LAYER_FREQ = Rule(1, Refuse(f"vLLM computes layer % moe_layer_freq ({V}model_executor/models/deepseek_v2.py:"
                                 "1269, :1296): None fails"),
                       how=_UNDECLARED + "getattr(config, \"moe_layer_freq\", 1) (vllm/model_executor/models/"
                       "deepseek_v2.py:1269)")
_TOPK_METHOD = Rule(None, None, how=_UNDECLARED + "getattr(config, \"topk_method\", None) (vllm/model_executor/"
                    "models/deepseek_v2.py:327): no e_score_correction_bias",
                    null_how=_NONE_KEPT + "no topk_method (vllm/model_executor/models/deepseek_v2.py:327)")
_GATE = Rule(True, Refuse(f"vLLM sizes the query projection by 1 + attn_output_gate ({V}model_executor/models/"
                          "qwen3_next.py:315-320): None fails"),
             how=_UNDECLARED + "getattr(config, \"attn_output_gate\", True) (vllm/model_executor/models/"
             "qwen3_next.py:315)")
_INTERVAL = Rule(4, Refuse("transformers fills layer_types with (i + 1) % full_attention_interval: None fails"),
                 how="{cls}.__post_init__ fills layer_types with full_attention_interval 4 when config.json gives "
                 "neither ({file})")
_DEEPSEEK_TEXT = {
    "tie_word_embeddings": Rule(False),
    "first_k_dense_replace": Rule(3, Refuse(f"vLLM compares the layer index with it ({V}model_executor/models/"
                                            "deepseek_v2.py:1295): None fails")),
    "n_shared_experts": Rule(1),
    "q_lora_rank": Rule(1536, None, null_how=_NONE_KEPT + "no query LoRA: q_proj [heads × (nope + rope), hidden] "
                        "(vllm/model_executor/models/deepseek_v2.py:1051, :1081-1091)"),
    "moe_layer_freq": _MOE_LAYER_FREQ,
    "topk_method": _TOPK_METHOD,
    "max_position_embeddings": Rule(4096),
}

_CLASSES: tuple[HFClass, ...] = (
    HFClass("GptOssConfig", "gpt_oss", {
        "num_key_value_heads": Rule(8),
        "head_dim": Rule(64),
        "max_position_embeddings": Rule(131072),
        "sliding_window": Rule(128, None, null_how=_NONE_KEPT + "no window (vllm/model_executor/models/gpt_oss.py:"
                               "175)"),
        "tie_word_embeddings": Rule(False),
    }),
    HFClass("Qwen3MoeConfig", "qwen3_moe", {
        "num_key_value_heads": Rule(4),
        "head_dim": Rule(HIDDEN_PER_HEAD, HIDDEN_PER_HEAD,
                         how=_UNDECLARED + "getattr(config, \"head_dim\", None) or hidden_size // num_attention_heads "
                         "(vllm/model_executor/models/qwen3_moe.py:377, :277)",
                         null_how=_NONE_KEPT + "hidden_size // num_attention_heads (vllm/model_executor/models/"
                         "qwen3_moe.py:277)"),
        "tie_word_embeddings": Rule(False),
        "decoder_sparse_step": Rule(1),
        "mlp_only_layers": Rule([], [], null_how="{cls}.__post_init__ makes None [] ({file})"),
        "attention_bias": Rule(False),
        "use_sliding_window": Rule(False),
        "sliding_window": Rule(4096, None, null_how=_NONE_KEPT + "no window"),
        "max_position_embeddings": Rule(32768),
    }),
    HFClass("DeepseekV3Config", "deepseek_v3", dict(_DEEPSEEK_TEXT)),
    HFClass("GlmMoeDsaConfig", "glm_moe_dsa", {
        "tie_word_embeddings": Rule(False),
        "first_k_dense_replace": Rule(3),
        "n_shared_experts": Rule(1),
        "q_lora_rank": Rule(2048),
        "max_position_embeddings": Rule(202752),
        "moe_layer_freq": _MOE_LAYER_FREQ,
        "topk_method": _TOPK_METHOD,
    }),
    HFClass("Glm4MoeConfig", "glm4_moe", {
        "num_key_value_heads": Rule(8),
        "head_dim": Rule(Refuse(f"vLLM 0.33.0 reads config.head_dim (vllm/model_executor/models/glm4_moe.py:344), a "
                                f"field {TF} Glm4MoeConfig does not declare (transformers/models/glm4_moe/"
                                "configuration_glm4_moe.py): without it vLLM cannot build the attention, so there is "
                                "no head width to state"),
                         HIDDEN_PER_HEAD, null_how=_NONE_KEPT + "hidden_size // num_attention_heads "
                         "(vllm/model_executor/models/glm4_moe.py:255)"),
        "tie_word_embeddings": Rule(False),
        "first_k_dense_replace": Rule(1),
        "n_shared_experts": Rule(1),
        "attention_bias": Rule(False),
        "use_qk_norm": Rule(False),
        "max_position_embeddings": Rule(131072),
    }),
    HFClass("MixtralConfig", "mixtral", {
        "num_key_value_heads": Rule(8),
        "head_dim": Rule(HIDDEN_PER_HEAD, HIDDEN_PER_HEAD,
                         how="{cls} default None, which vLLM 0.33.0 reads as hidden_size // num_attention_heads "
                         "(vllm/model_executor/models/mixtral.py:173-175)",
                         null_how=_NONE_KEPT + "hidden_size // num_attention_heads (vllm/model_executor/models/"
                         "mixtral.py:173-175)"),
        "sliding_window": Rule(None, None),
        "tie_word_embeddings": Rule(False),
        "max_position_embeddings": Rule(131072),     # 4096 * 32
    }),
    HFClass("Qwen3NextConfig", "qwen3_next", {
        "num_key_value_heads": Rule(2),
        "head_dim": Rule(256),
        "tie_word_embeddings": Rule(False),
        "shared_expert_intermediate_size": Rule(512),
        "decoder_sparse_step": Rule(1),
        "mlp_only_layers": Rule([], [], null_how="{cls}.__post_init__ makes None [] ({file})"),
        "attn_output_gate": _GATE,
        "full_attention_interval": _INTERVAL,
        "max_position_embeddings": Rule(32768),
    }),
    HFClass("Qwen3_5MoeTextConfig", "qwen3_5_moe", {
        "num_key_value_heads": Rule(2),
        "head_dim": Rule(256),
        "tie_word_embeddings": Rule(False),
        "shared_expert_intermediate_size": Rule(512),
        "attn_output_gate": _GATE,
        "full_attention_interval": _INTERVAL,
        "max_position_embeddings": Rule(32768),
    }),
    HFClass("Qwen3_5MoeConfig", "qwen3_5_moe", {"tie_word_embeddings": Rule(False)},
            {"text_config": "Qwen3_5MoeTextConfig", "vision_config": "Qwen3_5MoeVisionConfig"}),
    HFClass("Qwen3_5MoeVisionConfig", "qwen3_5_moe", {
        "deepstack_visual_indexes": Rule([], Refuse(f"vLLM takes len() of it once the attribute exists "
                                                    f"({V}model_executor/models/qwen3_vl.py:586-607): None fails"),
                                         how=_UNDECLARED + "hasattr(vision_config, \"deepstack_visual_indexes\"), "
                                         "else no deepstack merger (vllm/model_executor/models/qwen3_vl.py:586-590)"),
    }),
    HFClass("NemotronHConfig", "nemotron_h", {
        "num_key_value_heads": Rule(8),
        "head_dim": Rule(128),
        "tie_word_embeddings": Rule(False),
        "n_shared_experts": Rule(1),
        "moe_shared_expert_intermediate_size": Rule(7688),
        "use_bias": Rule(False),
        "use_conv_bias": Rule(True),
        "mlp_bias": Rule(False),
        "mamba_ssm_cache_dtype": Rule("float32"),
        "mlp_hidden_act": Rule("relu2"),
        "sliding_window": Rule(None, None),
        "max_position_embeddings": Rule(4096),
    }),
    HFClass("Llama4TextConfig", "llama4", {
        "num_key_value_heads": Rule(8),
        "head_dim": Rule(128),
        "tie_word_embeddings": Rule(False),
        "attention_chunk_size": Rule(8192, None, null_how=_NONE_KEPT + "no chunking: every layer full attention "
                                     "(vllm/model_executor/models/llama4.py:251)"),
        "max_position_embeddings": Rule(131072),     # 4096 * 32
    }),
    HFClass("Llama4Config", "llama4", {"tie_word_embeddings": Rule(False)},
            {"text_config": "Llama4TextConfig", "vision_config": "Llama4VisionConfig"}),
    HFClass("Llama4VisionConfig", "llama4", {"multi_modal_projector_bias": Rule(False)}),
    HFClass("Qwen3VLMoeTextConfig", "qwen3_vl_moe", {
        "num_key_value_heads": Rule(16),
        "head_dim": Rule(HIDDEN_PER_HEAD, HIDDEN_PER_HEAD,
                         how="{cls}.__post_init__ sets head_dim or hidden_size // num_attention_heads ({file})",
                         null_how="{cls}.__post_init__ sets head_dim or hidden_size // num_attention_heads ({file})"),
        "tie_word_embeddings": Rule(True),
        "decoder_sparse_step": Rule(1),
        "mlp_only_layers": Rule([], [], null_how="{cls}.__post_init__ makes None [] ({file})"),
        "attention_bias": Rule(False),
        "max_position_embeddings": Rule(128000),
    }),
    HFClass("Qwen3VLMoeConfig", "qwen3_vl_moe", {"tie_word_embeddings": Rule(False)},
            {"text_config": "Qwen3VLMoeTextConfig", "vision_config": "Qwen3VLMoeVisionConfig"}),
    HFClass("Qwen3VLMoeVisionConfig", "qwen3_vl_moe", {"deepstack_visual_indexes": Rule([8, 16, 24])}),
    HFClass("Kimi_K25Config", "kimi_k25", {
        "tie_word_embeddings": Rule(Refuse(
            f"{TF} Kimi_K25Config defaults it to true (transformers/models/kimi_k25/configuration_kimi_k25.py), "
            f"vLLM copies the root value into text_config ({V}config/vllm.py:1011-1015) and then ties the LM head to "
            f"the embeddings unless the checkpoint ships an lm_head ({V}config/model.py:1255-1281), which config.json "
            "does not say; give tie_word_embeddings")),
    }, {"text_config": AUTO_DEEPSEEK, "vision_config": "Kimi_K25VisionConfig"}),
    HFClass("Kimi_K25VisionConfig", "kimi_k25", {}),
)

CLASSES: dict[str, HFClass] = {c.name: c for c in _CLASSES}

# model_type -> the class vLLM 0.33.0 loads config.json through (transformers' registry, or vLLM's first)
ROOT: dict[str, str] = {
    "gpt_oss": "GptOssConfig", "qwen3_moe": "Qwen3MoeConfig", "deepseek_v3": "DeepseekV3Config",
    "kimi_k2": "DeepseekV3Config", "deepseek_v32": "DeepseekV3Config", "glm_moe_dsa": "GlmMoeDsaConfig",
    "glm4_moe": "Glm4MoeConfig", "mixtral": "MixtralConfig", "qwen3_next": "Qwen3NextConfig",
    "qwen3_5_moe": "Qwen3_5MoeConfig", "qwen3_5_moe_text": "Qwen3_5MoeTextConfig", "nemotron_h": "NemotronHConfig",
    "llama4": "Llama4Config", "llama4_text": "Llama4TextConfig", "qwen3_vl_moe": "Qwen3VLMoeConfig",
    "kimi_k25": "Kimi_K25Config",
}
_VLLM_REGISTRY = {"kimi_k2": f"{V}transformers_utils/config.py:141",
                  "deepseek_v32": f"{V}transformers_utils/config.py:133"}

# composite model_types: the language model is their `text_config` (vLLM's hf_text_config)
COMPOSITE = {name for name, c in CLASSES.items() if "text_config" in c.sub}


def root_class(cfg: Config) -> tuple[HFClass | None, str]:
    """The class vLLM builds this config.json through, or None and why it cannot be told."""
    mtype = cfg.data.get("model_type")
    if mtype is None:
        # build.read_config refuses such a file before this (`_no_model_type`); this is for any other caller
        return None, ("config.json has no `model_type`, without which transformers' AutoConfig cannot pick the config "
                      f"class ({TF} models/auto/configuration_auto.py:442-445)")
    name = ROOT.get(mtype) if isinstance(mtype, str) else None
    if name is None:
        return None, f"the importer has no record of the config class for model_type {mtype!r}"
    return CLASSES[name], ""


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "None"
    return str(value)


def given(cfg: Config, key: str) -> tuple[Any, str]:
    """`key` of `cfg` and its source: the config's own value ("config.json `text_config.x`"), else what the
    transformers class vLLM loads it through makes of its absence or null (`Rule`), else a refusal naming the
    field and why. May return `HIDDEN_PER_HEAD` for the caller to divide."""
    name = cfg.name(key)
    if cfg.data.get(key) is not None:
        return cfg.data[key], f"config.json `{name}`"
    null = key in cfg.data
    state = "null" if null else "not given"
    c: HFClass | None = cfg.hf
    if c is None:
        raise cfg.error(key, f"`{name}` is {state}: vLLM 0.33.0 loads config.json through the transformers config "
                        f"class of its model_type, whose default then applies, but {cfg.hf_why}; give `{name}` in "
                        "config.json")
    rule = c.rules.get(key)
    if rule is None:
        raise cfg.error(key, f"`{name}` is {state}, and the importer has no record of what {TF} {c.name} "
                        f"({c.file}) and vLLM 0.33.0 make of that; give `{name}` in config.json")
    what = rule.null if null else rule.absent
    if what is STRICT:
        keep = (f"; leave the key out ({c.name} then gives {_show(rule.absent)})"
                if not isinstance(rule.absent, Refuse) and rule.absent is not HIDDEN_PER_HEAD else "")
        raise cfg.error(key, f"`{name}` is null, but {TF} {c.name} types `{key}` without None and refuses it "
                        f"(huggingface_hub @strict; {c.file}): vLLM 0.33.0 cannot load this config.json{keep}")
    if isinstance(what, Refuse):
        raise cfg.error(key, f"`{name}` is {state}: {what.why}")
    shown = "hidden_size // num_attention_heads" if what is HIDDEN_PER_HEAD else _show(what)
    template = (rule.null_how or "{cls} accepts None ({file})") if null else (rule.how or "{cls} default {value} "
                                                                               "({file})")
    mtype = cfg.data.get("model_type")
    file = c.file + (f"; vLLM registers {mtype} to it, {_VLLM_REGISTRY[mtype]}" if mtype in _VLLM_REGISTRY else "")
    how = template.format(cls=f"{TF} {c.name}", file=file, value=shown)
    if "{value}" not in template and shown not in how:
        how += f": {shown}"
    value = list(what) if isinstance(what, list) else what        # a copy: the rule's list is shared
    return value, (f"`{name}` null in config.json: {how}" if null else f"no `{name}` in config.json: {how}")


def phrase(value: Any, src: str) -> str:
    """A rule's words for one input: "config.json `x` 3" for a given value, the default's own source else."""
    return f"{src} {_show(value)}" if src.startswith("config.json") else src


def mtype_of(cfg: Config) -> str | None:
    value = cfg.data.get("model_type")
    return value if isinstance(value, str) else None


def check_root_pairing(cfg: Config, arch: str, text_at_root: bool) -> None:
    """A composite model_type (its language model under `text_config`) with an architecture the importer reads at
    the root, or a text model_type with one it reads under `text_config`: vLLM would read other fields than the
    importer (the text_config transformers fills with defaults, or the root), so the import is refused."""
    c = cfg.hf
    if c is None:
        return
    composite = c.name in COMPOSITE
    if composite and text_at_root:
        raise cfg.error("model_type", f"model_type {mtype_of(cfg)!r} makes {TF} build {c.name}, whose language model "
                        f"is `text_config` ({c.sub['text_config']} defaults for whatever it lacks) — vLLM 0.33.0's "
                        f"{arch} reads that, not the root fields this config carries; give the text model_type")
    if not composite and not text_at_root:
        raise cfg.error("model_type", f"model_type {mtype_of(cfg)!r} makes {TF} build {c.name}, which has no "
                        f"`text_config` sub-config: vLLM 0.33.0's {arch} would read the root fields, not text_config")
