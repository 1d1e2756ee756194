"""Expert containers that models build through their own ``RoutedExperts`` subclass.

``RoutedExperts.register_oot`` replaces the class by *name*: ``PluggableLayer.__new__`` looks up
``cls.__name__`` in the OOT registry (``model_executor/custom_op.py:46-65``, vLLM 0.32 and 0.33),
so a model that passes ``routed_experts_cls=GptOssRoutedExperts`` to ``FusedMoEFactory``
(``models/gpt_oss.py:402``) is never handed ``ResidencyRoutedExperts`` — without this module the
runtime would not see gpt-oss's MoE layers at all (no split, no counts, no refusal). For
gpt-oss the residency container is registered under ``GptOssRoutedExperts``'s name and keeps its
weight loader (interleaved gate/up, biases, rank-0 ``w2_bias``) by inheritance:

    ResidencyGptOssRoutedExperts -> ResidencyRoutedExperts -> ResidencyForward -> GptOssRoutedExperts -> RoutedExperts
"""

from __future__ import annotations


def register_model_routed_experts() -> list[str]:
    """Register residency containers for the models' own ``RoutedExperts`` subclasses that this
    vLLM has; returns the class names registered (idempotent)."""
    from vllm.model_executor.custom_op import op_registry_oot

    done = []
    try:
        from vllm.model_executor.models.gpt_oss import GptOssRoutedExperts
    except ImportError:
        return done
    from .routed_experts import ResidencyRoutedExperts

    name = GptOssRoutedExperts.__name__
    if name not in op_registry_oot:
        cls = type("ResidencyGptOssRoutedExperts", (ResidencyRoutedExperts, GptOssRoutedExperts),
                   {"__module__": __name__,
                    "__doc__": "gpt-oss's expert container with the runtime's forward and hooks."})
        GptOssRoutedExperts.register_oot(cls)
    done.append(name)
    return done
