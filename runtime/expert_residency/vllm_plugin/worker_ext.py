"""Worker extension (``--worker-extension-cls expert_residency.vllm_plugin.worker_ext.
ResidencyWorkerExtension``): runtime requests reachable through ``collective_rpc``.

Offline: ``llm.collective_rpc("expert_residency_dump")``. Served (development endpoint,
``VLLM_SERVER_DEV_MODE=1``): ``POST /collective_rpc {"method": "expert_residency_dump"}``.
Production lanes do not need it: the dump folder gets snapshots on a timer, on SIGUSR1 to the
worker and at shutdown (``expert_residency.core.dump``).
"""

from __future__ import annotations

from typing import Any

from .worker_runtime import get_runtime


class ResidencyWorkerExtension:
    def init_worker_extension(self) -> None:
        """vLLM 0.33 calls this with the worker instance right after ``init_device``
        (``worker_base.py:366-368``; older releases never do): adaptive residency's barrier then
        runs at each scheduler step's start (``worker_runtime.install_step_entry``)."""
        from .worker_runtime import install_step_entry

        install_step_entry(self)

    def expert_residency_dump(self, folder: str | None = None) -> str:
        """Write the counts so far as a histogram file; return its path."""
        return _runtime().dump(folder or None)

    def expert_residency_status(self) -> dict[str, Any]:
        """Mode, MoE layers, start-up report line and (when counting) the counts so far."""
        return _runtime().status()

    def expert_residency_reset_counts(self) -> None:
        runtime = _runtime()
        if runtime.counter is not None:
            runtime.counter.reset()


def _runtime() -> Any:
    runtime = get_runtime()
    if runtime is None:
        raise RuntimeError("expert_residency is inactive in this worker (EXPERT_RESIDENCY_MODE "
                           "unset or off)")
    return runtime
