"""MXFP4 expert layers (vLLM 0.33 ``Mxfp4MoEMethod``; gpt-oss's ``GptOssMxfp4MoEMethod``) under
residency: the runtime owns the layout.

vLLM's MXFP4 backends convert the checkpoint tensors into a backend-specific format in
``process_weights_after_loading`` and keep the block scales in a quant config built once for the
whole layer, so a bank split cannot reuse their kernels. In the split modes the plugin therefore
skips that conversion for MXFP4 layers (``routed_experts``) and keeps the **checkpoint layout**::

    w13_weight        uint8 [E, 2I, H/2]   E2M1 pairs, low nibble first; gate rows 0..I-1, up I..2I-1
                                           (gpt-oss, swigluoai: interleaved, gate 2n, up 2n+1)
    w13_weight_scale  uint8 [E, 2I, H/32]  ue8m0
    w2_weight         uint8 [E, H, I/2]
    w2_weight_scale   uint8 [E, H, I/32]
    w13_bias [E, 2I], w2_bias [E, H]       bf16 (gpt-oss: ``GptOssMxfp4MoEMethod.create_weights``
                                           with ``moe.has_bias``; interleaved like w13)

and this module turns those into banks and a per-pick expert function:

* on CUDA: the bank kernel ``blackwell.plugin.cuda_bank_experts`` selects by compute capability
  (the runtime's Triton MXFP4 kernels, ``expert_residency.gpu``, off the SM100 family): tensors
  re-ordered into its layout (``to_kernel_layout``), the cold bank in exact-size pinned host
  memory read in place (``gpu.pinned.pinned_view_allocator``); the worker runtime calls its
  ``forward`` — the fused split layer, both banks in one pass — (``Mxfp4Residency.fused``), the
  per-pick function stays for the core's contract;
* on CPU: the core's torch reference (``core.reference.mxfp4_swiglu_per_pick``) over the
  checkpoint layout (no vLLM MXFP4 kernel runs on CPU).

The expert these compute is ``y = W2 · bf16(silu(W1·x) * (W3·x))`` with bf16 activations, fp32
accumulation; with the layer's ``swiglu_limit`` L > 0 (DeepSeek-V4/V4.1 pass their
config's) ``silu(min(W1·x, L)) * clamp(W3·x, -L, L)``, as vLLM 0.33 computes SILU experts with a
clamp (``fused_moe/activation.py`` ``silu_and_mul_with_clamp``, ``fused_moe/utils.py``
``swiglu_limit_func``; docs/plugin.md cites the lines). gpt-oss (``activation == "swigluoai"``):
the biased SwiGLU-OAI of ``core.formats_ref.gptoss_mxfp4_per_pick`` with the constants
``GptOssMxfp4MoEMethod.get_fused_moe_quant_config`` passes (``quantization/mxfp4.py:428-430``:
alpha 1.702, beta 1.0 = the ``+ 1`` on up, limit 7.0). Anything else a layer asks for (another
activation, other swigluoai constants, alpha/beta on SILU) is refused by
``mxfp4_unsupported_reason`` rather than computed differently.

No vLLM import here (the GPU test runs it where vLLM is absent); the caller hands in the layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..contract.expert_formats import GPTOSS_SWIGLU_ALPHA, GPTOSS_SWIGLU_LIMIT
from ..core.banks import BankAllocator, device_allocator, host_allocator
from ..core.split import PerPickExpertFn

CHECKPOINT_NAMES = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")
SILU, SWIGLUOAI = "silu", "swigluoai"
BIAS_NAMES = ("w13_bias", "w2_bias")
MX_BLOCK = 32


def layer_swiglu_limit(layer: Any) -> float | None:
    """The SwiGLU clamp the runtime applies for ``layer``: its ``swiglu_limit`` when > 0, else None.
    vLLM 0.33 clamps only for a limit > 0 (``swiglu_limit_func``: ``HAS_LIMIT=swiglu_limit > 0``;
    ``_swiglu_limit_torch``: ``if swiglu_limit > 0``); an infinite limit clamps nothing."""
    limit = getattr(layer, "swiglu_limit", None)
    if limit is None or not float(limit) > 0 or float(limit) == float("inf"):
        return None
    return float(limit)


def layer_activation(layer: Any) -> str:
    """vLLM's ``MoEActivation`` value of ``layer`` (``silu``, ``swigluoai``, ...), lower case."""
    activation = getattr(layer, "activation", None)
    return str(getattr(activation, "value", activation)).lower()


def mxfp4_unsupported_reason(layer: Any) -> str | None:
    """None if the runtime computes exactly what this MXFP4 layer asks for, else why not.

    ``layer`` is a vLLM ``RoutedExperts`` (or anything with its attributes: ``layer_name``,
    ``activation``, ``swiglu_limit``, ``moe_config.swiglu_alpha/_beta``, the weight parameters).
    The verdict is the runtime's capability table's (``expert_residency.capabilities``, which
    ``recipegen check budgets`` reads too); this adds the layer and parameter names.
    """
    from ..capabilities import unsupported_reason
    from .dense_layers import swigluoai_constants_reason

    name = getattr(layer, "layer_name", "MoE layer")
    reason = padding_contract_reason(layer)
    if reason is not None:
        return (f"{name}: {reason}; set EXPERT_RESIDENCY_MODE=off/count for this model "
                "(vLLM's own kernel then serves it)")
    biases = [b for b in BIAS_NAMES if getattr(layer, b, None) is not None]
    act_name = layer_activation(layer)
    moe_config = getattr(layer, "moe_config", None)
    alpha = getattr(moe_config, "swiglu_alpha", None)
    beta = getattr(moe_config, "swiglu_beta", None)
    # swigluoai: gpt-oss's constants (alpha 1.702, limit 7.0, the method's own) or refused by
    # name; SILU: no alpha/beta. The table's alpha_beta flag cannot say which constants.
    reason = swigluoai_constants_reason(layer)
    if reason is not None:
        return (f"{name}: {reason}; set EXPERT_RESIDENCY_MODE=off/count for this model "
                "(vLLM's own kernel then serves it)")
    if act_name == SWIGLUOAI:
        alpha = beta = None
    reason = unsupported_reason(expert_format="mxfp4", activation=act_name,
                                swiglu_limit=None if act_name == SWIGLUOAI else layer_swiglu_limit(layer),
                                swiglu_alpha=alpha, swiglu_beta=beta, biases=bool(biases))
    if reason is None:
        return None
    detail = f" ({', '.join(biases)})" if biases and "bias" in reason else ""
    return (f"{name}: {reason}{detail}; set EXPERT_RESIDENCY_MODE=off/count for this model "
            "(vLLM's own kernel then serves it)")


def padding_contract_reason(layer: Any) -> str | None:
    """None when vLLM hands the runtime its padded activations and takes a padded output, else why
    not. vLLM 0.33 rounds an MXFP4 layer's hidden / intermediate sizes up for its backend before
    ``create_weights`` (``routed_experts.py:171-184``; ``fused_moe/oracle/mxfp4.py:837-917``:
    Marlin and TRT-LLM to 256 / 128, so gpt-oss's 2,880 / 2,880 become 3,072 / 2,944; the Triton
    backend keeps 2,880), zero-fills the pad (the parameters are ``torch.zeros`` and gpt-oss's
    loader copies the checkpoint into ``[:, :dim1, :dim2]``, ``routed_experts.py:698-707``), pads
    the activations with zeros to the rounded hidden size (``runner/moe_runner.py:546-557``) and
    cuts the output back (``moe_runner.py:517``). Zero pad rows, columns, scales and biases add
    exact zeros, so the runtime serves the padded layer as it is. Two TRT-LLM backends break that
    contract (``quantization/mxfp4.py:169-181``): ``skip_forward_padding`` (the activations
    arrive unpadded, narrower than the weights) and ``has_unpadded_output`` (the output must
    already be cut); with a padded hidden size (``moe_config.hidden_dim`` above
    ``hidden_dim_unpadded``, ``fused_moe/config.py:1293``) those are refused here. Unpadded
    geometries (DeepSeek-V4.1's 5,120 / 2,304 on TRT-LLM) are not affected."""
    method = getattr(layer, "quant_method", None)
    flags = [f for f in ("skip_forward_padding", "has_unpadded_output")
             if getattr(method, f, False) is True]
    moe_config = getattr(layer, "moe_config", None)
    hidden = getattr(moe_config, "hidden_dim", None)
    unpadded = getattr(moe_config, "hidden_dim_unpadded", None)
    if not flags or hidden is None or unpadded is None or int(hidden) == int(unpadded):
        return None
    backend = getattr(method, "mxfp4_backend", None)
    backend = getattr(backend, "name", backend)
    return (f"vLLM's MXFP4 backend {backend} sets {' and '.join(flags)} with the hidden size padded "
            f"from {int(unpadded)} to {int(hidden)} (its kernel pads the activations or cuts the "
            "output itself), which the runtime's split layer does not do")


def hold_back_conversion(method: Any, get_runtime: Callable[[], Any],
                         is_weights_pre_processed: Callable[[], bool]) -> None:
    """Replace ``method.process_weights_after_loading`` (a vLLM ``Mxfp4MoEMethod``) so that, for
    the target model's layers, the checkpoint-layout tensors stay as loaded: no backend
    conversion, no vLLM kernel, no quant config holding the whole layer's scales; the worker
    runtime re-homes the layers this marks (``_er_mxfp4``) after load. Layers it cannot compute
    exactly refuse here, at load, before any conversion. vLLM's own method is kept on the layer
    (``_er_vllm_process_weights``) and still runs for a second model's layers (a drafter, loaded
    after the target's banks exist), which vLLM's kernel serves."""
    from .hold_back import hold_back_checkpoint_layout

    def mark(module: Any) -> None:
        module._er_mxfp4 = True

    hold_back_checkpoint_layout(method, get_runtime, is_weights_pre_processed,
                                mxfp4_unsupported_reason, "MXFP4", mark)


def checkpoint_geometry(tensors: dict[str, torch.Tensor], layer_name: str = "MoE layer"
                        ) -> tuple[int, int, int]:
    """(experts, hidden, intermediate) of checkpoint-layout MXFP4 tensors; ValueError naming the
    tensor if any name, dtype or shape disagrees with vLLM 0.33's ``Mxfp4MoEMethod.create_weights``."""
    missing = [n for n in CHECKPOINT_NAMES if n not in tensors]
    if missing:
        raise ValueError(f"{layer_name}: no {missing} among the MXFP4 expert tensors "
                         f"({sorted(tensors)})")
    w13 = tensors["w13_weight"]
    if w13.dim() != 3:
        raise ValueError(f"{layer_name}: w13_weight must be [E, 2I, H/2], got {tuple(w13.shape)}")
    experts, two_i, half_h = (int(d) for d in w13.shape)
    hidden, inter = 2 * half_h, two_i // 2
    expected = {
        "w13_weight": (experts, 2 * inter, hidden // 2),
        "w13_weight_scale": (experts, 2 * inter, hidden // MX_BLOCK),
        "w2_weight": (experts, hidden, inter // 2),
        "w2_weight_scale": (experts, hidden, inter // MX_BLOCK),
    }
    for name, shape in expected.items():
        t = tensors[name]
        if t.dtype != torch.uint8 or tuple(t.shape) != shape:
            raise ValueError(f"{layer_name}: {name} is {t.dtype} {tuple(t.shape)}, expected "
                             f"torch.uint8 {shape} (vLLM's MXFP4 checkpoint layout; a backend's "
                             "converted format cannot be split)")
    if two_i % 2 or hidden % MX_BLOCK or inter % MX_BLOCK:
        raise ValueError(f"{layer_name}: hidden {hidden} / intermediate {inter} are not whole "
                         f"MX blocks of {MX_BLOCK}")
    has = [n in tensors for n in BIAS_NAMES]
    if has[0] != has[1]:
        raise ValueError(f"{layer_name}: w13_bias and w2_bias come together (one is missing)")
    for name, shape in (("w13_bias", (experts, 2 * inter)), ("w2_bias", (experts, hidden))):
        t = tensors.get(name)
        if t is not None and (tuple(t.shape) != shape or not t.is_floating_point()):
            raise ValueError(f"{layer_name}: {name} is {t.dtype} {tuple(t.shape)}, expected a float {shape}")
    return experts, hidden, inter


@dataclass(frozen=True)
class Mxfp4Geometry:
    hidden: int
    intermediate: int
    num_experts: int
    top_k: int


class Mxfp4Residency:
    """Layout, allocators and per-pick function for MXFP4 layers of one geometry on one device.

    One instance serves every layer of that geometry: on CUDA the Triton kernels' scratch
    workspace (sized for ``max_tokens``) is shared by the layers, which run one after another.
    """

    def __init__(self, geometry: Mxfp4Geometry, device: torch.device | str, max_tokens: int,
                 *, kernel_config: Any | None = None, swiglu_limit: float | None = None,
                 activation: str = SILU) -> None:
        if activation not in (SILU, SWIGLUOAI):
            raise ValueError(f"MXFP4 residency computes silu or swigluoai, not {activation!r}")
        if activation == SWIGLUOAI and swiglu_limit is not None:
            raise ValueError("swigluoai's limit is gpt-oss's 7.0 (no swiglu_limit)")
        self.geometry = geometry
        self.swiglu_limit = swiglu_limit
        self.activation = activation
        clamp = "" if swiglu_limit is None else f", swiglu_limit={swiglu_limit:g}"
        if activation == SWIGLUOAI:
            clamp = f", swigluoai alpha {GPTOSS_SWIGLU_ALPHA:g} limit {GPTOSS_SWIGLU_LIMIT:g} + biases"
        self.device = torch.device(device)
        self.max_tokens = int(max_tokens)
        self._experts: Any | None = None
        self.choice: Any | None = None  # blackwell.select.BankKernelChoice (CUDA)
        if self.device.type == "cuda":
            # The bank kernel by compute capability (and EXPERT_RESIDENCY_BANK_KERNEL): the
            # runtime's Triton kernels on SM90/SM89, FlashInfer TRT-LLM banks on SM100, or the
            # torch reference; each object offers the fused split layer's ``forward``.
            from ..blackwell.plugin import cuda_bank_experts

            self._experts, self.name, self.choice = cuda_bank_experts(
                geometry.hidden, geometry.intermediate, geometry.num_experts, geometry.top_k,
                self.max_tokens, self.device, kernel_config=kernel_config,
                swiglu_limit=swiglu_limit, activation=activation)
        elif self.device.type == "cpu":
            ref = "core.formats_ref" if activation == SWIGLUOAI else "core.reference"
            self.name = f"expert_residency torch MXFP4 reference ({ref}{clamp})"
        else:
            raise ValueError(f"MXFP4 residency runs on CUDA or CPU, not {self.device}")

    def to_kernel_layout(self, tensors: dict[str, torch.Tensor]) -> None:
        """Re-order one layer's full checkpoint tensors in place for the per-pick function (CUDA:
        tile-major for the Triton kernels; CPU: the reference reads the checkpoint layout as is).
        Call once per layer before re-homing or building the unsplit layer."""
        if self._experts is not None:
            self._experts.to_kernel_layout(tensors)

    def allocators(self) -> tuple[BankAllocator, BankAllocator]:
        """(hot, cold) bank allocators: CUDA — device memory and exact-size pinned host memory read
        in place; CPU — both host memory (the cold bank is the host tier by name only)."""
        if self.device.type == "cuda":
            from ..gpu.pinned import pinned_view_allocator

            return device_allocator(self.device), pinned_view_allocator(self.device)
        return device_allocator("cpu"), host_allocator(pin=False)

    @property
    def fused(self) -> Any | None:
        """CUDA: the bank-kernel object (``gpu.experts.TritonMxfp4Experts``, or on SM100
        ``blackwell.trtllm.TrtllmMxfp4Banks``) whose ``forward`` is the whole split layer (both
        banks in one pass, one finalize, counter on the device); None for the torch reference."""
        return self._experts

    @property
    def workspace_bytes(self) -> int:
        """Device bytes allocated once for the kernels' shared workspace (0 on CPU), with the
        Triton kernels' split-K tickets (``gpu.experts.SplitScratch``: zeroed at start-up, reset
        by each launch's last program; the TRT-LLM banks have none)."""
        if self._experts is None:
            return 0
        scratch = getattr(self._experts, "split_scratch", None)
        return self._experts.workspace.nbytes + (scratch.nbytes if scratch is not None else 0)

    def per_pick_fn(self) -> PerPickExpertFn:
        if self._experts is not None:
            return self._experts.per_pick_fn()
        if self.activation == SWIGLUOAI:   # vLLM's interleaved layout, biases from the banks
            from ..core.formats_ref import gptoss_mxfp4_per_pick

            return gptoss_mxfp4_per_pick()
        from ..core.reference import mxfp4_swiglu_per_pick

        return mxfp4_swiglu_per_pick(swiglu_limit=self.swiglu_limit)


def residency_for(tensors: dict[str, torch.Tensor], top_k: int, max_tokens: int,
                  cache: dict[tuple, Mxfp4Residency], layer_name: str = "MoE layer",
                  swiglu_limit: float | None = None, activation: str = SILU) -> Mxfp4Residency:
    """The (shared) ``Mxfp4Residency`` for a layer's checkpoint tensors, SwiGLU clamp
    (``layer_swiglu_limit``) and activation (``layer_activation``: ``swigluoai`` for gpt-oss);
    ValueError on a layout or geometry the kernels cannot take."""
    experts, hidden, inter = checkpoint_geometry(tensors, layer_name)
    device = tensors["w13_weight"].device
    if activation == SWIGLUOAI:
        swiglu_limit = None   # gpt-oss's 7.0 is the activation's own
    key = (hidden, inter, experts, int(top_k), str(device), swiglu_limit, activation)
    if key not in cache:
        cache[key] = Mxfp4Residency(Mxfp4Geometry(hidden, inter, experts, int(top_k)), device,
                                    max_tokens, swiglu_limit=swiglu_limit, activation=activation)
    return cache[key]
