"""bench/humming_peer.py (the Humming peer of bench/peer_moe.py) on the CPU: the vLLM 0.33 names it cuts
out of the unpacked wheel exist there and run (the SiLU-with-clamp activation string Humming
compiles, the fused top-k reduction's torch-free launcher is importable), and its stand-in for
vLLM's CUDA ``moe_align_block_size`` gives the output vLLM's own docstring gives for its example.
No GPU and no Humming needed; skips where the unpacked wheel or Triton is absent."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VLLM = ROOT / ".cache/vllm-0.33.0/vllm"

pytestmark = [
    pytest.mark.skipif(not (VLLM / "model_executor/layers/fused_moe/moe_fused_mul_sum.py").exists(),
                       reason="needs the unpacked vLLM 0.33.0 wheel (.cache/vllm-0.33.0, made by the setup script)"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (the test extra)"),
]


def _module():
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "bench"))
    import humming_peer
    return humming_peer


def test_glue_names_come_from_the_wheel_and_the_activation_is_vllms() -> None:
    hp = _module()
    glue = hp.load_vllm_glue(VLLM)
    for name, where in glue.CITED.items():   # file:line really starts that name (or its decorator)
        rel, line = where.rsplit(":", 1)
        text = (VLLM / rel).read_text().splitlines()[int(line) - 1]
        assert text.startswith(("@", f"def {name}(", f"{name} =", f"{name}:")), (name, text)
    # SILU with DeepSeek-V4's clamp: vLLM's clamped-SiLU expression with limit 10, alpha 1, beta 0
    act = glue.get_humming_activation(glue.MoEActivation.SILU, glue.ApplyMoEActivationConfig(clamp_limit=10.0))
    assert act["activation_type"] == "binary_split"
    assert "fminf(a, (10.0f))" in act["activation_impl"] and "(up + (0.0f))" in act["activation_impl"]
    assert "expf(-(1.0f) * gate)" in act["activation_impl"]
    plain = glue.get_humming_activation(glue.MoEActivation.SILU, glue.ApplyMoEActivationConfig())
    assert plain["activation_impl"] == "(a / (1.f + expf(-a))) * b"
    assert glue.USE_UE8M0 is True and glue.current_platform.is_cuda_alike() is False


def test_align_stand_in_matches_vllms_documented_example() -> None:
    """``moe_align_block_size``'s docstring (fused_moe/moe_align_block_size.py): topk_ids
    [[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]] over experts 1..4 (here 0..3), block 4 ->
    sorted ids [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12] (12 = padding), 16 padded."""
    hp = _module()
    import torch

    ids = torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]]) - 1
    sorted_ids, expert_ids, padded = hp.align_block_size(ids, 4, 4)
    assert int(padded) == 16
    assert sorted_ids[:16].tolist() == [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12]
    assert (sorted_ids[16:] == 12).all()                       # vLLM's buffer: numel + E * (block - 1)
    assert sorted_ids.numel() == 12 + 4 * 3
    assert expert_ids[:4].tolist() == [0, 1, 2, 3]
    # fewer picks than experts: vLLM caps the buffer at numel * block; -1 picks are in no block
    ids = torch.tensor([[5, -1, 2]])
    sorted_ids, expert_ids, padded = hp.align_block_size(ids, 8, 16)
    assert sorted_ids.numel() == 3 * 8 and int(padded) == 16
    assert sorted(v for v in sorted_ids.tolist() if v < 3) == [0, 2]
    assert expert_ids[:2].tolist() == [2, 5]
