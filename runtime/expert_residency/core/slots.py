"""Adaptive residency's swaps as transfers into spare rows: the copies run while steps run, the
barrier only flips map entries and recycles rows.

A layer re-homed for adaptive residency has spare rows (``rehome_layer(..., hot_spare=S,
cold_spare=P)``; ``SPARE`` in the host mirrors): rows no code of the live map points at. A swap —
cold expert ``X`` (host row ``c``) in, hot expert ``Y`` (HBM row ``h``) out — becomes a
``Transfer``:

1. **copy in**: ``X``'s host row ``c`` → a spare HBM row ``s`` (host → HBM);
2. **copy out**, only where the host does not already hold ``Y``: ``Y``'s HBM row ``h`` → a spare
   host row ``t`` (HBM → host). Where it does (``layer.host_copies``: a host row still holding the
   bytes of a hot expert, e.g. the row it was promoted from, or every hot expert when the lane keeps
   host copies of all experts), ``t`` is that row and nothing is copied;
3. **flip** (at a barrier, after the copies landed): ``codes[X] = s``, ``codes[Y] = ~t``;
4. **recycle**: ``h`` becomes a spare HBM row; ``c`` keeps ``X``'s bytes and becomes ``X``'s host
   copy (demoting ``X`` later costs no copy), reclaimed as a spare host row only when a copy out
   needs a row and none is free (oldest copy first).

Steps 1–2 only *read* rows of the live map (forwards read them too: read/read) and only *write*
rows nothing reads, so they run beside the steps; every forward before the flip sees the old map
with all its rows intact, every forward after it the new one. The flip waits (on the device) for
the copies, and copies into a recycled row wait for the step stream to pass the flip that retired
it (``core.copies``). ``check_destination`` refuses a copy into a row the live map reads.

Copies go in ``CHUNKS_PER_ROW`` byte-range chunks of the expert's rows (all of its tensors, in
order), so a per-step budget smaller than one expert spreads a row over several steps; chunk ``j``
of a transfer holds both directions' slice ``j``. Everything here is host bookkeeping, a function of
the plan and the tick count only: tensor-parallel ranks (each holding ``1/tp`` of every row, the
same number of chunks) issue and flip the same transfers at the same steps.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from .banks import SPARE, ExpertBank, ResidentLayer
from .copies import Copy, RowPiece

CHUNKS_PER_ROW = 4
"""Byte-range chunks per expert row: the copy budget's unit is a quarter of an expert."""

FLIP_BUFFERS = 4
"""Pinned upload buffers a ``MapFlipper`` cycles through (a flip waits for the upload of the flip
that used its buffer this many flips ago, normally long done)."""


class Swap(NamedTuple):
    """One accepted exchange: ``promote`` (cold now) becomes hot, ``demote`` (hot now) goes cold."""

    layer: int
    promote: int
    demote: int


@dataclass
class Transfer:
    """One swap in flight (see the module docstring)."""

    swap: Swap
    hot_row: int
    """Spare HBM row the promoted expert is copied into."""
    host_row: int
    """Host row the demoted expert is served from after the flip."""
    copy_back: bool
    """Whether the demoted expert is copied out (False: ``host_row`` already holds its bytes)."""
    from_hot_row: int
    """The demoted expert's HBM row now (a spare row after the flip)."""
    from_host_row: int
    """The promoted expert's host row now (its host copy after the flip)."""
    chunks: list[list[Copy]]
    row_bytes: int
    gain: float = 0.0
    """Ranked score of the promoted expert minus the demoted one's (transfers run in this order)."""
    issued: int = 0
    issued_at: int = -1
    """Forwards counted when the last chunk was issued."""
    marker: Any = None

    @property
    def all_issued(self) -> bool:
        return self.issued == len(self.chunks)

    @property
    def bytes_in(self) -> int:
        return self.row_bytes

    @property
    def bytes_out(self) -> int:
        return self.row_bytes if self.copy_back else 0

    def codes(self) -> list[tuple[int, int]]:
        """``(expert, new code)`` pairs of the flip."""
        return [(self.swap.promote, self.hot_row), (self.swap.demote, -self.host_row - 1)]


def row_bytes(layer: ResidentLayer) -> int:
    """Bytes of one expert row (every tensor of the layer)."""
    return sum(t[0].numel() * t.element_size() for t in layer.hot.tensors.values()) if layer.hot.num_rows else 0


def bank_byte_views(bank: ExpertBank) -> list[torch.Tensor]:
    """Per tensor of the bank, a ``uint8 [rows, bytes per row]`` view over the same memory: made
    once, so a copy piece is one slice of it (``view[row, lo:hi]``) instead of a reshape per row
    on the step path. A bank tensor that is not contiguous is refused (a copy into a reshaped
    copy would write nowhere)."""
    views = []
    for name, t in bank.tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"adaptive residency: bank tensor {name!r} is not contiguous; its rows "
                             "cannot be copied as byte ranges")
        views.append(t.view(t.shape[0], math.prod(t.shape[1:])).view(torch.uint8))
    return views


def chunk_bounds(sizes: Sequence[int], chunks: int = CHUNKS_PER_ROW) -> list[list[tuple[int, int, int]]]:
    """``chunks`` equal byte ranges of tensors of ``sizes`` bytes laid end to end, as
    ``(tensor, lo, hi)`` pieces per chunk (a range may span two tensors: one piece each)."""
    total = sum(sizes)
    out: list[list[tuple[int, int, int]]] = []
    for j in range(chunks):
        lo, hi = j * total // chunks, (j + 1) * total // chunks
        pieces, start = [], 0
        for k, size in enumerate(sizes):
            a, b = max(lo, start), min(hi, start + size)
            if b > a:
                pieces.append((k, a - start, b - start))
            start += size
        out.append(pieces)
    return out


def _row_chunks(dst: list[torch.Tensor], dst_row: int, src: list[torch.Tensor], src_row: int, direction: str,
                bounds: list[list[tuple[int, int, int]]]) -> list[list[Copy]]:
    """The copies of one row, from row ``src_row`` of the byte views ``src`` (``bank_byte_views``)
    to row ``dst_row`` of ``dst``, chunked by ``bounds`` (``chunk_bounds``), as ``RowPiece`` s: no
    tensor view is made on the step path unless a copy engine asks for one."""
    return [[RowPiece(dst[k], dst_row, src[k], src_row, a, b, direction) for k, a, b in pieces] for pieces in bounds]


class LayerSlots:
    """One layer's spare rows, host copies and experts in flight (host bookkeeping, no device op)."""

    def __init__(self, layer: ResidentLayer) -> None:
        self.layer = layer
        copy_rows = set(layer.host_copies.values())
        self.free_hot = deque(r for r, e in enumerate(layer.hot_ids) if e == SPARE)
        self.free_host = deque(r for r, e in enumerate(layer.cold_ids) if e == SPARE and r not in copy_rows)
        self.busy: set[int] = set()
        self._row_bytes = row_bytes(layer)
        self._hot_views, self._cold_views = bank_byte_views(layer.hot), bank_byte_views(layer.cold)
        self._bounds: dict[int, list[list[tuple[int, int, int]]]] = {}   # per chunk count

    @property
    def spare_hot(self) -> int:
        return sum(1 for e in self.layer.hot_ids if e == SPARE)

    def reserve(self, swap: Swap, *, gain: float = 0.0, chunks: int = CHUNKS_PER_ROW) -> Transfer | None:
        """A transfer for ``swap`` with its rows reserved, or None when this layer has no spare HBM
        row (or no host row for the copy out) left, or either expert is already in flight."""
        layer, promote, demote = self.layer, swap.promote, swap.demote
        if promote in self.busy or demote in self.busy:
            return None
        if promote not in layer.cold_ids:
            raise ValueError(f"layer {layer.layer_index}: expert {promote} is not cold")
        if demote not in layer.hot_ids:
            raise ValueError(f"layer {layer.layer_index}: expert {demote} is not hot")
        if not self.free_hot:
            return None
        copy_back = demote not in layer.host_copies
        if copy_back and not self.free_host:
            victim = next((e for e in layer.host_copies if e not in self.busy), None)
            if victim is None:
                return None
            self.free_host.append(layer.host_copies.pop(victim))   # its bytes are no longer kept
        hot_row = self.free_hot.popleft()
        host_row = self.free_host.popleft() if copy_back else layer.host_copies.pop(demote)
        from_hot, from_host = layer.hot_ids.index(demote), layer.cold_ids.index(promote)
        bounds = self._bounds.get(chunks)
        if bounds is None:
            bounds = self._bounds[chunks] = chunk_bounds([v.shape[1] for v in self._hot_views], chunks)
        plan = _row_chunks(self._hot_views, hot_row, self._cold_views, from_host, "in", bounds)
        if copy_back:
            out = _row_chunks(self._cold_views, host_row, self._hot_views, from_hot, "out", bounds)
            plan = [a + b for a, b in zip(plan, out)]
        self.busy |= {promote, demote}
        return Transfer(swap, hot_row, host_row, copy_back, from_hot, from_host, plan, self._row_bytes, gain)

    def check_destination(self, transfer: Transfer) -> None:
        """RuntimeError unless the transfer's destinations are rows no code points at (the guard
        that keeps copies beside the steps exact)."""
        layer = self.layer
        if layer.hot_ids[transfer.hot_row] != SPARE:
            raise RuntimeError(f"adaptive residency: layer {layer.layer_index}: a copy would overwrite HBM row "
                               f"{transfer.hot_row}, which serves expert {layer.hot_ids[transfer.hot_row]}")
        if transfer.copy_back and (layer.cold_ids[transfer.host_row] != SPARE
                                   or transfer.host_row in layer.host_copies.values()):
            raise RuntimeError(f"adaptive residency: layer {layer.layer_index}: a copy would overwrite host row "
                               f"{transfer.host_row}, which holds an expert")

    def retire(self, transfer: Transfer) -> None:
        """After the flip: the host mirrors follow the device map; the demoted expert's HBM row is
        spare; the promoted expert's host row keeps its bytes as its host copy."""
        layer, swap = self.layer, transfer.swap
        layer.hot_ids[transfer.hot_row] = swap.promote
        layer.hot_ids[transfer.from_hot_row] = SPARE
        layer.cold_ids[transfer.host_row] = swap.demote
        layer.cold_ids[transfer.from_host_row] = SPARE
        layer.host_copies[swap.promote] = transfer.from_host_row
        self.free_hot.append(transfer.from_hot_row)
        self.busy -= {swap.promote, swap.demote}

    def release(self, transfer: Transfer) -> None:
        """A transfer dropped before its flip: its rows go back (a host copy stays a host copy)."""
        swap = transfer.swap
        self.free_hot.appendleft(transfer.hot_row)
        if transfer.copy_back:
            self.free_host.appendleft(transfer.host_row)
        else:
            self.layer.host_copies[swap.demote] = transfer.host_row
        self.busy -= {swap.promote, swap.demote}


@dataclass
class MapFlipper:
    """Writes the flip's code entries into the layers' device maps: one host-to-device copy and
    one ``index_copy_`` for all of a barrier's flips when every layer's map is a row of one
    ``[L, E]`` table (``share_row_codes``), else one ``index_copy_`` per layer."""

    layers: Sequence[ResidentLayer]
    capacity: int
    table: torch.Tensor | None = None
    _host: list[list[torch.Tensor]] | None = field(default=None, repr=False)
    _dev: list[list[torch.Tensor]] | None = field(default=None, repr=False)
    _done: list[Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.table = shared_codes_table(self.layers)
        self._slot = 0
        if self.table is not None and self.table.is_cuda:
            # (flat index, code) pairs: two pinned rows uploaded as two contiguous copies, in a
            # ring of FLIP_BUFFERS so a flip reuses a buffer only once the flip that used it
            # FLIP_BUFFERS flips ago was uploaded (flips may come on consecutive steps)
            size = max(self.capacity, 1)
            self._host = [[torch.zeros(size, dtype=torch.int64, pin_memory=True) for _ in range(2)]
                          for _ in range(FLIP_BUFFERS)]
            self._dev = [[torch.zeros(size, dtype=torch.int64, device=self.table.device) for _ in range(2)]
                         for _ in range(FLIP_BUFFERS)]
            self._done = [None] * FLIP_BUFFERS
            self._warm_up()

    def _warm_up(self) -> None:
        """Flip one entry to its own value at start-up, so the flip's kernels (a cast and an
        ``index_copy_``) are loaded now: CUDA loads a kernel's module at its first launch, which
        took ~15 ms of host time on the H200 at the first flip after a class shift."""
        self.flip([(0, 0, int(self.table.view(-1)[0]))])
        torch.cuda.current_stream(self.table.device).synchronize()

    def flip(self, entries: Sequence[tuple[int, int, int]]) -> None:
        """``entries``: ``(layer position, expert, code)``, written in stream order."""
        if not entries:
            return
        if self.table is None:
            by_layer: dict[int, list[tuple[int, int]]] = {}
            for pos, expert, code in entries:
                by_layer.setdefault(pos, []).append((expert, code))
            for pos, pairs in by_layer.items():
                codes = self.layers[pos].row_codes
                index = torch.tensor([e for e, _ in pairs], dtype=torch.long, device=codes.device)
                values = torch.tensor([c for _, c in pairs], dtype=codes.dtype, device=codes.device)
                codes.index_copy_(0, index, values)
            return
        width = self.table.shape[1]
        flat = [pos * width + expert for pos, expert, _ in entries]
        values = [code for _, _, code in entries]
        if self._host is None:   # CPU: the table is host memory
            self.table.view(-1).index_copy_(0, torch.tensor(flat, dtype=torch.long),
                                            torch.tensor(values, dtype=self.table.dtype))
            return
        n = len(entries)
        slot = self._slot
        self._slot = (slot + 1) % FLIP_BUFFERS
        host, dev = self._host[slot], self._dev[slot]
        if n > host[0].numel():
            raise RuntimeError(f"adaptive residency: {n} map entries exceed the flip buffer ({host[0].numel()})")
        if self._done[slot] is not None:
            self._done[slot].synchronize()   # this buffer's last upload, FLIP_BUFFERS flips ago
        for h, d, data in zip(host, dev, (flat, values)):
            h[:n].copy_(torch.tensor(data, dtype=torch.int64))
            d[:n].copy_(h[:n], non_blocking=True)
        self._done[slot] = torch.cuda.current_stream(self.table.device).record_event()
        self.table.view(-1).index_copy_(0, dev[0][:n], dev[1][:n].to(self.table.dtype))


def share_row_codes(layers: Mapping[int, ResidentLayer], order: Sequence[int] | None = None) -> torch.Tensor:
    """Put every layer's device map in one ``[L, E]`` table (rows in ``order``, default sorted
    layer index) and point each ``layer.row_codes`` at its row. Call before any CUDA graph is
    captured (a graph keeps the address it read); afterwards a barrier's flips are one write."""
    order = list(order if order is not None else sorted(layers))
    first = layers[order[0]].row_codes
    table = torch.stack([layers[i].row_codes.to(first.device) for i in order])
    for row, index in enumerate(order):
        layers[index].row_codes = table[row]
    return table


def shared_codes_table(layers: Sequence[ResidentLayer]) -> torch.Tensor | None:
    """The ``[L, E]`` table whose rows are the layers' maps in this order, if there is one."""
    base = getattr(layers[0].row_codes, "_base", None)
    if base is None or base.dim() != 2 or base.shape[0] != len(layers):
        return None
    for row, layer in enumerate(layers):
        codes = layer.row_codes
        if codes._base is not base or codes.data_ptr() != base[row].data_ptr() or codes.shape != base[row].shape:
            return None
    return base


def add_spare_rows(layer: ResidentLayer, hot_spare: int, cold_spare: int, *, host_copies: bool = False) -> ResidentLayer:
    """The same layer with spare rows (and optionally a host copy of every hot expert), its banks
    re-allocated beside the old ones (same device, pinned where the old host bank was). For layers
    built before adaptive residency was configured (tests, the simulation); an engine re-homes with
    the spare rows directly (``rehome_layer(..., hot_spare=, cold_spare=)``), which needs no second
    copy. The returned layer shares ``row_codes`` with ``layer``."""
    if layer.host_copies or SPARE in layer.hot_ids or SPARE in layer.cold_ids:
        raise ValueError(f"layer {layer.layer_index} already has spare rows")
    hot_ids, cold_ids = list(layer.hot_ids), list(layer.cold_ids)
    extra = len(hot_ids) if host_copies else 0
    hot = ExpertBank({}, len(hot_ids) + hot_spare)
    cold = ExpertBank({}, len(cold_ids) + extra + cold_spare)
    for name, t in layer.hot.tensors.items():
        c = layer.cold.tensors[name]
        grown = torch.zeros((hot.num_rows, *t.shape[1:]), dtype=t.dtype, device=t.device)
        grown[:len(hot_ids)].copy_(t)
        pinned = c.device.type == "cpu" and c.is_pinned()
        grown_cold = torch.zeros((cold.num_rows, *c.shape[1:]), dtype=c.dtype, device=c.device, pin_memory=pinned)
        grown_cold[:len(cold_ids)].copy_(c)
        if host_copies:
            grown_cold[len(cold_ids):len(cold_ids) + extra].copy_(t)
        hot.tensors[name], cold.tensors[name] = grown, grown_cold
    copies = {e: len(cold_ids) + r for r, e in enumerate(hot_ids)} if host_copies else {}
    return ResidentLayer(layer.layer_index, layer.num_experts, hot, cold, hot_ids + [SPARE] * hot_spare,
                         cold_ids + [SPARE] * (extra + cold_spare), layer.row_codes, copies)
