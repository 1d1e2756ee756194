"""The plugin's entry to bank-kernel selection: one call builds the CUDA experts object an MXFP4
geometry runs on, chosen by ``blackwell.select`` (compute capability + ``EXPERT_RESIDENCY_BANK_KERNEL``).

Both objects it returns have the interface ``vllm_plugin.mxfp4_experts.Mxfp4Residency`` uses:
``name``, ``to_kernel_layout(tensors)`` (before re-homing), ``per_pick_fn()`` (the core's contract),
``forward(layer, x, topk_weights, topk_ids, *, counter=, token_mask=, decode_mask=)`` (the fused
split layer) and ``workspace.nbytes``. ``None`` means the core's torch reference
(``torch-reference``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from ..contract.expert_formats import GPTOSS_SWIGLU_ALPHA, GPTOSS_SWIGLU_LIMIT
from .select import (
    FLASHINFER_TRTLLM,
    TORCH_REFERENCE,
    TRITON_DOT_SCALED,
    BankKernelChoice,
    activation_refusal,
    bank_kernel_from_env,
)

TRTLLM_ACTIVATION = "mxfp8"   # vLLM 0.33's first TRT-LLM choice for DeepSeek-V4-style MXFP4
FLASHINFER_MIN_TUNE_TOKENS = 8192  # vLLM's fi_moe_largest_bucket floor


def cuda_bank_experts(hidden: int, intermediate: int, num_experts: int, top_k: int,
                      max_tokens: int, device: torch.device | str, *,
                      kernel_config: Any | None = None, swiglu_limit: float | None = None,
                      activation: str = "silu", capability: tuple[int, int] | None = None,
                      environ: Mapping[str, str] | None = None
                      ) -> tuple[Any | None, str, BankKernelChoice]:
    """(experts object or None, its name, the choice) for one MXFP4 geometry on a CUDA ``device``.
    ``capability`` defaults to the device's; ValueError when the lane's override cannot run here.
    ``activation="swigluoai"`` (gpt-oss, with biases): the runtime's Triton kernels or the torch
    reference; the TRT-LLM bank path is not wired for it (ValueError naming the override)."""
    dev = torch.device(device)
    cap = capability if capability is not None else torch.cuda.get_device_capability(dev)
    choice = bank_kernel_from_env(cap, environ)
    clamp = "" if swiglu_limit is None else f", swiglu_limit={swiglu_limit:g}"
    if activation == "swigluoai":
        clamp = f", swigluoai alpha {GPTOSS_SWIGLU_ALPHA:g} limit {GPTOSS_SWIGLU_LIMIT:g} + biases"
    refusal = activation_refusal(choice.kernel, activation)
    if refusal is not None:
        raise ValueError(refusal)
    if choice.kernel == FLASHINFER_TRTLLM:
        from .trtllm import TrtllmMxfp4Banks

        experts = TrtllmMxfp4Banks(hidden, intermediate, num_experts, top_k,
                                   activation=TRTLLM_ACTIVATION, swiglu_limit=swiglu_limit,
                                   tune_max_num_tokens=max(int(max_tokens), FLASHINFER_MIN_TUNE_TOKENS),
                                   device=dev)
        return experts, experts.name, choice
    if choice.kernel == TORCH_REFERENCE:
        return None, f"expert_residency torch MXFP4 reference (core.reference{clamp})", choice
    from ..gpu.experts import ExpertShape, KernelConfig, TritonMxfp4Experts, config_for_shape
    from ..gpu.tile_rules import check_compiled_block_m

    shape = ExpertShape(hidden, intermediate)
    # Default tiles shrink to the geometry (gpt-oss's 2,880 = 45 x 64); a given config is kept.
    config = kernel_config if kernel_config is not None else config_for_shape(shape, KernelConfig())
    if choice.kernel == TRITON_DOT_SCALED:
        config = dataclasses.replace(config, dequant=1)
    # Refused before any allocation: block_m < 16 computes wrong outputs compiled (gpu.tile_rules).
    check_compiled_block_m(config, dev)
    experts = TritonMxfp4Experts(shape, num_experts, top_k, max_tokens, dev, config,
                                 swiglu_limit=swiglu_limit, activation=activation)
    return experts, f"expert_residency Triton MXFP4 ({config.describe()}{clamp})", choice
