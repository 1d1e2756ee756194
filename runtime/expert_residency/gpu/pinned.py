"""Pinned host memory the GPU reads in place, without vLLM.

The cold bank lives in page-locked host memory and the kernels read it where it is, through a
CUDA tensor that aliases the same address (unified virtual addressing: a mapped page-locked
allocation has one address valid on the host and on the device). vLLM builds that view with its
compiled op ``get_cuda_view_from_cpu_tensor``; the runtime must also work where vLLM is absent
(the H200 bench machine), so it builds the view from ``__cuda_array_interface__`` instead:
``torch.as_tensor`` wraps a foreign device pointer without copying.

Not managed memory and not VMM/EGM mappings: the seeds measured those at a quarter of the
pinned path's read bandwidth.

``PinnedRegion`` registers exactly the bytes asked for (``cudaHostRegister`` over a page-aligned
plain allocation) instead of ``torch.empty(pin_memory=True)``, whose caching host allocator rounds
every block up to a power of two (a 7.2 GB layer would pin 8 GiB). If registration is refused it
falls back to ``pin_memory=True``.

The device view does not own the memory: keep the ``PinnedRegion`` (or the host tensor) alive as
long as the view is used. ``pinned_view_allocator`` returns a ``core.banks.BankAllocator`` that
hands the region to the bank as its owner, so ``ExpertBank.owners`` keeps it alive.
"""

from __future__ import annotations

import math
import threading

import torch

from ..core.banks import AllocatedTensor, BankAllocator

PAGE = 4096
# cudaHostRegisterPortable | cudaHostRegisterMapped: visible to every context, mapped into the
# device address space (with UVA the device address equals the host address).
_REGISTER_FLAGS = 0x01 | 0x02


def device_view(host: torch.Tensor, device: torch.device | str | int | None = None, *,
                check_pinned: bool = True) -> torch.Tensor:
    """A CUDA tensor aliasing the page-locked host tensor ``host`` (same bytes, same shape/dtype).

    ``host`` must be contiguous and page-locked. Reads and writes through the view go over the host
    link in place; nothing is copied. The view does not keep ``host`` alive. ``check_pinned=False``
    skips ``host.is_pinned()``, which only recognises torch's own pinned allocations, not memory
    registered with ``cudaHostRegister`` (``PinnedRegion``); the driver still refuses to wrap an
    address it does not know.
    """
    if host.device.type != "cpu":
        raise ValueError(f"device_view wants a host tensor, got one on {host.device}")
    if not host.is_contiguous():
        raise ValueError("device_view wants a contiguous host tensor")
    dev = _cuda_device(device)
    nbytes = host.numel() * host.element_size()
    if nbytes == 0:
        return torch.empty(host.shape, dtype=host.dtype, device=dev)
    if check_pinned and not host.is_pinned():
        raise ValueError("device_view wants page-locked host memory (pin_memory=True or PinnedRegion)")
    raw = torch.as_tensor(_CudaArray(host.data_ptr(), nbytes), device=dev)
    if raw.data_ptr() != host.data_ptr():  # as_tensor must alias, never copy
        raise RuntimeError("torch.as_tensor copied the pinned buffer instead of aliasing it")
    return raw.view(host.dtype).view(host.shape)


class _CudaArray:
    """Minimal ``__cuda_array_interface__`` (v3) exporter for a flat byte range."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "strides": None,
            "version": 3,
        }


class PinnedRegion:
    """One page-locked host allocation of exactly ``shape``/``dtype`` plus its device view."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device | str | int | None = None) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.device = _cuda_device(device)
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.nbytes = math.prod(self.shape) * itemsize
        self._registered_ptr: int | None = None
        self.registered = False  # True: exact-size cudaHostRegister; False: pin_memory fallback
        self._lock = threading.Lock()
        self.host = self._allocate(itemsize)
        try:
            self.view = device_view(self.host, self.device, check_pinned=not self.registered)
        except Exception:
            if not self.registered:
                raise
            # The driver would not wrap the registered range: use torch's cudaHostAlloc instead.
            self.close()
            self._raw = None
            self.registered = False
            self.host = torch.empty(self.shape, dtype=self.dtype, pin_memory=True)
            self.view = device_view(self.host, self.device)

    def _allocate(self, itemsize: int) -> torch.Tensor:
        if self.nbytes == 0:
            return torch.empty(self.shape, dtype=self.dtype)
        span = -(-self.nbytes // PAGE) * PAGE
        raw = torch.empty(span + PAGE, dtype=torch.uint8)
        offset = (-raw.data_ptr()) % PAGE
        ptr = raw.data_ptr() + offset
        try:
            torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(ptr, span, _REGISTER_FLAGS))
        except Exception:
            # Registration refused (e.g. a sandbox without it): cudaHostAlloc through torch.
            self.registered = False
            return torch.empty(self.shape, dtype=self.dtype, pin_memory=True)
        self.registered = True
        self._registered_ptr = ptr
        self._raw = raw  # keeps the registered pages alive
        return raw[offset:offset + self.nbytes].view(self.dtype).view(self.shape)

    def close(self) -> None:
        """Unregister the pages. Only call when no kernel can still read the view."""
        with self._lock:
            if self._registered_ptr is not None:
                torch.cuda.cudart().cudaHostUnregister(self._registered_ptr)
                self._registered_ptr = None

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order is not testable
        try:
            self.close()
        except Exception:
            pass


def pinned_view_allocator(device: torch.device | str | int | None = None) -> BankAllocator:
    """``core.banks.BankAllocator`` for the GPU cold bank: pinned host memory, exact size, read in
    place through its device view; the ``PinnedRegion`` becomes the bank tensor's owner."""

    def allocate(shape: tuple[int, ...], dtype: torch.dtype) -> AllocatedTensor:
        region = PinnedRegion(shape, dtype, device)
        return AllocatedTensor(region.view, owner=region)

    return allocate


def _cuda_device(device: torch.device | str | int | None) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if dev.type != "cuda":
        raise ValueError(f"a device view needs a CUDA device, got {dev}")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev
