"""Run the runtime right after vLLM's model loader returns: weights loaded and converted to the
kernel format (``process_weights_after_loading``), before the model runner wraps the model and
before the worker measures memory for the KV cache.

``BaseModelLoader.load_model`` is the one method every in-tree loader built on the default flow
goes through (default/safetensors, dummy, ...); loaders that override it wholesale (tensorizer,
weight-cache IPC) are not covered, and in split modes a layer that was never installed refuses
at its first forward (during vLLM's profile/warm-up run, i.e. before serving).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from .worker_runtime import get_runtime

_MARK = "_expert_residency_hook"


def install_loader_hook() -> None:
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    original = BaseModelLoader.load_model
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        model = original(self, *args, **kwargs)
        runtime = get_runtime()
        if runtime is not None:
            check_expert_containers(model, runtime)
            runtime.after_model_loaded(model)
        return model

    setattr(load_model, _MARK, True)
    BaseModelLoader.load_model = load_model  # type: ignore[method-assign]


def check_expert_containers(model: Any, runtime: Any) -> None:
    """Refuse the target model when one of its MoE layers is a ``RoutedExperts`` subclass the
    plugin did not take over (``gptoss_routed_experts.unseen_expert_layers``): vLLM would serve it
    with its own kernel, uncounted and unsplit, and the runtime would report nothing wrong. A
    second model's (the drafter's) such layers are only logged: vLLM serves a drafter anyway."""
    from .gptoss_routed_experts import unseen_expert_layers, unseen_layers_reason
    from .refusal import refuse

    unseen = unseen_expert_layers(model)
    if not unseen:
        return
    if getattr(runtime, "target_layers", None):
        print(f"expert_residency: a second model (drafter) has {len(unseen)} MoE layer(s) the "
              f"runtime does not take over, left to vLLM's own kernel: {unseen[:4]}",
              file=sys.stderr, flush=True)
        return
    refuse(unseen_layers_reason(unseen))
