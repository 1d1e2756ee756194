"""A lane that spans machines: pipeline stages over several boxes, tensor parallel within each.

vLLM 0.33 runs such a lane on its own multiprocessing multi-node mode (`--nnodes`, `--node-rank`,
`--master-addr`, `--master-port`, `--headless` on the workers; `vllm/config/parallel.py`,
`vllm/entrypoints/cli/serve.py::run_headless`): node *r* holds ranks `r × local_world_size …`, and
ranks are ordered [PP, TP], so with one stage per machine pipeline stage *r* is node *r*. Stage 0's
machine is the head: it serves the API; the others run headless.
"""

from __future__ import annotations

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from recipegen.schema.base import PathError, StrictModel

# vLLM 0.33 ParallelConfig.master_port default (vllm/config/parallel.py).
VLLM_DEFAULT_MASTER_PORT = 29501


class PipelineStage(StrictModel):
    """One pipeline stage: the machine it runs on and that machine's GPUs (tensor parallel)."""

    machine: str
    """Key of the machine in the recipe's `machines` (one stage per machine; stage 0 is the head)."""
    gpus: list[NonNegativeInt] = Field(min_length=1)
    """GPU ids on that machine; every stage uses the same number (vLLM's TP size)."""
    all_experts_in_hbm: bool = False
    """This stage keeps every routed expert of its layers in HBM: no residency runtime, no row map
    on it. Otherwise the lane's `offload` (and active class's row map) applies to its layers."""

    @model_validator(mode="after")
    def _check(self) -> PipelineStage:
        if len(set(self.gpus)) != len(self.gpus):
            raise PathError(f"GPU ids repeat: {self.gpus}", ("gpus",))
        return self


class Parallel(StrictModel):
    """How a lane spans machines: pipeline stages in order (rank 0 first), and their layers."""

    pipeline: list[PipelineStage] = Field(min_length=2)
    """The stages, in pipeline order; stage *r* runs as vLLM node rank *r* (`--node-rank r`)."""
    layer_partition: list[PositiveInt] | None = None
    """Decoder layers per stage (vLLM `VLLM_PP_LAYER_PARTITION`); omitted: vLLM's own rule
    (`vllm/distributed/utils.py::get_pp_indices`: even split, the remainder to the stages before
    the last)."""
    master_port: int = Field(default=VLLM_DEFAULT_MASTER_PORT, ge=1, le=65535)
    """`--master-port` on the head's address: the port the nodes rendezvous on. Not an API port on
    the head, nor, with `monitoring`, its Prometheus or Grafana port (`prometheus_port`,
    `grafana_port`)."""
    host_tables_in_hbm: bool = False
    """Place the model's host tables (DeepSeek-V4.1's Engram tables) in HBM instead of pinned
    host memory: vLLM `--engram-config '{"cpu_offload": false}'` (its default keeps them in host)."""

    @model_validator(mode="after")
    def _check(self) -> Parallel:
        if self.layer_partition is not None and len(self.layer_partition) != len(self.pipeline):
            raise PathError(f"{len(self.layer_partition)} entries for {len(self.pipeline)} pipeline "
                            "stages (one layer count per stage)", ("layer_partition",))
        seen: dict[str, int] = {}
        for i, stage in enumerate(self.pipeline):
            if stage.machine in seen:
                raise PathError(f"machine {stage.machine!r} already runs stage {seen[stage.machine]}: "
                                "one stage per machine (vLLM gives every node the same number of "
                                "ranks, one stage's TP group)", ("pipeline", i, "machine"))
            seen[stage.machine] = i
        sizes = {len(s.gpus) for s in self.pipeline}
        if len(sizes) > 1:
            raise PathError("every stage needs the same number of GPUs (vLLM's tensor-parallel size "
                            f"is one per lane); stages have {[len(s.gpus) for s in self.pipeline]}",
                            ("pipeline",))
        return self

    @property
    def pipeline_parallel_size(self) -> int:
        return len(self.pipeline)

    @property
    def tensor_parallel_size(self) -> int:
        return len(self.pipeline[0].gpus)
