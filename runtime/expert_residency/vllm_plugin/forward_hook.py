"""Run a callback on every vLLM forward context as it is created (eager, before the forward).

vLLM 0.32/0.33 enter ``vllm.forward_context.set_forward_context`` around every model forward —
eager steps, CUDA-graph replays (the context is entered, then the graph replays), profiling and
capture dummies — and it builds the context through the module-level ``create_forward_context``
(looked up at call time). Wrapping that function is the one place that sees every step's
``is_padding`` and attention metadata outside any captured region, which is where the runtime's
step masks (``step_masks``) are refreshed. tests/test_vllm_plugin_graphsafe_contracts.py pins
the call in 0.33's source.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_CALLBACKS: list[Callable[[Any], None]] = []


def on_forward_context(callback: Callable[[Any], None]) -> None:
    """Call ``callback(context)`` for every forward context vLLM creates from now on."""
    import vllm.forward_context as fc

    if not getattr(fc.create_forward_context, "_er_wrapped", False):
        original = fc.create_forward_context

        def create_forward_context(*args: Any, **kwargs: Any) -> Any:
            context = original(*args, **kwargs)
            for cb in list(_CALLBACKS):
                cb(context)
            return context

        create_forward_context._er_wrapped = True  # type: ignore[attr-defined]
        create_forward_context._er_original = original  # type: ignore[attr-defined]
        fc.create_forward_context = create_forward_context
    if callback not in _CALLBACKS:
        _CALLBACKS.append(callback)


def clear_callbacks() -> None:
    _CALLBACKS.clear()
