"""The Blackwell bank kernel: FlashInfer's TRT-LLM routed MXFP4 MoE once per bank with
``do_finalize=False``, then the runtime's fp32-fma finalize over both banks' unfinalized rows.

The call is the one vLLM 0.33 makes in ``experts/trtllm_mxfp4_moe.py``
``TrtLlmMxfp4ExpertsModular._invoke_kernel`` (``flashinfer.trtllm_fp4_block_scale_routed_moe``
with ``topk_ids=(ids, weights)``, ``routing_method_type=Renormalize``, no output scales, the same
activation type and clamp tensors), with three differences, each the expert-parallel contract
that call already serves:

* **ids remapped to bank rows.** A layer's banks are numbered like two expert-parallel ranks
  (``bank_slots``): hot row ``r`` is id ``r``, cold row ``r`` is id ``H + r`` (H = hot rows), so
  ``num_experts`` stays the layer's expert count. The hot call passes ``local_expert_offset=0,
  local_num_experts=H`` and the hot bank's tensors; the cold call ``local_expert_offset=H,
  local_num_experts=C`` and the cold bank's. A pick of the other bank is an in-range id outside
  ``[offset, offset + local)``: FlashInfer's routing marks it not local
  (``isLocal``/``isLocalExpert`` in ``trtllm_fused_moe_routing_custom.cuh`` and
  ``RoutingKernel.cuh``), computes nothing for it and writes ``-1`` into
  ``expanded_idx_to_permuted_idx`` — exactly what it does for another EP rank's experts, the
  path vLLM runs with ``local_expert_offset = ep_rank * local_num_experts``. No dummy row, no
  zero weight, no compaction (the kernel's ``top_k`` is fixed per call); docs/blackwell.md cites
  the lines.
* **router ids outside ``0..E-1`` skipped.** A pick with no expert on this layer (vLLM's ``-1``:
  computed on another rank, or unrouted; or an id ``>= E``; ``core.devmap.valid_ids``) is never
  looked up (``codes[-1]`` would wrap around to the last expert) and never handed to FlashInfer as
  is (its routing kernels index shared memory by id). ``launch_ids`` gives it a stand-in id that
  cannot disturb a real pick — FlashInfer's block routing kernel keeps one ``k`` per (token, id),
  so a duplicate id in a token would race with that token's real pick: in a split layer each
  launch gets an id of the *other* bank (not local: computed nowhere), in a one-bank layer an id
  the token does not use (computed, then discarded). ``pick_outputs`` reads no row for it (its
  map entry taken as ``-1``) and zeroes it in a reused ``pick_out``; ``forward`` gives it weight
  0, so the finalize adds ``fma(0, 0, acc)``: the bits of ``core.split.residency_forward``.
  Fixed shapes, no sync.
* **``do_finalize=False``.** The call returns ``[gemm2_output, expert_weights,
  expanded_idx_to_permuted_idx]``: the permuted, *unweighted* GEMM2 rows (bf16,
  ``[padded rows, hidden]``), the weights as passed, and the ``[T*K]`` int32 map from route
  ``t*K + k`` to its row, ``-1`` for non-local routes (vLLM's ``moe_output.UnfinalizedMoEOutput``
  documents the same fields).
* **one finalize for both banks.** ``gather_pick_rows`` reads every route's row from the bank that
  computed it into ``pick_out [T, K, H]``; ``core.fma_finalize.finalize`` (or the GPU's Triton
  finalize, the same bits) weighs and sums in router order in fp32 with fma and casts once.

Each pick row is produced by the same GEMM kernels whichever bank holds the expert; bit-identity of
split and unsplit additionally needs FlashInfer's per-row arithmetic not to depend on the tactic
its autotuner picks per shape (each bank size is its own tuning shape). That held on the GB300 of
the field report "vLLM: Pin Hot Experts" (2026-09-17); it has not been run here (no SM100 machine
is reachable): ``python -m expert_residency.blackwell.selfcheck`` checks it on the operator's box.

FlashInfer and vLLM are imported lazily inside the call path; ``routed_moe``/``quantize`` can be
injected (``blackwell.emulation`` does on CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..core.banks import ExpertBank, ResidentLayer
from ..core.devmap import lookup_routed, valid_ids
from ..core.fma_finalize import finalize
from ..core.reference import check_swiglu_limit
from ..core.split import PerPickExpertFn, routed_weights, zero_skipped_rows
from .layout import check_bank_separable

if TYPE_CHECKING:
    from ..core.counter import ExpertCounter

ACTIVATIONS = ("mxfp8", "bf16")
# flashinfer.tllm_enums.ActivationType.Swiglu: vLLM maps MoEActivation.SILU to it
# (quantization/utils/flashinfer_utils.py ``activation_to_flashinfer_type``).
SWIGLU = 3
# flashinfer.tllm_enums.RoutingMethodType.Renormalize: what vLLM passes for pre-routed tokens.
RENORMALIZE = 1
# vLLM's grid bound for one launch (TrtLlmMxfp4ExpertsModular._max_supported_tokens).
MAX_GRID_Y, MIN_TILE_TOKENS_DIM = 65535, 8

RoutedMoe = Callable[..., Any]
Quantize = Callable[[torch.Tensor], "tuple[torch.Tensor, torch.Tensor | None]"]


def bank_slots(codes: torch.Tensor, topk_ids: torch.Tensor, hot_rows: int) -> torch.Tensor:
    """int32 ``[T, K]`` bank-numbered ids: hot row ``r`` -> ``r``, cold row ``r`` -> ``hot_rows + r``
    (``codes``: ``core.devmap`` row codes). An id outside ``0..E-1`` gets slot 0 as a placeholder
    (never ``codes[-1]``, no IndexError); ``launch_ids`` replaces it before a launch. Fixed shapes,
    no sync."""
    code, valid = lookup_routed(codes, topk_ids)
    cold = torch.bitwise_not(code) + hot_rows
    slot = torch.where(code >= 0, code, cold)
    return torch.where(valid, slot, torch.zeros_like(slot)).to(torch.int32).contiguous()


def spare_slots(slots: torch.Tensor, valid: torch.Tensor, num_slots: int) -> torch.Tensor:
    """int64 ``[T, K]``: for the ``j``-th skipped pick (``~valid``) of a token, the ``j``-th slot in
    ``0..min(K, num_slots)-1`` that none of the token's valid picks uses (values at valid picks
    arbitrary). Distinct within a token and never one of its real slots: a token with ``s`` skipped
    picks has at most ``K - s`` valid ones, so the first ``K`` slots leave at least ``s`` free
    (``K <= num_slots``). Fixed shapes (a ``[T, K + 1]`` scratch), no sync."""
    t, k = slots.shape
    window = min(k, num_slots)
    # valid slots inside the window are marked; the rest land in the extra column, dropped
    marks = torch.where(valid & (slots < window), slots, torch.full_like(slots, window)).long()
    used = torch.zeros(t, window + 1, dtype=torch.int32, device=slots.device)
    used.scatter_add_(1, marks, torch.ones_like(marks, dtype=torch.int32))
    free_first = torch.argsort((used[:, :window] > 0).to(torch.int32), dim=1, stable=True)
    rank = (torch.cumsum((~valid).to(torch.int64), dim=1) - 1).clamp(min=0, max=window - 1)
    return free_first.gather(1, rank)


def launch_ids(slots: torch.Tensor, valid: torch.Tensor, hot_rows: int, cold_rows: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(hot launch ids, cold launch ids), int32 ``[T, K]`` contiguous: ``slots`` (``bank_slots``)
    with each skipped pick (``~valid``) given a stand-in that no real pick of its token shares.
    Both banks non-empty: the hot launch gets id ``hot_rows`` (a cold slot) and the cold launch id
    0 (a hot slot) — in range, not local, so FlashInfer computes nothing and maps the route to -1
    whatever else the token picked. One bank: ``spare_slots`` (local, computed, discarded by the
    caller). Without skipped picks both are ``slots``. Fixed shapes, no sync."""
    if hot_rows and cold_rows:
        hot = torch.where(valid, slots, torch.full_like(slots, hot_rows))
        cold = torch.where(valid, slots, torch.zeros_like(slots))
        return hot.to(torch.int32).contiguous(), cold.to(torch.int32).contiguous()
    spare = spare_slots(slots, valid, hot_rows + cold_rows)
    ids = torch.where(valid, slots.long(), spare).to(torch.int32).contiguous()
    return ids, ids


def gather_pick_rows(gemm2_output: torch.Tensor, permuted_idx: torch.Tensor, out: torch.Tensor
                     ) -> None:
    """``out[t, k] = gemm2_output[permuted_idx[t, k]]`` where ``permuted_idx >= 0``; other entries
    of ``out`` untouched (the other bank's). ``permuted_idx``: ``[T, K]`` or ``[T*K]`` int32."""
    t, k, h = out.shape
    idx = permuted_idx.reshape(t, k)
    local = idx >= 0
    rows = gemm2_output[:, :h][idx.clamp(min=0).long()]
    out.copy_(torch.where(local.unsqueeze(-1), rows.to(out.dtype), out))


def max_tokens_per_launch(top_k: int, num_experts: int) -> int:
    """Tokens one launch may carry before the batched GEMM's grid overflows (vLLM's bound)."""
    return max(1, min(300000, (MAX_GRID_Y - num_experts) * MIN_TILE_TOKENS_DIM // top_k))


def _flashinfer_routed_moe() -> RoutedMoe:
    from flashinfer import trtllm_fp4_block_scale_routed_moe

    return trtllm_fp4_block_scale_routed_moe


def vllm_mxfp8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations as vLLM 0.33 prepares them for FLASHINFER_TRTLLM_MXFP4_MXFP8 (non-swizzled
    ue8m0 scales, 256-aligned: ``make_mxfp4_moe_quant_config``; ``moe_kernel_quantize_input``),
    scales viewed as float8_e4m3fn as ``TrtLlmMxfp4ExpertsModular.apply`` does."""
    from vllm.model_executor.layers.fused_moe.utils import moe_kernel_quantize_input

    xq, scale = moe_kernel_quantize_input(x, None, quant_dtype="mxfp8", per_act_token_quant=False,
                                          block_shape=None, is_scale_swizzled=False,
                                          mx_alignment=256)
    return xq, scale.view(torch.float8_e4m3fn)


@dataclass(frozen=True)
class CallScratch:
    """FlashInfer allocates its scratch inside each call (torch's caching allocator, seen by
    vLLM's profile run); nothing is held between calls."""

    nbytes: int = 0


class TrtllmMxfp4Banks:
    """FlashInfer TRT-LLM routed MXFP4 experts over a layer's hot and cold banks.

    Banks hold the TRT-LLM layout (``blackwell.layout``; convert a layer's full tensors with
    ``to_kernel_layout`` before re-homing it). One instance serves every layer of its geometry.
    """

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, *,
                 activation: str = "mxfp8", swiglu_limit: float | None = None,
                 tune_max_num_tokens: int = 8192, routed_moe: RoutedMoe | None = None,
                 quantize: Quantize | None = None, convert: Callable[[dict], None] | None = None,
                 device: torch.device | str | None = None) -> None:
        """``activation``: ``mxfp8`` (FLASHINFER_TRTLLM_MXFP4_MXFP8, vLLM 0.33's first choice for
        DeepSeek-V4-style MXFP4) or ``bf16`` (…_MXFP4_BF16). ``swiglu_limit``: the layer's clamp
        (FlashInfer ``gemm1_clamp_limit``, per local expert). ``routed_moe``/``quantize``/``convert``:
        injectable stand-ins for FlashInfer's kernel, vLLM's activation quantizer and vLLM's
        weight conversion (default: the real ones, imported on first use)."""
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        check_bank_separable(hidden, intermediate)
        self.hidden, self.intermediate = int(hidden), int(intermediate)
        self.num_experts, self.top_k = int(num_experts), int(top_k)
        self.activation = activation
        self.swiglu_limit = check_swiglu_limit(swiglu_limit)
        self.tune_max_num_tokens = int(tune_max_num_tokens)
        self._routed_moe = routed_moe
        self._quantize = quantize
        self._convert = convert
        self.device = None if device is None else torch.device(device)
        self._clamp: torch.Tensor | None = None
        self.workspace = CallScratch()
        clamp = "" if self.swiglu_limit is None else f", swiglu_limit={self.swiglu_limit:g}"
        self.name = (f"FlashInfer TRT-LLM routed MXFP4 per bank (do_finalize=False, "
                     f"act {activation}{clamp}) + fp32-fma finalize")

    # -- layout ----------------------------------------------------------------------------
    def to_kernel_layout(self, tensors: dict[str, torch.Tensor]) -> None:
        """Convert one layer's full checkpoint-layout tensors in place (vLLM's conversion unless
        ``convert`` was injected). Call before re-homing or building the unsplit layer."""
        if self._convert is not None:
            self._convert(tensors)
            return
        from .layout import convert_with_vllm

        convert_with_vllm(tensors, self.activation)

    # -- the call ---------------------------------------------------------------------------
    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Quantize the layer input once for both banks (bf16: as is)."""
        if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"x must be bf16 [T, {self.hidden}], got {x.dtype} {tuple(x.shape)}")
        if self.activation == "bf16":
            return x.contiguous(), None
        quantize = self._quantize or vllm_mxfp8_quantize
        return quantize(x)

    def _clamp_limit(self, rows: int, device: torch.device) -> torch.Tensor | None:
        if self.swiglu_limit is None:
            return None
        if self._clamp is None or self._clamp.device != device or self._clamp.numel() < rows:
            self._clamp = torch.full((max(rows, self.num_experts),), self.swiglu_limit,
                                     dtype=torch.float32, device=device)
        return self._clamp[:rows]

    def bank_call(self, x_quant: torch.Tensor, x_scale: torch.Tensor | None, ids: torch.Tensor,
                  weights: torch.Tensor, bank: ExpertBank, offset: int, num_experts: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """One ``do_finalize=False`` launch over ``bank`` as local experts
        ``[offset, offset + bank.num_rows)`` of ``num_experts``; returns (gemm2_output, permuted_idx)."""
        routed_moe = self._routed_moe or _flashinfer_routed_moe()
        result = routed_moe(
            topk_ids=(ids, weights),
            routing_bias=None,
            hidden_states=x_quant,
            hidden_states_scale=x_scale,
            gemm1_weights=bank["w13_weight"],
            gemm1_weights_scale=bank["w13_weight_scale"],
            gemm1_bias=bank.tensors.get("w13_bias"),
            gemm1_alpha=None,
            gemm1_beta=None,
            gemm1_clamp_limit=self._clamp_limit(bank.num_rows, x_quant.device),
            gemm2_weights=bank["w2_weight"],
            gemm2_weights_scale=bank["w2_weight_scale"],
            gemm2_bias=bank.tensors.get("w2_bias"),
            output1_scale_scalar=None,
            output1_scale_gate_scalar=None,
            output2_scale_scalar=None,
            num_experts=num_experts,
            top_k=ids.shape[1],
            n_group=None,
            topk_group=None,
            intermediate_size=self.intermediate,
            local_expert_offset=offset,
            local_num_experts=bank.num_rows,
            routed_scaling_factor=None,
            routing_method_type=RENORMALIZE,
            do_finalize=False,
            enable_pdl=True,
            activation_type=SWIGLU,
            output=None,
            tune_max_num_tokens=self.tune_max_num_tokens,
        )
        if isinstance(result, torch.Tensor) or len(result) != 3:
            raise RuntimeError("FlashInfer's do_finalize=False call did not return "
                               "[gemm2_output, expert_weights, expanded_idx_to_permuted_idx]")
        gemm2_output, _, permuted_idx = result
        return gemm2_output, permuted_idx

    def pick_outputs(self, layer: ResidentLayer, x: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, pick_out: torch.Tensor | None = None) -> torch.Tensor:
        """Unweighted per-pick rows ``[T, K, H]`` bf16 of both banks (one launch per non-empty
        bank per chunk of ``max_tokens_per_launch`` tokens). Rows of skipped picks (ids outside
        ``0..E-1``) are 0, also in a reused ``pick_out``."""
        t, k = topk_ids.shape
        if layer.num_experts != self.num_experts or k != self.top_k:
            raise ValueError(f"layer has {layer.num_experts} experts / top-{k}; this kernel was "
                             f"built for {self.num_experts} / top-{self.top_k}")
        fresh = pick_out is None
        if pick_out is None:
            pick_out = torch.zeros(t, k, self.hidden, dtype=torch.bfloat16, device=x.device)
        x_quant, x_scale = self.prepare(x)
        valid = valid_ids(topk_ids, self.num_experts)
        slots = bank_slots(layer.row_codes, topk_ids, layer.hot.num_rows)
        hot_ids, cold_ids = launch_ids(slots, valid, layer.hot.num_rows, layer.cold.num_rows)
        # do_finalize=False returns the weights untouched; a skipped pick's is 0 all the same
        weights = routed_weights(topk_weights, valid).contiguous()
        chunk = max_tokens_per_launch(k, self.num_experts)
        banks = [(b, off, ids) for b, off, ids in ((layer.hot, 0, hot_ids),
                                                   (layer.cold, layer.hot.num_rows, cold_ids))
                 if b.num_rows]
        for start in range(0, t, chunk):
            end = min(start + chunk, t)
            xs = None if x_scale is None else x_scale[start:end]
            for bank, offset, ids in banks:
                gemm2, idx = self.bank_call(x_quant[start:end], xs, ids[start:end],
                                            weights[start:end], bank, offset, self.num_experts)
                # a skipped pick's row (one-bank layer: computed on a spare slot) is not read
                idx = torch.where(valid[start:end].reshape(-1), idx.reshape(-1),
                                  torch.full_like(idx.reshape(-1), -1))
                gather_pick_rows(gemm2, idx, pick_out[start:end])
        if not fresh:   # a fresh buffer is already 0 where no bank wrote; a reused one may be stale
            zero_skipped_rows(pick_out, valid)
        return pick_out

    def forward(self, layer: ResidentLayer, x: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, *, counter: ExpertCounter | None = None,
                token_mask: torch.Tensor | None = None, decode_mask: torch.Tensor | None = None,
                out: torch.Tensor | None = None, out_dtype: torch.dtype | None = None
                ) -> torch.Tensor:
        """The layer's routed-expert output ``[T, H]``: both banks, then one finalize. The same
        signature as ``gpu.experts.TritonMxfp4Experts.forward`` (the plugin's fused path); the
        picks are counted with ``counter.count`` (FlashInfer has no in-kernel counter). A pick
        with an id outside ``0..E-1`` gets a zero row and weight 0: ``fma(0, 0, acc)``."""
        if counter is not None:
            counter.count(layer.layer_index, topk_ids, token_mask=token_mask,
                          decode_mask=decode_mask)
        pick_out = self.pick_outputs(layer, x, topk_weights, topk_ids)
        weights = routed_weights(topk_weights, valid_ids(topk_ids, self.num_experts))
        return finalize(pick_out, weights, out_dtype or x.dtype, out=out)

    # -- the core's per-pick contract -----------------------------------------------------
    def per_pick_fn(self) -> PerPickExpertFn:
        """``core.split.PerPickExpertFn`` over one bank: in-bank picks keep their row, the others
        get id ``bank.num_rows`` (in range, not local: computed nowhere, ``-1`` in the map), with
        ``num_experts = max(layer experts, rows + 1)``."""

        def per_pick(hidden_states: torch.Tensor, bank: ExpertBank, rows: torch.Tensor,
                     mask: torch.Tensor, out: torch.Tensor) -> None:
            x_quant, x_scale = self.prepare(hidden_states)
            r = bank.num_rows
            ids = torch.where(mask, rows, torch.full_like(rows, r)).to(torch.int32).contiguous()
            weights = torch.ones(rows.shape, dtype=torch.float32, device=rows.device)
            gemm2, idx = self.bank_call(x_quant, x_scale, ids, weights, bank, 0,
                                        max(self.num_experts, r + 1))
            gather_pick_rows(gemm2, idx, out)

        return per_pick
