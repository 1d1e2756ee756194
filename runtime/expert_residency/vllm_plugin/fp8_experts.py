"""FP8 block-scaled expert layers — vLLM 0.33 ``Fp8MoEMethod`` with ``weight_block_size`` — under
residency.

``create_weights`` (``quantization/fp8.py:530-663``) registers ``w13_weight [E, 2I, H]`` and
``w2_weight [E, H, I]`` as ``float8_e4m3fn``, fp32 block scales named ``w13_weight_scale_inv``
``[E, ceil(2I/bn), ceil(H/bk)]`` and ``w2_weight_scale_inv [E, ceil(H/bn), ceil(I/bk)]`` (the
``_inv`` name is DeepSeek-V3's, line 486), and optional biases. ``process_weights_after_loading``
(lines 713-767) converts them to the backend's format (``convert_to_fp8_moe_kernel_format``) and
builds a kernel whose quant config holds the **whole layer's** scales (``get_fused_moe_quant_config``)
— which a bank split cannot reuse. The split modes therefore hold that conversion back
(``dense_hold_back.hold_back``) and serve the checkpoint layout with the runtime's FP8-block kernels
(``dense_layers.DenseResidency``; W8A8 with per-token-group-128 activation quantization, as
``core.formats_ref.fp8_block_per_pick``).

Computed: block quantization with 128x128 blocks from an FP8 checkpoint (DeepSeek-V3, Qwen3-FP8),
``silu`` or ``swigluoai``, with or without biases. Refused: per-tensor FP8, online quantization
of a BF16 checkpoint, another block shape, and TP splits that make vLLM refine the block grid
(``weight_scale_refine``).
"""

from __future__ import annotations

from typing import Any

from .dense_layers import FP8_BLOCK, FP8_BLOCK_SHAPE
from .unquantized_experts import unsupported_reason_for


def is_fp8_method(method: Any) -> bool:
    try:
        from vllm.model_executor.layers.quantization.fp8 import Fp8MoEMethod
    except ImportError:
        return False
    return isinstance(method, Fp8MoEMethod)


def fp8_method_reason(method: Any, layer_name: str = "MoE layer") -> str | None:
    """Why the runtime cannot take this ``Fp8MoEMethod``'s layout (None: 128x128 block FP8 as loaded)."""
    if not getattr(method, "block_quant", False):
        return f"{layer_name}: per-tensor FP8 experts: the runtime computes 128x128 block-scaled FP8 only"
    quant_config = getattr(method, "quant_config", None)
    if not getattr(quant_config, "is_checkpoint_fp8_serialized", True):
        return (f"{layer_name}: FP8 quantized online from a BF16 checkpoint: the runtime splits FP8 "
                "checkpoints (or serve the BF16 checkpoint unquantized)")
    block = tuple(getattr(method, "weight_block_size", None) or ())
    shape = tuple(getattr(method, "moe_block_shape", None) or block)
    if block != FP8_BLOCK_SHAPE or shape != FP8_BLOCK_SHAPE:
        return (f"{layer_name}: FP8 block shape {list(block)} (kernel {list(shape)}): the runtime "
                f"computes {list(FP8_BLOCK_SHAPE)} blocks only")
    if getattr(method, "weight_scale_refine", None) is not None:
        return (f"{layer_name}: this tensor-parallel split makes vLLM refine the FP8 block grid "
                f"({method.weight_scale_refine}); the runtime reads 128x128 blocks as stored")
    return None


def fp8_unsupported_reason(layer: Any) -> str | None:
    reason = fp8_method_reason(getattr(layer, "quant_method", None), getattr(layer, "layer_name", "MoE layer"))
    if reason is not None:
        return reason + "; set EXPERT_RESIDENCY_MODE=off/count for this model"
    return unsupported_reason_for(layer, FP8_BLOCK)
