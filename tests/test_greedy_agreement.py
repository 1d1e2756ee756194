"""The rule the vLLM-engine tests use to compare runs whose kernels round differently
(tests/vllm_support/agreement.py), on hand-made runs whose figures are worked out below."""

from __future__ import annotations

import pytest
from vllm_support.agreement import assert_greedy_agreement, greedy_agreement, top1_margins


def test_identical_runs_agree_exactly() -> None:
    a = greedy_agreement([[1, 2, 3]], [[-0.5, -1.0, -0.25]], [[0.3, 0.2, 0.1]],
                         [[1, 2, 3]], [[-0.5, -1.0, -0.25]])
    assert (a.max_logprob_diff, a.tokens_identical, a.tokens) == (0.0, 3, 3)
    assert (a.prompts_identical, a.prompts, a.flips_above_bound) == (1, 1, ())
    assert a.smallest_reference_margin == 0.1
    assert_greedy_agreement(a, 0.125)


def test_a_flip_inside_twice_the_largest_difference_is_rounding() -> None:
    # Position 0 agrees with |Δ| = 0.0625, so d = 0.0625 and 2d = 0.125; position 1 flips where the
    # reference's margin is 0.1 < 0.125; position 2 is not compared (the contexts differ).
    a = greedy_agreement([[1, 2, 3]], [[-0.5, -1.0, -0.25]], [[0.5, 0.1, 9.0]],
                         [[1, 7, 8]], [[-0.5625, -2.0, -9.0]])
    assert a.max_logprob_diff == 0.0625
    assert (a.tokens_identical, a.prompts_identical, a.flips_above_bound) == (1, 0, ())
    assert a.smallest_reference_margin == 0.1     # position 2 (margin 9.0) was not compared
    assert_greedy_agreement(a, 0.125)


def test_a_flip_beyond_twice_the_largest_difference_fails() -> None:
    # d = 0.0625 again, but the flip is where the reference led by 0.25 > 2d.
    a = greedy_agreement([[1, 2], [4]], [[-0.5, -1.0], [-0.1]], [[0.5, 0.25], [1.0]],
                         [[1, 7], [4]], [[-0.5625, -2.0], [-0.1]])
    assert a.flips_above_bound == ((0, 1, 0.25),)
    assert a.prompts_identical == 1
    with pytest.raises(AssertionError, match="margin exceeds 2 x 0.0625"):
        assert_greedy_agreement(a, 0.125)


def test_logprobs_beyond_the_tolerance_fail_even_with_identical_tokens() -> None:
    a = greedy_agreement([[1]], [[-0.5]], [[1.0]], [[1]], [[-0.75]])
    assert a.max_logprob_diff == 0.25
    with pytest.raises(AssertionError):
        assert_greedy_agreement(a, 0.125)


def test_a_first_token_flip_with_nothing_agreeing_needs_a_tied_reference() -> None:
    # Nothing agreed, so d = 0: only an exact tie (margin 0) may flip.
    tied = greedy_agreement([[1]], [[-0.7]], [[0.0]], [[2]], [[-0.7]])
    assert tied.flips_above_bound == ()
    led = greedy_agreement([[1]], [[-0.7]], [[0.001]], [[2]], [[-0.7]])
    assert led.flips_above_bound == ((0, 0, 0.001),)


def test_margins_from_a_completion_response() -> None:
    response = {"choices": [{"logprobs": {"top_logprobs": [
        {"a": -0.25, "b": -1.5},     # margin 1.25
        {"c": -0.5},                 # one entry (two tokens printing alike): no margin known
        {"d": -2.0, "e": -0.125},    # listed worst first: margin 1.875
    ]}}]}
    assert top1_margins(response) == [1.25, 0.0, 1.875]


def test_without_the_margin_rule_only_the_tolerance_and_a_nonempty_comparison_count() -> None:
    flipped = greedy_agreement([[1, 2], [4]], [[-0.5, -1.0], [-0.1]], [[0.5, 0.25], [1.0]],
                               [[1, 7], [4]], [[-0.5625, -2.0], [-0.1]])
    assert flipped.flips_above_bound            # refused with the rule (test above) ...
    assert_greedy_agreement(flipped, 0.125, margin_rule=False)   # ... passed without it
    nothing_agreed = greedy_agreement([[1]], [[-0.7]], [[0.0]], [[2]], [[-0.7]])
    with pytest.raises(AssertionError, match="no generated token agreed"):
        assert_greedy_agreement(nothing_agreed, 0.125, margin_rule=False)
    far = greedy_agreement([[1]], [[-0.5]], [[1.0]], [[1]], [[-0.75]])
    with pytest.raises(AssertionError):
        assert_greedy_agreement(far, 0.125, margin_rule=False)
