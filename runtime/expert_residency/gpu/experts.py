"""The split MoE layer on the GPU: Triton MXFP4 experts over a hot and a cold bank, plus finalize.

``TritonMxfp4Experts`` drives ``gpu.kernels`` (and at T=1 on CUDA sm_80+ the warp-MMA kernels of
``gpu.kernels_t1``, ``KernelConfig.t1_warp_mma``) for layers built by the runtime core
(``core.banks.ResidentLayer``: ``w13_weight``/``w2_weight`` packed E2M1 and their ``*_scale``
ue8m0 tensors in a hot bank on the device and a cold bank that is a device view of pinned host
memory, and the device row map ``row_codes``). Two entry points:

* ``forward(layer, x, topk_weights, topk_ids)`` — the whole routed-expert output ``[T, H]`` in four
  launches (group, w13+SwiGLU, w2, finalize; two at T=1, which needs no grouping and
  finalizes inside the w2 launch; programmatic dependent launches on sm_90+), both banks in one pass, optional in-kernel counting
  into a ``core.counter.ExpertCounter``. Fixed shapes, no host sync: capture it in a CUDA graph
  (``gpu.graphs``) and replay it with new routing, or after a swap (the map is read at run time).
* ``per_pick_fn()`` — the same kernels behind the core's ``PerPickExpertFn`` contract, so
  ``core.split.residency_forward`` (torch finalize) runs with the Triton per-pick arithmetic.

The banks must hold the kernel layout of ``config`` (``gpu.layout``; tile-major by default): call
``to_kernel_layout`` on a layer's full tensors before re-homing it. The torch references read
vLLM's layout, not this one.

Scratch memory is a ``Workspace`` sized once for ``max_tokens``; layers run one after another on
one stream share it. ``pick_outputs`` returns a view of it: consume it before the next call.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton

from ..contract import sizing
from ..contract.expert_formats import GPTOSS_SWIGLU_ALPHA, GPTOSS_SWIGLU_LIMIT
from ..core.banks import ExpertBank, ResidentLayer
from ..core.formats_ref import SWIGLUOAI, deinterleave_gate_up
from ..core.reference import check_swiglu_limit
from . import kernels, kernels_t1

try:  # Gluon (Triton's lower-level language) is experimental; without it the other kernels run
    from . import kernels_ws
except (ImportError, AttributeError):   # absent, or its names moved (kernels_ws resolves them at import)
    kernels_ws = None
from .layout import check_mma_tiles, is_mma_order, to_kernel_layout
from .tile_rules import (
    WS_MAX_PROGRAMS_PER_SM,
    WS_PROGRAMS_MEMORY_BOUND,
    check_compiled_block_m,
    peak_memory_bytes_per_s,
    t1_fused_programs,
    ws_max_registers,
    ws_programs_for,
)

if TYPE_CHECKING:
    from ..core.counter import ExpertCounter

W13, W2 = "w13_weight", "w2_weight"
SCALE_SUFFIX = "_scale"
# The grouping kernel sorts every pick of a step in one program; above this many picks (prefill)
# the same grouping is done with torch ops (identical order, so identical bits). 1024 picks (T=170
# at top-6) is the largest size run on the H200 so far.
MAX_FUSED_PICKS = 1024


@dataclass(frozen=True)
class KernelConfig:
    """Tile shapes. ``block_m`` tokens per tile; ``block_n*`` weight rows per program; ``block_k*``
    reduction depth per step (a multiple of 32, the MX block). The same config is used for every
    bank and every bank size; that is what keeps the split bit-identical to the unsplit layer."""

    # The tile defaults live in contract.sizing (the ledger sizes the start-up bytes from them).
    block_m: int = sizing.BLOCK_M
    block_n1: int = sizing.BLOCK_N1
    block_k1: int = sizing.BLOCK_K1
    block_n2: int = sizing.BLOCK_N2  # w2: 128-row tiles, 3.3 instead of 4.2 instructions per weight (SASS)
    block_k2: int = sizing.BLOCK_K2
    num_warps: int = 4
    num_stages: int = 4  # three weight tiles in flight (cp.async) per program
    # 0: integer dequant + tl.dot (also runs under TRITON_INTERPRET=1); 1: tl.dot_scaled;
    # 2: prmt-table PTX (GPU only); 3: MMA-order layout, decoded in the tensor cores' register
    # order (the default; tiles of multiples of 64 rows x 64 values; GPU, and its integer twin
    # under TRITON_INTERPRET=1). See BENCHMARKS.md.
    dequant: int = 3
    # Banks hold each expert tile-major for these tile shapes (``gpu.layout``): contiguous reads,
    # which the host link needs. False: vLLM's row-major layout as loaded.
    tile_major: bool = True
    finalize_block: int = 1024
    # Small steps (T <= min(small_tokens, block_m), chosen by T when a launch is traced, so each
    # captured graph keeps one schedule): the K reduction of w13 (hidden dim) and of w2
    # (intermediate dim) can be split over split_k1 / split_k2 programs (grid axis 2; fp32
    # partials added in split order by each tile's last split). Off by default: on the H200 it
    # did not shorten T=1 (59 vs 60 µs, the layer is issue-bound, not short of programs) and it
    # slowed T=6 (327 vs 228 µs); BENCHMARKS.md. With a split, a token's bits depend on whether
    # its step was small (fp32 summation order); split == unsplit banks holds at every T.
    small_tokens: int = sizing.SMALL_TOKENS
    split_k1: int = sizing.SPLIT_K1
    split_k2: int = sizing.SPLIT_K2
    # T = 1: no grouping launch (each pick its own slot): three launches instead of four
    # (one all-HBM layer 67 -> 60 µs on the H200).
    one_token: bool = True
    # Pipeline stages above small_tokens (None: num_stages): 3 stages measured faster at T >= 16
    # (460 vs 471 µs at T=16), 4 faster at T=1.
    num_stages_large: int | None = 3
    # Register cap per thread (Triton's ``maxnreg``; 0: the compiler's choice) of the tl.dot
    # expert launches at small steps / above small_tokens. Registers decide how many programs an
    # SM holds (65,536 per SM over 32 * num_warps threads), and so how many weight tiles are in
    # flight per SM. Uncapped, the small schedule's w2 takes 189 (2 programs per SM) and the
    # large schedule's 153 / 156 (3); 168 and 128 give 3 and 4, with no spill inside the K loop
    # (SASS, triton 3.6). H200, DeepSeek-V4.1 all-HBM layer, four calls: 0.974-1.002 / 0.986-0.997
    # / 0.966-0.989 of the uncapped layer at T = 6 / 16 / 96; the usage-aware step within 0.8%
    # (BENCHMARKS.md, run RC). A cap changes no arithmetic: same bits.
    max_registers: int = 168
    max_registers_large: int = 128
    # T = 1 (with one_token and no w2 split): the finalize runs inside the w2 launch (the last
    # program of each row tile adds the token's K rows in router order; same bits): two launches.
    fuse_finalize: bool = True
    # Programmatic dependent launch (sm_90+ on CUDA; ignored elsewhere): each kernel's programs
    # start while the previous kernel drains and wait for it before touching memory.
    pdl: bool = True
    # Grouped steps (T > 1) of a split layer: the cold experts' slots first in both expert
    # launches, so their reads over the host link, the layer's longest, start with the launch
    # rather than wherever the cold ids fall among the hot ones (a slot computes the same bits
    # wherever it runs: split == unsplit holds). False: slots in expert-id order.
    cold_first: bool = True
    # T = 1 stream-K (with one_token): the w13 / w2 launch on this many programs, each an equal
    # share of the (pick, row tile, K step) work list, partials of tiles cut by a share boundary
    # added in share order (``kernels.w13_stream_kernel``); 0: one program per (pick, row tile).
    # A multiple of the SM count (132 on the H200) balances the grid.
    stream_k1: int = sizing.STREAM_K1
    stream_k2: int = sizing.STREAM_K2
    # T = 1 (with one_token, no split and no stream-K; the MMA-order layout with 64-row w13 tiles
    # and 64- or 128-row w2 tiles; compiled on CUDA sm_80+): the two expert launches multiply with
    # warp-level tensor-core MMA (``gpu.kernels_t1``) instead of ``tl.dot``; t1_warpgroups*
    # warpgroups per program share each tile's K (the largest power of two up to this that divides
    # the tile's 64-value half-steps; 0: that launch through tl.dot); each warp accumulates in
    # t1_chains* independent MMA chains (1, 2 or 4; 4 needs 128+ registers, which leaves w2 one
    # program per SM). Under TRITON_INTERPRET=1 the tl.dot schedule runs. H200, 13-layer T=1
    # step, all experts in HBM: 42.9 us per layer against 51.7 through tl.dot (BENCHMARKS.md).
    t1_warp_mma: bool = True
    t1_warpgroups1: int = 2
    t1_warpgroups2: int = 2
    t1_chains1: int = 2
    t1_chains2: int = 2
    # T = 1 warp-MMA: K half-steps per loop trip of the w13 / w2 launch (a multiple of 4). Each
    # trip waits once for the weights the previous one loaded last (ptxas issues those after the
    # trip's last MMA), so longer trips wait less often, for longer code: on the H200 8 beats 4
    # (42.9 vs 45.1 us per all-HBM T=1 layer), 12 and 16 are slower (47.4, 55.8; BENCHMARKS.md).
    t1_unroll1: int = 8
    t1_unroll2: int = 8
    # Register cap of the T = 1 warp-MMA launches (0: the compiler's choice). A T = 1 step has
    # fewer programs than two per SM hold (DeepSeek-V4.1: 216 / 240 on 132 SMs), so two programs of
    # two warpgroups must share an SM's 65,536 registers: 128 each. Given the cap, ptxas also keeps
    # w2's weight loads further ahead of their use (it took 100 registers unasked and issued some
    # loads 4 MMAs before their first use; at 128, 12 or more): on an H100 the 8-layer T = 1 step
    # took 0.97-1.00x the uncapped one's time in four runs (BENCHMARKS.md, run TP). The same bits.
    t1_max_registers: int = 128
    # T = 1 with the fused finalize and equal warpgroup counts: the layer in one launch
    # (``kernels_t1.t1_fused_kernel``: the w13 items, then the w2 items, each pick's w2 tiles waiting
    # on a count its w13 tiles raise), on as many programs as the GPU holds at once
    # (``tile_rules.t1_fused_programs``; needs t1_max_registers). Meant to take off the second
    # launch's hand-off and ramp, part of the ~13.5 us per layer that does not shrink with the bytes
    # (BENCHMARKS.md, run TP). The separate launches' arithmetic, so their bits (GPU test passed on
    # an H100). Off: 1.10-1.12x slower than the separate launches on an H100, with or without its
    # wait (run OL: each w2 item is bound to the program that ran a w13 item, where separate
    # launches let the hardware place w2's programs as SMs free). Not timed on an H200
    # (bench/pending_h200.sh t1fused).
    t1_fused: bool = False
    # Warp-MMA launches (T = 1 and grouped): 0 keeps four half-steps of weights in flight per
    # thread in registers (a ring); 2..4 hands the weight loads to Triton's software pipeline
    # instead, which copies them asynchronously into t1_smem_stages - 1 shared-memory stages of
    # t1_unroll* half-steps ahead of the MMAs (SASS, triton 3.6: LDGSTS, 2.4-2.5 instructions per
    # weight against the ring's 2.3; more bytes in flight per SM). The same MMAs in the same order:
    # the same bits (GPU test). On the H200 it is slower: 1.20-1.47x the ring's layer at T = 1 / 6 /
    # 16 (DeepSeek-V4.1; BENCHMARKS.md, run SP), so off.
    t1_smem_stages: int = 0
    # Grouped steps of 2..gw_max_tokens tokens (0: off) with an unsplit reduction, where the T = 1
    # warp-MMA kernels run: the two expert launches run their loops (``kernels_t1.w13_gw_kernel``
    # / ``w2_gw_kernel``: the same warpgroups, chains and loop trips) on up to eight picks of one
    # expert per program, one per column of the MMA's B operand, instead of ``tl.dot`` tiles (whose
    # K loop is 3.5 / 3.3 SASS instructions per weight against the warp-MMA loop's 2.6 / 2.7; they read
    # 64-row w13 tiles only, so block_n1=128 keeps tl.dot there).
    # Each pick's row then has the bits the T = 1 kernels give its token alone. On by default up
    # to 16 tokens since each program runs its slot's passes itself (gw_pass_loop): on the H200,
    # DeepSeek-V4.1 geometry, 0.94-0.95 / 0.96-0.97 of the tl.dot grouped step all-HBM at T = 6 /
    # 16 and 0.99 / 1.00 of the usage-aware step; at T = 96 1.01-1.02, so not above 16 (BENCHMARKS.md,
    # run GL; with a launch per possible pass, run GW, it had lengthened the usage-aware step). From 24
    # to 48 tokens 0.97-0.98 of tl.dot all-HBM but 1.02 on the usage-aware step (a pass of eight picks
    # reads a cold expert over the host link once per pass; run GT), so 16 stays. On Hopper (9.x) the
    # warp-specialized launches below take these steps from ws_min_tokens on (all of them by default).
    gw_max_tokens: int = 16
    # With gw_max_tokens: each program runs its slot's passes of eight picks in turn (a grid of
    # one pass) instead of one program per possible pass (a grid of ceil(T / 8) passes, most of
    # whose programs find their pass empty and return: 11 of 12 at T = 96). The loop keeps 178
    # registers live in w13 (one 256-thread program per SM); gw_max_registers (Triton's maxnreg,
    # 0: the compiler's choice) caps both launches, 128 leaving two per SM as without the loop
    # (SASS, triton 3.6: two spill instructions, outside the K loop).
    gw_pass_loop: bool = True
    gw_max_registers: int = 128
    # Geometries whose K tiles config_for_shape halves below 128 values (gpt-oss-120b: 2,880 = 45 x
    # 64): there the tl.dot grouped kernels' 64-value tiles read 60-63% of the HBM limit, the
    # grouped warp-MMA loop 73-77%, so config_for_shape raises gw_max_tokens to this (0: leaves it).
    # H200, gpt-oss-120b layer at T = 17 / 24 / 32 / 48: all-HBM 0.79 / 0.78 / 0.80 / 0.85 of the
    # tl.dot layer, usage-aware 0.94-1.00, positional 1.01-1.06 (BENCHMARKS.md, run GT).
    gw_max_tokens_small_tiles: int = 48
    # Grouped steps of ws_min_tokens tokens and more (unsplit, SiLU-GLU experts without biases, the
    # MMA-order layout's default tiles: w13 64 x 128, w2 128 x 128; CUDA compute capability 9.x and a
    # Triton with Gluon, else nothing changes): the two expert launches run warp-specialized and persistent
    # (``gpu.kernels_ws``: a loader warpgroup copies tiles into an mbarrier ring, one warpgroup
    # decodes and multiplies), ws_programs_per_sm programs per SM, taking those steps from both the
    # grouped warp-MMA kernels (which keep 2 .. ws_min_tokens - 1, none at the default) and tl.dot.
    # Each pick row is the same fp32 sum in the same order as tl.dot's (the same bits; from the
    # warp-MMA kernels' two chains ~1e-5 apart). H100, DeepSeek-V4.1, 8 layers: all-HBM 0.95 / 0.93 /
    # 0.92 / 0.94 of the grouped warp-MMA kernels' step at T = 2 / 3 / 4 / 5, usage-aware 0.98 / 0.96
    # / 0.98 / 0.99 (an earlier call had T = 2 at 1.03 usage-aware: within that step's noise); 0.93 /
    # 0.93 / 0.93 / 0.97 of the previous default's all-HBM step at T = 6 / 16 / 32 / 96, usage-aware
    # 0.94 / 0.88 / 0.78 / 0.77 (BENCHMARKS.md, run WS). 1 takes T = 1 wherever T = 1 is grouped:
    # with one_token off, or a step outside the small schedule (T = 1 otherwise runs ungrouped, on
    # the T = 1 kernels): 1.12x the T = 1 loops' layer on the H200 (run WH), so 2 stays.
    # ws_programs_per_sm (1..4) sets the launches' register cap too (tile_rules.ws_max_registers);
    # 0 takes it from the GPU's memory bandwidth per SM (tile_rules.ws_programs_for) on layers with
    # every expert in HBM: 4 on an H200, where two programs' instructions do not keep up with its
    # memory (0.94-0.97x the all-HBM step at T = 2-96, 84-89% of the HBM read at 16-96: run SH), 2 on
    # an H100 (four were 1.01-1.06x: run OC); and 2 on split layers, whose step the host link sets
    # (four were 1.01-1.03x the usage-aware step at T = 2 / 16 / 32 / 96 on the H200, in two calls).
    ws_grouped: bool = True
    ws_min_tokens: int = 2
    ws_programs_per_sm: int = 0
    # The warp-specialized launches read each item's slot rows, expert and pick ids an item ahead
    # (``kernels_ws._slot_of``), so those global reads' latency passes behind the previous item's
    # K steps instead of stalling both partitions at every item's start. The same copies and
    # products: the same bits.
    ws_prefetch: bool = False
    # Warps of the loader partition of the w13 and of the w2 launch (1, 2 or 4): with one, its copies
    # need no barrier among loader warps (Triton puts two per K step between them). H200, four
    # programs per SM, each GEMM alone: w13 88-89% of the HBM read with one loader warp against
    # 86-87% with four at T = 16-96, w2 86-87% either way; but on an H100 at two programs per SM one
    # loader warp made the layer 1.03-1.06x slower at T = 2-96 (run SH), so 4 stays.
    ws_loader_warps1: int = 4
    ws_loader_warps2: int = 4
    # On a split layer (cold slots grouped first): this many of the persistent programs walk the
    # cold experts' items and the rest the hot ones, so the hot reads stream beside the host link's
    # (a few programs keep the link busy). With every program taking items a fixed stride apart each
    # started on a cold expert and the usage-aware step lost 1-8%; 4 / 8 / 16 / 32 / 64 cold programs:
    # 8 best at T = 17 / 32 / 96 (run WS).
    ws_cold_programs: int = 8

    def __post_init__(self) -> None:
        for name in ("max_registers", "max_registers_large", "gw_max_registers", "t1_max_registers"):
            cap = getattr(self, name)
            if cap and not 32 <= cap <= 255:   # ptxas' range for .maxnreg
                raise ValueError(f"{name} {cap} is not 0 (the compiler's choice) or 32..255 registers")
        if self.ws_min_tokens < 1:
            raise ValueError(f"ws_min_tokens {self.ws_min_tokens} is not a token count of 1 or more (1 takes "
                             "T = 1 only where T = 1 is grouped, as with one_token off)")
        if not 0 <= self.ws_programs_per_sm <= WS_MAX_PROGRAMS_PER_SM:
            raise ValueError(f"ws_programs_per_sm {self.ws_programs_per_sm}: the persistent grid needs at least "
                             f"one program per SM, and an SM holds at most {WS_MAX_PROGRAMS_PER_SM} (registers and "
                             "shared memory); 0 takes the count from the GPU's memory bandwidth per SM")
        for name in ("ws_loader_warps1", "ws_loader_warps2"):
            if getattr(self, name) not in (1, 2, 4):
                raise ValueError(f"{name} {getattr(self, name)} is not 1, 2 or 4 loader warps")
        if self.t1_fused and not self.t1_max_registers:
            raise ValueError("t1_fused needs t1_max_registers (the register cap sets how many programs the GPU "
                             "holds at once; 0 leaves it to the compiler)")
        if self.ws_cold_programs < 0:
            raise ValueError(f"ws_cold_programs {self.ws_cold_programs} is not a count of programs (0: every "
                             "program walks every item)")

    def describe(self) -> str:
        kind = {0: "int-dequant", 1: "dot_scaled", 2: "prmt-dequant", 3: "mma-order"}.get(
            self.dequant, f"dequant{self.dequant}")
        kind += " tile-major" if self.tile_major else " row-major"
        text = (f"{kind} BM{self.block_m} w13:BN{self.block_n1}xBK{self.block_k1} "
                f"w2:BN{self.block_n2}xBK{self.block_k2} warps{self.num_warps} stages{self.num_stages}")
        if self.num_stages_large is not None and self.num_stages_large != self.num_stages:
            text += f"/{self.num_stages_large}"
        if self.max_registers or self.max_registers_large:
            text += f" maxregs{self.max_registers or '-'}/{self.max_registers_large or '-'}"
        if self.split_k1 > 1 or self.split_k2 > 1:
            text += f" splitK{self.split_k1}/{self.split_k2}@T<={self.small_tokens}"
        if self.one_token:
            text += " T1-ungrouped"
            if self.fuse_finalize:
                text += "+fused-finalize"
            if self.stream_k1 or self.stream_k2:
                text += f" T1-streamK{self.stream_k1}/{self.stream_k2}"
            elif self.t1_warp_mma:
                text += (f" T1-warp-mma{self.t1_warpgroups1}/{self.t1_warpgroups2}"
                         f"x{self.t1_chains1}/{self.t1_chains2}")
                text += f" unroll{self.t1_unroll1}/{self.t1_unroll2}"
                if self.t1_max_registers:
                    text += f" regs<={self.t1_max_registers}"
                if self.t1_fused and self.fuse_finalize:
                    text += " one-launch"
                if self.t1_smem_stages:
                    text += f" smem-stages{self.t1_smem_stages}"
                if self.gw_max_tokens >= 2:
                    text += f" warp-mma-grouped@2..{self.gw_max_tokens}"
                    if not self.gw_pass_loop:
                        text += "(pass-grid)"
                    if self.gw_max_registers:
                        text += f"(regs<={self.gw_max_registers})"
        if self.ws_grouped:
            # compute capability 9.x with Gluon only, where it takes these steps from the warp-MMA
            # grouped kernels
            per_sm = self.ws_programs_per_sm or "2|4"   # 0: by the GPU's memory bandwidth per SM
            text += (f" warp-specialized-grouped@>={self.ws_min_tokens}(sm9x)x{per_sm}/SM"
                     f"(cold-programs{self.ws_cold_programs})")
            if self.ws_prefetch:
                text += "+prefetch"
            if (self.ws_loader_warps1, self.ws_loader_warps2) != (4, 4):
                text += f"(loader-warps{self.ws_loader_warps1}/{self.ws_loader_warps2})"
        if not self.cold_first:    # the default (cold experts' slots first) goes unsaid
            text += " id-order-slots"
        if self.pdl:
            text += " pdl"
        return text

    def small_step_limit(self) -> int:
        """Largest T that runs the small-step schedule (a slot then fits one BM tile)."""
        return sizing.small_step_limit(self.small_tokens, self.block_m)

    def tl_dot_launch(self, small: bool) -> dict:
        """Launch options of the tl.dot expert kernels for a small (``T <= small_step_limit()``) or
        a large step: warps, pipeline stages and the register cap."""
        stages = self.num_stages if small or self.num_stages_large is None else self.num_stages_large
        cap = self.max_registers if small else self.max_registers_large
        options = dict(num_warps=self.num_warps, num_stages=stages)
        if cap:
            options["maxnreg"] = cap
        return options


@dataclass(frozen=True)
class ExpertShape:
    hidden: int
    intermediate: int

    @property
    def bytes_per_expert(self) -> int:
        """Packed values plus ue8m0 scales of w13 and w2."""
        h, i = self.hidden, self.intermediate
        return 2 * i * (h // 2 + h // 32) + h * (i // 2 + i // 32)


def expert_shape_of(bank: ExpertBank) -> ExpertShape:
    w13, w2 = bank[W13], bank[W2]
    if w13.dtype != torch.uint8 or w2.dtype != torch.uint8:
        raise TypeError(f"Triton experts read MXFP4 packed uint8 weights, got {w13.dtype}/{w2.dtype}")
    shape = ExpertShape(hidden=w13.shape[2] * 2, intermediate=w13.shape[1] // 2)
    expected = {
        W13: (2 * shape.intermediate, shape.hidden // 2),
        W13 + SCALE_SUFFIX: (2 * shape.intermediate, shape.hidden // 32),
        W2: (shape.hidden, shape.intermediate // 2),
        W2 + SCALE_SUFFIX: (shape.hidden, shape.intermediate // 32),
    }
    for name, dims in expected.items():
        if name not in bank.tensors:
            raise ValueError(f"bank has no {name!r} tensor (has {sorted(bank.tensors)})")
        t = bank.tensors[name]
        if tuple(t.shape[1:]) != dims or not t.is_contiguous():
            raise ValueError(f"{name}: expected contiguous [rows, {dims[0]}, {dims[1]}], got {tuple(t.shape)}")
    for name, n in (("w13_bias", 2 * shape.intermediate), ("w2_bias", shape.hidden)):
        if name in bank.tensors and (tuple(bank[name].shape[1:]) != (n,) or not bank[name].is_contiguous()):
            raise ValueError(f"{name}: expected contiguous [rows, {n}], got {tuple(bank[name].shape)}")
    if ("w13_bias" in bank.tensors) != ("w2_bias" in bank.tensors):
        raise ValueError("w13_bias and w2_bias come together (one is missing)")
    return shape


class Workspace:
    """Per-step scratch for up to ``max_tokens`` tokens of ``top_k`` picks (shared across layers)."""

    def __init__(self, max_tokens: int, top_k: int, shape: ExpertShape, device: torch.device | str,
                 act_dtype: torch.dtype = torch.bfloat16) -> None:
        self.max_tokens, self.top_k, self.shape = max_tokens, top_k, shape
        picks = max_tokens * top_k
        pb = triton.next_power_of_2(max(picks, 2))
        dev = torch.device(device)
        i32 = dict(dtype=torch.int32, device=dev)
        self.sorted_pick = torch.zeros(pb, **i32)
        self.scratch = torch.zeros(pb, **i32)
        self.slot_start = torch.zeros(picks + 1, **i32)
        self.slot_expert = torch.zeros(max(picks, 1), **i32)
        self.num_slots = torch.zeros(1, **i32)
        self.n_tokens = torch.zeros(1, **i32)
        # Zeroed, not empty: rows of masked (padded) tokens are never written, and the finalize
        # reads them; they must hold finite numbers (zeros, or a previous step's rows).
        self.act = torch.zeros(picks, shape.intermediate, dtype=act_dtype, device=dev)
        self.pick_out = torch.zeros(picks, shape.hidden, dtype=act_dtype, device=dev)
        self.dummy_i64 = torch.zeros(1, dtype=torch.int64, device=dev)

    @staticmethod
    def bytes_for(max_tokens: int, top_k: int, shape: ExpertShape, act_bytes: int = 2) -> int:
        """Device bytes of one workspace (``contract.sizing.workspace_bytes``)."""
        return sizing.workspace_bytes(max_tokens, top_k, shape.hidden, shape.intermediate, act_bytes)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in vars(self).values()
                   if isinstance(t, torch.Tensor))


class SplitScratch:
    """Split-K scratch of the small-step schedule (``KernelConfig.small_tokens``): fp32 partials
    ``[split, picks, 2I]`` (w13) and ``[split, picks, H]`` (w2) for the picks of the largest small
    step, and one int32 ticket per (slot, row tile) and kernel (zero between launches: the last
    split of a tile resets it)."""

    def __init__(self, max_tokens: int, top_k: int, shape: ExpertShape, config: KernelConfig,
                 device: torch.device | str) -> None:
        dev = torch.device(device)
        tokens = min(max_tokens, config.small_step_limit())
        self.picks = picks = max(tokens * top_k, 1)
        s1, s2 = effective_splits(shape, config)
        self.part13 = torch.empty(s1 if s1 > 1 else 0, picks, 2 * shape.intermediate, dtype=torch.float32,
                                  device=dev)
        self.part2 = torch.empty(s2 if s2 > 1 else 0, picks, shape.hidden, dtype=torch.float32, device=dev)
        self.tickets13 = torch.zeros(picks * (shape.intermediate // config.block_n1), dtype=torch.int32,
                                     device=dev)
        self.tickets2 = torch.zeros(picks * (shape.hidden // config.block_n2), dtype=torch.int32, device=dev)
        # T = 1 stream-K: per program two (first/last piece) fp32 partials; w2's own tickets
        # (tickets2 holds the fused finalize's); w13 uses tickets13.
        k = top_k if config.one_token else 0
        self.stream13 = torch.empty(config.stream_k1 * 4 * config.block_n1 if k else 0,
                                    dtype=torch.float32, device=dev)
        self.stream2 = torch.empty(config.stream_k2 * 2 * config.block_n2 if k else 0,
                                   dtype=torch.float32, device=dev)
        self.stream_tickets2 = torch.zeros(k * (shape.hidden // config.block_n2) if config.stream_k2 else 0,
                                           dtype=torch.int32, device=dev)
        # The one-launch T = 1 layer's per-pick counts (t1_fused): w13 tiles stored, w2 tiles past
        # their wait; zero between launches (the last w2 tile of a pick resets both).
        self.t1_ready = torch.zeros(2 * k if config.t1_fused else 0, dtype=torch.int32, device=dev)

    @staticmethod
    def bytes_for(max_tokens: int, top_k: int, shape: ExpertShape, config: KernelConfig) -> int:
        """Device bytes of one split scratch (``contract.sizing.split_scratch_bytes``)."""
        return sizing.split_scratch_bytes(
            max_tokens, top_k, shape.hidden, shape.intermediate, block_n1=config.block_n1,
            block_n2=config.block_n2, small_tokens=config.small_tokens, block_m=config.block_m,
            splits=effective_splits(shape, config), one_token=config.one_token,
            stream_k1=config.stream_k1, stream_k2=config.stream_k2)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in vars(self).values()
                   if isinstance(t, torch.Tensor))


def effective_splits(shape: ExpertShape, config: KernelConfig) -> tuple[int, int]:
    """(w13, w2) K splits of a small step: the config's, at most one K step per split."""
    return (max(1, min(config.split_k1, shape.hidden // config.block_k1)),
            max(1, min(config.split_k2, shape.intermediate // config.block_k2)))


def t1_warpgroups(shape: ExpertShape, config: KernelConfig) -> tuple[int, int] | None:
    """Warpgroups per program of the T = 1 warp-MMA kernels (``gpu.kernels_t1``) for w13 and w2
    (0: that launch through tl.dot), or None where the config does not take them: off, a split or
    stream-K T = 1 schedule, not the MMA-order layout with 64/128-row w13 and w2 tiles.
    Each count is the largest power of two up to the configured one (at most 8) that divides the
    reduction's 64-value half-steps (gpt-oss's 2,880 = 45 x 64 takes one)."""
    for name in ("t1_chains1", "t1_chains2"):
        if getattr(config, name) not in (1, 2, 4):
            raise ValueError(f"{name} {getattr(config, name)} is not 1, 2 or 4")
    for name in ("t1_unroll1", "t1_unroll2"):
        if getattr(config, name) not in (4, 8, 12, 16, 20):
            raise ValueError(f"{name} {getattr(config, name)} is not 4, 8, 12, 16 or 20 half-steps per trip")
    if config.t1_smem_stages not in (0, 2, 3, 4):
        raise ValueError(f"t1_smem_stages {config.t1_smem_stages} is not 0 (registers), 2, 3 or 4 stages")
    if not (config.t1_warp_mma and config.one_token and is_mma_order(config)
            and config.block_n1 in (64, 128) and config.block_n2 in (64, 128)
            and not (config.stream_k1 or config.stream_k2) and effective_splits(shape, config) == (1, 1)):
        return None

    def groups(halves: int, most: int) -> int:   # a power of two (the kernel's thread ranges)
        return max((g for g in (1, 2, 4, 8) if g <= most and halves % g == 0), default=0)

    g1, g2 = groups(shape.hidden // 64, config.t1_warpgroups1), groups(shape.intermediate // 64, config.t1_warpgroups2)
    for name, g, unroll, streams in (("w13", g1, config.t1_unroll1, 2), ("w2", g2, config.t1_unroll2,
                                                                           config.block_n2 // 64)):
        need = warp_mma_shared_bytes(config.t1_smem_stages, unroll, g, streams)
        if need > MAX_SHARED_BYTES:
            raise ValueError(f"t1_smem_stages {config.t1_smem_stages} with t1_unroll {unroll} needs {need:,} bytes "
                             f"of shared memory per {name} program ({g} warpgroups); an SM90 program may use "
                             f"{MAX_SHARED_BYTES:,}")
    return g1, g2


# Shared memory one program may use on the SM90 family (227 KiB).
MAX_SHARED_BYTES = 227 * 1024


def warp_mma_shared_bytes(stages: int, unroll: int, warpgroups: int, streams: int) -> int:
    """Shared memory of a warp-MMA launch with ``t1_smem_stages`` (0: none): Triton keeps
    ``stages - 1`` buffers of ``unroll`` half-steps, each half-step 16 weight bytes and a 4-byte
    scale word per thread and stream (SASS of triton 3.6: 40,960 / 61,440 bytes at 3 / 4 stages of
    4 half-steps, one warpgroup, two streams)."""
    return max(stages - 1, 0) * unroll * 128 * warpgroups * 20 * streams


WS_TILES = (64, 128, 128, 128)  # (block_n1, block_k1, block_n2, block_k2) gpu.kernels_ws reads


def runs_warp_specialized(device: torch.device, config: KernelConfig) -> bool:
    """Whether ``config.ws_grouped``'s kernels (``gpu.kernels_ws``) run on ``device``: Gluon
    importable, compiled CUDA of compute capability 9.x (Hopper: warp specialization needs 9.0+, and
    only Hopper was measured), the MMA-order layout with the tiles those kernels read. Steps they
    cannot take keep the other kernels."""
    return (config.ws_grouped and kernels_ws is not None and runs_warp_mma(device)
            and torch.cuda.get_device_capability(device)[0] == 9 and is_mma_order(config)
            and (config.block_n1, config.block_k1, config.block_n2, config.block_k2) == WS_TILES)


def runs_warp_mma(device: torch.device) -> bool:
    """Whether the T = 1 warp-MMA kernels can run on ``device``: compiled (inline PTX does not run
    under TRITON_INTERPRET=1) CUDA of compute capability 8.0+ (``mma.sync`` bf16)."""
    return (os.environ.get("TRITON_INTERPRET", "0") != "1" and device.type == "cuda"
            and torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] >= 8)


def config_for_shape(shape: ExpertShape, config: KernelConfig = KernelConfig()) -> KernelConfig:
    """``config`` with each tile dim halved until it divides its matrix dim (down to 64 for the
    MMA-order layout, 32 otherwise): gpt-oss's 2,880 = 45 x 64 takes 64-wide tiles where the
    defaults are 128, and with halved K tiles the grouped warp-MMA loop runs up to
    ``gw_max_tokens_small_tiles`` tokens. ValueError when no such tile exists."""
    floor = sizing.MMA_ORDER_TILE_FLOOR if is_mma_order(config) else 32
    fields = {"block_n1": shape.intermediate, "block_k1": shape.hidden,
              "block_n2": shape.hidden, "block_k2": shape.intermediate}
    fitted = {}
    for name, dim in fields.items():
        tile = sizing.fitted_tile(getattr(config, name), dim, floor)
        if dim % tile:
            raise ValueError(f"{name}: no tile of >= {floor} divides {dim} ({shape})")
        fitted[name] = tile
    if fitted["block_k1"] < config.block_k1 and config.gw_max_tokens >= 2:
        fitted["gw_max_tokens"] = max(config.gw_max_tokens, config.gw_max_tokens_small_tiles)
    return dataclasses.replace(config, **fitted)


class TritonMxfp4Experts:
    """Launches the residency kernels for layers of one geometry (see the module docstring)."""

    def __init__(self, shape: ExpertShape, num_experts: int, top_k: int, max_tokens: int,
                 device: torch.device | str, config: KernelConfig = KernelConfig(), *,
                 swiglu_limit: float | None = None, activation: str = "silu",
                 swiglu_alpha: float | None = None) -> None:
        """``swiglu_limit``: vLLM's SwiGLU clamp of the layers (``silu(min(gate, L)) *
        clamp(up, -L, L)``, as ``core.reference``); None computes the unclamped kernel as before.
        ``activation="swigluoai"``: gpt-oss's experts as vLLM 0.33 computes them
        (``core.formats_ref.gptoss_mxfp4_per_pick``): gate/up rows interleaved in the checkpoint
        (``to_kernel_layout`` puts them gate-first), ``(clamp(up, -L, L) + 1) * gate *
        sigmoid(alpha * gate)`` with ``gate = min(g, L)``, limit 7.0 and alpha 1.702 unless given.
        Expert biases (``w13_bias [rows, 2I]``, ``w2_bias [rows, H]``, any float dtype, read as
        fp32) are used whenever the banks hold them, with either activation."""
        if shape.hidden % config.block_k1 or shape.intermediate % config.block_k2:
            raise ValueError(f"block_k must divide the reduction dims ({shape}, {config})")
        if shape.intermediate % config.block_n1 or shape.hidden % config.block_n2:
            raise ValueError(f"block_n must divide the output dims ({shape}, {config})")
        if is_mma_order(config):
            check_mma_tiles(config.block_n1, config.block_k1)
            check_mma_tiles(config.block_n2, config.block_k2)
        # block_m < 16 gives wrong outputs compiled (measured on the H200; gpu/tile_rules.py).
        check_compiled_block_m(config, device)
        self.shape, self.num_experts, self.top_k = shape, num_experts, top_k
        self.config = config
        if activation == SWIGLUOAI:   # gpt-oss: limit 7.0, alpha 1.702 unless given
            self.swiglu_limit = (GPTOSS_SWIGLU_LIMIT if swiglu_limit is None
                                 else check_swiglu_limit(swiglu_limit))
            self.swiglu_alpha = GPTOSS_SWIGLU_ALPHA if swiglu_alpha is None else float(swiglu_alpha)
        elif activation == "silu" and swiglu_alpha is None:
            self.swiglu_limit, self.swiglu_alpha = check_swiglu_limit(swiglu_limit), 1.0
        else:
            raise ValueError(f"activation {activation!r} (swiglu_alpha {swiglu_alpha!r}) is not "
                             f"'silu' (no alpha) or 'swigluoai'")
        self.activation = activation
        self._dummy_f32 = torch.zeros(1, dtype=torch.float32, device=device)
        self.device = torch.device(device)
        self.workspace = Workspace(max_tokens, top_k, shape, self.device)
        self.split_scratch = SplitScratch(max_tokens, top_k, shape, config, self.device)
        self._identity_codes: torch.Tensor | None = None
        self._pdl = bool(config.pdl and self.device.type == "cuda" and torch.cuda.is_available()
                         and torch.cuda.get_device_capability(self.device)[0] >= 9)
        groups = t1_warpgroups(shape, config)
        self._t1_groups = groups if groups is not None and runs_warp_mma(self.device) else None
        self._ws = runs_warp_specialized(self.device, config)
        self._ws_compiled: set = set()

    def to_kernel_layout(self, tensors: dict[str, torch.Tensor]) -> None:
        """Re-order a layer's full expert tensors for these kernels (in place; ``gpu.layout``).
        Call once per layer before re-homing it into banks. SwiGLU-OAI layers' interleaved gate/up
        rows (and their scales and bias) are put gate-first first."""
        if self.activation == SWIGLUOAI:
            deinterleave_gate_up(tensors)
        to_kernel_layout(tensors, self.config)

    # -- the fused split layer -------------------------------------------------------------
    def forward(self, layer: ResidentLayer, x: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, *, counter: ExpertCounter | None = None,
                token_mask: torch.Tensor | None = None, decode_mask: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """Routed-expert output ``[T, H]`` (dtype of ``x``) of ``layer`` for ``x [T, H]`` bf16.

        ``token_mask [T]`` (nonzero = real token): masked tokens are neither computed nor counted;
        their output rows are unspecified (finite). ``decode_mask [T]`` (bool, real decode tokens
        only) adds the step's decode tokens to ``counter`` (one reduction, fixed shape)."""
        if self._fuses_finalize(topk_ids.shape[0]):
            if topk_weights.shape != topk_ids.shape:
                raise ValueError(f"topk_weights {tuple(topk_weights.shape)} do not match picks "
                                 f"{tuple(topk_ids.shape)}")
            if out is None:
                out = torch.empty(1, self.shape.hidden, dtype=x.dtype, device=x.device)
            self.pick_outputs(layer, x, topk_ids, counter=counter, token_mask=token_mask,
                              decode_mask=decode_mask, _finalize=(topk_weights.contiguous(), out))
            return out
        pick_out = self.pick_outputs(layer, x, topk_ids, counter=counter, token_mask=token_mask,
                                     decode_mask=decode_mask)
        return self.finalize(pick_out, topk_weights, out=out, out_dtype=x.dtype, topk_ids=topk_ids)

    def _fuses_finalize(self, tokens: int) -> bool:
        """T = 1 with the ungrouped schedule and an unsplit w2: finalize inside the w2 launch."""
        cfg = self.config
        return (tokens == 1 and cfg.fuse_finalize and cfg.one_token and cfg.small_step_limit() >= 1
                and self.top_k <= MAX_FUSED_PICKS and effective_splits(self.shape, cfg)[1] == 1)

    def pick_outputs(self, layer: ResidentLayer, x: torch.Tensor, topk_ids: torch.Tensor, *,
                     counter: ExpertCounter | None = None,
                     token_mask: torch.Tensor | None = None,
                     decode_mask: torch.Tensor | None = None,
                     _finalize: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Unreduced per-pick rows ``[T, K, H]`` bf16 (a view of the workspace: consume before the
        next call). ``_finalize`` (``forward`` at T=1): ``(topk_weights, out)`` for the fused
        finalize."""
        hot = layer.hot
        cold = layer.cold if layer.cold.num_rows else layer.hot
        counts = tokens = None
        if counter is not None:
            row = counter.row_of(layer.layer_index)
            counts, tokens = counter.counts[row], counter.tokens[row:row + 1]
            if decode_mask is None:
                counter._decode_known = False  # as ExpertCounter.count() without a decode mask
            else:
                counter.decode_tokens[row:row + 1].add_(decode_mask.sum())
        self._run(x, topk_ids, layer.row_codes, hot, cold, token_mask=token_mask,
                  counts=counts, tokens=tokens, fin=_finalize)
        t, k = topk_ids.shape
        return self.workspace.pick_out[:t * k].view(t, k, self.shape.hidden)

    def finalize(self, pick_out: torch.Tensor, topk_weights: torch.Tensor, *,
                 out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                 topk_ids: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 fma over the K pick rows in router order, one cast (== ``core.finalize``).
        ``topk_ids`` (``forward`` passes them): a pick whose id is outside ``0..E-1`` (-1 under
        expert parallelism) adds ``fma(0, 0, acc)`` instead of its row, as ``parallel.ep``."""
        t, k, h = pick_out.shape
        if topk_weights.shape != (t, k):
            raise ValueError(f"topk_weights {tuple(topk_weights.shape)} do not match picks {(t, k)}")
        if topk_ids is not None and topk_ids.shape != (t, k):
            raise ValueError(f"topk_ids {tuple(topk_ids.shape)} do not match picks {(t, k)}")
        if out is None:
            out = torch.empty(t, h, dtype=out_dtype, device=pick_out.device)
        bh = min(self.config.finalize_block, triton.next_power_of_2(h))
        ids = self.workspace.dummy_i64 if topk_ids is None else topk_ids.contiguous()
        kernels.finalize_kernel[(t, triton.cdiv(h, bh))](
            pick_out, topk_weights.contiguous(), out, ids, self.num_experts, H=h, TOP_K=k, BH=bh,
            HAS_IDS=topk_ids is not None, num_warps=4, **self._pdl_args())
        return out

    # -- the core's per-pick contract -----------------------------------------------------
    def per_pick_fn(self):
        """A ``core.split.PerPickExpertFn`` running these kernels on one bank at a time."""

        def per_pick(hidden_states: torch.Tensor, bank: ExpertBank, rows: torch.Tensor,
                     mask: torch.Tensor, out: torch.Tensor) -> None:
            ids = torch.where(mask, rows, torch.full_like(rows, -1))
            codes = self._identity(bank.num_rows)
            self._run(hidden_states, ids, codes, bank, bank, token_mask=None, counts=None, tokens=None)
            t, k = rows.shape
            picks = self.workspace.pick_out[:t * k].view(t, k, self.shape.hidden)
            out.copy_(torch.where(mask.unsqueeze(-1), picks.to(out.dtype), out))

        return per_pick

    def _identity(self, rows: int) -> torch.Tensor:
        if self._identity_codes is None or self._identity_codes.numel() < rows:
            self._identity_codes = torch.arange(max(rows, self.num_experts), dtype=torch.int32,
                                                device=self.device)
        return self._identity_codes

    # -- launches ----------------------------------------------------------------------------
    def _pdl_args(self) -> dict:
        return dict(PDL=True, launch_pdl=True) if self._pdl else {}

    def _run(self, x: torch.Tensor, ids: torch.Tensor, codes: torch.Tensor, hot: ExpertBank,
             cold: ExpertBank, *, token_mask: torch.Tensor | None, counts: torch.Tensor | None,
             tokens: torch.Tensor | None,
             fin: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        cfg, ws, shape = self.config, self.workspace, self.shape
        t, k = ids.shape
        self._check_step(x, ids, hot, cold)
        picks = t * k
        ids = ids.reshape(-1)
        if not ids.is_contiguous():
            ids = ids.contiguous()
        small = t <= cfg.small_step_limit() and picks <= MAX_FUSED_PICKS
        one_token = small and t == 1 and cfg.one_token
        s1, s2 = effective_splits(shape, cfg) if small else (1, 1)
        launch = cfg.tl_dot_launch(small)
        count_in_kernel = counts is not None
        if fin is not None and not (one_token and s2 == 1):
            raise RuntimeError("the fused finalize needs the T=1 ungrouped schedule with an unsplit w2")
        if one_token:
            max_slots = picks
        else:
            count_in_kernel, max_slots = self._group(ids, t, k, token_mask, counts, tokens, codes,
                                                     split=cold is not hot)
        sc = self.split_scratch
        mask_arg = token_mask if token_mask is not None else ws.scratch
        # Constexprs that only the small schedule reads stay fixed otherwise (no extra variants).
        small_args = dict(ONE_TOKEN=one_token, HAS_TOKEN_MASK=one_token and token_mask is not None,
                          PART_PICKS=sc.picks if s1 > 1 or s2 > 1 else 1)
        has_bias = "w13_bias" in hot.tensors
        if has_bias != ("w13_bias" in cold.tensors):
            raise ValueError("hot and cold banks disagree on expert biases")
        b13 = (hot["w13_bias"], cold["w13_bias"]) if has_bias else (self._dummy_f32,) * 2
        b2 = (hot["w2_bias"], cold["w2_bias"]) if has_bias else (self._dummy_f32,) * 2
        w13, s13 = hot[W13], hot[W13 + SCALE_SUFFIX]
        w2, s2w = hot[W2], hot[W2 + SCALE_SUFFIX]
        # at most one program per work unit (every share non-empty)
        stream1 = min(cfg.stream_k1, k * shape.hidden // cfg.block_k1 * (shape.intermediate // cfg.block_n1)
                      ) if one_token and s1 == 1 else 0
        stream2 = min(cfg.stream_k2, k * shape.intermediate // cfg.block_k2 * (shape.hidden // cfg.block_n2)
                      ) if one_token and s2 == 1 else 0
        act_args = dict(SWIGLU_LIMIT=0.0 if self.swiglu_limit is None else self.swiglu_limit,
                        HAS_BIAS=has_bias, ACT=1 if self.activation == SWIGLUOAI else 0,
                        ALPHA=float(self.swiglu_alpha))
        g1 = g2 = gw1 = gw2 = 0
        if one_token and self._t1_groups is not None and x.data_ptr() % 4 == 0:
            g1, g2 = self._t1_groups
        elif (not one_token and 2 <= t <= self._gw_max_tokens() and s1 == 1 and s2 == 1 and self._t1_groups is not None
              and cfg.block_n1 == 64 and x.data_ptr() % 4 == 0 and x.stride(0) % 2 == 0):
            gw1, gw2 = self._t1_groups
        # the warp-specialized launches take the grouped steps tl.dot would (unsplit, no biases, SiLU)
        ws_step = (self._ws and not one_token and not gw1 and t >= cfg.ws_min_tokens and s1 == 1 and s2 == 1
                   and not has_bias
                   and self.activation != SWIGLUOAI and x.stride(0) == shape.hidden and x.data_ptr() % 16 == 0)
        # a slot holds at most T picks (a token picks an expert once)
        passes = 1 if cfg.gw_pass_loop else triton.cdiv(t, 8)
        gw_cap = dict(maxnreg=cfg.gw_max_registers) if cfg.gw_max_registers else {}
        t1_cap = dict(maxnreg=cfg.t1_max_registers) if cfg.t1_max_registers else {}
        if g1 and g1 == g2 and fin is not None and cfg.t1_fused and not cfg.t1_smem_stages:
            nt13, nt2 = shape.intermediate // 64, shape.hidden // cfg.block_n2
            fa = self._fused_finalize_args(fin, ws)
            kernels_t1.t1_fused_kernel[(self._t1_fused_programs(g1, k * max(nt13, nt2)),)](
                x, codes, w13, s13, cold[W13], cold[W13 + SCALE_SUFFIX], w2, s2w, cold[W2], cold[W2 + SCALE_SUFFIX],
                ws.act, ws.pick_out, counts if count_in_kernel else ws.dummy_i64,
                tokens if count_in_kernel else ws.dummy_i64, w13.stride(0), s13.stride(0), w2.stride(0),
                s2w.stride(0), ids, mask_arg, self.num_experts, b13[0], b13[1],
                b13[0].stride(0) if has_bias else 0, b2[0], b2[1], b2[0].stride(0) if has_bias else 0,
                fa["weights_ptr"], fa["out_ptr"], fa["fin_ticket_ptr"], sc.t1_ready[:k], sc.t1_ready[k:],
                H=shape.hidden, INTER=shape.intermediate, TOP_K=k, BK1=cfg.block_k1, BN2=cfg.block_n2,
                BK2=cfg.block_k2, KSPLIT=g1, CHAINS1=cfg.t1_chains1, CHAINS2=cfg.t1_chains2, COUNT=count_in_kernel,
                HAS_TOKEN_MASK=token_mask is not None, UNROLL1=cfg.t1_unroll1, UNROLL2=cfg.t1_unroll2,
                BN1=cfg.block_n1, **act_args, num_warps=4 * g1, num_stages=1, **t1_cap, **self._pdl_args())
            return
        if g1:
            kernels_t1.w13_t1_kernel[(shape.intermediate // 64, k)](
                x, codes, w13, s13, cold[W13], cold[W13 + SCALE_SUFFIX], ws.act,
                counts if count_in_kernel else ws.dummy_i64, tokens if count_in_kernel else ws.dummy_i64,
                w13.stride(0), s13.stride(0), ids, mask_arg, self.num_experts,
                b13[0], b13[1], b13[0].stride(0) if has_bias else 0,
                H=shape.hidden, INTER=shape.intermediate, TOP_K=k, BK=cfg.block_k1, KSPLIT=g1,
                COUNT=count_in_kernel, CHAINS=cfg.t1_chains1,
                HAS_TOKEN_MASK=token_mask is not None, UNROLL=cfg.t1_unroll1, BN1=cfg.block_n1,
                SMEM_STAGES=cfg.t1_smem_stages, **act_args, num_warps=4 * g1, num_stages=1,
                **t1_cap, **self._pdl_args())
        elif gw1:
            kernels_t1.w13_gw_kernel[(shape.intermediate // 64, max_slots, passes)](
                x, codes, w13, s13, cold[W13], cold[W13 + SCALE_SUFFIX],
                ws.sorted_pick, ws.slot_start, ws.slot_expert, ws.num_slots, ws.act,
                counts if count_in_kernel else ws.dummy_i64, tokens if count_in_kernel else ws.dummy_i64,
                ws.n_tokens, x.stride(0), w13.stride(0), s13.stride(0),
                b13[0], b13[1], b13[0].stride(0) if has_bias else 0,
                H=shape.hidden, INTER=shape.intermediate, TOP_K=k, BK=cfg.block_k1, KSPLIT=gw1,
                COUNT=count_in_kernel, CHAINS=cfg.t1_chains1, UNROLL=cfg.t1_unroll1,
                **act_args, PASS_LOOP=cfg.gw_pass_loop, SMEM_STAGES=cfg.t1_smem_stages,
                num_warps=4 * gw1, num_stages=1, **gw_cap, **self._pdl_args())
        elif ws_step and self._launch_ws("w13", x, codes, hot, cold, max_slots, ws.act, count_in_kernel, counts,
                                         tokens):
            pass
        elif stream1:
            kernels.w13_stream_kernel[(stream1,)](
                x, codes, w13, s13, cold[W13], cold[W13 + SCALE_SUFFIX], ws.act,
                counts if count_in_kernel else ws.dummy_i64, tokens if count_in_kernel else ws.dummy_i64,
                w13.stride(0), s13.stride(0), ids, mask_arg, sc.stream13, sc.tickets13, self.num_experts,
                b13[0], b13[1], b13[0].stride(0) if has_bias else 0,
                H=shape.hidden, INTER=shape.intermediate, TOP_K=k, BM=cfg.block_m, BN=cfg.block_n1,
                BK=cfg.block_k1, DEQUANT=cfg.dequant, TILE_MAJOR=cfg.tile_major, COUNT=count_in_kernel,
                PROGRAMS=stream1, HAS_TOKEN_MASK=token_mask is not None, **act_args,
                **launch, **self._pdl_args())
        else:
            kernels.w13_swiglu_kernel[(shape.intermediate // cfg.block_n1, max_slots, s1)](
                x, codes, w13, s13, cold[W13], cold[W13 + SCALE_SUFFIX],
                ws.sorted_pick, ws.slot_start, ws.slot_expert, ws.num_slots, ws.act,
                counts if count_in_kernel else ws.dummy_i64, tokens if count_in_kernel else ws.dummy_i64,
                ws.n_tokens, x.stride(0), w13.stride(0), s13.stride(0),
                ids, mask_arg, sc.part13 if s1 > 1 else ws.dummy_i64, sc.tickets13, self.num_experts,
                b13[0], b13[1], b13[0].stride(0) if has_bias else 0,
                H=shape.hidden, INTER=shape.intermediate, TOP_K=k,
                BM=cfg.block_m, BN=cfg.block_n1, BK=cfg.block_k1, DEQUANT=cfg.dequant,
                TILE_MAJOR=cfg.tile_major, COUNT=count_in_kernel,
                SWIGLU_LIMIT=0.0 if self.swiglu_limit is None else self.swiglu_limit,
                SPLIT=s1, **small_args, HAS_BIAS=has_bias, ACT=1 if self.activation == SWIGLUOAI else 0,
                ALPHA=float(self.swiglu_alpha), **launch,
                **self._pdl_args())
        if g2:
            kernels_t1.w2_t1_kernel[(shape.hidden // cfg.block_n2, k)](
                ws.act, codes, w2, s2w, cold[W2], cold[W2 + SCALE_SUFFIX], ws.pick_out,
                w2.stride(0), s2w.stride(0), ids, mask_arg, self.num_experts,
                b2[0], b2[1], b2[0].stride(0) if has_bias else 0, **self._fused_finalize_args(fin, ws),
                H=shape.hidden, INTER=shape.intermediate, TOP_K=k, BN=cfg.block_n2, BK=cfg.block_k2,
                KSPLIT=g2, CHAINS=cfg.t1_chains2, HAS_TOKEN_MASK=token_mask is not None,
                HAS_BIAS=has_bias, UNROLL=cfg.t1_unroll2, SMEM_STAGES=cfg.t1_smem_stages,
                num_warps=4 * g2, num_stages=1, **t1_cap, **self._pdl_args())
        elif gw2:
            kernels_t1.w2_gw_kernel[(shape.hidden // cfg.block_n2, max_slots, passes)](
                ws.act, codes, w2, s2w, cold[W2], cold[W2 + SCALE_SUFFIX],
                ws.sorted_pick, ws.slot_start, ws.slot_expert, ws.num_slots, ws.pick_out,
                w2.stride(0), s2w.stride(0), b2[0], b2[1], b2[0].stride(0) if has_bias else 0,
                H=shape.hidden, INTER=shape.intermediate, BN=cfg.block_n2, BK=cfg.block_k2, KSPLIT=gw2,
                CHAINS=cfg.t1_chains2, HAS_BIAS=has_bias, UNROLL=cfg.t1_unroll2, PASS_LOOP=cfg.gw_pass_loop,
                SMEM_STAGES=cfg.t1_smem_stages, num_warps=4 * gw2, num_stages=1, **gw_cap, **self._pdl_args())
        elif ws_step and self._launch_ws("w2", ws.act, codes, hot, cold, max_slots, ws.pick_out, False, None, None):
            pass
        elif stream2:
            kernels.w2_stream_kernel[(stream2,)](
                ws.act, codes, w2, s2w, cold[W2], cold[W2 + SCALE_SUFFIX], ws.pick_out,
                w2.stride(0), s2w.stride(0), ids, mask_arg, sc.stream2, sc.stream_tickets2,
                self.num_experts, b2[0], b2[1], b2[0].stride(0) if has_bias else 0,
                **self._fused_finalize_args(fin, ws),
                H=shape.hidden, INTER=shape.intermediate, TOP_K=k, BM=cfg.block_m, BN=cfg.block_n2,
                BK=cfg.block_k2, DEQUANT=cfg.dequant, TILE_MAJOR=cfg.tile_major, PROGRAMS=stream2,
                HAS_TOKEN_MASK=token_mask is not None, HAS_BIAS=has_bias,
                **launch, **self._pdl_args())
        else:
            kernels.w2_kernel[(shape.hidden // cfg.block_n2, max_slots, s2)](
                ws.act, codes, w2, s2w, cold[W2], cold[W2 + SCALE_SUFFIX],
                ws.sorted_pick, ws.slot_start, ws.slot_expert, ws.num_slots, ws.pick_out,
                w2.stride(0), s2w.stride(0),
                ids, mask_arg, sc.part2 if s2 > 1 else ws.dummy_i64, sc.tickets2, self.num_experts,
                b2[0], b2[1], b2[0].stride(0) if has_bias else 0,
                H=shape.hidden, INTER=shape.intermediate,
                BM=cfg.block_m, BN=cfg.block_n2, BK=cfg.block_k2, DEQUANT=cfg.dequant,
                TILE_MAJOR=cfg.tile_major, TOP_K=k, SPLIT=s2, **small_args, HAS_BIAS=has_bias,
                **launch, **self._pdl_args(),
                # T=1 fused finalize: the token's weights, the output row, one ticket per row tile
                # (the w2 split tickets, unused when w2 is unsplit; every launch leaves them at zero)
                **self._fused_finalize_args(fin, ws))

    @functools.cached_property
    def _sm_resources(self) -> tuple[int, int, int]:
        """The device's SMs, and the registers and threads one SM holds (CUDA's device properties;
        Hopper's 65,536 and 2,048 where torch does not report them)."""
        props = torch.cuda.get_device_properties(self.device)
        return (props.multi_processor_count, getattr(props, "regs_per_multiprocessor", 65536),
                getattr(props, "max_threads_per_multi_processor", 2048))

    def _t1_fused_programs(self, warpgroups: int, items: int) -> int:
        """``tile_rules.t1_fused_programs`` for this device and config."""
        return t1_fused_programs(*self._sm_resources, self.config.t1_max_registers, warpgroups, items)

    def _gw_max_tokens(self) -> int:
        """The largest grouped step the warp-MMA grouped kernels take: below ws_min_tokens where the
        warp-specialized kernels run (``_ws``; it turns off if they fail to compile), else
        ``gw_max_tokens``."""
        cfg = self.config
        return min(cfg.gw_max_tokens, cfg.ws_min_tokens - 1) if self._ws else cfg.gw_max_tokens

    def ws_programs_on(self, split: bool) -> int:
        """The warp-specialized launches' programs per SM on a split layer (``split``: a cold bank)
        or one with every expert in HBM: the config's count, or with 0 two on a split layer and
        ``ws_programs_per_sm`` on the other (``KernelConfig.ws_programs_per_sm``)."""
        if split and not self.config.ws_programs_per_sm:
            return WS_PROGRAMS_MEMORY_BOUND
        return self.ws_programs_per_sm

    @functools.cached_property
    def ws_programs_per_sm(self) -> int:
        """The warp-specialized launches' programs per SM on this GPU for layers with every expert in
        HBM: the config's, or with 0 the count for its memory bandwidth per SM
        (``tile_rules.ws_programs_for``; 2 where the device properties do not say the memory clock)."""
        if self.config.ws_programs_per_sm:
            return self.config.ws_programs_per_sm
        props = torch.cuda.get_device_properties(self.device)
        peak = peak_memory_bytes_per_s(getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0))
        return ws_programs_for(peak, props.multi_processor_count)

    def _launch_ws(self, which: str, src: torch.Tensor, codes: torch.Tensor, hot: ExpertBank, cold: ExpertBank,
                   max_slots: int, out: torch.Tensor, count: bool, counts: torch.Tensor | None,
                   tokens: torch.Tensor | None) -> bool:
        """One expert GEMM of a grouped step through ``gpu.kernels_ws`` (``KernelConfig.ws_grouped``):
        a persistent grid of ``ws_programs_on`` programs per SM, at most one per (slot, row tile).
        False (nothing launched) if the kernel does not compile the first time (Gluon's API moves
        between Triton releases): a warning names the error and the layer keeps the tl.dot kernels."""
        ws, shape, cfg = self.workspace, self.shape, self.config
        name = W13 if which == "w13" else W2
        w, sw = hot[name], hot[name + SCALE_SUFFIX]
        tiles = (shape.intermediate // 64) if which == "w13" else (shape.hidden // 128)
        per_sm = self.ws_programs_on(split=cold is not hot)
        programs = min(torch.cuda.get_device_properties(self.device).multi_processor_count * per_sm, max_slots * tiles)
        cold_programs = min(cfg.ws_cold_programs, programs // 2) if cold is not hot and cfg.cold_first else 0
        const = kernels_ws.gemm_constants(which, shape.hidden, shape.intermediate, self.top_k,
                                          swiglu_limit=0.0 if self.swiglu_limit is None else self.swiglu_limit,
                                          count=count, cold_programs=cold_programs,
                                          max_slots=min(ws.max_tokens * ws.top_k, self.num_experts),
                                          prefetch=cfg.ws_prefetch,
                                          loader_warps=cfg.ws_loader_warps1 if which == "w13" else cfg.ws_loader_warps2)
        args = (src, codes, w, sw, cold[name], cold[name + SCALE_SUFFIX],
                ws.sorted_pick, ws.slot_start, ws.slot_expert, ws.num_slots, out,
                counts if count else ws.dummy_i64, tokens if count else ws.dummy_i64, ws.n_tokens,
                w.stride(0), sw.stride(0))
        launch = kernels_ws.KERNELS[which][(programs,)]
        key = (which, tuple(sorted(const.items())))
        if key in self._ws_compiled:
            launch(*args, **const, num_warps=4, maxnreg=ws_max_registers(per_sm))
            return True
        try:  # the first launch of each variant compiles it
            launch(*args, **const, num_warps=4, maxnreg=ws_max_registers(per_sm))
        except Exception as exc:  # noqa: BLE001 - any compile failure: keep the tl.dot kernels
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            warnings.warn(f"expert residency: the warp-specialized {which} expert kernel did not compile with "
                          f"Triton {triton.__version__} ({type(exc).__name__}: {first_line}); grouped steps use "
                          "the other MoE kernels from now on (same results, measured slower on Hopper)",
                          RuntimeWarning, stacklevel=2)
            self._ws = False
            return False
        self._ws_compiled.add(key)
        return True

    def _check_step(self, x: torch.Tensor, ids: torch.Tensor, hot: ExpertBank, cold: ExpertBank) -> None:
        """ValueError unless ``ids [T, top_k]`` fits the workspace, ``x`` is bf16 ``[T, H]`` with unit
        column stride and both banks hold this geometry."""
        t, k = ids.shape
        if k != self.top_k or t > self.workspace.max_tokens:
            raise ValueError(f"routing {tuple(ids.shape)} exceeds the workspace "
                             f"({self.workspace.max_tokens} x {self.top_k})")
        if x.dtype != torch.bfloat16 or x.shape != (t, self.shape.hidden) or x.stride(1) != 1:
            raise ValueError(f"x must be bf16 [T={t}, H={self.shape.hidden}] with unit column stride, "
                             f"got {x.dtype} {tuple(x.shape)}")
        for bank in (hot, cold):
            if expert_shape_of(bank) != self.shape:
                raise ValueError(f"bank geometry {expert_shape_of(bank)} != {self.shape}")

    def _fused_finalize_args(self, fin: tuple[torch.Tensor, torch.Tensor] | None, ws: Workspace) -> dict:
        if fin is None:
            return dict(weights_ptr=ws.dummy_i64, out_ptr=ws.dummy_i64, fin_ticket_ptr=ws.dummy_i64)
        weights, out = fin
        if out.shape != (1, self.shape.hidden) or out.stride(1) != 1:
            raise ValueError(f"out must be [1, {self.shape.hidden}] with unit column stride, got "
                             f"{tuple(out.shape)}")
        return dict(weights_ptr=weights, out_ptr=out, fin_ticket_ptr=self.split_scratch.tickets2,
                    FUSE_FINALIZE=True)

    def _group(self, ids: torch.Tensor, t: int, k: int, token_mask: torch.Tensor | None,
               counts: torch.Tensor | None, tokens: torch.Tensor | None, codes: torch.Tensor, *,
               split: bool) -> tuple[bool, int]:
        """Cut a grouped step's picks into slots, one per expert (``group_picks_kernel``, or torch
        ops above ``MAX_FUSED_PICKS``); a split layer's cold experts first (``cold_first``).
        Returns (the expert kernel counts, the slots to launch)."""
        ws, picks = self.workspace, t * k
        cold_first = split and self.config.cold_first
        if picks <= MAX_FUSED_PICKS:
            kernels.group_picks_kernel[(1,)](
                ids, token_mask if token_mask is not None else ws.scratch,
                ws.sorted_pick, ws.slot_start, ws.slot_expert, ws.num_slots, ws.scratch, ws.n_tokens, codes,
                picks, t, self.num_experts, TOP_K=k, PB=triton.next_power_of_2(max(picks, 2)),
                HAS_TOKEN_MASK=token_mask is not None, COLD_FIRST=cold_first, num_warps=4, **self._pdl_args())
            return counts is not None, min(picks, self.num_experts)
        self._group_torch(ids, t, k, token_mask, counts, tokens, codes if cold_first else None)
        return False, min(picks, self.num_experts)

    def _group_torch(self, ids: torch.Tensor, t: int, k: int, token_mask: torch.Tensor | None,
                     counts: torch.Tensor | None, tokens: torch.Tensor | None,
                     codes: torch.Tensor | None = None) -> None:
        """The grouping kernel's exact result with torch ops (large steps; fixed shapes, no sync);
        ``codes``: cold experts (negative codes) first, as ``COLD_FIRST``."""
        ws, e = self.workspace, self.num_experts
        picks = t * k
        ids = ids.to(torch.int64)
        valid = (ids >= 0) & (ids < e)
        if token_mask is not None:
            valid &= token_mask.bool().repeat_interleave(k)
        order = torch.arange(picks, device=ids.device)
        if codes is None:
            rank = torch.where(valid, ids, torch.full_like(ids, e))
        else:
            code = codes.to(torch.int64)[torch.where(valid, ids, torch.zeros_like(ids))]
            rank = torch.where(valid, torch.where(code < 0, ids, ids + e), torch.full_like(ids, 2 * e))
        key, _ = torch.sort(rank * picks + order)
        rank, pick = key // picks, key % picks
        expert = rank if codes is None else torch.where(rank >= 2 * e, e, torch.where(rank >= e, rank - e, rank))
        ws.sorted_pick[:picks].copy_(pick)
        prev = torch.cat([expert.new_full((1,), -1), expert[:-1]])
        first = (expert != prev) & (expert < e)
        slot = torch.cumsum(first.to(torch.int64), 0) - 1
        n_slots = first.sum()
        n_valid = valid.sum()
        # Non-first positions write to a trash index past the real slots (fixed shapes, no sync).
        trash = torch.full_like(slot, picks)
        target = torch.where(first, slot, trash)
        start = torch.zeros(picks + 1, dtype=torch.int64, device=ids.device)
        start.scatter_(0, target, order)
        expert_of = torch.zeros(picks + 1, dtype=torch.int64, device=ids.device)
        expert_of.scatter_(0, target, expert)
        start.scatter_(0, n_slots.reshape(1), n_valid.reshape(1))
        ws.slot_start[:picks + 1].copy_(start.to(torch.int32))
        ws.slot_expert[:picks].copy_(expert_of[:picks].to(torch.int32))
        ws.num_slots.copy_(n_slots.reshape(1).to(torch.int32))
        if counts is not None:
            counts.index_add_(0, torch.where(valid, ids, torch.zeros_like(ids)), valid.to(torch.int64))
            # A Python scalar add is a kernel, not a host->device copy: stays capturable.
            tokens.add_(token_mask.to(torch.int64).sum() if token_mask is not None else t)
