"""Re-homing hands the pinned host cache of the freed originals back (``core.rehome.release_host_cache``):
called once, after every original is gone; skipped without the function or an accelerator."""

from __future__ import annotations

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import rehome_model  # noqa: E402
from expert_residency.core.banks import device_allocator, host_allocator  # noqa: E402
from expert_residency.core.rehome import release_host_cache  # noqa: E402
from test_core_fixtures import float_layer  # noqa: E402

pytestmark = pytest.mark.torch
E, H, I = 6, 16, 8


def _rehome() -> list[weakref.ref]:
    tensors = {i: float_layer(i, torch.float32, experts=E, hidden=H, inter=I) for i in (0, 2)}
    refs = [weakref.ref(t) for layer in tensors.values() for t in layer.values()]
    hot = {i: [0, 3] for i in tensors}
    cold = {i: [1, 2, 4, 5] for i in tensors}
    rehome_model(tensors, hot, cold, hot_alloc=device_allocator("cpu"),
                 cold_alloc=host_allocator(pin=False), on_device=lambda t: True)
    return refs


def test_called_once_after_every_original_is_freed(monkeypatch) -> None:
    calls: list[list[bool]] = []
    refs: list[weakref.ref] = []

    def empty_host_cache() -> None:
        gc.collect()
        calls.append([r() is None for r in refs])

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "empty_host_cache", empty_host_cache, raising=False)
    import expert_residency.core.banks as banks

    original = banks.rehome_layer

    def spy(tensors, *a, **k):  # learn the originals as the model re-homes them
        refs.extend(weakref.ref(t) for t in tensors.values())
        return original(tensors, *a, **k)

    monkeypatch.setattr("expert_residency.core.rehome.rehome_layer", spy)
    _rehome()
    assert len(refs) == 4 and calls == [[True] * 4]


def test_skipped_without_the_function_or_an_accelerator(monkeypatch) -> None:
    called = []
    monkeypatch.setattr(torch.accelerator, "empty_host_cache", lambda: called.append(1), raising=False)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    assert release_host_cache() is False and not called
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    assert release_host_cache() is True and called == [1]
    monkeypatch.delattr(torch.accelerator, "empty_host_cache")
    assert release_host_cache() is False
    _rehome()  # no accelerator function: re-homing still works
