"""BF16 and FP8-block expert layers under residency: checkpoint layout, geometry, per-pick function.

Shared by ``unquantized_experts`` (vLLM 0.33 ``UnquantizedFusedMoEMethod``) and ``fp8_experts``
(``Fp8MoEMethod`` with 128x128 ``weight_block_size``). As for MXFP4 (``mxfp4_experts``), the split
modes hold back vLLM's kernel-format conversion for the layers the runtime computes, keep the
tensors as ``create_weights`` registered them and loading filled them::

    w13_weight            [E, 2I, H]  bf16/fp16, or float8_e4m3fn
    w2_weight             [E, H, I]
    w13_weight_scale_inv  [E, ceil(2I/128), ceil(H/128)] fp32   (fp8-block only)
    w2_weight_scale_inv   [E, ceil(H/128), ceil(I/128)]  fp32   (fp8-block only)
    w13_bias [E, 2I], w2_bias [E, H]                      (models with biased experts: gpt-oss)

and turn them into a ``DenseResidency``: on CUDA the runtime's Triton dense kernels
(``gpu.dense_experts.TritonDenseExperts``: fused split layer over an HBM bank and a pinned-host
bank read in place); on CPU the core's torch references (``core.formats_ref``).

Activations: vLLM's ``silu`` (gate rows first; the layer's ``swiglu_limit`` clamp when > 0) and
``swigluoai`` (gpt-oss: interleaved gate/up). For ``swigluoai`` vLLM 0.33's unquantized Triton path
calls ``torch.ops._C.swigluoai_and_mul(output, input)`` with the op's defaults
(``fused_moe/activation.py:380-381``; alpha 1.702, limit 7.0, ``layers/activation.py:481``), so
those are the constants here; a layer asking for other ones is refused rather than computed
differently.

No vLLM import here (the caller hands in the layer and its tensors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..contract.expert_formats import GPTOSS_SWIGLU_ALPHA, GPTOSS_SWIGLU_LIMIT
from ..core.banks import BankAllocator, device_allocator, host_allocator
from ..core.formats_ref import SILU, SWIGLUOAI
from ..core.split import PerPickExpertFn

BF16, FP16, FP8_BLOCK = "bf16", "fp16", "fp8-block"
WEIGHT_NAMES = ("w13_weight", "w2_weight")
FP8_SCALE_NAMES = ("w13_weight_scale_inv", "w2_weight_scale_inv")
BIAS_NAMES = ("w13_bias", "w2_bias")
FP8_BLOCK_SHAPE = (128, 128)
_FLOAT_FORMATS = {torch.bfloat16: BF16, torch.float16: FP16}


@dataclass(frozen=True)
class ActivationFacts:
    """What a vLLM ``RoutedExperts`` layer asks its experts to compute."""

    activation: str
    """vLLM ``MoEActivation`` value (``silu``, ``swigluoai``, ...)."""
    swiglu_limit: float | None
    """The clamp the runtime applies: SILU's ``swiglu_limit`` when > 0; swigluoai's 7.0."""
    swiglu_alpha: float | None
    """swigluoai's alpha (1.702); None for SILU."""
    raw_alpha: float | None
    """``moe_config.swiglu_alpha`` as the layer has it (for the capability table)."""
    raw_beta: float | None
    biases: bool


def activation_facts(layer: Any) -> ActivationFacts:
    act = getattr(layer, "activation", None)
    name = str(getattr(act, "value", act)).lower()
    moe_config = getattr(layer, "moe_config", None)
    alpha = getattr(moe_config, "swiglu_alpha", None)
    beta = getattr(moe_config, "swiglu_beta", None)
    limit = getattr(layer, "swiglu_limit", None)
    limit = float(limit) if limit is not None and float(limit) > 0 and float(limit) != float("inf") else None
    biases = any(getattr(layer, b, None) is not None for b in BIAS_NAMES)
    if name == SWIGLUOAI:
        return ActivationFacts(name, GPTOSS_SWIGLU_LIMIT, GPTOSS_SWIGLU_ALPHA, alpha, beta, biases)
    return ActivationFacts(name, limit, None, alpha, beta, biases)


def swigluoai_constants_reason(layer: Any) -> str | None:
    """swigluoai layers must ask for vLLM's op defaults (alpha 1.702, limit 7.0) or nothing; SILU
    layers for no alpha/beta (the table's ``alpha_beta`` flag cannot say which constants)."""
    act = getattr(layer, "activation", None)
    moe_config = getattr(layer, "moe_config", None)
    alpha = getattr(moe_config, "swiglu_alpha", None)
    beta = getattr(moe_config, "swiglu_beta", None)
    limit = getattr(layer, "swiglu_limit", None)
    if str(getattr(act, "value", act)).lower() != SWIGLUOAI:
        if alpha not in (None, 1.0) or beta not in (None, 0.0):
            return f"SILU with alpha {alpha}, beta {beta}: the runtime computes silu(gate) * up only"
        return None
    if alpha not in (None, GPTOSS_SWIGLU_ALPHA) or beta not in (None, 0.0) or \
            limit not in (None, GPTOSS_SWIGLU_LIMIT):
        return (f"swigluoai with alpha {alpha}, beta {beta}, limit {limit}: the runtime computes "
                f"gpt-oss's constants (alpha {GPTOSS_SWIGLU_ALPHA}, limit {GPTOSS_SWIGLU_LIMIT}) only")
    return None


def capability_kwargs(facts: ActivationFacts) -> dict[str, Any]:
    """The capability table's arguments for these facts (swigluoai's constants are its own)."""
    return dict(activation=facts.activation,
                swiglu_limit=facts.swiglu_limit if facts.activation == SILU else None,
                swiglu_alpha=facts.raw_alpha if facts.activation == SILU else None,
                swiglu_beta=facts.raw_beta if facts.activation == SILU else None,
                biases=facts.biases)


@dataclass(frozen=True)
class DenseGeometry:
    expert_format: str
    num_experts: int
    hidden: int
    intermediate: int
    biases: bool


def dense_geometry(tensors: dict[str, torch.Tensor], layer_name: str = "MoE layer") -> DenseGeometry:
    """Format and geometry of a layer's checkpoint-layout expert tensors; ValueError naming the
    tensor if a name, dtype or shape disagrees with vLLM 0.33's ``create_weights``."""
    missing = [n for n in WEIGHT_NAMES if n not in tensors]
    if missing:
        raise ValueError(f"{layer_name}: no {missing} among the expert tensors ({sorted(tensors)})")
    w13, w2 = tensors["w13_weight"], tensors["w2_weight"]
    if w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"{layer_name}: w13_weight/w2_weight must be 3-D, got "
                         f"{tuple(w13.shape)} / {tuple(w2.shape)}")
    experts, two_i, hidden = (int(d) for d in w13.shape)
    inter = two_i // 2
    if two_i % 2 or tuple(w2.shape) != (experts, hidden, inter):
        raise ValueError(f"{layer_name}: w2_weight is {tuple(w2.shape)}, expected "
                         f"{(experts, hidden, inter)} for w13_weight {tuple(w13.shape)}")
    if w13.dtype == torch.float8_e4m3fn:
        fmt = FP8_BLOCK
        bn, bk = FP8_BLOCK_SHAPE
        want = {"w13_weight_scale_inv": (experts, -(-two_i // bn), -(-hidden // bk)),
                "w2_weight_scale_inv": (experts, -(-hidden // bn), -(-inter // bk))}
        for name, shape in want.items():
            t = tensors.get(name)
            if t is None or t.dtype != torch.float32 or tuple(t.shape) != shape:
                got = "missing" if t is None else f"{t.dtype} {tuple(t.shape)}"
                raise ValueError(f"{layer_name}: {name} is {got}, expected torch.float32 {shape} "
                                 "(128x128 block scales)")
        if hidden % bk or inter % bk:
            raise ValueError(f"{layer_name}: hidden {hidden} / intermediate {inter} are not whole "
                             f"{bk}-value blocks (the kernels quantize activations per {bk})")
    elif w13.dtype in _FLOAT_FORMATS:
        fmt = _FLOAT_FORMATS[w13.dtype]
    else:
        raise ValueError(f"{layer_name}: w13_weight dtype {w13.dtype} is neither bf16/fp16 nor "
                         "float8_e4m3fn")
    if w2.dtype != w13.dtype:
        raise ValueError(f"{layer_name}: w2_weight is {w2.dtype}, w13_weight {w13.dtype}")
    has = [n in tensors for n in BIAS_NAMES]
    if has[0] != has[1]:
        raise ValueError(f"{layer_name}: w13_bias and w2_bias come together")
    if has[0]:
        for name, shape in (("w13_bias", (experts, two_i)), ("w2_bias", (experts, hidden))):
            if tuple(tensors[name].shape) != shape:
                raise ValueError(f"{layer_name}: {name} is {tuple(tensors[name].shape)}, expected {shape}")
    return DenseGeometry(fmt, experts, hidden, inter, has[0])


class DenseResidency:
    """Allocators, per-pick function and (CUDA) the fused split layer for dense layers of one
    geometry, format and activation on one device — the same interface as ``Mxfp4Residency``."""

    def __init__(self, geometry: DenseGeometry, facts: ActivationFacts, top_k: int,
                 device: torch.device | str, max_tokens: int, *, kernel_config: Any | None = None) -> None:
        self.geometry, self.facts = geometry, facts
        self.device = torch.device(device)
        self.max_tokens = int(max_tokens)
        self.choice = None
        self._experts: Any | None = None
        act = facts.activation + ("" if facts.swiglu_limit is None else f", limit {facts.swiglu_limit:g}")
        if self.device.type == "cuda":
            if geometry.expert_format == FP16:
                raise ValueError("fp16 experts on CUDA: the runtime's dense kernels read bf16 or fp8")
            from ..gpu.dense_experts import TritonDenseExperts
            from ..gpu.experts import ExpertShape

            self._experts = TritonDenseExperts(
                ExpertShape(geometry.hidden, geometry.intermediate), geometry.num_experts, int(top_k),
                self.max_tokens, self.device, kernel_config,   # None: the format's measured default
                expert_format="fp8-block" if geometry.expert_format == FP8_BLOCK else "bf16",
                activation=facts.activation, swiglu_limit=facts.swiglu_limit,
                swiglu_alpha=facts.swiglu_alpha)
            self.name = f"expert_residency Triton {geometry.expert_format} ({act})"
        elif self.device.type == "cpu":
            self.name = f"expert_residency torch {geometry.expert_format} reference (core.formats_ref, {act})"
        else:
            raise ValueError(f"dense residency runs on CUDA or CPU, not {self.device}")

    def to_kernel_layout(self, tensors: dict[str, torch.Tensor]) -> None:
        """No-op: both the kernels and the references read the checkpoint layout."""

    def allocators(self) -> tuple[BankAllocator, BankAllocator]:
        if self.device.type == "cuda":
            from ..gpu.pinned import pinned_view_allocator

            return device_allocator(self.device), pinned_view_allocator(self.device)
        return device_allocator("cpu"), host_allocator(pin=False)

    @property
    def fused(self) -> Any | None:
        return self._experts

    @property
    def workspace_bytes(self) -> int:
        """Device scratch of the kernels: the shared workspace, the T = 1 fused-finalize tickets,
        plus (FP8) the step's quantized inputs."""
        if self._experts is None:
            return 0
        return self._experts.workspace.nbytes + self._experts.ticket_bytes + self._experts.fp8_scratch_bytes

    def per_pick_fn(self) -> PerPickExpertFn:
        if self._experts is not None:
            return self._experts.per_pick_fn()
        from ..core.formats_ref import float_per_pick, fp8_block_per_pick

        make = fp8_block_per_pick if self.geometry.expert_format == FP8_BLOCK else float_per_pick
        return make(self.facts.activation, swiglu_limit=self.facts.swiglu_limit,
                    alpha=self.facts.swiglu_alpha)


def dense_residency_for(tensors: dict[str, torch.Tensor], layer: Any, top_k: int, max_tokens: int,
                        cache: dict[tuple, Any]) -> DenseResidency:
    """The shared ``DenseResidency`` for one layer (ValueError on a layout the runtime cannot take)."""
    name = getattr(layer, "layer_name", "MoE layer")
    geometry = dense_geometry(tensors, name)
    facts = activation_facts(layer)
    device = tensors["w13_weight"].device
    key = ("dense", geometry, facts, int(top_k), str(device))
    if key not in cache:
        cache[key] = DenseResidency(geometry, facts, int(top_k), device, max_tokens)
    return cache[key]
