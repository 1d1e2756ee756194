"""Unquantized (BF16/FP16) expert layers — vLLM 0.33 ``UnquantizedFusedMoEMethod`` — under residency.

``create_weights`` (``fused_moe/unquantized_fused_moe_method.py:68-129``) registers
``w13_weight [E, 2I, H]``, ``w2_weight [E, H, I]`` in the model dtype and, with
``moe.has_bias``, ``w13_bias [E, 2I]``/``w2_bias [E, H]``; ``process_weights_after_loading``
(lines 213-251) pads/shuffles them into the backend's format (``_setup_kernel``) and builds the
kernel with the biases in its quant config (``biased_moe_quant_config``, line 262).

Where the runtime computes such a layer itself (``wants_runtime_kernel``) the split modes hold
that conversion back (``dense_hold_back.hold_back``) and serve the checkpoint layout with
``dense_layers.DenseResidency``:

* on CUDA always — the runtime's Triton dense kernels use one tiling for every bank size, which
  the bit-identity claim needs (vLLM's Triton ``fused_moe`` picks its config by expert count);
* on CPU for layers vLLM's CPU per-bank path cannot take: expert biases, ``swigluoai``
  (gpt-oss) or a SILU clamp — the core's torch reference then; plain SILU layers keep vLLM's CPU
  kernel (``cpu_experts``), verified end to end. FP16 layers on CUDA keep vLLM's modular kernel.
"""

from __future__ import annotations

from typing import Any

import torch

from .dense_layers import activation_facts, capability_kwargs, swigluoai_constants_reason

SILU = "silu"


def is_unquantized_method(method: Any) -> bool:
    try:
        from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
            UnquantizedFusedMoEMethod,
        )
    except ImportError:
        return False
    return isinstance(method, UnquantizedFusedMoEMethod)


def wants_runtime_kernel(layer: Any, cuda: bool | None = None) -> bool:
    """True where the runtime (not vLLM's kernel) computes this unquantized layer in split modes."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    if cuda:
        # fp16 keeps vLLM's modular kernel (the runtime's dense kernels read bf16 or fp8)
        return getattr(getattr(layer, "w13_weight", None), "dtype", torch.bfloat16) != torch.float16
    facts = activation_facts(layer)
    has_bias = bool(getattr(getattr(layer, "moe_config", None), "has_bias", False)) or facts.biases
    return has_bias or facts.activation != SILU or facts.swiglu_limit is not None


def unsupported_reason_for(layer: Any, expert_format: str) -> str | None:
    """The capability table's verdict on a dense layer (plus swigluoai's constants and the GPU's
    compute capability), with the layer's name; None = the runtime computes it exactly."""
    from ..capabilities import unsupported_reason

    name = getattr(layer, "layer_name", "MoE layer")
    w13 = getattr(layer, "w13_weight", None)
    cc = None
    if w13 is not None and getattr(w13, "device", None) is not None and w13.device.type == "cuda":
        cc = torch.cuda.get_device_capability(w13.device)
    reason = swigluoai_constants_reason(layer)
    if reason is None:
        reason = unsupported_reason(expert_format=expert_format, compute_capability=cc,
                                    **capability_kwargs(activation_facts(layer)))
    if reason is None:
        return None
    return (f"{name}: {reason}; set EXPERT_RESIDENCY_MODE=off/count for this model "
            "(vLLM's own kernel then serves it)")


def unquantized_unsupported_reason(layer: Any) -> str | None:
    w13 = getattr(layer, "w13_weight", None)
    fmt = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(getattr(w13, "dtype", None), "bf16")
    return unsupported_reason_for(layer, fmt)
