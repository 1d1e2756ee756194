"""The reserves of a lane: HBM (non-expert, non-KV) and host (page cache, processes).

Each is a measured input (given, or back-solved from a measured boot) or, for a lane that has not
booted yet, an estimate from the model and the machine; the label says which (`reserve_basis`),
and only a reserve that carries a measurement is called measured.
"""

from __future__ import annotations

import re
from typing import Any

from recipegen.common.units import GiB, MiB
from recipegen.ledger.figures import Figure
from recipegen.ledger.parallel import dense_per_rank
from recipegen.ledger.pinning import boot_pinning
from recipegen.ledger.result import USAGE_AWARE
from recipegen.schema import Lane, Machine, Model
from recipegen.schema.lane import HbmReserve, HostReserve

# Estimated HBM reserve: what vLLM 0.33's profile run and CUDA-graph capture take besides the
# dense weights and its fused-MoE workspace — the sampler's logits, attention and residual
# activations of max_num_batched_tokens tokens, the captured graphs (vLLM logged "Estimated CUDA
# graph memory: 0.73 GiB total" for a Qwen3.5-MoE model in vllm-project/vllm pull request "[Model]
# Add GGUF support for Qwen 3.5 dense and MoE models", 2026-04-13). An allowance, not a
# measurement: 2 GiB per GPU.
ESTIMATE_HBM_ALLOWANCE = 2 * GiB
# Estimated host reserve: the operating system with vLLM's API-server and engine-core processes,
# plus one worker process per GPU (each has imported torch and the CUDA libraries). Assumed
# figures (8 GiB, 4 GiB per GPU); the page cache of the checkpoint is reclaimable and not counted.
ESTIMATE_HOST_BASE = 8 * GiB
ESTIMATE_HOST_PER_GPU = 4 * GiB
# What a worker holds on its GPU before the weights load: the CUDA context, cuBLAS and, on a lane of
# more than one GPU, the NCCL communicators vLLM 0.33 creates first (its memory snapshot is taken
# "after NCCL is initialized", v1/worker/gpu_worker.py:531; a one-GPU group creates no device
# communicator, distributed/parallel_state.py:550). Measured on one NVIDIA H100 80GB HBM3 (driver
# 580.159.04, PyTorch 2.11.0+cu130), 2026-12-05, by NVML against the device before the process touched
# CUDA (bench/context_allowance.py): CUDA context 529 MiB, with cuBLAS 717 MiB (a Triton module adds
# nothing measurable), with a one-rank NCCL group and an all-reduce 1,281 MiB. Rounded up to 64 MiB:
# 768 MiB on a one-GPU lane, 1,344 MiB per GPU on a tensor-parallel one (a floor there: NCCL's buffers
# grow with the ranks). The earlier assumption, 512 MiB from a public "~400mb on each GPU" on RTX 3090s,
# was below the H100's context alone. At run time it lies in the part of the GPU
# --gpu-memory-utilization leaves out; while loading, the weights and it must fit the GPU together.
LOAD_CONTEXT_ONE_GPU = 768 * MiB
LOAD_CONTEXT_WITH_NCCL = 1344 * MiB


def load_context_allowance(tp: int) -> int:
    """Bytes a worker holds on its GPU before the weights load, per GPU of a lane of `tp` GPUs."""
    return LOAD_CONTEXT_ONE_GPU if tp <= 1 else LOAD_CONTEXT_WITH_NCCL
# vLLM's fused-MoE workspaces hold bf16 activations (the model's activation dtype).
ACTIVATION_BYTES = 2

ESTIMATED_NOTE = "estimated, not measured: replace with a measured boot (recipegen verify)"


def reserve_basis(spec: HbmReserve | HostReserve | None) -> str:
    """How a reserve was obtained, as printed: `back-solved`, `measured`, `estimated`, `assumed`,
    or `declared` (a value whose recipe does not say it was measured)."""
    if spec is None:
        return "not declared"
    if spec.back_solved_from is not None:
        return "back-solved"
    if spec.estimated:
        return "estimated"
    return spec.basis or "declared"


_STAGE_SHARE = "'s share (stage.hbm_reserve)"


def stage_share_source(rank: int) -> str:
    """The source a pipeline stage's HBM reserve is given (recipegen.ledger.multinode), by which
    `stage_share` knows it: one owner for the text both read."""
    return f"stage {rank}{_STAGE_SHARE}"


def stage_share_words(rank: int, kind: str) -> str:
    """How a pipeline stage's HBM reserve note names what it derives from (`stage_share_of` reads it)."""
    return f"stage {rank}'s share of the lane's {kind} single-box reserve"


def stage_share_of(note: str) -> tuple[str, str] | None:
    """(`stage N`, the single-box reserve's basis) where `note` is a stage reserve's (`stage_share_words`)."""
    found = re.search(r"(stage \d+)'s share of the lane's ([\w -]+?) single-box reserve", note)
    return (found[1], found[2]) if found else None


def stage_share(spec: HbmReserve | HostReserve | None) -> bool:
    """Whether `spec` is a pipeline stage's share of its lane's single-box reserve, as the stage
    ledger is given it (`stage_share_source`): a value derived there, not declared."""
    return spec is not None and re.fullmatch(r"stage \d+" + re.escape(_STAGE_SHARE), spec.source or "") is not None


def _value_note(spec: HbmReserve | HostReserve) -> str:
    kind = reserve_basis(spec)
    what = {"measured": "measured input", "assumed": "assumed input (not measured)"}.get(
        kind, "declared input (not marked measured: set basis)")
    return f"{what}: {spec.source}"


def hbm_reserve(model: Model, machine: Machine, lane: Lane, add: Any) -> float:
    spec = lane.reserves.hbm
    tp = lane.tensor_parallel_size
    if spec.estimated:
        return estimated_hbm_reserve(model, machine, lane, add)
    if spec.value is not None:
        return add(Figure("hbm.reserve", "HBM reserve (non-expert, non-KV)", spec.value, "bytes", "", {},
                          _value_note(spec))).value
    m = spec.back_solved_from
    assert m is not None
    hot_at_measure = m.hot_experts_per_layer * model.num_moe_layers * model.expert_bytes / tp
    value = machine.gpus.usable * m.gpu_memory_utilization - hot_at_measure - m.kv_pool
    return add(Figure(
        "hbm.reserve", "HBM reserve (dense, drafter, activations, CUDA graphs)", value, "bytes",
        "hbm_capacity × measured_utilization − measured_hot × moe_layers × bytes_per_expert / tp − measured_kv_pool",
        {"hbm_capacity_bytes": machine.gpus.usable, "measured_utilization": m.gpu_memory_utilization,
         "measured_hot": m.hot_experts_per_layer, "moe_layers": model.num_moe_layers,
         "bytes_per_expert": model.expert_bytes, "tp": tp, "measured_kv_pool_bytes": m.kv_pool},
        f"back-solved from a measured boot: {spec.source}")).value


def fused_moe_workspace(model: Model, lane: Lane, tokens: int, *, vllm_computes: bool | None = None) -> float:
    """vLLM 0.33's fused-MoE workspaces for `tokens` tokens on one GPU (Triton experts,
    vllm/model_executor/layers/fused_moe/experts/triton_moe.py:240-255: workspace1 (M, top_k,
    max(I, H)) and workspace2 (M, top_k, max(2I, H)), bf16, the output reusing workspace1 —
    modular_kernel.py:1183-1205), I per rank. None on a lane whose experts the residency runtime
    computes (its own workspace is `hbm.runtime_workspace`). `vllm_computes`: whether vLLM's own
    fused-MoE kernels compute the experts in the placement priced (default: the lane's own)."""
    if model.moe_intermediate_size is None or model.hidden_size is None:
        return 0.0
    if vllm_computes is None:
        vllm_computes = not runtime_computes(model, lane)
    if not vllm_computes:
        return 0.0
    inter = model.moe_intermediate_size / lane.tensor_parallel_size
    hidden = model.hidden_size
    return tokens * model.top_k * (max(inter, hidden) + max(2 * inter, hidden)) * ACTIVATION_BYTES


def runtime_computes(model: Model, lane: Lane) -> bool:
    """Whether the residency runtime, not vLLM's fused-MoE kernels, computes the lane's experts."""
    return lane.offload.placement == USAGE_AWARE and lane.offload.hot_experts_per_layer != model.routed_experts


def _estimate_formula(runtime: bool) -> str:
    workspace = "max_num_batched_tokens × top_k × (max(I/tp, H) + max(2·I/tp, H)) × 2 B"
    if runtime:   # the operand is 0 B: say why beside the product it would be
        workspace = ("0 B here: the runtime computes the experts, so vLLM's fused-MoE workspace is not "
                     f"allocated; where vLLM's kernels compute them, {workspace}")
    return (f"dense per GPU + drafter / tp + fused-MoE workspace ({workspace}) + allowance for CUDA graphs "
            "and activations")


def estimated_hbm_reserve(model: Model, machine: Machine, lane: Lane, add: Any) -> float:
    """dense weights per GPU + vLLM's fused-MoE workspace at max_num_batched_tokens + allowance."""
    from recipegen.ledger.workspace import max_num_batched_tokens

    tp = lane.tensor_parallel_size
    dense = dense_per_rank(model, tp)
    batched = max_num_batched_tokens(machine, lane)
    moe = fused_moe_workspace(model, lane, batched.value)
    drafter = ((model.drafter.weights if model.drafter else None) or 0) / tp
    value = dense.value + drafter + moe + ESTIMATE_HBM_ALLOWANCE
    note = ESTIMATED_NOTE
    if model.dense_bytes is None:
        note += "; the model declares no dense_bytes, so its dense weights are missing from the estimate"
    return add(Figure(
        "hbm.reserve", "HBM reserve (estimated: dense, drafter, activations, CUDA graphs)", value, "bytes",
        _estimate_formula(runtime_computes(model, lane)),
        {"dense_bytes": dense.value, "drafter_bytes": drafter, "fused_moe_workspace_bytes": moe,
         "max_num_batched_tokens": batched.value, "allowance_bytes": ESTIMATE_HBM_ALLOWANCE, "tp": tp},
        f"{note} (max_num_batched_tokens: {batched.reason}; allowance: recipegen.ledger.reserves)")).value


def placement_hbm_reserve(model: Model, machine: Machine, lane: Lane, lane_reserve: Figure,
                          placement: str, hot_per_layer: list[int]) -> Figure | None:
    """An estimated reserve re-estimated for one placement column, where its fused-MoE workspace
    differs from the lane's: plain vLLM (positional) computes the experts with its fused-MoE kernels
    and needs their workspace; usage-aware residency computes them itself unless every expert is
    hot. None when the reserve is not estimated or the column's reserve is the lane's."""
    from recipegen.ledger.workspace import max_num_batched_tokens

    if not lane.reserves.hbm.estimated:
        return None
    computes = placement != USAGE_AWARE or all(h == model.routed_experts for h in hot_per_layer)
    tokens = max_num_batched_tokens(machine, lane).value
    moe = fused_moe_workspace(model, lane, tokens, vllm_computes=computes)
    lane_moe = lane_reserve.operands["fused_moe_workspace_bytes"]
    if moe == lane_moe:
        return None
    operands = {**lane_reserve.operands, "fused_moe_workspace_bytes": moe}
    who = ("plain vLLM computes the experts with its fused-MoE kernels" if computes
           else "the residency runtime computes the experts (its workspace is hbm.runtime_workspace)")
    return Figure("hbm.reserve", "HBM reserve (estimated for this placement)",
                  lane_reserve.value - lane_moe + moe, "bytes", _estimate_formula(not computes), operands,
                  f"{ESTIMATED_NOTE}; re-estimated for this column: {who}")


def host_reserve(model: Model, lane: Lane, add: Any, notes: list[str]) -> float:
    spec = lane.reserves.host
    if spec is None:
        notes.append("no host reserve declared: page cache and processes are not counted")
        return add(Figure("host.reserve", "host reserve (page cache, processes)", 0, "bytes", "", {},
                          "not declared (reserves.host)")).value
    if spec.estimated:
        gpus = lane.tensor_parallel_size
        value = ESTIMATE_HOST_BASE + ESTIMATE_HOST_PER_GPU * gpus
        return add(Figure("host.reserve", "host reserve (estimated: OS and vLLM processes)", value, "bytes",
                          "OS, API server and engine core + one worker process per GPU",
                          {"base_bytes": ESTIMATE_HOST_BASE, "per_gpu_bytes": ESTIMATE_HOST_PER_GPU, "gpus": gpus},
                          ESTIMATED_NOTE + "; page cache is reclaimable and not counted")).value
    if spec.value is not None:
        return add(Figure("host.reserve", "host reserve (page cache, processes)", spec.value, "bytes",
                          "", {}, _value_note(spec))).value
    m = spec.back_solved_from
    assert m is not None
    # The boot's pinned experts by the ledger's own pinning model (recipegen.ledger.pinning), the
    # one its load and host figures use, so replaying that boot gives back its measured host use.
    boot = boot_pinning(model, m.pinned_experts)
    value = m.host_used - boot.pinned_bytes - model.host_table_bytes
    layers = f"{boot.layers_whole} MoE layers" + (" and part of one more" if boot.layers_partial else "")
    rest = m.pinned_experts - boot.expert_bytes
    return add(Figure("host.reserve", "host reserve (page cache, processes)", value, "bytes",
                      "measured_host_used − measured_pinned_blocks − host_tables",
                      {"measured_host_used_bytes": m.host_used,
                       "measured_pinned_experts_bytes": m.pinned_experts,
                       "measured_expert_params_bytes": boot.expert_bytes,
                       "measured_pinned_blocks_bytes": boot.pinned_bytes,
                       "host_tables_bytes": model.host_table_bytes},
                      f"back-solved from a measured boot: {spec.source}. The boot's pinned experts count as "
                      f"vLLM pins them: the routed-expert parameters within the {m.pinned_experts / GiB:.2f} GiB "
                      f"it offloaded ({layers}, {boot.expert_bytes / GiB:.2f} GiB), each rounded up to a power "
                      "of two by PyTorch's caching host allocator, as in load.host_pinned_initial"
                      + (f"; the other {rest / GiB:.2f} GiB (non-routed parameters the walk also met) stay "
                         "inside the reserve, as the ledger's walk does not count them" if rest > 0 else "")
                      + ". Evidence for counting them rounded: PyTorch rounds every pinned request "
                      "(ATen/core/CachingHostAllocator.h:300-309); the offloaded bytes are vLLM's own count "
                      "(vllm/model_executor/offloader/uva.py:124), not a reading of host memory; and on the GB300 of "
                      "the field report 'vLLM: Pin Hot Experts' (2026-09-17), v15, which frees vLLM's pinned blocks "
                      "for exact-size ones (62.33 GiB), left 125 GiB available against v14's 69: +56 GiB, where "
                      "the rounding predicts +52.4 GiB (114.75 → 62.33) and exact sizes −1.8 GiB (60.51 → 62.33) (docs/ledger.md 'The host "
                      "reserve of a measured boot')")).value


def basis_of(figure: Figure) -> str:
    """The basis of a `hbm.reserve` / `host.reserve` figure, read from the note its function wrote."""
    note = figure.note
    for prefix, kind in (("back-solved", "back-solved"), ("estimated", "estimated"),
                         ("measured input", "measured"), ("assumed input", "assumed"),
                         ("declared input", "declared")):
        if note.startswith(prefix):
            return kind
    return "not declared" if note.startswith("not declared") else "declared"
