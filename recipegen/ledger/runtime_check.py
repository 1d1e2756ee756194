"""Would the expert residency runtime refuse this lane? Asked of the runtime's own capability
table (`expert_residency.capabilities`, the one place that says what the runtime can split), so
`check budgets` fails where the plugin would refuse at boot, naming why."""

from __future__ import annotations

from expert_residency.capabilities import format_support, unsupported_reason, unverified_note

from recipegen.ledger.flags import flag_int, flag_on
from recipegen.ledger.result import USAGE_AWARE, Violation
from recipegen.schema import Lane, Machine, Model


def runtime_violations(model: Model, machine: Machine, lane: Lane) -> list[Violation]:
    """A usage-aware lane runs the runtime's split; a positional lane, or one holding every routed
    expert in HBM, is plain vLLM (not asked)."""
    if lane.offload.placement != USAGE_AWARE or model.expert_format is None:
        return []
    if lane.offload.hot_experts_per_layer == model.routed_experts:
        return []  # every routed expert in HBM: nothing to split, the runtime is not mounted
    act = model.activation
    reason = unsupported_reason(
        expert_format=model.expert_format,
        activation=act.kind if act else "silu",
        swiglu_limit=act.limit if act else None,
        swiglu_alpha=act.alpha if act else None,
        biases=model.expert_biases,
        compute_capability=machine.gpus.compute_capability,
        expert_parallel=flag_on(list(lane.extra_args), "--enable-expert-parallel"),
        eplb=flag_on(list(lane.extra_args), "--enable-eplb"))
    if reason is None and flag_on(list(lane.extra_args), "--enable-expert-parallel") \
            and flag_int(list(lane.extra_args), "--data-parallel-size") > 1:
        # vllm_plugin.expert_parallel.ep_reason: the token dispatch runs inside the MoE kernel
        # the runtime replaces (fused_moe/config.py:1034-1039, runner/moe_runner.py:801-804)
        reason = ("expert parallelism with --data-parallel-size > 1: vLLM dispatches tokens between ranks "
                  "inside the MoE kernel the runtime replaces; run EP with --data-parallel-size 1")
    if reason is None:
        return _backend_violations(model, machine, lane) or (
            _bank_kernel_violations(model, machine, lane) + _padding_violations(model, machine, lane))
    return [Violation(
        "runtime", f"the expert residency runtime would refuse this lane at boot: {reason}",
        "use placement: positional (vLLM's own --cpu-offload-gb, no runtime split), or a checkpoint "
        "in a format the runtime splits (expert_residency/capabilities.py)", lane=lane.name)]


def _backend_violations(model: Model, machine: Machine, lane: Lane) -> list[Violation]:
    """No vLLM 0.33 MoE backend runs the format as a modular kernel on the GPU
    (recipegen.vllm_flags.moe_backend): the runtime's boot would fail there too."""
    from recipegen.vllm_flags.moe_backend import NoBackend, choose

    try:
        choose(model.expert_format, machine.gpus.compute_capability, machine.gpus.kind)
    except NoBackend as exc:
        message, _, fix = str(exc).partition(". What would work: ")
        return [Violation("runtime", message, fix or "placement: positional", lane=lane.name)]
    return []


def _bank_kernel_violations(model: Model, machine: Machine, lane: Lane) -> list[Violation]:
    """The bank kernel the runtime picks on this GPU (`expert_residency.blackwell.select`: by
    compute capability, or the lane's EXPERT_RESIDENCY_BANK_KERNEL) cannot compute the experts'
    activation: the plugin refuses the layer at load with the same words."""
    from expert_residency.blackwell.select import activation_refusal

    from recipegen.ledger.workspace import bank_kernel

    kernel = bank_kernel(model, machine, lane)
    act = model.activation.kind if model.activation else "silu"
    reason = activation_refusal(kernel, act) if kernel else None
    if reason is None:
        return []
    return [Violation(
        "runtime", f"the expert residency runtime would refuse this lane at load: {reason} "
        f"(compute capability {machine.gpus.compute_capability} picks {kernel})",
        "set env EXPERT_RESIDENCY_BANK_KERNEL: triton on the lane (the runtime's Triton kernels), or "
        "placement: positional (plain vLLM)", lane=lane.name)]


def _padding_violations(model: Model, machine: Machine, lane: Lane) -> list[Violation]:
    """vLLM's TRT-LLM MXFP4 backends skip the activation padding or return an unpadded output
    (vLLM 0.33 quantization/mxfp4.py:169-181, :595-607); with a padded hidden size the runtime
    refuses the layer at load (vllm_plugin/mxfp4_experts.py `padding_contract_reason`)."""
    from recipegen.ledger.vllm_layout import lane_layout

    layout = lane_layout(model, machine, lane, runtime=True)
    if layout is None or not layout.backend.startswith("FLASHINFER_TRTLLM") or layout.hidden == model.hidden_size:
        return []
    return [Violation(
        "runtime", f"the expert residency runtime would refuse this lane at load: vLLM's MXFP4 backend "
        f"{layout.backend} pads the hidden size {model.hidden_size} -> {layout.hidden} but leaves the "
        "activations unpadded or cuts the output itself, which the runtime's split layer does not do "
        "(vllm_plugin/mxfp4_experts.py padding_contract_reason)",
        "use placement: positional (plain vLLM), or a GPU whose backend pads the activations "
        "(Marlin, Triton)", lane=lane.name)]


def runtime_caveat(model: Model, machine: Machine, lane: Lane) -> str | None:
    """A note (not a violation) where the runtime would split this lane but its split was not
    verified bit-identical on this kind of GPU."""
    if lane.offload.placement != USAGE_AWARE or model.expert_format is None \
            or lane.offload.hot_experts_per_layer == model.routed_experts:
        return None
    if runtime_violations(model, machine, lane):
        return None
    if unverified_note(model.expert_format, machine.gpus.compute_capability) is None:
        return None
    row = format_support(model.expert_format)
    where = sorted({line.split(":")[0] for line in (row.verified_on if row else ())})
    return (f"the runtime's {model.expert_format} split is not verified on compute capability "
            f"{machine.gpus.compute_capability} (verified on: {'; '.join(where)})")
