"""The checkpoint's storage format, from `quantization_config` (config.json or its `text_config`)
or, where config.json has none, ModelOpt's `hf_quant_config.json` beside it — the order vLLM
0.33 reads them in (vllm/transformers_utils/config.py:951-964; model_executor/model_loader/
weight_utils.py:240-245 for the text config). Gives the routed experts' tensors, the dense
linear layers' format and the KV cache dtype `--kv-cache-dtype auto` resolves to.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from recipegen.common.errors import InputError
from recipegen.modelimport.config import Config
from recipegen.modelimport.inventory import DenseFormat
from recipegen.modelimport.jsondoc import JsonDoc, load_json

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


def expert_format(cfg: Config, text: Config, folder: Path, *, gated: bool = True) -> Format:
    for sidecar in UNREAD_SIDECARS:
        if (folder / sidecar).exists():
            raise InputError(f"{sidecar} beside config.json: a quantization file the importer does not read "
                             "(it reads config.json `quantization_config` and ModelOpt's hf_quant_config.json)",
                             file=str(folder / sidecar))
    owner = cfg if cfg.has("quantization_config") else text if text.has("quantization_config") else None
    if owner is not None:
        q = owner.section("quantization_config")
        fmt = _from_quantization_config(q, gated)
        if (folder / HF_QUANT).exists():  # vLLM reads config.json's first and never opens the file
            fmt = replace(fmt, source=fmt.source + f"; {HF_QUANT} beside it is not read: config.json has a "
                          f"quantization_config ({V}transformers_utils/config.py:951-964)")
        return fmt
    if (folder / HF_QUANT).exists():
        doc = load_json(folder / HF_QUANT, limit=MAX_QUANT_BYTES, what=HF_QUANT)
        return _modelopt(doc, ("quantization",), gated, f"{HF_QUANT} `quantization`")
    return _plain(text, cfg)


def _plain(text: Config, root: Config) -> Format:
    field_ = text.field("torch_dtype", "dtype") or root.field("torch_dtype", "dtype")
    dtype = text.get("torch_dtype", "dtype") or root.get("torch_dtype", "dtype") or "bfloat16"
    name = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[dtype]
    src = f"config.json `{field_}` {dtype}" if field_ else "no quantization_config: bf16"
    kv = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}[name]
    return Format(name, None, src, DenseFormat(name), kv, f"vLLM --kv-cache-dtype auto: the model's dtype ({kv})")


def _from_quantization_config(q: Config, gated: bool) -> Format:
    method = q.get("quant_method")
    if method == "mxfp4":
        return Format("mxfp4", None, f"config.json `{q.name('quant_method')}` mxfp4 (e2m1 values, one ue8m0 scale "
                      "per 32)")
    if method == "fp8":
        block = q.get("weight_block_size")
        if block is None:
            return Format("fp8", None, f"config.json `{q.name('quant_method')}` fp8 (per-tensor scale)")
        if not (isinstance(block, list) and block == [128, 128]):
            raise q.error("weight_block_size", f"expected [128, 128] (the block vLLM's FP8 MoE allocates scales "
                          f"for), got {block!r}")
        return Format("fp8", {"dtype": "fp32", "block": [128, 128]},
                      f"config.json `{q.name('quant_method')}` fp8 {q.get('fmt', 'e4m3')}, `weight_block_size` "
                      "[128, 128] (one fp32 scale per block)", DenseFormat("fp8_block"))
    if method == "compressed-tensors":
        return _compressed_int4(q)
    if method in ("modelopt", "modelopt_fp4"):
        return _modelopt(q.doc, q.base, gated, f"config.json `{q.name('quant_method')}` {method}")
    raise q.error("quant_method", f"quant_method {method!r} is not one the importer reads (mxfp4, fp8, "
                  "compressed-tensors int4, modelopt NVFP4)")


def _compressed_int4(q: Config) -> Format:
    groups = q.get("config_groups") or {}
    if not isinstance(groups, dict) or len(groups) != 1:
        raise q.error("config_groups", "one int4 group is what the importer reads")
    (gname, group), = groups.items()
    weights = (group or {}).get("weights") or {} if isinstance(group, dict) else {}
    size = weights.get("group_size")
    if not (weights.get("num_bits") == 4 and weights.get("type") == "int" and isinstance(size, int)
            and not isinstance(size, bool) and 1 <= size <= 4096 and weights.get("strategy", "group") == "group"):
        raise q.error("config_groups", f"group {gname!r}: the importer reads int4 weights with a group_size "
                      "(num_bits 4, type int, strategy group)")
    if weights.get("actorder") not in (None, False):
        raise q.error("config_groups", f"group {gname!r}: actorder reorders groups (a g_idx per weight): not read")
    ignore = q.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(x, str) for x in ignore):
        raise q.error("ignore", "expected a list of module names / re: patterns")
    src = (f"config.json `{q.name('config_groups')}.{gname}.weights` int4, group_size {size} (one bf16 scale per "
           f"group; vLLM's WNA16 MoE also allocates w13/w2 `weight_shape` [2] in the model dtype, "
           f"{V}model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/"
           "compressed_tensors_moe_wna16.py:345-355)")
    return Format("int4", {"dtype": "bf16", "block": [size]}, src,
                  DenseFormat("int4", group=size, excluded=tuple(ignore), regex=True),
                  extra=({"name": "w13_weight_shape", "shape": [2], "dtype": "bf16", "kind": "scale"},
                         {"name": "w2_weight_shape", "shape": [2], "dtype": "bf16", "kind": "scale"}))


def _modelopt(doc: JsonDoc, base: tuple, gated: bool, where: str) -> Format:
    """ModelOpt NVFP4 (vllm/model_executor/layers/quantization/modelopt.py:729-839): experts as
    `ModelOptNvFp4FusedMoE.create_weights` allocates them (:909-1026)."""
    node: Any = doc.data
    for part in base:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        raise doc.error("expected an object with quant_algo", base)
    def field_err(name: str, message: str) -> InputError:
        return doc.error(message, base + (name,))
    algo = node.get("quant_algo")
    if not isinstance(algo, str) or algo.upper() != "NVFP4":
        raise field_err("quant_algo", f"ModelOpt quant_algo {algo!r}: the importer reads NVFP4")
    group = node.get("group_size", NVFP4_GROUP)
    if group != NVFP4_GROUP or isinstance(group, bool):
        raise field_err("group_size", f"group_size {group!r}: NVFP4 scales one e4m3 per {NVFP4_GROUP} values")
    excluded = node.get("exclude_modules") or []
    if not isinstance(excluded, list) or not all(isinstance(x, str) for x in excluded):
        raise field_err("exclude_modules", "expected a list of module names / wildcards")
    if any(".experts" in x and "shared_expert" not in x for x in excluded):
        raise field_err("exclude_modules", "routed experts left unquantized in some layers: the importer reads "
                        "one expert format for every MoE layer")
    kv_algo = node.get("kv_cache_quant_algo")
    if kv_algo is None:
        kv, kv_src = "bf16", f"{where}: no kv_cache_quant_algo, --kv-cache-dtype auto is the model's dtype (bf16)"
    elif isinstance(kv_algo, str) and kv_algo.upper() == "FP8":
        kv = "fp8"
        kv_src = (f"{where} `kv_cache_quant_algo` FP8: --kv-cache-dtype auto resolves to fp8 "
                  f"({V}utils/torch_utils.py:443-517, engine/arg_utils.py:2297)")
    else:
        raise field_err("kv_cache_quant_algo", f"{kv_algo!r}: the importer reads FP8 or none")
    shards = 2 if gated else 1
    src = (f"{where} `quant_algo` NVFP4, group_size 16: e2m1 values packed 2 per byte, one e4m3 scale per 16, "
           f"per expert fp32 w13_weight_scale_2 / w13_input_scale [{shards}] and w2 [1] each "
           f"({V}model_executor/layers/quantization/modelopt.py:909-1026)")
    return Format("nvfp4", None, src, DenseFormat("nvfp4", group=NVFP4_GROUP, excluded=tuple(excluded)), kv, kv_src,
                  scalars=(("w13_global_scales", 2 * shards), ("w2_global_scales", 2)))
