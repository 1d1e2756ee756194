"""The runtime's capability table: what it splits, what it refuses, and why (one line each)."""

from __future__ import annotations

from expert_residency.capabilities import FORMATS, unsupported_reason, unverified_note


def test_mxfp4_silu_with_clamp_is_supported_on_hopper() -> None:
    assert unsupported_reason(expert_format="mxfp4", swiglu_limit=7.0, compute_capability="9.0") is None
    assert unverified_note("mxfp4", "9.0") is None          # verified on the H200
    assert "8.9" in (unverified_note("mxfp4", "8.9") or "")  # supported, not verified there


def test_gpt_oss_mxfp4_experts_are_supported_and_other_formats_refuse_first_missing() -> None:
    # gpt-oss: MXFP4, biases, SwiGLU-OAI (alpha 1.702, beta 1.0, limit 7.0) in the Triton kernels.
    assert unsupported_reason(expert_format="mxfp4", activation="swigluoai", swiglu_alpha=1.702,
                              swiglu_beta=1.0, swiglu_limit=7.0, biases=True,
                              compute_capability="9.0") is None
    assert unsupported_reason(expert_format="mxfp4", biases=True) is None
    # fp16 still computes SILU only, without biases or alpha/beta: refused on the first one missing.
    reason = unsupported_reason(expert_format="fp16", activation="swigluoai", swiglu_alpha=1.702,
                                biases=True)
    assert reason is not None and "swigluoai" in reason
    assert "alpha/beta" in (unsupported_reason(expert_format="fp16", swiglu_alpha=1.702) or "")
    assert "biases" in (unsupported_reason(expert_format="fp16", biases=True) or "")
    assert "gelu" in (unsupported_reason(expert_format="mxfp4", activation="gelu") or "")


def test_formats_without_a_kernel_and_old_devices_are_refused() -> None:
    for fmt in ("fp8", "int4", "nvfp4"):
        assert not FORMATS[fmt].supported and unsupported_reason(expert_format=fmt) == FORMATS[fmt].why_not
    assert "not in the runtime's capability table" in (unsupported_reason(expert_format="q4_k") or "")
    assert "8.0 or newer" in (unsupported_reason(expert_format="mxfp4", compute_capability=(7, 5)) or "")
    # expert parallelism is split per rank (vllm_plugin.expert_parallel); EPLB stays refused
    assert unsupported_reason(expert_format="bf16", expert_parallel=True) is None
    assert "EPLB" in (unsupported_reason(expert_format="bf16", eplb=True) or "")


def test_experts_without_a_gate_are_refused_for_every_format() -> None:
    # Nemotron-H's relu2 experts (vLLM MoEActivation.RELU2_NO_MUL): an up projection, no gate rows.
    for fmt in ("bf16", "mxfp4", "fp8-block"):
        reason = unsupported_reason(expert_format=fmt, activation="relu2_no_mul", compute_capability="9.0")
        assert reason is not None and "without a gate" in reason and "relu2_no_mul" in reason
    assert "NVFP4" in unsupported_reason(expert_format="nvfp4", activation="relu2_no_mul")
