"""Test-only worker extension: a trace of adaptive residency's barrier inside the real engine.

``adaptive_trace_install`` (after the server is ready) wraps, in the worker process, the policy's
barrier (each swap's ordered steps are run one by one and logged: ``c`` a staging copy, ``m`` the
map flip; ``b`` a barrier's start) and the runtime's split forward (``f`` one MoE layer's forward).
``adaptive_trace`` returns the log as one string, so a test can check that no ``f`` ever falls
between a swap's first ``c`` and its ``m``.
"""

from __future__ import annotations

from typing import Any

from expert_residency.vllm_plugin.worker_ext import ResidencyWorkerExtension
from expert_residency.vllm_plugin.worker_runtime import get_runtime


class AdaptiveTraceExtension(ResidencyWorkerExtension):
    def adaptive_trace_install(self) -> int:
        runtime = get_runtime()
        if runtime is None or runtime.policy is None:
            raise RuntimeError("adaptive residency is off in this worker")
        policy = runtime.policy
        events: list[str] = []
        self._adaptive_events = events
        barrier, split_forward = policy.barrier, runtime.split_forward

        def run_logged(steps: Any) -> None:
            for step in steps:
                events.append("c" if step.kind == "copy" else "m")
                step.run()

        def traced_barrier(**_: Any) -> Any:
            events.append("b")
            return barrier(run=run_logged)

        def traced_split_forward(*args: Any, **kwargs: Any) -> Any:
            events.append("f")
            return split_forward(*args, **kwargs)

        policy.barrier = traced_barrier            # StepBarrier calls policy.barrier()
        runtime.split_forward = traced_split_forward   # ResidencyForward calls runtime.split_forward
        return len(runtime.target_layers)

    def adaptive_trace(self) -> str:
        return "".join(self._adaptive_events)
