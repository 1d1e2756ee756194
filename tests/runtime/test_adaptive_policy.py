"""The adaptive policy on real banks: split == unsplit bit for bit through swap rounds under
shifting routing, hashes, bytes, window figures, and mis-ordered swaps caught."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import (  # noqa: E402
    ExpertCounter,
    build_unsplit_layer,
    current_rowmap,
    device_allocator,
    host_allocator,
    rehome_layer,
    residency_forward,
)
from expert_residency.core.adaptive import AdaptiveConfig, AdaptivePolicy, Swap, run_in_order  # noqa: E402
from expert_residency.core.reference import swiglu_per_pick  # noqa: E402
from expert_residency.formats import load_histogram  # noqa: E402
from expert_residency.formats.hashes import content_hash  # noqa: E402
from test_core_fixtures import (  # noqa: E402
    EXPERTS,
    HIDDEN,
    INTER,
    TOP_K,
    clone_tensors,
    float_layer,
    hidden_states,
    single_torch_thread,  # noqa: E402,F401  (autouse)
)

pytestmark = pytest.mark.torch

PROFILES = Path(__file__).resolve().parents[2] / "recipes" / "profiles" / "dsv41-flash"
LAYERS = (3, 5)  # model numbering: the policy must not assume 0..L-1
HOT = 10


def class_probs(name: str) -> torch.Tensor:
    """The synthetic class profile scaled down: MoE layers 0 and 1, experts 0..15 of the
    reference histograms (each class keeps its own skew and its own ranking)."""
    h = load_histogram(PROFILES / f"{name}.hist")
    counts = torch.tensor(h.counts[:len(LAYERS), :EXPERTS], dtype=torch.float64)
    return counts / counts.sum(dim=1, keepdim=True)


def top_hot(probs_row: torch.Tensor) -> tuple[list[int], list[int]]:
    order = torch.argsort(probs_row, descending=True, stable=True).tolist()
    return order[:HOT], order[HOT:]


def sample_ids(probs_row: torch.Tensor, tokens: int, g: torch.Generator) -> torch.Tensor:
    return torch.multinomial(probs_row.float().expand(tokens, -1), TOP_K, replacement=False,
                             generator=g).to(torch.int32)


class Engine:
    """Two split layers beside their unsplit references, one counter, one policy."""

    def __init__(self, config: AdaptiveConfig, start: str = "agent", priors=None) -> None:
        probs = class_probs(start)
        self.fn = swiglu_per_pick()
        self.split, self.ref = {}, {}
        for row, index in enumerate(LAYERS):
            tensors = float_layer(40 + row, torch.bfloat16)
            hot, cold = top_hot(probs[row])
            spare = max(config.spare_rows, 1)   # as the plugin re-homes an adaptive lane
            keep = config.host_copies == "all"
            self.split[index] = rehome_layer(clone_tensors(tensors), hot, cold, layer_index=index,
                                             hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator(),
                                             hot_spare=spare, cold_spare=0 if keep else spare,
                                             host_copies=keep)
            self.ref[index] = build_unsplit_layer(tensors, layer_index=index)
        self.counter = ExpertCounter(LAYERS, EXPERTS, top_k=TOP_K)
        self.policy = AdaptivePolicy(self.counter, self.split, config, priors=priors)

    def forward(self, ids: dict[int, torch.Tensor], seed: int, count: bool = True) -> bool:
        """One step through both layers; True when split == unsplit bit for bit in every layer."""
        same = True
        for index in LAYERS:
            x = hidden_states(seed + index, ids[index].shape[0], torch.bfloat16)
            w = torch.softmax(torch.randn(ids[index].shape, generator=torch.Generator().manual_seed(seed)), -1)
            got = residency_forward(self.split[index], x, w, ids[index], self.fn,
                                    counter=self.counter if count else None)
            want = residency_forward(self.ref[index], x, w, ids[index], self.fn)
            same = same and torch.equal(got, want)
        return same

    def full_check(self) -> bool:
        """Every expert in every top-k position of some token, in both layers (not counted: the
        check is not traffic)."""
        ids = torch.tensor([[(e + 5 * k) % EXPERTS for k in range(TOP_K)] for e in range(EXPERTS)],
                           dtype=torch.int32)
        return self.forward({index: ids for index in LAYERS}, seed=999, count=False)


def decode_live(codes: torch.Tensor) -> tuple[list[int], list[int]]:
    """The device map read on its own (no host mirror): hot experts by HBM row, cold experts by
    host row; spare rows are simply rows no code names. Fails if two experts share a row."""
    values = codes.tolist()
    hot = sorted((v, e) for e, v in enumerate(values) if v >= 0)
    cold = sorted((-v - 1, e) for e, v in enumerate(values) if v < 0)
    assert len({r for r, _ in hot}) == len(hot) and len({r for r, _ in cold}) == len(cold)
    return [e for _, e in hot], [e for _, e in cold]


def hot_mass(layers, probs: torch.Tensor) -> float:
    """Share of a class's picks (by its profile) that the live maps serve from the hot bank."""
    return sum(float(probs[row, layers[index].hot_experts].sum()) for row, index in enumerate(LAYERS)) / len(LAYERS)


def test_split_equals_unsplit_through_swap_rounds_under_shifting_traffic():
    engine = Engine(AdaptiveConfig(interval=3, swaps_per_layer=2, decay=0.5, margin=0.25, evidence=0.0,
                                   counts_evidence=0.0))
    g = torch.Generator().manual_seed(7)
    shape_hash = current_rowmap(engine.split).shape_hash()
    hashes = [engine.policy.initial_content_hash]
    step = 0
    for phase in ("agent", "prose", "math"):
        probs = class_probs(phase)
        before = hot_mass(engine.split, probs)
        for _ in range(18):
            ids = {index: sample_ids(probs[row], 8, g) for row, index in enumerate(LAYERS)}
            assert engine.forward(ids, seed=step), f"split != unsplit at step {step} ({phase})"
            step += 1
            if engine.policy.tick():
                report = engine.policy.barrier()
                assert engine.full_check(), f"bit-exact check failed after barrier {report.barrier}"
                assert report.shape_hash == shape_hash
                # the reported hash is the hash of what the device map holds (decoded independently)
                hot, cold = zip(*(decode_live(engine.split[i].row_codes) for i in LAYERS))
                assert report.content_hash == content_hash(LAYERS, EXPERTS, hot, cold)
        after = hot_mass(engine.split, probs)
        hashes.append(engine.policy.reports[-1].content_hash)
        if phase != "agent":  # the map moved toward the new class
            assert after > before, (phase, before, after)
    assert engine.policy.barriers == 18 and engine.policy.forwards == 54
    assert engine.policy.swaps_done >= 4
    assert len(set(hashes[1:])) == 3 and hashes[-1] != hashes[0]
    # at most S swaps per layer per barrier
    for report in engine.policy.reports:
        for index in LAYERS:
            assert sum(1 for s in report.swaps if s.layer == index) <= 2


def test_window_figures_and_bytes_by_hand():
    engine = Engine(AdaptiveConfig(interval=1, swaps_per_layer=1, decay=0.5, margin=0.0, evidence=0.0,
                                   counts_evidence=0.0))
    layer = engine.split[3]
    cold, hot = list(layer.cold_experts), list(layer.hot_experts)  # copies: the swap updates the live lists
    # one forward, 2 tokens: layer 3 gets 3 cold picks + 5 hot picks, layer 5 all-hot picks of its map
    ids3 = torch.tensor([[cold[0], cold[1], hot[0], hot[1]], [cold[0], hot[2], hot[3], hot[4]]], dtype=torch.int32)
    h5 = list(engine.split[5].hot_experts)
    ids5 = torch.tensor([h5[:4], h5[4:8]], dtype=torch.int32)
    assert engine.forward({3: ids3, 5: ids5}, seed=1)
    assert engine.policy.tick()
    report = engine.policy.barrier()
    assert report.window_picks == 16 and report.window_cold_picks == 3
    assert report.window_cold_share == 3 / 16
    # layer 3: cold[0] scored 2 beats the weakest hot expert (score 0, lowest id among the unpicked)
    unpicked_hot = sorted(set(hot) - {hot[0], hot[1], hot[2], hot[3], hot[4]})
    assert report.swaps == [Swap(3, cold[0], unpicked_hot[0])]
    # bytes: one bf16 row each of w13 [2I, H] and w2 [H, I] = (2*32*64 + 64*32) * 2 = 12288 B per expert;
    # a swap moves one expert in and (the host held no copy of the demoted one) one out; each of the
    # two layers has 4 spare HBM rows and 4 spare host rows (spare_rows, default)
    assert (INTER, HIDDEN) == (32, 64)
    assert report.host_link_bytes == 2 * 12288 and report.copied_out == 1
    assert engine.policy.spare_bytes() == {"hbm": 2 * 4 * 12288, "host": 2 * 4 * 12288}
    assert engine.full_check()


@pytest.mark.parametrize("counts_evidence, swapped", [(1.5, True), (2.5, False)])
def test_counts_alone_use_the_counts_evidence_guard(counts_evidence, swapped):
    # 3 tokens each pick cold[0] and three hot experts: cold[0] scores 3 against an unpicked hot
    # expert's 0. Lead 3 vs guard * sqrt(3 + 0): 1.5 * 1.732 = 2.60 passes, 2.5 * 1.732 = 4.33 does
    # not. `evidence` (the guard with a profile in the ranking) is 0 here and must not apply.
    engine = Engine(AdaptiveConfig(interval=1, swaps_per_layer=1, decay=0.5, margin=0.0, evidence=0.0,
                                   counts_evidence=counts_evidence, prior_weight=0.0))
    cold, hot = list(engine.split[3].cold_experts), list(engine.split[3].hot_experts)
    ids = torch.tensor([[cold[0], hot[0], hot[1], hot[2]]] * 3, dtype=torch.int32)
    engine.counter.count(3, ids)
    report = engine.policy.barrier()
    assert bool(report.swaps) is swapped
    if swapped:
        assert report.swaps[0].promote == cold[0]


def test_decayed_scores_follow_the_counter_and_survive_a_reset():
    engine = Engine(AdaptiveConfig(interval=1, swaps_per_layer=0, decay=0.5, margin=0.0, evidence=0.0,
                                   counts_evidence=0.0))
    e = engine.split[3].cold_experts[0]
    ids = torch.tensor([[e, (e + 1) % EXPERTS, (e + 2) % EXPERTS, (e + 3) % EXPERTS]], dtype=torch.int32)
    for _ in range(3):  # counts of e per window: 1, 1, 1 -> scores 1, 1.5, 1.75
        engine.counter.count(3, ids)
        engine.policy.barrier()
    assert engine.policy.scores[0, e].item() == 1.75
    engine.counter.reset()           # e.g. a dump writer that restarts its counts
    engine.counter.count(3, ids)     # window = 1 (not 1 - 3): 0.5 * 1.75 + 1 = 1.875
    engine.policy.barrier()
    assert engine.policy.scores[0, e].item() == 1.875
    engine.policy.barrier()          # an empty window only decays: 0.9375
    assert engine.policy.scores[0, e].item() == 0.9375
    assert engine.counter.counts[0, e].item() == 1  # the counter itself stays cumulative


def _primed_engine():
    """An engine whose next barrier swaps at least one pair in layer 3."""
    engine = Engine(AdaptiveConfig(interval=1, swaps_per_layer=1, decay=0.5, margin=0.0, evidence=0.0,
                                   counts_evidence=0.0))
    cold = engine.split[3].cold_experts
    engine.counter.count(3, torch.tensor([[cold[0], cold[1], cold[2], cold[3]]], dtype=torch.int32))
    return engine


def test_flip_before_copy_is_caught_by_the_bit_exact_check():
    engine = _primed_engine()
    results = []

    def flip_first(steps):
        flips = [s for s in steps if s.kind == "map"]
        copies = [s for s in steps if s.kind == "copy"]
        for s in flips:
            s.run()
        results.append(engine.full_check())  # a forward sneaking in between flip and copies
        for s in copies:
            s.run()

    report = engine.policy.barrier(run=flip_first)
    assert report.swaps and results == [False]
    assert engine.full_check()  # once the copies landed the state is what an ordered swap gives


def test_flip_without_copies_is_caught_after_the_round():
    engine = _primed_engine()
    engine.policy.barrier(run=lambda steps: [s.run() for s in steps if s.kind == "map"])
    assert not engine.full_check()


def test_ordered_round_passes_the_same_check():
    engine = _primed_engine()
    report = engine.policy.barrier(run=run_in_order)
    assert report.swaps and engine.full_check()


def test_a_forward_inside_the_barrier_is_refused():
    engine = _primed_engine()

    def forward_between(steps):
        steps[0].run()
        engine.policy.tick()  # the engine counting a forward between the first copy and the flip

    with pytest.raises(RuntimeError, match="inside a swap barrier"):
        engine.policy.barrier(run=forward_between)
    assert engine.policy.tick() is True  # the guard is lifted again afterwards


def test_policy_refuses_layers_that_do_not_match_the_counter():
    engine = Engine(AdaptiveConfig())
    with pytest.raises(ValueError, match="counter's MoE layers"):
        AdaptivePolicy(ExpertCounter((3, 4), EXPERTS), engine.split)
    with pytest.raises(ValueError, match="experts"):
        AdaptivePolicy(ExpertCounter(LAYERS, EXPERTS + 1), engine.split)


def _run_prose(engines, steps: int, tokens: int = 8) -> dict:
    """Feed the same prose traffic to every engine; bit-exact check after each barrier; the
    reported prior choices per engine."""
    probs = class_probs("prose")
    g = torch.Generator().manual_seed(3)
    chosen = {id(e): [] for e in engines}
    for step in range(steps):
        ids = {index: sample_ids(probs[row], tokens, g) for row, index in enumerate(LAYERS)}
        for engine in engines:
            assert engine.forward(ids, seed=step)
            if engine.policy.tick():
                chosen[id(engine)].append(engine.policy.barrier().prior)
                assert engine.full_check()
    return chosen


def test_class_priors_pick_the_class_and_lead_the_ranking():
    """With the class profiles as priors the window's class is named in the report and its map is
    approached faster than counts alone allow under the same evidence guard."""
    profiles = {name: class_probs(name) for name in ("agent", "prose", "math")}
    config = dict(interval=2, swaps_per_layer=2, decay=0.5, margin=0.25, evidence=1.0, counts_evidence=1.0)
    with_prior = Engine(AdaptiveConfig(**config, prior_weight=8.0), priors=profiles)
    counts_only = Engine(AdaptiveConfig(**config, prior_weight=0.0), priors=profiles)
    chosen = _run_prose([with_prior, counts_only], steps=8)
    assert chosen[id(counts_only)] == [None] * 4
    # the first window is judged against the profiles alone (no counts yet): prose; later the
    # observed counts may fit as well (they are an estimate of the same traffic)
    assert chosen[id(with_prior)][0] == "prose" and set(chosen[id(with_prior)]) <= {"prose", "observed"}
    probs = profiles["prose"]
    assert hot_mass(with_prior.split, probs) > hot_mass(counts_only.split, probs)
    # an empty window keeps the last choice
    last = chosen[id(with_prior)][-1]
    assert with_prior.policy.barrier().prior == last


def test_traffic_no_profile_explains_falls_back_to_the_counts():
    """Prose traffic on a lane that only has agent and math profiles: once counts exist, they fit
    the window better than any profile (or their mixture) and the ranking follows them."""
    profiles = {name: class_probs(name) for name in ("agent", "math")}
    engine = Engine(AdaptiveConfig(interval=2, swaps_per_layer=2, decay=0.5, margin=0.25, evidence=1.0,
                                   counts_evidence=1.0, prior_weight=8.0), priors=profiles)
    chosen = _run_prose([engine], steps=12)[id(engine)]
    # even before any counts, the uniform start of the observed candidate beats a wrong profile
    assert chosen == ["observed"] * 6


def test_priors_of_the_wrong_shape_are_refused():
    engine = Engine(AdaptiveConfig())
    with pytest.raises(ValueError, match="prior 'agent' has shape"):
        AdaptivePolicy(engine.counter, engine.split, AdaptiveConfig(), priors={"agent": torch.ones(3, EXPERTS)})


def test_live_rowmap_and_status(tmp_path):
    engine = _primed_engine()
    before = engine.policy.status()
    assert before == {"live_content_hash": engine.policy.initial_content_hash,
                      "boot_content_hash": engine.policy.initial_content_hash,
                      "shape_hash": engine.policy.shape_hash, "forwards": 0, "barriers": 0, "swaps": 0,
                      "window_cold_share": None, "prior": None}
    report = engine.policy.barrier()
    after = engine.policy.status()
    # the primed window: 4 picks of layer 3, all cold (before the swap), none in layer 5
    assert after["window_cold_share"] == 1.0 and after["barriers"] == 1 and after["swaps"] == len(report.swaps) == 1
    assert after["live_content_hash"] == report.content_hash != after["boot_content_hash"]
    live = engine.policy.live_rowmap(provenance={"class": "prose"})
    live.validate()
    assert live.content_hash() == report.content_hash and live.shape_hash() == engine.policy.shape_hash
    assert live.provenance == {"builder": "adaptive", "barriers": 1, "swaps": 1,
                               "boot_content_hash": engine.policy.initial_content_hash, "class": "prose"}
    hot, cold = decode_live(engine.split[3].row_codes)
    assert live.hot[0] == hot and live.cold[0] == cold
    # it saves and loads as an ordinary row map with the same hash (a class map for the next boot)
    from expert_residency.formats import load_rowmap, save_rowmap
    save_rowmap(live, tmp_path / "prose-live.rowmap")
    again = load_rowmap(tmp_path / "prose-live.rowmap")
    assert again.content_hash() == report.content_hash and again.provenance["builder"] == "adaptive"


def test_live_rowmap_waits_for_a_barrier_in_progress():
    """A reader on another thread (the dump writer, a status request) asking for the live map
    while a barrier is between a swap's copies and its flip waits for the barrier to finish, then
    sees the map after it — never the half-swapped host mirror."""
    import threading

    engine = _primed_engine()
    asked, got = threading.Event(), []

    def reader():
        asked.set()
        got.append(engine.policy.live_rowmap())

    thread = threading.Thread(target=reader)
    blocked = []

    def copies_then_wait_then_flip(steps):
        for step in steps[:-1]:
            step.run()
        thread.start()
        asked.wait()
        thread.join(timeout=0.5)
        blocked.append(thread.is_alive())  # still waiting on the map lock
        steps[-1].run()

    report = engine.policy.barrier(run=copies_then_wait_then_flip)
    thread.join()
    assert report.swaps and blocked == [True]
    assert got[0].content_hash() == report.content_hash


def _cold_by_hand(layers, ids: dict[int, torch.Tensor]) -> int:
    """Picks of experts the live host mirrors list as cold, counted in Python."""
    return sum(int(e) in set(layers[i].cold_experts) for i in LAYERS for e in ids[i].reshape(-1).tolist())


def test_lookahead_applies_the_same_plans_one_barrier_later():
    """With lookahead a barrier swaps by the plan the previous barrier computed. The plans must be
    the ones a policy without lookahead computes on the same traffic (routing does not depend on
    the map, and each plan ranks the map after its predecessor's swaps either way), each applied
    one barrier later; the report's window is the applied plan's, its cold picks under the map
    that served it (recounted by hand); split == unsplit throughout."""
    config = AdaptiveConfig(interval=2, swaps_per_layer=2, decay=0.5, margin=0.25, evidence=0.0,
                            counts_evidence=0.0, copy_rows_per_layer=1e6,   # copies keep up
                            flip_interval=2)   # flips at the barriers only: one map per window
    plain, ahead = Engine(config), Engine(config)
    assert plain.policy.lookahead_on is False          # CPU default: nothing to hide
    ahead.policy = AdaptivePolicy(ahead.counter, ahead.split, config, lookahead=True)
    assert ahead.policy.lookahead_on
    g = torch.Generator().manual_seed(21)
    windows, cold_now = [], 0   # the lookahead engine's hand-counted cold picks per window
    step = 0
    for phase in ("agent", "prose", "math"):
        probs = class_probs(phase)
        for _ in range(16):
            ids = {index: sample_ids(probs[row], 8, g) for row, index in enumerate(LAYERS)}
            cold_now += _cold_by_hand(ahead.split, ids)
            for engine in (plain, ahead):
                assert engine.forward(ids, seed=step), f"split != unsplit at step {step}"
            step += 1
            due = [engine.policy.tick() for engine in (plain, ahead)]
            assert due[0] == due[1]
            if due[0]:
                windows.append(cold_now)
                cold_now = 0
                plain.policy.barrier()
                ahead.policy.barrier()
                assert ahead.full_check(), f"bit-exact check failed after barrier {ahead.policy.barriers}"
            ahead.policy.pump()   # the step's copies (the engine calls it after every tick)
    p, a = plain.policy.reports, ahead.policy.reports
    assert len(p) == len(a) == 24
    assert a[0].swaps == [] and a[0].window_picks == 0 and a[0].prior is None
    assert sum(len(r.swaps) for r in p[:-1]) >= 4     # the comparison below is not vacuous
    for k in range(1, len(a)):
        # the same swaps; with lookahead they are copied (and listed) strongest gain first
        assert sorted(a[k].swaps) == sorted(p[k - 1].swaps), k
        assert a[k].window_picks == p[k - 1].window_picks == 2 * 8 * TOP_K * len(LAYERS)
        assert a[k].window_cold_picks == windows[k - 1], k
    # the map lags by exactly the last plan: applying it brings the two maps level
    ahead.policy.apply(p[-1].swaps)
    assert current_rowmap(ahead.split).content_hash() == current_rowmap(plain.split).content_hash()


def test_lookahead_drops_a_plan_made_stale_by_swaps_outside_a_barrier():
    config = AdaptiveConfig(interval=1, swaps_per_layer=1, decay=0.5, margin=0.0, evidence=0.0,
                            counts_evidence=0.0, copy_rows_per_layer=1e6)
    engine = Engine(config)
    engine.policy = AdaptivePolicy(engine.counter, engine.split, config, lookahead=True)
    layer = engine.split[3]
    cold = layer.cold_experts[0]
    # every forward: layer 3 picks `cold` twice (once per token) beside three hot experts, layer 5 hot only
    ids = {3: torch.tensor([[cold] + layer.hot_experts[:3]] * 2, dtype=torch.int32),
           5: torch.tensor([engine.split[5].hot_experts[:4]] * 2, dtype=torch.int32)}
    assert engine.forward(ids, seed=1)
    assert engine.policy.tick()
    assert engine.policy.barrier().swaps == []        # plan started: promote `cold` in layer 3
    engine.policy.pump()                              # ... read, its copies issued
    assert [t.swap.promote for t in engine.policy.in_flight] == [cold]
    # an operator swap changes the map before the plan applies: the transfer in flight is dropped
    engine.policy.apply([Swap(3, layer.cold_experts[1], layer.hot_experts[5])])
    assert engine.policy.in_flight == [] and engine.policy.discarded_plans == 1
    assert engine.forward(ids, seed=2)
    assert engine.policy.tick()
    report = engine.policy.barrier()
    assert report.swaps == [] and engine.policy.discarded_plans == 1 and report.window_picks == 0
    assert engine.full_check()
    engine.policy.pump()
    # the next barrier applies the plan started after the drop
    assert engine.forward(ids, seed=3)
    assert engine.policy.tick()
    report = engine.policy.barrier()
    assert [(s.layer, s.promote) for s in report.swaps] == [(3, cold)]
    # its window (forward 2) had 16 picks, `cold`'s 2 cold under the map after the operator's swap
    assert (report.window_picks, report.window_cold_picks) == (16, 2) and engine.full_check()
