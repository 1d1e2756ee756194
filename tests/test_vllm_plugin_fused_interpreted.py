"""The plugin's fused CUDA branch on the CPU: ``WorkerRuntime.split_forward`` → the fused split
layer (``TritonMxfp4Experts.forward``) with the Triton kernels under ``TRITON_INTERPRET=1``
(integer dequantizer, small tiles: indexing and masking, not the GPU's numerics).

The GPU runs the compiled kernels through the same entry under CUDA graphs
(tests/gpu/test_plugin_entry_graph_gpu.py); this checks the branch logic in CI: through the
stand-in layer's ``forward_modular`` (the method vLLM calls), residency (two banks, counter on,
step masks from a vLLM-shaped forward context with padded rows) == unsplit on the real rows bit
for bit, and the in-kernel counter == a recount by hand that skips the padding.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interpreter_rerun import rerun_interpreted  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="needs Triton for TRITON_INTERPRET=1"),
    pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: "
                       "tests/gpu/test_plugin_entry_graph_gpu.py runs the compiled kernels")]


def _rerun_interpreted(test_id: str) -> bool:
    """This file's test ``test_id`` in a fresh ``TRITON_INTERPRET=1`` process when needed
    (``interpreter_rerun``)."""
    return rerun_interpreted(__file__, test_id)


def test_fused_branch_equals_unsplit_and_counts_exactly(monkeypatch) -> None:
    if _rerun_interpreted("test_fused_branch_equals_unsplit_and_counts_exactly"):
        return
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels module is first imported
    import test_vllm_plugin_mxfp4 as mx
    from expert_residency.core.banks import device_allocator, host_allocator
    from expert_residency.gpu.experts import ExpertShape, KernelConfig, TritonMxfp4Experts
    from expert_residency.mxfp4 import quantize_mxfp4
    from expert_residency.vllm_plugin import mxfp4_experts
    from expert_residency.vllm_plugin.worker_runtime import set_runtime
    from plugin_entry_support import plugin_runtime, recount, step_context

    config = KernelConfig(dequant=0, block_m=4, block_n1=32, block_k1=64, block_n2=32,
                          block_k2=64)

    class Interpreted(mxfp4_experts.Mxfp4Residency):
        """The CUDA branch's objects on CPU tensors: Triton experts, host banks."""

        def __init__(self, geometry, device, max_tokens, *, kernel_config=None,
                     swiglu_limit=None, activation="silu") -> None:
            super().__init__(geometry, "cpu", max_tokens, swiglu_limit=swiglu_limit,
                             activation=activation)
            self._experts = TritonMxfp4Experts(
                ExpertShape(geometry.hidden, geometry.intermediate), geometry.num_experts,
                geometry.top_k, max_tokens, "cpu", config, swiglu_limit=swiglu_limit,
                activation=activation)

        def allocators(self):
            return device_allocator("cpu"), host_allocator(pin=False)

    monkeypatch.setattr(mxfp4_experts, "Mxfp4Residency", Interpreted)

    def tensors():
        out = {}
        for index, (w13, w2) in mx.build_case("cpu").weights.items():
            q13, s13 = quantize_mxfp4(w13)
            q2, s2 = quantize_mxfp4(w2)
            out[index] = {"w13_weight": q13, "w13_weight_scale": s13, "w2_weight": q2,
                          "w2_weight_scale": s2}
        return out

    res, res_layers = plugin_runtime(tensors(), "residency", top_k=mx.TOP_K, max_num_tokens=16,
                                     hot={i: [0, 3, 5] for i in mx.LAYERS}, count=True)
    ref, ref_layers = plugin_runtime(tensors(), "unsplit", top_k=mx.TOP_K, max_num_tokens=16)
    assert set(res.fused) == set(ref.fused) == set(mx.LAYERS)
    rows, lengths = 8, [1, 1, 4]            # 6 real rows: two decodes, a chunk; 2 padded rows
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, mx.HIDDEN, generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(mx.EXPERTS, generator=gen)[:mx.TOP_K]
                       for _ in range(rows)]).to(torch.int32)
    ids[6:] = 0
    weights = torch.softmax(torch.randn(rows, mx.TOP_K, generator=gen), dim=-1)
    ctx = step_context(rows, lengths, "cpu")
    outs = {}
    try:
        for name, runtime, layers in (("res", res, res_layers), ("ref", ref, ref_layers)):
            set_runtime(runtime)
            runtime.on_forward_context(ctx)
            outs[name] = [layers[i].forward_modular(x, weights, ids) for i in mx.LAYERS]
    finally:
        set_runtime(None)
    for a, b in zip(outs["res"], outs["ref"]):
        assert torch.equal(a[:6], b[:6]) and a[:6].float().abs().sum() > 0
    counts, tokens, decode = res.counter.snapshot()
    want, n, d = recount(ids, lengths, mx.EXPERTS)
    assert (tokens, decode) == (n, d) == (6, 2)
    for row in range(len(mx.LAYERS)):
        assert counts[row].tolist() == want
    assert counts[0, 0] == want[0] and sum(want) == 6 * mx.TOP_K  # padded rows not counted
