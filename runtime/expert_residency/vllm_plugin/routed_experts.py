"""``ResidencyRoutedExperts``: the expert container swapped in with ``RoutedExperts.register_oot``.

``RoutedExperts`` is a vLLM ``PluggableLayer`` (0.32 and 0.33): once registered, every
``RoutedExperts(...)`` that ``FusedMoEFactory`` builds is an instance of this subclass, so the
runtime owns the expert container of every MoE model without touching model files. Weight
creation, loading and kernel-format conversion are vLLM's own (``super().__init__``); the subclass
only registers the layer with the worker runtime and takes over ``forward_modular``
(``forward.ResidencyForward``, first in the bases, so it is the method vLLM's ``MoERunner`` calls).
"""

from __future__ import annotations

from typing import Any

from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

from .forward import ResidencyForward
from .worker_runtime import get_runtime


class ResidencyRoutedExperts(ResidencyForward, RoutedExperts):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        runtime = get_runtime()
        if runtime is not None:
            _require_modular_kernel(args[2] if len(args) > 2 else kwargs.get("moe_config"))
        super().__init__(*args, **kwargs)
        self._er_resident = None
        self._er_counted = False
        self._er_excluded = True  # until the runtime registers it (inert processes)
        self._er_mxfp4 = False
        if runtime is not None:
            runtime.register_layer(self)
            if runtime.settings.splits_experts:
                _keep_mxfp4_checkpoint_layout(self)
                from .dense_hold_back import keep_dense_checkpoint_layout  # BF16 / FP8-block layers
                keep_dense_checkpoint_layout(self, get_runtime)


def _keep_mxfp4_checkpoint_layout(layer: RoutedExperts) -> None:
    """Split modes own an MXFP4 layer's layout: hold back vLLM's conversion on the layer's
    ``Mxfp4MoEMethod`` or gpt-oss's ``GptOssMxfp4MoEMethod`` (a sibling class, not a subclass:
    ``quantization/mxfp4.py:152``; same checkpoint parameters plus bf16 biases)
    (``mxfp4_experts.hold_back_conversion``)."""
    try:
        from vllm.model_executor.layers.quantization import mxfp4 as vllm_mxfp4
        from vllm.model_executor.utils import is_weights_pre_processed
    except ImportError:  # a build without MXFP4 support has no such layers
        return
    methods = tuple(getattr(vllm_mxfp4, n) for n in ("Mxfp4MoEMethod", "GptOssMxfp4MoEMethod")
                    if hasattr(vllm_mxfp4, n))
    if methods and isinstance(layer.quant_method, methods):
        from .mxfp4_experts import hold_back_conversion

        hold_back_conversion(layer.quant_method, get_runtime, is_weights_pre_processed)


def _require_modular_kernel(moe_config: Any) -> None:
    """Ask vLLM's backend oracle for a modular (decomposed) experts class: monolithic kernels
    route inside the kernel and expose no ``topk_ids``. vLLM 0.33 honours
    ``FusedMoEConfig.require_decomposed_backend`` when it picks the experts class (in the quant
    method's constructor, which ``RoutedExperts.__init__`` runs); 0.32 has no such field, and a
    monolithic choice there is refused after load."""
    if moe_config is not None and hasattr(moe_config, "require_decomposed_backend"):
        moe_config.require_decomposed_backend = True
