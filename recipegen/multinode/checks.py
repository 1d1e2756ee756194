"""Cross-field checks of a multi-node lane: its stages' machines, GPUs, addresses, ports, layers.

master_port has its rules here, all of them: not the lane's API port, not another lane's on the head
machine, not the monitoring profile's Prometheus or Grafana port.

Returns (field path, message) problems like `recipegen.load.checks`, which calls this per lane.
"""

from __future__ import annotations

from recipegen.common.units import format_count
from recipegen.multinode.partition import PartitionError, stage_layers
from recipegen.schema.recipe import Recipe

Problem = tuple[tuple[str | int, ...], str]


def parallel_problems(recipe: Recipe, lane_index: int) -> list[Problem]:
    lane = recipe.lanes[lane_index]
    parallel = lane.parallel
    if parallel is None:
        return []
    where: tuple[str | int, ...] = ("lanes", lane_index, "parallel")
    problems: list[Problem] = []
    addresses: dict[str, int] = {}
    for rank, stage in enumerate(parallel.pipeline):
        at = (*where, "pipeline", rank)
        machine = recipe.machines.get(stage.machine)
        if machine is None:
            problems.append(((*at, "machine"), f"unknown machine {stage.machine!r}; the recipe's "
                             f"machines are: {', '.join(sorted(recipe.machines))}"))
            continue
        for j, gpu in enumerate(stage.gpus):
            if gpu >= machine.gpus.count:
                problems.append(((*at, "gpus", j), f"GPU id {gpu} does not exist on machine "
                                 f"{stage.machine!r} ({format_count(machine.gpus.count, 'GPU')})"))
        if not machine.address:
            problems.append(((*at, "machine"), f"machine {stage.machine!r} has no address: a "
                             "multi-node lane needs every machine's address (the head's is "
                             "--master-addr; each node's is its VLLM_HOST_IP)"))
        elif machine.address in addresses:
            problems.append(((*at, "machine"), f"machine {stage.machine!r} has the same address "
                             f"{machine.address!r} as stage {addresses[machine.address]}'s machine: "
                             "vLLM's nodes must be reachable at distinct addresses"))
        else:
            addresses[machine.address] = rank
        head = recipe.machines.get(lane.machine)
        if head is not None and machine.gpus.kind != head.gpus.kind:
            problems.append(((*at, "machine"), f"machine {stage.machine!r} has "
                             f"{machine.gpus.kind} GPUs, the head has "
                             f"{head.gpus.kind}: the ledger and vLLM's "
                             "kernels assume one GPU kind per lane"))
    if parallel.master_port == lane.port:
        problems.append(((*where, "master_port"), f"master_port {parallel.master_port} is the lane's "
                         "API port"))
    for i, other in enumerate(recipe.lanes):
        if other is not lane and other.machine == lane.machine and other.port == parallel.master_port:
            problems.append(((*where, "master_port"), f"master_port {parallel.master_port} is lanes[{i}]'s "
                             f"API port on machine {lane.machine!r}"))
    # The head (the lane's own machine, host network) serves the API, so the monitoring profile
    # publishes Prometheus and Grafana there too, beside the rendezvous on master_port.
    monitoring = recipe.monitoring
    for field, service in (("prometheus_port", "Prometheus"), ("grafana_port", "Grafana")):
        if monitoring is not None and getattr(monitoring, field) == parallel.master_port:
            problems.append(((*where, "master_port"), f"master_port {parallel.master_port} is monitoring.{field}: "
                             f"{service} publishes it on the head machine {lane.machine!r}, where vLLM's nodes "
                             "rendezvous on master_port"))
    if parallel.host_tables_in_hbm and not recipe.model.host_tables:
        problems.append(((*where, "host_tables_in_hbm"), f"model {recipe.model.name} declares no host "
                         "tables (vLLM refuses --engram-config for a model without Engram layers)"))
    try:
        stages = stage_layers(recipe.model.decoder_layers, recipe.model.moe_layers,
                              parallel.pipeline_parallel_size, parallel.layer_partition)
    except PartitionError as exc:
        problems.append(((*where, "layer_partition" if parallel.layer_partition else "pipeline"), str(exc)))
        return problems
    for stage in stages:
        if not stage.moe_layers:
            problems.append(((*where, "layer_partition" if parallel.layer_partition else "pipeline"),
                             f"stage {stage.rank} (layers {stage.start}-{stage.end - 1}) holds no MoE "
                             "layer; the ledger needs every stage to hold one"))
    return problems
