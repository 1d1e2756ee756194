"""`config.json` (+ optional safetensors index) -> a model document whose every figure is sourced.

The document is what `recipegen model import` writes (`recipes/models/<name>.yaml`) and what the
catalog ships (`recipegen/catalog/models/<name>.yaml`): a `Model` with `{value, source}` figures,
validated by the schema before anything is written. The architecture picks the family
(`families.FAMILIES`); the config is checked field by field against it before any arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipegen.common.errors import InputError
from recipegen.modelimport import hftypes
from recipegen.modelimport.config import Config
from recipegen.modelimport.families import Built, Family, family_of, index_ranges, sourced
from recipegen.modelimport.formats import Format, expert_format
from recipegen.modelimport.hfdefaults import COMPOSITE, ROOT, TF, check_root_pairing, given, root_class
from recipegen.modelimport.inventory import DenseParts, dense_parts, exclusion_note
from recipegen.modelimport.jsondoc import present
from recipegen.modelimport.quantmatch import ExpertModules
from recipegen.modelimport.safetensors import INDEX_NAME, IndexFacts, is_routed_expert, mtp_layer_of, read_index
from recipegen.schema.model import AttentionLayers, ExpertTensor, StateLayers, kv_bytes_per_token

_PART_ORDER = ("embeddings", "lm_head", "norms", "attention", "indexer", "linear_attention", "mamba", "routers",
               "shared_experts", "dense_mlp", "encoder")


@dataclass(frozen=True)
class ImportInput:
    config: Path
    index: Path | None


def locate(path: Path) -> ImportInput:
    """A config.json, or a folder with config.json (and model.safetensors.index.json if present)."""
    if path.is_dir():
        config = path / "config.json"
        if not present(config, "config.json"):
            raise InputError("no config.json in this folder", file=str(path))
        index = path / INDEX_NAME
        return ImportInput(config, index if present(index, INDEX_NAME) else None)
    if not present(path, "the path given"):
        raise InputError("no such file or folder", file=str(path))
    index = path.parent / INDEX_NAME
    return ImportInput(path, index if present(index, INDEX_NAME) else None)


def read_config(path: Path) -> tuple[Config, Built, str]:
    """The config checked against its family, and the family's build of it."""
    cfg = Config.read(path)
    fam, arch = family_of(cfg)
    text_at_root = not (fam.text_config and arch.endswith("ForConditionalGeneration"))
    # keys a multimodal wrapper carries at its root that size nothing (image preprocessing): not text_config's
    cfg.check_fields(set(fam.reads), set(fam.ignored) | (set() if text_at_root else set(fam.root_ignored)), arch)
    mtype = cfg.get("model_type")
    if mtype is None:
        raise _no_model_type(cfg, fam, arch, text_at_root)
    if mtype not in fam.model_types:
        raise cfg.error("model_type", f"model_type {mtype!r} with architecture {arch!r}: vLLM reads that architecture "
                        f"for model_type {', '.join(fam.model_types)}")
    cfg.hf, cfg.hf_why = root_class(cfg)
    check_root_pairing(cfg, arch, text_at_root)
    hftypes.check(cfg)
    if not text_at_root:
        if not cfg.has("text_config"):
            raise cfg.error("text_config", f"{arch} keeps the language model under `text_config`; it is missing")
        text = cfg.section("text_config")
        text.check_fields(set(fam.reads), set(fam.ignored), arch)
        hftypes.check(text)
        if cfg.has("vision_config"):
            vision = cfg.section("vision_config")
            vision.check_fields(set(fam.vision_reads) | {"model_type"}, set(fam.vision_ignored),
                                f"{arch} vision_config")
            hftypes.check(vision)
    return cfg, fam.build(cfg, arch), arch


def _no_model_type(cfg: Config, fam: Family, arch: str, text_at_root: bool) -> InputError:
    """A config.json without `model_type` (or with a null one): vLLM 0.33.0 builds the file through transformers'
    AutoConfig (vllm/transformers_utils/config.py:361-369 takes `model_type` from the file and maps an architecture
    to one only for LongcatFlash; :445 AutoConfig.from_pretrained). Without one, AutoConfig loads the file only
    through remote code, where `auto_map` names an AutoConfig class and the code is trusted (vLLM's
    --trust-remote-code; transformers 5.20.2 models/auto/configuration_auto.py:398, :413-418), and refuses it
    otherwise (:442-445). The importer reads no remote code, so it refuses both: where `auto_map` names an
    AutoConfig, saying that the file relies on remote code. Either way it names the model type to add."""
    # the model types of this architecture: a composite one (language model under text_config) for a wrapper
    fits = [t for t in fam.model_types if t in ROOT and (ROOT[t] in COMPOSITE) == (not text_at_root)]
    head = "`model_type` is null" if "model_type" in cfg.data else "config.json has no `model_type`"
    add = f"add the model type {arch} uses: {' or '.join(fits or fam.model_types)}"
    auto_map = cfg.data.get("auto_map")
    remote = auto_map.get("AutoConfig") if isinstance(auto_map, dict) else None
    if remote:
        return cfg.error("model_type", f"{head}, and `auto_map` names the AutoConfig class {remote!r}: the file relies "
                         "on remote code, which transformers' AutoConfig runs only when vLLM 0.33.0 is given "
                         f"--trust-remote-code ({TF} models/auto/configuration_auto.py:398, :413-418); the importer "
                         f"reads no remote code; {add}")
    return cfg.error("model_type", f"{head}: vLLM 0.33.0 loads config.json "
                     "through transformers' AutoConfig (vllm/transformers_utils/config.py:361-369, :445), which "
                     "cannot pick the config class without it and refuses the file (\"Unrecognized model … Should "
                     f"have a `model_type` key\", {TF} models/auto/configuration_auto.py:442-445); {add}")


def describe(inp: ImportInput, *, name: str, checkpoint: str | None = None) -> dict[str, Any]:
    """The model document (plain data, YAML-ready) for `inp`."""
    cfg, b, arch = read_config(inp.config)
    text = b.text
    fmt = expert_format(cfg, text, inp.config.parent, gated=b.gated, experts=ExpertModules(arch, tuple(b.moe)))
    layers, moe, routed, hidden, inter = b.layers, b.moe, b.routed, b.hidden, b.inter
    if not moe:
        # each family refuses its own all-dense rule naming the field (families._all_dense); this is the backstop
        raise InputError(f"no MoE layer: every layer is dense by {b.moe_rule}", file=cfg.file)
    rows = 2 * inter if b.gated else inter
    unit = {"mxfp4": 32, "nvfp4": 16, "int4": (fmt.scale or {}).get("block", [2])[0], "fp8": 1}.get(fmt.dtype, 1)
    for width, field_ in ((hidden, "hidden_size"), (inter, b.inter_src.split("`")[1].rsplit(".", 1)[-1])):
        if width % max(unit, 2 if fmt.dtype in ("mxfp4", "nvfp4", "int4") else 1):
            raise text.error(field_, f"{width} does not split into the {fmt.dtype} scale groups of {unit} (vLLM packs "
                             "and scales the experts in whole groups)")
    shape_src = (f"{b.inter_src} {inter}" + (" (gate + up)" if b.gated else " (up only: no gate)")
                 + f" × config.json `{text.name('hidden_size')}` {hidden}; {fmt.source}")
    w1 = "w13" if b.gated else "w1"
    tensors: list[dict[str, Any]] = [{"name": w1, "shape": [rows, hidden], "dtype": fmt.dtype},
                                     {"name": "w2", "shape": [hidden, inter], "dtype": fmt.dtype}]
    if fmt.scale is not None:
        for t in tensors:
            t["scale"] = dict(fmt.scale)
    for sname, count in fmt.scalars:
        tensors.append({"name": sname, "shape": [count], "dtype": "fp32", "kind": "scale"})
    tensors += [dict(x) for x in fmt.extra]
    facts: IndexFacts | None = read_index(inp.index, layers) if inp.index else None
    biases, bias_src = b.expert_biases, b.bias_src
    if facts is not None and facts.expert_bias_names:
        biases, bias_src = True, f"{INDEX_NAME}: {facts.expert_bias_names[0]}"
    if biases:
        tensors += [{"name": f"{w1}_bias", "shape": [rows], "dtype": "bf16", "kind": "bias"},
                    {"name": "w2_bias", "shape": [hidden], "dtype": "bf16", "kind": "bias"}]
        shape_src += f"; bf16 biases per expert ({bias_src})"
    expert_bytes = sum(int(ExpertTensor.model_validate(t).num_bytes()) for t in tensors)

    doc: dict[str, Any] = {"name": name, "description": f"{checkpoint or name} ({arch}), imported from its config.json"
                           + (" and safetensors index" if inp.index else "")}
    doc["architecture"] = arch
    if checkpoint:
        doc["checkpoint"] = checkpoint
    doc["decoder_layers"] = sourced(layers, b.layers_src)
    doc["moe_layers"] = sourced(index_ranges(moe), b.moe_rule)
    doc["routed_experts"] = sourced(routed, b.routed_src)
    doc["top_k"] = sourced(b.top_k, b.top_k_src)
    doc["shared_experts"] = sourced(b.shared, b.shared_src)
    doc["hidden_size"] = sourced(hidden, f"config.json `{text.name('hidden_size')}`")
    doc["moe_intermediate_size"] = sourced(inter, b.inter_src)
    doc["expert_tensors"] = sourced(tensors, shape_src)
    doc["max_position_embeddings"] = sourced(*_context_length(text))
    doc["activation"] = sourced(b.activation, b.activation_src)
    parts = dense_parts(b.tensors, fmt.dense)
    _dense(doc, facts, parts, fmt, b, expert_bytes, inp)
    doc["dense_bytes"]["source"] += exclusion_note(fmt.dense, b.tensors, b.layers) + fmt.inert
    # DeepSeek sparse attention with an fp8 cache: what vLLM 0.33 stores depends on the GPU's backend,
    # so the model file keeps plain fp8 and the ledger sizes it per machine (ledger.kv.lane_attention).
    ds_mla_note = ("; a sparse-MLA fp8 cache is counted here as plain fp8, (512 + 64) × 1 B: vLLM 0.33 turns a "
                   "checkpoint's FP8 KV scheme into fp8_e4m3 (utils/torch_utils.py:78-80), which FLASHINFER_MLA_SPARSE "
                   "on the SM100 family and FLASHINFER_MLA_SPARSE_SM90 on Hopper store as plain fp8 (platforms/"
                   "cuda.py:96-154); on SM120, or on Hopper given --kv-cache-dtype fp8, vLLM stores fp8_ds_mla, 656 B "
                   "per token per layer (512 fp8 + 4 fp32 scales + 64 bf16 RoPE; model_executor/layers/attention/"
                   "mla_attention.py:359-376), which the ledger and the estimate count per machine"
                   if fmt.kv_dtype == "fp8" and any(g.get("index_head_dim") for g in b.attention) else "")
    for g in b.attention:
        g["kv_dtype"] = fmt.kv_dtype
    doc["attention"] = b.attention
    if b.state:
        doc["state"] = b.state
    if b.cacheless:
        doc["cacheless_layers"] = sourced(index_ranges(b.cacheless), b.cacheless_src)
    groups = [AttentionLayers.model_validate(_plain(g)) for g in b.attention]
    per_token = kv_bytes_per_token(groups)
    doc["kv_bytes_per_token"] = sourced(f"{per_token} B", f"Σ attention layers × bytes per token per layer at one "
                                        f"rank, {fmt.kv_dtype} ({_kv_terms(groups)}; {fmt.kv_source}); sliding and "
                                        "chunked layers counted uncapped here, the ledger caps them per sequence" + ds_mla_note)
    if b.state:
        states = [StateLayers.model_validate(_plain(g)) for g in b.state]
        total = sum(len(s.layers) * s.bytes_per_sequence_per_layer(1) for s in states)
        doc["state_bytes_per_sequence"] = sourced(f"{total} B", "Σ state layers × (conv + recurrent state) at one "
                                                  "rank, before vLLM pads it to an attention page (" +
                                                  " + ".join(f"{len(s.layers)} {s.kind} × "
                                                             f"{s.bytes_per_sequence_per_layer(1):,} B"
                                                             for s in states) + ")")
    return doc


def _dense_from_geometry(parts: DenseParts, fmt: Format, note: str = "") -> dict[str, Any]:
    summary = ", ".join(f"{k} {parts.parts[k]:,}" for k in _PART_ORDER if k in parts.parts)
    return sourced(f"{parts.total} B", "derived from config.json geometry as vLLM 0.33 builds the layers: "
                   f"{summary}" + _format_note(fmt) + note)


def _dense(doc: dict[str, Any], facts: IndexFacts | None, parts: DenseParts, fmt: Format, b: Built,
           expert_bytes: int, inp: ImportInput) -> None:
    moe, routed = b.moe, b.routed
    if facts is not None and fmt.narrowed:   # the index sizes the stored tensors, wider than what vLLM loads
        doc["dense_bytes"] = _dense_from_geometry(parts, fmt, f"; {INDEX_NAME} not used: it sizes the stored float32 "
                                                  f"tensors, and {fmt.narrowed}")
    elif facts is not None and facts.exact_dense_bytes is not None:
        geometry = len(moe) * routed * expert_bytes
        check = ("the routed experts' bytes in the headers match the geometry" if facts.exact_expert_bytes == geometry
                 else f"the headers hold {facts.exact_expert_bytes:,} B of routed experts, the geometry "
                      f"{geometry:,} B: the expert tensors above may not match the checkpoint's format")
        doc["dense_bytes"] = sourced(f"{facts.exact_dense_bytes} B",
                                     f"{INDEX_NAME} + {facts.shards_read} shard header(s): every tensor not under "
                                     f"`.experts.` in decoder layers < the {b.layers} decoder layers; {check}")
    elif facts is not None and facts.total_size is not None:
        mtp_moe = [lay for lay in facts.mtp_layers
                   if any(mtp_layer_of(n, b.layers) == lay and is_routed_expert(n) for n in facts.names)]
        n_moe = len(moe) + len(mtp_moe)
        rest = facts.total_size - n_moe * routed * expert_bytes
        if rest <= 0:
            raise InputError(f"metadata.total_size {facts.total_size:,} B is smaller than the routed experts the "
                             f"config implies ({n_moe * routed * expert_bytes:,} B): wrong index for this config?",
                             file=str(inp.index), field="metadata.total_size")
        doc["dense_bytes"] = sourced(f"{rest} B", f"{INDEX_NAME} `metadata.total_size` − {n_moe} MoE layers × "
                                     f"{routed} routed experts × {expert_bytes:,} B"
                                     + (f" (includes the non-expert tensors of MTP layers {facts.mtp_layers})"
                                        if facts.mtp_layers else ""))
    else:
        doc["dense_bytes"] = _dense_from_geometry(parts, fmt)
    declared = int(str(doc["dense_bytes"]["value"]).split()[0])
    if parts.encoder:
        doc["encoder_bytes"] = sourced(f"{parts.encoder} B", f"of dense_bytes: {b.encoder_src}")
    if parts.replicated + parts.kv_projections <= declared:   # else the geometry is not this checkpoint's
        tp: dict[str, Any] = {"replicated": f"{parts.replicated} B"}
        kv_heads = next((g["kv_heads"]["value"] for g in b.attention if "kv_heads" in g), None)
        if parts.kv_projections and kv_heads:
            tp.update(kv_projections=f"{parts.kv_projections} B", kv_heads=kv_heads)
        doc["dense_tensor_parallel"] = sourced(
            tp, "derived from config.json geometry as vLLM 0.33 builds the layers: replicated = norms, routers "
            "(GateLinear is a ReplicatedLinear), MLA q_a/kv_a projections and norms (disable_tp), the sparse-attention "
            "indexer (ReplicatedLinear), row-parallel biases, replicated projectors; kv_projections = GQA k/v "
            "projections (max(1, kv_heads // tp) heads per rank); the rest of dense_bytes is split over the ranks")
    doc["decoder_layer_bytes"] = sourced(_layer_bytes(parts, b), "derived from config.json geometry: each decoder "
                                         "layer's non-routed tensors (attention or state mixer, norms, router, shared "
                                         "experts, a dense layer's MLP): what vLLM's --cpu-offload-gb walk meets per "
                                         "layer")
    if facts is not None and facts.total_size is not None:
        doc["total_bytes"] = sourced(f"{facts.total_size} B", f"{INDEX_NAME} `metadata.total_size`"
                                     + (f" (includes MTP layers {facts.mtp_layers})" if facts.mtp_layers else ""))


def _format_note(fmt: Format) -> str:
    return {"fp8_block": " (FP8 linear layers with fp32 128×128 block scales)",
            "nvfp4": " (NVFP4 linear layers outside exclude_modules: e2m1 + e4m3 per 16 + two fp32 scalars)",
            "int4": " (int4 linear layers outside `ignore`)"}.get(fmt.dense.kind, "")


def _layer_bytes(parts: DenseParts, b: Built) -> dict[str, Any]:
    moe = set(b.moe)
    per = [parts.per_layer.get(i, 0) for i in range(b.layers)]
    moe_sizes = {per[i] for i in moe}
    dense_sizes = {per[i] for i in range(b.layers) if i not in moe}
    out: dict[str, Any] = {"moe_layer": f"{per[b.moe[0]]} B"}
    if dense_sizes:
        out["dense_layer"] = f"{per[next(i for i in range(b.layers) if i not in moe)]} B"
    if len(moe_sizes) > 1 or len(dense_sizes) > 1:
        out["layers"] = [f"{n} B" for n in per]
    return out


# RoPE types whose max_position_embeddings is already the scaled length (vLLM does not multiply).
_PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def _context_length(cfg: Config) -> tuple[int, str]:
    """The longest max_model_len vLLM 0.33 accepts, as `_get_and_verify_max_len` derives it
    (vllm/config/model.py:2599-2634: × rope_scaling.factor except for YaRN-style types that are
    pre-scaled; :2657-2684: a larger `model_max_length` in config.json also allows it)."""
    # absent: the class default, as vLLM's AutoConfig builds it (hfdefaults); null: refused (typed without None)
    length, src = given(cfg, "max_position_embeddings")
    # transformers 5.20.2 reads both spellings into `rope_parameters`, `rope_scaling` first when both are given
    # (modeling_rope_utils.py:752-755, `rope_scaling or self.rope_parameters`); vLLM scales by that
    # (vllm/transformers_utils/config.py:690-699 iter_rope_parameters)
    key = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
    rope = cfg.get(key) or {}
    if isinstance(rope, dict) and rope and all(isinstance(v, dict) for v in rope.values()):
        raise cfg.error(key, f"`{cfg.name(key)}` nested per layer type: the importer reads one RoPE setting")
    rope_type = (rope.get("rope_type") or rope.get("type")) if isinstance(rope, dict) else None
    factor = rope.get("factor") if isinstance(rope, dict) else None
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                               or not 0 < factor <= 1024):
        raise cfg.error(key, f"{key}.factor {factor!r} is not a positive number up to 1024")
    if factor and rope_type not in _PRESCALED_ROPE and rope_type != "default":
        length = int(length * float(factor))
        src += f" × `{key}.factor` {factor} ({rope_type}; vllm/config/model.py:2599-2634)"
    elif factor:
        src += f" ({key} {rope_type}: already the scaled length, vllm/config/model.py:2610-2612)"
    extra = cfg.get("model_max_length")
    if isinstance(extra, int) and extra > length:
        length, src = extra, f"config.json `{cfg.name('model_max_length')}` (vllm/config/model.py:2657-2684)"
    return length, src


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        if set(v) == {"value", "source"}:
            return v["value"]
        return {k: _plain(x) for k, x in v.items()}
    return v


def _kv_terms(groups: list[AttentionLayers]) -> str:
    out = []
    for g in groups:
        if g.kind == "mla":
            term = f"{len(g.layers)} MLA × ({g.kv_lora_rank} + {g.rope_head_dim}) × dtype"
            if g.index_head_dim:
                term += f" + indexer {g.index_head_dim} + {g.index_head_dim // 128} × 4 B"
            out.append(term)
        else:
            out.append(f"{len(g.layers)} {g.kind} × 2 × {g.kv_heads} × {g.head_dim} × dtype")
    return " + ".join(out)
