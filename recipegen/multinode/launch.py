"""How each machine of a multi-node lane starts its vLLM node: flags and environment.

vLLM 0.33's multiprocessing multi-node mode (the default executor when `--nnodes` > 1 on CUDA,
`vllm/config/parallel.py`): every machine runs `vllm serve` with the same model flags plus
`--nnodes N --node-rank r --master-addr <head> --master-port <port>`; ranks ≥ 1 add `--headless`
(no API server: `vllm/entrypoints/cli/serve.py::run_headless`). Each node advertises its own address
(`VLLM_HOST_IP`: vLLM otherwise picks the interface of its default route, which can be the wrong
network on a box with several). The layer split is pinned with `VLLM_PP_LAYER_PARTITION` so that
the engine splits exactly as the ledger and the row-map slices assume, whatever vLLM's default
rule becomes. Used by compose rendering, Kubernetes rendering and the real two-node test alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from recipegen.multinode.partition import StageLayers, partition_env_value, stage_layers
from recipegen.schema.parallel import Parallel

EXECUTOR_BACKEND = "mp"
# `parallel.host_tables_in_hbm`: vLLM keeps the Engram tables in pinned host memory unless told.
HOST_TABLES_IN_HBM_ARGS: tuple[str, ...] = ("--engram-config", json.dumps({"cpu_offload": False}))


@dataclass(frozen=True)
class NodeLaunch:
    rank: int
    machine: str
    address: str
    headless: bool
    args: tuple[str, ...]                   # appended to the lane's `vllm serve` flags
    env: tuple[tuple[str, str], ...]
    layers: StageLayers


def node_args(*, pp: int, rank: int, master_addr: str, master_port: int | str) -> list[str]:
    args = ["--pipeline-parallel-size", str(pp), "--nnodes", str(pp), "--node-rank", str(rank),
            "--master-addr", master_addr, "--master-port", str(master_port),
            "--distributed-executor-backend", EXECUTOR_BACKEND]
    if rank > 0:
        args.append("--headless")
    return args


def host_table_args(parallel: Parallel | None) -> list[str]:
    """The flags that place a multi-node lane's host tables (`parallel.host_tables_in_hbm`)."""
    return list(HOST_TABLES_IN_HBM_ARGS) if parallel is not None and parallel.host_tables_in_hbm else []


def launch_flags(parallel: Parallel | None) -> dict[str, str]:
    """Every flag the launch of `parallel` writes on any of its nodes (canonical name → the recipe
    field it comes from; empty for a one-machine lane). The recipe loader and the render both refuse
    these in `extra_args` (`recipegen.ledger.flags.rendered_flag_problems`): vLLM would keep the
    later one and boot a topology the ledger never priced, so `check recipe` refuses what `render`
    refuses, with the same message."""
    if parallel is None:
        return {}
    # rank 1 stands for every rank: a worker writes the head's flags plus --headless
    args = node_args(pp=parallel.pipeline_parallel_size, rank=1, master_addr="head", master_port=0)
    flags = {a: "parallel.pipeline" for a in args if a.startswith("--")}
    flags.update((a, "parallel.host_tables_in_hbm") for a in host_table_args(parallel) if a.startswith("--"))
    return flags


def node_env(*, host_ip: str, stages: list[StageLayers]) -> list[tuple[str, str]]:
    return [("VLLM_HOST_IP", host_ip), ("VLLM_PP_LAYER_PARTITION", partition_env_value(stages))]


def lane_launches(recipe, lane) -> list[NodeLaunch]:  # recipe: Recipe, lane: Lane (with parallel)
    """One launch per stage, rank order."""
    parallel = lane.parallel
    assert parallel is not None
    stages = stage_layers(recipe.model.decoder_layers, recipe.model.moe_layers,
                          parallel.pipeline_parallel_size, parallel.layer_partition)
    head = recipe.machines[parallel.pipeline[0].machine]
    assert head.address
    out = []
    for rank, stage in enumerate(parallel.pipeline):
        address = recipe.machines[stage.machine].address
        assert address
        out.append(NodeLaunch(
            rank, stage.machine, address, rank > 0,
            tuple(node_args(pp=parallel.pipeline_parallel_size, rank=rank, master_addr=head.address,
                            master_port=parallel.master_port)),
            tuple(node_env(host_ip=address, stages=stages)), stages[rank]))
    return out
