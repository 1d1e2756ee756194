"""Start the metrics exporter in a vLLM worker, once the banks are installed (``worker_runtime``).

Only the lane's first worker (global rank 0: the first tensor-parallel rank of the first pipeline
stage) exports: under tensor and expert parallelism every rank counts the same picks in global
expert ids, so one writer keeps the summed multiprocess counters right. Its host bytes count every
rank's read of a cold pick: each tensor-parallel rank reads its 1/TP shard of the expert (so the
rank's row bytes × TP), under expert parallelism the one rank holding the expert reads it whole.
"""

from __future__ import annotations

import sys
from typing import Any


def _tensor_parallel() -> tuple[int, int]:
    """(global rank, tensor-parallel world size); (0, 1) outside a distributed vLLM worker."""
    import torch

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return 0, 1
    try:
        from vllm.distributed import get_tensor_model_parallel_world_size

        tp = int(get_tensor_model_parallel_world_size())
    except Exception:  # the model parallel groups are not set up (tests driving the runtime)
        tp = 1
    return int(torch.distributed.get_rank()), tp


def row_bytes(layers: dict[int, Any], tp: int) -> list[int]:
    """Per layer (in ``layers`` order): bytes over every rank for one cold pick (0 for a layer the
    runtime did not re-home). The row's size comes from the cold bank's tensor shapes, not from its
    rows: under expert parallelism this rank's cold bank may hold no expert of a layer whose cold
    experts sit on other ranks, and their picks still read a whole row each."""
    out = []
    for module in layers.values():
        resident = getattr(module, "_er_resident", None)
        if resident is None:
            out.append(0)
            continue
        per_row = resident.cold.row_nbytes()
        expert_parallel = getattr(module, "_er_expert_map", None) is not None
        out.append(per_row * (1 if expert_parallel else tp))
    return out


def snapshot_time(dumper: Any) -> float | None:
    """Unix time of the dumper's newest histogram file (its name carries it), None before one."""
    from ..core.dump import parse_dump_name

    written = getattr(dumper, "written", None)
    if not written:
        return None
    parsed = parse_dump_name(written[-1].name)
    return None if parsed is None else parsed.time.timestamp()


def start_metrics(runtime: Any) -> Any | None:
    """The running exporter, or None (metrics off, or not the lane's first worker)."""
    config = runtime.settings.metrics
    if config is None or not runtime.target_layers:
        return None
    rank, tp = _tensor_parallel()
    if rank != 0:
        return None
    if runtime.counter is None:
        runtime._start_counter()
    from ..metrics.exporter import LaneFacts, MetricsExporter
    from ..metrics.reader import CountReader

    counter = runtime.counter
    layers = {i: runtime.target_layers[i] for i in counter.moe_layer_indices}
    facts = LaneFacts(runtime.settings.lane, runtime.settings.traffic_class, counter.moe_layer_indices,
                      counter.num_experts, row_bytes(layers, tp), config.predicted_cold_share)
    residency = runtime.state is not None and runtime.rowmap is not None
    boot = runtime.rowmap if residency else None
    policy = runtime.policy
    live = policy.live_rowmap if policy is not None else ((lambda: boot) if boot is not None else None)
    dumper = runtime.dumper
    exporter = MetricsExporter(
        facts, CountReader(counter).read, interval_s=config.interval_s, window_s=config.window_s,
        live_map=live, boot_map=boot,
        swaps=(lambda: policy.swaps_done) if policy is not None else None,
        swap_copy_bytes=(lambda: dict(policy.copied_bytes)) if policy is not None else None,
        snapshot_time=(lambda: snapshot_time(runtime.dumper)) if dumper is not None else None)
    exporter.start()
    print(f"expert_residency: metrics every {config.interval_s:g} s (window {config.window_s:g} s) "
          f"into {config.multiproc_dir} for the lane's /metrics", file=sys.stderr, flush=True)
    return exporter
