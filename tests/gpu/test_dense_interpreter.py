"""The BF16 and FP8-block Triton split layers (``gpu.kernels_dense`` via ``gpu.dense_experts``)
under ``TRITON_INTERPRET=1`` on the CPU, plus their pure-Python checks.

Under the interpreter (fresh process, as ``test_layout_and_interpreter.py`` explains): split ==
unsplit bit for bit, after swaps too; the in-kernel counter == a recount (with a token mask);
within bf16 tolerance of the torch reference of the same format (``core.formats_ref``; the
interpreter truncates fp32 -> bf16 and has no true fma, hence 2e-2 rather than the GPU's ~1e-3).
The H200 checks of the compiled kernels are in ``tests/gpu/test_dense_gpu.py``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))
from interpreter_rerun import rerun_interpreted  # noqa: E402

needs_interpreter = [
    pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                       reason="needs Triton for TRITON_INTERPRET=1 (the H200 runs tests/gpu/test_dense_gpu.py)"),
    pytest.mark.skipif(torch.cuda.is_available(),
                       reason="a GPU is present: tests/gpu/test_dense_gpu.py checks the compiled kernels"),
]


def _rerun_interpreted(test_id: str) -> bool:
    """This file's test ``test_id`` in a fresh ``TRITON_INTERPRET=1`` process when needed
    (``interpreter_rerun``)."""
    return rerun_interpreted(__file__, test_id)


E, K, H, I, T = 6, 2, 256, 128, 5
HOT, COLD = [5, 1, 0, 3], [2, 4]


def dense_tensors(fmt: str, bias: bool, seed: int = 0, w13_scale: float = 1.0) -> dict:
    from expert_residency.fp8 import quantize_fp8_block

    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(E, 2 * I, H, generator=g) * (w13_scale / H ** 0.5)
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    if fmt == "bf16":
        out = {"w13_weight": w13.bfloat16(), "w2_weight": w2.bfloat16()}
    else:
        q13, s13 = quantize_fp8_block(w13)
        q2, s2 = quantize_fp8_block(w2)
        out = {"w13_weight": q13, "w13_weight_scale_inv": s13, "w2_weight": q2, "w2_weight_scale_inv": s2}
    if bias:
        out["w13_bias"] = (torch.randn(E, 2 * I, generator=g) * 0.5).bfloat16()
        out["w2_bias"] = (torch.randn(E, H, generator=g) * 0.2).bfloat16()
    return out


CASES = {  # name: (format, activation, biases, w13 scale: gpt-oss cases drive the 7.0 clamp)
    "bf16-silu": ("bf16", "silu", False, 1.0),
    "bf16-gptoss": ("bf16", "swigluoai", True, 8.0),
    "fp8-silu": ("fp8-block", "silu", False, 1.0),
    "fp8-swigluoai-bias": ("fp8-block", "swigluoai", True, 8.0),
    "bf16-gptoss-uninterleaved": ("bf16", "swigluoai_uninterleave", True, 8.0),
}


@needs_interpreter[0]
@needs_interpreter[1]
@pytest.mark.parametrize("case", sorted(CASES))
def test_dense_kernels_under_triton_interpreter(case: str) -> None:
    if _rerun_interpreted(f"test_dense_kernels_under_triton_interpreter[{case}]"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer
    from expert_residency.core.counter import ExpertCounter
    from expert_residency.core.formats_ref import float_per_pick, fp8_block_per_pick
    from expert_residency.core.split import residency_forward, split_invoke
    from expert_residency.core.swap import swap_experts
    from expert_residency.gpu.dense_experts import DenseKernelConfig, TritonDenseExperts
    from expert_residency.gpu.experts import ExpertShape

    fmt, act, bias, scale = CASES[case]
    original = dense_tensors(fmt, bias, seed=3, w13_scale=scale)
    torch.manual_seed(1)
    x = torch.randn(T, H).bfloat16()
    weights, ids = torch.topk(torch.softmax(torch.randn(T, E), -1), K)
    ids[0] = torch.tensor([2, 4])   # entirely cold
    ids[1] = torch.tensor([5, 2])   # straddling
    make_ref = float_per_pick if fmt == "bf16" else fp8_block_per_pick
    ref = residency_forward(build_unsplit_layer(original, layer_index=0), x, weights, ids,
                            make_ref(act), pick_dtype=torch.bfloat16)
    cfg = DenseKernelConfig(block_m=4, block_n1=32, block_k1=128, block_n2=64, block_k2=128)
    unsplit = build_unsplit_layer({n: v.clone() for n, v in original.items()}, layer_index=0)
    split = rehome_layer({n: v.clone() for n, v in original.items()}, HOT, COLD, layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    ex = TritonDenseExperts(ExpertShape(H, I), E, K, max_tokens=8, device="cpu", config=cfg,
                            expert_format=fmt, activation=act)
    counter = ExpertCounter([0], E)
    out_split = ex.forward(split, x, weights, ids, counter=counter).clone()
    out_unsplit = ex.forward(unsplit, x, weights, ids).clone()
    assert torch.equal(out_split, out_unsplit)
    assert torch.equal(counter.counts[0], torch.bincount(ids.flatten(), minlength=E))
    assert int(counter.tokens[0]) == T
    rel = ((out_split.float() - ref.float()).norm() / ref.float().norm()).item()
    assert rel < 2e-2, rel
    # The core's per-pick contract with these kernels (one bank per launch): the same pick rows
    # as the fused two-bank pass (the finalize differs here only because the interpreter has no fma).
    rows_core = split_invoke(split, x, ids, ex.per_pick_fn(), out_dtype=torch.bfloat16)
    assert torch.equal(rows_core, ex.pick_outputs(unsplit, x, ids))
    # Swaps move every tensor (scales, biases): still bit-identical.
    swap_experts(split, [(5, 2), (0, 4)])
    assert torch.equal(ex.forward(split, x, weights, ids), out_unsplit)
    # Padded tokens: neither computed nor counted.
    mask = torch.tensor([True, True, False, True, True])
    masked = ExpertCounter([0], E)
    ex.forward(split, x, weights, ids, counter=masked, token_mask=mask)
    assert torch.equal(masked.counts[0], torch.bincount(ids[mask].flatten(), minlength=E))
    assert int(masked.tokens[0]) == 4


@needs_interpreter[0]
@needs_interpreter[1]
@pytest.mark.parametrize("fmt", ["bf16", "fp8-block"])
def test_dense_above_the_fused_grouping_limit(fmt: str) -> None:
    """T = 257 at top-4 = 1,028 picks, above ``MAX_FUSED_PICKS`` (1,024): the grouping runs as
    torch ops and counts outside the kernel; split == unsplit bit for bit, the counter == a recount,
    within 2e-2 of the torch reference (FP8: the step's inputs quantized once, 1,028 activation rows)."""
    if _rerun_interpreted(f"test_dense_above_the_fused_grouping_limit[{fmt}]"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer
    from expert_residency.core.counter import ExpertCounter
    from expert_residency.core.formats_ref import float_per_pick, fp8_block_per_pick
    from expert_residency.core.split import residency_forward
    from expert_residency.gpu.dense_experts import DenseKernelConfig, TritonDenseExperts
    from expert_residency.gpu.experts import MAX_FUSED_PICKS, ExpertShape

    k, t = 4, 257
    assert t * k > MAX_FUSED_PICKS
    original = dense_tensors(fmt, True, seed=7)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(t, H, generator=g).bfloat16()
    weights, ids = torch.topk(torch.softmax(torch.randn(t, E, generator=g), -1), k)
    make_ref = float_per_pick if fmt == "bf16" else fp8_block_per_pick
    ref = residency_forward(build_unsplit_layer(original, layer_index=0), x, weights, ids, make_ref("silu"),
                            pick_dtype=torch.bfloat16)
    cfg = DenseKernelConfig(block_m=16, block_n1=64, block_k1=128, block_n2=128, block_k2=128)
    ex = TritonDenseExperts(ExpertShape(H, I), E, k, max_tokens=t, device="cpu", config=cfg, expert_format=fmt)
    unsplit = build_unsplit_layer({n: v.clone() for n, v in original.items()}, layer_index=0)
    split = rehome_layer({n: v.clone() for n, v in original.items()}, HOT, COLD, layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    counter = ExpertCounter([0], E)
    out_split = ex.forward(split, x, weights, ids, counter=counter).clone()
    assert torch.equal(out_split, ex.forward(unsplit, x, weights, ids))
    assert torch.equal(counter.counts[0], torch.bincount(ids.flatten(), minlength=E))
    assert int(counter.tokens[0]) == t
    rel = ((out_split.float() - ref.float()).norm() / ref.float().norm()).item()
    assert rel < 2e-2, rel


@needs_interpreter[0]
@needs_interpreter[1]
@pytest.mark.parametrize("fmt", ["bf16", "fp8-block"])
def test_dense_t1_schedule_and_fused_act_quant_keep_the_bits(fmt: str) -> None:
    """The T = 1 schedule (no grouping launch, the finalize inside the w2 launch) gives the same
    bits as the four-launch schedule, with a -1 pick (weight-zero contribution) and the counter
    counting only real picks; split == unsplit there too. FP8 with 128-row w13 tiles: quantizing
    the activation rows in the w13 epilogue gives the same bits as the separate launch, at T = 1
    and T = 5."""
    if _rerun_interpreted(f"test_dense_t1_schedule_and_fused_act_quant_keep_the_bits[{fmt}]"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    from dataclasses import replace

    from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer
    from expert_residency.core.counter import ExpertCounter
    from expert_residency.core.formats_ref import float_per_pick, fp8_block_per_pick
    from expert_residency.core.split import residency_forward
    from expert_residency.gpu.dense_experts import DenseKernelConfig, TritonDenseExperts
    from expert_residency.gpu.experts import ExpertShape

    original = dense_tensors(fmt, False, seed=5)
    unsplit = build_unsplit_layer({n: v.clone() for n, v in original.items()}, layer_index=0)
    split = rehome_layer({n: v.clone() for n, v in original.items()}, HOT, COLD, layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    base = DenseKernelConfig(block_m=4, block_n1=32, block_k1=128, block_n2=64, block_k2=128)
    four = replace(base, one_token=False, fuse_finalize=False, pdl=False, fuse_act_quant=False)

    def experts(cfg):
        return TritonDenseExperts(ExpertShape(H, I), E, K, max_tokens=8, device="cpu", config=cfg,
                                  expert_format=fmt)

    t1, grouped = experts(base), experts(four)
    assert t1._fuses_finalize(1) and not grouped._fuses_finalize(1)
    g = torch.Generator().manual_seed(4)
    make_ref = float_per_pick if fmt == "bf16" else fp8_block_per_pick
    for pair in ([5, 2], [2, 4], [3, -1]):   # straddling, entirely cold, one pick of another rank
        x = torch.randn(1, H, generator=g).bfloat16()
        ids = torch.tensor([pair])
        w = torch.softmax(torch.randn(1, K, generator=g), -1)
        counter = ExpertCounter([0], E)
        got = t1.forward(split, x, w, ids, counter=counter).clone()
        assert torch.equal(got, t1.forward(unsplit, x, w, ids))
        assert torch.equal(got, grouped.forward(unsplit, x, w, ids))
        real = ids[ids >= 0]
        assert torch.equal(counter.counts[0], torch.bincount(real, minlength=E))
        assert int(counter.tokens[0]) == 1
        ref_ids = ids.clamp(min=0)
        ref_w = torch.where(ids >= 0, w, torch.zeros_like(w))   # -1: weight zero
        ref = residency_forward(unsplit, x, ref_w, ref_ids, make_ref("silu"), pick_dtype=torch.bfloat16)
        rel = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
        assert rel < 2e-2, (pair, rel)
    if fmt == "fp8-block":
        fused, separate = experts(replace(base, block_n1=128)), experts(replace(base, block_n1=128,
                                                                              fuse_act_quant=False))
        for t in (1, 5):
            x = torch.randn(t, H, generator=g).bfloat16()
            w, ids = torch.topk(torch.softmax(torch.randn(t, E, generator=g), -1), K)
            got = fused.forward(split, x, w, ids).clone()
            assert torch.equal(got, separate.forward(split, x, w, ids))
            assert torch.equal(got, fused.forward(unsplit, x, w, ids))


def test_bank_validation_and_config_refusals() -> None:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("gpu.dense_experts imports triton")
    from expert_residency.core.banks import ExpertBank
    from expert_residency.gpu.dense_experts import DenseKernelConfig, TritonDenseExperts
    from expert_residency.gpu.experts import ExpertShape

    shape = ExpertShape(H, I)
    with pytest.raises(ValueError, match="block_k1 == block_k2 == 128"):
        TritonDenseExperts(shape, E, K, 4, "cpu", DenseKernelConfig(block_k1=64), expert_format="fp8-block")
    with pytest.raises(ValueError, match="not one of"):
        TritonDenseExperts(shape, E, K, 4, "cpu", expert_format="int4")
    with pytest.raises(ValueError, match="no swiglu_alpha"):
        TritonDenseExperts(shape, E, K, 4, "cpu", swiglu_alpha=1.702)
    ex = TritonDenseExperts(shape, E, K, 4, "cpu", expert_format="fp8-block", activation="swigluoai")
    assert (ex.limit, ex.alpha) == (7.0, 1.702)
    good = dense_tensors("fp8-block", bias=True)
    assert ex.check_bank(ExpertBank(good, E)) is True
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        ex.check_bank(ExpertBank(dense_tensors("bf16", bias=False) | {
            k: v for k, v in good.items() if "scale" in k}, E))
    with pytest.raises(ValueError, match="come together"):
        ex.check_bank(ExpertBank({k: v for k, v in good.items() if k != "w2_bias"}, E))
    bad = dict(good, w13_weight_scale_inv=good["w13_weight_scale_inv"][:, :1])
    with pytest.raises(ValueError, match="w13_weight_scale_inv: expected contiguous"):
        ex.check_bank(ExpertBank(bad, E))


def test_bytes_per_expert_by_hand() -> None:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("gpu.dense_experts imports triton")
    from expert_residency.gpu.dense_experts import dense_bytes_per_expert
    from expert_residency.gpu.experts import ExpertShape

    # Qwen3-30B-A3B expert: H 2048, I 768 -> bf16 2 * 3 * 2048 * 768 = 9,437,184 B.
    assert dense_bytes_per_expert(ExpertShape(2048, 768), "bf16") == 9_437_184
    # DeepSeek-V3 expert: H 7168, I 2048 -> 3 * 7168 * 2048 = 44,040,192 B of E4M3, plus
    # (4096/128)*(7168/128) + (7168/128)*(2048/128) = 32*56 + 56*16 = 2688 blocks * 4 B.
    assert dense_bytes_per_expert(ExpertShape(7168, 2048), "fp8-block") == 44_040_192 + 10_752
    # gpt-oss-120b in BF16 with bf16 biases: H 2880, I 2880: 2*3*2880^2 + 2*(5760 + 2880).
    assert dense_bytes_per_expert(ExpertShape(2880, 2880), "bf16", bias_bytes=2) == 49_766_400 + 17_280
