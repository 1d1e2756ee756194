"""Speculative-decoding k checks: coverage, monotonicity, method limit, boundaries vs concurrency."""

from __future__ import annotations

from recipegen.costmodel.kschedule import check_k_schedule


def levels(check, level):
    return [f.message for f in check.findings if f.level == level]


def test_constant_k_is_clean():
    check = check_k_schedule(5, max_num_seqs=16, method_max_k=7, expected_concurrency=(1, 16))
    assert check.ok and not check.findings
    assert check.dense[1:] == [5] * 16 and check.boundaries == []


def test_schedule_expands_like_vllm_with_gaps_tail_and_clamp():
    check = check_k_schedule([[1, 4, 5], [8, 12, 3]], max_num_seqs=16, num_speculative_tokens=4)
    # 1-4 -> min(4, 5); gap 5-7 carries 5 (clamped to 4); 8-12 -> 3; tail 13-16 carries 3
    assert check.dense[1:] == [4, 4, 4, 4, 4, 4, 4, 3, 3, 3, 3, 3, 3, 3, 3, 3]
    assert check.boundaries == [8]
    assert any("gap" in m for m in levels(check, "note"))
    assert any("clamps" in m for m in levels(check, "warning"))


def test_rising_k_overlap_and_missing_start_are_errors():
    assert any("rises" in m for m in levels(check_k_schedule([[1, 4, 1], [5, 16, 3]], max_num_seqs=16), "error"))
    assert any("overlap" in m for m in levels(check_k_schedule([[1, 8, 3], [6, 16, 1]], max_num_seqs=16), "error"))
    assert any("starts at 2" in m for m in levels(check_k_schedule([[2, 16, 3]], max_num_seqs=16), "error"))
    assert not check_k_schedule([[1, 16, 9]], max_num_seqs=16, method_max_k=7).ok


def test_boundary_inside_expected_concurrency_warns_and_recommends_constant_k():
    schedule = [[1, 4, 5], [5, 64, 2]]
    inside = check_k_schedule(schedule, max_num_seqs=64, expected_concurrency=(1, 8))
    warnings = levels(inside, "warning")
    assert any("batch size 5" in m and "constant k=5" in m for m in warnings)
    assert any("piecewise" in m for m in warnings)
    outside = check_k_schedule(schedule, max_num_seqs=64, expected_concurrency=(8, 32))
    assert not any("inside" in m for m in levels(outside, "warning"))
    assert inside.ok  # warnings, not errors
