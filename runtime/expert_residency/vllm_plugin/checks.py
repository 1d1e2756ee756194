"""Pure checks behind the refusals (no vllm, no torch): each returns None or the one-line reason.

The plugin gathers the facts from vLLM objects (see ``worker_runtime``) and refuses on the first
reason; these functions are what the unit tests exercise for refusals the CPU engine cannot
trigger (EPLB needs expert parallelism on GPUs; monolithic backends are GPU-only).
"""

from __future__ import annotations

from collections.abc import Sequence


def eplb_reason(enable_eplb: bool) -> str | None:
    if not enable_eplb:
        return None
    return ("--enable-eplb is on: EPLB rearranges expert rows and ids behind the runtime's back "
            "(physical ids, one contiguous tensor per parameter); turn EPLB off or set "
            "EXPERT_RESIDENCY_MODE=off")


def lora_reason(lora_enabled: bool, mode: str) -> str | None:
    if not lora_enabled or mode not in ("residency", "unsplit"):
        return None
    return ("LoRA is enabled (--enable-lora): LoRA on MoE replaces the expert kernel the residency "
            "split drives; disable LoRA or set EXPERT_RESIDENCY_MODE=off/count")


def monolithic_reason(is_monolithic: bool, backend: str, layer_name: str) -> str | None:
    if not is_monolithic:
        return None
    return (f"{layer_name}: MoE backend {backend} is monolithic (routing happens inside the kernel, "
            "no routing ids reach Python); choose a modular backend with --moe-backend")


def deferred_finalize_reason(deferred: bool, layer_name: str) -> str | None:
    """vLLM 0.33 lets a layer's consumer own the top-k reduction (DSv4.1's mHC all-reduce fusion
    at TP > 1 with TRTLLM modular experts); the split path finalizes itself."""
    if not deferred:
        return None
    return (f"{layer_name}: the model defers the MoE top-k finalize to its all-reduce (vLLM's "
            "use_deferred_moe_finalize: DSv4.1 mHC fusion at TP > 1); the residency split "
            "finalizes itself and does not return vLLM's unfinalized output — run TP=1/PP, or "
            "set EXPERT_RESIDENCY_MODE=off/count")


def expert_parallel_reason(local_num_experts: int, global_num_experts: int,
                           layer_name: str) -> str | None:
    if local_num_experts == global_num_experts:
        return None
    return (f"{layer_name}: expert parallelism places {local_num_experts} of {global_num_experts} "
            "experts on this rank; the runtime supports one rank holding every expert (TP/PP, no EP)")


def expert_parallel_adaptive_reason(adaptive: bool, layer_name: str) -> str | None:
    """Adaptive swaps rank and move experts by global id over banks of every expert; under EP a
    rank's banks hold only its local experts (``vllm_plugin.expert_parallel``)."""
    if not adaptive:
        return None
    return (f"{layer_name}: adaptive residency (EXPERT_RESIDENCY_ADAPTIVE) with expert parallelism: "
            "the policy swaps experts by global id, a rank's banks hold only its local experts; "
            "unset EXPERT_RESIDENCY_ADAPTIVE or run without --enable-expert-parallel")


def geometry_reason(map_layers: Sequence[int], map_experts: int, model_layers: Sequence[int],
                    model_experts: Sequence[int], rowmap_path: str) -> str | None:
    """The row map must cover exactly the model's MoE layers, with its routed-expert count."""
    experts = sorted(set(model_experts))
    if len(experts) != 1:
        return f"the model's MoE layers disagree on the routed-expert count ({experts})"
    if map_experts != experts[0]:
        return (f"row map {rowmap_path} is for {map_experts} experts per layer, the model has "
                f"{experts[0]}: geometry mismatch (wrong map for this model?)")
    if sorted(map_layers) != sorted(model_layers):
        missing = sorted(set(model_layers) - set(map_layers))
        extra = sorted(set(map_layers) - set(model_layers))
        return (f"row map {rowmap_path} covers MoE layers {_span(map_layers)}, the model has "
                f"{_span(model_layers)} (missing {missing[:5]}, extra {extra[:5]}): geometry mismatch")
    return None


def _span(indices: Sequence[int]) -> str:
    values = sorted(indices)
    if not values:
        return "none"
    if values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}-{values[-1]}" if len(values) > 1 else str(values[0])
    return ",".join(str(v) for v in values[:8]) + ("..." if len(values) > 8 else "")
