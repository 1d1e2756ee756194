"""The warp-MMA loops' shared-memory pipeline (``KernelConfig.t1_smem_stages``): values outside
2..4 (or 0) are refused naming the value, a stage count whose buffers exceed an SM90 program's
shared memory is refused naming the launch, ``describe`` names it; and compiled for sm_90 (no GPU
needed: Triton's own ptxas and cuobjdump) the loop really copies the weights asynchronously into
shared memory while the input row stays a plain load, in the shared memory
``warp_mma_shared_bytes`` says. The expected instruction counts follow from what one half-step
loads per thread: the input row's two ``[128, 4]`` word tensors (eight 4-byte loads) and, per
stream (gate and up), 16 weight bytes and one scale word (two copies). Whether the pipeline keeps
the bits is the GPU test ``tests/gpu/test_t1_warp_mma.py::test_shared_memory_pipeline_changes_no_bit``.

The T = 1 launches' register cap (``KernelConfig.t1_max_registers``), compiled the same way: both
launches within it, so two programs of two warpgroups (2 x 256 threads) share an SM's 65,536
registers, and w2's loop keeps every 128-bit weight load at least 10 MMAs ahead of the first use
of its registers (a trip has 64: 8 half-steps x 2 row reps x 4). Uncapped, ptxas took 100
registers for w2 and issued loads 4 MMAs ahead of their use (Triton 3.6 and 3.9); capped, 12-13
at the least. Whether the cap keeps the bits is
``tests/gpu/test_t1_warp_mma.py::test_register_cap_changes_no_bit``."""

from __future__ import annotations

import collections
import importlib.util
import re
import sys
from pathlib import Path

import pytest
from tiers import needs_gpu_experts

pytestmark = needs_gpu_experts

ROOT = Path(__file__).resolve().parent.parent
DSV41 = (5120, 2304)


@pytest.mark.parametrize("stages", [1, 5, -1])
def test_stage_count_outside_the_range_is_refused(stages: int) -> None:
    from expert_residency.gpu.experts import ExpertShape, KernelConfig, t1_warpgroups

    with pytest.raises(ValueError) as err:
        t1_warpgroups(ExpertShape(*DSV41), KernelConfig(t1_smem_stages=stages))
    assert f"t1_smem_stages {stages}" in str(err.value)


def test_buffers_beyond_a_programs_shared_memory_are_refused() -> None:
    from expert_residency.gpu.experts import MAX_SHARED_BYTES, ExpertShape, KernelConfig, t1_warpgroups

    shape = ExpertShape(*DSV41)
    # two warpgroups, two streams, 40 bytes per thread and half-step, stages - 1 buffers:
    # 3 stages of 8 half-steps -> 2 * 8 * 256 * 40 bytes fit, of 12 -> 2 * 12 * 256 * 40 do not
    assert 2 * 8 * 256 * 40 <= MAX_SHARED_BYTES < 2 * 12 * 256 * 40
    assert t1_warpgroups(shape, KernelConfig(t1_smem_stages=3, t1_unroll1=8, t1_unroll2=8)) == (2, 2)
    with pytest.raises(ValueError) as err:
        t1_warpgroups(shape, KernelConfig(t1_smem_stages=3, t1_unroll1=12))
    assert "t1_smem_stages 3 with t1_unroll 12 needs 245,760 bytes" in str(err.value)
    assert "w13 program" in str(err.value)


def test_describe_names_the_pipeline() -> None:
    from expert_residency.gpu.experts import KernelConfig

    assert "smem-stages3" in KernelConfig(t1_smem_stages=3).describe()
    assert "smem-stages" not in KernelConfig().describe()
    assert KernelConfig().t1_smem_stages == 0


def _nvidia_tools() -> bool:
    spec = importlib.util.find_spec("triton")
    return spec is not None and (Path(spec.origin).parent / "backends/nvidia/bin/cuobjdump").exists()


@pytest.fixture
def sass_tools():
    if not _nvidia_tools():
        pytest.skip("this Triton has no NVIDIA backend tools (ptxas, cuobjdump) to compile for sm_90")
    sys.path.insert(0, str(ROOT / "bench"))
    import kernel_sass
    import triton.language.target_info as target_info

    replaced = kernel_sass.use_target(90)
    yield kernel_sass
    target_info.current_target = replaced


def _loop_ops(kernel_sass, kernel) -> collections.Counter:
    body = kernel_sass.innermost_loop(kernel_sass.cuobjdump(kernel, "-sass"))
    return collections.Counter(re.match(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", t).group(1) for t in body)


def _w13(kernel_sass, stages: int, unroll: int, maxnreg: int | None = None):
    from expert_residency.gpu import kernels_t1

    h, i = DSV41
    return kernel_sass.compile_kernel(
        kernels_t1.w13_t1_kernel, kernel_sass.W13_T1_ARGS,
        dict(H=h, INTER=i, TOP_K=6, BK=128, KSPLIT=2, CHAINS=2, COUNT=True, SWIGLU_LIMIT=0.0, HAS_BIAS=False,
             ACT=0, ALPHA=1.0, HAS_TOKEN_MASK=False, PDL=False, UNROLL=unroll, BN1=64, SMEM_STAGES=stages),
        8, 1, maxnreg)


def _w2(kernel_sass, maxnreg: int | None):
    from expert_residency.gpu import kernels_t1

    h, i = DSV41
    return kernel_sass.compile_kernel(
        kernels_t1.w2_t1_kernel, kernel_sass.W2_T1_ARGS,
        dict(H=h, INTER=i, TOP_K=6, BN=128, BK=128, KSPLIT=2, CHAINS=2, HAS_TOKEN_MASK=False, HAS_BIAS=False,
             FUSE_FINALIZE=True, PDL=True, UNROLL=8, SMEM_STAGES=0), 8, 1, maxnreg)


@pytest.mark.parametrize("stages", [3, 4])
def test_compiled_loop_copies_the_weights_through_shared_memory(sass_tools, stages: int) -> None:
    from expert_residency.gpu.experts import warp_mma_shared_bytes

    unroll = 4
    ring = _loop_ops(sass_tools, _w13(sass_tools, 0, unroll))
    piped_kernel = _w13(sass_tools, stages, unroll)
    piped = _loop_ops(sass_tools, piped_kernel)
    x_loads, copies = 8 * unroll, 4 * unroll
    # the register ring: every load a plain global load, no copies
    assert ring["LDGSTS"] == 0 and ring["LDG"] == x_loads + copies
    # the pipeline: the weights and scales as asynchronous copies, the row still plain loads
    assert piped["LDGSTS"] == copies and piped["LDG"] == x_loads
    assert piped["HMMA"] == ring["HMMA"] == unroll * 2 * 4      # 2 streams x 4 MMAs per half-step
    assert piped_kernel.metadata.shared == warp_mma_shared_bytes(stages, unroll, 2, 2)


def _registers(kernel_sass, kernel) -> int:
    return int(re.search(r"REG:(\d+)", kernel_sass.cuobjdump(kernel, "-res-usage")).group(1))


def test_t1_register_cap_fits_two_programs_and_keeps_w2_loads_ahead(sass_tools) -> None:
    from expert_residency.gpu.experts import KernelConfig

    cap = KernelConfig.t1_max_registers
    assert cap * 2 * 256 <= 65536
    w13, w2 = _w13(sass_tools, 0, 8, maxnreg=cap), _w2(sass_tools, cap)
    assert _registers(sass_tools, w13) <= cap and _registers(sass_tools, w2) <= cap
    body = sass_tools.innermost_loop(sass_tools.cuobjdump(w2, "-sass"))
    distances = sass_tools.load_use_distances(body)
    assert len(distances) == 8 * 2                 # a trip: 8 half-steps x 2 row reps of 16-byte words
    assert sum("HMMA" in t for t in body) == 64
    assert min(distances) >= 10, distances
