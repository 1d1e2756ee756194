"""Test-only worker extension: an independent recount of routed picks through vLLM's own router
capture seam (``BaseRouter.set_capture_fn``), not through the runtime's counter.

Loaded in the vLLM worker (this folder is put on PYTHONPATH next to ``runtime/``); installed after
the server is ready, so it sees only the requests the test sends.
"""

from __future__ import annotations

import re
from typing import Any

from expert_residency.vllm_plugin.worker_ext import ResidencyWorkerExtension

_LAYER = re.compile(r"layers\.(\d+)\.")


class RecountWorkerExtension(ResidencyWorkerExtension):
    def recount_install(self) -> int:
        """Hook every MoE router of the loaded model; return how many were hooked."""
        self._recount: dict[int, list[int]] = {}
        model = self.model_runner.get_model()
        hooked = 0
        for _name, module in model.named_modules():
            router = getattr(module, "router", None)
            routed = getattr(module, "routed_experts", None)
            if router is None or routed is None or not hasattr(router, "set_capture_fn"):
                continue
            layer = int(_LAYER.search(routed.layer_name).group(1))
            counts = self._recount.setdefault(layer, [0] * int(routed.global_num_experts))

            def capture(topk_ids: Any, counts: list[int] = counts) -> None:
                for expert in topk_ids.reshape(-1).tolist():
                    counts[int(expert)] += 1

            router.set_capture_fn(capture)
            hooked += 1
        return hooked

    def recount_counts(self) -> dict[str, list[int]]:
        return {str(layer): list(c) for layer, c in sorted(self._recount.items())}
