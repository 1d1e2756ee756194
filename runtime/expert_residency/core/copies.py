"""Where adaptive residency's copies run: beside the steps (side streams on a GPU) or at once.

A ``CopyEngine`` executes the chunks of ``core.slots.Transfer`` s — each a list of
``(destination, source, direction)`` row slices, direction ``"in"`` (host bank → HBM) or ``"out"``
(HBM → host bank) — and gives the policy three orderings, all without the host waiting:

* ``marker()`` after a transfer's last chunk: everything issued so far;
* ``compute_waits(markers)`` before a map flip: the step stream (the one the forwards run on) does
  not pass this point until those copies have landed (on a GPU ``cudaStreamWaitEvent``: the device
  waits, the host does not);
* ``copies_wait_compute()`` after a flip: copies issued from now on start only once the step stream
  has passed the flip, so a row the flip retired (the demoted expert's old HBM row, read by forwards
  issued before the flip) is overwritten only after the last of those forwards.

Implementations:

* ``ImmediateCopies`` — each copy runs when issued, on the current stream (the CPU build, where
  device ops run synchronously, and every synchronous swap): the orderings hold trivially;
* ``CudaCopies`` — two side streams, one per direction (a PCIe link is full duplex: a copy out does
  not slow the cold bank's reads, which come in), CUDA events for the markers. Each piece is one
  ``cudaMemcpyAsync`` through the CUDA runtime the process already loaded (``RuntimeMemcpy``):
  ~1–2 µs of host time against ~10 µs for ``Tensor.copy_`` (dispatch and its iterator set-up), and
  a pump at full depth issues a few hundred pieces a step on the decode path; ``copy_`` when no
  runtime library is found;
* ``ThreadedCopies`` — a worker thread on the CPU: copies overlap the forwards of the calling
  thread for real (the tests' concurrent steps; torch releases the GIL inside a copy).

Nothing here decides what to copy or when (``core.slots`` and ``core.adaptive`` do, on the host,
from tick counts alone, so every tensor-parallel rank issues the same chunks at the same steps).
"""

from __future__ import annotations

import ctypes
import queue
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import torch


class RowPiece:
    """One contiguous byte range ``[lo, hi)`` of one tensor's row, from row ``src_row`` of a bank's
    byte view (``uint8 [rows, bytes per row]``) to row ``dst_row`` of another's. Unpacks as a
    ``(destination, source, direction)`` copy (the views are made then); ``pointers()`` gives the
    addresses without making any view, which is what the side streams use on the step path."""

    __slots__ = ("dst_view", "dst_row", "src_view", "src_row", "lo", "hi", "direction")

    def __init__(self, dst_view: torch.Tensor, dst_row: int, src_view: torch.Tensor, src_row: int,
                 lo: int, hi: int, direction: str) -> None:
        self.dst_view, self.dst_row, self.src_view, self.src_row = dst_view, dst_row, src_view, src_row
        self.lo, self.hi, self.direction = lo, hi, direction

    @property
    def dst(self) -> torch.Tensor:
        return self.dst_view[self.dst_row, self.lo:self.hi]

    @property
    def src(self) -> torch.Tensor:
        return self.src_view[self.src_row, self.lo:self.hi]

    def __iter__(self):
        return iter((self.dst, self.src, self.direction))

    def pointers(self) -> tuple[int, int, int]:
        """``(destination address, source address, bytes)``."""
        d, s = self.dst_view, self.src_view
        return (d.data_ptr() + self.dst_row * d.stride(0) + self.lo,
                s.data_ptr() + self.src_row * s.stride(0) + self.lo, self.hi - self.lo)


Copy = "tuple[torch.Tensor, torch.Tensor, str] | RowPiece"
"""``(destination, source, direction)`` — ``destination.copy_(source)``, direction ``"in"`` or
``"out"`` — or a ``RowPiece``, which unpacks as one."""


def _direction(copy: Copy) -> str:
    return copy.direction if isinstance(copy, RowPiece) else copy[2]


def _pointers(copy: Copy) -> tuple[int, int, int]:
    """``(destination address, source address, bytes)`` of a copy; its two sides must be the same
    size and contiguous."""
    if isinstance(copy, RowPiece):
        return copy.pointers()
    dst, src, _ = copy
    nbytes = dst.numel() * dst.element_size()
    if nbytes != src.numel() * src.element_size():
        raise ValueError(f"adaptive residency: a copy of {src.numel() * src.element_size()} B into {nbytes} B")
    if not (dst.is_contiguous() and src.is_contiguous()):
        raise ValueError("adaptive residency: a copy between tensors that are not contiguous")
    return dst.data_ptr(), src.data_ptr(), nbytes


class CopyEngine(Protocol):
    """See the module docstring."""

    def issue(self, copies: Sequence[Copy]) -> None: ...

    def marker(self) -> Any: ...

    def compute_waits(self, markers: Sequence[Any]) -> None: ...

    def copies_wait_compute(self) -> None: ...

    def drain(self) -> None: ...


class ImmediateCopies:
    """Copies run when issued, on the current stream; markers are ``None``."""

    asynchronous = False

    def issue(self, copies: Sequence[Copy]) -> None:
        for dst, src, _ in copies:
            dst.copy_(src)

    def marker(self) -> Any:
        return None

    def compute_waits(self, markers: Sequence[Any]) -> None:
        return None

    def copies_wait_compute(self) -> None:
        return None

    def drain(self) -> None:
        return None


CUDA_MEMCPY_DEFAULT = 4
"""``cudaMemcpyDefault``: the direction inferred from the pointers (unified virtual addressing)."""


def runtime_candidates(mapped: Sequence[str], cuda_version: str | None) -> list[str]:
    """The CUDA runtime libraries mapped into the process (paths from ``/proc/self/maps``), the
    ones of PyTorch's CUDA major version first (``libcudart.so.13`` for a ``13.0`` build): another
    package may have mapped a runtime of another version beside it."""
    paths = sorted(set(mapped))
    major = (cuda_version or "").split(".")[0]
    if not major:
        return paths
    return sorted(paths, key=lambda p: not p.rsplit("/", 1)[-1].startswith(f"libcudart.so.{major}"))


class RuntimeMemcpy:
    """``cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream)`` from the CUDA runtime library
    already mapped into this process (PyTorch's), called through ctypes. ``load()`` returns None
    when no such library is mapped (then ``Tensor.copy_`` does the copies)."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        self.path = path
        self._memcpy = lib.cudaMemcpyAsync
        self._memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        self._memcpy.restype = ctypes.c_int
        self._error = lib.cudaGetErrorString
        self._error.argtypes = [ctypes.c_int]
        self._error.restype = ctypes.c_char_p

    @classmethod
    def load(cls) -> RuntimeMemcpy | None:
        try:
            with open("/proc/self/maps") as maps:
                mapped = [line.split()[-1] for line in maps if "/libcudart.so" in line]
        except OSError:
            return None
        for path in runtime_candidates(mapped, torch.version.cuda):
            try:
                return cls(path)
            except (OSError, AttributeError):
                continue
        return None

    def __call__(self, copy: Copy, stream: int) -> None:
        dst, src, nbytes = _pointers(copy)
        status = self._memcpy(dst, src, nbytes, CUDA_MEMCPY_DEFAULT, stream)
        if status:
            raise RuntimeError(f"adaptive residency: cudaMemcpyAsync failed: {self._error(status).decode()}")


class CudaCopies:
    """Two side streams (``"in"``, ``"out"``) on ``device``; a marker is one event per stream.
    Pieces must be contiguous byte ranges (``core.slots`` makes them so)."""

    asynchronous = True

    def __init__(self, device: torch.device | str, *, runtime_memcpy: bool = True) -> None:
        self.device = torch.device(device)
        # lowest priority (the larger number): the step's own kernels are scheduled first
        low, _ = torch.cuda.Stream.priority_range()
        self.streams = {d: torch.cuda.Stream(device=self.device, priority=low) for d in ("in", "out")}
        self._used = {d: False for d in self.streams}
        self.memcpy = RuntimeMemcpy.load() if runtime_memcpy else None
        """The runtime's cudaMemcpyAsync, or None: ``Tensor.copy_`` under the side stream."""

    def issue(self, copies: Sequence[Copy]) -> None:
        for direction, stream in self.streams.items():   # each side stream entered once per call
            mine = [c for c in copies if _direction(c) == direction]
            if not mine:
                continue
            if self.memcpy is not None:
                with torch.cuda.device(self.device):   # the runtime copies on the current device
                    handle = stream.cuda_stream
                    for copy in mine:
                        self.memcpy(copy, handle)
            else:
                with torch.cuda.stream(stream):
                    for dst, src, _ in mine:
                        dst.copy_(src, non_blocking=True)
            self._used[direction] = True

    def marker(self) -> Any:
        return tuple(s.record_event() for d, s in self.streams.items() if self._used[d])

    def compute_waits(self, markers: Sequence[Any]) -> None:
        step = torch.cuda.current_stream(self.device)
        for marker in markers:
            for event in marker or ():
                step.wait_event(event)

    def copies_wait_compute(self) -> None:
        event = torch.cuda.current_stream(self.device).record_event()
        for stream in self.streams.values():
            stream.wait_event(event)

    def drain(self) -> None:
        for stream in self.streams.values():
            stream.synchronize()


class ThreadedCopies:
    """A worker thread runs the copies in issue order while the caller's thread runs forwards.
    A marker is a ``threading.Event`` set once every copy issued before it ran; the caller's
    forwards are synchronous (CPU), so ``copies_wait_compute`` has nothing to wait for."""

    asynchronous = True

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="adaptive-copies", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if isinstance(item, threading.Event):
                    item.set()
                elif callable(item):   # a test's hook between copies (a delay, a counter)
                    item()
                else:
                    dst, src, _ = item
                    dst.copy_(src)
            except BaseException as exc:  # surfaced to the caller at its next wait
                self._error = exc
            finally:
                self._queue.task_done()

    def issue(self, copies: Sequence[Copy]) -> None:
        for copy in copies:
            self._queue.put(copy)

    def marker(self) -> Any:
        event = threading.Event()
        self._queue.put(event)
        return event

    def compute_waits(self, markers: Sequence[Any]) -> None:
        for marker in markers:
            if marker is not None:
                marker.wait()
        self._raise()

    def copies_wait_compute(self) -> None:
        return None

    def drain(self) -> None:
        self._queue.join()
        self._raise()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"adaptive residency: a copy failed: {self._error}") from self._error


def default_engine(device: torch.device, asynchronous: bool) -> CopyEngine:
    """Side streams on a CUDA device when the policy runs its copies beside the steps; otherwise
    copies at once (the CPU build, synchronous barriers)."""
    if asynchronous and device.type == "cuda":
        return CudaCopies(device)
    return ImmediateCopies()
