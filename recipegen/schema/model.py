"""The model: a MoE checkpoint's geometry and sizes."""

from __future__ import annotations

import re
from collections.abc import Iterable
from fractions import Fraction
from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, field_validator, model_validator

from recipegen.common.units import GiB
from recipegen.schema.base import Bytes, PathError, PositiveBytes, ScaledNumber, StrictModel
from recipegen.schema.patterns import FILE_NAME, checkpoint_refusal
from recipegen.schema.sourced import lift_sources

# Storage per logical element: (bits per value, values per scale block, bytes per scale).
# The block here is the format's own (over the flattened tensor); a tensor with an explicit
# `scale` layout (FP8 128×128 blocks, int4 groups) counts that instead.
DTYPE_STORAGE: dict[str, tuple[int, int, int]] = {
    "mxfp4": (4, 32, 1),   # OCP MX: fp4 e2m1 values packed 2 per byte, one ue8m0 scale per 32
    "nvfp4": (4, 16, 1),   # fp4 e2m1 values, one fp8 e4m3 scale per 16 (per-tensor scale ignored)
    "fp8": (8, 0, 0),      # e4m3; block scales only where `scale` declares them
    "int4": (4, 0, 0),     # packed 2 per byte; its group scales are declared in `scale`
    "bf16": (16, 0, 0),
    "fp16": (16, 0, 0),
    "fp32": (32, 0, 0),
}
Dtype = Literal["mxfp4", "nvfp4", "fp8", "int4", "bf16", "fp16", "fp32"]

# Bytes per scale value.
SCALE_BYTES: dict[str, int] = {"ue8m0": 1, "e4m3": 1, "bf16": 2, "fp16": 2, "fp32": 4}
ScaleDtype = Literal["ue8m0", "e4m3", "bf16", "fp16", "fp32"]

# Bytes per KV cache element.
KV_DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


class ScaleLayout(StrictModel):
    """How a quantized tensor's scales are laid out: one scale per block of logical elements."""

    dtype: ScaleDtype
    """Storage of one scale (FP8 block checkpoints: `fp32`; MXFP4: `ue8m0`; int4 groups: `bf16`)."""
    block: list[PositiveInt] = Field(min_length=1)
    """Block size per trailing dimension of the tensor's shape, e.g. `[128, 128]` (DeepSeek/Qwen
    FP8: one fp32 scale per 128×128 block) or `[32]` (a group of 32 along the last dimension)."""

    def count(self, shape: list[int]) -> int:
        """Scales of a tensor of `shape`: Π ⌈dim / block⌉ over the blocked dims × the other dims."""
        lead = shape[:len(shape) - len(self.block)]
        n = 1
        for dim in lead:
            n *= dim
        for dim, block in zip(shape[len(lead):], self.block):
            n *= -(-dim // block)
        return n


class ExpertTensor(StrictModel):
    """One weight tensor of a routed expert, as logical element counts."""

    name: str
    """Tensor name, e.g. `w13` (gate+up) or `w2` (down)."""
    shape: list[PositiveInt] = Field(min_length=1)
    """Logical element counts (values, not packed bytes), e.g. [4608, 5120]."""
    dtype: Dtype
    """Storage format; block-scaled formats add their scale bytes (mxfp4: 1 ue8m0 byte per 32 values)."""
    scale: ScaleLayout | None = None
    """Explicit scale layout (FP8 with 128×128 fp32 block scales, int4 with group scales); replaces
    the format's own block (mxfp4/nvfp4). Omitted for fp8: a per-tensor scale, not counted."""
    kind: Literal["weight", "bias", "scale"] = "weight"
    """`bias` for a per-expert bias vector (gpt-oss: `gate_up_proj_bias`, `down_proj_bias`); `scale`
    for per-expert scalars vLLM allocates beside the weights (ModelOpt NVFP4's fp32 global and
    input scales; compressed-tensors int4's `weight_shape`)."""

    @model_validator(mode="after")
    def _check_scale(self) -> ExpertTensor:
        if self.dtype == "int4" and self.scale is None:
            raise PathError("int4 values need their scale layout (e.g. {dtype: bf16, block: [32]})",
                            ("scale",))
        if self.scale is not None and len(self.scale.block) > len(self.shape):
            raise PathError(f"scale block {self.scale.block} has more dimensions than shape {self.shape}",
                            ("scale", "block"))
        return self

    def num_bytes(self) -> Fraction:
        numel = 1
        for dim in self.shape:
            numel *= dim
        bits, block, scale_bytes = DTYPE_STORAGE[self.dtype]
        total = Fraction(numel * bits, 8)
        if self.scale is not None:
            total += self.scale.count(list(self.shape)) * SCALE_BYTES[self.scale.dtype]
        elif block:
            total += -(-numel // block) * scale_bytes
        return total

    def scale_bytes(self) -> int:
        """Bytes of this tensor's scales alone."""
        numel = 1
        for dim in self.shape:
            numel *= dim
        _, block, per = DTYPE_STORAGE[self.dtype]
        if self.scale is not None:
            return self.scale.count(list(self.shape)) * SCALE_BYTES[self.scale.dtype]
        return -(-numel // block) * per if block else 0


class AttentionLayers(StrictModel):
    """Decoder layers that share one attention kind, and what each caches per token.

    `full`: grouped-query (or multi-head) attention over the whole sequence — K and V of
    `kv_heads` heads of `head_dim`. `sliding`: the same, but each sequence keeps only the last
    `window` tokens. `chunked`: Llama-4's chunked local attention — each sequence keeps the
    current `chunk` of tokens (plus those in flight). `mla`: multi-head latent attention
    (DeepSeek-V3 style) — one compressed latent of `kv_lora_rank` + `rope_head_dim` per token, the
    same on every tensor-parallel rank; with `index_head_dim` (DeepSeek sparse attention) each
    layer also caches the indexer's key: `index_head_dim` fp8 values and one fp32 scale per 128.
    """

    kind: Literal["full", "sliding", "chunked", "mla"]
    """Attention kind of these layers."""
    layers: list[NonNegativeInt] = Field(min_length=1)
    """Decoder layer indices (`"0-35"` ranges accepted)."""
    kv_heads: PositiveInt | None = None
    """KV heads (config.json `num_key_value_heads`); full, sliding and chunked layers."""
    head_dim: PositiveInt | None = None
    """Per-head dimension of K and V (config.json `head_dim`); full, sliding and chunked layers."""
    window: PositiveInt | None = None
    """Sliding window in tokens (config.json `sliding_window`); sliding layers."""
    chunk: PositiveInt | None = None
    """Attention chunk in tokens (config.json `attention_chunk_size`); chunked layers."""
    kv_lora_rank: PositiveInt | None = None
    """MLA latent width (config.json `kv_lora_rank`)."""
    rope_head_dim: PositiveInt | None = None
    """MLA decoupled RoPE key width cached beside the latent (config.json `qk_rope_head_dim`)."""
    index_head_dim: PositiveInt | None = None
    """DeepSeek sparse attention's indexer key width (config.json `index_head_dim`); MLA layers. vLLM
    caches it as uint8: the fp8 values plus one fp32 scale per 128 (vLLM 0.33
    vllm/models/deepseek_v32/attention.py:95-100), whatever `--kv-cache-dtype` says."""
    index_topk: PositiveInt | None = None
    """DeepSeek sparse attention: tokens the indexer selects for each query token (config.json
    `index_topk`; vLLM 0.33 vllm/models/deepseek_v32/attention.py:65); the decode estimate reads
    the latent KV of at most this many tokens per query token. MLA layers with `index_head_dim`."""
    kv_dtype: Literal["bf16", "fp16", "fp8", "fp32"] = "bf16"
    """KV cache element type (vLLM `--kv-cache-dtype`; `auto` is the model dtype, or FP8 where the
    checkpoint's ModelOpt config asks for it)."""

    @field_validator("layers", mode="before")
    @classmethod
    def _expand_ranges(cls, value: Any) -> Any:
        return expand_index_ranges(value)

    @model_validator(mode="after")
    def _check(self) -> AttentionLayers:
        need = {"full": ("kv_heads", "head_dim"), "sliding": ("kv_heads", "head_dim", "window"),
                "chunked": ("kv_heads", "head_dim", "chunk"), "mla": ("kv_lora_rank", "rope_head_dim")}[self.kind]
        for name in need:
            if getattr(self, name) is None:
                raise PathError(f"{self.kind} attention needs {name}", (name,))
        other = {"kv_heads", "head_dim", "window", "chunk", "kv_lora_rank", "rope_head_dim"} - set(need)
        if self.kind != "mla":
            other.update({"index_head_dim", "index_topk"})
        for name in sorted(other):
            if getattr(self, name) is not None:
                raise PathError(f"{name} does not apply to {self.kind} attention", (name,))
        if self.index_topk is not None and self.index_head_dim is None:
            raise PathError("index_topk needs index_head_dim (a sparse-attention indexer)", ("index_topk",))
        if self.index_head_dim is not None and self.index_head_dim % 128:
            raise PathError(f"index_head_dim {self.index_head_dim}: the indexer cache holds one scale per 128 values",
                            ("index_head_dim",))
        return self

    def kv_heads_per_rank(self, tp: int) -> int:
        """vLLM 0.33 `ModelConfig.get_num_kv_heads` (vllm/config/model.py:1673-1683): MLA caches one
        latent "head" on every rank; otherwise max(1, kv_heads // tp) — heads are replicated when
        tensor parallelism exceeds them."""
        if self.kind == "mla":
            return 1
        assert self.kv_heads is not None
        return max(1, self.kv_heads // tp)

    def indexer_bytes_per_token(self) -> int:
        """The sparse-attention indexer's cache per token per layer (every rank): d + d / 128 × 4."""
        return 0 if self.index_head_dim is None else self.index_head_dim + self.index_head_dim // 128 * 4

    def bytes_per_token_per_layer(self, tp: int = 1) -> int:
        """KV bytes one layer caches per token on one tensor-parallel rank."""
        size = KV_DTYPE_BYTES[self.kv_dtype]
        if self.kind == "mla":
            assert self.kv_lora_rank is not None and self.rope_head_dim is not None
            return (self.kv_lora_rank + self.rope_head_dim) * size + self.indexer_bytes_per_token()
        assert self.head_dim is not None
        return 2 * self.kv_heads_per_rank(tp) * self.head_dim * size


def kv_bytes_per_token(groups: Iterable[AttentionLayers], tp: int = 1) -> int:
    """Σ over the groups' layers of the KV bytes one layer caches per token on one rank (sliding
    layers uncapped): the one sum of the model entry, the importer and a pipeline stage."""
    return sum(len(g.layers) * g.bytes_per_token_per_layer(tp) for g in groups)


STATE_DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}


class StateLayers(StrictModel):
    """Decoder layers that keep a fixed state per sequence instead of KV per token.

    `gdn`: Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): a convolution state of
    (conv_kernel − 1) × (2 · num_k_heads · head_k_dim + num_v_heads · head_v_dim) and a recurrent
    state of num_v_heads × head_v_dim × head_k_dim. `mamba2`: Mamba-2 (Nemotron-H): a convolution
    state of (conv_kernel − 1) × (num_heads · head_dim + 2 · n_groups · state_size) and an SSM state
    of num_heads × head_dim × state_size. Shapes and their split over tensor-parallel ranks are
    vLLM 0.33's `MambaStateShapeCalculator` (vllm/model_executor/layers/mamba/mamba_utils.py:186-212,
    :261-294); every rank holds 1/tp of the heads and channels.
    """

    kind: Literal["gdn", "mamba2"]
    """State kind of these layers."""
    layers: list[NonNegativeInt] = Field(min_length=1)
    """Decoder layer indices (`"0-35"` ranges accepted)."""
    conv_kernel: PositiveInt
    """Convolution width (config.json `linear_conv_kernel_dim` / `conv_kernel`)."""
    num_k_heads: PositiveInt | None = None
    """Gated DeltaNet key heads (config.json `linear_num_key_heads`)."""
    num_v_heads: PositiveInt | None = None
    """Gated DeltaNet value heads (config.json `linear_num_value_heads`)."""
    head_k_dim: PositiveInt | None = None
    """Gated DeltaNet key head width (config.json `linear_key_head_dim`)."""
    head_v_dim: PositiveInt | None = None
    """Gated DeltaNet value head width (config.json `linear_value_head_dim`)."""
    num_heads: PositiveInt | None = None
    """Mamba-2 heads (config.json `mamba_num_heads`)."""
    head_dim: PositiveInt | None = None
    """Mamba-2 head width (config.json `mamba_head_dim`)."""
    n_groups: PositiveInt | None = None
    """Mamba-2 B/C groups (config.json `n_groups`)."""
    state_size: PositiveInt | None = None
    """Mamba-2 state width (config.json `ssm_state_size`)."""
    conv_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    """Convolution state dtype (vLLM `--mamba-cache-dtype`; the model dtype by default)."""
    ssm_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    """Recurrent / SSM state dtype (vLLM `--mamba-ssm-cache-dtype`; by default the conv dtype, or what
    the model's config asks: Qwen3.5 `mamba_ssm_dtype`, Nemotron-H `mamba_ssm_cache_dtype` / fp32)."""

    @field_validator("layers", mode="before")
    @classmethod
    def _expand_ranges(cls, value: Any) -> Any:
        return expand_index_ranges(value)

    @model_validator(mode="after")
    def _check(self) -> StateLayers:
        need = {"gdn": ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"),
                "mamba2": ("num_heads", "head_dim", "n_groups", "state_size")}[self.kind]
        for name in need:
            if getattr(self, name) is None:
                raise PathError(f"{self.kind} state needs {name}", (name,))
        other = {"num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "num_heads", "head_dim", "n_groups",
                 "state_size"} - set(need)
        for name in sorted(other):
            if getattr(self, name) is not None:
                raise PathError(f"{name} does not apply to {self.kind} state", (name,))
        return self

    def split_reason(self, tp: int) -> str | None:
        """Why vLLM cannot split this state over `tp` ranks (its `divide` asserts), or None."""
        conv, heads = self.conv_channels(1), self.state_heads()
        if heads % tp:
            return f"{heads} state heads do not split over tensor-parallel size {tp}"
        if self.kind == "mamba2":
            assert self.n_groups is not None and self.head_dim is not None and self.state_size is not None
            groups = self.n_groups + (0 if self.n_groups % tp == 0 else tp - self.n_groups)
            conv = self.num_heads * self.head_dim + 2 * groups * self.state_size  # type: ignore[operator]
        if conv % tp:
            return f"{conv} convolution channels do not split over tensor-parallel size {tp}"
        return None

    def state_heads(self) -> int:
        return (self.num_v_heads if self.kind == "gdn" else self.num_heads) or 0

    def conv_channels(self, tp: int) -> int:
        """Convolution channels on one rank (Mamba-2 widens n_groups to a multiple of tp first,
        `extra_groups_for_head_shards`, mamba_utils.py:261-270)."""
        if self.kind == "gdn":
            assert self.num_k_heads and self.head_k_dim and self.num_v_heads and self.head_v_dim
            return (2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim) // tp
        assert self.num_heads and self.head_dim and self.n_groups and self.state_size
        groups = self.n_groups + (0 if self.n_groups % tp == 0 else tp - self.n_groups)
        return (self.num_heads * self.head_dim + 2 * groups * self.state_size) // tp

    def state_parts(self, tp: int = 1, spec_tokens: int = 0) -> tuple[int, int, int, int]:
        """One layer's state per sequence on one rank, in its parts: (conv channels, state heads, conv
        bytes, SSM bytes). Conv: (kernel − 1 + spec) × channels × conv dtype; SSM: heads // tp × the
        recurrent matrix (Gated DeltaNet head_v_dim × head_k_dim, Mamba-2 head_dim × state_size) × SSM
        dtype (vLLM 0.33 model_executor/layers/mamba/mamba_utils.py:186-212, :272-294)."""
        channels, heads = self.conv_channels(tp), self.state_heads() // tp
        conv = (self.conv_kernel - 1 + spec_tokens) * channels * STATE_DTYPE_BYTES[self.conv_dtype]
        if self.kind == "gdn":
            assert self.head_v_dim and self.head_k_dim
            matrix = self.head_v_dim * self.head_k_dim
        else:
            assert self.head_dim and self.state_size
            matrix = self.head_dim * self.state_size
        return channels, heads, conv, heads * matrix * STATE_DTYPE_BYTES[self.ssm_dtype]

    def bytes_per_sequence_per_layer(self, tp: int = 1, spec_tokens: int = 0) -> int:
        """State bytes one layer holds per sequence on one rank: conv plus SSM (`state_parts`; vLLM's
        `MambaSpec.page_size_bytes` before padding)."""
        _, _, conv, ssm = self.state_parts(tp, spec_tokens)
        return conv + ssm


class DecoderLayerBytes(StrictModel):
    """Non-routed bytes of one decoder layer, as vLLM's `--cpu-offload-gb` walk meets them: it
    offloads each decoder layer's parameters in order (attention first, then the MLP), dense
    parameters included (vllm/model_executor/offloader/uva.py:74-125)."""

    moe_layer: Bytes
    """Attention, norms, router and shared experts of one MoE decoder layer (walked before its
    routed experts: an approximation of the parameter order inside the layer)."""
    dense_layer: Bytes | None = None
    """One dense (non-MoE) decoder layer: attention, norms and its MLP."""
    layers: list[Bytes] | None = None
    """Every decoder layer's non-routed bytes in order, where layers differ (hybrid models: a Mamba-2
    layer, an attention layer and an MoE layer each hold different tensors); the walk uses it
    instead of `moe_layer` / `dense_layer`."""


class DenseTensorParallel(StrictModel):
    """How vLLM 0.33 lays the non-routed weights (`dense_bytes`) over tensor-parallel ranks.

    The rest of `dense_bytes` (column/row-parallel linears: attention q/o, MLA q_b/kv_b/o, shared
    experts, dense MLP layers; the vocab-parallel embeddings and LM head) is split evenly over the
    ranks (`vllm/model_executor/layers/linear.py`, `vocab_parallel_embedding.py`)."""

    replicated: Bytes
    """Bytes every rank holds whole: norms, routers (`GateLinear` is a `ReplicatedLinear`,
    `layers/fused_moe/router/gate_linear.py:22`), MLA's q_a/kv_a projections and their norms
    (`DeepSeekV2FusedQkvAProjLinear(disable_tp=True)`, `models/deepseek_v2.py:953-968`;
    `kv_a_proj_with_mqa = ReplicatedLinear`, `:518`), row-parallel biases."""
    kv_projections: Bytes = Field(default=0, validate_default=False)
    """GQA k/v projection bytes over all `kv_heads` heads (weights, scales, biases): each rank holds
    max(1, kv_heads // tp) heads of them (`QKVParallelLinear` replicates KV heads when TP exceeds
    them, `layers/linear.py`)."""
    kv_heads: PositiveInt | None = None
    """The k/v projections' head count (given with `kv_projections`)."""


class Activation(StrictModel):
    """The routed experts' activation (vLLM `MoEActivation`)."""

    kind: Literal["silu", "swigluoai", "relu2_no_mul"] = "silu"
    """`silu`: SwiGLU, silu(gate) × up. `swigluoai`: gpt-oss's variant, gate × σ(alpha × gate) ×
    (up + 1) with gate/up clamped (gate/up interleaved in w13). `relu2_no_mul`: relu(x)² of the up
    projection alone, no gate (Nemotron-H; vLLM 0.33 `MoEActivation.RELU2_NO_MUL`,
    vllm/model_executor/layers/fused_moe/activation.py:45): the first expert tensor is `w1` [I, H]."""
    alpha: float | None = None
    """swigluoai alpha (gpt-oss: 1.702, set by vLLM, vllm/model_executor/layers/quantization/mxfp4.py:428)."""
    limit: float | None = None
    """Clamp limit (config.json `swiglu_limit`: gpt-oss 7.0; DeepSeek-V4 style clamped silu)."""


class HostTable(StrictModel):
    """A table that lives in host memory for the whole run (e.g. an Engram table)."""

    name: str
    """What the table is."""
    bytes: PositiveBytes
    """Its size in host memory."""
    layer: NonNegativeInt | None = None
    """Decoder layer the table belongs to (DeepSeek-V4.1: `engram_layer_ids`); a pipeline stage holds
    the tables of its layers. Unknown: every stage of a multi-node lane counts it (conservative)."""


class Drafter(StrictModel):
    """The speculative-decoding drafter that ships with the checkpoint (DSpark, MTP, …)."""

    method: str
    """vLLM speculative method that runs it (e.g. `dspark`, `mtp`)."""
    weights: Bytes | None = None
    """Its weights in HBM, where known. Part of the measured HBM reserve, never added on top of it."""
    kv_bytes_per_token: Bytes | None = None
    """Its KV cache per token, where known (counted inside the measured KV rate otherwise)."""


class UniqueExperts(StrictModel):
    """Measured unique routed experts touched per layer per decode step."""

    streams: PositiveInt
    """Concurrent streams (batch size) the figure was measured at."""
    k: NonNegativeInt | None = None
    """Speculative tokens per step (None: not recorded / any)."""
    experts_per_layer: PositiveFloat
    """Unique experts touched per MoE layer per step."""


class PositionalOffloadMeasurement(StrictModel):
    """What vLLM's plain `--cpu-offload-gb` actually moved to host, measured on a boot."""

    cpu_offload: PositiveBytes
    """The `--cpu-offload-gb` budget of that boot, written with its unit (`60 GiB`: vLLM reads the
    flag's number as GiB)."""
    offloaded: PositiveBytes
    """Bytes the offloader reported moving (it walks dense parameters too)."""


class Model(StrictModel):
    """A MoE checkpoint: geometry, sizes, and the measured figures the ledger needs."""

    name: str = Field(pattern=FILE_NAME.regex)
    """Catalog name (lowercase, `-`, `.`, `_`)."""
    description: str = ""
    """Free text."""
    architecture: str | None = None
    """vLLM architecture class (config.json `architectures[0]`)."""
    checkpoint: str | None = None
    """Where the engine loads the weights from: a Hugging Face repo id `org/name` (mounted from the
    host's Hugging Face hub cache) or an absolute path on the machine that runs the lane (mounted
    read-only); omitted: `<RECIPEGEN_MODELS_DIR>/<name>` (default `/srv/models/<name>`). A relative
    or `~/…` path is refused: Compose would resolve it against the rendered compose folder (or the
    home of whoever runs it), and Kubernetes not at all."""
    revision: str | None = None
    """Checkpoint revision (commit); maps and histograms record it as provenance."""
    decoder_layers: PositiveInt
    """Total decoder layers."""
    moe_layers: list[NonNegativeInt] = Field(min_length=1)
    """Indices of the MoE decoder layers (`"0-39"` ranges accepted). DeepSeek-V4-style models may
    have hash-routed early layers that are not in this list."""
    routed_experts: PositiveInt
    """Routed experts per MoE layer."""
    top_k: PositiveInt
    """Routed experts picked per token per layer."""
    shared_experts: NonNegativeInt | None = None
    """Shared experts per MoE layer, where known (always in HBM; counted in the dense bytes)."""
    hidden_size: PositiveInt | None = None
    """Model width (config.json `hidden_size`), where known; vLLM's layout padding needs it."""
    attention_heads: PositiveInt | None = None
    """Query attention heads (config.json `num_attention_heads`), where known: vLLM 0.33 refuses a
    tensor-parallel size that does not divide them (vllm/config/model.py:1559-1564)."""
    moe_intermediate_size: PositiveInt | None = None
    """Routed expert intermediate width (config.json `moe_intermediate_size` or `intermediate_size`)."""
    activation: Activation | None = None
    """The routed experts' activation; omitted: SwiGLU (silu), unclamped."""
    max_position_embeddings: PositiveInt | None = None
    """Longest context the checkpoint declares (config.json `max_position_embeddings`); vLLM refuses a
    longer `max_model_len` unless `VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`."""
    expert_tensors: list[ExpertTensor] | None = None
    """Per-expert tensors (logical shapes + dtype); bytes per expert is derived from them."""
    bytes_per_expert: PositiveBytes | None = None
    """Bytes of one routed expert (weights + scales). Derived from `expert_tensors` when omitted;
    when both are given they must agree."""
    dense_bytes: Bytes | None = None
    """Non-routed weights resident in HBM (attention, shared experts, embeddings)."""
    dense_tensor_parallel: DenseTensorParallel | None = None
    """Which part of `dense_bytes` vLLM replicates on every tensor-parallel rank (the rest is split
    evenly); omitted: the ledger splits all of `dense_bytes` evenly (a lower bound per GPU)."""
    decoder_layer_bytes: DecoderLayerBytes | None = None
    """Non-routed bytes per decoder layer, for vLLM's positional offload walk (which offloads
    dense parameters too); omitted: the walk counts routed experts only."""
    total_bytes: Bytes | None = None
    """Whole checkpoint size, for reference."""
    host_tables: list[HostTable] = []
    """Tables that always live in host memory (e.g. two Engram tables)."""
    attention: list[AttentionLayers] = []
    """Attention kind per decoder layer (full, sliding window, chunked, MLA) with what each caches
    per token; the ledger derives KV bytes per token per tensor-parallel rank from it (heads
    replicated when TP exceeds them, MLA latents on every rank, sliding and chunked layers capped
    per sequence). When given, the groups (with `state` and `cacheless_layers`) cover every
    decoder layer once."""
    state: list[StateLayers] = []
    """Layers that keep a fixed state per sequence instead of KV per token (Gated DeltaNet, Mamba-2);
    the ledger sizes the KV pool in sequences and tokens as vLLM shares it between them and the
    attention layers."""
    cacheless_layers: list[NonNegativeInt] = []
    """Decoder layers with neither attention nor state (Nemotron-H's MoE and MLP layers)."""
    encoder_bytes: Bytes | None = None
    """Of `dense_bytes`: the vision tower and projector, which vLLM does not load when every
    modality limit is 0 (`--language-model-only`)."""
    state_bytes_per_sequence: Bytes | None = None
    """State bytes per sequence, all state layers, one rank, before vLLM pads it to an attention
    page (derived from `state`; if given, must agree)."""
    kv_bytes_per_token: PositiveBytes | None = None
    """KV cache bytes per token, all layers, one rank (give this, `kv_tokens_per_gib`, or
    `attention`; with `attention` it is derived and, if given, must agree)."""
    kv_tokens_per_gib: ScaledNumber | None = None
    """KV tokens per GiB of pool, as measured (e.g. `0.518M`)."""
    drafter: Drafter | None = None
    """The bundled drafter, if any."""
    unique_experts: list[UniqueExperts] = []
    """Measured unique experts per layer per step, by streams and k."""
    positional_offload: list[PositionalOffloadMeasurement] = []
    """Measured results of vLLM's positional `--cpu-offload-gb` on this model."""
    positional_cold_pick_share: list[Annotated[float, Field(gt=0, lt=1)]] = []
    """Measured share of routed picks that land on host-resident experts under positional offload
    (each with its source; the field reports quote ~23% and 24%)."""
    sources: dict[str, str] = {}
    """Where each figure comes from, by field path (filled from `{value, source}` figures)."""

    @model_validator(mode="before")
    @classmethod
    def _split_sources(cls, data: Any) -> Any:
        return lift_sources(data)

    @field_validator("moe_layers", mode="before")
    @classmethod
    def _expand_ranges(cls, value: Any) -> Any:
        return expand_index_ranges(value)

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint(cls, value: str | None) -> str | None:
        # the rendering mounts a repo id or an absolute path (render.services._model_source);
        # anything else would be resolved by Compose against the compose folder
        problem = checkpoint_refusal(value) if value is not None else None
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _check(self) -> Model:
        if self.moe_layers != sorted(set(self.moe_layers)):
            raise PathError("MoE layer indices must be unique and ascending", ("moe_layers",))
        if self.moe_layers[-1] >= self.decoder_layers:
            raise PathError(f"MoE layer index {self.moe_layers[-1]} is outside the model's "
                            f"{self.decoder_layers} decoder layers", ("moe_layers",))
        if self.top_k > self.routed_experts:
            raise PathError(f"top_k {self.top_k} exceeds routed_experts {self.routed_experts}", ("top_k",))
        if self.expert_tensors is None and self.bytes_per_expert is None:
            raise PathError("give expert_tensors (shapes + dtype) or bytes_per_expert", ("bytes_per_expert",))
        if self.expert_tensors is not None:
            derived = sum((t.num_bytes() for t in self.expert_tensors), Fraction(0))
            if derived.denominator != 1:
                raise PathError(f"expert tensors give a fractional byte count ({float(derived)})",
                                ("expert_tensors",))
            if self.bytes_per_expert is not None and self.bytes_per_expert != int(derived):
                raise PathError(f"bytes_per_expert {self.bytes_per_expert} disagrees with the "
                                f"{int(derived)} bytes derived from expert_tensors", ("bytes_per_expert",))
            self.bytes_per_expert = int(derived)
        if self.dense_tensor_parallel is not None:
            self._check_dense_tp()
        if (self.state or self.cacheless_layers) and not self.attention:
            raise PathError("state / cacheless_layers describe the layers beside attention: give attention too",
                            ("attention",))
        if self.encoder_bytes is not None and (self.dense_bytes is None or self.encoder_bytes > self.dense_bytes):
            raise PathError("encoder_bytes is part of dense_bytes: give dense_bytes at least as large",
                            ("encoder_bytes",))
        if self.decoder_layer_bytes is not None and self.decoder_layer_bytes.layers is not None \
                and len(self.decoder_layer_bytes.layers) != self.decoder_layers:
            raise PathError(f"{len(self.decoder_layer_bytes.layers)} entries for {self.decoder_layers} decoder layers",
                            ("decoder_layer_bytes", "layers"))
        if self.attention:
            self._check_attention()
        elif (self.kv_bytes_per_token is None) == (self.kv_tokens_per_gib is None):
            raise PathError("give exactly one of kv_bytes_per_token and kv_tokens_per_gib (or attention)",
                            ("kv_bytes_per_token",))
        return self

    def _check_dense_tp(self) -> None:
        part = self.dense_tensor_parallel
        assert part is not None
        if self.dense_bytes is None:
            raise PathError("dense_tensor_parallel splits dense_bytes: give dense_bytes too",
                            ("dense_tensor_parallel",))
        if part.replicated + part.kv_projections > self.dense_bytes:
            raise PathError(f"replicated + kv_projections ({part.replicated + part.kv_projections:,} B) exceed "
                            f"dense_bytes ({self.dense_bytes:,} B) they are part of", ("dense_tensor_parallel",))
        if (part.kv_projections > 0) != (part.kv_heads is not None):
            raise PathError("give kv_heads exactly when kv_projections > 0", ("dense_tensor_parallel", "kv_heads"))

    def _check_attention(self) -> None:
        seen: dict[int, str] = {}
        owners: list[tuple[str, int, list[int]]] = [("attention", i, g.layers) for i, g in enumerate(self.attention)]
        owners += [("state", i, g.layers) for i, g in enumerate(self.state)]
        owners += [("cacheless_layers", -1, self.cacheless_layers)] if self.cacheless_layers else []
        for field_name, i, layers in owners:
            where: tuple[Any, ...] = (field_name,) if i < 0 else (field_name, i, "layers")
            name = field_name if i < 0 else f"{field_name}[{i}]"
            for layer in layers:
                if layer >= self.decoder_layers:
                    raise PathError(f"layer {layer} is outside the model's {self.decoder_layers} decoder "
                                    "layers", where)
                if layer in seen:
                    raise PathError(f"layer {layer} is in {seen[layer]} and {name}", where)
                seen[layer] = name
        missing = [n for n in range(self.decoder_layers) if n not in seen]
        if missing:
            raise PathError(f"attention groups leave decoder layers {_ranges(missing)} out"
                            + (" (state layers and cacheless_layers count too)" if self.state else ""),
                            ("attention",))
        if self.state:
            derived_state = sum(len(g.layers) * g.bytes_per_sequence_per_layer(1) for g in self.state)
            if self.state_bytes_per_sequence is not None and self.state_bytes_per_sequence != derived_state:
                raise PathError(f"state_bytes_per_sequence {self.state_bytes_per_sequence} disagrees with the "
                                f"{derived_state} bytes derived from state (one rank)", ("state_bytes_per_sequence",))
            self.state_bytes_per_sequence = derived_state
        if self.kv_tokens_per_gib is not None:
            raise PathError("kv_tokens_per_gib is measured; with attention the rate is derived — give one",
                            ("kv_tokens_per_gib",))
        derived = self.kv_bytes_per_token_derived(1)
        if self.kv_bytes_per_token is not None and self.kv_bytes_per_token != derived:
            raise PathError(f"kv_bytes_per_token {self.kv_bytes_per_token} disagrees with the {derived} "
                            "bytes derived from attention (all layers, one rank)", ("kv_bytes_per_token",))
        self.kv_bytes_per_token = derived

    def kv_bytes_per_token_derived(self, tp: int) -> int:
        """Σ over decoder layers of KV bytes per token on one rank (sliding layers uncapped)."""
        return kv_bytes_per_token(self.attention, tp)

    # --- derived figures (the ledger cites these by name) ---
    @property
    def expert_bytes(self) -> int:
        """Bytes of one routed expert (declared or derived)."""
        assert self.bytes_per_expert is not None
        return self.bytes_per_expert

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layers)

    @property
    def routed_expert_bytes(self) -> int:
        """Bytes of every routed expert of every MoE layer (one copy, unsharded)."""
        return self.num_moe_layers * self.routed_experts * self.expert_bytes

    @property
    def kv_token_bytes(self) -> float:
        """KV bytes per token, from either declared form."""
        if self.kv_bytes_per_token is not None:
            return float(self.kv_bytes_per_token)
        assert self.kv_tokens_per_gib is not None
        return GiB / self.kv_tokens_per_gib

    @property
    def host_table_bytes(self) -> int:
        return sum(t.bytes for t in self.host_tables)

    @property
    def expert_biases(self) -> bool:
        """Whether routed experts carry bias vectors."""
        return any(t.kind == "bias" for t in self.expert_tensors or [])

    @property
    def expert_format(self) -> str | None:
        """The routed experts' weight format (dtype of their weight tensors, with `-block` when FP8
        carries block scales, `-group` for int4 groups), or None without declared tensors."""
        weights = [t for t in self.expert_tensors or [] if t.kind == "weight"]
        if not weights:
            return None
        t = weights[0]
        if t.dtype == "fp8" and t.scale is not None:
            return "fp8-block"
        return t.dtype


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out: list[str] = []
    start = prev = values[0]
    for v in values[1:] + [None]:  # type: ignore[list-item]
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(out)


MAX_LAYER_INDICES = 65_536
_ASCII_INT = re.compile(r"[0-9]{1,9}")  # ASCII digits (str.isdigit() takes any script's digits)


def expand_index_ranges(value: Any) -> Any:
    """`"0-39"`, `[0, "3-5"]` -> list of ints; other shapes pass through for pydantic to reject."""
    items = value if isinstance(value, list) else [value] if isinstance(value, str) else None
    if items is None:
        return value
    out: list[Any] = []
    for item in items:
        if isinstance(item, str):
            for part in item.split(","):
                part = part.strip()
                if "-" in part[1:]:
                    lo, hi = part.split("-", 1)
                    if not (_ASCII_INT.fullmatch(lo.strip()) and _ASCII_INT.fullmatch(hi.strip())) \
                            or int(hi) < int(lo):
                        raise ValueError(f"cannot read layer range {part!r} (e.g. '0-39')")
                    if len(out) + int(hi) - int(lo) + 1 > MAX_LAYER_INDICES:
                        # bounded before expanding: '0-300000000' would allocate gigabytes
                        raise ValueError(f"more than {MAX_LAYER_INDICES} layers")
                    out.extend(range(int(lo), int(hi) + 1))
                elif _ASCII_INT.fullmatch(part):
                    out.append(int(part))
                else:
                    raise ValueError(f"cannot read layer index {part!r}")
        else:
            out.append(item)
    return out
