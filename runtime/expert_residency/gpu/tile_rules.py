"""Which tile shapes the compiled MXFP4 kernels may run with, and how many warp-specialized
programs share an SM (standard library only; the GPU's figures come in as arguments).

``KernelConfig.block_m`` (tokens per tile) below 16 is refused for compiled kernels: measured on
one NVIDIA H200 (2026-12-01), the MMA-order decode (``dequant=3``, the default) compiled with
``block_m=4`` gives wrong outputs (relative L2 1.9 against ``block_m=16`` on a 6-expert 256 x 128
layer, plain SiLU), while ``TRITON_INTERPRET=1`` on CPU computes it right, so CPU tests cannot see
it. The other decodes were never run on a GPU below 16 either. Under the interpreter (device
``cpu``) small tiles stay allowed: the CPU tests use ``block_m=4`` to keep steps short.

Every path that builds the compiled kernels checks here: ``TritonMxfp4Experts`` (its constructor),
the plugin's ``blackwell.plugin.cuda_bank_experts`` (a given ``kernel_config``) and the benches'
``--config`` / ``--sweep`` / ``--compare`` parser (``bench/gpu_residency.parse_config``, which
``bench/peer_moe.py`` reuses).
"""

from __future__ import annotations

from typing import Any

# The smallest block_m run and checked compiled on the H200 (the default KernelConfig's).
MIN_COMPILED_BLOCK_M = 16


def compiled_block_m_reason(block_m: int, dequant: int, device_type: str) -> str | None:
    """None when ``block_m`` may run on ``device_type`` ("cuda": compiled; "cpu": interpreted),
    else why not (the message names the field, its value and the smallest allowed)."""
    if device_type != "cuda" or int(block_m) >= MIN_COMPILED_BLOCK_M:
        return None
    measured = ("the MMA-order decode (dequant=3) compiled with block_m=4 gave wrong outputs on "
                "the H200 (relative L2 1.9 against block_m=16)" if int(dequant) == 3 else
                f"dequant={int(dequant)} was never checked compiled below block_m="
                f"{MIN_COMPILED_BLOCK_M}")
    return (f"KernelConfig.block_m={int(block_m)} is below {MIN_COMPILED_BLOCK_M}, the smallest "
            f"token tile the compiled MXFP4 kernels are checked at: {measured}; use block_m >= "
            f"{MIN_COMPILED_BLOCK_M} (smaller tiles run only under TRITON_INTERPRET=1 on CPU)")


def check_compiled_block_m(config: Any, device: Any) -> None:
    """ValueError (``compiled_block_m_reason``) when ``config`` (a ``KernelConfig``) cannot run
    compiled on ``device`` (a ``torch.device`` or its string)."""
    device_type = getattr(device, "type", None) or str(device).split(":")[0]
    reason = compiled_block_m_reason(config.block_m, config.dequant, device_type)
    if reason is not None:
        raise ValueError(reason)


# A Hopper SM's register file: 64 Ki 32-bit registers shared by the programs resident on it.
SM_REGISTERS = 64 * 1024
# Threads of one warp-specialized program (``gpu.kernels_ws``): the compute warpgroup and the loader
# partition, which Triton pads to a whole warpgroup so that its warps can hand registers over.
WS_THREADS = 256
# The cap at two programs per SM, where the launches were measured first (BENCHMARKS.md, run WS).
WS_MAX_REGISTERS = 128
# Four programs use 4 x 49,412 bytes of the SM's 228 KiB of shared memory and 64 registers per thread;
# five would leave 48 registers, and the compute loop then spills (SASS, Triton 3.6).
WS_MAX_PROGRAMS_PER_SM = 4


def ws_max_registers(programs_per_sm: int) -> int:
    """ptxas' register cap (Triton's ``maxnreg``) at which ``programs_per_sm`` warp-specialized
    programs fit one SM's register file together. A program launches with the cap for each of its
    256 threads (its loader then hands its surplus to the compute warpgroup), so N programs fit at
    65,536 / (256 N) registers, rounded down to ptxas' step of 8, and at most 128. Launched at 128
    with three programs per SM, the third program of each SM waits for one of the first two to end
    (the persistent grid then runs in two waves)."""
    if not 1 <= programs_per_sm <= WS_MAX_PROGRAMS_PER_SM:
        raise ValueError(f"ws_programs_per_sm {programs_per_sm}: a Hopper SM holds 1 to "
                         f"{WS_MAX_PROGRAMS_PER_SM} of these programs")
    return min(WS_MAX_REGISTERS, SM_REGISTERS // (WS_THREADS * programs_per_sm) // 8 * 8)


# HBM read bandwidth per SM above which the warp-specialized launches run four programs per SM
# instead of two. Two programs' instructions keep up with an H100 SXM's memory (3.35 TB/s peak over
# 132 SMs: 25 GB/s per SM; they read 93-99% of its measured HBM rate at 16-96 tokens, and four were
# 1.01-1.06x slower: BENCHMARKS.md, run OC) but not with an H200's (4.8 TB/s: 36 GB/s per SM; two
# read 80-84%, four 84-89%, the same bits: run SH). With each expert's weights held in L2, where
# memory does not limit, two programs per SM on an H100 read at most 3.8-4.0 TB/s and four 4.3 TB/s
# (run SH): what a program's own instructions allow, which an H200's memory outruns.
WS_FOUR_PROGRAMS_ABOVE_BYTES_PER_S_PER_SM = 30e9
# Programs per SM where the memory sets the pace (at or below that bandwidth per SM, and on split
# layers, whose step the host link sets) and where the programs' instructions do (above it).
WS_PROGRAMS_MEMORY_BOUND = 2
WS_PROGRAMS_INSTRUCTION_BOUND = 4


def peak_memory_bytes_per_s(memory_clock_khz: int, bus_width_bits: int) -> float:
    """A GPU's peak memory bandwidth from its device properties (CUDA's ``memoryClockRate``, kHz,
    and ``memoryBusWidth``, bits): two transfers per clock over the bus (HBM3 / HBM3e)."""
    return 2.0 * memory_clock_khz * 1e3 * bus_width_bits / 8


def ws_programs_for(peak_bytes_per_s: float, sms: int) -> int:
    """Warp-specialized programs per SM for a GPU of ``sms`` SMs and ``peak_bytes_per_s`` of memory
    bandwidth (``KernelConfig.ws_programs_per_sm`` = 0): four above
    ``WS_FOUR_PROGRAMS_ABOVE_BYTES_PER_S_PER_SM`` per SM, else two (also when the figures are unknown:
    ``peak_bytes_per_s`` 0)."""
    if sms <= 0:
        raise ValueError(f"sms {sms}: a GPU has at least one SM")
    if peak_bytes_per_s / sms > WS_FOUR_PROGRAMS_ABOVE_BYTES_PER_S_PER_SM:
        return WS_PROGRAMS_INSTRUCTION_BOUND
    return WS_PROGRAMS_MEMORY_BOUND


def t1_fused_programs(sms: int, registers_per_sm: int, threads_per_sm: int, max_registers: int,
                      warpgroups: int, items: int) -> int:
    """Programs of the one-launch T = 1 layer (``kernels_t1.t1_fused_kernel``): as many as the GPU
    holds at once — its w2 items wait on other programs' w13 items, so every program must be
    resident — and no more than the larger of its two item lists. A program of ``warpgroups``
    warpgroups (128 threads each) under a register cap of ``max_registers`` per thread takes
    ``max_registers * 128 * warpgroups`` of an SM's ``registers_per_sm`` (the cap, not what ptxas
    happens to use: the count must hold whatever the compiler does)."""
    if min(sms, registers_per_sm, threads_per_sm, max_registers, warpgroups, items) <= 0:
        raise ValueError("t1_fused_programs: every figure must be positive (a register cap of 0 leaves the "
                         "programs per SM unknown)")
    threads = 128 * warpgroups
    per_sm = min(registers_per_sm // (max_registers * threads), threads_per_sm // threads)
    if per_sm < 1:
        raise ValueError(f"t1_fused_programs: a program of {threads} threads at {max_registers} registers does not "
                         f"fit an SM of {registers_per_sm} registers")
    return min(sms * per_sm, items)
