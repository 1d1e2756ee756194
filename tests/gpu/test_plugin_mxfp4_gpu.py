"""The vLLM plugin's MXFP4 residency adapter on a CUDA GPU (the H200 device), without vLLM: the same
stand-in layers (vLLM 0.33 ``Mxfp4MoEMethod`` parameter names/shapes/dtypes, checkpoint layout)
and the same worker-runtime code as tests/test_vllm_plugin_mxfp4.py, here with the runtime's
Triton MXFP4 kernels and the cold bank in pinned host memory read in place.

Run there with ``PYTHONPATH=runtime python3 -m pytest tests/gpu/test_plugin_mxfp4_gpu.py -q``.

Claims, each able to fail:
* residency (two maps) == unsplit bit for bit (``torch.equal``) through ``WorkerRuntime``;
* the same with a SwiGLU clamp (``swiglu_limit``) against the clamped reference;
* both within relative L2 1e-2 of the dequantize-then-matmul reference (fp32 summation order and
  tensor-core accumulation differ from the CPU reference);
* banks hold the Triton kernels' tile-major layout of exactly the checkpoint rows of their experts
  (undoing the layout gives the original rows back), the hot bank in device memory and the cold
  bank a device view of a pinned host region.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU: run them on a GPU machine (BENCHMARKS.md gives the H200 commands)",
                allow_module_level=True)
pytest.importorskip("triton", reason="needs Triton (the H200 image has triton 3.6)")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "tests"))

import test_vllm_plugin_mxfp4 as cpu_case  # noqa: E402
from expert_residency.gpu.experts import KernelConfig  # noqa: E402
from expert_residency.gpu.layout import from_kernel_layout  # noqa: E402
from expert_residency.gpu.pinned import PinnedRegion  # noqa: E402
from expert_residency.mxfp4 import quantize_mxfp4  # noqa: E402


def test_residency_equals_unsplit_with_triton_kernels() -> None:
    result = cpu_case.run_modes("cuda")
    cpu_case.check_modes(result, rel_tol=1e-2)
    runtime, _ = result["runtimes"]["residency-a"]
    assert runtime.per_pick_name.startswith("expert_residency Triton MXFP4")


def test_residency_with_swiglu_clamp_equals_unsplit_with_triton_kernels() -> None:
    """The same with the layers' ``swiglu_limit`` (DeepSeek-V4/V4.1): the plugin passes it to the
    Triton kernel; split == unsplit bit for bit, within 1e-2 of the clamped reference."""
    result = cpu_case.run_modes("cuda", swiglu_limit=cpu_case.CLAMP)
    cpu_case.check_modes(result, rel_tol=1e-2)
    cpu_case.clamp_bites(result["case"])
    runtime, _ = result["runtimes"]["residency-a"]
    assert runtime.per_pick_name.startswith("expert_residency Triton MXFP4")
    assert runtime.per_pick_name.endswith("swiglu_limit=1.5)")


def test_banks_hold_the_kernel_layout_of_their_experts_hot_in_hbm_cold_pinned() -> None:
    case = cpu_case.build_case("cuda")
    hot_ids = [0, 3, 5]
    _, layers = cpu_case.runtime_for(case, "residency", hot_ids)
    resident = layers[0]._er_resident
    cold_ids = [e for e in range(cpu_case.EXPERTS) if e not in hot_ids]
    assert resident.cold_ids == cold_ids
    w13, w2 = case.weights[0]
    q13, s13 = quantize_mxfp4(w13)
    q2, s2 = quantize_mxfp4(w2)
    original = {"w13_weight": q13, "w13_weight_scale": s13, "w2_weight": q2, "w2_weight_scale": s2}
    for bank, ids in ((resident.hot, hot_ids), (resident.cold, cold_ids)):
        rows = {name: t.clone() for name, t in bank.tensors.items()}
        assert all(t.is_cuda for t in bank.tensors.values())
        from_kernel_layout(rows, KernelConfig())
        for name, t in rows.items():
            expected = original[name][ids]
            assert torch.equal(t.cpu(), expected), f"{name}: bank rows != checkpoint rows"
        for name in ("w13_weight", "w13_weight_scale"):  # several tiles per row: layout differs
            assert not torch.equal(bank.tensors[name].cpu(), original[name][ids]), \
                f"{name}: bank is not in the kernels' tile-major layout"
    assert resident.cold.owners and all(isinstance(o, PinnedRegion) for o in resident.cold.owners)
    assert not resident.hot.owners  # plain device allocations


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-rs", "-s"] + sys.argv[1:]))
