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

On a positional lane nothing re-homes, so these rounded blocks are what the host holds for the whole
run (`host.cold_pinned`). A host reserve back-solved from a `--cpu-offload-gb` boot subtracts what
that boot pinned by this same rule (`boot_pinning`), so replaying the boot gives back its measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recipegen.common.units import GiB, MiB
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


def vllm_parameter_names(model: Model) -> list[list[str]]:
    """The names of `vllm_parameters`, same shape: the tensor's name for its values, `+ scales`
    for its separate block-scale parameter."""
    experts = model.routed_experts
    if not model.expert_tensors:
        return [["experts"]]
    out = []
    for tensor in model.expert_tensors:
        scales = tensor.scale_bytes() * experts
        values = int(tensor.num_bytes()) * experts - scales
        out.append([n for n, b in ((tensor.name, values), (f"{tensor.name} scales", scales)) if b > 0])
    return out


# Why vLLM's pinned blocks are larger than the experts, as the report, the verdict and the fit's host
# line say it.
PINNED_ROUNDING = "each parameter rounded up to a power of two"


def _size(nbytes: int, *, power_of_two: bool = False) -> str:
    """A size as the pinned-parameter operands print it: an exact one to the precision the other
    operands print (GiB to 4 places), a power of two exactly (8 GiB, 0.5 GiB, 2 MiB)."""
    for unit, factor, digits in (("GiB", GiB, ".4f"), ("MiB", MiB, ".2f")):
        if nbytes >= (GiB / 8 if unit == "GiB" else MiB):
            return f"{nbytes / factor:{'g' if power_of_two else digits}} {unit}"
    return f"{nbytes:,} B"


def pinned_parameter_list(model: Model) -> list[str]:
    """One MoE layer's pinned parameters as printed operands: `name exact → rounded`."""
    return [f"{name} {_size(b)} → {_size(caching_host_allocation(b), power_of_two=True)}"
            for names, params in zip(vllm_parameter_names(model), vllm_parameters(model), strict=True)
            for name, b in zip(names, params, strict=True)]


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


def pinned_operands(model: Model, host_per_layer: Sequence[int]) -> tuple[str, dict[str, object]]:
    """The formula and operands of the pinned total over a walk's offloaded bytes per layer: whole
    layers × one layer's parameters each rounded up (printed `name exact → rounded`), plus what a
    partly offloaded layer pins of its first parameters."""
    full = sum(sum(p) for p in vllm_parameters(model))
    per_whole = sum(caching_host_allocation(p) for params in vllm_parameters(model) for p in params)
    pinned = pinned_per_layer(model, host_per_layer)
    whole = sum(1 for h in host_per_layer if h == full)
    partial = [p for h, p in zip(host_per_layer, pinned, strict=True) if 0 < h < full]
    operands: dict[str, object] = {"offloaded_bytes": sum(host_per_layer), "layers_whole": whole,
                                   "pinned_params_per_layer": pinned_parameter_list(model),
                                   "pinned_per_whole_layer_bytes": per_whole}
    formula = "layers_whole × pinned_per_whole_layer (Σ pinned_params_per_layer, each rounded up to a power of two)"
    if partial:
        operands.update(layers_partial=len(partial), partial_layers_pinned_bytes=sum(partial))
        formula += " + partial_layers_pinned (the leading parameters the walk reached, rounded the same way)"
    return formula, operands


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


@dataclass(frozen=True)
class BootPinning:
    """What a measured `--cpu-offload-gb` boot pinned for its routed experts, as this module models it."""

    logged_bytes: int       # the bytes vLLM logged as offloaded ("Total CPU offloaded parameters")
    expert_bytes: int       # the routed-expert parameters among them (whole parameters, module order)
    pinned_bytes: int       # those parameters as PyTorch's caching host allocator reserves them
    layers_whole: int
    layers_partial: int


def boot_pinning(model: Model, logged_bytes: int) -> BootPinning:
    """The routed-expert parameters a boot that offloaded `logged_bytes` held in pinned memory: the
    longest run of whole expert parameters in module order (w13 then w2, layer by layer, as
    vLLM's walk meets them) that fits in the logged bytes, each pinned at its power of two. What
    the logged bytes hold beyond them are non-routed parameters the walk also met; the ledger's
    positional walk does not model those for a model without `decoder_layer_bytes`, so a reserve
    back-solved with this keeps them inside it and replaying the boot gives back its measurement."""
    units = [sum(p) for p in vllm_parameters(model)]
    full = sum(units)
    host_per_layer: list[int] = []
    walked = 0
    for _ in range(model.num_moe_layers):
        layer = 0
        for size in units:
            if walked + size > logged_bytes:
                break
            walked += size
            layer += size
        host_per_layer.append(layer)
        if layer < full:
            break
    pinned = sum(pinned_per_layer(model, host_per_layer))
    whole = sum(1 for b in host_per_layer if b == full)
    partial = sum(1 for b in host_per_layer if 0 < b < full)
    return BootPinning(logged_bytes, walked, pinned, whole, partial)
