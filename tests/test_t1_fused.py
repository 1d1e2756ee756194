"""The one-launch T = 1 layer (``KernelConfig.t1_fused``, off by default: 1.10-1.12x slower than the separate
launches on an H100, BENCHMARKS.md run OL).

Claims and how each can fail:
* ``tile_rules.t1_fused_programs``: as many programs as the GPU holds at once under the register
  cap — an H200 / H100 (132 SMs, 65,536 registers and 2,048 threads per SM) holds two programs
  of two warpgroups (256 threads x 128 registers = 32,768) per SM, four of one warpgroup, 264 /
  528 in all — and no more than the items; figures it cannot use are refused;
* the config refuses ``t1_fused`` without a register cap (the count would not hold) and
  ``describe`` names it;
* compiled for sm_90 (Triton's own ptxas and cuobjdump, no GPU): within the cap, and the
  hand-off is what the kernel's docstring says — a GPU-scope release add per w13 tile; a wait
  that polls with volatile loads and sleeps, then takes one acquire load; the finalize's acq_rel
  ticket.
Whether it keeps the separate launches' bits is the GPU test
``tests/gpu/test_t1_warp_mma.py::test_one_launch_gives_the_separate_launches_bits``."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from tiers import needs_gpu_experts

pytestmark = needs_gpu_experts
ROOT = Path(__file__).resolve().parent.parent


def test_programs_fill_the_gpu_once() -> None:
    from expert_residency.gpu.tile_rules import t1_fused_programs

    assert t1_fused_programs(132, 65536, 2048, 128, 2, 10_000) == 264
    assert t1_fused_programs(132, 65536, 2048, 128, 1, 10_000) == 528
    assert t1_fused_programs(132, 65536, 2048, 128, 2, 240) == 240          # DeepSeek-V4.1: 6 x 40 w2 items
    assert t1_fused_programs(132, 65536, 2048, 96, 2, 10_000) == 264        # 65,536 // 24,576 = 2
    assert t1_fused_programs(132, 65536, 2048, 64, 2, 10_000) == 4 * 132    # 65,536 // 16,384
    assert t1_fused_programs(132, 65536, 512, 64, 2, 10_000) == 2 * 132     # threads: 512 // 256


@pytest.mark.parametrize("args", [(132, 65536, 2048, 0, 2, 240), (0, 65536, 2048, 128, 2, 240),
                                  (132, 65536, 2048, 255, 4, 240)])
def test_figures_it_cannot_use_are_refused(args: tuple) -> None:
    from expert_residency.gpu.tile_rules import t1_fused_programs

    with pytest.raises(ValueError, match="t1_fused_programs"):
        t1_fused_programs(*args)


def test_config() -> None:
    from expert_residency.gpu.experts import KernelConfig

    assert KernelConfig().t1_fused is False
    with pytest.raises(ValueError, match="t1_fused needs t1_max_registers"):
        KernelConfig(t1_fused=True, t1_max_registers=0)
    assert "one-launch" in KernelConfig(t1_fused=True).describe()
    assert "one-launch" not in KernelConfig().describe()


FUSED_ARGS = [("x_ptr", "*bf16"), ("codes_ptr", "*i32"), ("hot13_w_ptr", "*u8"), ("hot13_s_ptr", "*u8"),
              ("cold13_w_ptr", "*u8"), ("cold13_s_ptr", "*u8"), ("hot2_w_ptr", "*u8"), ("hot2_s_ptr", "*u8"),
              ("cold2_w_ptr", "*u8"), ("cold2_s_ptr", "*u8"), ("act_ptr", "*bf16"), ("y_ptr", "*bf16"),
              ("counts_ptr", "*i64"), ("tokens_ptr", "*i64"), ("w13_expert_stride", "i64"),
              ("s13_expert_stride", "i64"), ("w2_expert_stride", "i64"), ("s2_expert_stride", "i64"),
              ("ids_ptr", "*i64"), ("token_mask_ptr", "*i32"), ("E", "i32"), ("hot13_b_ptr", "*fp32"),
              ("cold13_b_ptr", "*fp32"), ("b13_expert_stride", "i64"), ("hot2_b_ptr", "*fp32"),
              ("cold2_b_ptr", "*fp32"), ("b2_expert_stride", "i64"), ("weights_ptr", "*fp32"), ("out_ptr", "*bf16"),
              ("fin_ticket_ptr", "*i32"), ("ready_ptr", "*i32"), ("seen_ptr", "*i32")]


def test_compiled_hand_off(monkeypatch) -> None:
    spec = importlib.util.find_spec("triton")
    if spec is None or not (Path(spec.origin).parent / "backends/nvidia/bin/cuobjdump").exists():
        pytest.skip("this Triton has no NVIDIA backend tools (ptxas, cuobjdump) to compile for sm_90")
    sys.path.insert(0, str(ROOT / "bench"))
    import kernel_sass
    import triton.language.target_info as target_info
    from expert_residency.gpu import kernels_t1
    from expert_residency.gpu.experts import KernelConfig

    monkeypatch.setattr(target_info, "current_target", target_info.current_target)   # restored after the test
    kernel_sass.use_target(90)
    cap = KernelConfig.t1_max_registers
    kernel = kernel_sass.compile_kernel(
        kernels_t1.t1_fused_kernel, FUSED_ARGS,
        dict(H=5120, INTER=2304, TOP_K=6, BK1=128, BN2=128, BK2=128, KSPLIT=2, CHAINS1=2, CHAINS2=2, COUNT=True,
             HAS_TOKEN_MASK=False, SWIGLU_LIMIT=10.0, HAS_BIAS=False, ACT=0, ALPHA=1.0, PDL=True, UNROLL1=8,
             UNROLL2=8, BN1=64), 8, 1, cap)
    assert int(re.search(r"REG:(\d+)", kernel_sass.cuobjdump(kernel, "-res-usage")).group(1)) <= cap
    ptx = kernel.asm["ptx"]
    # a w13 tile stored (an atom, or a red where the old value goes unused: Triton 3.9)
    assert len(re.findall(r"(?:atom|red)\.global\.gpu\.release\.add\.u32", ptx)) == 1
    assert len(re.findall(r"ld\.global\.gpu\.acquire\.b32", ptx)) == 1             # the wait's one acquire,
    assert "ld.volatile.global.b32" in ptx and "nanosleep.u32" in ptx               # after its polls
    assert len(re.findall(r"atom\.global\.gpu\.acq_rel\.add\.u32", ptx)) == 1      # the finalize's ticket
