"""Routed-expert bytes as vLLM 0.33 allocates them, where that differs from the checkpoint.

For MXFP4 experts vLLM picks a backend by compute capability and pads the hidden and
intermediate sizes to that backend's tile (vllm/model_executor/layers/fused_moe/oracle/mxfp4.py):

- backend order: gpt-oss (swigluoai) `_get_priority_backends_for_gpt_oss` (:402-431: FlashInfer
  TRT-LLM first, which needs the SM100 family; OAI Triton next, which needs 9.0 <= cc < 13.0,
  experts/gpt_oss_triton_kernels_moe.py:41-53, and on SM12x is moved after Marlin, :424-430;
  Marlin, cc >= 7.5, experts/marlin_moe.py:592-594); other MXFP4 models `_get_priority_backends`
  (:437-460: TRT-LLM MXFP8 on SM100, then Marlin, with Humming moved ahead of Marlin on SM90,
  quantization/utils/humming/priority.py:11); an explicit `--moe-backend` is honoured instead
  (`select_mxfp4_moe_backend`, :650-710, through `map_mxfp4_backend`, :352-399);
- padding `mxfp4_round_up_hidden_size_and_intermediate_size` (:837-916): Marlin intermediate to
  128, hidden to 256 (:865-870); TRT-LLM intermediate 128, hidden 256 (:871-873); Triton and
  Humming only the intermediate to 64 (:915-916). The intermediate size is per tensor-parallel rank.

The rounding happens before the weights exist: `RoutedExperts.__init__` asks the quant method's
`maybe_roundup_sizes` (vllm/model_executor/layers/fused_moe/routed_experts.py:171-184;
quantization/mxfp4.py:183-198 for gpt-oss, :609-627 otherwise) and `create_weights` allocates
zero-filled tensors of the rounded shape (quantization/mxfp4.py:200-292: w13 [E, 2I, H/2] and w2
[E, H, I/2] uint8, scales [E, 2I, H/32] and [E, H, I/32] uint8, biases [E, 2I] and [E, H] bf16);
gpt-oss's loader copies the checkpoint into the front of them (routed_experts.py:698-707).

A plain-vLLM (positional) lane holds these padded tensors in HBM and in pinned host memory. So
does a usage-aware lane: the runtime holds back only vLLM's *conversion*
(`process_weights_after_loading`, runtime/expert_residency/vllm_plugin/hold_back.py), reads the
layer's geometry off the allocated, padded tensors (`mxfp4_experts.checkpoint_geometry`) and
re-homes those very tensors into its hot and cold banks (`worker_runtime.py`, `_expert_tensors`
into `rehome_model`); it serves the padded layer as it is (`mxfp4_experts.padding_contract_reason`).
Its backend is the one the lane boots with: the lane's own `--moe-backend`, else the one render
adds for the runtime (`recipegen.vllm_flags.moe_backend`: `marlin` off the SM100 family — H100/H200 too —,
`flashinfer_trtllm` on it), so a gpt-oss residency lane is padded to 3,072 / 2,944 on every
GPU unless it asks for `--moe-backend triton` (SM90 only). The runtime's start-up workspace is
sized from the same padded geometry (`lane_geometry`, used by `workspace`).
"""

from __future__ import annotations

from dataclasses import dataclass

from recipegen.ledger.flags import flag_value
from recipegen.ledger.result import USAGE_AWARE
from recipegen.schema import Lane, Machine, Model

_SRC = "vLLM 0.33.0 vllm/model_executor/layers/fused_moe/oracle/mxfp4.py"


@dataclass(frozen=True)
class Layout:
    backend: str
    hidden: int           # padded hidden size
    intermediate: int     # padded intermediate size, whole layer (per rank × tp)
    bytes_per_expert: int
    source: str


def _round_up(x: int, a: int) -> int:
    return -(-x // a) * a


# `--moe-backend` values (oracle/mxfp4.py:352-399, `map_mxfp4_backend`) -> (backend, alignments).
_BY_NAME: dict[str, tuple[str, int, int]] = {
    "marlin": ("MARLIN", 128, 256),
    "flashinfer_trtllm": ("FLASHINFER_TRTLLM_MXFP4_BF16", 128, 256),
    "flashinfer_trtllm_afp8": ("FLASHINFER_TRTLLM_MXFP4_MXFP8", 128, 256),
    "flashinfer_cutlass": ("FLASHINFER_CUTLASS_MXFP4_BF16", 128, 128),
    "flashinfer_cutlass_afp8": ("FLASHINFER_CUTLASS_MXFP4_MXFP8", 128, 128),
    "triton": ("TRITON", 64, 1),
    "humming": ("HUMMING", 64, 1),
    "deep_gemm": ("DEEPGEMM_MXFP4", 128, 128),
}


def mxfp4_backend(model: Model, compute_capability: str | None,
                  requested: str | None = None) -> tuple[str, int, int] | None:
    """(backend, intermediate alignment, hidden alignment) vLLM 0.33 uses: the lane's
    `--moe-backend` when it names an MXFP4 backend, else its default pick; None if unknown."""
    if requested is not None and requested in _BY_NAME:
        return _BY_NAME[requested]
    if compute_capability is None:
        return None
    major, _, minor = compute_capability.partition(".")
    cc = (int(major), int(minor or 0))
    gpt_oss = model.activation is not None and model.activation.kind == "swigluoai"
    if cc[0] == 10:
        return ("FLASHINFER_TRTLLM_MXFP4_BF16" if gpt_oss else "FLASHINFER_TRTLLM_MXFP4_MXFP8", 128, 256)
    if gpt_oss and cc[0] == 9:
        return ("TRITON", 64, 1)
    if not gpt_oss and cc == (9, 0):
        return ("HUMMING", 64, 1)
    if cc >= (7, 5):
        return ("MARLIN", 128, 256)
    return None


def vllm_mxfp4_layout(model: Model, machine: Machine, tp: int, requested: str | None = None) -> Layout | None:
    """The padded layout of an MXFP4 model with declared hidden/intermediate sizes, or None when
    nothing is padded (or the model does not declare its sizes)."""
    if model.expert_format != "mxfp4" or model.hidden_size is None or model.moe_intermediate_size is None:
        return None
    choice = mxfp4_backend(model, machine.gpus.compute_capability, requested)
    if choice is None:
        return None
    backend, inter_align, hidden_align = choice
    hidden = _round_up(model.hidden_size, hidden_align)
    inter = _round_up(model.moe_intermediate_size // tp, inter_align) * tp
    if (hidden, inter) == (model.hidden_size, model.moe_intermediate_size):
        return None
    per = (2 * inter * hidden + hidden * inter) // 2 + (2 * inter * hidden + hidden * inter) // 32
    if model.expert_biases:
        per += (2 * inter + hidden) * 2
    line = {"MARLIN": ":865-870", "FLASHINFER_TRTLLM_MXFP4_BF16": ":871-873",
            "FLASHINFER_TRTLLM_MXFP4_MXFP8": ":871-873", "DEEPGEMM_MXFP4": ":857-860",
            "FLASHINFER_CUTLASS_MXFP4_BF16": ":874-879",
            "FLASHINFER_CUTLASS_MXFP4_MXFP8": ":874-879"}.get(backend, ":915-916")
    how = f" (--moe-backend {requested})" if requested in _BY_NAME else ""
    return Layout(backend, hidden, inter, per,
                  f"{_SRC}{line}: {backend}{how} on compute capability {machine.gpus.compute_capability} pads hidden "
                  f"{model.hidden_size} -> {hidden}, intermediate {model.moe_intermediate_size} -> {inter}")


def runtime_mounted(model: Model, lane: Lane) -> bool:
    """The lane runs the runtime's split: usage-aware with experts left to re-home (render mounts
    the runtime for it and adds its `--moe-backend`)."""
    return lane.offload.placement == USAGE_AWARE and lane.offload.hot_experts_per_layer != model.routed_experts


def lane_moe_backend(model: Model, machine: Machine, lane: Lane, *, runtime: bool | None = None) -> str | None:
    """The `--moe-backend` vLLM 0.33 boots the lane with: the lane's own (`extra_args`); else, where
    the runtime runs (`runtime`, default `runtime_mounted`), the one render adds for it
    (`recipegen.vllm_flags.moe_backend.choose`, recipegen/render/services.py); else None (vLLM's auto pick)."""
    own = flag_value(list(lane.extra_args), "--moe-backend")
    if own is not None:
        return own
    if not (runtime_mounted(model, lane) if runtime is None else runtime):
        return None
    from recipegen.vllm_flags.moe_backend import NoBackend, choose

    try:
        return choose(model.expert_format, machine.gpus.compute_capability, machine.gpus.kind).moe_backend
    except NoBackend:
        return None  # check budgets and render refuse such a lane by name (runtime_check)


def lane_layout(model: Model, machine: Machine, lane: Lane, *, runtime: bool | None = None) -> Layout | None:
    """The padded layout of the lane's routed experts (`vllm_mxfp4_layout` at the lane's backend)."""
    return vllm_mxfp4_layout(model, machine, lane.tensor_parallel_size,
                             lane_moe_backend(model, machine, lane, runtime=runtime))


def lane_geometry(model: Model, machine: Machine, lane: Lane) -> tuple[int, int] | None:
    """(hidden, intermediate for the whole layer) of the tensors the runtime's banks hold on this
    lane, where vLLM pads them; None where it does not (the checkpoint's sizes apply)."""
    layout = lane_layout(model, machine, lane, runtime=True)
    return None if layout is None else (layout.hidden, layout.intermediate)


def as_lane_lays_out(model: Model, machine: Machine, lane: Lane) -> tuple[Model, Layout | None]:
    """The model with its routed experts as the lane's engine holds them: plain vLLM's layout on a
    positional lane, the same (possibly padded) tensors in the runtime's banks on a usage-aware one."""
    layout = lane_layout(model, machine, lane)
    return _padded(model, layout), layout


def _padded(model: Model, layout: Layout | None) -> Model:
    if layout is None:
        return model
    tensors = [{"name": "w13", "shape": [2 * layout.intermediate, layout.hidden], "dtype": "mxfp4"},
               {"name": "w2", "shape": [layout.hidden, layout.intermediate], "dtype": "mxfp4"}]
    if model.expert_biases:
        tensors += [{"name": "w13_bias", "shape": [2 * layout.intermediate], "dtype": "bf16", "kind": "bias"},
                    {"name": "w2_bias", "shape": [layout.hidden], "dtype": "bf16", "kind": "bias"}]
    from recipegen.schema.model import ExpertTensor
    return model.model_copy(update={
        "expert_tensors": [ExpertTensor.model_validate(t) for t in tensors],
        "bytes_per_expert": layout.bytes_per_expert,
        "sources": {**model.sources, "expert_tensors": layout.source}})
