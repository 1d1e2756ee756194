#!/usr/bin/env python3
"""Compile the MXFP4 expert kernels for sm_90 (or ``--arch``) on a machine without a GPU and count the SASS of their
innermost K loop (instructions per weight: the number that decides whether the kernel keeps up
with HBM at small batch).

    PYTHONPATH=runtime python3 bench/kernel_sass.py [--dequant 3] [--block-n1 64] [--block-k1 128]
        [--block-n2 128] [--block-k2 128] [--num-stages 4] [--split-k1 N] [--split-k2 N] [--one-token]
        [--fuse-finalize] [--pdl] [--stream-k1 P] [--stream-k2 P]
        [--warp-mma G1/G2 [--grouped [--gw-max-registers R]] --chains C [--unroll U1/U2] [--smem-stages S]
         [--t1-max-registers R]]
        [--max-registers R] [--dump DIR]

Uses whatever Triton is importable (the H200 image has 3.6.0; install the same version into a
scratch directory, e.g. ``pip install --target /tmp/t36 triton==3.6.0`` and put it first on
PYTHONPATH, for counts that match the GPU's binaries) and the ``cuobjdump`` shipped in Triton's
wheel. Integer arguments are compiled as 16-divisible, as Triton specialises them at run time for
the real geometries.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

import triton  # noqa: E402
from expert_residency.gpu import kernels, kernels_t1  # noqa: E402
from expert_residency.gpu.experts import KernelConfig  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

W13_ARGS = [("x_ptr", "*bf16"), ("codes_ptr", "*i32"), ("hot_w_ptr", "*u8"), ("hot_s_ptr", "*u8"),
            ("cold_w_ptr", "*u8"), ("cold_s_ptr", "*u8"), ("sorted_pick_ptr", "*i32"), ("slot_start_ptr", "*i32"),
            ("slot_expert_ptr", "*i32"), ("num_slots_ptr", "*i32"), ("act_ptr", "*bf16"), ("counts_ptr", "*i64"),
            ("tokens_ptr", "*i64"), ("n_tokens_ptr", "*i32"), ("stride_x", "i32"), ("w_expert_stride", "i64"),
            ("s_expert_stride", "i64"), ("ids_ptr", "*i64"), ("token_mask_ptr", "*i32"), ("part_ptr", "*fp32"),
            ("ticket_ptr", "*i32"), ("E", "i32"), ("hot_b_ptr", "*fp32"), ("cold_b_ptr", "*fp32"),
            ("b_expert_stride", "i64")]
W2_ARGS = [("act_ptr", "*bf16"), ("codes_ptr", "*i32"), ("hot_w_ptr", "*u8"), ("hot_s_ptr", "*u8"),
           ("cold_w_ptr", "*u8"), ("cold_s_ptr", "*u8"), ("sorted_pick_ptr", "*i32"), ("slot_start_ptr", "*i32"),
           ("slot_expert_ptr", "*i32"), ("num_slots_ptr", "*i32"), ("y_ptr", "*bf16"), ("w_expert_stride", "i64"),
           ("s_expert_stride", "i64"), ("ids_ptr", "*i64"), ("token_mask_ptr", "*i32"), ("part_ptr", "*fp32"),
           ("ticket_ptr", "*i32"), ("E", "i32"), ("hot_b_ptr", "*fp32"), ("cold_b_ptr", "*fp32"),
           ("b_expert_stride", "i64"), ("weights_ptr", "*fp32"), ("out_ptr", "*bf16"), ("fin_ticket_ptr", "*i32")]
W13_STREAM_ARGS = [("x_ptr", "*bf16"), ("codes_ptr", "*i32"), ("hot_w_ptr", "*u8"), ("hot_s_ptr", "*u8"),
                   ("cold_w_ptr", "*u8"), ("cold_s_ptr", "*u8"), ("act_ptr", "*bf16"), ("counts_ptr", "*i64"),
                   ("tokens_ptr", "*i64"), ("w_expert_stride", "i64"), ("s_expert_stride", "i64"),
                   ("ids_ptr", "*i64"), ("token_mask_ptr", "*i32"), ("part_ptr", "*fp32"), ("ticket_ptr", "*i32"),
                   ("E", "i32"), ("hot_b_ptr", "*fp32"), ("cold_b_ptr", "*fp32"), ("b_expert_stride", "i64")]
W2_STREAM_ARGS = [("act_ptr", "*bf16"), ("codes_ptr", "*i32"), ("hot_w_ptr", "*u8"), ("hot_s_ptr", "*u8"),
                  ("cold_w_ptr", "*u8"), ("cold_s_ptr", "*u8"), ("y_ptr", "*bf16"), ("w_expert_stride", "i64"),
                  ("s_expert_stride", "i64"), ("ids_ptr", "*i64"), ("token_mask_ptr", "*i32"), ("part_ptr", "*fp32"),
                  ("ticket_ptr", "*i32"), ("E", "i32"), ("hot_b_ptr", "*fp32"), ("cold_b_ptr", "*fp32"),
                  ("b_expert_stride", "i64"), ("weights_ptr", "*fp32"), ("out_ptr", "*bf16"),
                  ("fin_ticket_ptr", "*i32")]
W13_T1_ARGS = [("x_ptr", "*bf16"), ("codes_ptr", "*i32"), ("hot_w_ptr", "*u8"), ("hot_s_ptr", "*u8"),
               ("cold_w_ptr", "*u8"), ("cold_s_ptr", "*u8"), ("act_ptr", "*bf16"), ("counts_ptr", "*i64"),
               ("tokens_ptr", "*i64"), ("w_expert_stride", "i64"), ("s_expert_stride", "i64"),
               ("ids_ptr", "*i64"), ("token_mask_ptr", "*i32"), ("E", "i32"), ("hot_b_ptr", "*fp32"),
               ("cold_b_ptr", "*fp32"), ("b_expert_stride", "i64")]
W2_T1_ARGS = [("act_ptr", "*bf16"), ("codes_ptr", "*i32"), ("hot_w_ptr", "*u8"), ("hot_s_ptr", "*u8"),
              ("cold_w_ptr", "*u8"), ("cold_s_ptr", "*u8"), ("y_ptr", "*bf16"), ("w_expert_stride", "i64"),
              ("s_expert_stride", "i64"), ("ids_ptr", "*i64"), ("token_mask_ptr", "*i32"), ("E", "i32"),
              ("hot_b_ptr", "*fp32"), ("cold_b_ptr", "*fp32"), ("b_expert_stride", "i64"),
              ("weights_ptr", "*fp32"), ("out_ptr", "*bf16"), ("fin_ticket_ptr", "*i32")]
W13_GW_ARGS = [("x_ptr", "*bf16"), ("codes_ptr", "*i32"), ("hot_w_ptr", "*u8"), ("hot_s_ptr", "*u8"),
               ("cold_w_ptr", "*u8"), ("cold_s_ptr", "*u8"), ("sorted_pick_ptr", "*i32"), ("slot_start_ptr", "*i32"),
               ("slot_expert_ptr", "*i32"), ("num_slots_ptr", "*i32"), ("act_ptr", "*bf16"), ("counts_ptr", "*i64"),
               ("tokens_ptr", "*i64"), ("n_tokens_ptr", "*i32"), ("stride_x", "i32"), ("w_expert_stride", "i64"),
               ("s_expert_stride", "i64"), ("hot_b_ptr", "*fp32"), ("cold_b_ptr", "*fp32"),
               ("b_expert_stride", "i64")]
W2_GW_ARGS = [("act_ptr", "*bf16"), ("codes_ptr", "*i32"), ("hot_w_ptr", "*u8"), ("hot_s_ptr", "*u8"),
              ("cold_w_ptr", "*u8"), ("cold_s_ptr", "*u8"), ("sorted_pick_ptr", "*i32"), ("slot_start_ptr", "*i32"),
              ("slot_expert_ptr", "*i32"), ("num_slots_ptr", "*i32"), ("y_ptr", "*bf16"), ("w_expert_stride", "i64"),
              ("s_expert_stride", "i64"), ("hot_b_ptr", "*fp32"), ("cold_b_ptr", "*fp32"), ("b_expert_stride", "i64")]
_ADDR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(\S.*)")


ARCH = 90


def use_target(arch: int):
    """Compile for compute capability ``arch`` (x10). The kernels pick their PTX by the compile
    target's capability (cuda_capability_geq), which Triton reads from the active driver: make it
    the target compiled for (no GPU here). Returns what it replaced."""
    global ARCH
    ARCH = arch
    import triton.language.target_info as target_info

    def compile_target():
        return GPUTarget("cuda", ARCH, 32)

    compile_target.__triton_builtin__ = True  # as Triton marks its own current_target
    replaced = target_info.current_target
    target_info.current_target = compile_target
    return replaced


def compile_kernel(fn, args, constexprs, num_warps: int, num_stages: int, maxnreg: int | None = None):
    sig = dict(args)
    sig.update({k: "constexpr" for k in constexprs})
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(args))}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", ARCH, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages,
                                       **({"maxnreg": maxnreg} if maxnreg else {})))


def cuobjdump(kernel, flag: str) -> str:
    tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    try:
        return subprocess.run([str(tool), flag, f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)


def innermost_loop(sass: str) -> list[str]:
    """Instructions of the shortest backward branch's body (the K loop)."""
    lines = [(int(m.group(1), 16), m.group(2)) for m in map(_ADDR.search, sass.splitlines()) if m]
    best: list[str] | None = None
    for addr, text in lines:
        target = re.search(r"BRA\s+0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            body = [t for a, t in lines if int(target.group(1), 16) <= a <= addr]
            if best is None or len(body) < len(best):
                best = body
    return best or []


def load_use_distances(body: list[str]) -> list[int]:
    """For each 128-bit global load of a loop body: how many MMAs the warp issues between the load
    and the first instruction that reads one of its four registers (going round the loop: a load
    that feeds the next trip counts the MMAs to the trip's end and from the next trip's start).
    What hides the load's latency is the work between those two points."""
    out = []
    for at, text in enumerate(body):
        load = re.search(r"\bLDG\S*\.128\s+R(\d+),", text)
        if not load:
            continue
        regs = {f"R{int(load.group(1)) + k}" for k in range(4)}
        mmas = 0
        for step in range(1, len(body) + 1):
            later = body[(at + step) % len(body)]
            operands = re.sub(r"^(?:@!?U?P\w+\s+)?\S+\s*", "", later).split(",")
            if set(re.findall(r"\bR\d+\b", ",".join(operands[1:]))) & regs:
                break
            mmas += "HMMA" in later
        out.append(mmas)
    return sorted(out)


def report(name: str, kernel, weights_per_iter: int, dump: Path | None) -> dict:
    sass = cuobjdump(kernel, "-sass")
    res = cuobjdump(kernel, "-res-usage")
    regs = re.search(r"REG:(\d+)", res)
    body = innermost_loop(sass)
    ops = collections.Counter(re.match(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", t).group(1) for t in body)
    spills = sum(1 for line in sass.splitlines() if re.search(r"\b(LDL|STL)\b", line))
    loop_spills = ops["LDL"] + ops["STL"]
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
        (dump / f"{name}.sass").write_text(sass)
        (dump / f"{name}.ttgir").write_text(kernel.asm["ttgir"])
    out = {"kernel": name, "regs": int(regs.group(1)) if regs else None, "loop_instructions": len(body),
           "weights_per_thread_per_iteration": weights_per_iter,
           "instructions_per_weight": len(body) / weights_per_iter,
           "no_layout_conversion_on_weights": "convert_layout %packed" not in kernel.asm["ttgir"],
           "local_memory_instructions": spills, "local_memory_instructions_in_k_loop": loop_spills,
           "shared_bytes": kernel.metadata.shared,
           "mix": dict(ops.most_common(12))}
    print(f"{name}: {out['regs']} registers, K loop {len(body)} instructions for {weights_per_iter} weights per "
          f"thread = {out['instructions_per_weight']:.2f} per weight; {out['mix']}")
    print(f"  spill instructions (LDL/STL) {spills}, in the K loop {loop_spills}; shared memory "
          f"{kernel.metadata.shared} bytes")
    wide = [i for i, t in enumerate(body) if re.search(r"\bLDG\S*\.128\b", t)]
    mma = [i for i, t in enumerate(body) if re.search(r"\bHMMA\b", t)]
    if mma and wide:
        # The warp-MMA loops load into registers, so where ptxas puts a load decides how much work
        # hides its latency: one issued behind all but a few of the trip's MMAs feeds the next
        # trip, which starts by waiting for it.
        after = sorted(sum(m > i for m in mma) for i in wide)
        out["mmas_after_each_wide_load"] = after
        print(f"  the loop's {len(mma)} MMAs: how many follow each of its {len(wide)} 128-bit loads: {after} "
              "(few: the next trip starts by waiting for that load)")
        out["mmas_between_each_wide_load_and_its_use"] = load_use_distances(body)
        print(f"  MMAs between each 128-bit load and the first use of its registers: "
              f"{out['mmas_between_each_wide_load_and_its_use']}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--intermediate", type=int, default=2304)
    ap.add_argument("--dequant", type=int, default=3)
    ap.add_argument("--block-m", type=int, default=16)
    ap.add_argument("--block-n1", type=int, default=64)
    ap.add_argument("--block-k1", type=int, default=128)
    ap.add_argument("--block-n2", type=int, default=128)
    ap.add_argument("--block-k2", type=int, default=128)
    ap.add_argument("--num-warps", type=int, default=4)
    ap.add_argument("--num-stages", type=int, default=4)
    ap.add_argument("--split-k1", type=int, default=1, help="w13 K splits (the small-step schedule)")
    ap.add_argument("--split-k2", type=int, default=1, help="w2 K splits (the small-step schedule)")
    ap.add_argument("--one-token", action="store_true", help="the T=1 kernels (no grouping launch)")
    ap.add_argument("--fuse-finalize", action="store_true", help="T=1 w2 with the finalize folded in")
    ap.add_argument("--pdl", action="store_true", help="programmatic dependent launch (griddepcontrol)")
    ap.add_argument("--stream-k1", type=int, default=0, help="T=1 stream-K w13 on this many programs")
    ap.add_argument("--stream-k2", type=int, default=0, help="T=1 stream-K w2 on this many programs")
    ap.add_argument("--warp-mma", type=str, default=None, metavar="G1/G2",
                    help="the T=1 warp-MMA kernels (gpu.kernels_t1) with G1 / G2 warpgroups per program")
    ap.add_argument("--grouped", action="store_true",
                    help="with --warp-mma: the grouped-step kernels (up to eight picks of an expert per pass)")
    ap.add_argument("--chains", type=int, default=1, help="with --warp-mma: accumulator chains per warp")
    ap.add_argument("--unroll", type=str, default="8/8", metavar="U1/U2",
                    help="with --warp-mma: K half-steps per loop trip of w13 / w2")
    ap.add_argument("--arch", type=int, default=90, help="compute capability x10 (90: H100/H200, 80: A100)")
    ap.add_argument("--smem-stages", type=int, default=0,
                    help="with --warp-mma: weights through Triton's shared-memory pipeline of this many stages "
                         "(KernelConfig.t1_smem_stages; 0: the register ring)")
    ap.add_argument("--t1-max-registers", type=int, default=KernelConfig.t1_max_registers,
                    help="with --warp-mma (T = 1): the launches' register cap (KernelConfig.t1_max_registers; 0: "
                         "the compiler's choice)")
    ap.add_argument("--gw-max-registers", type=int, default=KernelConfig.gw_max_registers,
                    help="with --grouped: the register cap of the grouped launches (KernelConfig.gw_max_registers, "
                         "its default; 0: the compiler's choice)")
    ap.add_argument("--max-registers", type=int, default=0,
                    help="register cap (Triton's maxnreg) of the tl.dot kernels; 0: the compiler's choice")
    ap.add_argument("--dump", type=Path, default=None, help="write SASS and TTGIR here")
    a = ap.parse_args()
    use_target(a.arch)
    print(f"triton {triton.__version__}, sm_{ARCH}")
    threads = 32 * a.num_warps
    if a.stream_k1:
        w13 = compile_kernel(kernels.w13_stream_kernel, W13_STREAM_ARGS,
                             dict(H=a.hidden, INTER=a.intermediate, TOP_K=6, BM=a.block_m, BN=a.block_n1,
                                  BK=a.block_k1, DEQUANT=a.dequant, TILE_MAJOR=True, COUNT=True,
                                  SWIGLU_LIMIT=0.0, PROGRAMS=a.stream_k1, HAS_TOKEN_MASK=True, PDL=a.pdl),
                             a.num_warps, a.num_stages)
        report("w13-streamK", w13, 2 * a.block_n1 * a.block_k1 // threads, a.dump)
    if a.stream_k2:
        w2 = compile_kernel(kernels.w2_stream_kernel, W2_STREAM_ARGS,
                            dict(H=a.hidden, INTER=a.intermediate, TOP_K=6, BM=a.block_m, BN=a.block_n2,
                                 BK=a.block_k2, DEQUANT=a.dequant, TILE_MAJOR=True, PROGRAMS=a.stream_k2,
                                 HAS_TOKEN_MASK=True, FUSE_FINALIZE=a.fuse_finalize, PDL=a.pdl),
                            a.num_warps, a.num_stages)
        report("w2-streamK", w2, a.block_n2 * a.block_k2 // threads, a.dump)
    if a.stream_k1 or a.stream_k2:
        return 0
    if a.warp_mma and a.grouped:
        g1, g2 = (int(v) for v in a.warp_mma.split("/"))
        unroll1, unroll2 = (int(v) for v in a.unroll.split("/"))
        w13 = compile_kernel(kernels_t1.w13_gw_kernel, W13_GW_ARGS,
                             dict(H=a.hidden, INTER=a.intermediate, TOP_K=6, BK=a.block_k1, KSPLIT=g1,
                                  CHAINS=a.chains, COUNT=True, SWIGLU_LIMIT=0.0, HAS_BIAS=False, ACT=0, ALPHA=1.0,
                                  PDL=a.pdl, UNROLL=unroll1, PASS_LOOP=True, SMEM_STAGES=a.smem_stages),
                             4 * g1, 1, a.gw_max_registers or None)
        report("w13-grouped-warp-mma", w13, unroll1 * 2 * 32, a.dump)
        w2 = compile_kernel(kernels_t1.w2_gw_kernel, W2_GW_ARGS,
                            dict(H=a.hidden, INTER=a.intermediate, BN=a.block_n2, BK=a.block_k2, KSPLIT=g2,
                                 CHAINS=a.chains, HAS_BIAS=False, PDL=a.pdl, UNROLL=unroll2, PASS_LOOP=True,
                                 SMEM_STAGES=a.smem_stages), 4 * g2, 1, a.gw_max_registers or None)
        report("w2-grouped-warp-mma", w2, unroll2 * (a.block_n2 // 64) * 32, a.dump)
        return 0
    if a.warp_mma:
        g1, g2 = (int(v) for v in a.warp_mma.split("/"))
        unroll1, unroll2 = (int(v) for v in a.unroll.split("/"))
        w13 = compile_kernel(kernels_t1.w13_t1_kernel, W13_T1_ARGS,
                             dict(H=a.hidden, INTER=a.intermediate, TOP_K=6, BK=a.block_k1, KSPLIT=g1,
                                  CHAINS=a.chains, COUNT=True, SWIGLU_LIMIT=0.0, HAS_BIAS=False, ACT=0, ALPHA=1.0,
                                  HAS_TOKEN_MASK=False, PDL=a.pdl, UNROLL=unroll1, BN1=a.block_n1,
                                  SMEM_STAGES=a.smem_stages), 4 * g1, 1, a.t1_max_registers or None)
        report("w13-warp-mma", w13, unroll1 * 2 * 32, a.dump)  # per loop trip: its half-steps of gate and up
        w2 = compile_kernel(kernels_t1.w2_t1_kernel, W2_T1_ARGS,
                            dict(H=a.hidden, INTER=a.intermediate, TOP_K=6, BN=a.block_n2, BK=a.block_k2, KSPLIT=g2,
                                 CHAINS=a.chains, HAS_TOKEN_MASK=False, HAS_BIAS=False,
                                 FUSE_FINALIZE=a.fuse_finalize, PDL=a.pdl, UNROLL=unroll2,
                                 SMEM_STAGES=a.smem_stages), 4 * g2, 1, a.t1_max_registers or None)
        report("w2-warp-mma", w2, unroll2 * (a.block_n2 // 64) * 32, a.dump)  # the trip's half-steps of each rep
        return 0
    w13 = compile_kernel(kernels.w13_swiglu_kernel, W13_ARGS,
                         dict(H=a.hidden, INTER=a.intermediate, TOP_K=6, BM=a.block_m, BN=a.block_n1, BK=a.block_k1,
                              DEQUANT=a.dequant, TILE_MAJOR=True, COUNT=False, SWIGLU_LIMIT=0.0, SPLIT=a.split_k1,
                              ONE_TOKEN=a.one_token, HAS_TOKEN_MASK=False, PART_PICKS=96, PDL=a.pdl),
                         a.num_warps, a.num_stages, a.max_registers or None)
    report("w13", w13, 2 * a.block_n1 * a.block_k1 // threads, a.dump)  # gate + up tiles
    w2 = compile_kernel(kernels.w2_kernel, W2_ARGS,
                        dict(H=a.hidden, INTER=a.intermediate, BM=a.block_m, BN=a.block_n2, BK=a.block_k2,
                             DEQUANT=a.dequant, TILE_MAJOR=True, TOP_K=6, SPLIT=a.split_k2, ONE_TOKEN=a.one_token,
                             HAS_TOKEN_MASK=False, PART_PICKS=96, PDL=a.pdl,
                             FUSE_FINALIZE=a.fuse_finalize and a.one_token),
                        a.num_warps, a.num_stages, a.max_registers or None)
    report("w2", w2, a.block_n2 * a.block_k2 // threads, a.dump)
    return 0


if __name__ == "__main__":
    sys.exit(main())
