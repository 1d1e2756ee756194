"""A router id of -1 (another rank's expert under expert parallelism, or an unrouted pick) through
the Triton split layers under ``TRITON_INTERPRET=1``, with the **last expert filled with NaN**:
a kernel that looked ``-1`` up as ``codes[-1]`` (or read the row map one element before it, or
took the stale workspace row) turns the token into NaN or garbage.

Layers and schedules: ``TritonMxfp4Experts`` (MXFP4; NaN biases on the last expert, since E2M1
codes have no NaN and the layout refuses scales that overflow) at T = 1 (the ungrouped schedule,
fused finalize and separate), T = 3 (small grouped steps) and T = 9 (large grouped steps, past
``small_tokens``), and through the core's per-pick contract (``per_pick_fn`` + ``core.split``);
``TritonDenseExperts`` in BF16 and FP8-block (NaN weights, FP8 block scales NaN too) at T = 1 and
T = 5. For each: split (last expert in the pinned cold bank) == unsplit bit for bit, and the output
== the same launch with every -1 replaced by expert 0 at router weight 0, bit for bit (a -1 pick
adds ``fma(0, 0, acc)``, a weight-0 pick of a finite expert adds ``0 * y`` = a signed zero: the
same sums). A token that routes the last expert for real comes out NaN (the poison is live).
The compiled kernels get the same checks on the H200 (``tests/gpu/test_gpu_residency.py``,
``test_t1_warp_mma.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))
from interpreter_rerun import interpreter_only_marks, rerun_interpreted  # noqa: E402

NAN = float("nan")
E, H, I = 6, 256, 128
LAST = E - 1
HOT, COLD = [0, 3, 1, 4], [5, 2]            # the last expert lives in the cold bank

pytestmark = interpreter_only_marks("tests/gpu/test_gpu_residency.py", "tests/gpu/test_t1_warp_mma.py")

# top-3 routing per T: -1 in every position somewhere, a token whose every pick is -1
STEPS = {
    1: [[2, -1, 4]],
    3: [[-1, 0, 3], [1, 2, -1], [-1, -1, -1]],
    5: [[4, -1, 0], [-1, 3, 2], [1, 0, -1], [2, 4, 1], [-1, -1, 3]],
    9: [[4, -1, 0], [-1, 3, 2], [1, 0, -1], [2, 4, 1], [-1, -1, 3], [0, 1, 2], [3, -1, 4], [-1, 2, 0],
        [1, 4, -1]],
}


def _run_interpreted(test_id: str) -> bool:
    return rerun_interpreted(__file__, test_id)


def _weights(t: int, k: int, seed: int) -> torch.Tensor:
    return torch.rand(t, k, generator=torch.Generator().manual_seed(seed)) + 0.1


def _check(forward, split, unsplit, t: int, k: int, hidden: int, seed: int, live: bool = True) -> int:
    """The claims above for one step of ``t`` tokens (``live``: also that the poison is live);
    returns 1."""
    x = torch.randn(t, hidden, generator=torch.Generator().manual_seed(seed)).bfloat16()
    ids = torch.tensor(STEPS[t])
    w = _weights(t, k, seed)
    skipped = ids < 0
    got = forward(split, x, w, ids)
    assert torch.equal(got, forward(unsplit, x, w, ids)), f"T={t}: split != unsplit"
    want = forward(unsplit, x, torch.where(skipped, torch.zeros_like(w), w),
                   torch.where(skipped, torch.zeros_like(ids), ids))
    assert torch.isfinite(want.float()).all()
    assert torch.equal(got, want), f"T={t}: a -1 pick added something other than fma(0, 0, acc)"
    if live:
        real = ids.clone()
        real[0, 0] = LAST
        assert torch.isnan(forward(split, x, w, real)[0].float()).all(), "the NaN poison is not live"
    return 1


def test_mxfp4_kernels_never_read_the_last_expert_for_minus_one() -> None:
    if _run_interpreted("test_mxfp4_kernels_never_read_the_last_expert_for_minus_one"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer
    from expert_residency.core.split import residency_forward
    from expert_residency.gpu import experts as gx
    from expert_residency.mxfp4 import quantize_mxfp4

    g = torch.Generator().manual_seed(4)
    p13, s13 = quantize_mxfp4(torch.randn(E, 2 * I, H, generator=g) * 0.05)
    p2, s2 = quantize_mxfp4(torch.randn(E, H, I, generator=g) * 0.05)
    b13, b2 = torch.randn(E, 2 * I, generator=g) * 0.1, torch.randn(E, H, generator=g) * 0.1
    b13[LAST], b2[LAST] = NAN, NAN
    full = {"w13_weight": p13, "w13_weight_scale": s13, "w2_weight": p2, "w2_weight_scale": s2,
            "w13_bias": b13, "w2_bias": b2}
    base = dict(block_m=4, block_n1=64, block_k1=128, block_n2=64, block_k2=64)
    configs = {"fused": gx.KernelConfig(**base), "separate": gx.KernelConfig(**base, fuse_finalize=False)}
    gx.to_kernel_layout(full, configs["fused"])
    unsplit = build_unsplit_layer({n: v.clone() for n, v in full.items()}, layer_index=0)
    split = rehome_layer(dict(full), HOT, COLD, layer_index=0, hot_alloc=device_allocator("cpu"),
                         cold_alloc=host_allocator())
    checked = 0
    for name, cfg in configs.items():
        ex = gx.TritonMxfp4Experts(gx.ExpertShape(H, I), E, 3, max_tokens=9, device="cpu", config=cfg)
        assert ex.config.small_step_limit() < 9   # T = 9 takes the large grouped schedule

        def forward(layer, x, w, ids, ex=ex):
            ex.workspace.pick_out.fill_(NAN)          # stale rows the finalize must not read
            return ex.forward(layer, x, w, ids, out=torch.empty(ids.shape[0], H, dtype=torch.float32)).clone()

        for t in (1, 3, 9):
            checked += _check(forward, split, unsplit, t, 3, H, seed=10 * t, live=name == "fused")
        if name == "fused":   # the core's per-pick contract on these kernels, one bank per launch

            def via_core(layer, x, w, ids, ex=ex):
                return residency_forward(layer, x, w, ids, ex.per_pick_fn(), pick_dtype=torch.bfloat16,
                                         out_dtype=torch.float32)

            checked += _check(via_core, split, unsplit, 3, 3, H, seed=77, live=False)
    assert checked == 7


@pytest.mark.parametrize("fmt", ["bf16", "fp8-block"])
def test_dense_kernels_never_read_the_last_expert_for_minus_one(fmt: str) -> None:
    if _run_interpreted(f"test_dense_kernels_never_read_the_last_expert_for_minus_one[{fmt}]"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer
    from expert_residency.fp8 import quantize_fp8_block
    from expert_residency.gpu.dense_experts import DenseKernelConfig, TritonDenseExperts
    from expert_residency.gpu.experts import ExpertShape

    g = torch.Generator().manual_seed(3)
    w13 = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    if fmt == "bf16":
        full = {"w13_weight": w13.bfloat16(), "w2_weight": w2.bfloat16()}
        full["w13_weight"][LAST] = NAN
        full["w2_weight"][LAST] = NAN
    else:
        q13, s13 = quantize_fp8_block(w13)
        q2, s2 = quantize_fp8_block(w2)
        full = {"w13_weight": q13, "w13_weight_scale_inv": s13, "w2_weight": q2, "w2_weight_scale_inv": s2}
        for name in ("w13_weight", "w2_weight"):   # E4M3's NaN, and NaN block scales
            full[name].view(torch.uint8)[LAST] = 0x7F
            full[name + "_scale_inv"][LAST] = NAN
    cfg = DenseKernelConfig(block_m=4, block_n1=32, block_k1=128, block_n2=64, block_k2=128)
    unsplit = build_unsplit_layer({n: v.clone() for n, v in full.items()}, layer_index=0)
    split = rehome_layer({n: v.clone() for n, v in full.items()}, HOT, COLD, layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    ex = TritonDenseExperts(ExpertShape(H, I), E, 3, max_tokens=8, device="cpu", config=cfg, expert_format=fmt)

    def forward(layer, x, w, ids):
        ex.workspace.pick_out.fill_(NAN)
        return ex.forward(layer, x, w, ids, out=torch.empty(ids.shape[0], H, dtype=torch.float32)).clone()

    assert sum(_check(forward, split, unsplit, t, 3, H, seed=5 * t) for t in (1, 5)) == 2
