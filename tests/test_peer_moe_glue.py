"""bench/peer_moe.py loads vLLM 0.33's own MXFP4 glue from the unpacked wheel by name: pin that the
functions it cuts out exist there, keep their ``@triton.jit`` decorators, and import against the
wheel's vendored ``triton_kernels`` (no GPU needed; skips where the unpacked wheel or Triton is
absent)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VLLM = ROOT / ".cache/vllm-0.33.0/vllm"

pytestmark = [
    pytest.mark.skipif(not (VLLM / "third_party/triton_kernels/matmul_ogs.py").exists(),
                       reason="needs the unpacked vLLM 0.33.0 wheel (.cache/vllm-0.33.0, made by the setup script)"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (the test extra)"),
]


def test_glue_functions_come_from_the_wheel_with_their_decorators() -> None:
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "bench"))
    import peer_moe

    glue = peer_moe.load_vllm_glue(VLLM, VLLM / "third_party")
    import triton

    # decorator kept: a Triton kernel object (JITFunction, or InterpretedFunction when an earlier
    # test of this process switched on TRITON_INTERPRET), not the bare function
    assert isinstance(glue.pack_bitmatrix, triton.runtime.jit.KernelInterface)
    for name in ("make_routing_data", "triton_kernel_fused_experts", "_swizzle_mxfp4",
                 "_patch_legacy_routing_for_nonpow2_topk"):
        assert callable(getattr(glue, name))
    # Each citation is file:line of a line that really starts that function (or its decorator).
    for name, where in glue.CITED.items():
        rel, line = where.rsplit(":", 1)
        text = (VLLM / rel).read_text().splitlines()[int(line) - 1]
        assert text.startswith("@") or text.startswith(f"def {name}("), (name, text)
    # The vendored copy is the 3.5.1-generation API the glue is stubbed for (no SparseMatrix).
    import triton_kernels.tensor as tkt

    assert not hasattr(tkt, "SparseMatrix")
    assert torch is not None


@pytest.mark.skipif(importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None,
                    reason="bench/peer_moe.py imports torch and Triton (the test extra)")
def test_compare_refuses_a_variant_with_another_layout():
    """A --compare variant times the default's layers, so one that changes the banks' layout (tile
    shapes, dequant, tile_major) is refused before anything is built, naming the field; this once let
    block_n1=128 variants be timed on 64-row tiles (their outputs 1.40 relative L2 off, H200 2026-12-03)."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, str(root / "bench" / "peer_moe.py"), "--compare", "ok:num_stages_large=4;n128:block_n1=128"],
                         capture_output=True, text=True, timeout=300, cwd=root)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "--compare n128: block_n1 change how the banks are laid out" in run.stderr
