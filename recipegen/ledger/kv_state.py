"""The KV pool of a model whose layers keep a state per sequence (Gated DeltaNet, Mamba-2) beside
attention, as vLLM 0.33 lays it out — per tensor-parallel rank, in tokens and in sequences.

vLLM shares one block pool between the attention layers and the state layers:

1. Pages of one size. The attention block grows until one attention page (block × bytes per
   token per layer) holds a state page, and the state page is padded to it
   (`Platform._align_hybrid_block_size`, vllm/platforms/interface.py:940-1135): block =
   align · ⌈state / (align · attention per token)⌉, align = 16 (the attention kernels' smallest
   block: FLASH_ATTN / FlashInfer / Triton, v1/attention/backends/flash_attn.py:357-367), widened
   to 64 where Gated DeltaNet prefills export checkpoints (see 3).
2. Groups of equal size. Layers are grouped by kind; each group has as many layers as the
   smallest kind (or the largest, when it is under 1.5 × the smallest), and one block of the pool
   is one page for each layer of a group (v1/core/kv_cache_planning.py:416-590, :601-640).
3. Blocks per sequence. A full-attention group takes ⌈max_model_len / block⌉ blocks; a state
   group takes 1 block, or 2 with prefix caching ("align" mode: the running state and the last
   cached one, v1/kv_cache_interface.py:1135-1141) — on by default for hybrid models
   (config/cache.py:257, config/model.py:2277-2279, model_executor/models/config.py:763-779) —
   plus 1 when the Gated DeltaNet prefill kernel exports mid-prefill checkpoints (FlashInfer:
   compute capability 9.0, or 10.x / 12.x with a 128-wide key head and CUDA 13,
   model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:243-268, :691-720).
   vLLM's own concurrency is pool blocks ÷ Σ blocks per sequence
   (v1/core/kv_cache_utils.py:1061-1093).

A max_model_len sequence therefore costs (Σ blocks) × group size × page on every rank; the pool
holds ⌊pool ÷ that⌋ of them, and the same pool holds at most ⌊blocks ÷ (attention groups + state
blocks)⌋ sequences of any length — the state is paid per sequence, not per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import lcm

from recipegen.ledger.figures import Figure
from recipegen.ledger.flags import flag_value
from recipegen.schema import Lane, Machine, Model
from recipegen.schema.model import STATE_DTYPE_BYTES, StateLayers

KERNEL_BLOCK = 16            # smallest block of vLLM 0.33's attention backends
GDN_CHECKPOINT_ALIGNMENT = 64   # v1/attention/backends/gdn_attn.py:34


@dataclass(frozen=True)
class KeptLayers:
    """Attention layers `--kv-cache-dtype-skip-layers` keeps at the model's dtype beside a quantized
    cache, in a model with state layers: the largest bytes per token per layer of any attention part,
    and the layer count of each attention spec (the layers at the cache dtype, those kept)."""

    rate: int
    buckets: tuple[int, ...]


@dataclass(frozen=True)
class StatePool:
    block_tokens: int            # attention block size vLLM picks
    attn_bytes: int              # attention bytes per token per layer (per rank)
    state_page: int              # bytes of one state page before padding
    page: int                    # the unified page
    group_size: int              # layers per group
    attention_groups: int
    state_groups: int
    state_blocks: int            # blocks per sequence per state group
    attention_blocks: int        # blocks per max_model_len sequence per attention group
    bytes_per_block: int         # group_size × page
    blocks_per_sequence: int     # blocks one max_model_len sequence holds, all groups
    bytes_per_sequence: int      # blocks per sequence × bytes per block
    min_blocks_per_sequence: int  # a 1-token sequence: 1 block per attention group + state blocks
    prefix_caching: bool
    checkpoints: bool
    align: int                   # the block's alignment in tokens
    kernel_align: int            # before the GDN checkpoint alignment
    kept: KeptLayers | None = None   # skip-layers beside state layers: priced at the kept layers' page
    hybrid_block: int = 0        # the block before the skip-layers bump (kept only)


def prefix_caching(lane: Lane) -> bool:
    """vLLM 0.33 turns prefix caching on for hybrid models unless the lane turns it off."""
    args = list(lane.extra_args)
    return "--no-enable-prefix-caching" not in args


def gdn_checkpoints(model: Model, machine: Machine) -> bool:
    """Whether vLLM's Gated DeltaNet prefill exports checkpoints on this GPU (FlashInfer GDN)."""
    gdn = [g for g in model.state if g.kind == "gdn"]
    cc = machine.gpus.compute_capability
    if not gdn or cc is None:
        return False
    major, _, minor = cc.partition(".")
    if (int(major), int(minor or 0)) == (9, 0):
        return True
    return int(major) in (10, 12) and all(g.head_k_dim == 128 for g in gdn)


_MAMBA_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def lane_state_groups(model: Model, lane: Lane) -> list[StateLayers]:
    """The model's state groups with the lane's `--mamba-cache-dtype` (conv and SSM) and
    `--mamba-ssm-cache-dtype` (SSM) applied (vllm/model_executor/layers/mamba/mamba_utils.py:98-111)."""
    args = list(lane.extra_args)
    conv = _MAMBA_DTYPES.get(flag_value(args, "--mamba-cache-dtype") or "")
    ssm = _MAMBA_DTYPES.get(flag_value(args, "--mamba-ssm-cache-dtype") or "")
    out = []
    for g in model.state:
        update: dict[str, str] = {}
        if conv:
            update.update(conv_dtype=conv, ssm_dtype=conv)
        if ssm:
            update["ssm_dtype"] = ssm
        out.append(g.model_copy(update=update) if update else g)
    return out


def state_pool(model: Model, machine: Machine, lane: Lane, attn_bytes_per_token_per_layer: int,
               kept: KeptLayers | None = None) -> StatePool:
    """The pool's layout. `kept`: attention layers kept at the model's dtype (`KeptLayers`); vLLM 0.33
    first sizes the block for the state at the cache dtype (platforms/interface.py:783-787), then
    bumps it until a page of the cache dtype covers a kernel block of the model's dtype and the
    padded state page (:789-793, :909-925), and pads the state to that page (:931-937). A kept
    full-attention layer's page is then block × its own bytes per token, larger than the others
    (model_executor/layers/attention/attention.py:674-682), and vLLM unifies the pages to the largest
    (v1/core/kv_cache_planning.py:346-409) with one group per spec (:416-556). Priced here at an upper
    bound: every page at the kept layers' size, every attention layer holding `block` tokens a page."""
    tp, seq = lane.tensor_parallel_size, lane.max_model_len
    state_pages = {g.bytes_per_sequence_per_layer(tp) for g in lane_state_groups(model, lane)}
    state_page = max(state_pages)
    caching = prefix_caching(lane)
    checkpoints = caching and gdn_checkpoints(model, machine)
    user_block = flag_value(list(lane.extra_args), "--block-size")
    align = max(KERNEL_BLOCK, int(user_block) if user_block and user_block.isdigit() else 0)
    base_align = align
    if checkpoints:
        align = lcm(align, GDN_CHECKPOINT_ALIGNMENT)
    a = attn_bytes_per_token_per_layer
    block = align * -(-state_page // (align * a))
    hybrid_block = block
    page = block * a
    n_attn = sum(len(g.layers) for g in model.attention)
    n_state = sum(len(g.layers) for g in model.state)
    buckets: tuple[int, ...] = (n_attn,)
    if kept is not None:
        # interface.py:909-925: required = max(kept per token × kernel block, the state page padded to
        # block × a, where it was padded); the block grows in steps of itself until block × a covers it
        padded = page if page != state_page else 0
        required = max(kept.rate * KERNEL_BLOCK, padded)
        step = max(KERNEL_BLOCK, block)
        block = max(block, step * -(-required // (step * a)))
        page = max(block * kept.rate, state_page)
        buckets = kept.buckets
    sizes = (*buckets, n_state)
    small, large = min(sizes), max(sizes)
    group = large if large < small * 1.5 else small
    attn_groups, state_groups = sum(-(-n // group) for n in buckets), -(-n_state // group)
    state_blocks = (2 + (1 if checkpoints else 0)) if caching else 1
    attn_blocks = -(-seq // block)
    per_block = group * page
    blocks = attn_groups * attn_blocks + state_groups * state_blocks
    return StatePool(block, a, state_page, page, group, attn_groups, state_groups, state_blocks, attn_blocks,
                     per_block, blocks, blocks * per_block, attn_groups + state_groups * state_blocks, caching,
                     checkpoints, align, base_align, kept, hybrid_block if kept else 0)


def state_pool_figures(pool: StatePool, model: Model, lane: Lane) -> list[Figure]:
    src = "vLLM 0.33 platforms/interface.py:940-1135; v1/core/kv_cache_planning.py:416-640"
    why_align = (f"lcm({pool.kernel_align}, {GDN_CHECKPOINT_ALIGNMENT}): GDN prefill checkpoints land on block "
                 "boundaries" if pool.align != pool.kernel_align else "the attention kernels' smallest block")
    block = Figure("kv.block_tokens", "attention block (tokens)", pool.block_tokens, "tokens",
                   "align × ⌈state_page / (align × attention bytes per token per layer)⌉",
                   {"state_page_bytes": pool.state_page, "attention_bytes_per_token_per_layer": pool.attn_bytes,
                    "align": pool.align}, f"{src}; align = {why_align}")
    page = Figure("kv.page_bytes", "one page: an attention block; the state padded to it (per GPU)", pool.page,
                  "bytes", "block × attention bytes per token per layer",
                  {"block_tokens": pool.block_tokens, "attention_bytes_per_token_per_layer": pool.attn_bytes,
                   "state_padding_bytes": pool.page - pool.state_page}, src)
    if pool.kept is not None:
        hybrid_page = pool.hybrid_block * pool.attn_bytes
        step = max(KERNEL_BLOCK, pool.hybrid_block)
        block = Figure(
            "kv.block_tokens", "attention block (tokens), bumped for the layers kept at the model's dtype",
            pool.block_tokens, "tokens",
            "max(hybrid_block, step × ⌈required_page / (step × attention bytes per token per layer)⌉), "
            "hybrid_block = align × ⌈state_page / (align × attention bytes per token per layer)⌉, step = max(16, "
            "hybrid_block), required_page = max(kept bytes per token per layer × 16, the state page padded to "
            "hybrid_block × attention bytes per token per layer where it was padded)",
            {"hybrid_block_tokens": pool.hybrid_block, "state_page_bytes": pool.state_page,
             "attention_bytes_per_token_per_layer": pool.attn_bytes, "align": pool.align, "step_tokens": step,
             "kept_bytes_per_token_per_layer": pool.kept.rate,
             "required_page_bytes": max(pool.kept.rate * KERNEL_BLOCK,
                                        hybrid_page if hybrid_page != pool.state_page else 0)},
            f"vLLM 0.33 platforms/interface.py:940-1135 (the state), :909-925 (the layers kept at the model's dtype); "
            f"align = {why_align}")
        page = Figure(
            "kv.page_bytes", "one page, priced at a kept layer's: block × its bytes per token (per GPU)", pool.page,
            "bytes", "max(block × kept bytes per token per layer, state_page)",
            {"block_tokens": pool.block_tokens, "kept_bytes_per_token_per_layer": pool.kept.rate,
             "state_page_bytes": pool.state_page, "state_padding_bytes": pool.page - pool.state_page},
            "a kept full-attention layer's page is block × its bytes per token (vLLM 0.33 model_executor/layers/"
            "attention/attention.py:674-682), the largest, and vLLM unifies every page to the largest (v1/core/"
            "kv_cache_planning.py:346-409); an upper bound, every layer's page counted at it")
    return [
        _state_figure(pool, model, lane),
        block,
        page,
        Figure("kv.bytes_per_block", f"one pool block: a page for each of {pool.group_size} layers (per GPU)",
               pool.bytes_per_block, "bytes", "layers per group × page",
               {"layers_per_group": pool.group_size, "page_bytes": pool.page,
                "attention_groups": pool.attention_groups, "state_groups": pool.state_groups}, src),
        Figure("kv.state_blocks_per_sequence", "blocks each state group holds per sequence", pool.state_blocks,
               "count", "2 with prefix caching (+1 for GDN prefill checkpoints), else 1",
               {"prefix_caching": pool.prefix_caching, "gdn_checkpoints": pool.checkpoints},
               "vLLM 0.33 v1/kv_cache_interface.py:1135-1141; prefix caching is on by default (config/cache.py:257; "
               "--no-enable-prefix-caching turns it off)" + _checkpoint_note(pool, model)),
    ]


def _state_figure(pool: StatePool, model: Model, lane: Lane) -> Figure:
    """The state page with the operands that give it: those of the state group whose page is the
    largest (the one every page is sized for)."""
    tp = lane.tensor_parallel_size
    groups = lane_state_groups(model, lane)
    g = max(groups, key=lambda group: group.bytes_per_sequence_per_layer(tp))
    conv_dtype, ssm_dtype = STATE_DTYPE_BYTES[g.conv_dtype], STATE_DTYPE_BYTES[g.ssm_dtype]
    channels, heads, conv, ssm = g.state_parts(tp)
    if g.kind == "gdn":
        assert g.num_k_heads and g.head_k_dim and g.num_v_heads and g.head_v_dim
        matrix = {"head_v_dim": g.head_v_dim, "head_k_dim": g.head_k_dim}
        how_channels = (f"(2 × num_k_heads × head_k_dim + num_v_heads × head_v_dim) / tp = (2 × {g.num_k_heads} × "
                        f"{g.head_k_dim} + {g.num_v_heads} × {g.head_v_dim}) / {tp}")
        heads_name = f"num_v_heads {g.num_v_heads}"
    else:
        assert g.num_heads and g.head_dim and g.n_groups and g.state_size
        matrix = {"head_dim": g.head_dim, "state_size": g.state_size}
        widened = g.n_groups + (0 if g.n_groups % tp == 0 else tp - g.n_groups)
        how_channels = (f"(num_heads × head_dim + 2 × n_groups × state_size) / tp = ({g.num_heads} × {g.head_dim} + "
                        f"2 × {widened} × {g.state_size}) / {tp}"
                        + (f" (n_groups {g.n_groups} widened to {widened} for tp)" if widened != g.n_groups else ""))
        heads_name = f"num_heads {g.num_heads}"
    names = " × ".join(matrix)
    others = [f"{other.kind} layers {other.bytes_per_sequence_per_layer(tp):,} B" for other in groups if other is not g]
    return Figure(
        "kv.state_bytes_per_sequence_per_layer", "state per sequence per layer (per GPU, before padding)",
        pool.state_page, "bytes",
        f"(conv_kernel − 1) × conv_channels × conv_dtype_bytes + state_heads × {names} × ssm_dtype_bytes",
        {"state": g.kind, "conv_kernel": g.conv_kernel, "conv_channels": channels, "conv_dtype": g.conv_dtype,
         "conv_dtype_bytes": conv_dtype, "state_heads": heads, **matrix, "ssm_dtype": g.ssm_dtype,
         "ssm_dtype_bytes": ssm_dtype, "conv_state_bytes": conv, "ssm_state_bytes": ssm, "tp": tp},
        f"per GPU: conv_channels = {how_channels}; state_heads = {heads_name} / tp; dtypes as the model's config "
        "and the lane's --mamba-cache-dtype / --mamba-ssm-cache-dtype give them"
        + (f"; the other state layers' pages are smaller ({', '.join(others)})" if others else "")
        + "; vLLM 0.33 model_executor/layers/mamba/mamba_utils.py:186-212, :272-294")


def _checkpoint_note(pool: StatePool, model: Model) -> str:
    if not pool.checkpoints:
        return ""
    return ("; GDN checkpoints: FlashInfer's GDN prefill (gdn/qwen_gdn_linear_attn.py:243-268), certain on compute "
            "capability 9.0, on 10.x / 12.x only with a CUDA 13 runtime in the image — without it one block fewer")
