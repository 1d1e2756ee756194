"""Bank-kernel selection (``expert_residency.blackwell.select``): by compute capability, overridable
per lane through ``EXPERT_RESIDENCY_BANK_KERNEL``; refusals name the variable. No torch needed."""

from __future__ import annotations

import pytest
from expert_residency.blackwell.select import (
    ENV_VAR,
    FLASHINFER_TRTLLM,
    TORCH_REFERENCE,
    TRITON,
    TRITON_DOT_SCALED,
    bank_kernel_from_env,
    requested_kernel,
    select_bank_kernel,
)


@pytest.mark.parametrize("capability,kernel", [
    ((10, 0), FLASHINFER_TRTLLM),   # B200 / GB200
    ((10, 3), FLASHINFER_TRTLLM),   # B300 / GB300
    ((9, 0), TRITON),               # H100 / H200
    ((8, 9), TRITON),               # L40S / Ada
    ((12, 0), TRITON),              # RTX PRO 6000: no sm_120 TRT-LLM MXFP4 code
    (None, TORCH_REFERENCE),
])
def test_auto_by_capability(capability, kernel: str) -> None:
    assert select_bank_kernel(capability).kernel == kernel


def test_override_is_honoured_where_it_can_run() -> None:
    assert select_bank_kernel((10, 3), TRITON_DOT_SCALED).kernel == TRITON_DOT_SCALED
    assert select_bank_kernel((10, 0), TRITON).kernel == TRITON
    assert select_bank_kernel((9, 0), TRITON_DOT_SCALED).kernel == TRITON_DOT_SCALED
    assert select_bank_kernel(None, TORCH_REFERENCE).kernel == TORCH_REFERENCE


@pytest.mark.parametrize("capability,requested", [((9, 0), FLASHINFER_TRTLLM),
                                                  ((12, 0), FLASHINFER_TRTLLM),
                                                  (None, TRITON)])
def test_override_that_cannot_run_is_refused(capability, requested: str) -> None:
    with pytest.raises(ValueError, match=ENV_VAR):
        select_bank_kernel(capability, requested)


def test_environment_variable() -> None:
    assert requested_kernel({}) == "auto"
    assert requested_kernel({ENV_VAR: " Triton "}) == TRITON
    with pytest.raises(ValueError, match=f"{ENV_VAR}='cutlass'"):
        requested_kernel({ENV_VAR: "cutlass"})
    choice = bank_kernel_from_env((10, 3), {ENV_VAR: TRITON_DOT_SCALED})
    assert choice.kernel == TRITON_DOT_SCALED and choice.requested == TRITON_DOT_SCALED


def test_report_fields() -> None:
    fields = bank_kernel_from_env((10, 3), {}).report_fields()
    assert fields["bank_kernel"] == FLASHINFER_TRTLLM
    assert fields["compute_capability"] == "sm103"
    assert fields["bank_kernel_requested"] == "auto"
    assert select_bank_kernel(None).report_fields()["compute_capability"] == "none"


def test_plugin_entry_builds_the_selected_kernel() -> None:
    pytest.importorskip("torch")
    from expert_residency.blackwell.plugin import cuda_bank_experts
    from expert_residency.blackwell.trtllm import TrtllmMxfp4Banks

    experts, name, choice = cuda_bank_experts(5120, 2304, 384, 6, 512, "cpu", capability=(10, 3),
                                              environ={}, swiglu_limit=10.0)
    assert isinstance(experts, TrtllmMxfp4Banks) and choice.kernel == FLASHINFER_TRTLLM
    assert experts.activation == "mxfp8" and experts.tune_max_num_tokens == 8192
    assert "FlashInfer TRT-LLM" in name and "swiglu_limit=10" in name
    assert experts.workspace.nbytes == 0
    experts, name, choice = cuda_bank_experts(5120, 2304, 384, 6, 512, "cpu", capability=(10, 3),
                                              environ={ENV_VAR: TORCH_REFERENCE})
    assert experts is None and "reference" in name
    with pytest.raises(ValueError, match=ENV_VAR):
        cuda_bank_experts(5120, 2304, 384, 6, 512, "cpu", capability=(9, 0),
                          environ={ENV_VAR: FLASHINFER_TRTLLM})


def test_capability_table_keeps_the_sm100_caveat() -> None:
    from expert_residency.capabilities import unverified_note

    # The SM100 path is supported but was never run on such a device: the caveat must stay.
    note = unverified_note("mxfp4", (10, 3)) or ""
    assert "10.3" in note and "not run on SM100" in note
