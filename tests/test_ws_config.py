"""The warp-specialized grouped launches' settings (``KernelConfig.ws_*``, ``gpu.kernels_ws``) without
a GPU: refusals name the value, where they may run, the launch constants, and the variants the
runtime launches compile for sm_90 with the installed Triton (tests/test_ws_probe_sass.py counts the
probe's SASS; whether they compute the tl.dot launches' bits is tests/gpu/test_ws_grouped_gpu.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from tiers import needs_gpu_experts

pytestmark = needs_gpu_experts

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("field,value,words", [("ws_min_tokens", 0, "not a token count of 1 or more"),
                                               ("ws_programs_per_sm", -1, "at least one program per SM"),
                                               ("ws_cold_programs", -1, "not a count of programs")])
def test_settings_out_of_range_are_refused_naming_the_value(field: str, value: int, words: str) -> None:
    from expert_residency.gpu.experts import KernelConfig

    with pytest.raises(ValueError) as err:
        KernelConfig(**{field: value})
    assert f"{field} {value}" in str(err.value) and words in str(err.value)


def test_they_run_only_on_hopper_with_the_default_tiles() -> None:
    import torch
    from expert_residency.gpu.experts import KernelConfig, runs_warp_specialized

    assert not runs_warp_specialized(torch.device("cpu"), KernelConfig())
    # the default takes its programs per SM from the GPU: 2 or 4
    assert "warp-specialized-grouped@>=2(sm9x)x2|4/SM(cold-programs8)" in KernelConfig().describe()
    assert "(sm9x)x3/SM" in KernelConfig(ws_programs_per_sm=3).describe()
    assert "warp-specialized" not in KernelConfig(ws_grouped=False).describe()


def test_launch_constants_follow_the_gemm() -> None:
    from expert_residency.gpu import kernels_ws

    w13 = kernels_ws.gemm_constants("w13", 5120, 2304, 6, swiglu_limit=10.0, count=True, cold_programs=8,
                                    max_slots=384)
    w2 = kernels_ws.gemm_constants("w2", 5120, 2304, 6, count=True, cold_programs=8, max_slots=384)
    assert (w13["K"], w13["ROWS_OUT"], w13["ROW_DIV"], w13["BN"], w13["GATED"], w13["COUNT"]) == (5120, 2304, 6, 64,
                                                                                                   True, True)
    # w2 reads the w2 input by pick and never counts (the w13 launch counts each slot once)
    assert (w2["K"], w2["ROWS_OUT"], w2["ROW_DIV"], w2["BN"], w2["GATED"], w2["COUNT"]) == (2304, 5120, 1, 128,
                                                                                             False, False)
    # bisection over up to 384 slots: 384 < 2**9
    assert w13["SEARCH_STEPS"] == w2["SEARCH_STEPS"] == 9 and w13["COLD_PROGRAMS"] == 8


def test_programs_per_sm_set_the_register_cap_that_lets_them_share_the_register_file() -> None:
    from expert_residency.gpu.tile_rules import ws_max_registers

    # 256 threads per program (compute warpgroup + loader warpgroup), 65,536 registers per SM, a
    # multiple of 8: 2 x 256 x 128, 3 x 256 x 80 (85 rounded down), 4 x 256 x 64 fill the file.
    assert [ws_max_registers(n) for n in (1, 2, 3, 4)] == [128, 128, 80, 64]
    for n in (2, 3, 4):
        assert n * 256 * ws_max_registers(n) <= 65536 < n * 256 * (ws_max_registers(n) + 8)


@pytest.mark.parametrize("value", [-1, 0, 5])
def test_programs_per_sm_outside_what_an_sm_holds_are_refused(value: int) -> None:
    from expert_residency.gpu.experts import KernelConfig
    from expert_residency.gpu.tile_rules import ws_max_registers

    refusals = [lambda: ws_max_registers(value)]
    if value:   # the config's 0 is "by the GPU", a count the launches resolve before the cap
        refusals.append(lambda: KernelConfig(ws_programs_per_sm=value))
    for refuse in refusals:
        with pytest.raises(ValueError) as err:
            refuse()
        assert f"ws_programs_per_sm {value}" in str(err.value)


# What CUDA reported on the H100 and the H200 the runtime was measured on (BENCHMARKS.md, run SH
# calls 5 and 6): 2,619 MHz over 5,120 bits (3.35 TB/s, the H100 SXM datasheet's figure) and
# 3,201 MHz over 6,016 bits (4.81 TB/s; the H200 datasheet says 4.8), both 132 SMs; and an H100
# PCIe as its datasheet describes it (2.0 TB/s over 5,120 bits, 114 SMs).
H100_SXM = dict(memory_clock_khz=2_619_000, bus_width_bits=5120, sms=132)     # 3.35 TB/s
H200_SXM = dict(memory_clock_khz=3_201_000, bus_width_bits=6016, sms=132)     # 4.81 TB/s
H100_PCIE = dict(memory_clock_khz=1_562_500, bus_width_bits=5120, sms=114)    # 2.0 TB/s


@pytest.mark.parametrize("gpu,programs", [(H100_SXM, 2), (H200_SXM, 4), (H100_PCIE, 2)])
def test_programs_per_sm_follow_the_memory_bandwidth_per_sm(gpu: dict, programs: int) -> None:
    from expert_residency.gpu.tile_rules import peak_memory_bytes_per_s, ws_programs_for

    peak = peak_memory_bytes_per_s(gpu["memory_clock_khz"], gpu["bus_width_bits"])
    # double data rate over the bus, in bytes: clock (Hz) x 2 x bits / 8
    assert peak == gpu["memory_clock_khz"] * 1000 * 2 * gpu["bus_width_bits"] // 8
    assert ws_programs_for(peak, gpu["sms"]) == programs


def test_programs_per_sm_without_the_memory_figures_stay_two_and_no_sms_is_refused() -> None:
    from expert_residency.gpu.tile_rules import ws_programs_for

    assert ws_programs_for(0.0, 132) == 2
    # the threshold itself: 30 GB/s per SM is two, just above it four
    assert ws_programs_for(132 * 30e9, 132) == 2 and ws_programs_for(132 * 30.1e9, 132) == 4
    with pytest.raises(ValueError, match="sms 0"):
        ws_programs_for(4.8e12, 0)


@pytest.mark.parametrize("which", ["w13", "w2"])
def test_the_variants_the_runtime_launches_compile_for_sm90(which: str) -> None:
    spec = importlib.util.find_spec("triton")
    if not (Path(spec.origin).parent / "backends/nvidia/bin/cuobjdump").exists():
        pytest.skip("this Triton has no NVIDIA backend tools (ptxas, cuobjdump) to compile for sm_90")
    sys.path.insert(0, str(ROOT / "bench"))
    import kernel_sass
    import triton
    import triton.language.target_info as target_info
    from expert_residency.gpu import kernels_ws
    from expert_residency.gpu.tile_rules import ws_max_registers
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    replaced = kernel_sass.use_target(90)
    try:
        # two programs per SM (the default) at both cold splits, four (the tightest cap) without one;
        # the item-ahead reads on and off
        for cold, programs, prefetch in ((0, 2, False), (8, 2, True), (0, 4, True)):
            const = kernels_ws.gemm_constants(which, 5120, 2304, 6, swiglu_limit=10.0, count=which == "w13",
                                              cold_programs=cold, max_slots=384, prefetch=prefetch)
            sig = dict(kernels_ws.WS_ARGS)
            sig.update({k: "constexpr" for k in const})
            attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(kernels_ws.WS_ARGS))}
            src = GluonASTSource(fn=kernels_ws.KERNELS[which], signature=sig, constexprs=const, attrs=attrs)
            kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                    options=dict(num_warps=4, maxnreg=ws_max_registers(programs)))
            sass = kernel_sass.cuobjdump(kernel, "-sass")
            assert "HMMA" in sass and "LDGSTS" in sass and "SYNCS" in sass   # MMAs, cp.async, mbarriers
            # the counter's atomics only where it counts (the w13 launch)
            assert ("RED" in sass or "ATOM" in sass) == (which == "w13")
            assert not any(op in sass for op in ("LDL", "STL"))   # no spills
    finally:
        target_info.current_target = replaced


def test_split_layers_keep_two_programs_per_sm_and_a_configured_count_holds_everywhere() -> None:
    import torch
    from expert_residency.gpu.experts import ExpertShape, KernelConfig, TritonMxfp4Experts

    shape, cpu = ExpertShape(hidden=256, intermediate=128), torch.device("cpu")
    tiles = dict(block_m=4, block_n1=64, block_k1=128, block_n2=128, block_k2=128)
    # the default (0): a split layer runs two whatever the GPU (its step is the host link's); the
    # all-HBM count needs the GPU's figures (tests/gpu/test_ws_grouped_gpu.py)
    assert TritonMxfp4Experts(shape, 8, 2, 4, cpu, KernelConfig(**tiles)).ws_programs_on(split=True) == 2
    three = TritonMxfp4Experts(shape, 8, 2, 4, cpu, KernelConfig(ws_programs_per_sm=3, **tiles))
    assert three.ws_programs_on(split=True) == three.ws_programs_on(split=False) == 3
