"""The split MoE layer on the GPU for BF16 and FP8-block experts (``gpu.kernels_dense``).

``TritonDenseExperts`` has the public API of ``gpu.experts.TritonMxfp4Experts`` — ``forward``
(group, w13+activation, w2, finalize; with ``DenseKernelConfig.one_token`` at T = 1 only w13 and
w2, which finalizes; both banks in one pass, optional in-kernel counting; fixed shapes, no host
sync, CUDA-graph capturable), ``pick_outputs``, ``finalize`` and ``per_pick_fn`` (the core's
``PerPickExpertFn`` contract) — and reuses its workspace, grouping and finalize. The tile config
and schedule default per format to what measured fastest (``default_config``). The
banks hold vLLM's layout as loaded (``to_kernel_layout`` is a no-op): a ``core.banks.ResidentLayer``
whose hot bank is on the device and whose cold bank is a device view of pinned host memory.

Formats (``expert_format``):

* ``"bf16"`` — ``w13_weight [E, 2I, H]``, ``w2_weight [E, H, I]`` bf16 (``UnquantizedFusedMoEMethod``);
* ``"fp8-block"`` — the same shapes in ``float8_e4m3fn`` plus fp32 128x128 block scales
  ``w13_weight_scale_inv [E, 2I/128, H/128]``, ``w2_weight_scale_inv [E, H/128, I/128]``
  (``Fp8MoEMethod`` with ``weight_block_size = [128, 128]``); W8A8 with the layer input and the
  activation quantized per token per 128 values in the kernels, as ``core.formats_ref``.

Optional ``w13_bias [E, 2I]``/``w2_bias [E, H]`` (any float dtype) split with the weights.
Activations: ``"silu"`` (gate rows first; ``swiglu_limit`` clamp), ``"swigluoai"`` (gpt-oss:
interleaved gate/up, alpha 1.702, limit 7.0 unless given) or ``"swigluoai_uninterleave"`` (the
same, gate rows first).
Torch references with the same arithmetic: ``core.formats_ref.float_per_pick`` /
``fp8_block_per_pick`` with the same activation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..contract.expert_formats import GPTOSS_SWIGLU_ALPHA, GPTOSS_SWIGLU_LIMIT
from ..contract.sizing import DENSE_FIN_TICKET_ROWS as FIN_TICKET_ROWS
from ..core.banks import ExpertBank
from ..core.formats_ref import SILU, SWIGLUOAI, SWIGLUOAI_UNINTERLEAVE
from ..core.reference import check_swiglu_limit
from ..fp8 import BLOCK as FP8_BLOCK
from ..fp8 import FP8_DTYPE
from . import kernels_dense
from .experts import MAX_FUSED_PICKS, ExpertShape, TritonMxfp4Experts, Workspace

W13, W2 = "w13_weight", "w2_weight"
B13, B2 = "w13_bias", "w2_bias"
FP8_SCALE_SUFFIX = "_scale_inv"
FORMATS = ("bf16", "fp8-block")
ACT_CODES = {SILU: 0, SWIGLUOAI: 1, SWIGLUOAI_UNINTERLEAVE: 2}   # the kernels' ACT


@dataclass(frozen=True)
class DenseKernelConfig:
    """Tile shapes and launch schedule, the same for every bank and bank size (what keeps split ==
    unsplit bitwise; a step's schedule depends on its T only). FP8 needs ``block_k1 == block_k2 ==
    128`` (one activation scale group per reduction step)."""

    block_m: int = 16
    block_n1: int = 64
    block_k1: int = 128
    block_n2: int = 64
    block_k2: int = 128
    num_warps: int = 4
    num_stages: int = 3
    finalize_block: int = 1024
    # T = 1: no grouping launch (each pick its own slot, as the MXFP4 kernels do).
    one_token: bool = True
    # T = 1 (with one_token): the finalize runs inside the w2 launch (the last program of each row
    # tile adds the token's K rows in router order; the finalize kernel's bits).
    fuse_finalize: bool = True
    # Programmatic dependent launch (sm_90+ on CUDA; ignored elsewhere): each launch's programs
    # start while the previous kernel drains and wait for it before touching memory.
    pdl: bool = True
    # Grouped steps of a split layer: the cold experts' slots first (``KernelConfig.cold_first``).
    cold_first: bool = True
    # FP8 with a 128-row w13 tile: the activation rows are quantized in the w13 launch's epilogue
    # (same bits as the separate quantization launch, which it replaces).
    fuse_act_quant: bool = True
    # T = 1 tile overrides (None: block_n1 / block_n2 / num_stages).
    block_n1_t1: int | None = None
    block_n2_t1: int | None = None
    num_stages_t1: int | None = None
    # T >= large_tokens: block_m override (None: block_m).
    block_m_large: int | None = None
    large_tokens: int = 32

    def tiles(self, tokens: int) -> tuple[int, int, int, int]:
        """``(block_m, block_n1, block_n2, num_stages)`` of a step of ``tokens`` tokens."""
        bm = self.block_m_large if self.block_m_large is not None and tokens >= self.large_tokens \
            else self.block_m
        if tokens == 1:
            def pick(value: int | None, default: int) -> int:
                return default if value is None else value
            return (bm, pick(self.block_n1_t1, self.block_n1), pick(self.block_n2_t1, self.block_n2),
                    pick(self.num_stages_t1, self.num_stages))
        return bm, self.block_n1, self.block_n2, self.num_stages

    def describe(self) -> str:
        text = (f"dense BM{self.block_m} w13:BN{self.block_n1}xBK{self.block_k1} "
                f"w2:BN{self.block_n2}xBK{self.block_k2} warps{self.num_warps} stages{self.num_stages}")
        t1 = [f"{n}{v}" for n, v in (("w13:BN", self.block_n1_t1), ("w2:BN", self.block_n2_t1),
                                    ("stages", self.num_stages_t1)) if v is not None]
        if t1:
            text += " T1:" + ",".join(t1)
        if self.block_m_large is not None:
            text += f" BM{self.block_m_large}@T>={self.large_tokens}"
        if self.one_token:
            text += " T1-ungrouped" + ("+fused-finalize" if self.fuse_finalize else "")
        if self.fuse_act_quant:
            text += " fp8-act-quant-in-w13@BN128"
        if not self.cold_first:    # the default (cold experts' slots first) goes unsaid
            text += " id-order-slots"
        if self.pdl:
            text += " pdl"
        return text


def default_config(expert_format: str) -> DenseKernelConfig:
    """The measured default per format (one NVIDIA H200, ``bench/dense_peer.py``; BENCHMARKS.md "BF16
    and FP8-block layers against the kernel vLLM 0.33 selects"):

    * ``bf16``: the T = 1 schedule with four pipeline stages at T = 1 (Qwen3-30B-A3B: 25.8 / 26.1
      against 29.8 / 29.3 us per layer with three, two runs of 2026-12-04), programmatic dependent
      launches (no slower at T = 6, 16, 96), 32-token tiles from T = 64 (249.5 against 265.7 us at
      T = 96; slower at T = 16, 146.6 against 136.3);
    * ``fp8-block``: the T = 1 schedule with 64-row tiles and programmatic dependent launches
      (DeepSeek-V3, 2026-12-04: 97.6 / 99.3 against 103.9 / 105.2 us per layer at T = 1 with the
      four-launch schedule, two runs; within 1% of it at T = 6, 16, 96). 128-row w13 tiles with the
      activation quantized in their epilogue were slower at every T (2026-12-03), 32-token tiles
      slower at T = 16 and 96, four or five stages at T = 1 no faster."""
    if expert_format == "bf16":
        return DenseKernelConfig(block_m_large=32, large_tokens=64, num_stages_t1=4)
    if expert_format == "fp8-block":
        return DenseKernelConfig()
    raise ValueError(f"expert_format {expert_format!r} is not one of {FORMATS}")


def dense_bytes_per_expert(shape: ExpertShape, expert_format: str, bias_bytes: int = 0) -> int:
    """Weight (+ block scale) bytes of one expert: bf16 ``2 * 3HI``; fp8-block ``3HI`` plus 4 bytes
    per 128x128 block of w13 and w2; plus ``bias_bytes`` per bias value (``2I + H`` values)."""
    h, i = shape.hidden, shape.intermediate
    if expert_format == "bf16":
        weights = 2 * 3 * h * i
    elif expert_format == "fp8-block":
        blocks = -(-2 * i // FP8_BLOCK) * -(-h // FP8_BLOCK) + -(-h // FP8_BLOCK) * -(-i // FP8_BLOCK)
        weights = 3 * h * i + 4 * blocks
    else:
        raise ValueError(f"expert_format {expert_format!r} is not one of {FORMATS}")
    return weights + bias_bytes * (2 * i + h)


class TritonDenseExperts(TritonMxfp4Experts):
    """Launches the dense residency kernels for layers of one geometry and format."""

    def __init__(self, shape: ExpertShape, num_experts: int, top_k: int, max_tokens: int,
                 device: torch.device | str, config: DenseKernelConfig | None = None, *,
                 expert_format: str = "bf16", activation: str = SILU,
                 swiglu_limit: float | None = None, swiglu_alpha: float | None = None) -> None:
        """``config`` None: ``default_config(expert_format)``."""
        if expert_format not in FORMATS:
            raise ValueError(f"expert_format {expert_format!r} is not one of {FORMATS}")
        if config is None:
            config = default_config(expert_format)
        if shape.hidden % config.block_k1 or shape.intermediate % config.block_k2:
            raise ValueError(f"block_k must divide the reduction dims ({shape}, {config})")
        for tokens in (1, 2, max(config.large_tokens, 2)):
            _, bn1, bn2, _ = config.tiles(tokens)
            if shape.intermediate % bn1 or shape.hidden % bn2:
                raise ValueError(f"block_n must divide the output dims ({shape}, {config})")
            if bn2 < FIN_TICKET_ROWS:
                raise ValueError(f"w2 tiles need >= {FIN_TICKET_ROWS} rows, got {config}")
        if expert_format == "fp8-block" and (config.block_k1 != FP8_BLOCK or config.block_k2 != FP8_BLOCK):
            raise ValueError(f"fp8-block needs block_k1 == block_k2 == {FP8_BLOCK} (one activation "
                             f"scale group per step), got {config}")
        if activation in (SWIGLUOAI, SWIGLUOAI_UNINTERLEAVE):
            self.limit = GPTOSS_SWIGLU_LIMIT if swiglu_limit is None else check_swiglu_limit(swiglu_limit)
            self.alpha = GPTOSS_SWIGLU_ALPHA if swiglu_alpha is None else float(swiglu_alpha)
        elif activation == SILU:
            if swiglu_alpha is not None:
                raise ValueError("activation 'silu' takes no swiglu_alpha (that is swigluoai)")
            limit = check_swiglu_limit(swiglu_limit)
            self.limit, self.alpha = (0.0 if limit is None else limit), 1.0
        else:
            raise ValueError(f"activation {activation!r} is not one of {ACT_CODES}")
        self.expert_format, self.activation = expert_format, activation
        self.shape, self.num_experts, self.top_k = shape, num_experts, top_k
        self.config = config
        self.swiglu_limit = None if not self.limit else self.limit
        self.device = torch.device(device)
        self.workspace = Workspace(max_tokens, top_k, shape, self.device)
        self._identity_codes: torch.Tensor | None = None
        self._dummy_f32 = torch.zeros(1, dtype=torch.float32, device=self.device)
        self._pdl = bool(config.pdl and self.device.type == "cuda" and torch.cuda.is_available()
                         and torch.cuda.get_device_capability(self.device)[0] >= 9)
        # T = 1 fused finalize: one ticket per w2 row tile of at least FIN_TICKET_ROWS rows (every
        # launch leaves them at zero); sized for any tile, so the ledger needs no config.
        self._fin_tickets = torch.zeros(-(-shape.hidden // FIN_TICKET_ROWS), dtype=torch.int32,
                                        device=self.device)
        if expert_format == "fp8-block":
            # The GEMM inputs quantized once per step (x, then the activation rows), not once per
            # output tile: DeepSeek-V3's w2 repeated each pick's quantization in 112 programs.
            p = max_tokens * top_k
            h, i = shape.hidden, shape.intermediate
            f32 = dict(dtype=torch.float32, device=self.device)
            # E4M3 for the FP8 tensor cores; bf16 under TRITON_INTERPRET=1 (no FP8 type there).
            qdt = torch.bfloat16 if getattr(kernels_dense._INTERPRETED, "value", False) else FP8_DTYPE
            self._xq = torch.zeros(max_tokens, h, dtype=qdt, device=self.device)
            self._xs = torch.zeros(max_tokens, h // FP8_BLOCK, **f32)
            self._aq = torch.zeros(p, i, dtype=qdt, device=self.device)
            self._as = torch.zeros(p, i // FP8_BLOCK, **f32)

    @property
    def fp8_scratch_bytes(self) -> int:
        """Device bytes of the FP8 input scratch (0 for bf16): E4M3 ``T*H + P*I`` values (bf16 when
        interpreted) and fp32 ``(T*H + P*I) / 128`` scales for T = max_tokens, P = T*top_k."""
        return sum(t.numel() * t.element_size() for t in (getattr(self, n, None) for n in
                                                           ("_xq", "_xs", "_aq", "_as")) if t is not None)

    @property
    def ticket_bytes(self) -> int:
        """Device bytes of the T = 1 fused-finalize tickets: int32 ``ceil(H / 16)``."""
        return self._fin_tickets.numel() * self._fin_tickets.element_size()

    def to_kernel_layout(self, tensors: dict[str, torch.Tensor]) -> None:
        """No-op: the dense kernels read vLLM's layout as loaded (kept for the shared API)."""

    def check_bank(self, bank: ExpertBank) -> bool:
        """Validate one bank's tensors for this geometry/format; True when it holds biases."""
        h, i = self.shape.hidden, self.shape.intermediate
        fp8 = self.expert_format == "fp8-block"
        want = {W13: (2 * i, h), W2: (h, i)}
        if fp8:
            want[W13 + FP8_SCALE_SUFFIX] = (-(-2 * i // FP8_BLOCK), -(-h // FP8_BLOCK))
            want[W2 + FP8_SCALE_SUFFIX] = (-(-h // FP8_BLOCK), -(-i // FP8_BLOCK))
        for name, dims in want.items():
            if name not in bank.tensors:
                raise ValueError(f"bank has no {name!r} tensor (has {sorted(bank.tensors)})")
            t = bank.tensors[name]
            if tuple(t.shape[1:]) != dims or not t.is_contiguous():
                raise ValueError(f"{name}: expected contiguous [rows, {dims[0]}, {dims[1]}], got {tuple(t.shape)}")
        dtype = FP8_DTYPE if fp8 else torch.bfloat16
        for name in (W13, W2):
            if bank[name].dtype != dtype:
                raise TypeError(f"{name}: {self.expert_format} experts need {dtype}, got {bank[name].dtype}")
        if fp8:
            for name in (W13 + FP8_SCALE_SUFFIX, W2 + FP8_SCALE_SUFFIX):
                if bank[name].dtype != torch.float32:
                    raise TypeError(f"{name}: block scales must be float32, got {bank[name].dtype}")
        has = [n in bank.tensors for n in (B13, B2)]
        if has[0] != has[1]:
            raise ValueError("w13_bias and w2_bias come together (one is missing)")
        if has[0]:
            for name, n in ((B13, 2 * i), (B2, h)):
                t = bank.tensors[name]
                if tuple(t.shape[1:]) != (n,) or not t.is_contiguous():
                    raise ValueError(f"{name}: expected contiguous [rows, {n}], got {tuple(t.shape)}")
        return has[0]

    def _fuses_finalize(self, tokens: int) -> bool:
        """T = 1 with the ungrouped schedule: finalize inside the w2 launch."""
        cfg = self.config
        return tokens == 1 and cfg.one_token and cfg.fuse_finalize and self.top_k <= MAX_FUSED_PICKS

    def _run(self, x: torch.Tensor, ids: torch.Tensor, codes: torch.Tensor, hot: ExpertBank,
             cold: ExpertBank, *, token_mask: torch.Tensor | None, counts: torch.Tensor | None,
             tokens: torch.Tensor | None, fin: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        cfg, ws, shape = self.config, self.workspace, self.shape
        t, k = ids.shape
        if k != self.top_k or t > ws.max_tokens:
            raise ValueError(f"routing {tuple(ids.shape)} exceeds the workspace ({ws.max_tokens} x {self.top_k})")
        if x.dtype != torch.bfloat16 or x.shape != (t, shape.hidden) or x.stride(1) != 1:
            raise ValueError(f"x must be bf16 [T={t}, H={shape.hidden}] with unit column stride, "
                             f"got {x.dtype} {tuple(x.shape)}")
        biased = {self.check_bank(bank) for bank in (hot, cold)}
        if len(biased) != 1:
            raise ValueError("hot and cold banks disagree on expert biases")
        has_bias = biased.pop()
        picks = t * k
        ids = ids.reshape(-1)
        if not ids.is_contiguous():
            ids = ids.contiguous()
        one_token = t == 1 and cfg.one_token and picks <= MAX_FUSED_PICKS
        if fin is not None and not one_token:
            raise RuntimeError("the fused finalize needs the T=1 ungrouped schedule")
        bm, bn1, bn2, stages = cfg.tiles(t)
        pdl = self._pdl_args()
        count_in_kernel = counts is not None
        if one_token:
            max_slots = picks
        else:
            count_in_kernel, max_slots = self._group(ids, t, k, token_mask, counts, tokens, codes,
                                                     split=cold is not hot)
        fp8 = self.expert_format == "fp8-block"
        quant_act = fp8 and cfg.fuse_act_quant and bn1 == FP8_BLOCK
        mask_arg = token_mask if token_mask is not None else ws.scratch
        small = {"ONE_TOKEN": one_token, "HAS_TOKEN_MASK": one_token and token_mask is not None}

        def weights(bank: ExpertBank, name: str) -> torch.Tensor:
            w = bank[name]
            return w.view(torch.uint8) if fp8 else w   # E4M3 bytes; decoded in the kernel

        def scales(bank: ExpertBank, name: str) -> torch.Tensor:
            return bank[name + FP8_SCALE_SUFFIX] if fp8 else self._dummy_f32

        def bias(bank: ExpertBank, name: str) -> torch.Tensor:
            return bank[name] if has_bias else self._dummy_f32

        def stride(tensor: torch.Tensor) -> int:
            return tensor.stride(0) if tensor.dim() > 1 else 0

        w13, s13, b13 = weights(hot, W13), scales(hot, W13), bias(hot, B13)
        x_in, x_s, x_stride = x, self._dummy_f32, x.stride(0)
        if fp8:
            kernels_dense.quant_groups_kernel[(t, shape.hidden // FP8_BLOCK)](
                x, self._xq, self._xs, x.stride(0), K=shape.hidden, num_warps=1, **pdl)
            x_in, x_s, x_stride = self._xq, self._xs, shape.hidden
        aq, a_s = (self._aq, self._as) if fp8 else (self._dummy_f32, self._dummy_f32)
        kernels_dense.dense_w13_act_kernel[(shape.intermediate // bn1, max_slots)](
            x_in, x_s, codes, w13, weights(cold, W13), s13, scales(cold, W13), b13, bias(cold, B13),
            ws.sorted_pick, ws.slot_start, ws.slot_expert, ws.num_slots, ws.act,
            counts if count_in_kernel else ws.dummy_i64, tokens if count_in_kernel else ws.dummy_i64,
            ws.n_tokens, x_stride, w13.stride(0), stride(s13), stride(b13),
            ids, mask_arg, self.num_experts, aq, a_s,
            H=shape.hidden, INTER=shape.intermediate, TOP_K=k,
            BM=bm, BN=bn1, BK=cfg.block_k1,
            FP8=fp8, ACT=ACT_CODES[self.activation], HAS_BIAS=has_bias,
            COUNT=count_in_kernel, LIMIT=float(self.limit), ALPHA=float(self.alpha),
            QUANT_ACT=quant_act, **small, num_warps=cfg.num_warps, num_stages=stages, **pdl)
        w2, s2, b2 = weights(hot, W2), scales(hot, W2), bias(hot, B2)
        a_in, a_s = ws.act, self._dummy_f32
        if fp8:
            if not quant_act:
                kernels_dense.quant_groups_kernel[(picks, shape.intermediate // FP8_BLOCK)](
                    ws.act, self._aq, self._as, shape.intermediate, K=shape.intermediate, num_warps=1,
                    **pdl)
            a_in, a_s = self._aq, self._as
        if fin is not None:
            fin_w, fin_out = fin
            if fin_out.shape != (1, shape.hidden) or fin_out.stride(1) != 1:
                raise ValueError(f"out must be [1, {shape.hidden}] with unit column stride, got "
                                 f"{tuple(fin_out.shape)}")
            fin_args = {"weights_ptr": fin_w, "out_ptr": fin_out, "fin_ticket_ptr": self._fin_tickets,
                        "FUSE_FINALIZE": True}
        else:
            fin_args = {"weights_ptr": ws.dummy_i64, "out_ptr": ws.dummy_i64, "fin_ticket_ptr": ws.dummy_i64}
        kernels_dense.dense_w2_kernel[(shape.hidden // bn2, max_slots)](
            a_in, a_s, codes, w2, weights(cold, W2), s2, scales(cold, W2), b2, bias(cold, B2),
            ws.sorted_pick, ws.slot_start, ws.slot_expert, ws.num_slots, ws.pick_out,
            w2.stride(0), stride(s2), stride(b2),
            ids, mask_arg, self.num_experts, **fin_args,
            H=shape.hidden, INTER=shape.intermediate,
            BM=bm, BN=bn2, BK=cfg.block_k2, FP8=fp8, HAS_BIAS=has_bias, TOP_K=k, **small,
            num_warps=cfg.num_warps, num_stages=stages, **pdl)
