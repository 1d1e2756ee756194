"""A layer the runtime computes never has vLLM build its quant config: vLLM 0.33's MoE runner calls
``routed_experts._ensure_moe_quant_config_init()`` before every forward, which reads the layer's
weight-scale parameters — gone after re-homing (for MXFP4, ``get_fused_moe_quant_config`` reads
``layer.w13_weight_scale``). Pinned in the 0.33.0 source, then checked on the very method vLLM calls."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))

from test_vllm033_contracts import _v033_root  # noqa: E402

torch = pytest.importorskip("torch", reason="torch absent: the plugin's forward module needs it")


def _source(rel: str) -> str:
    root = _v033_root()
    if root is None:
        pytest.skip("vllm 0.33.0 source absent: run scripts/fetch-vllm033-source.sh")
    return (root / rel).read_text(encoding="utf-8")


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise AssertionError(f"{cls}.{name} not found")


def test_vllm_033_builds_the_quant_config_on_the_forward_path_from_layer_scales() -> None:
    runner = ast.unparse(ast.parse(_source("model_executor/layers/fused_moe/runner/moe_runner.py")))
    assert "self.routed_experts._ensure_moe_quant_config_init()" in runner
    ensure = ast.unparse(_method(ast.parse(_source("model_executor/layers/fused_moe/routed_experts.py")),
                                 "RoutedExperts", "_ensure_moe_quant_config_init"))
    assert "self.quant_method.moe_quant_config is None" in ensure
    assert "get_fused_moe_quant_config(self)" in ensure
    mxfp4 = ast.unparse(_method(ast.parse(_source("model_executor/layers/quantization/mxfp4.py")),
                                "Mxfp4MoEMethod", "get_fused_moe_quant_config"))
    assert "layer.w13_weight_scale" in mxfp4


class _VllmContainer:
    """What ``RoutedExperts._ensure_moe_quant_config_init`` does, reduced to the parameter read
    that fails once re-homing has removed the layer's scales."""

    def __init__(self) -> None:
        self.built = 0

    def _ensure_moe_quant_config_init(self) -> None:
        self.w13_weight_scale  # noqa: B018 — AttributeError after re-homing, as in vLLM
        self.built += 1


def _container() -> object:
    from expert_residency.vllm_plugin.forward import ResidencyForward

    class Layer(ResidencyForward, _VllmContainer):
        pass

    return Layer()


def test_a_runtime_computed_layer_skips_vllms_quant_config() -> None:
    layer = _container()
    layer._er_resident = object()  # re-homed: the runtime computes this layer
    layer._ensure_moe_quant_config_init()  # must not read the removed scales
    assert layer.built == 0


def test_a_layer_vllm_computes_still_gets_its_quant_config() -> None:
    layer = _container()
    with pytest.raises(AttributeError):  # vLLM's own path runs (and reads the scales)
        layer._ensure_moe_quant_config_init()
    layer.w13_weight_scale = torch.ones(1)
    layer._ensure_moe_quant_config_init()
    assert layer.built == 1
