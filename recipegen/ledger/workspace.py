"""HBM the expert residency runtime allocates once per GPU at start-up besides the banks.

The plugin allocates these in vLLM's `load_model` (vllm_plugin/worker_runtime.py), before the
worker measures memory for the KV cache, so vLLM sizes the KV pool without them; the ledger
subtracts them before it back-solves the pool (`placements.placement_figures`):

* the kernels' shared workspace, one per expert geometry (`gpu.experts.Workspace`, used by the
  Triton MXFP4 and the Triton BF16/FP8-block split layers): with P = max_num_batched_tokens ×
  top_k picks and PB the next power of two ≥ max(P, 2), int32 `2·PB + (P + 1) + max(P, 1) + 2`,
  one int64 and bf16 `P·(I + H)` (activation rows and per-pick output rows, which dominate);
  none with FlashInfer's TRT-LLM banks (SM100 family), whose scratch is allocated inside each
  call and so is part of vLLM's profiled activation peak (blackwell/trtllm.py `CallScratch`);
* the Triton MXFP4 kernels' split-K tickets (`gpu.experts.SplitScratch`, allocated with the
  workspace by `TritonMxfp4Experts`): the small-step schedule (T ≤ min(small_tokens 6, block_m
  16)) and the T = 1 fused finalize hand each row tile's reduction to its last program through
  one int32 ticket per (pick, row tile) and kernel, p = min(T, 6) × top_k picks: int32
  `p·(I/block_n1 + H/block_n2)` with the default tiles (64, 128) fitted to the geometry
  (`config_for_shape`); the default config splits no K and runs no stream-K, so its fp32
  partials are empty (DSv4.1: 36 × (2304/64 + 5120/128) × 4 = 10,944 B);
* the FP8-block dense kernels' quantized GEMM inputs (`gpu.dense_experts.TritonDenseExperts`):
  E4M3 `T·H + P·I` bytes and fp32 scales `4·(T·(H/128) + P·(I/128))`, T = max_num_batched_tokens;
* the BF16 / FP8-block dense kernels' T = 1 fused-finalize tickets (`TritonDenseExperts`): one
  int32 per 16 output rows, `4·ceil(H/16)` bytes, whatever the tile config (DeepSeek-V3: 1,792 B);
* the usage counter (`core.ExpertCounter`: int64 counts `[layers, experts]`, tokens and decode
  tokens `[layers]`) and the step masks (`vllm_plugin.step_masks.StepMasks`: bool
  `[max_num_batched_tokens + 1]`, int32 `[max_num_batched_tokens]`, one int64) — every rendered
  runtime lane counts (drift), so every one has them.

H and I are the sizes of the tensors the runtime's banks hold: where vLLM 0.33 pads an MXFP4
layer for the lane's backend (gpt-oss on Marlin / TRT-LLM: 2,880 / 2,880 -> 3,072 / 2,944) the
runtime reads its geometry off the padded tensors (`mxfp4_experts.checkpoint_geometry`) and sizes
its kernels from it, so the padded sizes apply (`vllm_layout.lane_geometry`).

All of it is allocated in `after_model_loaded` *before* the first layer is re-homed (the counter
in `_start_counter` — rendered lanes set EXPERT_RESIDENCY_DUMP_DIR — then the kernels' objects
in `_mxfp4_layers`, then `core.rehome_model`), so it is live at the load-time HBM peak too
(`load.load_figures`). A positional lane's usage-aware column at the same byte budget takes the
workspace the runtime would allocate there (`same_budget_workspace`).

The byte formulas and the kernels' tile defaults are the runtime's own, in the torch-free
`expert_residency.contract.sizing` (the kernels' objects size themselves with the same functions);
this module applies them to a lane. tests/test_ledger_workspace.py checks them against hand
arithmetic and against the runtime's own tensors (`nbytes`) on CPU. vLLM's
`max_num_batched_tokens` default is read from vLLM 0.33.0's `engine/arg_utils.py`
(`get_batch_defaults`, lines 2946-3039, and `_set_default_max_num_seqs_and_batched_tokens_args`,
lines 3151-3236).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from expert_residency.blackwell.select import FLASHINFER_TRTLLM, TRITON, TRITON_DOT_SCALED, select_bank_kernel
from expert_residency.contract import env as runtime_env
from expert_residency.contract.sizing import (
    BLOCK_N1,
    BLOCK_N2,
    counter_bytes,
    decode_counter_bytes,
    decode_mask_bytes,
    dense_ticket_bytes,
    fitted_tile,
    fp8_scratch_bytes,
    next_pow2,
    small_step_limit,
    split_scratch_bytes,
    step_mask_bytes,
    workspace_bytes,
)

from recipegen.common.units import GiB
from recipegen.ledger.adaptive import adaptive_hbm
from recipegen.ledger.figures import Figure
from recipegen.ledger.flags import flag_value, max_num_seqs, parsed_args
from recipegen.ledger.parallel import expert_parallel
from recipegen.ledger.result import USAGE_AWARE
from recipegen.ledger.vllm_layout import lane_geometry
from recipegen.schema import Lane, Machine, Model

# Expert formats whose split layer on CUDA runs a kernel with the shared workspace
# (vllm_plugin/mxfp4_experts.py; vllm_plugin/dense_layers.py, which refuses fp16 on CUDA).
WORKSPACE_FORMATS = ("mxfp4", "bf16", "fp8-block")

# vLLM 0.33 `vllm serve` (UsageContext.OPENAI_API_SERVER) defaults by GPU memory
# (engine/arg_utils.py:2973-3006): >= 160 GiB 16384; >= 70 GiB and not A100 / GB10 (12.1) 8192;
# else 2048.
SERVE_DEFAULT_TOKENS = ((160 * GiB, 16384), (70 * GiB, 8192))
SERVE_SMALL_TOKENS = 2048


def counter_and_mask_bytes(moe_layers: int, experts: int, max_tokens: int) -> int:
    """Counter (8·L·E + 16·L) plus step masks (5·max_num_batched_tokens + 9)."""
    return counter_bytes(moe_layers, experts) + step_mask_bytes(max_tokens)


def split_ticket_bytes(max_tokens: int, top_k: int, hidden: int, intermediate: int) -> int:
    """The split-K tickets of the Triton MXFP4 kernels at their default config fitted to the
    geometry (`config_for_shape`), as blackwell/plugin.py builds them."""
    return split_scratch_bytes(max_tokens, top_k, hidden, intermediate,
                               block_n1=fitted_tile(BLOCK_N1, int(intermediate)),
                               block_n2=fitted_tile(BLOCK_N2, int(hidden)))


@dataclass(frozen=True)
class BatchedTokens:
    """The lane's `max_num_batched_tokens` as vLLM 0.33 sets it, and why."""

    value: int
    reason: str


def max_num_batched_tokens(machine: Machine, lane: Lane) -> BatchedTokens:
    """`--max-num-batched-tokens` from extra_args, else the value vLLM 0.33 sets when the flag is
    not given (`_set_default_max_num_seqs_and_batched_tokens_args`, engine/arg_utils.py:3151-3236):
    the `vllm serve` default for the GPU, doubled by `--performance-mode throughput`, at least
    max_model_len with `--no-enable-chunked-prefill`, then at most max_num_seqs × max_model_len.

    Not modelled: the batched data-parallel MoE default (256 tokens, :3167-3170; it needs
    --data-parallel-size > 1, which the recipe loader refuses) and the multimodal prefix-LM floor
    (:3201-3216; no catalog model is one)."""
    args = list(lane.extra_args)
    given = flag_value(args, "--max-num-batched-tokens")
    if given is not None and given.strip().isdigit():
        return BatchedTokens(int(given), "--max-num-batched-tokens in extra_args")
    hbm, kind = machine.gpus.usable, machine.gpus.kind.lower()
    value, why = SERVE_SMALL_TOKENS, "vLLM 0.33's `vllm serve` default below 70 GiB"
    for floor, tokens in SERVE_DEFAULT_TOKENS:
        small_tier = floor < 160 * GiB and ("a100" in kind or machine.gpus.compute_capability == "12.1")
        if hbm >= floor and not small_tier:
            value, why = tokens, f"vLLM 0.33's `vllm serve` default for a GPU of ≥ {floor // GiB} GiB"
            break
    why += " (engine/arg_utils.py:2973-3006)"
    if flag_value(args, "--performance-mode") == "throughput":
        value, why = 2 * value, why + ", doubled by --performance-mode throughput (:3184-3186)"
    chunked = parsed_args(args).get("--enable-chunked-prefill")
    if chunked is not None and not chunked.on and lane.max_model_len > value:
        value, why = lane.max_model_len, "max_model_len: chunked prefill off (engine/arg_utils.py:3194-3199)"
    # vLLM 0.33 then caps its default at max_num_seqs × max_model_len (engine/arg_utils.py:3221-3224);
    # the render always passes --max-num-seqs (concurrency.max unless extra_args gives it), so that
    # is the max_num_seqs vLLM uses here.
    seqs, in_extra_args = max_num_seqs(args, lane.concurrency.max)
    cap = seqs * lane.max_model_len
    if cap < value:
        source = "--max-num-seqs in extra_args" if in_extra_args else "concurrency.max"
        value, why = cap, (f"max_num_seqs {seqs} ({source}) × max_model_len {lane.max_model_len:,}: "
                           "vLLM 0.33 caps its default there (engine/arg_utils.py:3221-3224); "
                           f"uncapped it would be {value:,}, {why}")
    return BatchedTokens(value, why)


def runtime_mounted(model: Model, lane: Lane) -> bool:
    """The lane runs the runtime's split (render: usage-aware with experts left to re-home)."""
    return lane.offload.placement == USAGE_AWARE and lane.offload.hot_experts_per_layer != model.routed_experts


def bank_kernel(model: Model, machine: Machine, lane: Lane) -> str | None:
    """The split layer's kernel on the lane's GPU (`blackwell.select`), None for formats the
    runtime does not run on CUDA with a workspace."""
    fmt = model.expert_format
    if fmt not in WORKSPACE_FORMATS:
        return None
    if fmt != "mxfp4":
        return TRITON
    cc_text = machine.gpus.compute_capability
    if cc_text is None:
        return TRITON  # unknown GPU: counted as the Triton kernels (the bytes an SM100 lane lacks)
    major, minor = (int(p) for p in cc_text.split("."))
    requested = lane.env.get(runtime_env.BANK_KERNEL, "").strip().lower() or "auto"
    try:
        return select_bank_kernel((major, minor), requested).kernel
    except ValueError:
        return select_bank_kernel((major, minor)).kernel  # render / the runtime refuse it by name


def expert_geometry(model: Model, machine: Machine | None = None, lane: Lane | None = None
                    ) -> tuple[int, int] | None:
    """(hidden, intermediate) of one routed expert as the runtime's banks hold it: with a machine
    and lane, vLLM's padded sizes where it pads them (`vllm_layout.lane_geometry`: the runtime reads
    its geometry off those tensors); else config values, else the w2 tensor [H, I]."""
    if machine is not None and lane is not None:
        padded = lane_geometry(model, machine, lane)
        if padded is not None:
            return padded
    hidden, inter = model.hidden_size, model.moe_intermediate_size
    if hidden is None or inter is None:
        w2 = [t for t in model.expert_tensors or [] if t.kind == "weight" and t.name.startswith("w2")]
        if not w2 or len(w2[0].shape) != 2:
            return None
        hidden, inter = hidden or w2[0].shape[0], inter or w2[0].shape[1]
    return hidden, inter


@dataclass(frozen=True)
class KernelBytes:
    """The split-layer kernels' start-up bytes per GPU and their parts (all 0 without them)."""

    workspace: int = 0
    tickets: int = 0
    fp8_scratch: int = 0

    @property
    def total(self) -> int:
        return self.workspace + self.tickets + self.fp8_scratch


def kernel_bytes(model: Model, machine: Machine, lane: Lane, tokens: int) -> KernelBytes:
    """What the lane's split-layer kernel objects allocate at start-up (per GPU), as the runtime
    reports it in `workspace_bytes`."""
    kernel = bank_kernel(model, machine, lane)
    geometry = expert_geometry(model, machine, lane)
    if kernel not in (TRITON, TRITON_DOT_SCALED) or geometry is None:
        return KernelBytes()
    hidden, inter = geometry
    if not expert_parallel(lane):
        # Tensor parallel shards the intermediate dim, H stays whole; expert parallel keeps
        # whole experts on each rank (every pick of the step still has a row, -1 for others).
        inter = inter // lane.tensor_parallel_size
    work = workspace_bytes(tokens, model.top_k, hidden, inter)
    if model.expert_format == "mxfp4":
        return KernelBytes(work, tickets=split_ticket_bytes(tokens, model.top_k, hidden, inter))
    if model.expert_format == "fp8-block":
        return KernelBytes(work, tickets=dense_ticket_bytes(hidden),
                           fp8_scratch=fp8_scratch_bytes(tokens, model.top_k, hidden, inter))
    return KernelBytes(work, tickets=dense_ticket_bytes(hidden))


def runtime_workspace_bytes(model: Model, machine: Machine, lane: Lane) -> int:
    """`hbm.runtime_workspace` of a lane running the runtime's split (0 on a CPU device)."""
    if machine.gpus.kind.strip().lower() == "cpu":
        return 0
    tokens = max_num_batched_tokens(machine, lane).value
    return (kernel_bytes(model, machine, lane, tokens).total
            + counter_and_mask_bytes(model.num_moe_layers, model.routed_experts, tokens))


def same_budget_workspace(model: Model, machine: Machine, lane: Lane, cold_bytes: float) -> float:
    """The runtime's start-up HBM in a lane's usage-aware column: the lane's own figure on a
    usage-aware lane; on a positional lane what the runtime would allocate if it split this
    lane's experts at the same byte budget (none when that column keeps every expert hot)."""
    if lane.offload.placement == USAGE_AWARE:
        return runtime_workspace_bytes(model, machine, lane) if runtime_mounted(model, lane) else 0.0
    return float(runtime_workspace_bytes(model, machine, lane)) if cold_bytes > 0 else 0.0


def workspace_figures(model: Model, machine: Machine, lane: Lane,
                      add: Callable[[Figure], Figure]) -> float:
    """`hbm.runtime_workspace` (per GPU) and its parts; 0 (and no figure) without the runtime."""
    if not runtime_mounted(model, lane):
        return 0.0
    if machine.gpus.kind.strip().lower() == "cpu":
        # vLLM's CPU build: the runtime's buffers are host memory, and it reports 0 device bytes.
        note = "CPU device: the runtime's workspace and counter are host memory (reported as 0)"
        for key, label in (("hbm.runtime_workspace.kernels", "  of which split-layer kernel workspace"),
                           ("hbm.runtime_workspace.counter", "  of which usage counter and step masks"),
                           ("hbm.runtime_workspace", "runtime workspace (per GPU)")):
            add(Figure(key, label, 0, "bytes", "", {"max_num_batched_tokens": 0}, note))
        return 0.0
    tp = lane.tensor_parallel_size
    tokens = max_num_batched_tokens(machine, lane)
    kernel = bank_kernel(model, machine, lane)
    geometry = expert_geometry(model, machine, lane)
    parts = kernel_bytes(model, machine, lane, tokens.value)
    if parts.total:
        assert geometry is not None
        hidden, inter = geometry
        picks = tokens.value * model.top_k
        ep = expert_parallel(lane)
        i_txt = "I" if ep else "I/tp"  # expert parallel: whole experts per rank
        formula = (f"4·(2·PB + P + 1 + max(P,1) + 2) + 8 + 2·P·({i_txt} + H), P = max_num_batched_tokens"
                   " × top_k, PB = next_pow2(max(P,2))")
        operands = {"max_num_batched_tokens": tokens.value, "top_k": model.top_k, "P": picks,
                    "PB": next_pow2(max(picks, 2)), "hidden": hidden, "intermediate": inter, "tp": tp,
                    "workspace_bytes": parts.workspace}
        note = f"runtime's {kernel} kernels (gpu.experts.Workspace"
        if parts.tickets and model.expert_format != "mxfp4":
            formula += " + T=1 finalize tickets 4·ceil(H / 16)"
            operands["dense_ticket_bytes"] = parts.tickets
            note += (" + gpu.dense_experts: one int32 ticket per 16 output rows of the fused T=1 "
                     "finalize hand-off")
        elif parts.tickets:
            i_rank = inter if ep else inter // tp
            formula += f" + split-K tickets 4·p·({i_txt} / block_n1 + H / block_n2), p = min(T, 6) × top_k"
            operands.update(split_ticket_bytes=parts.tickets, p=max(min(tokens.value, small_step_limit())
                                                                   * model.top_k, 1),
                            block_n1=fitted_tile(BLOCK_N1, i_rank),
                            block_n2=fitted_tile(BLOCK_N2, hidden))
            note += (" + gpu.experts.SplitScratch: one int32 ticket per (pick, row tile) of the small-step "
                     "split-K / fused T=1 finalize hand-off")
        if parts.fp8_scratch:
            formula += f" + FP8 inputs T·H + P·{i_txt} + 4·(T·H/128 + P·{i_txt}/128)"
            operands["fp8_scratch_bytes"] = parts.fp8_scratch
            note += " + gpu.dense_experts FP8-block quantized inputs (E4M3 values, fp32 scales)"
        add(Figure("hbm.runtime_workspace.kernels", "  of which split-layer kernel workspace", parts.total,
                   "bytes", formula, operands,
                   f"{note}); max_num_batched_tokens: {tokens.reason}"))
    elif kernel == FLASHINFER_TRTLLM:
        add(Figure("hbm.runtime_workspace.kernels", "  of which split-layer kernel workspace", 0, "bytes", "", {},
                   "FlashInfer TRT-LLM banks allocate their scratch inside each call (in vLLM's profiled peak)"))
    counter = counter_and_mask_bytes(model.num_moe_layers, model.routed_experts, tokens.value)
    formula = "8·moe_layers·routed_experts + 16·moe_layers + 5·max_num_batched_tokens + 9"
    note = "core.ExpertCounter + vllm_plugin.step_masks.StepMasks (rendered lanes always count: drift)"
    adaptive = lane.offload.adaptive
    if adaptive is not None and adaptive.rank_picks == "decode":
        counter += (decode_counter_bytes(model.num_moe_layers, model.routed_experts)
                    + decode_mask_bytes(tokens.value))
        formula += " + 16·moe_layers·routed_experts + max_num_batched_tokens + 9"
        note += "; offload.adaptive.rank_picks decode: the decode-picks count and the per-row decode mask"
    add(Figure("hbm.runtime_workspace.counter", "  of which usage counter and step masks", counter, "bytes",
               formula, {"moe_layers": model.num_moe_layers, "routed_experts": model.routed_experts,
                         "max_num_batched_tokens": tokens.value}, note))
    spare = adaptive_hbm(model, lane, add)
    total = parts.total + counter + spare
    operands = {"kernel_workspace_bytes": parts.total, "counter_bytes": counter}
    if spare:
        operands["adaptive_spare_hbm_bytes"] = spare
    add(Figure("hbm.runtime_workspace", "runtime workspace (per GPU)", total, "bytes",
               "kernel workspace + counter and step masks" + (" + adaptive spare rows" if spare else ""),
               operands,
               "allocated by the runtime in load_model, before vLLM sizes the KV cache, so not in a "
               "reserve back-solved from a boot without it; allocated before the runtime moves the "
               "first experts, so also in the load-time HBM peak"))
    return float(total)

