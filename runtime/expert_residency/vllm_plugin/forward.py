"""``forward_modular`` of the plugin's expert container, without a vLLM import.

``ResidencyRoutedExperts`` (``routed_experts``) is ``class ResidencyRoutedExperts(ResidencyForward,
RoutedExperts)``: vLLM's ``MoERunner`` calls ``routed_experts.forward_modular(x, topk_weights,
topk_ids, shared_experts, shared_experts_input)`` after its router picked the experts, and that
resolves to ``ResidencyForward.forward_modular`` below. Keeping the method in a module that needs
no vLLM lets the GPU tests and ``bench/plugin_gpu.py`` (the H200 has no vLLM) call the very method
vLLM calls, on stand-in layers with 0.33's parameters.

Per mode:

* runtime inactive: vLLM's own ``RoutedExperts.forward_modular`` (``super()``);
* ``count`` (layer not re-homed): count the picks on the device (``WorkerRuntime.count``), then
  vLLM's own kernel;
* ``residency``/``unsplit``: ``WorkerRuntime.split_forward`` — on CUDA for MXFP4 layers the fused
  split layer (``gpu.experts.TritonMxfp4Experts.forward``: both banks in one pass, Triton finalize,
  in-kernel counter), else the core's split invoke with the layer's per-pick function.

Every branch is decided by static properties of the layer and the process (mode, whether the
layer was re-homed, whether it is counted), so one captured CUDA graph replays the right kernels.
"""

from __future__ import annotations

from typing import Any

import torch

from .worker_runtime import get_runtime


class ResidencyForward:
    _er_resident: Any = None

    def _ensure_moe_quant_config_init(self) -> None:
        """vLLM's ``MoERunner`` calls this before every forward and, while the quant method has no
        quant config, builds one from the layer's weight-scale (and bias) parameters. The runtime
        never reads it for a layer it computes itself, and re-homing removed those parameters, so
        building it there would fail (MXFP4: ``w13_weight_scale`` is gone) or hold the originals."""
        if self._er_resident is not None:
            return
        super()._ensure_moe_quant_config_init()  # type: ignore[misc]

    def forward_modular(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                        shared_experts: Any = None, shared_experts_input: torch.Tensor | None = None,
                        ) -> Any:
        runtime = get_runtime()
        if runtime is None:
            return super().forward_modular(x, topk_weights, topk_ids,  # type: ignore[misc]
                                           shared_experts, shared_experts_input)
        if self._er_resident is None:
            runtime.check_installed(self)
            runtime.count(self, topk_ids)
            return super().forward_modular(x, topk_weights, topk_ids,  # type: ignore[misc]
                                           shared_experts, shared_experts_input)
        run_kernel_internal_shared_experts(self, shared_experts, shared_experts_input)
        return runtime.split_forward(self, x, topk_weights, topk_ids)


def run_kernel_internal_shared_experts(layer: Any, shared_experts: Any,
                                       shared_experts_input: torch.Tensor | None) -> None:
    """Do what ``FusedMoEKernel`` would have done with the shared experts it was handed: run
    them here only where the modular kernel runs them itself (async prepare/finalize);
    otherwise the MoE runner runs them outside ``forward_modular``."""
    if shared_experts is None:
        return
    kernel = getattr(layer.quant_method, "moe_kernel", None)
    prepare_finalize = getattr(kernel, "prepare_finalize", None)
    if prepare_finalize is None or not prepare_finalize.supports_async():
        return
    from vllm.model_executor.layers.fused_moe.runner.shared_experts import SharedExpertsOrder

    shared_experts(shared_experts_input, SharedExpertsOrder.MK_INTERNAL_OVERLAPPED)
