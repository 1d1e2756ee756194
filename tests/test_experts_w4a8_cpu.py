"""``gpu.experts_w4a8`` off the GPU: what it refuses, and where its FP8 scratch lives.

* ``w4a8_refusal`` names why a geometry, activation or device cannot run the FP8-activation
  kernels (and says nothing for DeepSeek-V4.1 on a compute capability 9.0 device);
* the scratch views (w2 input, its scales, the layer input, its scales) lie inside the workspace's
  bf16 activation buffer without overlapping, and a geometry whose views would not fit is refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="the kernel module imports Triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from expert_residency.gpu import experts_w4a8 as ew  # noqa: E402
from expert_residency.gpu.experts import ExpertShape  # noqa: E402

DSV41 = ExpertShape(hidden=5120, intermediate=2304)


def test_refusals_name_the_reason(monkeypatch):
    assert "SiLU-GLU" in ew.w4a8_refusal(DSV41, "cpu", activation="swigluoai")
    assert "divisible by 128, got 2880 and 2880" in ew.w4a8_refusal(ExpertShape(2880, 2880), "cpu")
    assert "compute capability 9.0" in ew.w4a8_refusal(DSV41, "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "compute capability 9.0" in ew.w4a8_refusal(DSV41, "cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert ew.w4a8_refusal(DSV41, "cuda") is None
    with pytest.raises(ValueError, match="compute capability 9.0"):
        ew.TritonW4a8Experts(DSV41, 8, 6, max_tokens=4, device="cpu")


@pytest.mark.parametrize("tokens,top_k", [(1, 6), (96, 6), (7, 8)])
def test_scratch_views_fit_the_activation_buffer_without_overlap(tokens: int, top_k: int):
    act = torch.zeros(tokens * top_k, DSV41.intermediate, dtype=torch.bfloat16)
    sc = ew._Fp8Scratch(act, tokens, top_k, DSV41)
    lo, hi = act.data_ptr(), act.data_ptr() + act.numel() * act.element_size()
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
                   for t in (sc.aq, sc.as_, sc.xq, sc.xs))
    assert all(lo <= a < b <= hi for a, b in spans)
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
    picks = tokens * top_k
    assert sc.aq.shape == (picks, 2304) and sc.as_.shape == (picks, 18)
    assert sc.xq.shape == (tokens, 5120) and sc.xs.shape == (tokens, 40)


def test_a_geometry_whose_scratch_does_not_fit_is_refused():
    shape = ExpertShape(hidden=8192, intermediate=256)     # top-1 x 256 cannot hold an 8,192 row
    act = torch.zeros(4, shape.intermediate, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cannot hold the FP8 activations"):
        ew._Fp8Scratch(act, 4, 1, shape)
