"""The architectures `recipegen model import` understands, each with the config fields it reads.

`FAMILIES` is the table: a config whose `architectures[0]` is not in it is refused naming the
architecture; a config of a known architecture carrying a field its family does not read (and
that is not known to change nothing) is refused naming the field (`config.Config.check_fields`).
Each family builds the model the way vLLM 0.33.0 does — which decoder layers are MoE, what each
layer caches (attention per token, a fixed state per sequence), and every non-routed tensor
(`inventory.Tensor`) — citing the vLLM source lines it follows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from expert_residency.contract.expert_formats import GPTOSS_SWIGLU_ALPHA, GPTOSS_SWIGLU_SOURCE

from recipegen.common.errors import InputError
from recipegen.modelimport.config import Config
from recipegen.modelimport.hfdefaults import HIDDEN_PER_HEAD, TF, given, phrase
from recipegen.modelimport.inventory import Tensor

V = "vLLM 0.33.0 vllm/"


def sourced(value: Any, source: str) -> dict[str, Any]:
    return {"value": value, "source": source}


@dataclass
class Built:
    """What a family builder returns (plain data; `build.describe` writes the document)."""

    text: Config                                 # the language model's config (root or text_config)
    layers: int
    layers_src: str
    moe: list[int]
    moe_rule: str
    routed: int
    routed_src: str
    top_k: int
    top_k_src: str
    hidden: int
    inter: int
    inter_src: str
    shared: int
    shared_src: str
    gated: bool = True                           # w13 holds gate and up (2 × inter rows)
    activation: dict[str, Any] = field(default_factory=lambda: {"kind": "silu"})
    activation_src: str = "config.json `hidden_act` silu"
    expert_biases: bool = False
    bias_src: str = ""
    attention: list[dict[str, Any]] = field(default_factory=list)
    state: list[dict[str, Any]] = field(default_factory=list)
    cacheless: list[int] = field(default_factory=list)
    cacheless_src: str = ""
    tensors: list[Tensor] = field(default_factory=list)
    mtp_layers: int = 0
    mtp_src: str = ""
    encoder_src: str = ""
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    reads: frozenset[str]
    ignored: frozenset[str]
    build: Callable[[Config, str], Built]
    vllm: str                                    # where vLLM 0.33 builds it
    text_config: bool = False                    # the language model is under `text_config`
    vision_reads: frozenset[str] = frozenset()
    vision_ignored: frozenset[str] = frozenset()
    # keys accepted unread at the root of the multimodal architecture (…ForConditionalGeneration) only, never in
    # text_config: settings that size no tensor and that vLLM does not read from config.json (image preprocessing)
    root_ignored: frozenset[str] = frozenset()


def index_ranges(idx: list[int]) -> str | list[int]:
    """[3, 4, 5] -> "3-5" (the schema reads ranges); a non-contiguous list stays a list."""
    if idx and idx == list(range(idx[0], idx[-1] + 1)):
        return f"{idx[0]}-{idx[-1]}"
    return idx


# ----------------------------------------------------------------------------------------------
# building blocks (checkpoint names; shapes [out, in] as the checkpoint stores them)

def _w(name: str, shape: tuple[int, ...], klass: str, part: str, layer: int | None, **kw: Any) -> Tensor:
    return Tensor(name, shape, klass, part, layer, **kw)


def _norm(name: str, width: int, layer: int | None, *, bias: bool = False, klass: str = "param",
          part: str = "norms", replicated: bool = True, encoder: bool = False) -> list[Tensor]:
    out = [Tensor(f"{name}.weight", (width,), klass, part, layer, replicated=replicated, encoder=encoder)]
    if bias:
        out.append(Tensor(f"{name}.bias", (width,), klass, part, layer, replicated=replicated, encoder=encoder))
    return out


def _linear(name: str, out: int, inp: int, layer: int | None, part: str, *, bias: bool = False,
            klass: str = "linear", kv: bool = False, replicated: bool = False, row_bias: bool = False,
            encoder: bool = False, unquantized_for: tuple[str, ...] = ()) -> list[Tensor]:
    """A linear layer: weight [out, inp] (+ bias [out]). A row-parallel layer's bias is whole on every
    rank (`row_bias`); a column-parallel one's is split like its weight."""
    t = [Tensor(f"{name}.weight", (out, inp), klass, part, layer, kv_proj=kv, replicated=replicated,
                encoder=encoder, unquantized_for=unquantized_for)]
    if bias:
        t.append(Tensor(f"{name}.bias", (out,), "param", part, layer, kv_proj=kv,
                        replicated=replicated or row_bias, encoder=encoder))
    return t


def gqa(prefix: str, layer: int, h: int, heads: int, kv: int, hd: int, *, q_rows: int | None = None,
        bias: bool = False, o_bias: bool = False, qk_norm: bool = False, sinks: bool = False,
        names: tuple[str, str, str, str] = ("q_proj", "k_proj", "v_proj", "o_proj")) -> list[Tensor]:
    q, k, v, o = names
    t = _linear(f"{prefix}.{q}", q_rows or heads * hd, h, layer, "attention", bias=bias)
    t += _linear(f"{prefix}.{k}", kv * hd, h, layer, "attention", bias=bias, kv=True)
    t += _linear(f"{prefix}.{v}", kv * hd, h, layer, "attention", bias=bias, kv=True)
    t += _linear(f"{prefix}.{o}", h, heads * hd, layer, "attention", bias=o_bias, row_bias=True)
    if qk_norm:
        t += _norm(f"{prefix}.q_norm", hd, layer, part="attention")
        t += _norm(f"{prefix}.k_norm", hd, layer, part="attention")
    if sinks:
        t.append(Tensor(f"{prefix}.sinks", (heads,), "param", "attention", layer))
    return t


def mla(prefix: str, layer: int, cfg: Config, h: int, q_rank: int | None) -> list[Tensor]:
    """DeepSeek MLA (vllm/model_executor/models/deepseek_v2.py:953-968, :518): q_a / kv_a
    projections and their norms whole on every rank (disable_tp), the rest split. `q_rank`: the
    query LoRA width (`q_lora_rank` as transformers' class resolves it), None for a plain q_proj."""
    heads = cfg.need("num_attention_heads")
    rank, rope = cfg.need("kv_lora_rank"), cfg.need("qk_rope_head_dim")
    nope, vh = cfg.need("qk_nope_head_dim"), cfg.need("v_head_dim")
    t: list[Tensor] = []
    if q_rank:
        t += _linear(f"{prefix}.q_a_proj", q_rank, h, layer, "attention", replicated=True)
        t += _norm(f"{prefix}.q_a_layernorm", q_rank, layer, part="attention")
        t += _linear(f"{prefix}.q_b_proj", heads * (nope + rope), q_rank, layer, "attention")
    else:
        t += _linear(f"{prefix}.q_proj", heads * (nope + rope), h, layer, "attention")
    t += _linear(f"{prefix}.kv_a_proj_with_mqa", rank + rope, h, layer, "attention", replicated=True)
    t += _norm(f"{prefix}.kv_a_layernorm", rank, layer, part="attention")
    t += _linear(f"{prefix}.kv_b_proj", heads * (nope + vh), rank, layer, "attention")
    t += _linear(f"{prefix}.o_proj", h, heads * vh, layer, "attention")
    return t


def dsa_indexer(prefix: str, layer: int, cfg: Config, h: int, q_rank: int | None) -> list[Tensor]:
    """DeepSeek sparse attention's indexer (models/deepseek_v32/attention.py:71-87): wq_b quantized
    with the model, wk + weights_proj fused unquantized, k_norm a fp32 LayerNorm; all replicated."""
    n, d = cfg.need("index_n_heads"), cfg.need("index_head_dim")
    if q_rank is None:
        raise cfg.error("q_lora_rank", f"`{cfg.name('q_lora_rank')}` is null: the indexer reads the query latent "
                        "(models/deepseek_v32/attention.py:71-87), so sparse attention needs a q_lora_rank")
    t = _linear(f"{prefix}.wq_b", n * d, q_rank, layer, "indexer", replicated=True)
    t += _linear(f"{prefix}.wk", d, h, layer, "indexer", klass="linear_bf16", replicated=True)
    t += _linear(f"{prefix}.weights_proj", n, h, layer, "indexer", klass="linear_bf16", replicated=True)
    t += _norm(f"{prefix}.k_norm", d, layer, bias=True, klass="fp32", part="indexer")
    return t


def swiglu(prefix: str, layer: int | None, h: int, inter: int, part: str,
           names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")) -> list[Tensor]:
    g, u, d = names
    return (_linear(f"{prefix}.{g}", inter, h, layer, part) + _linear(f"{prefix}.{u}", inter, h, layer, part)
            + _linear(f"{prefix}.{d}", h, inter, layer, part))


def router(name: str, layer: int, h: int, experts: int, *, bias: bool = False,
           correction: str | None = None) -> list[Tensor]:
    """Routers are `GateLinear`, a ReplicatedLinear (layers/fused_moe/router/gate_linear.py:22)."""
    t = [Tensor(f"{name}.weight", (experts, h), "param", "routers", layer, replicated=True)]
    if bias:
        t.append(Tensor(f"{name}.bias", (experts,), "param", "routers", layer, replicated=True))
    if correction:
        t.append(Tensor(correction, (experts,), "fp32", "routers", layer, replicated=True))
    return t


def embeddings(cfg: Config, h: int, embed: str, head: str, final_norm: str, tie: bool | None = None) -> list[Tensor]:
    """Embeddings, the LM head unless tied, the final norm. `tie`: what the caller knows vLLM reads instead of
    this config's `tie_word_embeddings` (a multimodal wrapper's root value, `_root_tie`)."""
    vocab = cfg.need("vocab_size")
    t = [Tensor(embed, (vocab, h), "param", "embeddings")]
    if tie is None:
        tie = bool(given(cfg, "tie_word_embeddings")[0])
    if not tie:
        t.append(Tensor(head, (vocab, h), "param", "lm_head"))
    return t + _norm(final_norm, h, None)


# ----------------------------------------------------------------------------------------------
# the common MoE numbers

EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")
TOP_K = ("num_experts_per_tok", "experts_per_token")


def _experts(cfg: Config) -> tuple[int, str, int, str]:
    routed = cfg.need(*EXPERTS, what="routed experts per MoE layer")
    top_k = cfg.need(*TOP_K, what="experts picked per token")
    if top_k > routed:
        raise cfg.error(cfg.field(*TOP_K).rsplit(".", 1)[-1],  # type: ignore[union-attr]
                        f"top-k {top_k} exceeds the {routed} routed experts ({cfg.field(*EXPERTS)})")
    return routed, f"config.json `{cfg.field(*EXPERTS)}`", top_k, f"config.json `{cfg.field(*TOP_K)}`"


def _heads(cfg: Config) -> tuple[int, int, int, str, str]:
    """Query heads, KV heads, head width and their sources. A KV-head count or head width config.json leaves out
    (or nulls) is what the transformers class vLLM loads it through makes of that (`hfdefaults.given`): Qwen3-MoE's
    4 KV heads, not the query heads; where that cannot be told, a refusal."""
    heads = cfg.need("num_attention_heads")
    kv, kv_src = given(cfg, "num_key_value_heads")
    if heads % kv:
        raise cfg.error("num_key_value_heads", f"{heads} query heads do not split into {kv} KV groups "
                        f"({cfg.name('num_attention_heads')} must be a multiple; {kv_src})")
    h = cfg.need("hidden_size")
    hd, hd_src = given(cfg, "head_dim")
    if hd is HIDDEN_PER_HEAD:
        if h % heads:
            raise cfg.error("hidden_size", f"no head_dim and {h} does not split into {heads} heads")
        derived = f"config.json `{cfg.name('hidden_size')}` / `{cfg.name('num_attention_heads')}`"
        hd, hd_src = h // heads, derived if "head_dim" not in cfg.data else f"{derived} ({hd_src})"
    return heads, kv, hd, kv_src, hd_src


def _full(layers: list[int], rule: str, kv: int, kv_src: str, hd: int, hd_src: str) -> dict[str, Any]:
    return {"kind": "full", "layers": sourced(index_ranges(layers), rule), "kv_heads": sourced(kv, kv_src),
            "head_dim": sourced(hd, hd_src), "kv_dtype": "bf16"}


def _layers(cfg: Config) -> tuple[int, str]:
    n = cfg.need("num_hidden_layers")
    return n, f"config.json `{cfg.name('num_hidden_layers')}`"


def _mtp(cfg: Config, *names: str) -> tuple[int, str]:
    n = cfg.get(*names, default=0) or 0
    return n, (f" (MTP layers excluded: `{cfg.field(*names)}` {n}; vLLM loads them only for speculative "
               "decoding)" if n else "")


# ----------------------------------------------------------------------------------------------
# families

QWEN3_MOE = f"{V}model_executor/models/qwen3_moe.py"


def _qwen3_moe(cfg: Config, arch: str, prefix: str = "model.", tie: bool | None = None) -> Built:
    """vllm/model_executor/models/qwen3_moe.py: every layer MoE unless in `mlp_only_layers` or off
    the `decoder_sparse_step` grid; GQA with q/k RMSNorm."""
    layers, layers_src = _layers(cfg)
    routed, routed_src, top_k, top_k_src = _experts(cfg)
    h = cfg.need("hidden_size")
    heads, kv, hd, kv_src, hd_src = _heads(cfg)
    step, step_src = given(cfg, "decoder_sparse_step")
    dense_list, dense_src = given(cfg, "mlp_only_layers")
    dense = set(dense_list)
    _check_indices(cfg, "mlp_only_layers", dense, layers)
    _sparse_step_dense(cfg, layers, step, step_src, dense, dense_src, f"{QWEN3_MOE}:385-392")
    moe = [i for i in range(layers) if i not in dense and (i + 1) % step == 0]
    if step_src.startswith("config.json") and dense_src.startswith("config.json"):
        rule = (f"config.json `{cfg.name('decoder_sparse_step')}` {step}, `{cfg.name('mlp_only_layers')}` "
                f"{sorted(dense)} ({V}model_executor/models/qwen3_moe.py)")
    else:
        rule = (f"{phrase(step, step_src)}; {phrase(sorted(dense), dense_src)} "
                f"({V}model_executor/models/qwen3_moe.py)")
    inter = cfg.need("moe_intermediate_size")
    bias = bool(given(cfg, "attention_bias")[0])
    attn_rule, shared_src = "every layer full attention", "Qwen3-MoE has no shared expert (qwen3_moe.py)"
    kinds, window, window_src = ["full"] * layers, None, ""
    if arch == "Qwen3MoeForCausalLM":
        on, on_src = given(cfg, "use_sliding_window")
        if on:
            # Qwen3MoeConfig keeps sliding_window only with use_sliding_window (its __post_init__); vLLM's Qwen3-MoE
            # passes no per-layer window, and with no layer_types the model-level window is every layer's.
            window, window_src = given(cfg, "sliding_window")
            if window is not None:
                kinds = ["sliding"] * layers
                attn_rule = (f"{phrase(on, on_src)} and a window: every layer sliding — {TF} Qwen3MoeConfig keeps "
                             "sliding_window only then, vLLM's Qwen3-MoE passes no per-layer window and, with no "
                             f"layer_types, the model-level window applies to every layer ({V}engine/arg_utils.py:"
                             f"2288-2294, {V}model_executor/layers/attention/attention.py:266-271; max_window_layers "
                             "is not read)")
    # Fields vLLM's Qwen3-MoE does not take from the config, accepted only with what it builds.
    if cfg.has("qkv_bias"):
        if cfg.get("qkv_bias") != bias:
            raise cfg.error("qkv_bias", f"{cfg.name('qkv_bias')} is {str(cfg.get('qkv_bias')).lower()}, but vLLM's "
                            f"{arch} builds q/k/v biases from `attention_bias` ({str(bias).lower()}; {QWEN3_MOE}:376, "
                            ":289) and never reads qkv_bias: the checkpoint's attention would not be what vLLM builds")
        attn_rule += (f"; `{cfg.name('qkv_bias')}` {str(bias).lower()} read: q/k/v biases as `attention_bias` builds "
                      f"them ({QWEN3_MOE}:376, :289)")
    if cfg.has("use_qk_norm"):
        if cfg.get("use_qk_norm") is not True:
            raise cfg.error("use_qk_norm", f"{cfg.name('use_qk_norm')} is false, but vLLM's {arch} attention "
                            f"always builds and applies the per-head q/k RMSNorm ({QWEN3_MOE}:326-327, :338-342)")
        attn_rule += f"; `{cfg.name('use_qk_norm')}` true read: per-head q/k RMSNorm ({QWEN3_MOE}:326-327)"
    if cfg.has("shared_expert_intermediate_size"):
        si = cfg.get("shared_expert_intermediate_size")
        if si != 0:
            raise cfg.error("shared_expert_intermediate_size", f"{si}: vLLM's {arch} builds a shared expert and its "
                            f"gate when it is above 0 ({QWEN3_MOE}:177-201); the importer reads it without one: only 0 "
                            "is accepted")
        shared_src = (f"config.json `{cfg.name('shared_expert_intermediate_size')}` 0: no shared expert "
                      f"({QWEN3_MOE}:177-201 builds one only above 0)")
    t = embeddings(cfg, h, f"{prefix}embed_tokens.weight", "lm_head.weight" if prefix == "model." else
                   prefix.replace("model.", "", 1) + "lm_head.weight", f"{prefix}norm", tie=tie)
    for i in range(layers):
        p = f"{prefix}layers.{i}"
        t += _norm(f"{p}.input_layernorm", h, i) + _norm(f"{p}.post_attention_layernorm", h, i)
        t += gqa(f"{p}.self_attn", i, h, heads, kv, hd, bias=bias, qk_norm=True)
        if i in moe:
            t += router(f"{p}.mlp.gate", i, h, routed)
        else:
            t += swiglu(f"{p}.mlp", i, h, cfg.need("intermediate_size"), "dense_mlp")
    return Built(cfg, layers, layers_src, moe, rule, routed, routed_src, top_k, top_k_src, h, inter,
                 f"config.json `{cfg.name('moe_intermediate_size')}`", 0, shared_src,
                 attention=_attention_groups(kinds, attn_rule, window, kv, kv_src, hd, hd_src, window_src), tensors=t)


def _check_indices(cfg: Config, name: str, idx: set[int], layers: int) -> None:
    bad = sorted(i for i in idx if i >= layers)
    if bad:
        raise cfg.error(name, f"layer {bad[0]} is past the {layers} decoder layers")


def _all_layers(layers: int) -> str:
    return f"all {layers} layers" if layers != 1 else "the one layer"


def _all_dense(cfg: Config, field_: str, why: str, layers: int, where: str) -> InputError:
    """The refusal for a layer rule that leaves no MoE layer, naming the field (and its line) that made every layer
    dense: "`first_k_dense_replace` 61 makes all 61 layers dense: no MoE layer to offload"."""
    return cfg.error(field_, f"{why} makes {_all_layers(layers)} dense: no MoE layer to offload (the importer "
                     f"describes MoE models; {where})")


def _sparse_step_dense(cfg: Config, layers: int, step: int, step_src: str, dense: set[int],
                       dense_src: str, where: str) -> None:
    """Qwen3-MoE / Qwen3-Next: layer i is MoE when i is not in `mlp_only_layers` and (i + 1) % decoder_sparse_step
    == 0. Refused, naming the field that left none (its class default never does), when no layer is MoE."""
    sparse = [i for i in range(layers) if (i + 1) % step == 0]
    if any(i not in dense for i in sparse):
        return
    if not sparse:
        raise _all_dense(cfg, "decoder_sparse_step", f"{phrase(step, step_src)} ((i + 1) % {step} == 0 for no layer "
                         f"i below {layers})", layers, where)
    why = phrase(index_ranges(sorted(dense)), dense_src)
    if len(sparse) < layers:    # the list takes out the layers the step leaves MoE
        why += f" with {phrase(step, step_src)}"
    raise _all_dense(cfg, "mlp_only_layers", why, layers, where)


def _mixtral(cfg: Config, arch: str) -> Built:
    layers, layers_src = _layers(cfg)
    routed, routed_src, top_k, top_k_src = _experts(cfg)
    h = cfg.need("hidden_size")
    heads, kv, hd, kv_src, hd_src = _heads(cfg)
    t = embeddings(cfg, h, "model.embed_tokens.weight", "lm_head.weight", "model.norm")
    for i in range(layers):
        p = f"model.layers.{i}"
        t += _norm(f"{p}.input_layernorm", h, i) + _norm(f"{p}.post_attention_layernorm", h, i)
        t += gqa(f"{p}.self_attn", i, h, heads, kv, hd)
        t += router(f"{p}.block_sparse_moe.gate", i, h, routed)
    kinds, rule, window = _sliding(cfg, layers)
    return Built(cfg, layers, layers_src, list(range(layers)),
                 f"every decoder layer is MoE ({V}model_executor/models/mixtral.py)", routed, routed_src, top_k,
                 top_k_src, h, cfg.need("intermediate_size"), f"config.json `{cfg.name('intermediate_size')}`",
                 0, "Mixtral has no shared expert", attention=_attention_groups(kinds, rule, window, kv, kv_src, hd,
                                                                                 hd_src), tensors=t)


def _sliding(cfg: Config, layers: int) -> tuple[list[str], str, int | None]:
    """Mixtral: every layer sliding with a window, else every layer full. MixtralConfig declares no layer_types,
    so vLLM's model-level window (`sliding_window`) is every layer's (vllm/engine/arg_utils.py:2288-2294;
    mixtral.py passes no per-layer window)."""
    window, src = given(cfg, "sliding_window")
    if window:
        return ["sliding"] * layers, f"config.json `{cfg.name('sliding_window')}`", window
    rule = f"config.json `{cfg.name('sliding_window')}` null" if "sliding_window" in cfg.data else src
    return ["full"] * layers, rule, None


def _attention_groups(kinds: list[str], rule: str, window: int | None, kv: int, kv_src: str, hd: int,
                      hd_src: str, window_src: str = "") -> list[dict[str, Any]]:
    out = []
    for kind in ("sliding", "full"):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        if not idx:
            continue
        g = _full(idx, rule, kv, kv_src, hd, hd_src)
        g["kind"] = kind
        if kind == "sliding":
            g["window"] = sourced(window, window_src or "config.json `sliding_window`")
        out.append(g)
    return out


GPT_OSS = f"{V}model_executor/models/gpt_oss.py"



def _layer_types(cfg: Config, layers: int, absent_kind: str) -> list | None:
    """config.json's `layer_types`, one entry per decoder layer and none of `absent_kind` (a kind of
    layer the architecture has none of in vLLM 0.33), or None where it gives none."""
    types = cfg.get("layer_types")
    if types is not None:
        if len(types) != layers:
            raise cfg.error("layer_types", f"{len(types)} entries for the {layers} layers of "
                            f"{cfg.name('num_hidden_layers')}")
        if absent_kind in types:
            raise cfg.error("layer_types", f"{absent_kind} layers: this architecture has none in vLLM 0.33")
    return types

def _gpt_oss_sliding(cfg: Config, layers: int) -> tuple[list[str], str, int | None, str]:
    """What vLLM 0.33 builds, not what `layer_types` lists: even layers get the per-layer window (gpt_oss.py:175);
    odd layers take the model-level window, which vLLM sets only when every layer_types entry is sliding
    (engine/arg_utils.py:2288-2294; GptOssConfig fills layer_types alternating when config.json has none). A
    `layer_types` that lists other layers than those is refused: vLLM would not run the checkpoint's layout."""
    window, window_src = given(cfg, "sliding_window")
    types = _layer_types(cfg, layers, "linear_attention")
    every = types is not None and all(x == "sliding_attention" for x in types)
    kinds = ["sliding" if window and (i % 2 == 0 or every) else "full" for i in range(layers)]
    if types is not None:
        listed = ["sliding" if x == "sliding_attention" else "full" for x in types]
        if listed != kinds:
            at = next(i for i in range(layers) if listed[i] != kinds[i])
            raise cfg.doc.error(f"layer {at} is {types[at]}, but vLLM's GptOssForCausalLM builds it "
                                f"{kinds[at]}: it gives even layers the window ({GPT_OSS}:175) and odd layers one only "
                                f"when every entry is sliding_attention ({V}engine/arg_utils.py:2288-2294)"
                                + ("; `sliding_window` is null: no window at all" if not window else "")
                                + " — the layers vLLM runs are not the ones listed", cfg.base + ("layer_types", at))
        rule = f"config.json `{cfg.name('layer_types')}`"
    elif not window:
        rule = f"{window_src}: every layer full attention ({GPT_OSS}:175 passes no window)"
    else:
        rule = (f"no `{cfg.name('layer_types')}` in config.json: {TF} GptOssConfig alternates sliding (even) and "
                f"full (odd) layers, as vLLM builds them ({GPT_OSS}:175)")
    return kinds, rule, window, window_src


def _gpt_oss(cfg: Config, arch: str) -> Built:
    layers, layers_src = _layers(cfg)
    routed, routed_src, top_k, top_k_src = _experts(cfg)
    h = cfg.need("hidden_size")
    heads, kv, hd, kv_src, hd_src = _heads(cfg)
    if given(cfg, "tie_word_embeddings")[0]:
        raise cfg.error("tie_word_embeddings", f"`{cfg.name('tie_word_embeddings')}` is true, but vLLM's "
                        f"GptOssForCausalLM builds its own lm_head whatever it says ({GPT_OSS}:1417-1421), and whether "
                        f"it then shares the embeddings' storage depends on the checkpoint's tensors "
                        f"({V}model_executor/model_loader/weight_tying.py): the LM head bytes cannot be stated")
    t = embeddings(cfg, h, "model.embed_tokens.weight", "lm_head.weight", "model.norm", tie=False)
    for i in range(layers):
        p = f"model.layers.{i}"
        t += _norm(f"{p}.input_layernorm", h, i) + _norm(f"{p}.post_attention_layernorm", h, i)
        t += gqa(f"{p}.self_attn", i, h, heads, kv, hd, bias=True, o_bias=True, sinks=True)
        t += router(f"{p}.mlp.router", i, h, routed, bias=True)
    kinds, rule, window, window_src = _gpt_oss_sliding(cfg, layers)
    limit = cfg.need("swiglu_limit")
    b = Built(cfg, layers, layers_src, list(range(layers)), f"every decoder layer is MoE ({V}model_executor/models/gpt_oss.py)", routed,
              routed_src, top_k, top_k_src, h, cfg.need("intermediate_size"),
              f"config.json `{cfg.name('intermediate_size')}`", 0, "gpt-oss has no shared expert",
              attention=_attention_groups(kinds, rule, window, kv, kv_src, hd, hd_src, window_src), tensors=t)
    b.activation = {"kind": "swigluoai", "alpha": GPTOSS_SWIGLU_ALPHA, "limit": float(limit)}
    b.activation_src = (f"{GPTOSS_SWIGLU_SOURCE}; config.json `swiglu_limit`; {V}model_executor/models/gpt_oss.py:400 "
                        "(activation swigluoai)")
    b.expert_biases = True
    b.bias_src = f"{V}model_executor/models/gpt_oss.py:399 (FusedMoE has_bias=True)"
    return b


def _deepseek(cfg: Config, arch: str, prefix: str = "model.", head: str = "lm_head.weight",
              tie: bool | None = None) -> Built:
    """DeepSeek-V3 / Kimi-K2 (models/deepseek_v2.py), DeepSeek-V3.2 and GLM-5 (models/deepseek_v32/):
    MoE at layer i >= first_k_dense_replace with i % moe_layer_freq == 0 (deepseek_v2.py:1293-1297).
    Fields config.json leaves out take transformers' DeepseekV3Config / GlmMoeDsaConfig defaults (3 leading dense
    layers, 1 shared expert, a query LoRA), as vLLM loads them (`hfdefaults`)."""
    layers, layers_src = _layers(cfg)
    routed, routed_src, top_k, top_k_src = _experts(cfg)
    h = cfg.need("hidden_size")
    k, k_src = given(cfg, "first_k_dense_replace")
    if k > layers:
        raise cfg.error("first_k_dense_replace", f"{k} leading dense layers of {layers} ({k_src})")
    freq, freq_src = given(cfg, "moe_layer_freq")
    moe = [i for i in range(k, layers) if i % freq == 0]
    where = f"MoE layers are i >= first_k_dense_replace with i % moe_layer_freq == 0, {V}model_executor/models/" \
            "deepseek_v2.py:1293-1297"
    if k == layers:
        raise _all_dense(cfg, "first_k_dense_replace", phrase(k, k_src), layers, where)
    if not moe:
        raise _all_dense(cfg, "moe_layer_freq", f"{phrase(freq, freq_src)} after {phrase(k, k_src)} (no layer "
                         f"{k}-{layers - 1} is a multiple of {freq})", layers, where)
    if k_src.startswith("config.json"):
        rule = (f"config.json `{cfg.name('first_k_dense_replace')}` {k}"
                + (f", `{cfg.name('moe_layer_freq')}` {freq}" if cfg.has("moe_layer_freq") else f"; {freq_src}")
                + f" ({V}model_executor/models/deepseek_v2.py:1293-1297)")
    else:
        rule = f"{k_src}; {phrase(freq, freq_src)} ({V}model_executor/models/deepseek_v2.py:1293-1297)"
    shared, shared_src = given(cfg, "n_shared_experts")
    inter = cfg.need("moe_intermediate_size")
    sparse = arch in ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")
    correction = given(cfg, "topk_method")[0] == "noaux_tc"
    q_rank = given(cfg, "q_lora_rank")[0]
    t = embeddings(cfg, h, f"{prefix}embed_tokens.weight", head, f"{prefix}norm", tie=tie)
    for i in range(layers):
        p = f"{prefix}layers.{i}"
        t += _norm(f"{p}.input_layernorm", h, i) + _norm(f"{p}.post_attention_layernorm", h, i)
        t += mla(f"{p}.self_attn", i, cfg, h, q_rank)
        if sparse:
            t += dsa_indexer(f"{p}.self_attn.indexer", i, cfg, h, q_rank)
        if i in moe:
            t += router(f"{p}.mlp.gate", i, h, routed,
                        correction=f"{p}.mlp.gate.e_score_correction_bias" if correction else None)
            if shared:
                t += swiglu(f"{p}.mlp.shared_experts", i, h, inter * shared, "shared_experts")
        else:
            t += swiglu(f"{p}.mlp", i, h, cfg.need("intermediate_size"), "dense_mlp")
    rank, rope = cfg.need("kv_lora_rank"), cfg.need("qk_rope_head_dim")
    group: dict[str, Any] = {"kind": "mla", "layers": sourced(f"0-{layers - 1}", f"config.json "
                                                                                  f"`{cfg.name('kv_lora_rank')}` (every "
                                                                                  "layer MLA)"),
                             "kv_lora_rank": sourced(rank, f"config.json `{cfg.name('kv_lora_rank')}`"),
                             "rope_head_dim": sourced(rope, f"config.json `{cfg.name('qk_rope_head_dim')}`"),
                             "kv_dtype": "bf16"}
    if sparse:
        _check_every_layer_indexed(cfg)
        d = cfg.need("index_head_dim")
        if d % 128:
            raise cfg.error("index_head_dim", f"{d}: vLLM's indexer cache stores one fp32 scale per 128 values")
        group["index_head_dim"] = sourced(d, f"config.json `{cfg.name('index_head_dim')}`: the indexer caches "
                                             f"{d} fp8 values + {d // 128} fp32 scale(s) per token per layer "
                                             f"({V}models/deepseek_v32/attention.py:95-100)")
        group["index_topk"] = sourced(cfg.need("index_topk"), f"config.json `{cfg.name('index_topk')}`: tokens the "
                                                              "indexer selects per query token "
                                                              f"({V}models/deepseek_v32/attention.py:65)")
    mtp, mtp_src = _mtp(cfg, "num_nextn_predict_layers")
    return Built(cfg, layers, layers_src + mtp_src, moe, rule, routed, routed_src, top_k, top_k_src, h, inter,
                 f"config.json `{cfg.name('moe_intermediate_size')}`", shared, shared_src, attention=[group], tensors=t,
                 mtp_layers=mtp)


def _check_every_layer_indexed(cfg: Config) -> None:
    """Which layers build an indexer: `index_topk_freq` / `index_topk_pattern` /
    `index_skip_topk_offset` (models/deepseek_v32/attention.py:166-176); the importer reads the
    default (every layer), so a config setting them is refused by `check_fields`."""


def _glm4_moe(cfg: Config, arch: str) -> Built:
    """models/glm4_moe.py: MoE from layer first_k_dense_replace on (:353-356, no moe_layer_freq)."""
    layers, layers_src = _layers(cfg)
    routed, routed_src, top_k, top_k_src = _experts(cfg)
    if cfg.get("moe_layer_freq", default=1) != 1:
        raise cfg.error("moe_layer_freq", "vLLM's GLM-4.5 ignores moe_layer_freq (glm4_moe.py:353-356): only 1 "
                        "describes what it builds")
    h = cfg.need("hidden_size")
    heads, kv, hd, kv_src, hd_src = _heads(cfg)
    k, k_src = given(cfg, "first_k_dense_replace")
    if k > layers:
        raise cfg.error("first_k_dense_replace", f"{k} leading dense layers of {layers} ({k_src})")
    if k == layers:
        raise _all_dense(cfg, "first_k_dense_replace", phrase(k, k_src), layers,
                         f"MoE layers are i >= first_k_dense_replace, {V}model_executor/models/glm4_moe.py:353-356")
    moe = list(range(k, layers))
    shared, shared_src = given(cfg, "n_shared_experts")
    inter = cfg.need("moe_intermediate_size")
    bias, qk_norm = bool(given(cfg, "attention_bias")[0]), bool(given(cfg, "use_qk_norm")[0])
    t = embeddings(cfg, h, "model.embed_tokens.weight", "lm_head.weight", "model.norm")
    for i in range(layers):
        p = f"model.layers.{i}"
        t += _norm(f"{p}.input_layernorm", h, i) + _norm(f"{p}.post_attention_layernorm", h, i)
        t += gqa(f"{p}.self_attn", i, h, heads, kv, hd, bias=bias, qk_norm=qk_norm)
        if i in moe:
            t += router(f"{p}.mlp.gate", i, h, routed, correction=f"{p}.mlp.gate.e_score_correction_bias")
            if shared:
                t += swiglu(f"{p}.mlp.shared_experts", i, h, inter * shared, "shared_experts")
        else:
            t += swiglu(f"{p}.mlp", i, h, cfg.need("intermediate_size"), "dense_mlp")
    mtp, mtp_src = _mtp(cfg, "num_nextn_predict_layers")
    return Built(cfg, layers, layers_src + mtp_src, moe,
                 f"{phrase(k, k_src)} ({V}model_executor/models/glm4_moe.py:353-356)",
                 routed, routed_src, top_k, top_k_src, h, inter, f"config.json `{cfg.name('moe_intermediate_size')}`",
                 shared, shared_src,
                 attention=[_full(list(range(layers)), "every layer full attention", kv, kv_src, hd, hd_src)],
                 tensors=t, mtp_layers=mtp)


# --- hybrids: Gated DeltaNet (Qwen3-Next, Qwen3.5) and Mamba-2 (Nemotron-H)

QWEN_NEXT = f"{V}model_executor/models/qwen3_next.py"
GDN = f"{V}model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"


def _qwen_hybrid(cfg: Config, arch: str, prefix: str, head: str, every_layer_moe: bool) -> Built:
    """Qwen3-Next (qwen3_next.py) and Qwen3.5-MoE (qwen3_5.py): `layer_types` (or
    `full_attention_interval`) picks Gated DeltaNet or gated full attention per layer."""
    layers, layers_src = _layers(cfg)
    routed, routed_src, top_k, top_k_src = _experts(cfg)
    h = cfg.need("hidden_size")
    heads, kv, hd, kv_src, hd_src = _heads(cfg)
    types = _layer_types(cfg, layers, "sliding_attention")
    if types is not None:
        interval = cfg.get("full_attention_interval")
        if interval is not None:
            implied = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
            if implied != types:
                raise cfg.error("full_attention_interval", f"{cfg.name('full_attention_interval')} {interval} "
                                f"and {cfg.name('layer_types')} describe different layers; vLLM reads layer_types")
        kinds = ["full" if x == "full_attention" else "linear" for x in types]
        rule = f"config.json `{cfg.name('layer_types')}` ({QWEN_NEXT}:668)"
    else:
        interval, interval_src = given(cfg, "full_attention_interval")
        kinds = ["linear" if (i + 1) % interval else "full" for i in range(layers)]
        rule = (f"{phrase(interval, interval_src)}: layer i is full attention when "
                f"(i + 1) % {interval} == 0 (transformers' Qwen3NextConfig fills layer_types so; {QWEN_NEXT}:668)")
    full = [i for i, k in enumerate(kinds) if k == "full"]
    linear = [i for i, k in enumerate(kinds) if k == "linear"]
    if every_layer_moe:
        moe = list(range(layers))
        moe_rule = f"every decoder layer is MoE (qwen3_5_moe_text: {V}model_executor/models/qwen3_5.py:171-176)"
    else:
        step, step_src = given(cfg, "decoder_sparse_step")
        dense_list, dense_src = given(cfg, "mlp_only_layers")
        dense = set(dense_list)
        _check_indices(cfg, "mlp_only_layers", dense, layers)
        _sparse_step_dense(cfg, layers, step, step_src, dense, dense_src, f"{QWEN_NEXT}:489-495")
        moe = [i for i in range(layers) if i not in dense and (i + 1) % step == 0]
        if step_src.startswith("config.json") and dense_src.startswith("config.json"):
            moe_rule = (f"config.json `{cfg.name('decoder_sparse_step')}` {step}, `{cfg.name('mlp_only_layers')}` "
                        f"{sorted(dense)} ({QWEN_NEXT}:489-495)")
        else:
            moe_rule = f"{phrase(step, step_src)}; {phrase(sorted(dense), dense_src)} ({QWEN_NEXT}:489-495)"
    gate = bool(given(cfg, "attn_output_gate")[0])
    lk, lv = cfg.need("linear_num_key_heads"), cfg.need("linear_num_value_heads")
    dk, dv = cfg.need("linear_key_head_dim"), cfg.need("linear_value_head_dim")
    conv = cfg.need("linear_conv_kernel_dim")
    if lv % lk:
        raise cfg.error("linear_num_value_heads", f"{lv} value heads do not group over {lk} key heads")
    key_dim, value_dim = lk * dk, lv * dv
    inter = cfg.need("moe_intermediate_size")
    si, si_src = given(cfg, "shared_expert_intermediate_size")
    t = embeddings(cfg, h, f"{prefix}embed_tokens.weight", head, f"{prefix}norm")
    for i in range(layers):
        p = f"{prefix}layers.{i}"
        t += _norm(f"{p}.input_layernorm", h, i) + _norm(f"{p}.post_attention_layernorm", h, i)
        if kinds[i] == "full":
            t += gqa(f"{p}.self_attn", i, h, heads, kv, hd, q_rows=heads * hd * (2 if gate else 1), qk_norm=True)
        else:
            a = f"{p}.linear_attn"
            t += _linear(f"{a}.in_proj_qkvz", 2 * key_dim + 2 * value_dim, h, i, "linear_attention")
            t += _linear(f"{a}.in_proj_ba", 2 * lv, h, i, "linear_attention")
            t.append(Tensor(f"{a}.conv1d.weight", (2 * key_dim + value_dim, 1, conv), "param", "linear_attention", i))
            t.append(Tensor(f"{a}.dt_bias", (lv,), "param", "linear_attention", i))
            t.append(Tensor(f"{a}.A_log", (lv,), "fp32", "linear_attention", i))
            t += _norm(f"{a}.norm", dv, i, part="linear_attention")
            t += _linear(f"{a}.out_proj", h, value_dim, i, "linear_attention")
        if i in moe:
            t += router(f"{p}.mlp.gate", i, h, routed)
            if si:
                t += swiglu(f"{p}.mlp.shared_expert", i, h, si, "shared_experts")
                t.append(Tensor(f"{p}.mlp.shared_expert_gate.weight", (1, h), "param", "shared_experts", i,
                                replicated=True))
        else:
            t += swiglu(f"{p}.mlp", i, h, cfg.need("intermediate_size"), "dense_mlp")
    attn = _full(full, rule, kv, kv_src, hd, hd_src)
    # vLLM 0.33.0 reads `mamba_ssm_dtype` only through Qwen3_5ForConditionalGenerationConfig.verify_and_update_config
    # (models/config.py:953-978), registered for the Qwen3_5* architectures alone (:1259-1262); for Qwen3-Next the
    # field (when present: an unread key, families' `ignored`) changes nothing and the state takes the conv dtype.
    qwen3_5 = arch.startswith("Qwen3_5")
    ssm_field = "mamba_ssm_dtype" if qwen3_5 and cfg.has("mamba_ssm_dtype") else None
    ssm = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[cfg.get("mamba_ssm_dtype", default="bfloat16")
                                                                     if qwen3_5 else "bfloat16"]
    unread = (f"; config.json `{cfg.name('mamba_ssm_dtype')}` {cfg.data['mamba_ssm_dtype']!r} is not read for {arch}: "
              f"vLLM 0.33.0 applies it only to the Qwen3_5* architectures ({V}model_executor/models/config.py:953-978,"
              " :1259-1262)") if not qwen3_5 and "mamba_ssm_dtype" in cfg.data else ""
    state = {"kind": "gdn", "layers": sourced(index_ranges(linear), rule),
             "num_k_heads": sourced(lk, f"config.json `{cfg.name('linear_num_key_heads')}`"),
             "num_v_heads": sourced(lv, f"config.json `{cfg.name('linear_num_value_heads')}`"),
             "head_k_dim": sourced(dk, f"config.json `{cfg.name('linear_key_head_dim')}`"),
             "head_v_dim": sourced(dv, f"config.json `{cfg.name('linear_value_head_dim')}`"),
             "conv_kernel": sourced(conv, f"config.json `{cfg.name('linear_conv_kernel_dim')}`"),
             "conv_dtype": sourced("bf16", f"--mamba-cache-dtype auto: the model dtype ({V}model_executor/layers/"
                                           "mamba/mamba_utils.py:98-111)"),
             "ssm_dtype": sourced(ssm, (f"config.json `{cfg.name(ssm_field)}` ({V}model_executor/models/config.py:"
                                        "953-978)") if ssm_field else
                                  f"--mamba-ssm-cache-dtype auto: the conv state's dtype ({V}model_executor/layers/"
                                  "mamba/mamba_utils.py:98-111)" + unread)}
    mtp, mtp_src = _mtp(cfg, "mtp_num_hidden_layers", "num_nextn_predict_layers")
    if si and si_src.startswith("config.json"):
        shared_src = (f"config.json `{cfg.name('shared_expert_intermediate_size')}` {si} (one shared expert and its "
                      "sigmoid gate)")
    else:
        shared_src = (f"{phrase(si, si_src)} ({'one shared expert and its sigmoid gate' if si else 'no shared expert'}"
                      f"; {QWEN_NEXT}:155)")
    return Built(cfg, layers, layers_src + mtp_src, moe, moe_rule, routed, routed_src, top_k, top_k_src, h, inter,
                 f"config.json `{cfg.name('moe_intermediate_size')}`", 1 if si else 0, shared_src, attention=[attn],
                 state=[state], tensors=t, mtp_layers=mtp)


NEMOTRON = f"{V}model_executor/models/nemotron_h.py"


def _nemotron_h(cfg: Config, arch: str) -> Built:
    """nemotron_h.py: one layer per character of `hybrid_override_pattern` (:591-615): M Mamba-2
    (MambaMixer2), E MoE (relu2 experts without a gate, :231-245, `is_non_gated_moe`), * attention,
    - relu2 MLP; each layer one norm and one mixer."""
    pattern = cfg.need("hybrid_override_pattern")
    if not pattern or len(pattern) > 4096 or set(pattern) - set("ME*-"):
        bad = sorted(set(pattern) - set("ME*-"))
        raise cfg.error("hybrid_override_pattern", "one character per layer from M, E, *, -"
                        + (f"; {bad[0]!r} is none of them" if bad else f"; {len(pattern)} characters"))
    layers = len(pattern)
    declared = cfg.get("num_hidden_layers")
    if declared is not None and declared != layers:
        raise cfg.error("num_hidden_layers", f"{cfg.name('num_hidden_layers')} is {declared} but "
                        f"{cfg.name('hybrid_override_pattern')} has {layers} layers; vLLM builds the pattern's")
    layers_src = f"config.json `{cfg.name('hybrid_override_pattern')}` ({layers} characters, {NEMOTRON}:591-615)"
    routed, routed_src, top_k, top_k_src = _experts(cfg)
    h = cfg.need("hidden_size")
    heads, kv, hd, kv_src, hd_src = _heads(cfg)
    if given(cfg, "mlp_hidden_act")[0] != "relu2":
        raise cfg.error("mlp_hidden_act", "the importer reads relu2 experts")
    nh, mhd = cfg.need("mamba_num_heads"), cfg.need("mamba_head_dim")
    groups, state_size, conv = cfg.need("n_groups"), cfg.need("ssm_state_size"), cfg.need("conv_kernel")
    if nh % groups:
        raise cfg.error("n_groups", f"{nh} Mamba heads do not split into {groups} groups")
    m_inter = nh * mhd
    conv_dim = m_inter + 2 * groups * state_size
    inter = cfg.need("moe_intermediate_size")
    shared, shared_src = given(cfg, "n_shared_experts")
    si = (given(cfg, "moe_shared_expert_intermediate_size")[0] * shared) if shared else 0
    bias = bool(given(cfg, "mlp_bias")[0])
    use_bias, conv_bias = bool(given(cfg, "use_bias")[0]), bool(given(cfg, "use_conv_bias")[0])
    t = embeddings(cfg, h, "backbone.embeddings.weight", "lm_head.weight", "backbone.norm_f")
    for i, kind in enumerate(pattern):
        p = f"backbone.layers.{i}"
        t += _norm(f"{p}.norm", h, i)
        m = f"{p}.mixer"
        if kind == "M":
            t += _linear(f"{m}.in_proj", m_inter + conv_dim + nh, h, i, "mamba", bias=use_bias)
            t.append(Tensor(f"{m}.conv1d.weight", (conv_dim, 1, conv), "param", "mamba", i))
            if conv_bias:
                t.append(Tensor(f"{m}.conv1d.bias", (conv_dim,), "param", "mamba", i))
            t.append(Tensor(f"{m}.A_log", (nh,), "fp32", "mamba", i))
            t.append(Tensor(f"{m}.D", (nh,), "param", "mamba", i))
            t.append(Tensor(f"{m}.dt_bias", (nh,), "param", "mamba", i))
            t.append(Tensor(f"{m}.norm.weight", (m_inter,), "param", "mamba", i))
            t += _linear(f"{m}.out_proj", h, m_inter, i, "mamba", bias=use_bias, row_bias=True)
        elif kind == "E":
            t += router(f"{m}.gate", i, h, routed, correction=f"{m}.gate.e_score_correction_bias")
            if si:
                t += _linear(f"{m}.shared_experts.up_proj", si, h, i, "shared_experts", bias=bias)
                t += _linear(f"{m}.shared_experts.down_proj", h, si, i, "shared_experts", bias=bias, row_bias=True)
        elif kind == "*":
            t += gqa(m, i, h, heads, kv, hd)
        else:
            mi = cfg.need("intermediate_size")
            t += _linear(f"{m}.up_proj", mi, h, i, "dense_mlp", bias=bias)
            t += _linear(f"{m}.down_proj", h, mi, i, "dense_mlp", bias=bias, row_bias=True)
    idx = {c: [i for i, k in enumerate(pattern) if k == c] for c in "ME*-"}
    if not idx["E"]:
        raise cfg.error("hybrid_override_pattern", "no E (MoE) layer: the importer describes MoE models")
    psrc = f"config.json `{cfg.name('hybrid_override_pattern')}`"
    ssm_value, ssm_src = given(cfg, "mamba_ssm_cache_dtype")
    ssm = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[ssm_value]
    state = {"kind": "mamba2", "layers": sourced(index_ranges(idx["M"]), f"{psrc} M"),
             "num_heads": sourced(nh, f"config.json `{cfg.name('mamba_num_heads')}`"),
             "head_dim": sourced(mhd, f"config.json `{cfg.name('mamba_head_dim')}`"),
             "n_groups": sourced(groups, f"config.json `{cfg.name('n_groups')}`"),
             "state_size": sourced(state_size, f"config.json `{cfg.name('ssm_state_size')}`"),
             "conv_kernel": sourced(conv, f"config.json `{cfg.name('conv_kernel')}`"),
             "conv_dtype": sourced("bf16", f"--mamba-cache-dtype auto: the model dtype ({V}model_executor/layers/"
                                           "mamba/mamba_utils.py:98-111)"),
             "ssm_dtype": sourced(ssm, f"{ssm_src} ({V}model_executor/models/config.py:812-839)")}
    attn = _full(idx["*"], f"{psrc} *", kv, kv_src, hd, hd_src) if idx["*"] else None
    window, window_src = given(cfg, "sliding_window")
    if attn and window:
        # vLLM passes `sliding_window` to every attention layer as its own window (nemotron_h.py:478-488)
        attn["kind"] = "sliding"
        attn["window"] = sourced(window, f"{window_src}: every attention layer's window ({NEMOTRON}:478-488)")
    b = Built(cfg, layers, layers_src, idx["E"], f"{psrc} E ({NEMOTRON}:591-615)", routed, routed_src, top_k,
              top_k_src, h, inter, f"config.json `{cfg.name('moe_intermediate_size')}`", shared, shared_src,
              attention=[attn] if attn else [], state=[state] if idx["M"] else [],
              cacheless=idx["E"] + idx["-"], cacheless_src=f"{psrc} E and -: no attention, no state", tensors=t)
    b.gated = False
    b.activation = {"kind": "relu2_no_mul"}
    b.activation_src = (f"{phrase('relu2', given(cfg, 'mlp_hidden_act')[1])}, experts without a gate: w1 [I, H] "
                        f"(up_proj) + w2 [H, I] ({NEMOTRON}:231-245, :731 is_non_gated_moe; "
                        f"{V}model_executor/layers/fused_moe/activation.py:45 relu2_no_mul)")
    b.expert_biases = bias
    b.bias_src = given(cfg, "mlp_bias")[1]
    return b


# --- multimodal wrappers and Llama-4

LLAMA4 = f"{V}model_executor/models/llama4.py"


def _llama4_text(cfg: Config, arch: str, prefix: str, head: str, tie: bool | None = None) -> Built:
    """llama4.py: MoE where (i + 1) % interleave_moe_layer_step == 0 (:340-343; vLLM does not read
    `moe_layers`), a shared expert per MoE layer (:107-115), top-1 sigmoid routing with the router
    weight applied to the input; NoPE (global) layers where no_rope_layers[i] == 0, the others
    chunked local attention (:184-186, :251-263)."""
    layers, layers_src = _layers(cfg)
    routed, routed_src, top_k, top_k_src = _experts(cfg)
    h = cfg.need("hidden_size")
    heads, kv, hd, kv_src, hd_src = _heads(cfg)
    step = cfg.need("interleave_moe_layer_step")
    moe = [i for i in range(layers) if (i + 1) % step == 0]
    if not moe:
        step_src = f"config.json `{cfg.name('interleave_moe_layer_step')}`"
        raise _all_dense(cfg, "interleave_moe_layer_step", f"{phrase(step, step_src)} ((i + 1) % {step} == 0 for "
                         f"no layer i below {layers})", layers, f"{LLAMA4}:340-343")
    listed = cfg.get("moe_layers")
    if listed is not None and sorted(listed) != moe:
        raise cfg.error("moe_layers", f"{cfg.name('moe_layers')} lists {index_ranges(sorted(listed))}, but vLLM builds "
                        f"MoE layers by {cfg.name('interleave_moe_layer_step')} {step} ({index_ranges(moe)}; "
                        f"{LLAMA4}:340-343 does not read moe_layers)")
    nope = cfg.get("no_rope_layers")
    if nope:
        if len(nope) != layers:
            raise cfg.error("no_rope_layers", f"{len(nope)} entries for the {layers} layers")
        nope_rule = f"config.json `{cfg.name('no_rope_layers')}`"
    else:
        nope = [int((i + 1) % 4 != 0) for i in range(layers)]
        nope_rule = ("no `no_rope_layers`: transformers' Llama4TextConfig makes every 4th layer NoPE "
                     "(no_rope_layer_interval 4)")
    chunk, chunk_src = given(cfg, "attention_chunk_size")
    global_layers = [i for i in range(layers) if nope[i] == 0]
    local = [i for i in range(layers) if nope[i] != 0]
    inter, mlp = cfg.need("intermediate_size"), cfg.need("intermediate_size_mlp")
    t = embeddings(cfg, h, f"{prefix}embed_tokens.weight", head, f"{prefix}norm", tie=tie)
    for i in range(layers):
        p = f"{prefix}layers.{i}"
        t += _norm(f"{p}.input_layernorm", h, i) + _norm(f"{p}.post_attention_layernorm", h, i)
        t += gqa(f"{p}.self_attn", i, h, heads, kv, hd)
        if i in moe:
            t += router(f"{p}.feed_forward.router", i, h, routed)
            t += swiglu(f"{p}.feed_forward.shared_expert", i, h, inter, "shared_experts")
        else:
            t += swiglu(f"{p}.feed_forward", i, h, mlp, "dense_mlp")
    groups = []
    if global_layers:
        groups.append(_full(global_layers, f"{nope_rule} (NoPE layers attend globally, {LLAMA4}:184-186)", kv,
                            kv_src, hd, hd_src))
    if local:
        if chunk:
            g = _full(local, f"{nope_rule} (RoPE layers: ChunkedLocalAttention, {LLAMA4}:251-263)", kv, kv_src, hd,
                      hd_src)
            g["kind"] = "chunked"
            g["chunk"] = sourced(chunk, chunk_src)
            groups.append(g)
        else:
            groups.append(_full(local, f"{nope_rule}; {chunk_src}: full attention", kv, kv_src, hd,
                                hd_src))
    return Built(cfg, layers, layers_src, moe,
                 f"config.json `{cfg.name('interleave_moe_layer_step')}` {step}: (i + 1) % {step} == 0 "
                 f"({LLAMA4}:340-343)", routed, routed_src, top_k, top_k_src, h, inter,
                 f"config.json `{cfg.name('intermediate_size')}`", 1,
                 f"one shared expert of `{cfg.name('intermediate_size')}` per MoE layer ({LLAMA4}:107-115)",
                 attention=groups, tensors=t)


def _llama4_vision(vc: Config, text_h: int) -> list[Tensor]:
    """mllama4.py:123-500: Llama4VisionModel + the pixel-shuffle MLP + the projector."""
    hv, iv = vc.need("hidden_size"), vc.need("intermediate_size")
    n, patch, img, ch = vc.need("num_hidden_layers"), vc.need("patch_size"), vc.need("image_size"), \
        vc.need("num_channels")
    pin, pout = vc.need("projector_input_dim"), vc.need("projector_output_dim")
    vout = vc.need("vision_output_dim")
    pbias = bool(given(vc, "multi_modal_projector_bias")[0])
    patches = (img // patch) ** 2 + 1
    e = dict(encoder=True)
    t = _linear("vision_model.patch_embedding.linear", hv, ch * patch * patch, None, "encoder", **e)
    t.append(Tensor("vision_model.class_embedding", (hv,), "param", "encoder", encoder=True))
    t.append(Tensor("vision_model.positional_embedding_vlm", (patches, hv), "param", "encoder", encoder=True))
    t += _norm("vision_model.layernorm_pre", hv, None, bias=True, part="encoder", replicated=False, encoder=True)
    t += _norm("vision_model.layernorm_post", hv, None, bias=True, part="encoder", replicated=False, encoder=True)
    for i in range(n):
        p = f"vision_model.model.layers.{i}"
        t += _norm(f"{p}.input_layernorm", hv, None, bias=True, part="encoder", replicated=False, encoder=True)
        t += _norm(f"{p}.post_attention_layernorm", hv, None, bias=True, part="encoder", replicated=False,
                   encoder=True)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t += _linear(f"{p}.self_attn.{proj}", hv, hv, None, "encoder", bias=True, **e)
        t += _linear(f"{p}.mlp.fc1", iv, hv, None, "encoder", bias=True, **e)
        t += _linear(f"{p}.mlp.fc2", hv, iv, None, "encoder", bias=True, **e)
    t += _linear("vision_model.vision_adapter.mlp.fc1", pin, iv, None, "encoder", bias=pbias, **e)
    t += _linear("vision_model.vision_adapter.mlp.fc2", pout, pin, None, "encoder", bias=pbias, **e)
    t += _linear("multi_modal_projector.linear_1", text_h, vout, None, "encoder", **e)
    return t


QWEN3_VL = f"{V}model_executor/models/qwen3_vl.py"


def _qwen3_vision(vc: Config) -> list[Tensor]:
    """Qwen3_VisionTransformer (qwen3_vl.py:378-665): Conv3d patch embedding, position embedding,
    blocks, the patch merger and one deepstack merger per `deepstack_visual_indexes`."""
    hv, iv, depth = vc.need("hidden_size"), vc.need("intermediate_size"), vc.need("depth")
    ch, tp, patch = vc.need("in_channels"), vc.need("temporal_patch_size"), vc.need("patch_size")
    npos, out, merge = vc.need("num_position_embeddings"), vc.need("out_hidden_size"), vc.need("spatial_merge_size")
    deep = given(vc, "deepstack_visual_indexes")[0]
    e = dict(encoder=True)
    m = hv * merge * merge
    t = [Tensor("model.visual.patch_embed.proj.weight", (hv, ch, tp, patch, patch), "param", "encoder", encoder=True),
         Tensor("model.visual.patch_embed.proj.bias", (hv,), "param", "encoder", encoder=True),
         Tensor("model.visual.pos_embed.weight", (npos, hv), "param", "encoder", encoder=True)]
    for i in range(depth):
        p = f"model.visual.blocks.{i}"
        t += _norm(f"{p}.norm1", hv, None, bias=True, part="encoder", replicated=False, encoder=True)
        t += _norm(f"{p}.norm2", hv, None, bias=True, part="encoder", replicated=False, encoder=True)
        t += _linear(f"{p}.attn.qkv", 3 * hv, hv, None, "encoder", bias=True, **e)
        t += _linear(f"{p}.attn.proj", hv, hv, None, "encoder", bias=True, **e)
        t += _linear(f"{p}.mlp.linear_fc1", iv, hv, None, "encoder", bias=True, **e)
        t += _linear(f"{p}.mlp.linear_fc2", hv, iv, None, "encoder", bias=True, **e)
    for name, norm in [("model.visual.merger", hv)] + [(f"model.visual.deepstack_merger_list.{j}", m)
                                                       for j in range(len(deep))]:
        t += _norm(f"{name}.norm", norm, None, bias=True, part="encoder", replicated=False, encoder=True)
        t += _linear(f"{name}.linear_fc1", m, m, None, "encoder", bias=True, **e)
        t += _linear(f"{name}.linear_fc2", out, m, None, "encoder", bias=True, **e)
    return t


KIMI_VIT = f"{V}model_executor/models/kimi_k25_vit.py"


def _moonvit(vc: Config, text_h: int) -> list[Tensor]:
    """MoonViT3dPretrainedModel (kimi_k25_vit.py:709-760) and KimiK25MultiModalProjector
    (:891-945, ReplicatedLinear: whole on every rank)."""
    hv, iv = vc.need("vt_hidden_size"), vc.need("vt_intermediate_size")
    n, patch = vc.need("vt_num_hidden_layers"), vc.need("patch_size")
    ph, pw = vc.need("init_pos_emb_height"), vc.need("init_pos_emb_width")
    mh, mw = vc.need("merge_kernel_size")
    # kimi_k25.py:387-390: with a compressed-tensors checkpoint the tower and projector are built unquantized.
    e: dict[str, Any] = dict(encoder=True, unquantized_for=("int4",))
    t = [Tensor("vision_tower.patch_embed.proj.weight", (hv, 3, patch, patch), "param", "encoder", encoder=True),
         Tensor("vision_tower.patch_embed.proj.bias", (hv,), "param", "encoder", encoder=True),
         Tensor("vision_tower.patch_embed.pos_emb.weight", (ph, pw, hv), "param", "encoder", encoder=True)]
    for i in range(n):
        p = f"vision_tower.encoder.blocks.{i}"
        t += _norm(f"{p}.norm0", hv, None, bias=True, part="encoder", replicated=False, encoder=True)
        t += _norm(f"{p}.norm1", hv, None, bias=True, part="encoder", replicated=False, encoder=True)
        t += _linear(f"{p}.wqkv", 3 * hv, hv, None, "encoder", bias=True, **e)
        t += _linear(f"{p}.wo", hv, hv, None, "encoder", bias=True, **e)
        t += _linear(f"{p}.mlp.fc0", iv, hv, None, "encoder", bias=True, **e)
        t += _linear(f"{p}.mlp.fc1", hv, iv, None, "encoder", bias=True, **e)
    t += _norm("vision_tower.encoder.final_layernorm", hv, None, bias=True, part="encoder", replicated=False,
               encoder=True)
    m = hv * mh * mw
    t += _norm("mm_projector.pre_norm", hv, None, bias=True, part="encoder", encoder=True)
    t += _linear("mm_projector.proj.0", m, m, None, "encoder", bias=True, replicated=True, **e)
    t += _linear("mm_projector.proj.2", text_h, m, None, "encoder", bias=True, replicated=True, **e)
    return t


# --- the table's build functions (config -> Built)

def _vision_section(cfg: Config, arch: str, builds: str) -> Config:
    """`vision_config`, or a refusal naming it: vLLM builds the tower from `config.vision_config` whatever the
    checkpoint (`builds`), and a config.json without one leaves transformers to fill its own defaults, which need
    not be this checkpoint's tower — so the encoder bytes could not be stated from the file."""
    value = cfg.data.get("vision_config")
    if not isinstance(value, dict):
        got = ("null" if "vision_config" in cfg.data else "missing") if value is None else \
            f"not an object ({type(value).__name__})"
        raise InputError(f"`vision_config` is {got}: {arch} builds its vision tower from it ({builds}), and without "
                         "it the tower's size (encoder bytes, part of dense bytes) cannot be read from this file; "
                         "use the checkpoint's own config.json, which carries vision_config",
                         file=cfg.file, field=cfg.name("vision_config"),
                         line=cfg.doc.line(cfg.base + ("vision_config",)) if "vision_config" in cfg.data else None)
    return cfg.section("vision_config")


def _vision_dtype(cfg: Config, vc: Config) -> str:
    """`vision_config.dtype` (or torch_dtype) accepted when it is the model dtype vLLM 0.33 builds the tower in, with
    the note for the source: one dtype for the whole model (`set_default_torch_dtype(model_config.dtype)`,
    model_loader/base_loader.py:73; the tower's parameters are made in the default dtype), taken from the root
    `dtype`, then text_config's, and from vision_config's only when neither is given
    (transformers_utils/model_arch_config_convertor.py:210-217)."""
    given = vc.field("dtype", "torch_dtype")
    if given is None:
        return ""
    value = vc.get("dtype", "torch_dtype")
    text = cfg.section("text_config")
    model_field = cfg.field("dtype", "torch_dtype") or text.field("dtype", "torch_dtype")
    model = cfg.get("dtype", "torch_dtype") or text.get("dtype", "torch_dtype") or "bfloat16"
    if value != model:
        key = given.rsplit(".", 1)[-1]
        raise vc.error(key, f"{given} is {value}, but vLLM 0.33 builds the vision tower in the one model dtype "
                       f"({model}: " + (f"`{model_field}`" if model_field else "none given, the importer reads bf16")
                       + f"; {V}model_executor/model_loader/base_loader.py:73, {V}transformers_utils/"
                       "model_arch_config_convertor.py:210-217): a tower in another dtype is not what vLLM loads")
    return (f"; `{given}` {value} read: the model dtype the tower is built in ({V}model_executor/model_loader/"
            "base_loader.py:73)")


def build_qwen3_moe(cfg: Config, arch: str) -> Built:
    return _qwen3_moe(cfg, arch)


def _root_tie(cfg: Config) -> bool:
    """A wrapper that builds its language model through `VllmConfig.with_hf_config(text_config)` (Qwen3-VL, Llama-4,
    Kimi-K2.5) has vLLM 0.33 copy the root's `tie_word_embeddings` into the text config (vllm/config/vllm.py:1011-1015):
    the root value (or the root class's default) decides, not text_config's."""
    return bool(given(cfg, "tie_word_embeddings")[0])


def build_qwen3_vl_moe(cfg: Config, arch: str) -> Built:
    text = cfg.section("text_config")
    b = _qwen3_moe(text, arch, prefix="model.language_model.", tie=_root_tie(cfg))
    vc = _vision_section(cfg, arch, f"{V}model_executor/models/qwen3_vl_moe.py:256-262")
    b.tensors += _qwen3_vision(vc)
    b.encoder_src = (f"vision tower Qwen3_VisionTransformer ({QWEN3_VL}:561-665), loaded unless every modality "
                     f"limit is 0 (--language-model-only; {V}model_executor/models/interfaces.py:347-367)"
                     + _vision_dtype(cfg, vc))
    return b


def build_qwen3_next(cfg: Config, arch: str) -> Built:
    return _qwen_hybrid(cfg, arch, "model.", "lm_head.weight", every_layer_moe=False)


def build_qwen3_5_moe(cfg: Config, arch: str) -> Built:
    if arch == "Qwen3_5MoeForCausalLM":
        return _qwen_hybrid(cfg, arch, "model.", "lm_head.weight", every_layer_moe=True)
    # vLLM's Qwen3.5 builds its language model from hf_text_config itself (qwen3_5.py:332, :353): text_config's
    # tie_word_embeddings (or Qwen3_5MoeTextConfig's default false) decides; the root's is not read.
    b = _qwen_hybrid(cfg.section("text_config"), arch, "model.language_model.", "lm_head.weight",
                     every_layer_moe=True)
    vc = _vision_section(cfg, arch, f"{V}model_executor/models/qwen3_5.py:736-743")
    b.tensors += _qwen3_vision(vc)
    b.encoder_src = (f"vision tower Qwen3_VisionTransformer ({V}model_executor/models/qwen3_5.py:736-743), loaded "
                     "unless every modality limit is 0 (--language-model-only)" + _vision_dtype(cfg, vc))
    return b


def build_kimi_k25(cfg: Config, arch: str) -> Built:
    text = cfg.section("text_config")
    b = _deepseek(text, "DeepseekV3ForCausalLM", prefix="language_model.model.", head="language_model.lm_head.weight",
                  tie=_root_tie(cfg))
    b.tensors += _moonvit(_vision_section(cfg, arch, f"{V}model_executor/models/kimi_k25.py:349-370"), b.hidden)
    b.encoder_src = (f"vision tower MoonViT + projector ({KIMI_VIT}:709-760, :891-945; unquantized with a compressed-tensors "
                     f"checkpoint, {V}model_executor/models/kimi_k25.py:387-390; "
                     f"{V}model_executor/models/kimi_k25.py:349-370), loaded unless the vision_chunk limit is 0")
    return b


def build_llama4(cfg: Config, arch: str) -> Built:
    if arch == "Llama4ForCausalLM":
        return _llama4_text(cfg, arch, "model.", "lm_head.weight")
    b = _llama4_text(cfg.section("text_config"), arch, "language_model.model.", "language_model.lm_head.weight",
                     tie=_root_tie(cfg))
    b.tensors += _llama4_vision(_vision_section(cfg, arch, f"{V}model_executor/models/mllama4.py:765-777"), b.hidden)
    b.encoder_src = (f"vision model + projector ({V}model_executor/models/mllama4.py:123-500), loaded unless "
                     "every modality limit is 0 (--language-model-only)")
    return b


# ----------------------------------------------------------------------------------------------
# the table

_GQA = {"num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "tie_word_embeddings", "max_position_embeddings", "torch_dtype", "dtype", "hidden_act",
        "quantization_config", "model_type", "architectures", "rope_scaling", "rope_parameters", "attention_bias"}
_MOE = {"num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "experts_per_token"}
_MLA = {"kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
        "first_k_dense_replace", "moe_layer_freq", "moe_intermediate_size", "intermediate_size", "n_shared_experts",
        "num_nextn_predict_layers", "topk_method"}
_GDN = {"layer_types", "full_attention_interval", "linear_num_key_heads", "linear_num_value_heads",
        "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "attn_output_gate",
        "moe_intermediate_size", "shared_expert_intermediate_size", "intermediate_size"}
_QWEN_VISION = frozenset({"hidden_size", "intermediate_size", "depth", "in_channels", "temporal_patch_size",
                          "patch_size", "num_position_embeddings", "out_hidden_size", "spatial_merge_size",
                          "deepstack_visual_indexes", "dtype", "torch_dtype"})


def _fam(name: str, archs: tuple[str, ...], types: tuple[str, ...], reads: set[str], ignored: set[str],
         build: Callable[[Config, str], Built], vllm: str, **kw: Any) -> Family:
    return Family(name, archs, types, frozenset(reads), frozenset(ignored), build, vllm, **kw)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    _fam("gpt-oss", ("GptOssForCausalLM",), ("gpt_oss",), _GQA | _MOE | {
        "intermediate_size", "sliding_window", "layer_types", "swiglu_limit"},
        {"experts_per_token", "initial_context_length"}, _gpt_oss, "model_executor/models/gpt_oss.py"),
    _fam("qwen3-moe", ("Qwen3MoeForCausalLM",), ("qwen3_moe",), _GQA | _MOE | {
        "moe_intermediate_size", "intermediate_size", "decoder_sparse_step", "mlp_only_layers",
        "sliding_window", "use_sliding_window", "max_window_layers", "qkv_bias", "use_qk_norm",
        "shared_expert_intermediate_size"}, set(), build_qwen3_moe,
        "model_executor/models/qwen3_moe.py"),
    _fam("deepseek-v3", ("DeepseekV3ForCausalLM",), ("deepseek_v3", "kimi_k2"), _GQA | _MOE | _MLA, set(),
         _deepseek, "model_executor/models/deepseek_v2.py"),
    _fam("deepseek-v3.2", ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"), ("deepseek_v32", "glm_moe_dsa"),
         _GQA | _MOE | _MLA | {"index_n_heads", "index_head_dim", "index_topk", "qk_head_dim"},
         {"indexer_rope_interleave", "rope_interleave"}, _deepseek, "models/deepseek_v32/"),
    _fam("glm-4.5", ("Glm4MoeForCausalLM",), ("glm4_moe",), _GQA | _MOE | {
        "moe_intermediate_size", "intermediate_size", "first_k_dense_replace", "moe_layer_freq", "n_shared_experts",
        "num_nextn_predict_layers", "use_qk_norm", "topk_method"}, set(), _glm4_moe,
        "model_executor/models/glm4_moe.py"),
    _fam("mixtral", ("MixtralForCausalLM",), ("mixtral",), _GQA | _MOE | {
        "intermediate_size", "sliding_window"}, set(), _mixtral, "model_executor/models/mixtral.py"),
    _fam("qwen3-next", ("Qwen3NextForCausalLM",), ("qwen3_next",), _GQA | _MOE | _GDN | {
        "decoder_sparse_step", "mlp_only_layers", "use_sliding_window", "sliding_window"},
        {"mamba_ssm_dtype"}, build_qwen3_next,  # vLLM 0.33.0 reads it for Qwen3_5* only (_qwen_hybrid's ssm_dtype)
        "model_executor/models/qwen3_next.py"),
    _fam("qwen3.5-moe", ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"),
         ("qwen3_5_moe", "qwen3_5_moe_text"), _GQA | _MOE | _GDN | {"mtp_num_hidden_layers", "mamba_ssm_dtype", "text_config",
                                                                    "vision_config", "mlp_only_layers"},
         {"mtp_use_dedicated_embeddings", "image_token_id", "video_token_id", "vision_start_token_id",
          "vision_end_token_id"}, build_qwen3_5_moe, "model_executor/models/qwen3_5.py", text_config=True,
         vision_reads=_QWEN_VISION, vision_ignored=frozenset({"hidden_act", "initializer_range", "model_type",
                                                              "num_heads"})),
    _fam("nemotron-h", ("NemotronHForCausalLM",), ("nemotron_h",), _GQA | _MOE | {
        "hybrid_override_pattern", "mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size",
        "conv_kernel", "use_conv_bias", "use_bias", "mamba_proj_bias", "mlp_bias", "mamba_ssm_cache_dtype",
        "mlp_hidden_act", "moe_intermediate_size", "moe_shared_expert_intermediate_size", "n_shared_experts",
        "intermediate_size", "sliding_window"},
        {"chunk_size", "expand", "mamba_hidden_act", "rescale_prenorm_residual", "residual_in_fp32",
         "time_step_floor", "time_step_max", "time_step_min", "use_mamba_kernels", "time_step_limit"},
        _nemotron_h, "model_executor/models/nemotron_h.py"),
    _fam("llama-4", ("Llama4ForConditionalGeneration", "Llama4ForCausalLM"), ("llama4", "llama4_text"),
         _GQA | _MOE | {"interleave_moe_layer_step", "moe_layers", "intermediate_size", "intermediate_size_mlp",
                        "attention_chunk_size", "no_rope_layers", "use_qk_norm", "text_config", "vision_config"},
         {"boi_token_index", "eoi_token_index", "image_token_index", "attn_temperature_tuning", "attn_scale",
          "floor_scale", "for_llm_compressor", "cache_implementation", "router_jitter_noise"}, build_llama4,
         "model_executor/models/mllama4.py, llama4.py", text_config=True,
         # image preprocessing (add_global_tile, max_patches, resize_to_max_canvas): vLLM 0.33.0 takes its image
         # processor settings from preprocessor_config.json (vllm/transformers_utils/config.py:1244-1255), never this
         # key, and no tensor's size depends on it
         root_ignored=frozenset({"image_processor_config"}),
         vision_reads=frozenset({"hidden_size", "intermediate_size", "num_hidden_layers", "patch_size",
                                 "image_size", "num_channels", "projector_input_dim", "projector_output_dim",
                                 "vision_output_dim", "multi_modal_projector_bias"}),
         vision_ignored=frozenset({"attention_dropout", "hidden_act", "initializer_range", "model_type", "norm_eps",
                                   "num_attention_heads", "pixel_shuffle_ratio", "projector_dropout", "rope_theta",
                                   "torch_dtype", "vision_feature_layer", "vision_feature_select_strategy",
                                   "_attn_implementation_autoset"})),
    _fam("qwen3-vl-moe", ("Qwen3VLMoeForConditionalGeneration",), ("qwen3_vl_moe",), _GQA | _MOE | {
        "moe_intermediate_size", "intermediate_size", "decoder_sparse_step", "mlp_only_layers", "text_config",
        "vision_config"}, {"image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"},
        build_qwen3_vl_moe, "model_executor/models/qwen3_vl_moe.py", text_config=True, vision_reads=_QWEN_VISION,
        vision_ignored=frozenset({"hidden_act", "initializer_range", "model_type", "num_heads"})),
    _fam("kimi-k2.5", ("KimiK25ForConditionalGeneration",), ("kimi_k25",), _GQA | _MOE | _MLA | {
        "text_config", "vision_config"}, {"media_placeholder_token_id", "use_unified_vision_chunk",
                                          "video_placeholder"}, build_kimi_k25,
        "model_executor/models/kimi_k25.py", text_config=True,
        vision_reads=frozenset({"vt_hidden_size", "vt_intermediate_size", "vt_num_hidden_layers", "patch_size",
                                "init_pos_emb_height", "init_pos_emb_width", "merge_kernel_size", "text_hidden_size",
                                "mm_hidden_size"}),
        vision_ignored=frozenset({"_attn_implementation", "init_pos_emb_time", "merge_type", "mm_projector_type",
                                  "pos_emb_type", "projector_hidden_act", "projector_ln_eps", "video_attn_type",
                                  "vt_num_attention_heads"})),
)}

BY_ARCH: dict[str, Family] = {a: f for f in FAMILIES.values() for a in f.architectures}


def family_of(cfg: Config) -> tuple[Family, str]:
    """The family of `architectures[0]`, or an error naming it and the table."""
    archs = cfg.get("architectures")
    if archs is None or archs == []:
        raise InputError("missing `architectures`: the importer picks the model's layout by it", file=cfg.file,
                         line=cfg.doc.line(("architectures",)), field="architectures")
    # A string is not a one-element list: indexing it would read its first letter as the architecture.
    if not isinstance(archs, list):
        got = repr(archs) if len(repr(archs)) <= 60 else repr(archs)[:57] + "..."
        raise cfg.error("architectures", f"must be a list of strings (the model classes, e.g. "
                        f"[\"Qwen3MoeForCausalLM\"]), got {got}")
    for i, item in enumerate(archs):
        if not isinstance(item, str):
            raise cfg.doc.error(f"must be a list of strings (the model classes), got {item!r} at position {i}",
                                cfg.base + ("architectures", i))
    arch = archs[0]
    fam = BY_ARCH.get(arch)
    if fam is None:
        known = ", ".join(sorted(BY_ARCH))
        raise cfg.error("architectures", f"architecture {arch!r} is not one the importer understands (it reads: "
                        f"{known}); an import by field names alone could be silently wrong")
    return fam, arch
