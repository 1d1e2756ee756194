"""Which `--moe-backend` a lane with the expert residency runtime gets: by GPU and expert format.

The runtime needs vLLM to build a *modular* MoE kernel for every routed-expert layer (the
plugin sets `FusedMoEConfig.require_decomposed_backend`, and vLLM 0.33 then skips monolithic
experts classes: `model_executor/layers/fused_moe/modular_kernel.py:610`): in count mode vLLM's
kernel serves and the runtime counts the `topk_ids` it is handed; in residency mode vLLM's quant
method is still constructed (its backend oracle runs in the constructor), but MXFP4 layers are
computed by the runtime's own kernels and unquantized layers by vLLM's modular kernel per pick.
An explicit `--moe-backend` whose experts class does not run on the lane's GPU makes vLLM refuse
the boot (`oracle/mxfp4.py` `_return_or_raise`: "... is not supported"), which is what rendering
`flashinfer_trtllm` (an SM100-family kernel) on every lane did to H200/H100/L40S lanes.

The table below is derived from vLLM 0.33.0's backend oracles and experts classes and pinned by
tests/test_moe_backend_contracts.py against the unpacked source. One row per candidate, in
order of preference: the first row whose device gate admits the GPU is rendered.

Formats without a row (int4, nvfp4) get no flag: vLLM's `auto` oracle, which honours
`require_decomposed_backend` too. A lane whose GPU no row admits, for a format that has rows, is
a `check budgets` violation (and render refuses it) naming the GPU, the format and what would
work.
"""

from __future__ import annotations

from dataclasses import dataclass

VLLM = "vLLM 0.33.0 vllm/model_executor/layers/fused_moe"


@dataclass(frozen=True)
class BackendRow:
    """One `--moe-backend` value for one expert format, and where it runs."""

    expert_format: str
    """The model's routed-expert format (`schema.Model.expert_format`)."""
    moe_backend: str
    """The `--moe-backend` value (vLLM 0.33 `config/kernel.py` `MoEBackend`)."""
    experts_class: str
    """The modular experts class vLLM's oracle picks for it with a decomposed backend required."""
    min_cc: tuple[int, int]
    """Lowest compute capability the class runs on."""
    major_only: int | None
    """Only this compute-capability major (a vLLM `is_device_capability_family` gate), or None."""
    autotunes: bool
    """Whether vLLM autotunes this kernel at boot (FlashInfer's autotuner), which sizes the
    health start period."""
    source: str
    """vLLM source lines the row is read from."""

    def admits(self, cc: tuple[int, int]) -> bool:
        if self.major_only is not None and cc[0] != self.major_only:
            return False
        return cc >= self.min_cc

    def gate(self) -> str:
        if self.major_only is not None:
            return f"the SM{self.major_only}0 family (compute capability {self.major_only}.x)"
        return f"compute capability {self.min_cc[0]}.{self.min_cc[1]} or newer"


TABLE: tuple[BackendRow, ...] = (
    BackendRow("mxfp4", "flashinfer_trtllm", "TrtLlmMxfp4ExpertsModular", (10, 0), 10, True,
               f"{VLLM}/oracle/mxfp4.py:361-364 (map), :227 (Monolithic, then Modular), "
               "experts/trtllm_mxfp4_moe.py:121-123 (is_device_capability_family(100))"),
    BackendRow("mxfp4", "marlin", "MarlinExperts", (7, 5), None, False,
               f"{VLLM}/oracle/mxfp4.py:378 (map), :280, "
               "experts/marlin_moe.py:592-594 (has_device_capability((7, 5)))"),
    BackendRow("bf16", "triton", "TritonExperts", (7, 0), None, False,
               f"{VLLM}/oracle/unquantized.py:183 (map), :134-139, "
               "experts/triton_moe.py:120-121 (is_cuda_alike)"),
    BackendRow("fp16", "triton", "TritonExperts", (7, 0), None, False,
               f"{VLLM}/oracle/unquantized.py:183 (map), :134-139, "
               "experts/triton_moe.py:120-121 (is_cuda_alike)"),
    BackendRow("fp8-block", "triton", "TritonExperts", (8, 9), None, False,
               f"{VLLM}/oracle/fp8.py:274 (map), :200-203, experts/triton_moe.py:159-161 "
               "(FP8 schemes only where current_platform.supports_fp8(): "
               "platforms/cuda.py:587-588, compute capability 8.9)"),
    BackendRow("fp8-block", "marlin", "MarlinExperts", (7, 5), None, False,
               f"{VLLM}/oracle/fp8.py:279 (map), :193-198, experts/marlin_moe.py:592-594, :608 "
               "(kFp8Static128BlockSym weights)"),
    BackendRow("fp8", "triton", "TritonExperts", (8, 9), None, False,
               f"{VLLM}/oracle/fp8.py:274, experts/triton_moe.py:159-165"),
    BackendRow("fp8", "marlin", "MarlinExperts", (7, 5), None, False,
               f"{VLLM}/oracle/fp8.py:279, experts/marlin_moe.py:592-594"),
)


@dataclass(frozen=True)
class BackendChoice:
    """What render emits for a lane: `moe_backend` (None: no flag, vLLM's auto) and why."""

    moe_backend: str | None
    row: BackendRow | None
    reason: str


class NoBackend(ValueError):
    """No row admits the lane's GPU for its expert format (the message says what would)."""


def parse_cc(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    major, _, minor = str(text).partition(".")
    return int(major), int(minor or 0)


def choose(expert_format: str | None, compute_capability: str | None, gpu: str = "GPU"
           ) -> BackendChoice:
    """The backend for experts of `expert_format` on a GPU of `compute_capability` ("9.0").

    No flag when the format has no row or the GPU's capability is unknown (vLLM's auto oracle,
    which honours the plugin's decomposed-backend request); NoBackend when rows exist and none
    admits the GPU."""
    rows = [r for r in TABLE if r.expert_format == expert_format]
    cc = parse_cc(compute_capability)
    if not rows:
        return BackendChoice(None, None, f"no table row for expert format {expert_format!r}: "
                             "vLLM 0.33's auto oracle picks a modular kernel")
    if cc is None:
        return BackendChoice(None, None, f"{gpu}: compute capability unknown: vLLM 0.33's auto "
                             "oracle picks a modular kernel")
    for row in rows:
        if row.admits(cc):
            return BackendChoice(row.moe_backend, row,
                                 f"{row.experts_class} on compute capability {cc[0]}.{cc[1]} "
                                 f"({row.source})")
    would = "; ".join(f"--moe-backend {r.moe_backend} ({r.experts_class}) needs {r.gate()}"
                      for r in rows)
    raise NoBackend(f"no vLLM 0.33 MoE backend runs {expert_format} experts as a modular kernel "
                    f"on {gpu} (compute capability {cc[0]}.{cc[1]}), so the expert residency "
                    f"runtime cannot boot there: {would}. What would work: a GPU one of those "
                    "admits, or placement: positional (plain vLLM, no runtime)")



def choose_or_auto(expert_format: str | None, compute_capability: str | None, gpu: str = "GPU"
                   ) -> BackendChoice:
    """`choose`, or where no row admits the GPU no flag (vLLM's auto oracle) with that refusal as the
    reason: what a lane without the runtime (a count boot, a positional lane) runs. The render's
    `--moe-backend` and health start period, and the monitoring rules' boot allowance, all read it."""
    try:
        return choose(expert_format, compute_capability, gpu)
    except NoBackend as exc:
        return BackendChoice(None, None, str(exc))

# Health start period of a lane: the first boot of a kernel shape that vLLM autotunes pays
# FlashInfer's autotuner (~75 min per shape in the field report "vLLM: Pin Hot Experts",
# 2026-09-17; two shapes for a split lane); other backends compile Triton kernels (seconds to
# minutes, cached in the lane's volume) and capture CUDA graphs. A lane turns healthy at its
# first good probe, so the period only bounds how long a hung boot goes unnoticed.
START_PERIOD_AUTOTUNED = "180m"
START_PERIOD_DEFAULT = "60m"


def start_period(choice: BackendChoice | None) -> str:
    if choice is not None and choice.row is not None and choice.row.autotunes:
        return START_PERIOD_AUTOTUNED
    return START_PERIOD_DEFAULT
