"""Adaptive swaps copied beside the steps: spare rows, copies running while forwards run, the flip
at a barrier, the copy budget, host copies, and the guards (a flip before its copies, a copy into a
live row, a forward inside a barrier) — split == unsplit bit for bit throughout."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import current_rowmap  # noqa: E402
from expert_residency.core.adaptive import COPY_LAND_STEPS, AdaptiveConfig, AdaptivePolicy, Swap  # noqa: E402
from expert_residency.core.adaptive_step import StepBarrier  # noqa: E402
from expert_residency.core.banks import SPARE  # noqa: E402
from expert_residency.core.copies import ImmediateCopies, ThreadedCopies  # noqa: E402
from expert_residency.core.slots import CHUNKS_PER_ROW, _row_chunks, chunk_bounds, share_row_codes  # noqa: E402
from test_adaptive_policy import LAYERS, Engine, class_probs, decode_live, hot_mass, sample_ids  # noqa: E402
from test_core_fixtures import single_torch_thread  # noqa: E402,F401  (autouse)

pytestmark = pytest.mark.torch

ROW_BYTES = 12288   # one bf16 expert of the fixtures: (2*32*64 + 64*32) * 2


class ManualCopies:
    """Copies that run only when the test (or a flip's wait) says so: every interleaving of copies
    and forwards can be set up by hand. A marker is the number of copies issued before it."""

    asynchronous = True

    def __init__(self) -> None:
        self.copies: list = []
        self.ran = 0
        self.waits: list[int] = []

    def issue(self, copies) -> None:
        self.copies.extend(copies)

    def marker(self):
        return len(self.copies)

    def run(self, upto: int | None = None) -> None:
        upto = len(self.copies) if upto is None else upto
        while self.ran < upto:
            dst, src, _ = self.copies[self.ran]
            dst.copy_(src)
            self.ran += 1

    def compute_waits(self, markers) -> None:
        if markers:
            self.waits.append(max(markers))
            self.run(max(markers))

    def copies_wait_compute(self) -> None:
        pass

    def drain(self) -> None:
        self.run()


class CountingThreadedCopies(ThreadedCopies):
    """The real worker thread, slowed down (a sleep before every copy) and counting finished copies,
    so a test can see forwards run while a copy is half done."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s, self.issued, self.finished = delay_s, 0, 0

    def issue(self, copies) -> None:
        for copy in copies:
            self.issued += 1
            self._queue.put(lambda: time.sleep(self.delay_s))
            self._queue.put(copy)
            self._queue.put(self._done)

    def _done(self) -> None:
        self.finished += 1


def _async(engine: Engine, config: AdaptiveConfig, copies) -> AdaptivePolicy:
    engine.policy = AdaptivePolicy(engine.counter, engine.split, config, lookahead=True, copies=copies)
    return engine.policy


def _primed(config: AdaptiveConfig, copies, **engine_kw):
    """An engine whose first plan promotes cold experts of layer 3 (their picks counted)."""
    engine = Engine(config, **engine_kw)
    policy = _async(engine, config, copies)
    cold = engine.split[3].cold_experts
    engine.counter.count(3, torch.tensor([[cold[0], cold[1], cold[2], cold[3]]] * 2, dtype=torch.int32))
    return engine, policy


SMALL = dict(interval=1, swaps_per_layer=2, decay=0.5, margin=0.0, evidence=0.0, counts_evidence=0.0)


def test_copies_run_while_forwards_run_and_every_forward_is_exact():
    """A worker thread copies (slowly) while the test's thread runs forwards through a traffic
    shift: every forward equals the unsplit layer bit for bit, forwards did run with a copy half
    done, and the map follows the traffic."""
    config = AdaptiveConfig(interval=4, swaps_per_layer=2, decay=0.5, margin=0.25, evidence=0.0,
                            counts_evidence=0.0, copy_rows_per_layer=0.125)   # 2 layers: one chunk per step
    copies = CountingThreadedCopies(delay_s=0.003)
    engine = Engine(config)
    policy = _async(engine, config, copies)
    step = StepBarrier(policy)
    g = torch.Generator().manual_seed(11)
    overlapped = 0
    n = 0
    try:
        for phase in ("agent", "prose", "math"):
            probs = class_probs(phase)
            before = hot_mass(engine.split, probs)
            for _ in range(24):
                ids = {index: sample_ids(probs[row], 8, g) for row, index in enumerate(LAYERS)}
                if step.before_forward(real=True) is not None:
                    assert engine.full_check(), f"bit-exact check failed after barrier {policy.barriers}"
                overlapped += copies.finished < copies.issued   # a copy still running during this forward
                assert engine.forward(ids, seed=n), f"split != unsplit at step {n} ({phase})"
                n += 1
            if phase != "agent":
                assert hot_mass(engine.split, probs) > before, phase
    finally:
        copies.drain()
        copies.close()
    assert policy.swaps_done >= 4 and overlapped >= 10
    assert copies.issued == copies.finished   # drained: every copy ran
    hot, cold = zip(*(decode_live(engine.split[i].row_codes) for i in LAYERS))
    assert [engine.split[i].hot_experts for i in LAYERS] == list(hot)
    assert [engine.split[i].cold_experts for i in LAYERS] == list(cold)


def test_the_flip_waits_for_the_copies_and_a_flip_before_them_is_caught():
    config = AdaptiveConfig(**SMALL, copy_rows_per_layer=1e6)
    copies = ManualCopies()
    engine, policy = _primed(config, copies)
    policy.barrier()
    policy.pump()                          # plan read, both transfers' chunks issued, none run
    pieces = sum(len(chunk) for t in policy.in_flight for chunk in t.chunks)
    assert len(policy.in_flight) == 2 and copies.ran == 0 and len(copies.copies) == pieces
    assert all(len(t.chunks) == CHUNKS_PER_ROW for t in policy.in_flight)
    assert engine.full_check()             # the live map is untouched: copies only wrote spare rows
    copies.run(3)                          # some chunks land while "steps" run
    assert engine.full_check()
    checks = []

    def flip_first(steps):
        wait, flip = steps
        assert (wait.kind, flip.kind) == ("copy", "map")
        flip.run()                         # the map flip without waiting for the copies ...
        checks.append(engine.full_check())  # ... and a forward reading the new map
        wait.run()

    policy.tick()
    report = policy.barrier(run=flip_first)
    assert len(report.swaps) == 2 and checks == [False]
    assert engine.full_check()             # once the copies landed the state is whole again


def test_an_ordered_flip_waits_on_the_device_not_the_host():
    config = AdaptiveConfig(**SMALL, copy_rows_per_layer=1e6)
    copies = ManualCopies()
    engine, policy = _primed(config, copies)
    policy.barrier()
    policy.pump()
    policy.tick()
    report = policy.barrier()
    # the flip's wait ran the copies up to the last transfer's marker, then the map changed
    assert copies.waits == [len(copies.copies)] and copies.ran == len(copies.copies)
    assert len(report.swaps) == 2 and report.copied_out == 2 and engine.full_check()
    assert report.host_link_bytes == 2 * 2 * ROW_BYTES


def test_a_flip_before_the_copies_were_issued_is_refused():
    config = AdaptiveConfig(**SMALL, copy_rows_per_layer=0.125)   # 2 layers: one chunk per step
    engine, policy = _primed(config, ManualCopies())
    policy.barrier()
    policy.pump()
    transfer = policy.in_flight[0]
    assert transfer.issued == 1 and not transfer.all_issued
    with pytest.raises(RuntimeError, match="before its copies were issued"):
        policy._flip([transfer])
    assert engine.split[3].hot_ids[transfer.hot_row] == SPARE   # nothing changed


def test_a_copy_into_a_row_the_live_map_reads_is_refused():
    config = AdaptiveConfig(**SMALL, copy_rows_per_layer=0.125)   # one chunk per step
    engine, policy = _primed(config, ManualCopies())
    policy.barrier()
    policy.forwards = 1                    # not a flip step (every flip_interval = 8 forwards)
    for _ in range(CHUNKS_PER_ROW):
        policy.pump()                      # the first transfer's chunks
    assert [t.all_issued for t in policy.in_flight] == [True] and len(policy.waiting) == 1
    layer, slots = engine.split[3], policy._slots[3]
    # corrupt the bookkeeping: the next spare row now "serves" an expert the map names
    layer.hot_ids[slots.free_hot[0]] = layer.cold_experts[-1]
    with pytest.raises(RuntimeError, match="would overwrite HBM row"):
        policy.pump()                      # the second transfer's first chunk


def test_a_forward_inside_the_barrier_is_refused():
    config = AdaptiveConfig(**SMALL, copy_rows_per_layer=1e6)
    engine, policy = _primed(config, ManualCopies())
    policy.barrier()
    policy.pump()

    def forward_between(steps):
        steps[0].run()
        policy.tick()      # the engine counting a forward between the wait and the flip

    with pytest.raises(RuntimeError, match="inside a swap barrier"):
        policy.barrier(run=forward_between)
    assert policy.tick() is True


def test_the_budget_issues_chunks_by_hand_and_carries_transfers_over():
    """0.25 rows per layer and step, 2 layers = 2 chunks per pump: two transfers of 4 chunks take
    pumps 1-2 and 3-4; a barrier after pump 3 flips the first only, the next one the second."""
    config = AdaptiveConfig(interval=3, swaps_per_layer=2, decay=0.5, margin=0.0, evidence=0.0,
                            counts_evidence=0.0, copy_rows_per_layer=0.25)
    copies = ManualCopies()
    engine = Engine(config)
    policy = _async(engine, config, copies)
    cold, hot = engine.split[3].cold_experts, engine.split[3].hot_experts
    # two cold experts picked twice each: the first plan promotes both, later plans nothing
    engine.counter.count(3, torch.tensor([[cold[0], cold[1], hot[0], hot[1]]] * 2, dtype=torch.int32))
    policy.forwards = 2
    assert policy.tick()
    policy.barrier()                       # plan 1 started (CPU: read by the next pump)
    issued = [policy.pump()]
    for _ in range(2):
        policy.tick()
        issued.append(policy.pump())
    assert issued == [2, 2, 2]             # forwards 3, 4, 5
    first, second = policy.in_flight
    assert first.all_issued and first.issued_at == 4 and second.issued == 2
    assert policy.tick()                   # forwards 6: due
    report = policy.barrier()
    assert report.swaps == [first.swap] and report.in_flight == 1
    assert engine.full_check()
    assert policy.pump() == 2 and second.all_issued
    policy.tick()
    assert policy.pump() == 0 and policy._credit == 0.0   # nothing left: no credit banked for later
    policy.tick()
    assert policy.tick()                   # forwards 9
    report = policy.barrier()
    assert report.swaps == [second.swap] and report.in_flight == 0 and engine.full_check()


def test_a_flip_takes_transfers_issued_two_forwards_before_and_a_late_one_flips_then():
    """A transfer whose last chunk was issued fewer than COPY_LAND_STEPS forwards ago is not
    flipped at a flip step (its copies may still be on the link: the step stream would wait for
    them); it flips at the first later step it may, not a whole flip interval later, and every
    forward in between reads the old map exactly."""
    config = AdaptiveConfig(**SMALL, copy_rows_per_layer=1e6, flip_interval=4)
    engine, policy = _primed(config, ManualCopies())
    policy.land_steps = COPY_LAND_STEPS    # what a CUDA device gets (0 on the CPU)
    while policy.forwards % 4 != 3:        # the plan is read and issued one forward before a flip step
        policy.tick()
    policy.barrier()
    policy.pump()                          # read; every chunk of its transfers issued at once
    moving = policy.in_flight
    assert moving and all(t.all_issued and t.issued_at == policy.forwards for t in moving)
    issued_at = policy.forwards
    policy.tick()
    policy.pump()                          # a flip step, one forward later: not yet
    assert policy.forwards % 4 == 0 and policy.forwards - issued_at == 1
    assert policy.in_flight == moving and policy.swaps_done == 0
    assert engine.full_check()
    policy.tick()
    policy.pump()                          # two forwards later, not a flip step: flipped
    assert policy.forwards - issued_at == COPY_LAND_STEPS == 2
    assert policy.in_flight == [] and policy.swaps_done == len(moving)
    assert all(t.swap.promote in engine.split[t.swap.layer].hot_experts for t in moving)
    assert engine.full_check()


def test_budget_is_not_banked_while_every_waiting_swap_lacks_a_spare_row():
    """Steps spent waiting for spare rows bank no copy budget: when a row comes free, one step
    issues at most its own share, not a burst."""
    config = AdaptiveConfig(**SMALL, copy_rows_per_layer=0.25, spare_rows=1, flip_interval=64)
    engine, policy = _primed(config, ManualCopies())
    policy.land_steps = COPY_LAND_STEPS
    per_step = config.copy_rows_per_layer * len(policy.counter.moe_layer_indices) * CHUNKS_PER_ROW
    policy.barrier()
    issued = []
    for _ in range(12):                    # layer 3's one spare row: one transfer, then waiting
        issued.append(policy.pump())
        policy.tick()
    assert policy.waiting and len(policy.in_flight) == 1
    assert policy._credit <= 1.0 + per_step
    policy.barrier()                       # flips the first transfer: its rows come free
    assert len(policy.in_flight) == 0 or policy.in_flight[0].issued == 0
    issued.append(policy.pump())
    assert policy.in_flight and max(issued) <= per_step + 1


def test_transfers_run_strongest_gain_first_across_layers():
    config = AdaptiveConfig(**SMALL, copy_rows_per_layer=1e6)
    engine, policy = _primed(config, ManualCopies())
    c5 = engine.split[5].cold_experts[0]
    h5 = engine.split[5].hot_experts
    engine.counter.count(5, torch.tensor([[c5] + h5[:3]] * 6, dtype=torch.int32))   # 6 picks: stronger
    policy.barrier()
    policy.pump()
    layers = [t.swap.layer for t in policy.in_flight]
    gains = [t.gain for t in policy.in_flight]
    assert policy.in_flight[0].swap.promote == c5 and layers[0] == 5
    assert gains == sorted(gains, reverse=True) and layers == [5, 3, 3]


def test_a_demoted_expert_the_host_still_holds_costs_no_copy_out():
    """Sync swaps: X in / Y out copies Y out; then Y in / X out finds X's bytes still in the host row
    it was promoted from — a map change, no copy out — and the layer stays exact."""
    engine = Engine(AdaptiveConfig(**SMALL))
    layer = engine.split[3]
    x, y = layer.cold_experts[0], layer.hot_experts[0]
    assert engine.policy.apply([Swap(3, x, y)]) == 2 * ROW_BYTES
    assert x in layer.host_copies and engine.full_check()
    assert engine.policy.apply([Swap(3, y, x)]) == ROW_BYTES     # Y in; X out is a map change
    assert x in layer.cold_experts and x not in layer.host_copies and engine.full_check()


def test_host_copies_all_never_copies_out():
    config = AdaptiveConfig(interval=3, swaps_per_layer=2, decay=0.5, margin=0.25, evidence=0.0,
                            counts_evidence=0.0, copy_rows_per_layer=1e6, host_copies="all")
    engine = Engine(config)
    # the host bank holds the cold experts, then every hot expert; no spare host row
    for index in LAYERS:
        layer = engine.split[index]
        assert len(layer.cold_ids) == 16 and set(layer.host_copies) == set(layer.hot_experts)
    policy = _async(engine, config, ImmediateCopies())
    step = StepBarrier(policy)
    g = torch.Generator().manual_seed(5)
    for n in range(30):
        ids = {index: sample_ids(class_probs("prose")[row], 8, g) for row, index in enumerate(LAYERS)}
        if step.before_forward(real=True) is not None:
            assert engine.full_check()
        assert engine.forward(ids, seed=n)
    assert policy.swaps_done >= 2
    assert policy.copied_bytes == {"in": policy.swaps_done * ROW_BYTES, "out": 0}
    assert all(r.copied_out == 0 for r in policy.reports)
    assert policy.spare_bytes() == {"hbm": 2 * 4 * ROW_BYTES, "host": 2 * 10 * ROW_BYTES}


def test_one_shared_code_table_flips_in_one_write_with_the_same_result():
    config = AdaptiveConfig(interval=3, swaps_per_layer=2, decay=0.5, margin=0.25, evidence=0.0,
                            counts_evidence=0.0, copy_rows_per_layer=1e6)
    shared, plain = Engine(config), Engine(config)
    table = share_row_codes(shared.split, order=LAYERS)
    policies = [_async(e, config, ImmediateCopies()) for e in (shared, plain)]
    assert policies[0]._flipper.table is table and policies[1]._flipper.table is None
    steps = [StepBarrier(p) for p in policies]
    g = torch.Generator().manual_seed(9)
    for n in range(30):
        ids = {index: sample_ids(class_probs("math")[row], 8, g) for row, index in enumerate(LAYERS)}
        for engine, step in zip((shared, plain), steps):
            step.before_forward(real=True)
            assert engine.forward(ids, seed=n)
    assert policies[0].swaps_done == policies[1].swaps_done >= 2
    for index in LAYERS:
        assert torch.equal(shared.split[index].row_codes, plain.split[index].row_codes)
        assert shared.split[index].row_codes.data_ptr() == table[LAYERS.index(index)].data_ptr()
    assert current_rowmap(shared.split).content_hash() == current_rowmap(plain.split).content_hash()


def test_ranks_holding_different_bytes_issue_and_flip_the_same_transfers():
    """Two "tensor-parallel ranks" (different expert bytes, the same routing): the same transfers,
    chunks issued at the same steps, the same flips (decisions depend on counts and ticks only)."""
    config = AdaptiveConfig(interval=4, swaps_per_layer=2, decay=0.5, margin=0.25, evidence=0.0,
                            counts_evidence=0.0, copy_rows_per_layer=0.75)
    ranks = [Engine(config), Engine(config)]
    with torch.no_grad():
        for t in ranks[1].split[3].hot.tensors.values():
            t.mul_(2)
    logs = [[], []]
    policies = [_async(e, config, ImmediateCopies()) for e in ranks]
    steps = [StepBarrier(p) for p in policies]
    g = torch.Generator().manual_seed(13)
    for n in range(48):
        ids = {index: sample_ids(class_probs("prose")[row], 4, g) for row, index in enumerate(LAYERS)}
        for r in range(2):
            report = steps[r].before_forward(real=True)
            logs[r].append((None if report is None else report.swaps,
                            [(t.swap, t.issued) for t in policies[r].in_flight]))
            ranks[r].forward(ids, seed=n)
    assert logs[0] == logs[1] and policies[0].swaps_done >= 2


def test_apply_drops_transfers_in_flight_and_returns_their_rows():
    config = AdaptiveConfig(**SMALL, copy_rows_per_layer=0.125)
    engine, policy = _primed(config, ManualCopies())
    policy.barrier()
    policy.pump()
    layer = engine.split[3]
    free_before = sorted(r for r, e in enumerate(layer.hot_ids) if e == SPARE)
    reserved = {t.hot_row for t in policy.in_flight}
    assert reserved <= set(free_before)
    x, y = layer.cold_experts[-1], layer.hot_experts[-1]
    policy.apply([Swap(3, x, y)])
    assert policy.in_flight == [] and policy.discarded_plans == 1
    assert x in layer.hot_experts and y in layer.cold_experts and engine.full_check()
    assert sum(1 for e in layer.hot_ids if e == SPARE) == len(free_before)


def test_chunks_cover_every_byte_once():
    a = torch.arange(10, dtype=torch.uint8).view(1, 10)
    b = (torch.arange(7, dtype=torch.uint8) + 100).view(1, 7)
    dst = [torch.zeros(2, 10, dtype=torch.uint8), torch.zeros(2, 7, dtype=torch.uint8)]
    bounds = chunk_bounds([10, 7], 4)
    chunks = _row_chunks(dst, 1, [a, b], 0, "in", bounds)
    assert len(chunks) == 4
    sizes = [sum(p.hi - p.lo for p in c) for c in chunks]
    assert sizes == [4, 4, 4, 5]          # 17 bytes: 0-4, 4-8, 8-12, 12-17 (one spans both tensors)
    assert len(chunks[2]) == 2 and [(p.lo, p.hi) for p in chunks[2]] == [(8, 10), (0, 2)]
    for c in chunks:
        for d, s, direction in c:         # a piece unpacks as a copy
            assert direction == "in"
            d.copy_(s)
    assert torch.equal(dst[0][1], a[0]) and torch.equal(dst[1][1], b[0])
    assert not dst[0][0].any() and not dst[1][0].any()   # the other row untouched
    piece = chunks[3][0]
    d_ptr, s_ptr, n = piece.pointers()
    assert (d_ptr, s_ptr, n) == (dst[1].data_ptr() + 7 + 2, b.data_ptr() + 2, 5)


def test_policy_refuses_layers_without_spare_rows():
    from expert_residency.core import ExpertCounter, device_allocator, host_allocator, rehome_layer
    from test_core_fixtures import EXPERTS, clone_tensors, float_layer

    layers = {i: rehome_layer(clone_tensors(float_layer(i, torch.bfloat16)), list(range(10)),
                              list(range(10, EXPERTS)), layer_index=i, hot_alloc=device_allocator("cpu"),
                              cold_alloc=host_allocator()) for i in LAYERS}
    with pytest.raises(ValueError, match="no spare HBM row"):
        AdaptivePolicy(ExpertCounter(LAYERS, EXPERTS), layers, AdaptiveConfig())
    AdaptivePolicy(ExpertCounter(LAYERS, EXPERTS), layers, AdaptiveConfig(swaps_per_layer=0))  # nothing to swap


def test_the_cuda_runtime_of_torchs_major_version_is_tried_first():
    from expert_residency.core.copies import runtime_candidates

    mapped = ["/opt/cupy/lib/libcudart.so.12", "/venv/nvidia/cu13/lib/libcudart.so.13",
              "/venv/nvidia/cu13/lib/libcudart.so.13", "/x/libcudart.so.12.8.90"]
    assert runtime_candidates(mapped, "13.0") == ["/venv/nvidia/cu13/lib/libcudart.so.13",
                                                  "/opt/cupy/lib/libcudart.so.12", "/x/libcudart.so.12.8.90"]
    assert runtime_candidates(mapped, "12.8")[:2] == ["/opt/cupy/lib/libcudart.so.12", "/x/libcudart.so.12.8.90"]
    assert runtime_candidates(mapped, None) == sorted(set(mapped))
    assert runtime_candidates([], "13.0") == []
