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
* ``plan``      — ``plan_rehome_order`` (pure, no torch: order device/host layers so neither
                  memory overshoots ``max(initial, final)`` by more than one layer).
* ``rehome``    — ``rehome_model`` (executes the plan), ``current_rowmap`` (state after swaps).
* ``split``     — the ``PerPickExpertFn`` contract, ``split_invoke``, ``residency_forward``
                  (split + finalize + optional count).
* ``fma_finalize`` — fp32 fma accumulation in original top-k order, one cast (``fma_f32`` exact).
* ``reference`` — torch reference per-pick functions: float SwiGLU and MXFP4-dequantizing SwiGLU.
* ``formats_ref`` — per-format references: gpt-oss MXFP4 (biases, SwiGLU-OAI), BF16 (SILU or
                  SwiGLU-OAI, biases), FP8 E4M3 with 128x128 block scales (W8A8 as vLLM).
* ``counter``   — ``ExpertCounter`` (count-only mode and drift alongside residency).
* ``dump``      — ``HistogramDumper``: the dump folder writer (interval, SIGUSR1, shutdown).
* ``swap``      — ``swap_experts`` through a staging buffer, copies before the map flip.
* ``slots``     — adaptive swaps as transfers into spare rows (``Transfer``, ``LayerSlots``), the
                  batched map flip (``MapFlipper``, ``share_row_codes``).
* ``copies``    — where those copies run: side streams (``CudaCopies``), at once, or a thread.
* ``adaptive``  — ``AdaptivePolicy``: decayed counts ranked at a barrier, bounded swaps with
                  hysteresis, copied beside the steps (``plan_swaps`` is the pure plan step).
* ``adaptive_config`` — ``AdaptiveConfig`` and the bytes it allows (no torch: ledgers read it).
* ``adaptive_step`` — ``StepBarrier``: the barrier and tick driven from forward starts (no vLLM).
* ``adaptive_setup`` — the policy's environment variables (parameters, class priors).

Typical use inside an engine (the vLLM plugin does this from ``RoutedExperts``)::

    layer = rehome_layer(tensors, hot_ids, cold_ids, layer_index=i,
                         hot_alloc=device_allocator("cuda"), cold_alloc=mapped_host_allocator(view))
    y = residency_forward(layer, x, topk_weights, topk_ids, per_pick_fn, counter=counter)

Imports nothing from recipegen.
"""

import importlib
from typing import Any

# name -> defining module. Loaded on first access (PEP 562) so that the pure-arithmetic
# ``core.plan`` stays importable where torch is not installed (recipegen's ledger, for one).
_EXPORTS = {
    "AllocatedTensor": "banks", "BankAllocator": "banks", "BankBytes": "banks",
    "ExpertBank": "banks", "ResidentLayer": "banks", "build_unsplit_layer": "banks",
    "copy_expert_rows": "banks", "device_allocator": "banks", "host_allocator": "banks",
    "mapped_host_allocator": "banks", "rehome_layer": "banks",
    "ExpertCounter": "counter",
    "PickRouting": "devmap", "decode_row_codes": "devmap", "encode_row_codes": "devmap",
    "route_picks": "devmap",
    "DumpConfig": "dump", "HistogramDumper": "dump", "dump_file_name": "dump",
    "parse_dump_name": "dump",
    "finalize": "fma_finalize", "fma_f32": "fma_finalize",
    "LayerPlacement": "plan", "RehomePlan": "plan", "plan_rehome_order": "plan",
    "ResidencyState": "rehome", "rehome_model": "rehome", "rowmap_banks": "rehome",
    "current_rowmap": "rehome",
    "PerPickExpertFn": "split", "dense_per_pick": "split", "residency_forward": "split",
    "split_invoke": "split",
    "StagingBuffer": "swap", "SwapStep": "swap", "swap_experts": "swap", "swap_steps": "swap",
    "swiglu_per_pick": "reference", "mxfp4_swiglu_per_pick": "reference",
    "float_per_pick": "formats_ref", "mxfp4_per_pick": "formats_ref",
    "gptoss_mxfp4_per_pick": "formats_ref", "fp8_block_per_pick": "formats_ref",
    "AdaptiveConfig": "adaptive_config", "AdaptivePolicy": "adaptive", "BarrierReport": "adaptive",
    "Swap": "slots", "Transfer": "slots", "LayerSlots": "slots", "MapFlipper": "slots",
    "share_row_codes": "slots", "add_spare_rows": "slots", "SPARE": "banks",
    "CudaCopies": "copies", "ImmediateCopies": "copies", "ThreadedCopies": "copies",
    "plan_swaps": "adaptive", "rank_swaps": "adaptive",
    "blend_prior": "adaptive", "choose_prior": "adaptive",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
