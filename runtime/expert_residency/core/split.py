"""Split invoke: run each pick on the bank that holds its expert, then one finalize.

The per-pick expert function is pluggable (``PerPickExpertFn``): the torch references live in
``core.reference``; the GPU engineer plugs a Triton kernel; the vLLM plugin on the CPU build plugs
vLLM's CPU expert kernel called per bank. Its contract:

``fn(hidden_states, bank, rows, mask, out) -> None``

* ``hidden_states``: ``[T, H]`` activations (the layer input, already prepared/quantized however
  the function needs — the core never looks inside).
* ``bank``: the ``ExpertBank`` to read (``bank.tensors[name]`` has ``bank.num_rows`` rows).
* ``rows``: ``int64 [T, K]`` bank row for every pick; 0 where the pick is not in this bank, so every
  entry is a valid index (fixed shapes — a kernel may compute masked picks and throw them away).
* ``mask``: ``bool [T, K]``, True where the pick is in this bank.
* ``out``: ``[T, K, H]`` shared pick-output buffer. The function must write ``out[t, k]`` =
  the **unweighted** output of expert ``rows[t, k]`` on token ``t`` wherever ``mask[t, k]``, and must
  leave every other ``out[t, k]`` untouched (the other bank writes those). No top-k reduction,
  no router weight (the finalize applies it) — unless the model applies router weights on the
  input, in which case the function scales the input and the caller passes unit weights.

Bit-identity requirement on the function: the value written for a pick must depend only on the
token's activations and the expert's rows — not on the bank's size, on which other picks are in
the bank, or on the row index. Kernels that tile by expert count must use the same tiling and
reduction order for every bank size (the torch references compute every pick with identical
shapes whatever the bank).

``dense_per_pick(compute)`` adapts a function that returns a full ``[T, K, H]`` result (values at
masked-out positions arbitrary) to this contract with a masked write.

A pick whose id is outside ``0..E-1`` (vLLM's -1) is in neither bank's mask: ``split_invoke``
leaves its ``pick_out`` row 0 and ``residency_forward`` gives it weight 0, so the finalize adds
``fma(0, 0, acc)`` for it — the bits of ``parallel.ep.ep_forward`` and the Triton kernels.

Fixed shapes and no host synchronisation throughout; the only Python branch is on a bank being
empty (a static property of the layer), so a split layer can be captured in one CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

from .banks import ExpertBank, ResidentLayer
from .devmap import route_picks
from .fma_finalize import finalize

if TYPE_CHECKING:
    from .counter import ExpertCounter


class PerPickExpertFn(Protocol):
    """See the module docstring for the full contract."""

    def __call__(self, hidden_states: torch.Tensor, bank: ExpertBank, rows: torch.Tensor,
                 mask: torch.Tensor, out: torch.Tensor) -> None: ...


DenseCompute = Callable[[torch.Tensor, ExpertBank, torch.Tensor], torch.Tensor]


def dense_per_pick(compute: DenseCompute) -> PerPickExpertFn:
    """Wrap ``compute(hidden_states, bank, rows) -> [T, K, H]`` into a ``PerPickExpertFn``."""

    def per_pick(hidden_states: torch.Tensor, bank: ExpertBank, rows: torch.Tensor,
                 mask: torch.Tensor, out: torch.Tensor) -> None:
        values = compute(hidden_states, bank, rows)
        out.copy_(torch.where(mask.unsqueeze(-1), values.to(out.dtype), out))

    return per_pick


def split_invoke(layer: ResidentLayer, hidden_states: torch.Tensor, topk_ids: torch.Tensor,
                 per_pick_fn: PerPickExpertFn, *, out_dtype: torch.dtype | None = None,
                 pick_out: torch.Tensor | None = None) -> torch.Tensor:
    """Compute every pick's unweighted expert output on its bank; return ``pick_out [T, K, H]``.

    ``out_dtype`` (default: ``hidden_states.dtype``) is the pick rows' dtype (bf16 rows in the
    seeds' kernels). ``H`` is taken from ``hidden_states`` unless ``pick_out`` is given.
    Rows of skipped picks (ids outside ``0..E-1``) are 0, also in a reused ``pick_out``.
    """
    return _split_invoke(layer, hidden_states, topk_ids, per_pick_fn, out_dtype, pick_out)[0]


def _split_invoke(layer: ResidentLayer, hidden_states: torch.Tensor, topk_ids: torch.Tensor,
                  per_pick_fn: PerPickExpertFn, out_dtype: torch.dtype | None,
                  pick_out: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``split_invoke`` plus the routing's ``valid`` mask (bool ``[T, K]``) for the finalize."""
    tokens, k = topk_ids.shape
    fresh = pick_out is None
    if pick_out is None:
        pick_out = torch.zeros(tokens, k, hidden_states.shape[-1],
                               dtype=out_dtype or hidden_states.dtype, device=hidden_states.device)
    routing = route_picks(layer.row_codes, topk_ids)
    if layer.hot.num_rows:
        per_pick_fn(hidden_states, layer.hot, routing.hot_rows, routing.hot_mask, pick_out)
    if layer.cold.num_rows:
        per_pick_fn(hidden_states, layer.cold, routing.cold_rows, routing.cold_mask, pick_out)
    valid = routing.valid
    if not fresh:   # a fresh buffer is already 0 where no bank wrote; a reused one may be stale
        zero_skipped_rows(pick_out, valid)
    return pick_out, valid


def zero_skipped_rows(pick_out: torch.Tensor, valid: torch.Tensor) -> None:
    """Zero the ``[T, K, H]`` rows of skipped picks (``~valid``), in place: a reused buffer's stale
    rows never reach the finalize. Fixed shapes, no sync."""
    pick_out.copy_(torch.where(valid.unsqueeze(-1), pick_out, torch.zeros_like(pick_out)))


def routed_weights(topk_weights: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """fp32 router weights with 0 at skipped picks (``~valid``): with their zero rows the finalize
    adds ``fma(0, 0, acc)`` for them."""
    weights = topk_weights.float()
    return torch.where(valid, weights, torch.zeros_like(weights))


def residency_forward(layer: ResidentLayer, hidden_states: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor, per_pick_fn: PerPickExpertFn, *,
                      pick_dtype: torch.dtype | None = None,
                      out_dtype: torch.dtype | None = None,
                      counter: ExpertCounter | None = None,
                      token_mask: torch.Tensor | None = None,
                      decode_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Split invoke + finalize (+ optional count): the MoE layer's routed-expert output ``[T, H]``.

    Works identically for split and unsplit layers; that is the bit-identity claim.
    ``counter``: count this step's picks for ``layer.layer_index`` (``core.counter``), with
    ``token_mask`` excluding padded tokens and ``decode_mask`` marking decode tokens.
    """
    if counter is not None:
        counter.count(layer.layer_index, topk_ids, token_mask=token_mask, decode_mask=decode_mask)
    pick_out, valid = _split_invoke(layer, hidden_states, topk_ids, per_pick_fn, pick_dtype, None)
    return finalize(pick_out, routed_weights(topk_weights, valid), out_dtype or hidden_states.dtype)

