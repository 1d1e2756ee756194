"""Which routed experts a quantization config leaves unquantized, decided the way vLLM 0.33 decides it.

A quantization config names modules to keep in the model dtype: ModelOpt's `ignore` /
`exclude_modules` (wildcards), FP8's `ignored_layers` / `modules_to_not_convert` (module names),
compressed-tensors' `ignore` (module names and `re:` patterns). vLLM matches them against the names
of its own modules — the routed experts of a decoder layer are one FusedMoE module, named by the
prefix the model gives `FusedMoEFactory` (`model.layers.N.mlp.experts` for most models;
vLLM 0.33.0 vllm/model_executor/layers/fused_moe/layer.py:233, fused_moe/routed_experts.py:165-169)
— after rewriting the list with the model class's `hf_to_vllm_mapper`, renames only
(model_executor/models/utils.py:180-199; applied by model_loader/utils.py:367-387 or, for a
`SupportsQuant` model, models/interfaces.py:1292-1297). A matched FusedMoE module is built
unquantized (fused_moe/routed_experts.py:227-242). The importer reads one expert format for every
MoE layer, so an entry vLLM would match against any layer's routed experts is refused, naming it;
this module finds that entry. `NAMING` holds, per architecture the importer reads, the expert
prefix, the renames and the checkpoint projection names vLLM 0.33 uses.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

V = "vLLM 0.33.0 vllm/"
M = f"{V}model_executor/models/"
MODELOPT_RULE = (f"{V}model_executor/layers/quantization/modelopt.py:191-226 is_layer_excluded, :266-285 "
                 "apply_vllm_mapper; utils/quant_utils.py:684-688")
FP8_RULE = (f"{V}model_executor/layers/quantization/fp8.py:153-156, :191-198; "
            "utils/quant_utils.py:684-688 (exact mode: an entry holding the experts' prefix)")
CT_RULE = (f"{V}model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/"
           "compressed_tensors_moe.py:36-58 (expert 0's projections), compressed_tensors.py:129-157, :1011-1015; "
           "utils/config_utils.py:384-420, :432-452 (equal, or `re:` by re.match)")


@dataclass(frozen=True)
class Renames:
    """A model's `hf_to_vllm_mapper` as `get_rename_mapper` keeps it (stacked and `None` entries dropped), applied in
    `_map_name_with_shard`'s order: substrings (first occurrence), prefixes, suffixes (models/utils.py:89-145)."""

    substr: tuple[tuple[str, str], ...] = ()
    prefix: tuple[tuple[str, str], ...] = ()
    suffix: tuple[tuple[str, str], ...] = ()

    def map(self, name: str) -> str:
        for old, new in self.substr:
            if old in name:
                name = name.replace(old, new, 1)
        for old, new in self.prefix:
            if name.startswith(old):
                name = name.replace(old, new, 1)
        for old, new in self.suffix:
            if name.endswith(old):
                name = new.join(name.rsplit(old, 1))
        return name


@dataclass(frozen=True)
class Naming:
    """How vLLM 0.33 names one architecture's routed experts for its quantization config."""

    experts: str                         # FusedMoE prefix; {layer} is the decoder layer
    renames: Renames | None              # None: the model class has no hf_to_vllm_mapper, nothing is rewritten
    projections: tuple[str, str, str]    # expert 0's (gate, up, down) as compressed-tensors looks them up
    source: str


_GATE_UP_DOWN = ("gate_proj", "up_proj", "down_proj")
_NONE = Renames()    # a mapper whose only entries are stacked or None: it renames nothing, but ModelOpt still splits
_QWEN3_VL = Renames(prefix=(("model.visual.", "visual."), ("lm_head.", "language_model.lm_head."),
                            ("model.language_model.", "language_model.model.")))
_GPT_OSS = Renames(substr=((".self_attn.", ".attn."),), suffix=(
    (".embed_tokens.weight", ".embedding.weight"), (".gate_up_proj_blocks", ".w13_weight"),
    (".down_proj_blocks", ".w2_weight"), (".gate_up_proj_scales", ".w13_weight_scale"),
    (".down_proj_scales", ".w2_weight_scale"), (".gate_up_proj", ".w13_weight"), (".down_proj", ".w2_weight"),
    (".gate_up_proj_bias", ".w13_bias"), (".down_proj_bias", ".w2_bias"), (".gate_up_proj.weight", ".w13_weight"),
    (".gate_up_proj.weight_scale", ".w13_weight_scale"), (".gate_up_proj.bias", ".w13_bias"),
    (".gate_up_proj.input_scale", ".w13_input_scale"), (".down_proj.weight", ".w2_weight"),
    (".down_proj.weight_scale", ".w2_weight_scale"), (".down_proj.bias", ".w2_bias"),
    (".down_proj.input_scale", ".w2_input_scale")))

NAMING: dict[str, Naming] = {
    "GptOssForCausalLM": Naming("model.layers.{layer}.mlp.experts", _GPT_OSS, _GATE_UP_DOWN,
                                f"{M}gpt_oss.py:390-397, :447, :1375-1403"),
    "Qwen3MoeForCausalLM": Naming("model.layers.{layer}.mlp.experts", _NONE, _GATE_UP_DOWN,
                                  f"{M}qwen3_moe.py:203-212, :393-395, :436-448, :543-552 (SupportsQuant)"),
    "DeepseekV3ForCausalLM": Naming("model.layers.{layer}.mlp.experts", None, _GATE_UP_DOWN,
                                    f"{M}deepseek_v2.py:374-386, :1330-1334, :1872-1884 (no hf_to_vllm_mapper)"),
    "DeepseekV32ForCausalLM": Naming("model.layers.{layer}.mlp.experts", None, _GATE_UP_DOWN,
                                     f"{V}models/deepseek_v32/nvidia/model.py:98-103, :432; {M}deepseek_v2.py:374-386"),
    "GlmMoeDsaForCausalLM": Naming("model.layers.{layer}.mlp.experts", None, _GATE_UP_DOWN,
                                   f"{V}models/deepseek_v32/__init__.py:21; nvidia/model.py:98-103"),
    "Glm4MoeForCausalLM": Naming("model.layers.{layer}.mlp.experts", None, _GATE_UP_DOWN,
                                 f"{M}glm4_moe.py:183-194, :357-360, :534 (the mapper is Glm4MoeModel's, not the "
                                 "model class's)"),
    "MixtralForCausalLM": Naming("model.layers.{layer}.block_sparse_moe.experts",
                                 Renames(substr=((".gate_proj.", ".w1."), (".up_proj.", ".w3."),
                                                 (".down_proj.", ".w2."))), ("w1", "w3", "w2"),
                                 f"{M}mixtral.py:118-131, :246-252, :285-298, :378"),
    "Qwen3NextForCausalLM": Naming("model.layers.{layer}.mlp.experts", _NONE, _GATE_UP_DOWN,
                                   f"{M}qwen3_next.py:223-234, :521-523, :823"),
    "Qwen3_5MoeForCausalLM": Naming("model.layers.{layer}.mlp.experts",
                                    Renames(prefix=(("model.language_model.", "model."),)), _GATE_UP_DOWN,
                                    f"{M}qwen3_5.py:173-175, :327-329, :343; qwen3_next.py:223-234"),
    "Qwen3_5MoeForConditionalGeneration": Naming("language_model.model.layers.{layer}.mlp.experts", _QWEN3_VL,
                                                 _GATE_UP_DOWN, f"{M}qwen3_5.py:476-479, :745-747; "
                                                 "qwen3_vl.py:1969-1975"),
    "NemotronHForCausalLM": Naming("model.layers.{layer}.mixer.experts",
                                   Renames(substr=(("A_log", "A"), ("embeddings", "embed_tokens")),
                                           prefix=(("backbone", "model"),)), ("up_proj", "None", "down_proj"),
                                   f"{M}nemotron_h.py:229-241 (ckpt_names up_proj, down_proj, None), :352-356, "
                                   ":734-742"),
    "Llama4ForCausalLM": Naming("model.layers.{layer}.feed_forward.experts", _NONE, _GATE_UP_DOWN,
                                f"{M}llama4.py:132-142, :345-347, :708; llama.py:348-358, :464-473 (SupportsQuant)"),
    "Llama4ForConditionalGeneration": Naming("language_model.model.layers.{layer}.feed_forward.experts", _NONE,
                                             _GATE_UP_DOWN, f"{M}mllama4.py:728, :779-785 (its language model is "
                                             "llama4.py Llama4ForCausalLM, a SupportsQuant: llama.py:464-473)"),
    "Qwen3VLMoeForConditionalGeneration": Naming("language_model.model.layers.{layer}.mlp.experts", _QWEN3_VL,
                                                 _GATE_UP_DOWN, f"{M}qwen3_vl_moe.py:230, :284-290; "
                                                 "qwen3_vl.py:1969-1975"),
    "KimiK25ForConditionalGeneration": Naming(
        "language_model.model.layers.{layer}.mlp.experts",
        Renames(prefix=(("language_model.layers.", "language_model.model.layers."),
                        ("mm_projector.proj.0", "mm_projector.linear_1"),
                        ("mm_projector.proj.2", "mm_projector.linear_2"))), _GATE_UP_DOWN,
        f"{M}kimi_k25.py:291-320 (SupportsQuant), :376-381; deepseek_v2.py:374-386"),
}


@dataclass(frozen=True)
class ExpertModules:
    """The routed-expert modules of one model as vLLM names them: its architecture and MoE decoder layers."""

    arch: str
    layers: tuple[int, ...]

    @property
    def naming(self) -> Naming:
        return NAMING[self.arch]

    def prefixes(self) -> list[tuple[int, str]]:
        return [(i, self.naming.experts.format(layer=i)) for i in self.layers]


@dataclass(frozen=True)
class Hit:
    """An entry of the list that leaves routed experts unquantized."""

    index: int              # position in the config's list
    as_matched: str         # the entry as vLLM holds it when it matches (split / renamed)
    layer: int              # the first MoE layer it leaves unquantized
    module: str             # that layer's routed-expert module, as vLLM names it
    layers: int             # how many MoE layers some entry leaves unquantized


def modelopt_hit(entries: Sequence[str], experts: ExpertModules) -> Hit | None:
    """ModelOpt: `path*` (not `.*`) becomes `path` and `path.*`, then the model's renames, when the model class has a
    mapper (modelopt.py:266-285); then is_layer_excluded (:191-226): exact-mode is_layer_skipped, which for a prefix
    holding `experts` asks whether an entry holding `experts` contains it (utils/quant_utils.py:684-688); any entry
    contained in the prefix (also with `language_model.` taken off it); fnmatch (posix: case-sensitive, as
    fnmatchcase)."""
    renames = experts.naming.renames
    held: list[tuple[str, int]] = []
    for i, entry in enumerate(entries):
        if renames is None:
            held.append((entry, i))
            continue
        split = [entry[:-1], entry[:-1] + ".*"] if len(entry) >= 2 and entry[-1] == "*" and entry[-2] != "." \
            else [entry]
        held += [(renames.map(x), i) for x in split]

    def excludes(prefix: str) -> tuple[str, int] | None:
        for pattern, i in held:
            if "experts" in pattern and prefix in pattern:
                return pattern, i
        short = prefix.removeprefix("language_model.") if prefix.startswith("language_model.") else None
        for pattern, i in held:
            if pattern != prefix and (pattern in prefix or (short is not None and pattern in short)):
                return pattern, i
        for pattern, i in held:
            if fnmatchcase(prefix, pattern):
                return pattern, i
        return None

    return _first(experts, excludes)


def fp8_hit(entries: Sequence[str], experts: ExpertModules) -> Hit | None:
    """FP8: the list renamed whole by the model's mapper (fp8.py:153-156); a FusedMoE module is skipped when an entry
    holding `experts` contains its prefix (is_layer_skipped, exact mode, utils/quant_utils.py:684-688)."""
    renames = experts.naming.renames
    held = [(renames.map(e) if renames is not None else e, i) for i, e in enumerate(entries)]

    def skips(prefix: str) -> tuple[str, int] | None:
        return next(((e, i) for e, i in held if "experts" in e and prefix in e), None)

    return _first(experts, skips)


def ct_split(patterns: Sequence[str], experts: ExpertModules) -> tuple[Hit | None, Hit | None]:
    """Compressed-tensors: vLLM looks up expert 0's gate, up and down projections (`{prefix}.0.{name}`) in `ignore`,
    whose layer paths (a `.`, no `re:`) the model's mapper renamed; an entry is equal or, after `re:`, re.match'es
    (config_utils.py:432-452). All three ignored: the layer's experts are unquantized (first of the pair); some but
    not all: vLLM refuses the layer (compressed_tensors_moe.py:50-55; second of the pair)."""
    renames = experts.naming.renames
    held = [((renames.map(p) if renames is not None and "." in p and not p.startswith("re:") else p), i)
            for i, p in enumerate(patterns)]

    def ignored(name: str) -> tuple[str, int] | None:
        for pattern, i in held:
            if pattern.startswith("re:"):
                if re.match(pattern[3:], name):
                    return pattern, i
            elif pattern == name:
                return pattern, i
        return None

    def all_three(prefix: str) -> tuple[str, int] | None:
        found = [ignored(f"{prefix}.0.{p}") for p in experts.naming.projections]
        return found[0] if all(found) else None

    def some(prefix: str) -> tuple[str, int] | None:
        found = [ignored(f"{prefix}.0.{p}") for p in experts.naming.projections]
        return next((f for f in found if f), None) if any(found) and not all(found) else None

    return _first(experts, all_three), _first(experts, some)


def _first(experts: ExpertModules, match) -> Hit | None:
    hits = [(layer, prefix, found) for layer, prefix in experts.prefixes() if (found := match(prefix)) is not None]
    if not hits:
        return None
    layer, prefix, (pattern, index) = hits[0]
    return Hit(index, pattern, layer, prefix, len(hits))
