"""The split MXFP4 layer with FP8 activations: what vLLM 0.33's Humming backend computes on Hopper.

``TritonW4a8Experts`` is ``TritonMxfp4Experts`` (same banks, row map, counter, workspace, finalize
and graph capture) with the two expert launches on FP8 tensor cores: the step's hidden states
are quantized to E4M3 per token and 128 values, the weights decoded to E4M3 with their block
scales folded into the exponent (``gpu.layout_w4a8``, which also refuses checkpoints it cannot
hold exactly), and the SwiGLU output quantized again for w2. Every step runs the grouped schedule
(group, quantize, w13 + SwiGLU, w2, finalize). A slot's arithmetic does not depend on the bank
holding its expert: a split layer is bit-identical to the unsplit one.

Not offered to users: on the H200 it took 1.03-1.10x the default layer's time at T = 6..96 (and
1.84x at T = 1, which has no schedule of its own here), so no plugin or recipe setting selects it;
``bench/peer_moe.py --w4a8`` times it (BENCHMARKS.md, run W8). Its outputs differ from the
bf16-activation kernels' by the activation quantization (both stated there against an fp32
reference). Needs compiled CUDA of compute capability 9.0+ (FP8 wgmma) and 128-divisible hidden
and intermediate sizes; no expert biases (gpt-oss keeps the default kernels).
"""

from __future__ import annotations

import dataclasses

import torch

from ..core.banks import ExpertBank
from . import kernels_w4a8
from .experts import SCALE_SUFFIX, W2, W13, ExpertShape, KernelConfig, TritonMxfp4Experts
from .layout_w4a8 import BLOCK_K, to_w4a8_layout

# w13 gate/up and w2 row tiles; the w13 tile's width is the w2 input's quantization group (one
# scale per 128 values, w2's k step). On the H200, 64-row w13 tiles with 64-value w2-input groups
# (two products per w2 k step) gave wrong outputs and were removed (BENCHMARKS.md).
TILE_ROWS = 128
SIZE_MULTIPLE = 128   # hidden and intermediate sizes: whole 128-value k steps and row tiles


def w4a8_config(config: KernelConfig = KernelConfig()) -> KernelConfig:
    """``config`` with the tiles and schedule these kernels run (128 x 128 tiles, grouped steps)."""
    return dataclasses.replace(config, block_n1=TILE_ROWS, block_k1=BLOCK_K, block_n2=TILE_ROWS,
                               block_k2=BLOCK_K, one_token=False, fuse_finalize=False, split_k1=1,
                               split_k2=1, stream_k1=0, stream_k2=0, t1_warp_mma=False, gw_max_tokens=0)


def w4a8_refusal(shape: ExpertShape, device: torch.device | str, activation: str = "silu") -> str | None:
    """None when these kernels can serve ``shape`` on ``device``, else why not."""
    dev = torch.device(device)
    if activation != "silu":
        return f"the FP8-activation kernels compute SiLU-GLU experts, not {activation!r}"
    if shape.hidden % SIZE_MULTIPLE or shape.intermediate % SIZE_MULTIPLE:
        return (f"the FP8-activation kernels need hidden and intermediate sizes divisible by "
                f"{SIZE_MULTIPLE}, got {shape.hidden} and {shape.intermediate}")
    if dev.type != "cuda" or not torch.cuda.is_available() or torch.cuda.get_device_capability(dev)[0] < 9:
        return "the FP8-activation kernels need a CUDA GPU of compute capability 9.0 or later (FP8 wgmma)"
    return None


class TritonW4a8Experts(TritonMxfp4Experts):
    """FP8-activation launches for layers of one geometry (module docstring)."""

    def __init__(self, shape: ExpertShape, num_experts: int, top_k: int, max_tokens: int,
                 device: torch.device | str, config: KernelConfig = KernelConfig(), *,
                 swiglu_limit: float | None = None) -> None:
        """``config``: tokens per tile (``block_m``), warps and pipeline stages; the tiles are
        ``w4a8_config``'s."""
        reason = w4a8_refusal(shape, device)
        if reason is not None:
            raise ValueError(reason)
        super().__init__(shape, num_experts, top_k, max_tokens, device, w4a8_config(config),
                         swiglu_limit=swiglu_limit)
        self._scratch = _Fp8Scratch(self.workspace.act, max_tokens, top_k, shape)

    def to_kernel_layout(self, tensors: dict[str, torch.Tensor]) -> None:
        """Re-encode a layer's full expert tensors for these kernels (in place; ``gpu.layout_w4a8``:
        ``W4a8LayoutError`` for a checkpoint the FP8 layout cannot hold exactly)."""
        for name in tensors:
            if name.endswith("_bias"):
                raise ValueError(f"the FP8-activation kernels take no expert biases ({name})")
        to_w4a8_layout(tensors, self.config)

    def _run(self, x: torch.Tensor, ids: torch.Tensor, codes: torch.Tensor, hot: ExpertBank,
             cold: ExpertBank, *, token_mask: torch.Tensor | None, counts: torch.Tensor | None,
             tokens: torch.Tensor | None, fin: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        cfg, ws, shape, sc = self.config, self.workspace, self.shape, self._scratch
        t, k = ids.shape
        if fin is not None:
            raise RuntimeError("the FP8-activation layer finalizes in its own launch")
        self._check_step(x, ids, hot, cold)
        if "w13_bias" in hot.tensors or "w13_bias" in cold.tensors:
            raise ValueError("the FP8-activation kernels take no expert biases")
        ids = ids.reshape(-1)
        if not ids.is_contiguous():
            ids = ids.contiguous()
        count_in_kernel, max_slots = self._group(ids, t, k, token_mask, counts, tokens, codes,
                                                 split=cold is not hot)
        pdl = self._pdl_args()
        kernels_w4a8.quant_rows_kernel[(t, shape.hidden // BLOCK_K)](
            x, x.stride(0), sc.xq, sc.xs, K=shape.hidden, G=BLOCK_K, num_warps=1, **pdl)
        small = t <= cfg.small_step_limit()
        launch = cfg.tl_dot_launch(small)
        w13, o13, w2, o2 = hot[W13], hot[W13 + SCALE_SUFFIX], hot[W2], hot[W2 + SCALE_SUFFIX]
        kernels_w4a8.w13_w4a8_kernel[(shape.intermediate // cfg.block_n1, max_slots)](
            sc.xq, sc.xs, codes, w13, o13, cold[W13], cold[W13 + SCALE_SUFFIX],
            ws.sorted_pick, ws.slot_start, ws.slot_expert, ws.num_slots, sc.aq, sc.as_,
            counts if count_in_kernel else ws.dummy_i64, tokens if count_in_kernel else ws.dummy_i64,
            ws.n_tokens, w13.stride(0), o13.stride(0),
            H=shape.hidden, INTER=shape.intermediate, TOP_K=k, BM=cfg.block_m, BN=cfg.block_n1, BK=BLOCK_K,
            COUNT=count_in_kernel, SWIGLU_LIMIT=0.0 if self.swiglu_limit is None else self.swiglu_limit,
            **launch, **pdl)
        kernels_w4a8.w2_w4a8_kernel[(shape.hidden // cfg.block_n2, max_slots)](
            sc.aq, sc.as_, codes, w2, o2, cold[W2], cold[W2 + SCALE_SUFFIX],
            ws.sorted_pick, ws.slot_start, ws.slot_expert, ws.num_slots, ws.pick_out,
            w2.stride(0), o2.stride(0), H=shape.hidden, INTER=shape.intermediate,
            BM=cfg.block_m, BN=cfg.block_n2, BK=BLOCK_K, **launch, **pdl)


class _Fp8Scratch:
    """FP8 views into the workspace's bf16 activation buffer (``2 * picks * I`` bytes), in order:
    the w2 input ``aq [picks, I]`` E4M3 and its scales ``as_ [picks, I/128]`` fp32, then the step's
    quantized hidden states ``xq [T, H]`` E4M3 and ``xs [T, H/128]`` fp32. No extra device memory:
    the ledger's workspace bytes hold for either kernel family."""

    def __init__(self, act: torch.Tensor, max_tokens: int, top_k: int, shape: ExpertShape) -> None:
        h, i, picks = shape.hidden, shape.intermediate, max_tokens * top_k
        raw = act.view(torch.uint8).reshape(-1)
        sizes = (picks * i, picks * i // BLOCK_K * 4, max_tokens * h, max_tokens * h // BLOCK_K * 4)
        if sum(sizes) > raw.numel():
            raise ValueError(f"the workspace's activation buffer ({raw.numel()} bytes) cannot hold the "
                             f"FP8 activations ({sum(sizes)} bytes): top_k x intermediate is too small "
                             f"beside hidden ({top_k} x {i} against {h})")
        parts, at = [], 0
        for n in sizes:
            parts.append(raw[at:at + n])
            at += n
        self.aq = parts[0].view(torch.float8_e4m3fn).view(picks, i)
        self.as_ = parts[1].view(torch.float32).view(picks, i // BLOCK_K)
        self.xq = parts[2].view(torch.float8_e4m3fn).view(max_tokens, h)
        self.xs = parts[3].view(torch.float32).view(max_tokens, h // BLOCK_K)


__all__ = ["TritonW4a8Experts", "w4a8_config", "w4a8_refusal"]
