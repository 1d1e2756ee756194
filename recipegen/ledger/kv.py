"""KV cache per sequence and per token, from the model's attention (and state) layers, as vLLM 0.33
sizes it on one tensor-parallel rank.

Attention, per rank and layer: full / sliding / chunked 2 × max(1, kv_heads // tp) × head_dim ×
dtype bytes per token (heads replicated when TP exceeds them: vllm/config/model.py:1673-1683),
MLA (kv_lora_rank + rope_head_dim) × dtype bytes on every rank, plus DeepSeek sparse attention's
indexer key. A max_model_len sequence holds every token in full and MLA layers, at most `window`
tokens in a sliding layer (vLLM frees the blocks behind the window:
vllm/v1/kv_cache_interface.py:918-944, which also keeps the tokens in flight during a prefill
chunk — not counted here) and at most `chunk` + the tokens in flight in a chunked layer
(`ChunkedLocalAttentionSpec`, :861-888: min(chunk + max_num_batched_tokens, max_model_len)).

`--kv-cache-dtype` values that are not a plain element type (vllm/config/cache.py:44-67) are
packed by the attention backend that serves them: vLLM 0.33 builds each layer's page from the
spec's head slots × bytes per slot (v1/kv_cache_interface.py:579-594), and the backend sets both
(`customize_spec`, applied to every attention layer: v1/worker/gpu_model_runner.py:7109-7113).
`lane_attention` is the one place those bytes are worked out; where vLLM has no backend for the
value on the lane's GPUs and model, the lane is refused (`kv_cache_refusal`).

`--kv-cache-dtype-skip-layers` keeps the attention layers it names at "auto", the model's dtype
(model_executor/layers/attention/attention.py:299-315; MLA: mla_attention.py:494-500), the rest at
the cache dtype: `lane_attention` splits each group by it (`skip_layers`, `AttentionPart`).

State layers (Gated DeltaNet, Mamba-2) hold a fixed state per sequence; vLLM then lays the
attention and state layers out in one pool of equal pages (`kv_state`), and a sequence costs
what that layout gives. The lane's rate is the sequence's bytes ÷ max_model_len × tp, so the
pool in tokens is pool ÷ (rate / tp) and in sequences pool ÷ bytes per sequence per GPU.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from recipegen.common.units import GiB
from recipegen.ledger.figures import Figure
from recipegen.ledger.flags import flag_value, flag_values
from recipegen.ledger.kv_state import KERNEL_BLOCK, KeptLayers, StatePool, state_pool, state_pool_figures
from recipegen.ledger.result import Violation, src_note
from recipegen.ledger.workspace import max_num_batched_tokens
from recipegen.schema import Lane, Machine, Model
from recipegen.schema.model import AttentionLayers
from recipegen.vllm_flags.moe_backend import parse_cc

# vLLM 0.33 `--kv-cache-dtype` values (vllm/config/cache.py:44-67) whose element size is plain.
KV_CACHE_DTYPES: dict[str, str] = {"float16": "fp16", "bfloat16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8",
                                   "fp8_e5m2": "fp8"}

# DeepSeek sparse attention (an MLA group with an indexer): vLLM 0.33 stores the cache as its
# attention backend asks (vllm/platforms/cuda.py:83-155 picks it; mla_attention.py:359-376 maps the
# dtype). `fp8_ds_mla` is, per token and layer, 512 fp8 latent values, 4 fp32 scales and 64 bf16
# RoPE values: what FLASHMLA_SPARSE stores for the quantized caches it lists, `fp8` and
# `fp8_ds_mla` (v1/attention/backends/mla/flashmla_sparse.py:149-155) — on Hopper the first sparse
# backend that takes fp8 (platforms/cuda.py:139-154: FLASH_ATTN_MLA_SPARSE, which lists no fp8
# cache, then FLASHMLA_SPARSE, then FLASHINFER_MLA_SPARSE_SM90). `fp8_e4m3` is not on its list, so
# on Hopper it falls to FLASHINFER_MLA_SPARSE_SM90 (flashinfer_mla_sparse_sm90.py:148-153), which
# stores plain fp8 — and `fp8_e4m3` is what vLLM turns a checkpoint's FP8 KV scheme into under
# `auto` (utils/torch_utils.py:78-80, 498-513, engine/arg_utils.py:2296-2299). SM120's only sparse
# backend, FLASHINFER_MLA_SPARSE_SM120, stores fp8_ds_mla for auto, fp8 and fp8_e4m3 alike — a
# bf16 model's cache included (flashinfer_mla_sparse_sm120.py:64-67 refuses any other). On the
# SM100 family vLLM prefers FLASHINFER_MLA_SPARSE for an fp8 cache, which stores plain fp8. Before
# SM90 no sparse MLA backend exists.
FP8_DS_MLA_BYTES = 512 + 4 * 4 + 64 * 2
# `--kv-cache-dtype fp8_ds_mla` named outright: FLASHMLA_SPARSE lists it (v1/attention/backends/mla/
# flashmla_sparse.py:149-155, compute capability 9.x or 10.x: :202-204) — on the SM100 family too,
# where FLASHINFER_MLA_SPARSE, ahead of it, refuses the name (flashinfer_mla_sparse.py:84-90,
# :134-135) — and so does SM120's backend (flashinfer_mla_sparse.py:168-173, :218-225).
# `nvfp4_ds_mla`: 512 fp4 (e2m1) latent values packed two a byte (256 B), 64 fp8 RoPE values and 32
# fp8 scales, one per 16 latent values: 352 B per token and layer (flashmla_sparse.py:111-122; the
# spec's bytes: model_executor/layers/attention/mla_attention.py:1383-1388). Only FLASHMLA_SPARSE
# lists it (flashmla_sparse.py:154), and only on compute capability 10.x (:250-254).
NVFP4_DS_MLA_BYTES = 512 // 2 + 64 + 512 // 16
DS_MLA_BYTES = {"fp8_ds_mla": FP8_DS_MLA_BYTES, "nvfp4_ds_mla": NVFP4_DS_MLA_BYTES}
SM120_DS_MLA_FLAGS = (None, "auto", "fp8", "fp8_e4m3", "fp8_ds_mla")

# TurboQuant (non-MLA attention only): each KV head's key and value share one slot per token
# (v1/attention/backends/turboquant_attn.py:140-153: state_content_bytes = slot_size_aligned, one
# slot per KV head). Key: fp8, head_dim bytes, for 8 key bits; else ⌈head_dim × bits / 8⌉ + a 2 B
# fp16 norm. Value: ⌈head_dim × bits / 8⌉ + 4 B (fp16 scale and zero point). The slot is rounded
# up to an even size (model_executor/layers/quantization/turboquant/config.py:20-41 the presets'
# bits, :128-175 the sizes). vLLM keeps the first and last n = min(2, layers // 2) decoder layers at
# the model's dtype, none in a model with state layers (config.py:178-213, added to the skip
# layers by engine/arg_utils.py:2334-2351; a skipped layer caches at "auto":
# model_executor/layers/attention/attention.py:299-315).
TURBOQUANT_BITS: dict[str, tuple[int, int]] = {"turboquant_k8v4": (8, 4), "turboquant_4bit_nc": (4, 4),
                                               "turboquant_k3v4_nc": (3, 4), "turboquant_3bit_nc": (3, 3)}
TURBOQUANT_BOUNDARY = 2
# Per-token-head scaling (non-MLA on CUDA: only TRITON_ATTN lists them, v1/attention/backends/
# triton_attn.py:326-336, any compute capability, head_size ≥ 32: :379-380): per KV head, key and
# value of 1-byte values (int4: head_dim // 2 bytes, two values a byte) and one fp32 scale each
# (triton_attn.py:307-319; dtypes int8 / uint8: vllm/utils/torch_utils.py:50-52).
PER_TOKEN_HEAD = ("int8_per_token_head", "fp8_per_token_head", "int4_per_token_head")
# NVFP4 (non-MLA only: config/vllm.py:3422-3438): FlashInfer, the only backend listing them
# (v1/attention/backends/flashinfer.py:573-582), keeps key and value as separate head slots of
# head_dim // 2 bytes of fp4 values + head_dim // 16 fp8 scales, one per 16 values
# (flashinfer.py:557-570, vllm/utils/torch_utils.py:542-544). `nvfp4_4over6` is the same layout
# with a per-block choice of scale (config/cache.py:245-246). On compute capability 8.x, 9.x and
# 12.x FlashInfer takes plain nvfp4 only, not at head size 64 (flashinfer.py:653-658, :679-688); on
# the SM100 family both, given its TRT-LLM kernels (:659-663, vllm/utils/flashinfer.py:675-697).
NVFP4 = ("nvfp4", "nvfp4_4over6")
PACKED = (*TURBOQUANT_BITS, *PER_TOKEN_HEAD, *NVFP4)
# Values no attention backend that vLLM 0.33 picks on NVIDIA GPUs stores: the candidates are
# FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION and TURBOQUANT, or the MLA backends
# (platforms/cuda.py:84-181), and none lists these.
NO_CUDA_BACKEND: dict[str, str] = {
    "fp8_inc": "Intel Gaudi's fp8 cache (config/cache.py:241)",
    "octave_k3v4": "the ROCm backend ROCM_OCTAVE's format (v1/attention/backends/rocm_octave_attn.py:95-99)",
    "octave_k3v3": "the ROCm backend ROCM_OCTAVE's format (v1/attention/backends/rocm_octave_attn.py:95-99)",
    "octave_k3v3_compact": "the ROCm backend ROCM_OCTAVE's format (v1/attention/backends/rocm_octave_attn.py:95-99)",
    "ultraquant_4bit": "the ULTRAQUANT backend's format (v1/attention/backends/ultraquant_attn.py:71)",
}
# Every value vLLM 0.33 accepts (config/cache.py:44-67), "auto" aside.
VLLM_CACHE_DTYPES = (*KV_CACHE_DTYPES, *DS_MLA_BYTES, *PACKED, *NO_CUDA_BACKEND)
# FlashInfer's head sizes (flashinfer.py:690-693) and compute capabilities (:695-704).
FLASHINFER_HEAD_SIZES = (64, 128, 256, 512)

# vLLM 0.33 starts only when the pool holds ⌈max_model_len / block⌉ whole blocks of every attention layer
# (v1/core/kv_cache_planning.py:66-86, v1/kv_cache_interface.py:643-648). A block is 16 tokens on most
# attention backends (kv_state.KERNEL_BLOCK) and at most 128 (CUTLASS MLA,
# v1/attention/backends/mla/cutlass_mla.py:49-50), or the lane's --block-size: a sequence is counted at
# max_model_len rounded up to that, exact for the largest block, at most 112 tokens high for the smallest.
SEQUENCE_BLOCK = 128


def sequence_block(lane: Lane) -> int:
    """The whole-block rounding of a sequence's tokens (SEQUENCE_BLOCK, or a larger --block-size)."""
    given = flag_value(list(lane.extra_args), "--block-size")
    return max(SEQUENCE_BLOCK, int(given) if given and given.isdigit() else 0)


def sequence_tokens(lane: Lane) -> int:
    """KV tokens one max_model_len sequence takes in vLLM's whole blocks."""
    block = sequence_block(lane)
    return -(-lane.max_model_len // block) * block


def cache_dtype_flag(lane: Lane) -> str | None:
    """The lane's `--kv-cache-dtype`, None for absent or auto."""
    flag = flag_value(list(lane.extra_args), "--kv-cache-dtype")
    return None if flag in (None, "auto") else flag


def turboquant_slot(cache_dtype: str, head_dim: int) -> int:
    """Bytes of one KV head's TurboQuant slot per token: key + value, rounded up to even
    (turboquant/config.py:128-175)."""
    key_bits, value_bits = TURBOQUANT_BITS[cache_dtype]
    key = head_dim if key_bits == 8 else -(-head_dim * key_bits // 8) + 2
    slot = key + -(-head_dim * value_bits // 8) + 4
    return slot + slot % 2


def packed_head_bytes(cache_dtype: str, head_dim: int) -> int:
    """Bytes one KV head caches per token (key and value together) in a packed layout."""
    if cache_dtype in TURBOQUANT_BITS:
        return turboquant_slot(cache_dtype, head_dim)
    if cache_dtype in PER_TOKEN_HEAD:
        side = head_dim // 2 if cache_dtype == "int4_per_token_head" else head_dim
        return 2 * side + 2 * 4
    assert cache_dtype in NVFP4, cache_dtype
    return 2 * (head_dim // 2 + head_dim // 16)


def turboquant_boundary(model: Model) -> list[int]:
    """The decoder layers vLLM 0.33 keeps at the model's dtype under TurboQuant: the first and last
    min(2, layers // 2), none in a model with state layers (turboquant/config.py:178-213)."""
    if model.state:
        return []
    n = min(TURBOQUANT_BOUNDARY, model.decoder_layers // 2)
    return sorted(set(range(n)) | set(range(model.decoder_layers - n, model.decoder_layers))) if n > 0 else []


# `--kv-cache-dtype-skip-layers` (vllm/config/cache.py:282-284; argparse `nargs="+"` of strings,
# engine/arg_utils.py:255-259, 813-816, 1415-1417: space-separated values, no comma splitting). Each
# attention layer compares its decoder-layer index, as a string, with the values; a non-MLA layer
# with a sliding window is also skipped by the value `sliding_window`
# (model_executor/layers/attention/attention.py:299-315; MLA: index only, mla_attention.py:494-500).
# A skipped layer caches at "auto", the model's dtype. vLLM checks the values no further: one that
# names no attention layer (another spelling of a number, "0,47", an index past the last layer)
# skips nothing.
SKIP_FLAG = "--kv-cache-dtype-skip-layers"
SLIDING_WINDOW = "sliding_window"
_LAYER_INDEX = re.compile(r"0|[1-9][0-9]*")      # str(int): the only spelling that matches a layer


@dataclass(frozen=True)
class SkipLayers:
    """The lane's `--kv-cache-dtype-skip-layers` as vLLM 0.33 applies it to the model."""

    values: tuple[str, ...]         # as given
    layers: frozenset[int]          # the attention layers they name (by index or as sliding-window layers)
    ignored: tuple[str, ...]        # values that name no attention layer of the model


def skip_layers(model: Model, lane: Lane) -> SkipLayers:
    """The attention layers the lane's `--kv-cache-dtype-skip-layers` keeps at the model's dtype
    (attention.py:299-315, mla_attention.py:494-500), and the values that name none."""
    values = flag_values(list(lane.extra_args), SKIP_FLAG)
    layers: set[int] = set()
    ignored: list[str] = []
    for value in values:
        if value == SLIDING_WINDOW:
            named = {n for g in model.attention if g.kind == "sliding" for n in g.layers}
        elif _LAYER_INDEX.fullmatch(value):
            named = {int(value)} & {n for g in model.attention for n in g.layers}
        else:
            named = set()
        if not named:
            ignored.append(value)
        layers |= named
    return SkipLayers(tuple(values), frozenset(layers), tuple(ignored))


def kept_layers(model: Model, lane: Lane) -> set[int]:
    """Every attention layer vLLM 0.33 keeps at the model's dtype: the lane's skip list, and under
    TurboQuant its first and last layers, which vLLM merges into that list (engine/arg_utils.py:2334-2351)."""
    kept = set(skip_layers(model, lane).layers)
    if cache_dtype_flag(lane) in TURBOQUANT_BITS:
        kept |= set(turboquant_boundary(model))
    return kept


def kv_cache_refusal(model: Model, machine: Machine, lane: Lane) -> tuple[str, str] | None:
    """Where vLLM 0.33 has no attention backend for the lane's `--kv-cache-dtype` on its GPUs and model
    (its backend choice: platforms/cuda.py:84-181, each candidate checked by
    v1/attention/backend.py:279-369; none left: "No valid attention backend found", cuda.py:471-475):
    (why, what would work). DeepSeek sparse attention's own refusals are `sparse_mla_cache`'s."""
    flag = cache_dtype_flag(lane)
    if flag is None or flag not in VLLM_CACHE_DTYPES:
        return None
    cc = parse_cc(machine.gpus.compute_capability)
    mla = any(g.kind == "mla" for g in model.attention)
    sparse = any(g.index_head_dim for g in model.attention)
    if flag in NO_CUDA_BACKEND:
        return (f"{NO_CUDA_BACKEND[flag]}, which no attention backend vLLM 0.33 picks on NVIDIA GPUs stores "
                "(platforms/cuda.py:84-181)", "--kv-cache-dtype auto or fp8")
    if mla:
        mla_only = ("the MLA backends vLLM 0.33 tries (platforms/cuda.py:96-155) list auto, float16, bfloat16, fp8 and "
                    "fp8_e4m3 at most, the DeepSeek sparse ones also fp8_ds_mla and nvfp4_ds_mla (e.g. "
                    "v1/attention/backends/mla/triton_mla.py:101-107, flashmla_sparse.py:149-155)")
        if flag in NVFP4:
            return ("vLLM 0.33 refuses an nvfp4 cache on MLA attention (config/vllm.py:3422-3438)",
                    "--kv-cache-dtype auto or fp8" + (", or nvfp4_ds_mla on compute capability 10.x" if sparse else ""))
        if flag == "fp8_e5m2" or flag in TURBOQUANT_BITS or flag in PER_TOKEN_HEAD:
            return f"no MLA attention backend stores it: {mla_only}", "--kv-cache-dtype auto or fp8"
        if flag in DS_MLA_BYTES and not sparse:
            return (f"a DeepSeek sparse-attention layout, and this model's MLA is dense: {mla_only}",
                    "--kv-cache-dtype auto or fp8")
        return None
    # Non-MLA attention.
    if flag in DS_MLA_BYTES:
        if flag == "nvfp4_ds_mla":
            if cc is None or cc[0] == 10:
                return None     # FlashInfer takes the name there; `lane_attention` says why it is not sized
            return ("a DeepSeek sparse-MLA layout; of the attention backends for non-MLA attention only FlashInfer "
                    "takes the name (by its nvfp4 prefix), and only on compute capability 10.x (v1/attention/backends/"
                    "flashinfer.py:653-664)", "--kv-cache-dtype auto, fp8 or nvfp4")
        return ("a DeepSeek sparse-MLA layout that no attention backend for non-MLA attention lists (FLASH_ATTN, "
                "FLASHINFER, TRITON_ATTN, FLEX_ATTENTION, TURBOQUANT: v1/attention/backends/flash_attn.py:290-296, "
                "flashinfer.py:573-582 and :653-664, triton_attn.py:326-336, flex_attention.py:96-100, "
                "turboquant_attn.py:183-187)", "--kv-cache-dtype auto or fp8")
    head_dims = sorted({g.head_dim for g in model.attention if g.head_dim})
    if flag in NVFP4:
        odd = [d for d in head_dims if d not in FLASHINFER_HEAD_SIZES]
        if odd:
            return (f"only FlashInfer stores it, for head sizes 64, 128, 256 and 512 (v1/attention/backends/"
                    f"flashinfer.py:690-693); this model's are {', '.join(map(str, head_dims))}",
                    "--kv-cache-dtype auto or fp8")
        if cc is None or cc[0] == 10:
            return None
        if not (8, 0) <= cc <= (12, 1) or cc[0] not in (8, 9, 12):
            return (f"only FlashInfer stores it, and not on compute capability {machine.gpus.compute_capability} "
                    "(FlashInfer runs on 8.0 to 12.1, flashinfer.py:695-704, and takes nvfp4 there on 8.x, 9.x "
                    "and 12.x or the SM100 family, 10.x, :653-664)", "--kv-cache-dtype auto or fp8")
        if flag != "nvfp4":
            return (f"on compute capability {machine.gpus.compute_capability} FlashInfer's FlashAttention-2 path "
                    "takes plain nvfp4 only (v1/attention/backends/flashinfer.py:653-658); nvfp4_4over6 needs the "
                    "SM100 family (compute capability 10.x)", "--kv-cache-dtype nvfp4")
        if 64 in head_dims:
            return (f"on compute capability {machine.gpus.compute_capability} FlashInfer's FlashAttention-2 prefill "
                    "misreads an NVFP4 cache at head size 64 and refuses it (v1/attention/backends/flashinfer.py:"
                    "679-685)",
                    "--kv-cache-dtype auto or fp8, or a GPU of compute capability 10.x")
        return None
    if flag in PER_TOKEN_HEAD and head_dims and head_dims[0] < 32:
        return (f"only TRITON_ATTN stores it, for head sizes of 32 and more (v1/attention/backends/"
                f"triton_attn.py:379-380); this model's smallest is {head_dims[0]}", "--kv-cache-dtype auto or fp8")
    if flag in TURBOQUANT_BITS:
        boundary = kept_layers(model, lane)
        sliding = [n for g in model.attention if g.kind == "sliding" for n in g.layers if n not in boundary]
        if sliding:
            return (f"TURBOQUANT, the only backend that stores it (v1/attention/backends/turboquant_attn.py:183-187), "
                    f"has no sliding-window support (v1/attention/backend.py:332-333), and sliding layers "
                    f"{_layer_span(sliding)} would need it", "--kv-cache-dtype auto or fp8")
        chunked = [n for g in model.attention if g.kind == "chunked" for n in g.layers if n in boundary]
        if chunked:
            return (f"a chunked-attention layer takes its backend from the cache dtype (TURBOQUANT: "
                    f"model_executor/layers/attention/chunked_local_attention.py:96-101) but caches at the model's "
                    f"dtype when vLLM keeps it unquantized, as it does layers {_layer_span(chunked)} (engine/"
                    f"arg_utils.py:2334-2351 and --kv-cache-dtype-skip-layers, attention/attention.py:299-315); "
                    f"TURBOQUANT's impl then fails on "
                    f"\"auto\" (v1/attention/backends/turboquant_attn.py:339, turboquant/config.py:216-226)",
                    "--kv-cache-dtype auto or fp8")
    return None


def _layers_word(layers: list[int]) -> str:
    return f"layer{'s' if len(layers) > 1 else ''} {_layer_span(layers)}"


def _layer_span(layers: list[int]) -> str:
    if len(layers) <= 6:
        return ", ".join(map(str, layers))
    return f"{layers[0]}, {layers[1]}, …, {layers[-1]} ({len(layers)} layers)"


def sparse_mla_cache(machine: Machine, lane: Lane) -> tuple[str | None, tuple[str, str] | None]:
    """For a DeepSeek sparse-attention group, by the lane's `--kv-cache-dtype` (the backend vLLM picks
    follows the flag's spelling, not only its element size): the DeepSeek layout vLLM 0.33 stores it
    in on the machine's GPUs (`fp8_ds_mla`, `nvfp4_ds_mla`; None: plain elements at the group's
    dtype), and (why, what would work) where it refuses to boot."""
    major = (machine.gpus.compute_capability or "").split(".")[0]
    flag = flag_value(list(lane.extra_args), "--kv-cache-dtype")
    if major == "12":
        if flag not in SM120_DS_MLA_FLAGS:
            return None, (f"--kv-cache-dtype {flag}: vLLM 0.33's only sparse-MLA backend on compute capability "
                          f"{machine.gpus.compute_capability}, FLASHINFER_MLA_SPARSE_SM120, stores fp8_ds_mla and "
                          "refuses any other cache (v1/attention/backends/mla/flashinfer_mla_sparse_sm120.py:64-67)",
                          "--kv-cache-dtype auto, fp8, fp8_e4m3 or fp8_ds_mla")
        return "fp8_ds_mla", None
    if flag == "nvfp4_ds_mla":
        if major in ("10", ""):     # a machine without a compute capability: as the only GPUs it exists on
            return "nvfp4_ds_mla", None
        if major == "9":
            return None, ("--kv-cache-dtype nvfp4_ds_mla: vLLM 0.33's FLASHMLA_SPARSE stores it on compute capability "
                          "10.x only (v1/attention/backends/mla/flashmla_sparse.py:250-254) and no other sparse-MLA "
                          "backend lists it (flashattn_mla_sparse.py:43-47, flashinfer_mla_sparse_sm90.py:148-153)",
                          "--kv-cache-dtype fp8 or fp8_ds_mla, or a GPU of compute capability 10.x")
    if major in ("9", "10", ""):
        # Hopper's FLASHMLA_SPARSE takes `fp8` (a machine without a compute capability: as Hopper);
        # fp8_e4m3, named or a checkpoint's FP8 scheme, goes to a backend that stores plain fp8
        hopper_fp8 = major in ("9", "") and flag == "fp8"
        return ("fp8_ds_mla" if flag == "fp8_ds_mla" or hopper_fp8 else None), None
    return None, (f"DeepSeek sparse attention: vLLM 0.33 has no sparse-MLA attention backend for compute "
                  f"capability {machine.gpus.compute_capability} (FLASH_ATTN_MLA_SPARSE and FLASHINFER_MLA_SPARSE_SM90 "
                  "need 9.x, FLASHMLA_SPARSE 9.x or 10.x, SM120's 12.x; platforms/cuda.py:83-155)",
                  "a machine whose GPUs have compute capability 9.x, 10.x or 12.x")

_HOW = {"mla": "(kv_lora_rank + rope_head_dim) × dtype bytes (every rank)",
        "full": "2 × max(1, kv_heads // tp) × head_dim × dtype bytes",
        "sliding": "2 × max(1, kv_heads // tp) × head_dim × dtype bytes, min(window, max_model_len) tokens",
        "chunked": "2 × max(1, kv_heads // tp) × head_dim × dtype bytes, min(chunk + max_num_batched_tokens, "
                   "max_model_len) tokens"}
_DS_MLA_HOW = {"fp8_ds_mla": "fp8_ds_mla: 512 fp8 + 4 fp32 scales + 64 bf16 RoPE values (every rank)",
               "nvfp4_ds_mla": "nvfp4_ds_mla: 512 fp4 values (256 B) + 64 fp8 RoPE values + 32 fp8 scales, one per 16 "
                               "values (every rank)"}
_TOKENS = {"sliding": ", min(window, max_model_len) tokens",
           "chunked": ", min(chunk + max_num_batched_tokens, max_model_len) tokens"}


def _packed_how(cache_dtype: str) -> str:
    if cache_dtype in TURBOQUANT_BITS:
        key_bits, value_bits = TURBOQUANT_BITS[cache_dtype]
        key = "head_dim (fp8)" if key_bits == 8 else f"⌈head_dim × {key_bits} / 8⌉ + 2 (fp16 norm)"
        return (f"{cache_dtype}: max(1, kv_heads // tp) × slot, slot = key {key} + value ⌈head_dim × {value_bits} / 8⌉ "
                "+ 4 (fp16 scale and zero), rounded up to even")
    if cache_dtype in PER_TOKEN_HEAD:
        side = "head_dim // 2 (two 4-bit values a byte)" if cache_dtype == "int4_per_token_head" else "head_dim × 1 B"
        return f"{cache_dtype}: 2 (key, value) × max(1, kv_heads // tp) × ({side} + 4 B fp32 scale)"
    return (f"{cache_dtype}: 2 (key, value) × max(1, kv_heads // tp) × (head_dim // 2 B of fp4 values + head_dim // 16 "
            "fp8 scales, one per 16 values)")


def _packed_note(cache_dtype: str, model: Model) -> str:
    dims = sorted({g.head_dim for g in model.attention if g.head_dim})
    if cache_dtype in TURBOQUANT_BITS:
        key_bits, value_bits = TURBOQUANT_BITS[cache_dtype]
        key = "fp8, 1 B a value" if key_bits == 8 else f"{key_bits} bits a value + a 2 B fp16 norm"
        slots = ", ".join(f"{turboquant_slot(cache_dtype, d)} B at head_dim {d}" for d in dims)
        boundary = turboquant_boundary(model)
        kept = (f"; it keeps decoder layers {', '.join(map(str, boundary))} (the first and last "
                f"{len(boundary) // 2}) at the model's dtype (engine/arg_utils.py:2334-2351 with "
                "turboquant/config.py:178-213)" if boundary else
                "; a model with state layers keeps none at the model's dtype (turboquant/config.py:194-203)")
        return (f"--kv-cache-dtype {cache_dtype}: vLLM 0.33's TURBOQUANT attention backend stores each KV head's key "
                f"({key}) and value ({value_bits} bits a value + 4 B of fp16 scale and zero point) in one slot per "
                f"token, rounded up to an even size — {slots} (model_executor/layers/quantization/turboquant/"
                f"config.py:20-41, :128-175; v1/attention/backends/turboquant_attn.py:140-153){kept}")
    if cache_dtype in PER_TOKEN_HEAD:
        values = {"int8_per_token_head": "int8 values, 1 B each", "fp8_per_token_head": "fp8 values, 1 B each",
                  "int4_per_token_head": "4-bit values, two a byte"}[cache_dtype]
        return (f"--kv-cache-dtype {cache_dtype}: vLLM 0.33 serves it with TRITON_ATTN only (v1/attention/backends/"
                f"triton_attn.py:326-336), which stores each KV head's key and value as {values}, plus one fp32 scale "
                "each per token (triton_attn.py:307-319)")
    return (f"--kv-cache-dtype {cache_dtype}: vLLM 0.33's FlashInfer backend stores each KV head's key and value as fp4 "
            "(e2m1) values two a byte plus one fp8 scale per 16 values — head_dim // 2 + head_dim // 16 bytes a side "
            "(v1/attention/backends/flashinfer.py:557-570, utils/torch_utils.py:542-544)"
            + ("; nvfp4_4over6 is that layout with each block's scale chosen between max/6 and max/4 "
               "(config/cache.py:245-246)" if cache_dtype == "nvfp4_4over6" else ""))


def _note_once(notes: list[str], note: str) -> None:
    if note not in notes:
        notes.append(note)


def kv_dtype(model: Model, machine: Machine, lane: Lane, notes: list[str]) -> str | None:
    """The lane's KV element dtype where it is a plain one other than the model's own:
    `--kv-cache-dtype`, else vLLM's per-model default (GLM-5 on the SM100 family: fp8_e4m3,
    vllm/model_executor/models/config.py:89-101). None for the model's own and for the packed and
    DeepSeek layouts, which `lane_attention` sizes from the flag."""
    cache_dtype = flag_value(list(lane.extra_args), "--kv-cache-dtype")
    if cache_dtype and cache_dtype != "auto":
        dtype = KV_CACHE_DTYPES.get(cache_dtype)
        if dtype is None and cache_dtype not in VLLM_CACHE_DTYPES:
            notes.append(f"--kv-cache-dtype {cache_dtype} is not a vLLM 0.33 value (config/cache.py:44-67), so not "
                         "modelled: KV counted at the model's dtype (an upper bound)")
        return dtype
    cc = machine.gpus.compute_capability or ""
    if model.architecture == "GlmMoeDsaForCausalLM" and cc.split(".")[0] == "10":
        notes.append("GLM-5 on the SM100 family: vLLM 0.33 turns --kv-cache-dtype auto into fp8_e4m3 "
                     "(model_executor/models/config.py:89-101); counted at 1 byte per element")
        return "fp8"
    return None


def _refused_at_model_dtype(flag: str | None, refusal: tuple[str, str] | None) -> bool:
    """Whether a refused `--kv-cache-dtype` is counted at the model's dtype: a packed or DeepSeek
    value is (its layout is never built); a refused plain one keeps its own bytes."""
    return refusal is not None and flag not in KV_CACHE_DTYPES


@dataclass(frozen=True)
class AttentionPart:
    """An attention group, or the part of one that caches alike, as the lane caches it."""

    group: AttentionLayers          # its layers, at the dtype they cache at
    rate: int                       # bytes per token per layer on one rank (a padded page's share included)
    layout: str | None              # the packed or DeepSeek layout; None: plain elements
    kept: bool = False              # layers vLLM keeps at the model's dtype (skip list, TurboQuant's boundary)
    padding: tuple[int, int, int] | None = None     # a padded sliding page: (bytes/token unpadded, page, tokens)
    cache_rate: int = 0             # kept layers: what they would cache per token at the cache dtype


def lane_attention(model: Model, machine: Machine, lane: Lane, dtype: str | None,
                   notes: list[str], *,
                   refusal_reported: bool = False) -> list[tuple[AttentionLayers, int, str | None]]:
    """Each attention group as the lane caches it, given the lane's KV dtype (`kv_dtype`): the group at
    that dtype, its bytes per token per layer on one rank, and the layout vLLM stores it in where that
    is not plain elements (the DeepSeek layouts of sparse MLA, by the GPU's backend:
    `sparse_mla_cache`; the packed TurboQuant, per-token-head and NVFP4 caches). Groups come split
    where vLLM keeps layers at the model's dtype (`--kv-cache-dtype-skip-layers`, TurboQuant's first
    and last layers): those layers apart (`attention_parts`). The ledger's pool and the cost model's KV
    reads both take their bytes from here. `refusal_reported`: the caller reports `kv_cache_refusal`
    itself (the ledger's violation, `kv_rate`), so no note repeats it."""
    return [(p.group, p.rate, p.layout)
            for p in attention_parts(model, machine, lane, dtype, notes, refusal_reported=refusal_reported)]


def attention_parts(model: Model, machine: Machine, lane: Lane, dtype: str | None, notes: list[str], *,
                    refusal_reported: bool = False) -> list[AttentionPart]:
    """`lane_attention`'s groups, each part marked where vLLM keeps it at the model's dtype."""
    tp = lane.tensor_parallel_size
    flag = cache_dtype_flag(lane)
    refusal = kv_cache_refusal(model, machine, lane)
    upper = _refused_at_model_dtype(flag, refusal)
    if refusal is not None and not refusal_reported:
        _note_once(notes, f"--kv-cache-dtype {flag}: vLLM 0.33 refuses to boot this lane with it — {refusal[0]}"
                   + (". KV counted at the model's dtype" if upper else ""))
    packed = flag if flag in PACKED and refusal is None else None
    if flag == "nvfp4_ds_mla" and refusal is None and not any(g.kind == "mla" for g in model.attention):
        _note_once(notes, "--kv-cache-dtype nvfp4_ds_mla on non-MLA attention is not modelled: KV counted at the "
                   "model's dtype (an upper bound). It is a DeepSeek sparse-MLA layout; vLLM 0.33's FlashInfer takes "
                   "the name on compute capability 10.x by its nvfp4 prefix (v1/attention/backends/flashinfer.py:"
                   "653-664) but packs only plain nvfp4 (:557-570; the name maps to its own quantization mode, "
                   "v1/kv_cache_interface.py:134-140), so the cache would be 1 byte per element in a layout its "
                   "kernels read as nvfp4")
    if packed:
        _note_once(notes, _packed_note(packed, model))
    skip = skip_layers(model, lane)
    boundary = set(turboquant_boundary(model)) if packed in TURBOQUANT_BITS else set()
    # a layer vLLM keeps at "auto" (attention.py:299-315, mla_attention.py:494-500; TurboQuant's boundary is
    # merged into the same list, engine/arg_utils.py:2334-2351); a refused layout is counted at the model's
    # dtype throughout
    kept = set() if upper else set(skip.layers) | boundary
    # the sparse-MLA layout is the lane's and the GPU's, the same for every sparse group; a kept layer
    # caches at "auto", which SM120's only sparse backend stores as fp8_ds_mla too (`sparse_mla_cache`)
    ds_layout = sparse_mla_cache(machine, lane)[0] if not upper else None
    ds_kept = "fp8_ds_mla" if (machine.gpus.compute_capability or "").split(".")[0] == "12" else None

    def cached(group: AttentionLayers, at_cache_dtype: bool) -> tuple[int, str | None]:
        layout = (ds_layout if at_cache_dtype else ds_kept) if group.kind == "mla" and group.index_head_dim else None
        if layout:
            return DS_MLA_BYTES[layout] + group.indexer_bytes_per_token(), layout
        if at_cache_dtype and packed and group.kind != "mla":
            assert group.head_dim is not None
            return group.kv_heads_per_rank(tp) * packed_head_bytes(packed, group.head_dim), packed
        return group.bytes_per_token_per_layer(tp), None

    out: list[AttentionPart] = []
    for base in model.attention:
        group = base.model_copy(update={"kv_dtype": dtype}) if dtype is not None else base
        rate, layout = cached(group, True)
        held = [n for n in base.layers if n in kept]
        if held:
            # "auto" is the model's dtype (vllm/utils/torch_utils.py:519-524): the group's own unless the
            # checkpoint asks for an fp8 cache, which a kept layer no longer follows (attention.py:286-315)
            own = base.kv_dtype if base.kv_dtype != "fp8" else "bf16"
            kept_group = base.model_copy(update={"layers": held, "kv_dtype": own})
            kept_rate, kept_layout = cached(kept_group, False)
            if (kept_rate, kept_layout) != (rate, layout):
                rest = [n for n in base.layers if n not in kept]
                if rest:
                    out.append(AttentionPart(group.model_copy(update={"layers": rest}), rate, layout))
                padding = None
                if group.kind == "sliding" and kept_rate > rate:
                    page, block = skip_sliding_page(lane, rate, kept_rate)
                    padding, kept_rate = (kept_rate, page, block), -(-page // block)
                out.append(AttentionPart(kept_group, kept_rate, kept_layout, kept=True, padding=padding,
                                         cache_rate=rate))
                if own != base.kv_dtype:
                    _note_once(notes, "the layers vLLM keeps at the model's dtype cache at \"auto\", not the "
                               "checkpoint's fp8 KV scheme (model_executor/layers/attention/attention.py:286-315); "
                               "counted as bf16")
                continue
        out.append(AttentionPart(group, rate, layout))
    for layout in dict.fromkeys(p.layout for p in out if p.layout in DS_MLA_BYTES):
        _ds_mla_note(layout, machine, notes)
    _skip_notes(model, skip, out, notes, upper)
    return out


def skip_sliding_page(lane: Lane, primary: int, skipped: int) -> tuple[int, int]:
    """The page and block (tokens) of a sliding-window layer kept at the model's dtype beside layers at
    the cache dtype, as vLLM 0.33 sizes it. The attention block grows until a page of the cache dtype
    holds a kernel block (16 tokens, `kv_state.KERNEL_BLOCK`) of the model's dtype — block = align ×
    ⌈16 × skipped / (align × primary)⌉, align = max(16, --block-size) — and that page is the one every
    kept layer pads up to (platforms/interface.py:787-793, :823-937); the sliding layer takes the
    largest kernel block whose page fits in it (model_executor/layers/attention/attention.py:626-673,
    :101-130). `primary`, `skipped`: bytes per token per layer at the cache and the model's dtype."""
    given = flag_value(list(lane.extra_args), "--block-size")
    align = max(KERNEL_BLOCK, int(given) if given and given.isdigit() else 0)
    block = align * -(-(skipped * KERNEL_BLOCK) // (align * primary))
    page = block * primary
    return page, max(KERNEL_BLOCK, page // skipped // KERNEL_BLOCK * KERNEL_BLOCK)


def _ds_mla_note(layout: str, machine: Machine, notes: list[str]) -> None:
    if layout == "fp8_ds_mla" and not any(n.startswith("sparse MLA cache stored as fp8_ds_mla") for n in notes):
        notes.append(f"sparse MLA cache stored as fp8_ds_mla on compute capability "
                     f"{machine.gpus.compute_capability}: vLLM 0.33's sparse backend there keeps "
                     f"{FP8_DS_MLA_BYTES} B per token per layer (512 fp8 + 4 fp32 scales + 64 bf16 RoPE values; "
                     "model_executor/layers/attention/mla_attention.py:359-376) plus the indexer key")
    if layout == "nvfp4_ds_mla":
        _note_once(notes, f"sparse MLA cache stored as nvfp4_ds_mla: vLLM 0.33's FLASHMLA_SPARSE keeps "
                   f"{NVFP4_DS_MLA_BYTES} B per token per layer (512 fp4 values two a byte, 64 fp8 RoPE values, "
                   "32 fp8 scales — one per 16 values; v1/attention/backends/mla/flashmla_sparse.py:111-122, "
                   "model_executor/layers/attention/mla_attention.py:1383-1388) plus the indexer key"
                   + ("" if machine.gpus.compute_capability else
                      "; no compute capability given: assumed 10.x, the only one vLLM stores it on"))


def _part_dtype(part: AttentionPart) -> str:
    return part.layout or part.group.kv_dtype


def _skip_notes(model: Model, skip: SkipLayers, parts: list[AttentionPart], notes: list[str], upper: bool) -> None:
    """What the lane's `--kv-cache-dtype-skip-layers` changes, and which of its values name nothing."""
    if not skip.values:
        return
    given = " ".join(skip.values)
    src = "model_executor/layers/attention/attention.py:299-315, mla_attention.py:494-500"
    if skip.ignored:
        comma = any("," in v for v in skip.ignored)
        _note_once(notes, f"--kv-cache-dtype-skip-layers {', '.join(map(repr, skip.ignored))}: "
                   f"{'names' if len(skip.ignored) == 1 else 'name'} no attention layer of this model, so vLLM 0.33 "
                   f"skips nothing for {'it' if len(skip.ignored) == 1 else 'them'} (each attention layer compares "
                   "its index, written as a plain integer, and sliding-window layers `sliding_window`, "
                   f"{src}; vLLM checks the values no further): ignored"
                   + ("; the flag takes its values space-separated (`nargs=\"+\"`, engine/arg_utils.py:255-259), "
                      "a comma does not split them" if comma else ""))
    named = [p for p in parts if p.kept and set(p.group.layers) & skip.layers]
    if not skip.layers:
        return
    if upper or not named:
        _note_once(notes, f"--kv-cache-dtype-skip-layers {given}: the layers it names cache at the model's dtype "
                   f"({src}), as the rest of this lane's cache does: no change")
        return
    split = "; ".join(
        (f"{p.group.kind} {_layers_word(sorted(p.group.layers))}"
         if p.kept else f"{len(p.group.layers)} {p.group.kind} layer{'s' if len(p.group.layers) > 1 else ''}")
        + f" at {p.rate:,} B per token ({_part_dtype(p)}" + (", the model's dtype" if p.kept else "") + ")"
        for p in parts)
    _note_once(notes, f"--kv-cache-dtype-skip-layers {given}: vLLM 0.33 caches the attention layers it names at "
               f"\"auto\", the model's dtype ({src}); per layer and GPU: {split}")
    for p in parts:
        if p.padding:
            bytes_, page, block = p.padding
            _note_once(notes, f"sliding-window layers kept at the model's dtype ({bytes_:,} B per token) pad their "
                       f"page to the one a block of the cache dtype fills: {page:,} B for {block} tokens, "
                       f"{p.rate:,} B a token (platforms/interface.py:823-937, model_executor/layers/attention/"
                       "attention.py:626-673)")
    kinds = {g.kind for g in model.attention}
    if "sliding" in kinds and any(p.kept and p.group.kind != "sliding" for p in parts):
        _note_once(notes, "non-sliding layers kept at the model's dtype beside sliding-window layers: their pages "
                   "differ from the others', which vLLM 0.33 then unifies (v1/core/kv_cache_planning.py:346-409, "
                   ":914-1041) in a way not followed here — each layer counted at its own bytes per token")


def _model_group(model: Model, group: AttentionLayers) -> int:
    """The index in the model's attention groups of the group `group` was split from."""
    return next(j for j, g in enumerate(model.attention) if group.layers[0] in g.layers)


def kv_rate(model: Model, machine: Machine, lane: Lane, add: Callable[[Figure], Figure], notes: list[str],
            violations: list[Violation]) -> tuple[float, StatePool | None]:
    """KV bytes per token of a max_model_len sequence, summed over the lane's ranks (figures added),
    and the state layout where the model has state layers."""
    tp, seq = lane.tensor_parallel_size, lane.max_model_len
    dtype = kv_dtype(model, machine, lane, notes)
    per_seq = 0
    operands: dict[str, object] = {"tp": tp, "max_model_len": seq}
    in_flight = max_num_batched_tokens(machine, lane) if any(g.kind == "chunked" for g in model.attention) else None
    rates = set()
    parts: list[AttentionPart] = []
    refused = kv_cache_refusal(model, machine, lane)
    if refused:
        # the one report of the refusal per lane (`lane_attention` below is told not to note it)
        counted = (" (KV counted at the model's dtype)"
                   if _refused_at_model_dtype(cache_dtype_flag(lane), refused) else "")
        violations.append(Violation("attention", f"--kv-cache-dtype {cache_dtype_flag(lane)}: {refused[0]}; vLLM "
                                    f"refuses to boot this lane{counted}", refused[1], lane=lane.name))
    # groups come split where vLLM keeps layers at the model's dtype: TurboQuant's first and last, and
    # those --kv-cache-dtype-skip-layers names
    boundary = set(turboquant_boundary(model)) if cache_dtype_flag(lane) in TURBOQUANT_BITS and not refused else set()
    named = skip_layers(model, lane).layers
    sparse = any(g.index_head_dim for g in model.attention)
    refusal = sparse_mla_cache(machine, lane)[1] if sparse and not refused else None
    if refusal and not any(v.message.startswith(refusal[0]) for v in violations):
        violations.append(Violation("attention", refusal[0] + "; vLLM refuses to boot this lane", refusal[1],
                                    lane=lane.name))
    for i, part in enumerate(attention_parts(model, machine, lane, dtype, notes, refusal_reported=True)):
        group, rate, layout, kept = part.group, part.rate, part.layout, part.kept
        rates.add(rate)
        parts.append(part)
        held = seq
        if group.kind == "sliding" and group.window:
            held = min(seq, group.window)
        elif group.kind == "chunked" and group.chunk and in_flight is not None:
            held = min(seq, group.chunk + in_flight.value)
        layer_bytes = len(group.layers) * rate * held
        per_seq += layer_bytes
        ops: dict[str, object] = {"layers": len(group.layers), "tp": tp, "kv_dtype": group.kv_dtype}
        if group.kind == "mla":
            ops.update(kv_lora_rank=group.kv_lora_rank, rope_head_dim=group.rope_head_dim)
            if group.index_head_dim:
                ops.update(indexer_bytes_per_token=group.indexer_bytes_per_token())
        else:
            ops.update(kv_heads=group.kv_heads, kv_heads_per_rank=group.kv_heads_per_rank(tp),
                       head_dim=group.head_dim)
        if layout and layout != "fp8_ds_mla":
            ops.update(kv_cache_dtype=layout)
            if layout in PACKED:
                assert group.head_dim is not None
                ops.update(bytes_per_token_per_kv_head=packed_head_bytes(layout, group.head_dim))
        if group.kind == "sliding":
            ops.update(window=group.window, tokens_held=held)
        if group.kind == "chunked":
            assert in_flight is not None
            ops.update(chunk=group.chunk, max_num_batched_tokens=in_flight.value, tokens_held=held)
        if layout in DS_MLA_BYTES:
            how = _DS_MLA_HOW[layout]
        elif layout:
            how = _packed_how(layout) + _TOKENS.get(group.kind, "")
        else:
            how = _HOW[group.kind]
        how += " + indexer key (index_head_dim + 4 per 128)" if group.index_head_dim else ""
        if kept:
            ends, listed = sorted(set(group.layers) & boundary), sorted(set(group.layers) & named)
            why = ([f"{_layers_word(ends)}: the first and last decoder layers, which TurboQuant leaves at the "
                    "model's dtype"] if ends else [])
            why += [f"{_layers_word(listed)}: named by --kv-cache-dtype-skip-layers"] if listed else []
            how += f", at the model's dtype ({'; '.join(why)})"
        if part.padding:
            unpadded, page, block = part.padding
            how = (f"⌈page_bytes / block_tokens⌉: the page padded to the one a block at the cache dtype fills "
                   f"(unpadded: {how})")
            ops.update(bytes_per_token_unpadded=unpadded, page_bytes=page, block_tokens=block)
        j = _model_group(model, group)
        label = (f"KV per token per layer, {group.kind} attention ({len(group.layers)} layers, per GPU"
                 + (f", {layout}" if layout and layout != "fp8_ds_mla" else "")
                 + (", model's dtype" + ("" if layout else f", {group.kv_dtype}") if kept
                    else f", {group.kv_dtype}" if named and not layout else "") + ")")
        add(Figure(f"kv.layers[{i}].bytes_per_token", label, rate, "bytes/token", how, ops,
                   src_note(model.sources, f"attention[{j}].kv_heads")
                   or src_note(model.sources, f"attention[{j}].kv_lora_rank")
                   + (f"; chunk held: {in_flight.reason}" if group.kind == "chunked" and in_flight else "")))
        operands[f"group{i}_{group.kind}_bytes"] = layer_bytes
    pool = _with_state(model, machine, lane, parts, add, notes, violations, operands) if model.state else None
    if pool is not None:
        per_seq = pool.bytes_per_sequence
    else:
        add(Figure("kv.bytes_per_sequence", "KV of one max_model_len sequence (per GPU)", per_seq, "bytes",
                   "Σ layer kinds: layers × bytes per token per layer × tokens held", operands))
    lane_rate = per_seq / seq * tp
    add(Figure("kv.lane_bytes_per_token", "KV bytes per token at max_model_len (lane, all GPUs)",
               lane_rate, "bytes/token", "bytes_per_sequence / max_model_len × tp",
               {"bytes_per_sequence": per_seq, "max_model_len": seq, "tp": tp}))
    return lane_rate, pool


# how the catalog's per-layer sum describes itself; not so for the per-GPU rate it is quoted beside
_UNCAPPED = "; sliding and chunked layers counted uncapped here, the ledger caps them per sequence"


def kv_tokens_figure(model: Model, lane: Lane, kv_pool: float, kv_token_bytes: float, tp: int) -> Figure:
    """`kv.tokens`: one GPU's KV pool in tokens, explained per GPU. `kv_token_bytes` is the lane's
    rate, summed over its tensor-parallel ranks (`kv.lane_bytes_per_token`, or the model's
    `kv_bytes_per_token`; plus the drafter's), so one GPU caches kv_token_bytes / tp per token."""
    tokens = max(0.0, kv_pool) * tp / kv_token_bytes
    per_gpu = kv_token_bytes / tp
    drafter = (model.drafter.kv_bytes_per_token or 0) if (model.drafter and lane.speculative) else 0
    kinds = {g.kind for g in model.attention}
    if model.attention:
        how = ("kv_bytes_per_token_per_gpu is what one GPU caches per token: lane_kv_bytes_per_token "
               "(kv.lane_bytes_per_token = kv.bytes_per_sequence, one max_model_len sequence's KV per GPU, "
               "÷ max_model_len × tp) ÷ tp")
        if kinds & {"sliding", "chunked"}:
            how += "; sliding-window and chunked layers counted at the tokens they hold, not at max_model_len"
        if model.state:
            how += "; the state pages and the page padding included"
        if not drafter and not model.state and not kinds & {"sliding", "chunked"} \
                and model.kv_bytes_per_token is not None and per_gpu == model.kv_bytes_per_token:
            source = src_note(model.sources, "kv_bytes_per_token").replace(_UNCAPPED, "")
            how += f"; here the sum over the layers (kv.layers[*]){f' ({source})' if source else ''}"
    else:
        how = ("kv_bytes_per_token_per_gpu is what one GPU caches per token: the model's KV bytes per token "
               "(all layers, one rank) ÷ tp")
        source = src_note(model.sources, "kv_tokens_per_gib") or src_note(model.sources, "kv_bytes_per_token")
        how += f" ({source})" if source else ""
    if drafter:
        how += "; the drafter's kv_bytes_per_token added to the lane's (kv.bytes_per_token)"
    return Figure("kv.tokens", "KV pool in tokens", tokens, "tokens",
                  "max(0, kv_pool) / kv_bytes_per_token_per_gpu, kv_bytes_per_token_per_gpu = "
                  "lane_kv_bytes_per_token / tp",
                  {"kv_pool_bytes": kv_pool, "kv_bytes_per_token_per_gpu": per_gpu,
                   "tokens_per_gib_per_gpu": GiB / per_gpu, "lane_kv_bytes_per_token": kv_token_bytes, "tp": tp},
                  how)


def _with_state(model: Model, machine: Machine, lane: Lane, parts: list[AttentionPart],
                add: Callable[[Figure], Figure], notes: list[str], violations: list[Violation],
                operands: dict[str, object]) -> StatePool | None:
    tp = lane.tensor_parallel_size
    for i, group in enumerate(model.state):
        reason = group.split_reason(tp)
        if reason:
            violations.append(Violation("parallel", f"state[{i}] ({group.kind}): {reason}; vLLM 0.33 refuses such "
                                        "a layout at boot (mamba_utils.py `divide`)",
                                        "pick a tensor-parallel size that divides the state's heads and channels",
                                        lane=lane.name))
            return None
    rates = {p.rate for p in parts}
    kept = _kept_beside_state(parts)
    if kept is None and len(rates) != 1:
        notes.append("state layers beside attention layers of several page sizes, or none: vLLM's shared page "
                     "layout is not modelled here — the state is left out, so the KV figures are optimistic")
        return None
    if lane.speculative is not None:
        notes.append("speculative decoding on a model with state layers: vLLM keeps extra state per draft token, "
                     "not counted here (a lower bound on the state)")
    if kept is not None:
        notes.append(f"--kv-cache-dtype-skip-layers beside state layers: vLLM 0.33 sizes the block for the state at "
                     f"the cache dtype, bumps it until a page of the cache dtype covers a 16-token block of the "
                     f"model's dtype (platforms/interface.py:909-925), pads the state to that page (:931-937), and "
                     f"unifies every page to the largest, a kept layer's (v1/core/kv_cache_planning.py:346-409), one "
                     f"group per spec (:416-556). Counted at an upper bound: every page at a kept layer's "
                     f"({kept[1].rate:,} B per token), every attention layer holding one block of tokens a page")
        pool = state_pool(model, machine, lane, kept[0], kept[1])
    else:
        pool = state_pool(model, machine, lane, rates.pop())
    for f in state_pool_figures(pool, model, lane):
        add(f)
    operands.update(blocks_per_sequence=pool.blocks_per_sequence, bytes_per_block=pool.bytes_per_block)
    add(Figure("kv.bytes_per_sequence", "KV + state of one max_model_len sequence (per GPU)",
               pool.bytes_per_sequence, "bytes",
               "(attention groups × ⌈max_model_len / block⌉ + state groups × state blocks) × layers per group × page",
               {"attention_groups": pool.attention_groups, "attention_blocks": pool.attention_blocks,
                "state_groups": pool.state_groups, "state_blocks": pool.state_blocks,
                "layers_per_group": pool.group_size, "page_bytes": pool.page},
               "vLLM 0.33 v1/core/kv_cache_utils.py:1061-1093 (its concurrency: pool blocks ÷ blocks per request)"))
    return pool


def _kept_beside_state(parts: list[AttentionPart]) -> tuple[int, KeptLayers] | None:
    """Where attention layers kept at the model's dtype are what splits the rates: the rate at the cache
    dtype and the kept layers (`kv_state.KeptLayers`); None otherwise."""
    kept = [p for p in parts if p.kept]
    primary = {p.rate for p in parts if not p.kept} | {p.cache_rate for p in kept}
    if not kept or len(primary) != 1:
        return None
    rate, largest = primary.pop(), max(p.rate for p in parts)
    if largest <= rate:
        return None
    buckets = tuple(n for n in (sum(len(p.group.layers) for p in parts if not p.kept),
                                sum(len(p.group.layers) for p in kept)) if n)
    return rate, KeptLayers(largest, buckets)


def state_sequence_bound(pool: StatePool, lane: Lane, kv_pool: float, add: Callable[[Figure], Figure],
                         notes: list[str]) -> None:
    """With state layers every sequence, however short, holds a block per attention group and its
    state blocks: the pool holds at most that many sequences at once, whatever their length."""
    blocks = int(max(0.0, kv_pool) // pool.bytes_per_block)
    bound = blocks // pool.min_blocks_per_sequence
    add(Figure("kv.max_sequences", "sequences of any length the pool holds at once (per GPU)", bound, "sequences",
               "⌊⌊kv_pool / bytes_per_block⌋ / (attention groups + state groups × state blocks)⌋",
               {"kv_pool_bytes": kv_pool, "bytes_per_block": pool.bytes_per_block,
                "blocks_per_short_sequence": pool.min_blocks_per_sequence},
               "each sequence keeps its state; vLLM 0.33 v1/core/kv_cache_utils.py:1061-1093"))
    if lane.concurrency.max > bound:
        notes.append(f"warning: concurrency up to {lane.concurrency.max} streams, but the KV pool holds the state of "
                     f"at most {bound} sequences at once (each holds {pool.min_blocks_per_sequence} blocks of "
                     f"{pool.bytes_per_block:,} B even when short): vLLM queues the rest. Lower concurrency.max or "
                     "give the KV pool more HBM")
