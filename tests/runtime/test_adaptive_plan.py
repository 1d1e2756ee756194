"""The adaptive policy's pure plan step against hand-made counts (no banks, no engine).

Every expected figure below is worked out by hand in the comments; decay 0.5 and small integer
counts keep the arithmetic exact in binary floating point.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core.adaptive import (  # noqa: E402
    AdaptiveConfig,
    Swap,
    blend_prior,
    choose_prior,
    decay_scores,
    plan_swaps,
    rank_swaps,
)

pytestmark = pytest.mark.torch


def _mask(hot_rows: list[list[int]], experts: int) -> torch.Tensor:
    mask = torch.zeros(len(hot_rows), experts, dtype=torch.bool)
    for row, ids in enumerate(hot_rows):
        mask[row, ids] = True
    return mask


def _scores(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def test_decay_arithmetic_by_hand():
    # windows 8, 4, 0, 2 with decay 0.5: 8 -> 0.5*8+4 = 8 -> 0.5*8+0 = 4 -> 0.5*4+2 = 4
    # a second expert seeing 0, 0, 16, 0: 0 -> 0 -> 16 -> 8
    scores = torch.zeros(1, 2, dtype=torch.float64)
    seen = []
    for a, b in ((8, 0), (4, 0), (0, 16), (2, 0)):
        decay_scores(scores, torch.tensor([[a, b]], dtype=torch.int64), 0.5)
        seen.append(scores[0].tolist())
    assert seen == [[8.0, 0.0], [8.0, 0.0], [4.0, 16.0], [4.0, 8.0]]


def test_strongest_cold_replaces_weakest_hot():
    # 6 experts, hot {0, 1, 2}, cold {3, 4, 5}; scores 10 9 1 | 0 7 3.
    # sorted cold: 4 (7), 5 (3), 3 (0); sorted hot: 2 (1), 1 (9), 0 (10).
    # margin 0.5: pair 0: 7 > 1.5*1 = 1.5 yes; pair 1: 3 > 1.5*9 no -> one swap: 4 in, 2 out.
    swaps = plan_swaps(_scores([[10, 9, 1, 0, 7, 3]]), _mask([[0, 1, 2]], 6), [5],
                       swaps_per_layer=3, margin=0.5)
    assert swaps == [Swap(layer=5, promote=4, demote=2)]


def test_margin_is_the_hysteresis():
    # cold 3 scores 12, weakest hot 0 scores 10: 12 > 1.1*10 = 11 swaps, 12 > 1.25*10 = 12.5 does not
    scores, mask = _scores([[10, 20, 30, 12]]), _mask([[0, 1, 2]], 4)
    assert plan_swaps(scores, mask, [0], swaps_per_layer=4, margin=0.1) == [Swap(0, 3, 0)]
    assert plan_swaps(scores, mask, [0], swaps_per_layer=4, margin=0.25) == []
    # strict: equal after the margin (12 vs 1.2*10 = 12) does not move
    assert plan_swaps(scores, mask, [0], swaps_per_layer=4, margin=0.2) == []


def test_swaps_per_layer_cap_and_order():
    # 8 experts, hot {0..3} all at 1, cold {4..7} at 50, 40, 30, 20: all four pairs pass any margin
    # below 19; S = 2 takes the two strongest cold (4, 5) against the two weakest hot — ties at 1,
    # lower id first: 0 then 1.
    scores = _scores([[1, 1, 1, 1, 50, 40, 30, 20], [5, 6, 7, 8, 0, 0, 0, 0]])
    mask = _mask([[0, 1, 2, 3], [0, 1, 2, 3]], 8)
    swaps = plan_swaps(scores, mask, [3, 7], swaps_per_layer=2, margin=1.0)
    # the second layer's cold experts never beat its hot ones
    assert swaps == [Swap(3, 4, 0), Swap(3, 5, 1)]
    assert len(plan_swaps(scores, mask, [3, 7], swaps_per_layer=4, margin=1.0)) == 4
    assert plan_swaps(scores, mask, [3, 7], swaps_per_layer=0, margin=1.0) == []


def test_accepted_pairs_are_a_prefix():
    # hot {0, 1} scores 2, 8; cold {2, 3} scores 10, 9. margin 0: pair 0: 10 > 2 yes; pair 1: 9 > 8 yes.
    # margin 0.2: pair 0: 10 > 2.4 yes; pair 1: 9 > 9.6 no.
    scores, mask = _scores([[2, 8, 10, 9]]), _mask([[0, 1]], 4)
    assert plan_swaps(scores, mask, [0], swaps_per_layer=2, margin=0.0) == [Swap(0, 2, 0), Swap(0, 3, 1)]
    assert plan_swaps(scores, mask, [0], swaps_per_layer=2, margin=0.2) == [Swap(0, 2, 0)]
    promote, demote, accept = rank_swaps(scores, mask, 2, 0.2)
    assert promote.tolist() == [[2, 3]] and demote.tolist() == [[0, 1]] and accept.tolist() == [[True, False]]


def test_columns_past_a_bank_are_refused():
    # one cold expert only: S = 3 must not pair the hot bank's own experts (their cold key is -inf)
    scores, mask = _scores([[0, 0, 0, 5]]), _mask([[0, 1, 2]], 4)
    assert plan_swaps(scores, mask, [0], swaps_per_layer=3, margin=0.0) == [Swap(0, 3, 0)]
    # an all-hot layer (empty cold bank) has nothing to swap
    assert plan_swaps(_scores([[1, 2]]), _mask([[0, 1]], 2), [0], swaps_per_layer=2, margin=0.0) == []


def test_zero_counts_never_swap():
    assert plan_swaps(torch.zeros(2, 6, dtype=torch.float64), _mask([[0, 1, 2], [3, 4, 5]], 6), [0, 1],
                      swaps_per_layer=3, margin=0.0) == []


def _alternating_swaps(margin: float, rounds: int) -> int:
    """Two classes alternate every barrier: expert 0 (hot) gets 10 picks in A-windows, expert 2
    (cold) gets 10 picks in B-windows; the live map follows every accepted swap.

    By hand, decay 0.5, first window A: s0 = 10, s2 = 0. Then B: s0 = 5, s2 = 10; A: s0 = 12.5,
    s2 = 5; B: s0 = 6.25, s2 = 12.5; ... the expert just counted holds (in the limit) 10/(1-0.25) =
    13.33 and the other 6.67 — a factor 2 at most. Margin 0 therefore swaps at every barrier after
    the first; margin 1.5 (a factor 2.5) never does.
    """
    scores = torch.zeros(1, 4, dtype=torch.float64)
    hot = [0, 1]
    swaps = 0
    for r in range(rounds):
        window = torch.zeros(1, 4, dtype=torch.int64)
        window[0, 0 if r % 2 == 0 else 2] = 10
        window[0, 1] = 10  # a steadily used hot expert that must never leave
        decay_scores(scores, window, 0.5)
        plan = plan_swaps(scores, _mask([hot], 4), [0], swaps_per_layer=2, margin=margin)
        for swap in plan:
            hot[hot.index(swap.demote)] = swap.promote
            swaps += 1
        assert 1 in hot
    return swaps


def test_alternating_traffic_thrashes_without_margin_and_not_with_it():
    # without hysteresis: the first window (A) has nothing to swap, every later one swaps once
    assert _alternating_swaps(0.0, 12) == 11
    assert _alternating_swaps(1.5, 12) == 0


def test_evidence_guard_by_hand():
    # cold 3 scores 9, weakest hot 0 scores 1: lead 8, sqrt(9 + 1) = 3.162...
    # evidence 2: 8 > 6.32 swaps; evidence 3: 8 > 9.49 does not (the ratio 9 > 1.5 passes both)
    scores, mask = _scores([[1, 20, 30, 9]]), _mask([[0, 1, 2]], 4)
    assert plan_swaps(scores, mask, [0], swaps_per_layer=1, margin=0.5, evidence=2.0) == [Swap(0, 3, 0)]
    assert plan_swaps(scores, mask, [0], swaps_per_layer=1, margin=0.5, evidence=3.0) == []
    # the small-count case the guard exists for: seen twice vs once passes any ratio margin below 1
    # but not evidence 1 (lead 1 < sqrt(3) = 1.73)
    small = _scores([[1, 20, 30, 2]])
    assert plan_swaps(small, mask, [0], swaps_per_layer=1, margin=0.5, evidence=0.0) == [Swap(0, 3, 0)]
    assert plan_swaps(small, mask, [0], swaps_per_layer=1, margin=0.5, evidence=1.0) == []


def test_evidence_may_be_a_device_tensor():
    # the policy picks the guard on the device (profile or counts); same result as the float
    scores, mask = _scores([[1, 20, 30, 9]]), _mask([[0, 1, 2]], 4)
    for guard, want in ((2.0, [Swap(0, 3, 0)]), (3.0, [])):
        assert plan_swaps(scores, mask, [0], swaps_per_layer=1, margin=0.5,
                          evidence=torch.tensor(guard, dtype=torch.float64)) == want


def test_choose_prior_by_hand():
    # one layer, two experts; A = (0.5, 0.5), B = (0.9, 0.1).
    # window (3, 1): log L_A = 4 ln 0.5 = -2.773; log L_B = 3 ln 0.9 + ln 0.1 = -0.316 - 2.303 = -2.619 -> B
    # window (2, 2): log L_A = -2.773; log L_B = 2 ln 0.9 + 2 ln 0.1 = -4.816 -> A
    log_priors = torch.log(torch.tensor([[[0.5, 0.5]], [[0.9, 0.1]]], dtype=torch.float64))
    assert int(choose_prior(torch.tensor([[3, 1]]), log_priors)) == 1
    assert int(choose_prior(torch.tensor([[2, 2]]), log_priors)) == 0


def test_blend_prior_by_hand():
    # layer total 8, weight 0.5: (2 + 0.5*8*0.25, 6 + 0.5*8*0.75) = (3, 9); second layer total 0 stays 0
    blended = blend_prior(_scores([[2, 6], [0, 0]]), torch.tensor([[0.25, 0.75], [0.5, 0.5]]), 0.5)
    assert blended.tolist() == [[3.0, 9.0], [0.0, 0.0]]


def test_plan_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="do not match"):
        plan_swaps(torch.zeros(2, 4, dtype=torch.float64), torch.zeros(2, 4, dtype=torch.bool), [0],
                   swaps_per_layer=1, margin=0.0)


@pytest.mark.parametrize("kwargs, field", [({"interval": 0}, "interval"), ({"swaps_per_layer": -1}, "swaps_per_layer"),
                                           ({"decay": 1.0}, "decay"), ({"decay": -0.1}, "decay"),
                                           ({"margin": -0.5}, "margin"), ({"margin": float("inf")}, "margin"),
                                           ({"evidence": -1.0}, "evidence"), ({"prior_weight": -2.0}, "prior_weight"),
                                           ({"counts_evidence": float("nan")}, "counts_evidence"),
                                           ({"interval": 2.5}, "interval")])
def test_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        AdaptiveConfig(**kwargs)


def _per_layer_plan(scores: torch.Tensor, hot: torch.Tensor, swaps: int, margin: float,
                    evidence: float) -> list[Swap]:
    """The plan's definition, one layer at a time in plain Python (no tensor op across layers):
    cold experts strongest first, hot ones weakest first, ties to the lower id; pair i accepted
    while every earlier pair was, cold > (1 + margin) * hot and, with a guard, the lead beats
    evidence * sqrt(cold + hot)."""
    out = []
    for layer in range(scores.shape[0]):
        row, mask = scores[layer].tolist(), hot[layer].tolist()
        cold_ids = sorted((e for e in range(len(row)) if not mask[e]), key=lambda e: (-row[e], e))
        hot_ids = sorted((e for e in range(len(row)) if mask[e]), key=lambda e: (row[e], e))
        for c, h in list(zip(cold_ids, hot_ids))[:swaps]:
            ok = row[c] > row[h] * (1.0 + margin)
            if ok and evidence:
                ok = row[c] - row[h] > evidence * (row[c] + row[h]) ** 0.5
            if not ok:
                break
            out.append(Swap(layer, c, h))
    return out


def _adversarial_cases():
    g = torch.Generator().manual_seed(5)
    cases = []
    for n in range(12):   # random counts, few distinct values (many ties), random hot masks
        layers, experts = 1 + n % 5, 4 + 3 * n
        scores = torch.randint(0, 4, (layers, experts), generator=g).to(torch.float64)
        hot = torch.rand(layers, experts, generator=g) < 0.6
        cases.append((scores, hot))
    g2 = torch.Generator().manual_seed(9)
    for _ in range(6):    # continuous decayed scores (no ties)
        scores = torch.rand(6, 40, generator=g2, dtype=torch.float64) * 50
        cases.append((scores, torch.rand(6, 40, generator=g2) < 0.7))
    experts = 8
    cases += [
        (torch.zeros(3, experts, dtype=torch.float64), torch.rand(3, experts, generator=g) < 0.5),  # all zero
        (torch.full((2, experts), 3.0, dtype=torch.float64), _mask([[0, 1, 2], [5, 6, 7]], experts)),  # all tied
        (_scores([[9, 9, 9, 1, 1, 1, 0, 0]]), _mask([[3, 4, 5, 6, 7]], experts)),  # tied on both sides
        (_scores([[1] * experts, [2] * experts]), torch.tensor([[True] * experts, [False] * experts])),  # one-sided
        (_scores([[0, 5, 0, 5, 0, 5, 0, 5]]), _mask([[1, 3, 5, 7]], experts)),  # hot strongest: nothing
        (_scores([[5, 0, 5, 0, 5, 0, 5, 0]]), _mask([[1, 3, 5, 7]], experts)),  # every pair beats
    ]
    return cases


@pytest.mark.parametrize("swaps, margin, evidence", [(1, 0.0, 0.0), (3, 0.5, 0.0), (16, 0.25, 1.5), (2, 0.0, 2.5)])
def test_batched_ranking_equals_the_per_layer_plan(swaps, margin, evidence):
    """The ranking is one set of [L, E] tensor ops for all layers (a fixed handful of kernels,
    not a loop over layers); it must decide exactly what the per-layer definition decides,
    tie-breaking included. Expected plans come from the Python reference above, not the code."""
    for scores, hot in _adversarial_cases():
        layers = list(range(scores.shape[0]))
        got = plan_swaps(scores, hot, layers, swaps_per_layer=swaps, margin=margin, evidence=evidence)
        assert got == _per_layer_plan(scores, hot, swaps, margin, evidence), (scores, hot)
        # the guard given as a device scalar (how the policy passes it) decides the same
        if evidence:
            alt = plan_swaps(scores, hot, layers, swaps_per_layer=swaps, margin=margin,
                             evidence=torch.tensor(evidence, dtype=torch.float64))
            assert alt == got


def test_per_layer_reference_by_hand():
    # layer 0: hot {3,4,5,6,7} scores 1,1,1,0,0 -> weakest first 6,7,3,4,5; cold {0,1,2} all 9 -> 0,1,2.
    # pairs (0,6): 9 > 0, (1,7): 9 > 0, (2,3): 9 > 1.5 -> all three at margin 0.5
    scores, hot = _scores([[9, 9, 9, 1, 1, 1, 0, 0]]), _mask([[3, 4, 5, 6, 7]], 8)
    assert _per_layer_plan(scores, hot, 4, 0.5, 0.0) == [Swap(0, 0, 6), Swap(0, 1, 7), Swap(0, 2, 3)]
    # evidence 2.5: 9 - 0 = 9 > 2.5 * 3 = 7.5 (twice), 9 - 1 = 8 > 2.5 * sqrt(10) = 7.9 -> all three
    assert len(_per_layer_plan(scores, hot, 4, 0.5, 2.5)) == 3
    # evidence 3: 9 > 9 fails on the first pair -> nothing
    assert _per_layer_plan(scores, hot, 4, 0.5, 3.0) == []
