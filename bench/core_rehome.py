#!/usr/bin/env python3
"""Runtime core at the real DSv4.1-Flash geometry on one GPU: re-homing time per layer and swap
latency through the staging buffer.

Runs on one NVIDIA H200 (command in BENCHMARKS.md, section "Runtime core:
re-homing and swaps"); needs torch with CUDA and ``runtime/`` on PYTHONPATH.

Model: 384 routed experts per layer, MXFP4 ``w13_weight [384, 4608, 2560]`` + ``w13_weight_scale
[384, 4608, 160]`` + ``w2_weight [384, 5120, 1152]`` + ``w2_weight_scale [384, 5120, 72]`` (uint8:
18,800,640 bytes per expert, 7.22 GB per layer), random bytes. Row map per layer: 295 hot / 89
cold, ids drawn at random and in random row order (the worst case for run-merging copies).

Load state like vLLM's ``--cpu-offload-gb``: ``--device-layers`` layers wholly in HBM, ``--host-layers``
wholly in pinned host memory behind a device view. ``core.rehome_model`` then re-homes every layer:
hot rows into HBM, cold rows into pinned host memory read in place (``core.mapped_host_allocator``
over ``torch.empty(pin_memory=True)`` and a ``__cuda_array_interface__`` view; torch's caching host
allocator rounds each block up to a power of two, which costs host memory, not time). Reported:
wall time per layer (synchronised), bytes moved, the plan's order and predicted peaks against the
measured peak HBM allocation, and the mean time of single swaps (hot row ↔ cold row, all four
tensors, staging + map flip) at a barrier.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from expert_residency.core import StagingBuffer, device_allocator, mapped_host_allocator, rehome_model, swap_experts  # noqa: E402

EXPERTS = 384
HOT = 295
SHAPES = {  # per expert
    "w13_weight": (4608, 2560), "w13_weight_scale": (4608, 160),
    "w2_weight": (5120, 1152), "w2_weight_scale": (5120, 72),
}
BYTES_PER_EXPERT = sum(a * b for a, b in SHAPES.values())
assert BYTES_PER_EXPERT == 18_800_640


class _CudaArray:
    def __init__(self, host: torch.Tensor) -> None:
        self.__cuda_array_interface__ = {"shape": (host.numel() * host.element_size(),), "typestr": "|u1",
                                         "data": (host.data_ptr(), False), "strides": None, "version": 3}


def pinned_device_view(host: torch.Tensor) -> torch.Tensor:
    """CUDA tensor aliasing pinned host memory (torch.empty(pin_memory=True) is cudaHostAlloc'd and
    mapped under UVA), the role vLLM's get_accelerator_view_from_cpu_tensor plays in the engine."""
    raw = torch.as_tensor(_CudaArray(host), device="cuda")
    assert raw.data_ptr() == host.data_ptr()
    return raw.view(host.dtype).view(host.shape)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device-layers", type=int, default=4)
    parser.add_argument("--host-layers", type=int, default=1)
    parser.add_argument("--swaps", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    dev = torch.device("cuda")
    alloc_s = {"hot": 0.0, "cold": 0.0}

    def timed(kind, alloc):
        def allocate(shape, dtype):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = alloc(shape, dtype)
            torch.cuda.synchronize()
            alloc_s[kind] += time.perf_counter() - t0
            return out
        return allocate

    cold_alloc = mapped_host_allocator(pinned_device_view)
    gen = torch.Generator(device=dev).manual_seed(0)
    n_layers = args.device_layers + args.host_layers
    host_layers = set(range(args.host_layers))  # the offloader takes the first layers here
    layer_tensors: dict[int, dict[str, torch.Tensor]] = {}
    device_ids: set[int] = set()
    owners = []
    for i in range(n_layers):
        tensors = {}
        for name, shape in SHAPES.items():
            if i in host_layers:
                view = cold_alloc((EXPERTS, *shape), torch.uint8)
                owners.append(view.owner)
                for start in range(0, EXPERTS, 32):  # fill through a small device buffer
                    chunk = torch.randint(0, 256, (min(32, EXPERTS - start), *shape), dtype=torch.uint8,
                                          device=dev, generator=gen)
                    view.tensor[start:start + chunk.shape[0]].copy_(chunk)
                    del chunk
                tensors[name] = view.tensor
            else:
                t = torch.randint(0, 256, (EXPERTS, *shape), dtype=torch.uint8, device=dev, generator=gen)
                device_ids.add(id(t))
                tensors[name] = t
        layer_tensors[i] = tensors
    cpu_gen = torch.Generator().manual_seed(1)
    hot, cold = {}, {}
    for i in range(n_layers):
        perm = torch.randperm(EXPERTS, generator=cpu_gen).tolist()
        hot[i], cold[i] = perm[:HOT], perm[HOT:]
    torch.cuda.synchronize()
    experts_on_device = args.device_layers * EXPERTS * BYTES_PER_EXPERT
    baseline = torch.cuda.memory_allocated() - experts_on_device
    torch.cuda.reset_peak_memory_stats()
    times: dict[int, float] = {}
    alloc_times: dict[int, float] = {}
    last = [time.perf_counter(), 0.0]

    def after_layer(layer) -> None:
        torch.cuda.synchronize()
        now = time.perf_counter()
        times[layer.layer_index] = now - last[0]
        spent = alloc_s["hot"] + alloc_s["cold"]
        alloc_times[layer.layer_index] = spent - last[1]
        last[0], last[1] = now, spent

    state = rehome_model(layer_tensors, hot, cold, hot_alloc=timed("hot", device_allocator(dev)),
                         cold_alloc=timed("cold", cold_alloc), on_device=lambda t: id(t) in device_ids,
                         after_layer=after_layer)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - baseline
    final = torch.cuda.memory_allocated() - baseline

    layer = state.layers[n_layers - 1]
    staging = StagingBuffer.for_layer(layer)
    swap_times = []
    for s in range(args.swaps + 2):
        pair = (layer.hot_ids[s % HOT], layer.cold_ids[s % (EXPERTS - HOT)])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        swap_experts(layer, [pair], staging)
        torch.cuda.synchronize()
        if s >= 2:  # two warm-ups
            swap_times.append(time.perf_counter() - t0)

    gib = 2 ** 30
    device_layer_times = [times[i] for i in times if i not in host_layers]
    host_layer_times = [times[i] for i in times if i in host_layers]
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "bytes_per_expert": BYTES_PER_EXPERT,
        "layers": {"device": args.device_layers, "host": args.host_layers},
        "plan_order": state.plan.order,
        "plan_peak_device_gib": state.plan.peak[0] / gib,
        "plan_final_device_gib": state.plan.final[0] / gib,
        "measured_peak_device_gib": peak / gib,
        "measured_final_device_gib": final / gib,
        "hot_bytes_total": state.total.hot,
        "cold_bytes_total": state.total.cold,
        "per_layer_s": {str(k): v for k, v in times.items()},
        "per_layer_alloc_s": {str(k): v for k, v in alloc_times.items()},
        "alloc_s_total": dict(alloc_s),
        "copy_s_per_layer_mean": statistics.mean(times[k] - alloc_times[k] for k in times),
        "device_layer_s_mean": statistics.mean(device_layer_times) if device_layer_times else None,
        "host_layer_s_mean": statistics.mean(host_layer_times) if host_layer_times else None,
        "swap_ms_mean": 1e3 * statistics.mean(swap_times),
        "swap_ms_median": 1e3 * statistics.median(swap_times),
        "swap_bytes": 2 * BYTES_PER_EXPERT,
    }
    for key, value in result.items():
        print(f"{key}: {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
