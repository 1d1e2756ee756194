"""Expert banks of one MoE layer and re-homing a layer's full expert tensors into them.

A layer's experts are a set of named tensors whose dim 0 is the expert id (``w13_weight``,
``w2_weight``, MXFP4 packed ``uint8`` weights, ``uint8`` ue8m0 ``*_weight_scale``, biases, ...).
Re-homing splits **every** tensor with the same partition: hot rows into a device tensor (the hot
bank), cold rows into host memory the device reads in place (the cold bank).

Where memory comes from is a hook, ``BankAllocator``:

* ``device_allocator(device)`` — ordinary device tensors (the hot bank);
* ``host_allocator(pin=...)`` — plain (optionally pinned) host tensors; on the CPU build this *is*
  the cold bank;
* ``mapped_host_allocator(view_fn)`` — pinned host memory plus a device view of the same address,
  the GPU cold bank. ``view_fn`` is the GPU engineer's plug point (e.g. vLLM's
  ``vllm.utils.torch_utils.get_accelerator_view_from_cpu_tensor``); the pinned host tensor is kept
  alive in ``ExpertBank.owners`` because the view does not own it.

``rehome_layer`` consumes the caller's tensors: it *pops* each one from the mapping it is given as
soon as that tensor's rows are copied, so when the mapping held the last reference the original
is freed before the next tensor is split (peak = one tensor's transient, not a layer's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .devmap import check_partition, encode_row_codes

SPARE = -1
"""``ResidentLayer.hot_ids`` / ``cold_ids`` entry of a row that holds no expert of the live map: a
spare row (adaptive residency copies a promoted expert into a spare hot row while steps run, and a
demoted one into a spare host row; ``core.slots``). No row code ever points at it."""


@dataclass
class AllocatedTensor:
    """A bank tensor plus whatever must stay alive for it to stay valid (None if it owns itself)."""

    tensor: torch.Tensor
    owner: object | None = None


class BankAllocator(Protocol):
    """Allocate an *uninitialised* tensor of ``shape``/``dtype`` for a bank."""

    def __call__(self, shape: tuple[int, ...], dtype: torch.dtype) -> AllocatedTensor: ...


def device_allocator(device: torch.device | str) -> BankAllocator:
    """Hot-bank allocator: ``torch.empty`` on ``device``."""
    dev = torch.device(device)

    def allocate(shape: tuple[int, ...], dtype: torch.dtype) -> AllocatedTensor:
        return AllocatedTensor(torch.empty(shape, dtype=dtype, device=dev))

    return allocate


def host_allocator(pin: bool = False) -> BankAllocator:
    """Cold-bank allocator for the CPU build (``pin=False``) or a pinned host bank without a view."""

    def allocate(shape: tuple[int, ...], dtype: torch.dtype) -> AllocatedTensor:
        return AllocatedTensor(torch.empty(shape, dtype=dtype, device="cpu", pin_memory=pin))

    return allocate


def mapped_host_allocator(view_fn: Callable[[torch.Tensor], torch.Tensor]) -> BankAllocator:
    """Cold-bank allocator for the GPU: pinned host memory read in place through ``view_fn(host)``.

    ``view_fn`` must return a device tensor aliasing the pinned host tensor (``cudaHostAlloc``-style
    mapped memory; not managed memory, not VMM — the seeds measured those at a quarter of the speed).
    """

    def allocate(shape: tuple[int, ...], dtype: torch.dtype) -> AllocatedTensor:
        host = torch.empty(shape, dtype=dtype, device="cpu", pin_memory=True)
        return AllocatedTensor(view_fn(host), owner=host)

    return allocate


@dataclass(frozen=True)
class BankBytes:
    """Bytes placed in each bank (the start-up report's figures)."""

    hot: int = 0
    cold: int = 0

    def __add__(self, other: BankBytes) -> BankBytes:
        return BankBytes(self.hot + other.hot, self.cold + other.cold)

    @property
    def total(self) -> int:
        return self.hot + self.cold


@dataclass
class ExpertBank:
    """One bank: named tensors whose dim 0 is the bank row (``num_rows`` rows, possibly 0)."""

    tensors: dict[str, torch.Tensor]
    num_rows: int
    owners: list[object] = field(default_factory=list)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def row_nbytes(self) -> int:
        """Bytes of one row over every tensor, from the tensors' shapes (so also of a bank with no
        rows: its tensors keep the row shape)."""
        return sum(math.prod(t.shape[1:]) * t.element_size() for t in self.tensors.values())

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]


@dataclass
class ResidentLayer:
    """One MoE layer after re-homing.

    ``hot_ids[r]``/``cold_ids[r]``: expert held in row ``r`` of each bank (host mirror of ``row_codes``,
    updated by swaps), ``SPARE`` for a row no code points at (adaptive lanes re-home with spare rows:
    ``rehome_layer(..., hot_spare=, cold_spare=)``). ``row_codes``: the device ``int32[num_experts]``
    map (``core.devmap``). ``host_copies``: hot experts whose bytes also sit in a host row that no
    code points at (expert -> cold-bank row): demoting one of them is a map change, no copy.
    An *unsplit* layer (the bit-identity reference) has every expert in the hot bank in id order and
    an empty cold bank.
    """

    layer_index: int
    num_experts: int
    hot: ExpertBank
    cold: ExpertBank
    hot_ids: list[int]
    cold_ids: list[int]
    row_codes: torch.Tensor
    host_copies: dict[int, int] = field(default_factory=dict)

    @property
    def unsplit(self) -> bool:
        return self.cold.num_rows == 0

    @property
    def hot_experts(self) -> list[int]:
        """The experts the hot bank serves, in row order (spare rows left out)."""
        return [e for e in self.hot_ids if e != SPARE]

    @property
    def cold_experts(self) -> list[int]:
        """The experts the cold bank serves, in row order (spare rows and host copies left out)."""
        return [e for e in self.cold_ids if e != SPARE]

    def bank_bytes(self) -> BankBytes:
        return BankBytes(self.hot.nbytes(), self.cold.nbytes())

    def expert_rows(self, expert: int) -> tuple[str, int]:
        """(bank name, row) of ``expert`` from the host mirror (no device sync)."""
        if expert in self.hot_ids:
            return "hot", self.hot_ids.index(expert)
        return "cold", self.cold_ids.index(expert)


def tensor_nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def rehome_layer(tensors: MutableMapping[str, torch.Tensor], hot_ids: Sequence[int],
                 cold_ids: Sequence[int], *, layer_index: int, hot_alloc: BankAllocator,
                 cold_alloc: BankAllocator,
                 codes_device: torch.device | str | None = None, hot_spare: int = 0,
                 cold_spare: int = 0, host_copies: bool = False) -> ResidentLayer:
    """Split one layer's full expert tensors into a hot and a cold bank; pop (free) the originals.

    ``tensors``: name → tensor with dim 0 = ``num_experts`` (all must agree). Each is popped from the
    mapping once its rows are copied. ``hot_ids``/``cold_ids``: experts in physical row order of each
    bank. ``codes_device``: where the ``int32`` row map lives (default: the hot bank's device).
    ``hot_spare``/``cold_spare``: extra rows after each bank's experts (zeroed, ``SPARE`` in the
    host mirrors) for adaptive residency's copies; ``host_copies``: the cold bank also keeps a copy
    of every hot expert (rows after the cold experts, before the spare ones), so a demotion never
    copies back. Returns the ``ResidentLayer``; ``layer.bank_bytes()`` gives the bytes placed.
    """
    names = list(tensors.keys())
    if not names:
        raise ValueError(f"layer {layer_index}: no expert tensors to re-home")
    num_experts = _common_num_experts(tensors, layer_index)
    hot = [int(e) for e in hot_ids]
    cold = [int(e) for e in cold_ids]
    try:  # validate before touching anything: a bad map must leave the caller's tensors intact
        check_partition(hot, cold, num_experts)
    except ValueError as exc:
        raise ValueError(f"layer {layer_index}: {exc}") from None
    if hot_spare < 0 or cold_spare < 0:
        raise ValueError(f"layer {layer_index}: spare rows must be >= 0, got {hot_spare}/{cold_spare}")
    # the cold bank's experts, then (host_copies) a copy of every hot expert, then the spare rows
    host_rows = cold + (hot if host_copies else [])
    hot_bank = ExpertBank({}, len(hot) + hot_spare)
    cold_bank = ExpertBank({}, len(host_rows) + cold_spare)
    hot_device = None
    for name in names:
        source = tensors[name]
        for bank, ids, alloc, spare in ((hot_bank, hot, hot_alloc, hot_spare),
                                        (cold_bank, host_rows, cold_alloc, cold_spare)):
            allocated = alloc((len(ids) + spare, *source.shape[1:]), source.dtype)
            copy_expert_rows(allocated.tensor, source, ids)
            if spare:
                allocated.tensor[len(ids):].zero_()   # deterministic bytes in rows nothing reads
            bank.tensors[name] = allocated.tensor
            if allocated.owner is not None:
                bank.owners.append(allocated.owner)
        hot_device = hot_bank.tensors[name].device
        if source.is_cuda:
            # The original may be host memory behind a device view (a UVA-offloaded parameter):
            # its host allocator cannot see the in-flight reads, so let them finish before it can
            # be freed and reused. Load time only; one wait per tensor.
            torch.cuda.current_stream(source.device).synchronize()
        del source
        tensors.pop(name)
    codes = encode_row_codes(hot, cold, num_experts,
                             device=codes_device if codes_device is not None else hot_device)
    copies = {e: len(cold) + r for r, e in enumerate(hot)} if host_copies else {}
    return ResidentLayer(layer_index, num_experts, hot_bank, cold_bank,
                         hot + [SPARE] * hot_spare, cold + [SPARE] * (len(copies) + cold_spare), codes,
                         copies)


def build_unsplit_layer(tensors: Mapping[str, torch.Tensor], *, layer_index: int,
                        codes_device: torch.device | str | None = None) -> ResidentLayer:
    """The reference: every expert in one bank, in id order, sharing (not copying) ``tensors``."""
    num_experts = _common_num_experts(tensors, layer_index)
    device = next(iter(tensors.values())).device
    bank = ExpertBank(dict(tensors), num_experts)
    empty = ExpertBank({name: t[:0] for name, t in tensors.items()}, 0)
    ids = list(range(num_experts))
    codes = encode_row_codes(ids, [], num_experts,
                             device=codes_device if codes_device is not None else device)
    return ResidentLayer(layer_index, num_experts, bank, empty, ids, [], codes)


def copy_expert_rows(dest: torch.Tensor, source: torch.Tensor, ids: Sequence[int]) -> None:
    """``dest[r] = source[ids[r]]`` without a full-size temporary: one slice copy per run of
    consecutive ids (positional maps are a handful of runs; scattered maps cost one copy per row)."""
    for dest_start, src_start, length in _runs(ids):
        dest[dest_start:dest_start + length].copy_(source[src_start:src_start + length])


def _runs(ids: Sequence[int]) -> Iterable[tuple[int, int, int]]:
    start = 0
    while start < len(ids):
        end = start + 1
        while end < len(ids) and ids[end] == ids[end - 1] + 1:
            end += 1
        yield start, ids[start], end - start
        start = end


def _common_num_experts(tensors: Mapping[str, torch.Tensor], layer_index: int) -> int:
    sizes = {name: t.shape[0] if t.dim() > 0 else None for name, t in tensors.items()}
    distinct = set(sizes.values())
    if len(distinct) != 1 or None in distinct:
        raise ValueError(f"layer {layer_index}: expert tensors disagree on dim 0 (experts): {sizes}")
    return int(distinct.pop())
