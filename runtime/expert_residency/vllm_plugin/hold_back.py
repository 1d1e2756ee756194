"""The one wrapper that holds back vLLM's kernel-format conversion for layers the runtime computes
(MXFP4: ``mxfp4_experts.hold_back_conversion``; BF16 / FP8-block: ``dense_hold_back.hold_back``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def hold_back_checkpoint_layout(method: Any, get_runtime: Callable[[], Any],
                                is_weights_pre_processed: Callable[[], bool],
                                reason_fn: Callable[[Any], str | None], expert_format: str,
                                mark: Callable[[Any], None]) -> None:
    """Replace ``method.process_weights_after_loading`` so the target model's layers keep the
    checkpoint layout (no conversion, no vLLM kernel) and are marked by ``mark``; layers the
    runtime cannot compute exactly (``reason_fn``) refuse here, at load. vLLM's own method stays on
    the layer (``_er_vllm_process_weights``) and still runs for a second model's layers (a
    drafter, loaded after the target's banks exist), which vLLM's kernel serves. Idempotent."""
    if getattr(method, "_er_wrapped", False):
        return
    vllm_process = method.process_weights_after_loading

    def process_weights_after_loading(module: Any) -> None:
        from .refusal import refuse

        module._er_vllm_process_weights = vllm_process
        runtime = get_runtime()
        if runtime is None or runtime.target_layers:
            vllm_process(module)
            return
        if is_weights_pre_processed():
            refuse(f"{module.layer_name}: pre-processed (kernel-format) {expert_format} weights "
                   "cannot be split; load the checkpoint layout with residency")
        reason = reason_fn(module)
        if reason is not None:
            refuse(reason)
        mark(module)

    method.process_weights_after_loading = process_weights_after_loading
    method._er_wrapped = True
