"""Where the adaptive barrier runs in an engine: at the start of a forward, before its kernels.

``StepBarrier(policy)`` turns "a forward is about to start" into the policy's calls:
``before_forward(real=...)`` runs ``policy.barrier()`` when the previous forwards made one due,
counts this forward with ``policy.tick()``, then lets the policy issue this step's copies
(``policy.pump()``: side streams on a GPU, beside the forward about to be issued). Call it on the
host, after the previous forward was issued and before this one's kernels (or graph replay) are:
the barrier's map flips are then enqueued on the step stream between the two forwards (after the
copies they flip have landed), so every forward sees one whole map.

``real=False`` marks forwards that serve no traffic (memory profiling, warm-up and CUDA-graph
capture dummies, data-parallel idle ranks): they neither tick nor run a barrier — in particular no
barrier ever runs while a graph is being captured. ``capturing`` (a zero-argument callable, e.g.
``torch.cuda.is_current_stream_capturing``) is a second guard: a due barrier waits for the next
forward outside capture.

Engine-agnostic (no vLLM import): the vLLM plugin calls it from its forward-context hook
(``vllm_plugin.forward_hook``, entered before every forward in vLLM 0.32 and 0.33, eager steps
and graph replays alike) — see docs/adaptive.md, "The barrier inside vLLM".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class StepBarrier:
    """Drives an ``AdaptivePolicy`` from forward starts (see the module docstring)."""

    def __init__(self, policy: Any, *, capturing: Callable[[], bool] = lambda: False,
                 on_report: Callable[[Any], None] | None = None) -> None:
        self.policy = policy
        self.capturing = capturing
        self.on_report = on_report
        self.due = False
        self.skipped_in_capture = 0   # due barriers deferred because a graph was being captured

    def before_forward(self, *, real: bool) -> Any | None:
        """Run the due barrier (if any) and count this forward; the barrier's report or None."""
        if not real:
            return None
        if self.capturing():
            self.skipped_in_capture += 1
            return None
        report = None
        if self.due:
            self.due = False
            report = self.policy.barrier()
            if self.on_report is not None:
                self.on_report(report)
        self.due = bool(self.policy.tick())
        pump = getattr(self.policy, "pump", None)
        if pump is not None:
            pump()
        return report
