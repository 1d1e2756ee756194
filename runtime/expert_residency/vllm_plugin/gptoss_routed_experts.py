"""Expert containers that models build through their own ``RoutedExperts`` subclass.

``RoutedExperts.register_oot`` replaces the class by *name*: ``PluggableLayer.__new__`` looks up
``cls.__name__`` in the OOT registry (``model_executor/custom_op.py:46-65``, vLLM 0.32 and 0.33),
so a model that passes ``routed_experts_cls=GptOssRoutedExperts`` to ``FusedMoEFactory``
(``models/gpt_oss.py:402``) is never handed ``ResidencyRoutedExperts`` — without this module the
runtime would not see gpt-oss's MoE layers at all (no split, no counts, no refusal). For
gpt-oss the residency container is registered under ``GptOssRoutedExperts``'s name and keeps its
weight loader (interleaved gate/up, biases, rank-0 ``w2_bias``) by inheritance:

    ResidencyGptOssRoutedExperts -> ResidencyRoutedExperts -> ResidencyForward -> GptOssRoutedExperts -> RoutedExperts

vLLM 0.33 has two more such subclasses a served model builds, registered the same way (their
own weight loaders kept by inheritance; vLLM's ``MoERunner`` still calls ``forward_modular``):

* Dbrx: ``DbrxExperts(RoutedExperts)`` (``models/dbrx.py:76``, built with
  ``routed_experts_cls=DbrxExperts`` at ``:175``; its loader splits w1/v1/w2);
* the Transformers modeling backend: ``TransformersRoutedExperts(RoutedExperts)``
  (``models/transformers/moe.py:167``, ``routed_experts_cls=`` at ``:348``; its
  ``TransformersMoERunner._forward_super`` runs ``MoERunner.forward``, ``:91-96``).

Other subclasses in the tree (``SubstitutedRoutedExperts``, ``fused_moe/expert_substitution.py:292``;
``DeepseekV4HeterogeneousSharedRoutedExperts``, ``models/deepseek_v4/amd/model.py:383``;
``MuseSparkConsolidatedRoutedExperts``, ``models/muse_spark/common/moe.py:133``) are not
registered: ``unseen_expert_layers`` finds any MoE layer the runtime does not own after load, and
the loader hook refuses the target model then (``loader_hook``), so residency never silently
leaves a layer to vLLM's kernel.
"""

from __future__ import annotations

from typing import Any

# (module, class) of the models' own RoutedExperts subclasses the runtime takes over.
MODEL_CONTAINERS = (
    ("vllm.model_executor.models.gpt_oss", "GptOssRoutedExperts"),
    ("vllm.model_executor.models.dbrx", "DbrxExperts"),
    ("vllm.model_executor.models.transformers.moe", "TransformersRoutedExperts"),
)


def _residency_class(base: type) -> type:
    from .routed_experts import ResidencyRoutedExperts

    return type(f"Residency{base.__name__}", (ResidencyRoutedExperts, base),
                {"__module__": __name__,
                 "__doc__": f"{base.__name__} with the runtime's forward and hooks."})


def register_model_routed_experts() -> list[str]:
    """Register residency containers for the models' own ``RoutedExperts`` subclasses that this
    vLLM has (``MODEL_CONTAINERS``); returns the class names registered (idempotent). A module
    this build cannot import (no such model, or a missing optional dependency) is skipped: its
    layers, if a model ever builds them, are refused after load (``unseen_expert_layers``)."""
    import importlib

    from vllm.model_executor.custom_op import op_registry_oot

    done = []
    for module_name, class_name in MODEL_CONTAINERS:
        try:
            base = getattr(importlib.import_module(module_name), class_name)
        except Exception:  # noqa: BLE001 - absent model or optional dependency: the load check covers it
            continue
        if class_name not in op_registry_oot:
            base.register_oot(_residency_class(base))
        done.append(class_name)
    return done


def unseen_expert_layers(model: Any) -> list[str]:
    """``"<layer name> (<class>)"`` for each vLLM ``RoutedExperts`` in ``model`` that is not the
    runtime's container (a subclass built by name that the plugin did not register)."""
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    from .forward import ResidencyForward

    return [f"{getattr(m, 'layer_name', name) or name} ({type(m).__name__})"
            for name, m in model.named_modules()
            if isinstance(m, RoutedExperts) and not isinstance(m, ResidencyForward)]


def unseen_layers_reason(unseen: list[str]) -> str:
    shown = ", ".join(unseen[:3]) + (f" and {len(unseen) - 3} more" if len(unseen) > 3 else "")
    return (f"{len(unseen)} MoE layer(s) are built from an expert container the residency plugin "
            f"does not take over: {shown}; vLLM's own kernel would serve them with no counts and "
            "no split. Set EXPERT_RESIDENCY_MODE=off for this model (or use a model whose expert "
            "container the plugin registers: RoutedExperts, "
            + ", ".join(c for _, c in MODEL_CONTAINERS) + ")")
