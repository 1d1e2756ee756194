"""Re-homing: bytes placed per bank, originals freed, layer order keeps peaks within one layer."""

from __future__ import annotations

import gc
import random
import subprocess
import sys
import weakref

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import (  # noqa: E402
    AllocatedTensor,
    LayerPlacement,
    current_rowmap,
    plan_rehome_order,
    rehome_layer,
    rehome_model,
    rowmap_banks,
)
from expert_residency.core.plan import step_peaks  # noqa: E402
from expert_residency.formats import RowMap  # noqa: E402
from test_core_fixtures import (  # noqa: E402
    float_layer,
    mxfp4_layer,
    random_partition,
    single_torch_thread,  # noqa: E402,F401  (autouse)
)

pytestmark = pytest.mark.torch


class MemoryTracker:
    """Live bytes per pool ('device' / 'host'), updated when tracked tensors are created and die.

    On the CPU both pools are host RAM; the tracker labels each tensor with the memory it stands
    for and learns of frees from the tensor's actual destruction (weakref finalizers), so a
    reference kept alive by mistake shows up as a higher peak.
    """

    def __init__(self) -> None:
        self.live = {"device": 0, "host": 0}
        self.peak = {"device": 0, "host": 0}
        self.pool_of: dict[int, str] = {}

    def track(self, tensor: torch.Tensor, pool: str) -> torch.Tensor:
        size = tensor.numel() * tensor.element_size()
        self.live[pool] += size
        self.peak[pool] = max(self.peak[pool], self.live[pool])
        self.pool_of[id(tensor)] = pool
        weakref.finalize(tensor, self._free, pool, size, id(tensor))
        return tensor

    def _free(self, pool: str, size: int, key: int) -> None:
        self.live[pool] -= size
        self.pool_of.pop(key, None)

    def allocator(self, pool: str):
        def allocate(shape, dtype):
            return AllocatedTensor(self.track(torch.empty(shape, dtype=dtype), pool))
        return allocate

    def on_device(self, tensor: torch.Tensor) -> bool:
        return self.pool_of[id(tensor)] == "device"


# Small MXFP4 geometry: hidden H, intermediate I (vLLM Mxfp4MoEMethod shapes).
H, I, E = 64, 32, 16


def mxfp4_bytes_per_expert(hidden: int, inter: int) -> int:
    """What a ledger predicts from geometry alone: fp4 values of w13 (2I x H) and w2 (H x I), two per
    byte, plus one ue8m0 byte per 32 values."""
    values = 2 * inter * hidden + hidden * inter
    return values // 2 + values // 32


def test_geometry_formula_reproduces_the_agreed_dsv41_expert_size():
    # w13 4608 x 5120 and w2 5120 x 2304 (interface 2 in the brief): 18,800,640 bytes per expert
    assert mxfp4_bytes_per_expert(5120, 2304) == 18_800_640


def test_layer_bytes_match_geometry_prediction_mxfp4():
    tensors = mxfp4_layer(1, experts=E, hidden=H, inter=I)
    hot, cold = random_partition(5, E, 11)
    tracker = MemoryTracker()
    layer = rehome_layer(tensors, hot, cold, layer_index=7, hot_alloc=tracker.allocator("device"),
                         cold_alloc=tracker.allocator("host"))
    per_expert = mxfp4_bytes_per_expert(H, I)
    assert layer.bank_bytes().hot == 11 * per_expert
    assert layer.bank_bytes().cold == 5 * per_expert
    assert layer.bank_bytes().total == E * per_expert
    assert tensors == {}  # every original popped
    assert tracker.live == {"device": 11 * per_expert, "host": 5 * per_expert}


def test_model_bytes_match_geometry_prediction_with_uneven_maps():
    layers = [0, 2, 5, 9]
    hot_counts = {0: 16, 2: 12, 5: 0, 9: 7}
    tensors = {i: mxfp4_layer(i, experts=E, hidden=H, inter=I) for i in layers}
    hot = {i: random_partition(i, E, hot_counts[i])[0] for i in layers}
    cold = {i: [e for e in range(E) if e not in hot[i]] for i in layers}
    state = rehome_model(tensors, hot, cold, hot_alloc=MemoryTracker().allocator("device"),
                         cold_alloc=MemoryTracker().allocator("host"), on_device=lambda t: True)
    per_expert = mxfp4_bytes_per_expert(H, I)
    for i in layers:
        assert state.bytes_per_layer[i].hot == hot_counts[i] * per_expert
        assert state.bytes_per_layer[i].cold == (E - hot_counts[i]) * per_expert
    assert state.total.hot == sum(hot_counts.values()) * per_expert
    assert state.total.cold == sum(E - n for n in hot_counts.values()) * per_expert
    assert sorted(state.layers) == layers


def test_float_bank_bytes_include_biases():
    tensors = float_layer(2, torch.bfloat16, experts=E, hidden=H, inter=I, bias=True)
    layer = rehome_layer(tensors, list(range(10)), list(range(10, E)), layer_index=0,
                         hot_alloc=MemoryTracker().allocator("device"),
                         cold_alloc=MemoryTracker().allocator("host"))
    per_expert = (2 * I * H + H * I + 2 * I + H) * 2
    assert (layer.bank_bytes().hot, layer.bank_bytes().cold) == (10 * per_expert, 6 * per_expert)


def test_originals_are_freed_as_the_layer_is_rehomed():
    tensors = float_layer(3, torch.float32, experts=E, hidden=H, inter=I)
    refs = [weakref.ref(t) for t in tensors.values()]
    rehome_layer(tensors, [1, 2, 3], [e for e in range(E) if e not in (1, 2, 3)], layer_index=0,
                 hot_alloc=MemoryTracker().allocator("device"), cold_alloc=MemoryTracker().allocator("host"))
    gc.collect()
    assert all(r() is None for r in refs)


def _model(tracker: MemoryTracker, on_device_layers: set[int], hot_counts: dict[int, int],
           split_layers: frozenset[int] = frozenset()):
    tensors = {}
    for i in hot_counts:
        pool = "device" if i in on_device_layers else "host"
        tensors[i] = {}
        for name, t in mxfp4_layer(i, experts=E, hidden=H, inter=I).items():
            # a layer the offloader split: w13 on the host, w2 on the device (whole parameters)
            where = ("host" if name.startswith("w13") else "device") if i in split_layers else pool
            tensors[i][name] = tracker.track(t, where)
    hot = {i: random_partition(100 + i, E, n)[0] for i, n in hot_counts.items()}
    cold = {i: [e for e in range(E) if e not in hot[i]] for i in hot_counts}
    return tensors, hot, cold


@pytest.mark.parametrize("case", ["offload-like", "mostly-host", "skewed", "split-load"])
def test_measured_peaks_stay_within_one_layer_of_final(case):
    """Load state like vLLM's --cpu-offload-gb (whole layers on host), then re-home; the tracked
    live bytes never exceed max(initial, final) + one layer, on either side."""
    rng = random.Random(case)
    n_layers = 10
    if case == "offload-like":       # ~20% of layers offloaded, ~77% hot per layer
        on_device = set(range(2, n_layers))
        hot_counts = {i: rng.randint(11, 14) for i in range(n_layers)}
    elif case == "mostly-host":
        on_device = {0, 1}
        hot_counts = {i: rng.randint(8, 16) for i in range(n_layers)}
    elif case == "skewed":
        on_device = set(range(0, n_layers, 2))
        hot_counts = {i: (16 if i % 3 else 1) for i in range(n_layers)}
    else:  # the offload budget ran out inside layers 2 and 5
        on_device = set(range(3, n_layers)) - {5}
        hot_counts = {i: rng.randint(10, 14) for i in range(n_layers)}
    split = frozenset({2, 5}) if case == "split-load" else frozenset()
    tracker = MemoryTracker()
    tensors, hot, cold = _model(tracker, on_device, hot_counts, split)
    initial = dict(tracker.live)
    tracker.peak = dict(initial)
    state = rehome_model(tensors, hot, cold, hot_alloc=tracker.allocator("device"),
                         cold_alloc=tracker.allocator("host"), on_device=tracker.on_device)
    gc.collect()
    per_expert = mxfp4_bytes_per_expert(H, I)
    layer_bytes = E * per_expert
    final = {"device": sum(hot_counts.values()) * per_expert,
             "host": sum(E - n for n in hot_counts.values()) * per_expert}
    assert tracker.live == final
    assert (initial["device"], initial["host"]) == state.plan.initial
    assert (final["device"], final["host"]) == state.plan.final
    assert state.plan.within_bound
    for pool, index in (("device", 0), ("host", 1)):
        bound = max(initial[pool], final[pool]) + layer_bytes
        assert tracker.peak[pool] <= state.plan.peak[index] <= bound, pool
    assert all(t == {} for t in tensors.values())


def test_naive_order_would_break_the_bound_here():
    """The ordering is doing work: device-layers-first on this map over-fills the host."""
    per = 100
    layers = [LayerPlacement(i, i >= 3, 12 * per, 4 * per) for i in range(10)]
    plan = plan_rehome_order(layers)
    assert plan.within_bound and max(plan.device_overshoot, plan.host_overshoot) <= 16 * per
    device = sum(l.total_bytes for l in layers if l.on_device)
    host = sum(l.total_bytes for l in layers if not l.on_device)
    worst_host = 0
    for layer in sorted(layers, key=lambda l: not l.on_device):
        _, h_peak, device, host = step_peaks(device, host, layer)
        worst_host = max(worst_host, h_peak)
    assert worst_host - max(plan.initial[1], plan.final[1]) > 16 * per


def test_plan_bound_holds_on_random_maps():
    rng = random.Random(0)
    for _ in range(1500):
        n = rng.randint(1, 14)
        uniform = rng.random() < 0.5
        size = rng.randint(1, 40)
        layers = []
        for i in range(n):
            total = size if uniform else rng.randint(1, 40)
            hot = rng.randint(0, total)
            split = rng.randint(0, total) * 1000 if rng.random() < 0.2 else None
            layers.append(LayerPlacement(i, rng.random() < 0.5, hot * 1000, (total - hot) * 1000,
                                         device_bytes=split))
        plan = plan_rehome_order(layers)
        assert sorted(plan.order) == list(range(n))
        assert plan.within_bound, layers
        assert plan.device_overshoot <= plan.largest_layer_bytes
        assert plan.host_overshoot <= plan.largest_layer_bytes


def test_split_layer_placement_arithmetic():
    layer = LayerPlacement(3, False, hot_bytes=70, cold_bytes=30, device_bytes=40)
    assert (layer.loaded_device_bytes, layer.loaded_host_bytes) == (40, 60)
    # banks allocated before the original is freed, then the original's two parts go
    assert step_peaks(1000, 500, layer) == (1070, 530, 1030, 470)
    plan = plan_rehome_order([layer])
    assert plan.initial == (40, 60) and plan.final == (70, 30)
    with pytest.raises(ValueError, match="device_bytes 101 outside 0..100"):
        LayerPlacement(0, True, 60, 40, device_bytes=101)


def test_plan_for_the_reference_geometry():
    """40 layers x 384 experts at 18,800,640 B, 295 hot / 89 cold, loaded with ~9 layers offloaded."""
    per = 18_800_640
    layers = [LayerPlacement(i, i >= 9, 295 * per, 89 * per) for i in range(40)]
    plan = plan_rehome_order(layers)
    assert plan.within_bound
    assert plan.final == (40 * 295 * per, 40 * 89 * per)
    assert plan.device_overshoot <= 384 * per and plan.host_overshoot <= 384 * per


def test_plan_module_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from expert_residency.core.plan import plan_rehome_order, LayerPlacement\n"
            "p = plan_rehome_order([LayerPlacement(0, True, 3, 1), LayerPlacement(1, False, 2, 2)])\n"
            "print(p.order, p.within_bound)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() in ("[0, 1] True", "[1, 0] True")


def test_rowmap_round_trip_through_banks():
    rowmap = RowMap((4, 6), 8, [[7, 1, 3], [0, 2, 4, 6]], [[0, 2, 4, 5, 6], [1, 3, 5, 7]],
                    {"note": "test"})
    hot, cold = rowmap_banks(rowmap)
    tensors = {i: float_layer(i, torch.float32, experts=8, hidden=H, inter=I) for i in (4, 6)}
    state = rehome_model(tensors, hot, cold, hot_alloc=MemoryTracker().allocator("device"),
                         cold_alloc=MemoryTracker().allocator("host"), on_device=lambda t: True)
    again = current_rowmap(state.layers)
    assert again.hot == rowmap.hot and again.cold == rowmap.cold
    assert again.content_hash() == rowmap.content_hash()
    assert again.shape_hash() == rowmap.shape_hash()


def test_rehome_rejects_inconsistent_tensors():
    bad = {"a": torch.zeros(4, 2), "b": torch.zeros(5, 2)}
    with pytest.raises(ValueError, match="disagree on dim 0"):
        rehome_layer(bad, [0, 1], [2, 3], layer_index=3, hot_alloc=MemoryTracker().allocator("device"),
                     cold_alloc=MemoryTracker().allocator("host"))
    intact = {"a": torch.zeros(4, 2)}
    with pytest.raises(ValueError, match="layer 3: expert 1 appears twice"):
        rehome_layer(intact, [0, 1], [1, 3], layer_index=3,
                     hot_alloc=MemoryTracker().allocator("device"), cold_alloc=MemoryTracker().allocator("host"))
    assert list(intact) == ["a"]  # nothing popped on a bad map


def test_rehome_model_checks_every_map_before_touching_a_layer():
    tensors = {0: {"a": torch.zeros(4, 2)}, 1: {"a": torch.zeros(4, 2)}}
    with pytest.raises(ValueError, match="layer 1: 1 expert id"):
        rehome_model(tensors, {0: [0, 1], 1: [0, 1]}, {0: [2, 3], 1: [2]},
                     hot_alloc=MemoryTracker().allocator("device"),
                     cold_alloc=MemoryTracker().allocator("host"), on_device=lambda t: True)
    assert all(list(t) == ["a"] for t in tensors.values())
    with pytest.raises(ValueError, match=r"no entry for MoE layer\(s\) \[1\]"):
        rehome_model(tensors, {0: [0, 1]}, {0: [2, 3]}, hot_alloc=MemoryTracker().allocator("device"),
                     cold_alloc=MemoryTracker().allocator("host"), on_device=lambda t: True)


def test_core_imports_nothing_from_recipegen_or_its_dependencies():
    """The serving container has torch and numpy, not recipegen, click or pydantic."""
    import subprocess
    import sys
    code = ("import sys\n"
            "for name in ('recipegen', 'click', 'pydantic', 'ruamel', 'vllm'):\n"
            "    sys.modules[name] = None\n"
            "import expert_residency.core as core, expert_residency.mxfp4\n"
            "import expert_residency.core.reference\n"
            "for name in core.__all__:\n"
            "    getattr(core, name)\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
