"""Expert-format constants the runtime computes with and recipegen writes into model entries and
budgets with."""

from __future__ import annotations

# gpt-oss's SwiGLU-OAI: (up + 1) · gate · σ(alpha · gate), gate ≤ limit, -limit ≤ up ≤ limit.
# vLLM 0.33 layers/activation.py:481 (SwigluOAIAndMul defaults), quantization/mxfp4.py:428-430
# (gemm1_alpha, swiglu_limit), gpt_oss_triton_kernels_moe.py:714-715.
GPTOSS_SWIGLU_ALPHA = 1.702
GPTOSS_SWIGLU_LIMIT = 7.0
GPTOSS_SWIGLU_SOURCE = "vLLM 0.33.0 vllm/model_executor/layers/quantization/mxfp4.py:428 (gemm1_alpha=1.702)"

# FP8-block checkpoints: one scale per 128 x 128 weight block, and the runtime's dense kernels
# quantize activations in groups of 128 values (gpu/kernels_dense.py).
FP8_BLOCK = 128
