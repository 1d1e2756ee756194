"""The Blackwell (SM100 family) bank kernel: FlashInfer's TRT-LLM routed MXFP4 MoE per bank with
``do_finalize=False`` and the runtime's fp32-fma finalize — the design the field report "vLLM: Pin
Hot Experts" (2026-09-17) measured on a GB300. docs/blackwell.md has the full account.

Modules (import them directly; none imports FlashInfer or vLLM at import time):

* ``select``    — ``bank_kernel_from_env`` / ``select_bank_kernel``: which kernel a device runs
                  (SM100 family: ``flashinfer-trtllm``; SM90/SM89: ``triton``), the per-lane override
                  ``EXPERT_RESIDENCY_BANK_KERNEL``, the start-up report fields (no torch).
* ``layout``    — the TRT-LLM weight/scale layout vLLM prepares, as torch rules (CPU), why banks
                  are per-expert slices of it, and ``convert_with_vllm`` (vLLM's own conversion).
* ``trtllm``    — ``TrtllmMxfp4Banks``: ids remapped to bank rows, one ``do_finalize=False``
                  launch per bank, the unfinalized rows gathered, one finalize.
* ``plugin``    — ``cuda_bank_experts``: the selected kernel object for one MXFP4 geometry (what the
                  vLLM plugin's ``Mxfp4Residency`` builds on CUDA).
* ``emulation`` — a torch model of the routed kernel's unfinalized output (CPU tests, dry runs).
* ``selfcheck`` — ``python -m expert_residency.blackwell.selfcheck``: split == unsplit on the
                  operator's SM100 box.
"""
