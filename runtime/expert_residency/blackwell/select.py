"""Which bank kernel a lane's MXFP4 experts run on: chosen by compute capability, overridable.

Kernels (the names are the values of ``EXPERT_RESIDENCY_BANK_KERNEL``):

* ``flashinfer-trtllm`` — FlashInfer's TRT-LLM routed MXFP4 MoE (``trtllm_fp4_block_scale_routed_moe``,
  what vLLM 0.33's ``TrtLlmMxfp4ExpertsModular`` calls) once per bank with ``do_finalize=False``,
  then the runtime's fp32-fma finalize (``blackwell.trtllm``). FlashInfer ships this kernel for the
  SM100 family only (sm100/sm103; the field report "Should a GB300 Prefetch Its Cold Experts?"
  (2026-10-23) found no sm_120 code), and vLLM gates it the same way
  (``TrtLlmMxfp4ExpertsBase._supports_current_device``: ``is_device_capability_family(100)``).
* ``triton`` — the runtime's Triton MXFP4 kernels with their default dequantizer
  (``gpu.experts.KernelConfig()``), tuned on the H200 (SM90); also SM89 and anything else with CUDA.
* ``triton-dot-scaled`` — the same Triton kernels with ``tl.dot_scaled`` (``KernelConfig(dequant=1)``),
  the second Blackwell option. As the kernels call it (bf16 activations without scales) Triton
  decomposes it into an upcast + bf16 MMA on every device, SM100 included: its native block-scaled
  MMA needs scales on both operands (docs/blackwell.md).
* ``torch-reference`` — the core's torch reference (``core.reference``); what a CPU device runs.

``auto`` (the default) picks ``flashinfer-trtllm`` on the SM100 family (major 10), ``triton`` on
other CUDA devices, ``torch-reference`` without CUDA. An explicit choice is honoured or refused
with a message naming the variable — never silently replaced.

No torch import here: recipegen's renderer and the start-up report read the same table.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..contract.env import BANK_KERNEL as ENV_VAR

FLASHINFER_TRTLLM = "flashinfer-trtllm"
TRITON = "triton"
TRITON_DOT_SCALED = "triton-dot-scaled"
TORCH_REFERENCE = "torch-reference"
AUTO = "auto"
KERNELS = (FLASHINFER_TRTLLM, TRITON, TRITON_DOT_SCALED, TORCH_REFERENCE)

# Compute-capability major of the SM100 family (B200/GB200 sm100, B300/GB300 sm103).
SM100_FAMILY_MAJOR = 10


@dataclass(frozen=True)
class BankKernelChoice:
    """The kernel a device runs, and why (the start-up report's ``extra`` fields)."""

    kernel: str
    """One of ``KERNELS``."""
    capability: tuple[int, int] | None
    """The device's compute capability, None without CUDA."""
    requested: str
    """What ``EXPERT_RESIDENCY_BANK_KERNEL`` asked for (``auto`` when unset)."""
    reason: str
    """One line: why this kernel."""

    def report_fields(self) -> dict[str, str]:
        """Keys for the start-up report's ``extra`` (``formats.report.StartupReport``)."""
        cap = "none" if self.capability is None else f"sm{self.capability[0]}{self.capability[1]}"
        return {"bank_kernel": self.kernel, "bank_kernel_requested": self.requested,
                "compute_capability": cap, "bank_kernel_reason": self.reason}


def is_sm100_family(capability: tuple[int, int] | None) -> bool:
    return capability is not None and int(capability[0]) == SM100_FAMILY_MAJOR


def requested_kernel(environ: Mapping[str, str] | None = None) -> str:
    """The lane's override: ``EXPERT_RESIDENCY_BANK_KERNEL`` (``auto`` when unset or empty).
    ValueError naming the variable for an unknown value."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_VAR, "").strip().lower() or AUTO
    if value != AUTO and value not in KERNELS:
        raise ValueError(f"{ENV_VAR}={env.get(ENV_VAR)!r}: expected one of "
                         f"{', '.join((AUTO,) + KERNELS)}")
    return value


def select_bank_kernel(capability: tuple[int, int] | None, requested: str = AUTO
                       ) -> BankKernelChoice:
    """The bank kernel for a device of ``capability`` (None: no CUDA device), honouring
    ``requested`` (``auto`` or one of ``KERNELS``). ValueError when the request cannot run there."""
    cap = None if capability is None else (int(capability[0]), int(capability[1]))
    if requested == AUTO:
        if cap is None:
            return BankKernelChoice(TORCH_REFERENCE, cap, requested, "no CUDA device")
        if is_sm100_family(cap):
            return BankKernelChoice(FLASHINFER_TRTLLM, cap, requested,
                                    "SM100 family: FlashInfer TRT-LLM routed MXFP4 per bank")
        return BankKernelChoice(TRITON, cap, requested,
                                f"sm{cap[0]}{cap[1]} is not SM100: the runtime's Triton kernels")
    if requested not in KERNELS:
        raise ValueError(f"{ENV_VAR}={requested!r}: expected one of {', '.join((AUTO,) + KERNELS)}")
    if requested == TORCH_REFERENCE:
        return BankKernelChoice(requested, cap, requested, f"requested by {ENV_VAR}")
    if cap is None:
        raise ValueError(f"{ENV_VAR}={requested}: needs a CUDA device, none is visible")
    if requested == FLASHINFER_TRTLLM and not is_sm100_family(cap):
        raise ValueError(f"{ENV_VAR}={requested}: FlashInfer's TRT-LLM MXFP4 MoE runs on the SM100 "
                         f"family only; this device is sm{cap[0]}{cap[1]} (use {TRITON} or "
                         f"{AUTO})")
    return BankKernelChoice(requested, cap, requested, f"requested by {ENV_VAR}")


def activation_refusal(kernel: str, activation: str) -> str | None:
    """Why the bank ``kernel`` cannot run MXFP4 experts with ``activation``, None when it can.
    FlashInfer's TRT-LLM path is wired for SiLU (with its clamp) only, not for gpt-oss's
    SwiGLU-OAI with biases, which the Triton kernels and the torch reference compute."""
    if kernel == FLASHINFER_TRTLLM and activation == "swigluoai":
        return (f"gpt-oss MXFP4 (swigluoai, biases): the FlashInfer TRT-LLM bank kernel is not wired "
                f"for it; set {ENV_VAR}={TRITON}")
    return None


def bank_kernel_from_env(capability: tuple[int, int] | None,
                         environ: Mapping[str, str] | None = None) -> BankKernelChoice:
    """``select_bank_kernel(capability, requested_kernel(environ))``: what the runtime calls."""
    return select_bank_kernel(capability, requested_kernel(environ))


# vLLM 0.33 ``--moe-backend`` value whose stock MXFP4 experts run the same GEMMs as each bank
# kernel (``oracle/mxfp4.py`` ``map_mxfp4_backend``: "flashinfer_trtllm" -> the
# FLASHINFER_TRTLLM_MXFP4_{BF16,MXFP8} backends; "triton_unfused" -> TRITON_UNFUSED): the
# renderer's table and the peer a benchmark runs side by side.
STOCK_MOE_BACKEND = {
    FLASHINFER_TRTLLM: "flashinfer_trtllm",
    TRITON: "triton_unfused",
    TRITON_DOT_SCALED: "triton_unfused",
    TORCH_REFERENCE: "auto",
}
