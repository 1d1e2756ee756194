"""Count-only mode's counter: one int64 per (MoE layer, expert), incremented per pick, on the device.

Used two ways:

* **count-only boot** (profile service): no row map, every expert in one bank; each MoE forward
  calls ``count`` and the dump writer (``core.dump``) snapshots ``to_histogram()`` into the dump
  folder in the shared histogram format;
* **alongside residency** (drift on a live lane): ``residency_forward(..., counter=...)``. The cost
  is one ``index_add_`` of ``T*K`` int64 ones per layer — device-only, fixed shapes, no sync.

``token_mask [T]`` (bool) excludes padded tokens (CUDA-graph padding routes garbage);
``decode_mask [T]`` (bool) marks decode tokens so the histogram can carry ``decode_tokens``.

**Decode picks** (``enable_decode_counts``; adaptive residency's decode-only ranking): a second
``[L, E]`` count of the picks of decode tokens only, two ways — per row, ``count(...,
decode_rows=)`` with the step masks' per-row decode mask (the torch per-pick path: one more
``index_add_``); or per step around a forward whose kernels count in place (the fused GPU layer):
``open_step()`` before its first counted layer, ``close_step(decode_step)`` after its last, adding
the step's picks when every real row of it is a decode row (a step that mixes prefill rows in adds
none of its picks: three small device ops per step, none per layer).
Counts are exact integers (integer atomics on the GPU), so a recount from the same ids matches.
Reading (``snapshot``) copies to the host and therefore synchronises: call it from the dump
thread or at a barrier, never on the step path. On a GPU the dump thread's copy runs on its own
stream, so increments of kernels still in flight may be missing from that snapshot (the next one
has them).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .devmap import valid_ids


class ExpertCounter:
    """Per-(layer, expert) pick counts for the MoE layers ``moe_layer_indices`` (model numbering)."""

    def __init__(self, moe_layer_indices: Sequence[int], num_experts: int,
                 device: torch.device | str = "cpu", top_k: int | None = None) -> None:
        self.moe_layer_indices = tuple(int(i) for i in moe_layer_indices)
        if len(set(self.moe_layer_indices)) != len(self.moe_layer_indices):
            raise ValueError("moe_layer_indices must be unique")
        self.num_experts = int(num_experts)
        self.top_k = top_k
        self.device = torch.device(device)
        self._row = {layer: row for row, layer in enumerate(self.moe_layer_indices)}
        layers = len(self.moe_layer_indices)
        self.counts = torch.zeros(layers, self.num_experts, dtype=torch.int64, device=self.device)
        self.tokens = torch.zeros(layers, dtype=torch.int64, device=self.device)
        self.decode_tokens = torch.zeros(layers, dtype=torch.int64, device=self.device)
        self.decode_counts: torch.Tensor | None = None
        self._step_start: torch.Tensor | None = None
        self._decode_known = True
        self._lock = threading.Lock()

    def enable_decode_counts(self) -> torch.Tensor:
        """Allocate (once) the decode-picks count ``[L, E]`` (module docstring); call before any
        CUDA graph that counts is captured."""
        if self.decode_counts is None:
            self.decode_counts = torch.zeros_like(self.counts)
            self._step_start = torch.zeros_like(self.counts)
        return self.decode_counts

    def open_step(self) -> None:
        """Per-step decode counting: remember the counts before this step's layers count."""
        if self._step_start is not None:
            self._step_start.copy_(self.counts)

    def close_step(self, decode_step: torch.Tensor) -> None:
        """Per-step decode counting: add this step's picks when ``decode_step`` (int64 ``[1]``,
        ``StepMasks.decode_step``) is 1."""
        if self.decode_counts is not None:
            self.decode_counts.add_((self.counts - self._step_start) * decode_step)

    def row_of(self, layer_index: int) -> int:
        try:
            return self._row[layer_index]
        except KeyError:
            raise ValueError(f"MoE layer {layer_index} is not counted "
                             f"(counter has {self.moe_layer_indices[:3]}...)") from None

    def count(self, layer_index: int, topk_ids: torch.Tensor, *, token_mask: torch.Tensor | None = None,
              decode_mask: torch.Tensor | None = None, decode_rows: torch.Tensor | None = None) -> None:
        """Add this step's picks ``topk_ids [T, K]`` of MoE layer ``layer_index``.

        Picks with an id outside ``0..num_experts-1`` (vLLM's -1, unrouted) count for no expert.
        ``decode_rows [T]`` (bool): with decode counts enabled, the decode tokens' picks are also
        added to ``decode_counts``."""
        row = self.row_of(layer_index)
        ids = topk_ids.long()
        routed = valid_ids(ids, self.num_experts)
        if token_mask is None:
            valid = torch.ones(topk_ids.shape[0], dtype=torch.int64, device=topk_ids.device)
            weight = routed.to(torch.int64)
        else:
            valid = token_mask.to(torch.int64)
            weight = valid.unsqueeze(1) * routed.to(torch.int64)
        ids = torch.where(routed, ids, torch.zeros_like(ids))
        self.counts[row].index_add_(0, ids.reshape(-1), weight.reshape(-1))
        if self.decode_counts is not None and decode_rows is not None:
            decode = weight * decode_rows.to(torch.int64).unsqueeze(1)
            self.decode_counts[row].index_add_(0, ids.reshape(-1), decode.reshape(-1))
        self.tokens[row] += valid.sum()
        if decode_mask is None:
            self._decode_known = False
        else:
            self.decode_tokens[row] += (valid * decode_mask.to(torch.int64)).sum()

    def reset(self) -> None:
        self.counts.zero_()
        self.tokens.zero_()
        self.decode_tokens.zero_()
        if self.decode_counts is not None:
            self.decode_counts.zero_()
        self._decode_known = True

    def snapshot(self) -> tuple[np.ndarray, int, int | None]:
        """(counts ``int64 [layers, experts]``, tokens, decode tokens or None) — synchronises.

        ``tokens`` is the largest per-layer token count: every layer sees every token, but a snapshot
        taken from another thread while a step is in flight (the dump thread) can find the later
        layers one step behind the first. Counts are never torn; at most that one step is missing
        from some layers.
        """
        with self._lock:
            counts = self.counts.detach().to("cpu").numpy().copy()
            tokens = self.tokens.detach().to("cpu").numpy()
            decode = self.decode_tokens.detach().to("cpu").numpy()
        total = int(tokens.max()) if tokens.size else 0
        return counts, total, (int(decode.max()) if self._decode_known else None)

    def to_histogram(self, *, source: str, model_revision: str = "",
                     meta: dict[str, Any] | None = None) -> Any:
        """Snapshot as an ``expert_residency.formats.Histogram``."""
        from ..formats.histogram import Histogram

        counts, tokens, decode = self.snapshot()
        return Histogram(self.moe_layer_indices, self.num_experts, counts, tokens,
                         decode_tokens=decode,
                         prefill_tokens=None if decode is None else tokens - decode,
                         source=source, model_revision=model_revision, top_k=self.top_k,
                         meta=dict(meta or {}))
