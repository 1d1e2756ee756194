"""The checkpoint's storage format, from `quantization_config` (config.json or its `text_config`)
or, where config.json has none, ModelOpt's `hf_quant_config.json` beside it — the order vLLM
0.33 reads them in (vllm/transformers_utils/config.py:951-964; model_executor/model_loader/
weight_utils.py:240-245 for the text config). Gives the routed experts' tensors, the dense
linear layers' format and the KV cache dtype `--kv-cache-dtype auto` resolves to.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from recipegen.common.errors import InputError
from recipegen.modelimport.config import Config, Field
from recipegen.modelimport.inventory import DenseFormat
from recipegen.modelimport.jsondoc import JsonDoc, load_json, present
from recipegen.modelimport.quantmatch import (
    CT_RULE,
    FP8_RULE,
    MODELOPT_RULE,
    ExpertModules,
    Hit,
    ct_split,
    fp8_hit,
    modelopt_hit,
)

V = "vLLM 0.33.0 vllm/"
HF_QUANT = "hf_quant_config.json"
MAX_QUANT_BYTES = 4 * 2**20
# Quantization sidecars other loaders read: the importer does not, so a checkpoint carrying one is
# refused rather than imported as if it were not there.
UNREAD_SIDECARS = ("quantize_config.json", "quant_config.json", "quantization_config.json")
NVFP4_GROUP = 16


@dataclass(frozen=True)
class Format:
    """The routed experts' storage and what follows from it."""

    dtype: str                                   # ExpertTensor dtype
    scale: dict[str, Any] | None                 # ExpertTensor scale layout, or None
    source: str
    dense: DenseFormat = field(default_factory=DenseFormat)
    kv_dtype: str = "bf16"
    kv_source: str = "vLLM --kv-cache-dtype auto: the model's dtype (bf16)"
    scalars: tuple[tuple[str, int], ...] = ()    # per-expert fp32 scalars (NVFP4 global / input scales)
    extra: tuple[dict[str, Any], ...] = ()       # further per-expert tensors vLLM allocates
    inert: str = ""                              # quantization keys known to change no size, with why
    narrowed: str = ""                           # why vLLM loads the stored tensors at fewer bytes (float32 -> bf16)


def expert_format(cfg: Config, text: Config, folder: Path, *, gated: bool = True,
                  experts: ExpertModules) -> Format:
    """`experts`: the model's routed-expert modules as vLLM names them, matched against the config's lists of
    modules left unquantized (`quantmatch`)."""
    for sidecar in UNREAD_SIDECARS:
        if present(folder / sidecar, sidecar):
            raise InputError(f"{sidecar} beside config.json: a quantization file the importer does not read "
                             "(it reads config.json `quantization_config` and ModelOpt's hf_quant_config.json)",
                             file=str(folder / sidecar))
    owner = cfg if cfg.has("quantization_config") else text if text.has("quantization_config") else None
    if owner is not None:
        q = owner.section("quantization_config")
        fmt = _from_quantization_config(q, gated, experts)
        if present(folder / HF_QUANT, HF_QUANT):  # vLLM reads config.json's first and never opens the file
            fmt = replace(fmt, source=fmt.source + f"; {HF_QUANT} beside it is not read: config.json has a "
                          f"quantization_config ({V}transformers_utils/config.py:951-964)")
        return fmt
    if present(folder / HF_QUANT, HF_QUANT):
        doc = load_json(folder / HF_QUANT, limit=MAX_QUANT_BYTES, what=HF_QUANT)
        if not isinstance(doc.data, dict):
            raise InputError(f"{HF_QUANT} must be a JSON object (ModelOpt's `producer` and `quantization`)",
                             file=doc.file, line=1)
        return _modelopt(doc, (), gated, HF_QUANT, experts)
    return _plain(text, cfg)


def _plain(text: Config, root: Config) -> Format:
    field_ = text.field("torch_dtype", "dtype") or root.field("torch_dtype", "dtype")
    dtype = text.get("torch_dtype", "dtype") or root.get("torch_dtype", "dtype") or "bfloat16"
    # The rendered lane runs vLLM's --dtype auto, which loads a float32 checkpoint in the platform's first dtype:
    # 2 bytes per value, not the 4 the config names.
    name = {"bfloat16": "bf16", "float16": "fp16", "float32": "bf16"}[dtype]
    src = f"config.json `{field_}` {dtype}" if field_ else "no quantization_config: bf16"
    narrowed = ""
    if dtype == "float32":
        narrowed = (f"vLLM's --dtype auto loads a float32 model as bf16 (fp16 below compute capability 8.0, 2 B "
                    f"either way; {V}config/model.py:2440-2442, {V}platforms/cuda.py:257-263)")
        src += f"; loaded as bf16: {narrowed}"
    kv = {"bf16": "bf16", "fp16": "fp16"}[name]
    return Format(name, None, src, DenseFormat(name), kv, f"vLLM --kv-cache-dtype auto: the model's dtype ({kv})",
                  narrowed=narrowed)


def _from_quantization_config(q: Config, gated: bool, experts: ExpertModules) -> Format:
    method = q.get("quant_method")
    if method == "mxfp4":
        # vLLM 0.33 model_executor/layers/quantization/mxfp4.py Mxfp4Config.from_config returns cls(): it reads no
        # key, and get_quant_method builds every linear layer unquantized (mxfp4.py:91-113), listed or not.
        inert = _keys(q, {"quant_method"}, {"modules_to_not_convert": "vLLM's Mxfp4Config.from_config reads no key "
                                             f"and builds every linear layer unquantized ({V}model_executor/layers/"
                                             "quantization/mxfp4.py:67-68, :91-105)"}, "mxfp4")
        return Format("mxfp4", None, f"config.json `{q.name('quant_method')}` mxfp4 (e2m1 values, one ue8m0 scale "
                      "per 32)" + inert, inert=inert)
    if method == "fp8":
        return _fp8(q, experts)
    if method == "compressed-tensors":
        return _compressed_int4(q, experts)
    if method in ("modelopt", "modelopt_fp4"):
        return _modelopt(q.doc, q.base, gated, f"config.json `{q.name('quant_method')}` {method}", experts)
    raise q.error("quant_method", f"quant_method {method!r} is not one the importer reads (mxfp4, fp8, "
                  "compressed-tensors int4, modelopt NVFP4)")


def _keys(q: Config, read: set[str], inert: dict[str, str], method: str) -> str:
    """Refuse any key of `q` neither read nor known to change no size; the source note for the inert ones given."""
    for key in q.data:
        if key not in read and key not in inert:
            raise q.error(key, f"not a {method} quantization_config key the importer reads (it reads "
                          f"{', '.join(sorted(read))}; known to change no size: {', '.join(sorted(inert)) or 'none'}): "
                          "it may change the stored format or the sizes")
    given = [k for k in inert if k in q.data]
    return "".join(f"; `{q.name(k)}` changes no size: {inert[k]}" for k in given)


def _names(q: Config, key: str, what: str, null: str | None) -> list[str]:
    """A list of module names read as vLLM reads it: absent is empty; a present key is a list of strings. `null`:
    None where vLLM reads null as absent, else why it does not. `{}`, `false`, `0` or `""` are not an empty list: a
    list read as `q.get(key) or []` would take them for "nothing excluded"."""
    if key not in q.data:
        return []
    value = q.data[key]
    if value is None and null is None:
        return []
    if not isinstance(value, list):
        raise q.error(key, f"must be a list of {what}, got {_json(value)}" + (f": {null}" if value is None else ""))
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise q.doc.error(f"must be a list of {what}; entry {i} is {_json(item)}", q.base + (key, i))
    return value


def _json(value: Any) -> str:
    """`value` as the file spells it (`{}`, `false`, `null`), shortened."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _experts_unquantized(q: Config, key: str, entries: list[str], hit: Hit, experts: ExpertModules, rule: str,
                         what: str = "routed experts left unquantized in some layers") -> InputError:
    """The refusal naming the entry (and its line) that vLLM matches against some layer's routed experts."""
    entry = entries[hit.index]
    held = f" (held by vLLM as `{hit.as_matched}`)" if hit.as_matched != entry else ""
    total = len(experts.layers)
    return InputError(f"{what}: entry {hit.index} `{entry}`{held} matches `{hit.module}`, the routed experts of "
                      f"decoder layer {hit.layer}, as vLLM 0.33 matches it ({rule}; the names: "
                      f"{experts.naming.source}); entries match {hit.layers} of the {total} MoE layers: the "
                      "importer reads one expert format for every MoE layer",
                      file=q.file, line=q.doc.line(q.base + (key, hit.index)), field=q.name(key))


def _int(q: Config, key: str, meaning: str, lo: int = 1, hi: int = 1 << 16) -> Any:
    """An integer setting, read as config.json's integer fields are (`Config.typed`): 16.0 or true is refused."""
    return q.typed(key, Field("int", meaning, lo, hi))


FP8 = f"{V}model_executor/layers/quantization/fp8.py"


def _fp8(q: Config, experts: ExpertModules) -> Format:
    """vLLM 0.33 model_executor/layers/quantization/fp8.py Fp8Config.from_config (:158-175) and __init__ (:95-134)."""
    inert = _keys(q, {"quant_method", "activation_scheme", "weight_block_size", "modules_to_not_convert",
                      "ignored_layers"},
                  {"fmt": f"vLLM's Fp8Config.from_config does not read it ({FP8}:158-175); weights are 1-byte e4m3",
                   "scale_fmt": "ue8m0 only sets VLLM_USE_DEEP_GEMM_E8M0 (vLLM 0.33.0 vllm/transformers_utils/config.py:"
                                "966-970); the block scales are still allocated fp32 (fp8.py:329-337, :620-633) and "
                                "DeepGEMM rounds them to powers of two in place (utils/fp8_utils.py:1096-1110, "
                                "1208-1214); the figures are that fp32 allocation"}, "fp8")
    src_m = f"config.json `{q.name('quant_method')}` fp8"
    scheme = q.get("activation_scheme")
    if scheme is None:
        raise q.error("activation_scheme", f"missing: vLLM's Fp8Config.from_config requires it ({FP8}:161)")
    if scheme != "dynamic":
        raise q.error("activation_scheme", f"{scheme!r}: vLLM 0.33 refuses block-wise FP8 with a non-dynamic activation "
                      f"scheme and the importer reads only block-wise FP8 with dynamic activations ({FP8}:114-132)")
    block = q.get("weight_block_size")
    if block is None:
        raise q.error("quant_method", "fp8 without `weight_block_size` (per-tensor weight scales, every linear layer "
                      f"FP8 with per-shard fp32 scales, {FP8}:315-323): not read by the importer, which sizes "
                      "block-wise FP8 only")
    q.typed("weight_block_size", Field("int_list", "FP8 weight block [rows, columns]", 1, 1 << 16, max_len=2))
    if block != [128, 128]:
        raise q.error("weight_block_size", f"expected [128, 128] (the block vLLM's FP8 MoE allocates scales "
                      f"for), got {block!r}")
    if q.get("store_dtype") is not None:
        raise q.error("store_dtype", "store_dtype changes the experts' format (fp8.py:199-203): not read")
    # fp8.py:162-168: `ignored_layers`, else (absent, null or empty) `modules_to_not_convert`; null is absent
    # (get_from_keys_or, then `or []` at :117); matched exactly (ignored_layers_match_mode "exact",
    # utils/quant_utils.py is_layer_skipped).
    ignored = _names(q, "ignored_layers", "module names", None)
    not_converted = _names(q, "modules_to_not_convert", "module names", None)
    key, skipped = ("ignored_layers", ignored) if ignored else ("modules_to_not_convert", not_converted)
    hit = fp8_hit(skipped, experts)
    if hit is not None:
        raise _experts_unquantized(q, key, skipped, hit, experts, FP8_RULE + "; UnquantizedFusedMoEMethod")
    kept = (f"; `{q.name(key)}` ({len(skipped)} modules) stay in the model dtype, matched exactly as vLLM does "
            f"({FP8}:162-168, :180-187; utils/quant_utils.py is_layer_skipped)") if skipped else ""
    return Format("fp8", {"dtype": "fp32", "block": [128, 128]},
                  f"{src_m} {q.get('fmt', 'e4m3')}, `weight_block_size` [128, 128] (one fp32 scale per block), "
                  f"activation_scheme dynamic{kept}{inert}",
                  DenseFormat("fp8_block", excluded=tuple(skipped), exact=True), inert=inert)


CT = "compressed-tensors"


def _compressed_int4(q: Config, experts: ExpertModules) -> Format:
    inert = _keys(q, {"quant_method", "config_groups", "ignore", "format", "kv_cache_scheme", "sparsity_config",
                      "transform_config"},
                  {"quantization_status": "the state the compressor left the weights in, not their layout",
                   "global_compression_ratio": "a statistic the compressor writes; vLLM does not read it "
                                               f"({V}model_executor/layers/quantization/compressed_tensors/"
                                               "compressed_tensors.py:250-270)"}, CT)
    fmt_ = q.get("format")
    if fmt_ not in (None, "pack-quantized"):
        raise q.error("format", f"{fmt_!r}: the importer reads pack-quantized int4 (8 values per int32)")
    for key in ("kv_cache_scheme", "sparsity_config", "transform_config"):
        if q.get(key) is not None:
            raise q.error(key, f"a {key} changes the cache or the stored weights: not read (the importer reads null)")
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        raise q.error("config_groups", "one int4 group is what the importer reads")
    (gname, group), = groups.items()
    if not isinstance(group, dict):
        raise q.error("config_groups", f"group {gname!r}: expected an object")
    g = q.section("config_groups").section(gname)
    for key in group:
        if key not in ("weights", "targets", "input_activations", "output_activations"):
            raise g.error(key, f"not a {CT} group key the importer reads (weights, targets, input_activations, "
                          "output_activations)")
    for key in ("input_activations", "output_activations"):
        if group.get(key) is not None:
            raise g.error(key, "activation quantization (not weight-only int4): not read")
    if group.get("targets") not in (None, ["Linear"]):
        raise g.error("targets", f"{group.get('targets')!r}: the importer reads ['Linear']")
    weights = group.get("weights")
    weights = {} if weights is None else weights
    if not isinstance(weights, dict):
        raise g.error("weights", "expected an object")
    w = g.section("weights") if weights else g
    for key in weights:
        if key not in ("num_bits", "type", "group_size", "strategy", "symmetric", "actorder", "block_structure",
                       "dynamic", "observer", "observer_kwargs"):
            raise w.error(key, f"not a {CT} weights key the importer reads")
    if weights:
        _int(w, "num_bits", "bits per weight", 1, 64)
        _int(w, "group_size", "weights per scale", 1, 1 << 20)
    size = weights.get("group_size")
    if not (weights.get("num_bits") == 4 and weights.get("type") == "int" and isinstance(size, int)
            and not isinstance(size, bool) and 1 <= size <= 4096 and weights.get("strategy", "group") == "group"):
        raise q.error("config_groups", f"group {gname!r}: the importer reads int4 weights with a group_size "
                      "(num_bits 4, type int, strategy group)")
    if weights.get("actorder") not in (None, False):
        raise q.error("config_groups", f"group {gname!r}: actorder reorders groups (a g_idx per weight): not read")
    if weights.get("symmetric", True) is not True:
        raise w.error("symmetric", "asymmetric int4 stores a zero point per group: not read")
    if weights.get("block_structure") is not None or weights.get("dynamic", False) is not False:
        raise w.error("block_structure" if weights.get("block_structure") is not None else "dynamic",
                      "not static group-wise weights: not read")
    # compressed_tensors.py:254 reads `ignore` as a list (default []); null reaches list(None) in
    # should_ignore_layer (utils/config_utils.py:395) and fails.
    ignore = _names(q, "ignore", "module names / `re:` patterns", f"vLLM 0.33 reads it as a list and fails on null "
                    f"({V}model_executor/layers/quantization/compressed_tensors/compressed_tensors.py:254)")
    for i, pattern in enumerate(ignore):
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as exc:
                raise q.doc.error(f"`{pattern}` is not a regular expression ({exc})", q.base + ("ignore", i)) from None
    every, some = ct_split(ignore, experts)
    if every is not None:
        raise _experts_unquantized(q, "ignore", ignore, every, experts, CT_RULE + "; UnquantizedFusedMoEMethod")
    if some is not None:
        raise _experts_unquantized(q, "ignore", ignore, some, experts, CT_RULE,
                                   "some but not all of a layer's expert projections ignored (vLLM 0.33 refuses "
                                   "the layer: \"All MoE projections need to have same quantization scheme\")")
    src = (f"config.json `{q.name('config_groups')}.{gname}.weights` int4, group_size {size} (one bf16 scale per "
           f"group; vLLM's WNA16 MoE also allocates w13/w2 `weight_shape` [2] in the model dtype, "
           f"{V}model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/"
           "compressed_tensors_moe_wna16.py:345-355); weights' observer / observer_kwargs are calibration settings"
           + inert)
    return Format("int4", {"dtype": "bf16", "block": [size]}, src,
                  DenseFormat("int4", group=size, excluded=tuple(ignore), regex=True),
                  extra=({"name": "w13_weight_shape", "shape": [2], "dtype": "bf16", "kind": "scale"},
                         {"name": "w2_weight_shape", "shape": [2], "dtype": "bf16", "kind": "scale"}), inert=inert)


MODELOPT = f"{V}model_executor/layers/quantization/modelopt.py"
_NESTED_KEYS = {"quant_algo", "kv_cache_quant_algo", "group_size", "exclude_modules", "kv_cache_scheme"}
_FLAT_KEYS = {"quant_method", "quant_algo", "kv_cache_scheme", "kv_cache_quant_algo", "ignore", "exclude_modules",
              "group_size", "config_groups"}
_PRODUCER = {"producer": "ModelOpt's name and version stamp (vLLM reads it only to recognise a ModelOpt config, "
                         f"{V}transformers_utils/model_arch_config_convertor.py:249-266)"}


def _modelopt(doc: JsonDoc, base: tuple, gated: bool, where: str, experts: ExpertModules) -> Format:
    """ModelOpt NVFP4 as vLLM 0.33 reads it: modelopt.py ModelOptQuantConfigBase.from_config (:324-410) for the
    weights — `quantization.{quant_algo, kv_cache_quant_algo, group_size, exclude_modules}` in the nested
    (hf_quant_config.json) form, `quant_algo`, `ignore` (else `exclude_modules`), `group_size`, `kv_cache_scheme`
    in the flat config.json form — and utils/torch_utils.py get_kv_cache_quant_algo_string (:443-495) for the
    cache dtype `--kv-cache-dtype auto` resolves to. Experts as ModelOptNvFp4FusedMoE.create_weights allocates
    them (:909-1026)."""
    root = Config(doc, base)
    nested = "quantization" in root.data
    if nested:
        inert = _keys(root, {"quantization", "quant_method"}, _PRODUCER, "ModelOpt")
        q = root.section("quantization")
        _keys(q, _NESTED_KEYS, {}, "ModelOpt `quantization`")
    else:
        inert = _keys(root, _FLAT_KEYS, _PRODUCER, "ModelOpt")
        q = root
    def field_err(name: str, message: str) -> InputError:
        return q.error(name, message)
    algo = q.data.get("quant_algo")
    if not isinstance(algo, str) or algo.upper() != "NVFP4":
        raise field_err("quant_algo", f"ModelOpt quant_algo {algo!r}: the importer reads NVFP4")
    if nested:
        missing = [k for k in ("group_size", "kv_cache_quant_algo", "exclude_modules") if k not in q.data]
        if missing:
            raise field_err(missing[0], f"missing: vLLM 0.33 requires group_size, kv_cache_quant_algo and "
                            f"exclude_modules in a nested NVFP4 config ({MODELOPT}:815-827)")
    group = _int(q, "group_size", "values per NVFP4 scale")
    group = NVFP4_GROUP if group is None else group
    if group != NVFP4_GROUP:
        raise field_err("group_size", f"group_size {group!r}: NVFP4 scales one e4m3 per {NVFP4_GROUP} values")
    if not nested:
        _nvfp4_groups(root)
    # modelopt.py:341-342 (nested: exclude_modules) and :359 (flat: `ignore`, else `exclude_modules`).
    # vLLM takes the key as given, null included, and refuses anything but a list (:379-382).
    ex_key = "ignore" if (not nested and "ignore" in q.data) else "exclude_modules"
    not_list = f"vLLM 0.33 refuses an exclude list that is not a list ({MODELOPT}:379-382)"
    excluded = _names(q, ex_key, "module names / wildcards", not_list)
    if ex_key == "ignore":   # `exclude_modules` beside `ignore` is not read, but must be what it says it is
        _names(q, "exclude_modules", "module names / wildcards", None)
    hit = modelopt_hit(excluded, experts)
    if hit is not None:
        raise _experts_unquantized(q, ex_key, excluded, hit, experts, MODELOPT_RULE + "; a FusedMoE module "
                                   "excluded gets no quant method and is built unquantized (modelopt.py:236-239; "
                                   "fused_moe/routed_experts.py:237-240)")
    kv, kv_src = _modelopt_kv(root, q, where)
    shards = 2 if gated else 1
    ex_src = (f"; `{q.name(ex_key)}` ({len(excluded)} patterns) stay in the model dtype ({MODELOPT}:191-226, "
              f":341-359)") if excluded else ""
    src = (f"{where} `{q.name('quant_algo')}` NVFP4, group_size 16: e2m1 values packed 2 per byte, one e4m3 scale per 16, "
           f"per expert fp32 w13_weight_scale_2 / w13_input_scale [{shards}] and w2 [1] each "
           f"({MODELOPT}:909-1026){ex_src}{inert}")
    return Format("nvfp4", None, src, DenseFormat("nvfp4", group=NVFP4_GROUP, excluded=tuple(excluded)), kv, kv_src,
                  scalars=(("w13_global_scales", 2 * shards), ("w2_global_scales", 2)), inert=inert)


def _nvfp4_groups(root: Config) -> None:
    """The flat form's `config_groups`: vLLM reads them only to route weight-only checkpoints (every group's
    input_activations null) to W4A16_NVFP4 (modelopt.py:801-811); the importer reads W4A4 NVFP4 groups."""
    groups = root.data.get("config_groups")
    if groups is None:
        return
    if not isinstance(groups, dict) or not groups:
        raise root.error("config_groups", "expected an object of quantization groups")
    for name, group in groups.items():
        g = root.section("config_groups").section(name)
        for key in group:
            if key not in ("weights", "input_activations", "targets"):
                raise g.error(key, "not a ModelOpt group key the importer reads (weights, input_activations, targets)")
        for key in ("weights", "input_activations"):
            spec = group.get(key)
            if isinstance(spec, dict):
                _int(g.section(key), "num_bits", "bits per value", 1, 64)
                _int(g.section(key), "group_size", "values per scale")
            if spec is None:
                raise g.error(key, f"null: {'a weight-only (W4A16_NVFP4) checkpoint, ' if key == 'input_activations' else ''}"
                              "not read by the importer (it reads NVFP4 weights and activations)")
            if not (isinstance(spec, dict) and spec.get("num_bits") == 4 and spec.get("type") == "float"
                    and spec.get("group_size", NVFP4_GROUP) == NVFP4_GROUP
                    and set(spec) <= {"num_bits", "type", "group_size", "dynamic"}):
                raise g.error(key, f"{spec!r}: the importer reads NVFP4 groups (num_bits 4, type float, group_size 16)")


def _modelopt_kv(root: Config, q: Config, where: str) -> tuple[str, str]:
    """The cache dtype --kv-cache-dtype auto resolves to: get_kv_cache_quant_algo_string (vLLM 0.33.0 vllm/
    utils/torch_utils.py:443-495) takes the first truthy of quantization.kv_cache_scheme, kv_cache_scheme,
    quantization.kv_cache_quant_algo, kv_cache_quant_algo; a dict {dynamic false, num_bits 8, type float} or the
    string fp8 is fp8 (e4m3)."""
    cite = f"{V}utils/torch_utils.py:443-517, engine/arg_utils.py:2297"
    for cfg, key in ((q, "kv_cache_scheme"), (root, "kv_cache_scheme"), (q, "kv_cache_quant_algo"),
                     (root, "kv_cache_quant_algo")):
        value = cfg.data.get(key)
        if value is not None and not isinstance(value, (dict, str)):
            raise cfg.error(key, f"{_json(value)}: expected {'an object' if key == 'kv_cache_scheme' else 'a string'} "
                            "or null")
        if not value:   # vLLM takes the first truthy of the four (utils/torch_utils.py:455-460)
            continue
        if isinstance(value, dict):
            _int(cfg.section(key), "num_bits", "KV cache bits", 1, 64)
            if value.get("dynamic") is False and value.get("num_bits") == 8 and value.get("type") == "float":
                return "fp8", (f"{where} `{cfg.name(key)}` {{dynamic false, num_bits 8, type float}}: --kv-cache-dtype "
                               f"auto resolves to fp8 ({cite})")
            raise cfg.error(key, f"{value!r}: the importer reads {{dynamic: false, num_bits: 8, type: float}} (FP8); "
                            "vLLM 0.33 maps num_bits 4 to an NVFP4 cache and anything else to the model dtype with a "
                            "warning (utils/torch_utils.py:462-479)")
        if isinstance(value, str) and value.lower() == "fp8":
            return "fp8", (f"{where} `{cfg.name(key)}` {value}: --kv-cache-dtype auto resolves to fp8 ({cite})")
        raise cfg.error(key, f"{value!r}: the importer reads FP8 or none")
    return "bf16", f"{where}: no kv_cache_scheme / kv_cache_quant_algo, --kv-cache-dtype auto is the model's dtype (bf16)"
