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

State layers (Gated DeltaNet, Mamba-2) hold a fixed state per sequence; vLLM then lays the
attention and state layers out in one pool of equal pages (`kv_state`), and a sequence costs
what that layout gives. The lane's rate is the sequence's bytes ÷ max_model_len × tp, so the
pool in tokens is pool ÷ (rate / tp) and in sequences pool ÷ bytes per sequence per GPU.
"""

from __future__ import annotations

from collections.abc import Callable

from recipegen.ledger.figures import Figure
from recipegen.ledger.flags import flag_value
from recipegen.ledger.kv_state import StatePool, state_pool, state_pool_figures
from recipegen.ledger.result import Violation, src_note
from recipegen.ledger.workspace import max_num_batched_tokens
from recipegen.schema import Lane, Machine, Model
from recipegen.schema.model import AttentionLayers

# vLLM 0.33 `--kv-cache-dtype` values (vllm/config/cache.py:44-67) whose element size is plain.
KV_CACHE_DTYPES: dict[str, str] = {"float16": "fp16", "bfloat16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8",
                                   "fp8_e5m2": "fp8"}

# DeepSeek sparse attention (an MLA group with an indexer): vLLM 0.33 stores the cache as its
# attention backend asks (vllm/platforms/cuda.py:83-155 picks it; mla_attention.py:359-376 maps the
# dtype). `fp8_ds_mla` is, per token and layer, 512 fp8 latent values, 4 fp32 scales and 64 bf16
# RoPE values: what FLASHMLA_SPARSE stores for any quantized cache (Hopper's only fp8-capable sparse
# backend ahead of FlashInfer's SM90 one), and what SM120's only sparse backend,
# FLASHINFER_MLA_SPARSE_SM120, stores for auto, fp8 and fp8_e4m3 alike — a bf16 model's cache
# included (flashinfer_mla_sparse_sm120.py:64-67 refuses any other). On the SM100 family vLLM
# prefers FLASHINFER_MLA_SPARSE for an fp8 cache, which stores plain fp8. Before SM90 no sparse
# MLA backend exists.
FP8_DS_MLA_BYTES = 512 + 4 * 4 + 64 * 2
SM120_DS_MLA_FLAGS = (None, "auto", "fp8", "fp8_e4m3")


def sparse_mla_cache(machine: Machine, lane: Lane, kv_dtype: str) -> tuple[bool, tuple[str, str] | None]:
    """For a DeepSeek sparse-attention group cached at `kv_dtype` (after the lane's flag): whether
    vLLM 0.33 stores it as fp8_ds_mla on the machine's GPUs, and (why, what would work) where it
    refuses to boot."""
    major = (machine.gpus.compute_capability or "").split(".")[0]
    flag = flag_value(list(lane.extra_args), "--kv-cache-dtype")
    if major == "12":
        if flag not in SM120_DS_MLA_FLAGS:
            return False, (f"--kv-cache-dtype {flag}: vLLM 0.33's only sparse-MLA backend on compute capability "
                           f"{machine.gpus.compute_capability}, FLASHINFER_MLA_SPARSE_SM120, stores fp8_ds_mla and "
                           "refuses any other cache (v1/attention/backends/mla/flashinfer_mla_sparse_sm120.py:64-67)",
                           "--kv-cache-dtype auto, fp8 or fp8_e4m3")
        return True, None
    if major in ("9", "10"):
        return major == "9" and kv_dtype == "fp8", None
    if not major:
        return kv_dtype == "fp8", None      # a machine without a compute capability: as Hopper
    return False, (f"DeepSeek sparse attention: vLLM 0.33 has no sparse-MLA attention backend for compute "
                   f"capability {machine.gpus.compute_capability} (FLASH_ATTN_MLA_SPARSE and FLASHINFER_MLA_SPARSE_SM90 "
                   "need 9.x, FLASHMLA_SPARSE 9.x or 10.x, SM120's 12.x; platforms/cuda.py:83-155)",
                   "a machine whose GPUs have compute capability 9.x, 10.x or 12.x")

_HOW = {"mla": "(kv_lora_rank + rope_head_dim) × dtype bytes (every rank)",
        "full": "2 × max(1, kv_heads // tp) × head_dim × dtype bytes",
        "sliding": "2 × max(1, kv_heads // tp) × head_dim × dtype bytes, min(window, max_model_len) tokens",
        "chunked": "2 × max(1, kv_heads // tp) × head_dim × dtype bytes, min(chunk + max_num_batched_tokens, "
                   "max_model_len) tokens"}


def kv_dtype(model: Model, machine: Machine, lane: Lane, notes: list[str]) -> str | None:
    """The lane's KV dtype where it is not the model's own: `--kv-cache-dtype`, else vLLM's per-model
    default (GLM-5 on the SM100 family: fp8_e4m3, vllm/model_executor/models/config.py:89-101)."""
    cache_dtype = flag_value(list(lane.extra_args), "--kv-cache-dtype")
    if cache_dtype and cache_dtype != "auto":
        dtype = KV_CACHE_DTYPES.get(cache_dtype)
        if dtype is None:
            notes.append(f"--kv-cache-dtype {cache_dtype} is not modelled: KV counted at the model's dtype "
                         "(an upper bound)")
        return dtype
    cc = machine.gpus.compute_capability or ""
    if model.architecture == "GlmMoeDsaForCausalLM" and cc.split(".")[0] == "10":
        notes.append("GLM-5 on the SM100 family: vLLM 0.33 turns --kv-cache-dtype auto into fp8_e4m3 "
                     "(model_executor/models/config.py:89-101); counted at 1 byte per element")
        return "fp8"
    return None


def lane_attention(model: Model, machine: Machine, lane: Lane, dtype: str | None,
                   notes: list[str]) -> list[tuple[AttentionLayers, int, bool]]:
    """Each attention group as the lane caches it, given the lane's KV dtype (`kv_dtype`): the group at
    that dtype, its bytes per token per layer on one rank, and whether vLLM stores it as fp8_ds_mla
    (sparse MLA, by the GPU's backend: `sparse_mla_cache`). The ledger's pool and the cost model's
    KV reads both take their bytes from here."""
    out = []
    for group in model.attention:
        if dtype is not None:
            group = group.model_copy(update={"kv_dtype": dtype})
        sparse = group.kind == "mla" and bool(group.index_head_dim)
        ds_mla = sparse and sparse_mla_cache(machine, lane, group.kv_dtype)[0]
        rate = (FP8_DS_MLA_BYTES + group.indexer_bytes_per_token() if ds_mla
                else group.bytes_per_token_per_layer(lane.tensor_parallel_size))
        if ds_mla and not any(n.startswith("sparse MLA cache stored as fp8_ds_mla") for n in notes):
            notes.append(f"sparse MLA cache stored as fp8_ds_mla on compute capability "
                         f"{machine.gpus.compute_capability}: vLLM 0.33's sparse backend there keeps "
                         f"{FP8_DS_MLA_BYTES} B per token per layer (512 fp8 + 4 fp32 scales + 64 bf16 RoPE values; "
                         "model_executor/layers/attention/mla_attention.py:359-376) plus the indexer key")
        out.append((group, rate, ds_mla))
    return out


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
    for i, (group, rate, ds_mla) in enumerate(lane_attention(model, machine, lane, dtype, notes)):
        refusal = sparse_mla_cache(machine, lane, group.kv_dtype)[1] if group.index_head_dim else None
        if refusal and not any(v.message.startswith(refusal[0]) for v in violations):
            violations.append(Violation("attention", refusal[0] + "; vLLM refuses to boot this lane", refusal[1],
                                        lane=lane.name))
        rates.add(rate)
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
                ops.update(indexer_bytes=group.indexer_bytes_per_token())
        else:
            ops.update(kv_heads=group.kv_heads, kv_heads_per_rank=group.kv_heads_per_rank(tp),
                       head_dim=group.head_dim)
        if group.kind == "sliding":
            ops.update(window=group.window, tokens_held=held)
        if group.kind == "chunked":
            assert in_flight is not None
            ops.update(chunk=group.chunk, max_num_batched_tokens=in_flight.value, tokens_held=held)
        how = ("fp8_ds_mla: 512 fp8 + 4 fp32 scales + 64 bf16 RoPE values (every rank)" if ds_mla
               else _HOW[group.kind]) + (" + indexer key (index_head_dim + 4 per 128)" if group.index_head_dim else "")
        add(Figure(f"kv.layers[{i}].bytes_per_token", f"KV per token per layer, {group.kind} attention "
                   f"({len(group.layers)} layers, per GPU)", rate, "count", how, ops,
                   src_note(model.sources, f"attention[{i}].kv_heads")
                   or src_note(model.sources, f"attention[{i}].kv_lora_rank")
                   + (f"; chunk held: {in_flight.reason}" if group.kind == "chunked" and in_flight else "")))
        operands[f"group{i}_{group.kind}_bytes"] = layer_bytes
    pool = _with_state(model, machine, lane, rates, add, notes, violations, operands) if model.state else None
    if pool is not None:
        per_seq = pool.bytes_per_sequence
    else:
        add(Figure("kv.bytes_per_sequence", "KV of one max_model_len sequence (per GPU)", per_seq, "bytes",
                   "Σ layer kinds: layers × bytes per token per layer × tokens held", operands))
    lane_rate = per_seq / seq * tp
    add(Figure("kv.lane_bytes_per_token", "KV bytes per token at max_model_len (lane, all GPUs)",
               lane_rate, "count", "bytes_per_sequence / max_model_len × tp",
               {"bytes_per_sequence": per_seq, "max_model_len": seq, "tp": tp}))
    return lane_rate, pool


def _with_state(model: Model, machine: Machine, lane: Lane, rates: set[int], add: Callable[[Figure], Figure],
                notes: list[str], violations: list[Violation], operands: dict[str, object]) -> StatePool | None:
    tp = lane.tensor_parallel_size
    for i, group in enumerate(model.state):
        reason = group.split_reason(tp)
        if reason:
            violations.append(Violation("parallel", f"state[{i}] ({group.kind}): {reason}; vLLM 0.33 refuses such "
                                        "a layout at boot (mamba_utils.py `divide`)",
                                        "pick a tensor-parallel size that divides the state's heads and channels",
                                        lane=lane.name))
            return None
    if len(rates) != 1:
        notes.append("state layers beside attention layers of several page sizes, or none: vLLM's shared page "
                     "layout is not modelled here — the state is left out, so the KV figures are optimistic")
        return None
    if lane.speculative is not None:
        notes.append("speculative decoding on a model with state layers: vLLM keeps extra state per draft token, "
                     "not counted here (a lower bound on the state)")
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
