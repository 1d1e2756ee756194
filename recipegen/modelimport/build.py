"""`config.json` (+ optional safetensors index) -> a model document whose every figure is sourced.

The document is what `recipegen model import` writes (`recipes/models/<name>.yaml`) and what the
catalog ships (`recipegen/catalog/models/<name>.yaml`): a `Model` with `{value, source}` figures,
validated by the schema before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expert_residency.contract.expert_formats import GPTOSS_SWIGLU_ALPHA, GPTOSS_SWIGLU_SOURCE

from recipegen.common.errors import InputError
from recipegen.modelimport.config import Config
from recipegen.modelimport.dense import dense_bytes
from recipegen.modelimport.geometry import (
    GPT_OSS_BIAS_SOURCE,
    MOE_INTER_FIELDS,
    ROUTED_FIELDS,
    TOP_K_FIELDS,
    attention_groups,
    expert_format,
    index_ranges,
    moe_layer_indices,
    sourced,
)
from recipegen.modelimport.safetensors import IndexFacts, is_routed_expert, layer_of, read_index
from recipegen.schema.model import AttentionLayers, ExpertTensor, kv_bytes_per_token

INDEX_NAME = "model.safetensors.index.json"
KV_DTYPE_SOURCE = "vLLM --kv-cache-dtype auto: the model's activation dtype (bf16)"


@dataclass(frozen=True)
class ImportInput:
    config: Path
    index: Path | None


def locate(path: Path) -> ImportInput:
    """A config.json, or a folder with config.json (and model.safetensors.index.json if present)."""
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise InputError("no config.json in this folder", file=str(path))
        index = path / INDEX_NAME
        return ImportInput(config, index if index.is_file() else None)
    if not path.is_file():
        raise InputError("no such file or folder", file=str(path))
    index = path.parent / INDEX_NAME
    return ImportInput(path, index if index.is_file() else None)


def describe(inp: ImportInput, *, name: str, checkpoint: str | None = None) -> dict[str, Any]:
    """The model document (plain data, YAML-ready) for `inp`."""
    cfg = Config.read(inp.config)
    arch_list = cfg.need("architectures", kind=list)
    arch = str(arch_list[0])
    layers = cfg.need("num_hidden_layers")
    routed_field = cfg.field(*ROUTED_FIELDS)
    routed = cfg.need(*ROUTED_FIELDS, what="routed experts per MoE layer (is this a MoE model?)")
    top_k_field = cfg.field(*TOP_K_FIELDS)
    top_k = cfg.need(*TOP_K_FIELDS)
    hidden = cfg.need("hidden_size")
    inter_fields = MOE_INTER_FIELDS if cfg.get("moe_intermediate_size") else ("intermediate_size",)
    inter = cfg.need(*inter_fields, what="the routed experts' intermediate width")
    inter_src = f"config.json `{inter_fields[0]}`"
    moe, moe_rule = moe_layer_indices(cfg, layers)
    if not moe:
        raise InputError("no MoE layer: every layer is dense by the config's layer rule", file=cfg.file,
                         field="first_k_dense_replace")
    fmt = expert_format(cfg)
    act = cfg.get("hidden_act", default="silu")
    if act != "silu":
        raise InputError(f"expert activation {act!r}: the importer reads SwiGLU (silu) experts", file=cfg.file,
                         field="hidden_act")

    shape_src = f"{inter_src} {inter} (gate + up) × config.json `hidden_size` {hidden}; {fmt.source}"
    tensors: list[dict[str, Any]] = [
        {"name": "w13", "shape": [2 * inter, hidden], "dtype": fmt.dtype},
        {"name": "w2", "shape": [hidden, inter], "dtype": fmt.dtype}]
    if fmt.scale is not None:
        for t in tensors:
            t["scale"] = dict(fmt.scale)
    biases = arch == "GptOssForCausalLM"
    bias_src = GPT_OSS_BIAS_SOURCE
    facts: IndexFacts | None = read_index(inp.index, layers) if inp.index else None
    if facts is not None and facts.expert_bias_names:
        biases, bias_src = True, f"{INDEX_NAME}: {facts.expert_bias_names[0]}"
    if biases:
        tensors += [{"name": "w13_bias", "shape": [2 * inter], "dtype": "bf16", "kind": "bias"},
                    {"name": "w2_bias", "shape": [hidden], "dtype": "bf16", "kind": "bias"}]
        shape_src += f"; bf16 biases per expert ({bias_src})"

    doc: dict[str, Any] = {"name": name, "description": f"{checkpoint or name} ({arch}), imported from its config.json"
                           + (" and safetensors index" if inp.index else "")}
    doc["architecture"] = arch
    if checkpoint:
        doc["checkpoint"] = checkpoint
    doc["decoder_layers"] = sourced(layers, "config.json `num_hidden_layers`"
                                    + (f" (MTP layers excluded: `num_nextn_predict_layers` "
                                       f"{cfg.get('num_nextn_predict_layers')})"
                                       if cfg.get("num_nextn_predict_layers") else ""))
    doc["moe_layers"] = sourced(index_ranges(moe), moe_rule)
    doc["routed_experts"] = sourced(routed, f"config.json `{routed_field}`")
    doc["top_k"] = sourced(top_k, f"config.json `{top_k_field}`")
    if cfg.has("n_shared_experts"):
        doc["shared_experts"] = sourced(cfg.get("n_shared_experts") or 0, "config.json `n_shared_experts`")
    elif cfg.get("shared_expert_intermediate_size"):
        doc["shared_experts"] = sourced(1, "config.json `shared_expert_intermediate_size` "
                                        f"{cfg.get('shared_expert_intermediate_size')} (one shared expert)")
    else:
        doc["shared_experts"] = sourced(0, "no n_shared_experts / shared_expert_intermediate_size in config.json")
    doc["hidden_size"] = sourced(hidden, "config.json `hidden_size`")
    doc["moe_intermediate_size"] = sourced(inter, inter_src)
    doc["expert_tensors"] = sourced(tensors, shape_src)
    if cfg.get("max_position_embeddings"):
        doc["max_position_embeddings"] = sourced(*_context_length(cfg))
    if arch == "GptOssForCausalLM":
        limit = cfg.need("swiglu_limit", kind=(int, float))
        doc["activation"] = sourced({"kind": "swigluoai", "alpha": GPTOSS_SWIGLU_ALPHA, "limit": float(limit)},
                                    f"{GPTOSS_SWIGLU_SOURCE}; config.json `swiglu_limit`; vLLM 0.33.0 "
                                    "vllm/model_executor/models/gpt_oss.py:400 (activation swigluoai)")
    else:
        doc["activation"] = sourced({"kind": "silu"}, "config.json `hidden_act` silu")
    dense = dense_bytes(cfg, fmt, moe, layers)
    if facts is not None and facts.exact_dense_bytes is not None:
        geometry = len(moe) * routed * int(_expert_bytes(tensors))
        check = ("the routed experts' bytes in the headers match the geometry" if facts.exact_expert_bytes == geometry
                 else f"the headers hold {facts.exact_expert_bytes:,} B of routed experts, the geometry "
                      f"{geometry:,} B: the expert tensors above may not match the checkpoint's format")
        doc["dense_bytes"] = sourced(f"{facts.exact_dense_bytes} B",
                                     f"{INDEX_NAME} + {facts.shards_read} shard header(s): every tensor not "
                                     f"under `.experts.` in decoder layers < num_hidden_layers; {check}")
    elif facts is not None and facts.total_size is not None:
        expert_bytes = int(_expert_bytes(tensors))
        mtp_moe = [lay for lay in facts.mtp_layers
                   if any(layer_of(n) == lay and is_routed_expert(n) for n in facts.names)]
        n_moe = len(moe) + len(mtp_moe)
        rest = facts.total_size - n_moe * routed * expert_bytes
        if rest <= 0:
            raise InputError(f"metadata.total_size {facts.total_size:,} B is smaller than the routed experts "
                             f"the config implies ({n_moe * routed * expert_bytes:,} B): wrong index for this "
                             "config?", file=str(inp.index), field="metadata.total_size")
        doc["dense_bytes"] = sourced(f"{rest} B", f"{INDEX_NAME} `metadata.total_size` − {n_moe} MoE layers × "
                                     f"{routed} routed experts × {expert_bytes:,} B"
                                     + (f" (includes the non-expert tensors of MTP layers {facts.mtp_layers})"
                                        if facts.mtp_layers else ""))
    else:
        doc["dense_bytes"] = sourced(f"{dense.total} B", "derived from config.json geometry: " + dense.summary()
                                     + (" (FP8 linear layers with fp32 block scales)" if fmt.dense_fp8_block else ""))
    tp_parts: dict[str, Any] = {"replicated": f"{dense.replicated} B"}
    if dense.kv_projections:
        tp_parts.update(kv_projections=f"{dense.kv_projections} B", kv_heads=dense.kv_heads)
    declared_dense = int(str(doc["dense_bytes"]["value"]).split()[0])
    if dense.replicated + dense.kv_projections <= declared_dense:   # else the geometry is not this checkpoint's
        doc["dense_tensor_parallel"] = sourced(
                tp_parts, "derived from config.json geometry as vLLM 0.33 builds the layers: replicated = norms, "
            "routers (GateLinear is a ReplicatedLinear), MLA q_a/kv_a projections and norms (disable_tp), "
            "row-parallel biases; kv_projections = GQA k/v projections (max(1, kv_heads // tp) heads per rank); "
            "the rest of dense_bytes is split over the ranks")
    layer_bytes: dict[str, Any] = {"moe_layer": f"{dense.moe_layer} B"}
    if dense.dense_layer:
        layer_bytes["dense_layer"] = f"{dense.dense_layer} B"
    doc["decoder_layer_bytes"] = sourced(layer_bytes, "derived from config.json geometry: one MoE decoder layer's "
                                         "attention + norms + router + shared experts; one dense layer's attention "
                                         "+ norms + MLP (what vLLM's --cpu-offload-gb walk meets per layer)")
    if facts is not None and facts.total_size is not None:
        doc["total_bytes"] = sourced(f"{facts.total_size} B", f"{INDEX_NAME} `metadata.total_size`"
                                     + (f" (includes MTP layers {facts.mtp_layers})" if facts.mtp_layers else ""))
    kv_dtype = "bf16"
    groups = attention_groups(cfg, layers, kv_dtype)
    doc["attention"] = groups
    per_token = _kv_bytes_per_token(groups)
    doc["kv_bytes_per_token"] = sourced(f"{per_token} B", "Σ attention layers × bytes per token per layer at one "
                                        "rank, bf16 (" + _kv_terms(groups) + "); sliding layers counted uncapped "
                                        "here, the ledger caps them at their window per sequence")
    return doc


# RoPE types whose max_position_embeddings is already the scaled length (vLLM does not multiply).
_PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def _context_length(cfg: Config) -> tuple[int, str]:
    """The longest max_model_len vLLM 0.33 accepts, as `_get_and_verify_max_len` derives it
    (vllm/config/model.py:2599-2634: × rope_scaling.factor except for YaRN-style types that are
    pre-scaled; :2657-2684: a larger `model_max_length` in config.json also allows it)."""
    length = cfg.need("max_position_embeddings")
    src = "config.json `max_position_embeddings`"
    rope = cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type") or rope.get("type") if isinstance(rope, dict) else None
    factor = rope.get("factor") if isinstance(rope, dict) else None
    if factor and rope_type not in _PRESCALED_ROPE and rope_type != "default":
        length = int(length * float(factor))
        src += f" × `rope_scaling.factor` {factor} ({rope_type}; vllm/config/model.py:2599-2634)"
    elif factor:
        src += f" (rope_scaling {rope_type}: already the scaled length, vllm/config/model.py:2610-2612)"
    extra = cfg.get("model_max_length")
    if isinstance(extra, int) and extra > length:
        length, src = extra, "config.json `model_max_length` (vllm/config/model.py:2657-2684)"
    return length, src


def _expert_bytes(tensors: list[dict[str, Any]]) -> float:
    return float(sum(ExpertTensor.model_validate(t).num_bytes() for t in tensors))


def _plain(v: Any) -> Any:
    return v["value"] if isinstance(v, dict) and set(v) == {"value", "source"} else v


def _kv_bytes_per_token(groups: list[dict[str, Any]]) -> int:
    return kv_bytes_per_token(AttentionLayers.model_validate({k: _plain(v) for k, v in g.items()})
                              for g in groups)


def _kv_terms(groups: list[dict[str, Any]]) -> str:
    out = []
    for g in groups:
        group = AttentionLayers.model_validate({k: _plain(v) for k, v in g.items()})
        if group.kind == "mla":
            out.append(f"{len(group.layers)} MLA × ({group.kv_lora_rank} + {group.rope_head_dim}) × 2 B")
        else:
            out.append(f"{len(group.layers)} {group.kind} × 2 × {group.kv_heads} × {group.head_dim} × 2 B")
    return " + ".join(out)
