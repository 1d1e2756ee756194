"""The device row map: one ``int32[num_experts]`` per MoE layer resolving an expert id to (bank, row).

Encoding (one int32 per expert id ``e``):

* ``code[e] >= 0``  → expert ``e`` lives in the **hot** bank at row ``code[e]``;
* ``code[e] <  0``  → expert ``e`` lives in the **cold** bank at row ``~code[e]`` (i.e. ``-code[e] - 1``).

The encoding is a plain device tensor, never a captured constant: a CUDA graph replays against
whatever it holds, so a swap only has to rewrite two of its elements (see ``core.swap``).

``route_picks`` turns router output ``topk_ids [T, K]`` into per-bank row indices and masks with
fixed shapes and no host synchronisation (every pick gets a row in both banks; the mask says which
one is real; masked-out rows are clamped to 0 so they are always valid indices). A pick whose id is
outside ``0..num_experts-1`` (vLLM's -1: computed on another rank, or unrouted) is in neither mask —
it is skipped, never looked up (``codes[-1]`` would wrap around to the last expert) — and the
finalize adds ``fma(0, 0, acc)`` for it (``core.split``), as ``parallel.ep`` and the Triton kernels do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def encode_row_codes(hot_ids: Sequence[int], cold_ids: Sequence[int], num_experts: int,
                     device: torch.device | str | None = None) -> torch.Tensor:
    """Build the ``int32[num_experts]`` code tensor for one layer.

    ``hot_ids[r]`` is the expert held in hot row ``r``; ``cold_ids[r]`` the expert in cold row ``r``.
    Every id in ``0..num_experts-1`` must appear exactly once across both lists.
    """
    hot = [int(e) for e in hot_ids]
    cold = [int(e) for e in cold_ids]
    check_partition(hot, cold, num_experts)
    codes = [0] * num_experts
    for row, expert in enumerate(hot):
        codes[expert] = row
    for row, expert in enumerate(cold):
        codes[expert] = -row - 1
    return torch.tensor(codes, dtype=torch.int32, device=device)


def decode_row_codes(codes: torch.Tensor) -> tuple[list[int], list[int]]:
    """Inverse of ``encode_row_codes`` (host side; syncs — for reports and tests, not the step path)."""
    values = [int(v) for v in codes.detach().to("cpu").tolist()]
    hot_rows = {v: e for e, v in enumerate(values) if v >= 0}
    cold_rows = {-v - 1: e for e, v in enumerate(values) if v < 0}
    if sorted(hot_rows) != list(range(len(hot_rows))) or sorted(cold_rows) != list(range(len(cold_rows))):
        raise ValueError("row codes do not describe dense hot/cold rows (a row is used twice or skipped)")
    return [hot_rows[r] for r in range(len(hot_rows))], [cold_rows[r] for r in range(len(cold_rows))]


@dataclass
class PickRouting:
    """Per-bank view of one step's picks; every tensor is ``[T, K]`` on the device of ``topk_ids``.

    ``hot_rows``/``cold_rows`` are int64 row indices into the bank (0 where the pick belongs to the
    other bank or to none); ``hot_mask``/``cold_mask`` are bool and disjoint, complementary except
    at skipped picks (ids outside ``0..E-1``), which are in neither.
    """

    hot_rows: torch.Tensor
    hot_mask: torch.Tensor
    cold_rows: torch.Tensor
    cold_mask: torch.Tensor

    @property
    def valid(self) -> torch.Tensor:
        """bool ``[T, K]``: the pick has an expert on this layer (in one of the two banks)."""
        return self.hot_mask | self.cold_mask


def valid_ids(topk_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """bool ``[T, K]``: ``0 <= id < num_experts`` (device-only, no sync)."""
    return (topk_ids >= 0) & (topk_ids < num_experts)


def lookup_routed(table: torch.Tensor, topk_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(table[id], valid)`` for router ids ``[T, K]`` into a per-expert table (row codes, an EP
    expert map): an id outside ``0..len(table)-1`` is looked up as id 0 — never ``table[-1]``'s
    wrap-around, no IndexError — and is False in ``valid`` (``valid_ids``). Fixed shapes, no sync."""
    ids = topk_ids.long()
    valid = valid_ids(ids, table.shape[0])
    return table[torch.where(valid, ids, torch.zeros_like(ids))], valid


def route_picks(codes: torch.Tensor, topk_ids: torch.Tensor) -> PickRouting:
    """Resolve ``topk_ids [T, K]`` (any integer dtype, global expert ids) through ``codes``.

    Ids outside ``0..E-1`` are in neither mask (looked up as expert 0, never as ``codes[-1]``).
    Fixed shapes, device-only ops, no ``.item()``/``nonzero``: safe inside CUDA-graph capture.
    """
    code, valid = lookup_routed(codes, topk_ids)
    hot_mask = valid & (code >= 0)
    cold_mask = valid & (code < 0)
    zero = torch.zeros_like(code)
    hot_rows = torch.where(hot_mask, code, zero).long()
    cold_rows = torch.where(cold_mask, torch.bitwise_not(code), zero).long()
    return PickRouting(hot_rows=hot_rows, hot_mask=hot_mask, cold_rows=cold_rows, cold_mask=cold_mask)


def check_partition(hot: Sequence[int], cold: Sequence[int], num_experts: int) -> None:
    """ValueError unless ``hot`` + ``cold`` hold every id in ``0..num_experts-1`` exactly once."""
    seen: dict[int, str] = {}
    for bank, ids in (("hot", hot), ("cold", cold)):
        for expert in ids:
            if not 0 <= expert < num_experts:
                raise ValueError(f"{bank} expert id {expert} is outside 0..{num_experts - 1}")
            if expert in seen:
                raise ValueError(f"expert {expert} appears twice ({seen[expert]} and {bank})")
            seen[expert] = bank
    if len(seen) != num_experts:
        missing = sorted(set(range(num_experts)) - set(seen))
        raise ValueError(f"{len(missing)} expert id(s) in neither bank, first {missing[:5]}")
