"""Host memory vLLM 0.33's `--cpu-offload-gb` pins at load, as PyTorch allocates it.

vLLM 0.33's offloader copies each offloaded parameter to the host and pins it with
`Tensor.pin_memory()` (vllm/model_executor/offloader/uva.py:114-116, `should_pin_memory()` in
offloader/base.py:23-32). That goes through PyTorch's caching host allocator, which reserves the
next power of two of every request (ATen/core/CachingHostAllocator.h:300-309 in PyTorch 2.13;
measured on one NVIDIA H200 with PyTorch 2.11, 2026-12-01: `torch.empty(4.5 GiB).pin_memory()`
grew the process by 8.10 GiB). A routed-expert parameter holds all experts of one layer, so an
MXFP4 `w13_weight` of 4.22 GiB pins 8 GiB and its 0.26 GiB scales 0.5 GiB.

PyTorch 2.13 can skip the rounding above a size (`PYTORCH_ALLOC_CONF=pinned_max_round_threshold_mb:N`);
PyTorch 2.11 refuses that key at the first pinned allocation (measured, same machine), so recipegen
does not render it. The runtime's own cold banks are exact-size (`expert_residency.gpu.pinned`).
"""

from __future__ import annotations

from collections.abc import Sequence

from recipegen.schema import Model


def caching_host_allocation(nbytes: int) -> int:
    """Bytes PyTorch's caching host allocator reserves for one pinned tensor of `nbytes`."""
    if nbytes <= 0:
        return 0
    return 1 << (nbytes - 1).bit_length()


def vllm_parameters(model: Model) -> list[list[int]]:
    """Per expert tensor of one MoE layer (w13, w2: the positional walk's units), the bytes of the
    vLLM parameters it is stored as: the packed values and, for block-scaled formats, a separate
    `*_weight_scale` parameter; each holds every routed expert of the layer."""
    experts = model.routed_experts
    if not model.expert_tensors:
        return [[model.expert_bytes * experts]]
    out = []
    for tensor in model.expert_tensors:
        scales = tensor.scale_bytes() * experts
        values = int(tensor.num_bytes()) * experts - scales
        out.append([b for b in (values, scales) if b > 0])
    return out


def pinned_per_layer(model: Model, host_per_layer: Sequence[int]) -> list[int]:
    """Host bytes pinned per MoE layer after the load, given the walk's offloaded bytes per layer
    (a prefix of the layer's expert tensors: the walk moves whole parameters in module order)."""
    units = vllm_parameters(model)
    out = []
    for offloaded in host_per_layer:
        pinned, walked = 0, 0
        for params in units:
            if walked >= offloaded:
                break
            walked += sum(params)
            pinned += sum(caching_host_allocation(p) for p in params)
        if walked != offloaded:
            raise ValueError(f"offloaded {offloaded} bytes is not a whole number of expert parameters")
        out.append(pinned)
    return out


def rehoming_host_peak(pinned: Sequence[int], final_host: Sequence[int], order: Sequence[int]) -> int:
    """Host expert bytes at the worst moment: at load every offloaded layer holds its pinned
    (rounded) blocks; re-homing layer `i` (in the runtime's `order`) first allocates its exact
    cold bank, then releases the layer's pinned blocks. With no re-homing the load is final."""
    current = sum(pinned)
    peak = current
    for i in order:
        peak = max(peak, current + final_host[i])
        current += final_host[i] - pinned[i]
    return peak
