"""Expert residency runtime core (torch; device-agnostic: CPU in CI, CUDA on the H200).

Per MoE layer: a **hot bank** (device tensor of the hot experts' rows), a **cold bank** (host memory
the device reads in place), and a device **row map** ``int32[num_experts]`` resolving an expert id
to (bank, row). Every expert tensor — float weights, MXFP4 packed weights, ue8m0 block scales,
biases — is split with the same partition.

Modules (each documents its contract):

* ``devmap``    — the row-map encoding (``code >= 0`` hot row, ``code < 0`` cold row ``~code``),
                  ``route_picks`` (ids → per-bank rows + masks, fixed shapes, no sync).
* ``banks``     — ``ExpertBank``, ``ResidentLayer``, ``rehome_layer`` (split one layer, free the
                  originals, bytes per bank), ``build_unsplit_layer`` (the reference), allocator
                  hooks (``device_allocator``, ``host_allocator``, ``mapped_host_allocator(view_fn)``
                  — the GPU pinned-host device-view plugs in there).
* ``rehome``    — ``plan_rehome_order`` (pure: alternate device/host layers so neither memory
                  overshoots by more than one layer) and ``rehome_model``.
* ``split``     — the ``PerPickExpertFn`` contract, ``split_invoke``, ``residency_forward``
                  (split + finalize + optional count).
* ``finalize``  — fp32 fma accumulation in original top-k order, one cast (``fma_f32`` exact).
* ``reference`` — torch reference per-pick functions: float SwiGLU and MXFP4-dequantizing SwiGLU.
* ``counter``   — ``ExpertCounter`` (count-only mode and drift alongside residency).
* ``dump``      — ``HistogramDumper``: the dump folder writer (interval, SIGUSR1, shutdown).
* ``swap``      — ``swap_experts`` through a staging buffer, copies before the map flip.

Typical use inside an engine (the vLLM plugin does this from ``RoutedExperts``)::

    layer = rehome_layer(tensors, hot_ids, cold_ids, layer_index=i,
                         hot_alloc=device_allocator("cuda"), cold_alloc=mapped_host_allocator(view))
    y = residency_forward(layer, x, topk_weights, topk_ids, per_pick_fn, counter=counter)

Imports nothing from recipegen.
"""

from .banks import (AllocatedTensor, BankAllocator, BankBytes, ExpertBank, ResidentLayer,
                    build_unsplit_layer, copy_expert_rows, device_allocator, host_allocator,
                    mapped_host_allocator, rehome_layer)
from .counter import ExpertCounter
from .devmap import PickRouting, decode_row_codes, encode_row_codes, route_picks
from .dump import DumpConfig, HistogramDumper, dump_file_name, parse_dump_name
from .finalize import finalize, fma_f32
from .rehome import (LayerPlacement, RehomePlan, ResidencyState, plan_rehome_order, rehome_model,
                     rowmap_banks)
from .split import PerPickExpertFn, dense_per_pick, residency_forward, split_invoke
from .swap import StagingBuffer, SwapStep, swap_experts, swap_steps

__all__ = [
    "AllocatedTensor", "BankAllocator", "BankBytes", "ExpertBank", "ResidentLayer",
    "build_unsplit_layer", "copy_expert_rows", "device_allocator", "host_allocator",
    "mapped_host_allocator", "rehome_layer", "ExpertCounter", "PickRouting", "decode_row_codes",
    "encode_row_codes", "route_picks", "DumpConfig", "HistogramDumper", "dump_file_name",
    "parse_dump_name", "finalize", "fma_f32", "LayerPlacement", "RehomePlan", "ResidencyState",
    "plan_rehome_order", "rehome_model", "rowmap_banks", "PerPickExpertFn", "dense_per_pick",
    "residency_forward", "split_invoke", "StagingBuffer", "SwapStep", "swap_experts", "swap_steps",
]
