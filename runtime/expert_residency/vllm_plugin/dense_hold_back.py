"""BF16 / FP8-block layers in the split modes: hold back vLLM's kernel-format conversion where the
runtime computes the layer itself (``dense_layers`` holds the layout and the per-pick function,
``unquantized_experts`` / ``fp8_experts`` decide which layers those are)."""

from __future__ import annotations

from typing import Any

from . import fp8_experts, unquantized_experts
from .dense_layers import FP8_BLOCK
from .hold_back import hold_back_checkpoint_layout


def hold_back(method: Any, get_runtime: Any, is_weights_pre_processed: Any, reason_fn: Any,
              expert_format: str) -> None:
    """Replace ``method.process_weights_after_loading`` so the target model's layers keep the
    checkpoint layout (no conversion, no vLLM kernel) and are marked ``_er_dense``; layers the
    runtime cannot compute exactly refuse here, at load. vLLM's method stays on the layer
    (``_er_vllm_process_weights``) for a drafter's layers, as ``mxfp4_experts.hold_back_conversion``."""
    def mark(module: Any) -> None:
        module._er_dense = expert_format
        # vLLM's runner builds the method's quant config on the first forward if none exists
        # (``RoutedExperts._ensure_moe_quant_config_init``), reading the layer's weight/bias
        # parameters — which re-homing has removed by then. Build it now, as vLLM's own
        # conversion would have (``_init_moe_kernel``); the runtime's forward never reads it.
        method.moe_quant_config = method.get_fused_moe_quant_config(module)

    hold_back_checkpoint_layout(method, get_runtime, is_weights_pre_processed, reason_fn,
                                expert_format, mark)


def keep_dense_checkpoint_layout(layer: Any, get_runtime: Any) -> None:
    """Split modes' hook (``routed_experts``): hold back vLLM's conversion on the layer's
    unquantized or FP8-block method where the runtime computes the layer itself (see
    ``unquantized_experts.wants_runtime_kernel`` and ``fp8_experts``)."""
    try:
        from vllm.model_executor.utils import is_weights_pre_processed
    except ImportError:
        return
    method = getattr(layer, "quant_method", None)
    if unquantized_experts.is_unquantized_method(method):
        if unquantized_experts.wants_runtime_kernel(layer):
            hold_back(method, get_runtime, is_weights_pre_processed,
                      unquantized_experts.unquantized_unsupported_reason, "bf16")
    elif fp8_experts.is_fp8_method(method):
        hold_back(method, get_runtime, is_weights_pre_processed,
                  fp8_experts.fp8_unsupported_reason, FP8_BLOCK)
