"""Row-map logic on small cases whose answers are computed by hand in the comments."""

from __future__ import annotations

import math

import numpy as np
import pytest
from expert_residency.formats import Histogram, RowMap

from recipegen.common.errors import InputError
from recipegen.common.units import parse_bytes
from recipegen.rowmap import cold_share, cold_share_per_layer, hot_count_for_cold_budget
from recipegen.rowmap.build import build_budget_global, build_top_n
from recipegen.rowmap.coldshare import layer_positional_cold_share, positional_baseline
from recipegen.rowmap.compare import compare
from recipegen.rowmap.diff import diff
from recipegen.rowmap.evaluate import evaluate, leave_one_out
from recipegen.rowmap.skew import gini_per_layer, spearman, top_overlap_per_layer, top_share
from recipegen.rowmap.text import diff_lines


def H(counts: list[list[int]], layers: tuple[int, ...] | None = None, **kw: object) -> Histogram:
    arr = np.array(counts)
    return Histogram(layers or tuple(range(arr.shape[0])), arr.shape[1], arr,
                     tokens=int(arr.sum()), **kw)  # type: ignore[arg-type]


SMALL = H([[5, 1, 3, 3], [0, 0, 0, 7]])


def test_top_n_ties_go_to_lower_id_and_rows_ascend() -> None:
    rm = build_top_n(SMALL, 2)
    # layer 0: 5 (e0) first, then e2 and e3 tie at 3 -> e2; layer 1: e3, then e0 (ties at 0)
    assert rm.hot == [[0, 2], [0, 3]] and rm.cold == [[1, 3], [1, 2]]
    rm.validate()


def test_top_n_per_layer_counts_and_bounds() -> None:
    rm = build_top_n(SMALL, [1, 3])
    assert rm.hot == [[0], [0, 1, 3]]
    with pytest.raises(InputError, match="hot count 5 outside 0..4"):
        build_top_n(SMALL, 5)
    with pytest.raises(InputError, match="1 hot counts for 2 MoE layers"):
        build_top_n(SMALL, [1])


def test_cold_share_by_hand() -> None:
    rm = build_top_n(SMALL, 2)
    # cold: layer 0 e1 + e3 = 1 + 3 = 4; layer 1 e1 + e2 = 0; total 19
    assert cold_share(rm, SMALL) == pytest.approx(4 / 19)
    assert cold_share_per_layer(rm, SMALL).tolist() == pytest.approx([4 / 12, 0.0])
    # positional: e0, e1 hot -> cold e2 + e3 = 6 in layer 0, 7 in layer 1
    assert cold_share(positional_baseline(rm), SMALL) == pytest.approx(13 / 19)


def test_cold_share_refuses_other_geometry() -> None:
    rm = build_top_n(SMALL, 2)
    with pytest.raises(InputError, match="5 experts per layer"):
        cold_share(rm, H([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]))
    with pytest.raises(InputError, match="covers MoE layers"):
        cold_share(rm, H([[1, 1, 1, 1], [1, 1, 1, 1]], layers=(0, 5)))


def test_layer_positional_cold_share() -> None:
    # 6 experts' worth cold with 4 per layer: layer 0 whole (12) + half of layer 1 (3.5)
    assert layer_positional_cold_share(SMALL, 6) == pytest.approx((12 + 3.5) / 19)


def test_budget_global_by_hand() -> None:
    b = build_budget_global(SMALL, 35, 10)
    # 3 cold: the three zero counts of layer 1, ties in descending id order
    assert b.cold_experts == 3 and b.rowmap.cold == [[], [0, 1, 2]]
    assert b.rowmap.hot == [[0, 1, 2, 3], [3]]
    # uniform: 3 // 2 = 1 cold per layer: layer 0 -> e1 (count 1); layer 1 -> e2 (last of ties)
    assert b.uniform_cold_per_layer == 1 and b.uniform.cold == [[1], [2]]
    assert b.global_same_total.cold == [[], [1, 2]]
    assert cold_share(b.rowmap, SMALL) == 0.0 and cold_share(b.uniform, SMALL) == pytest.approx(1 / 19)
    # bank sizes: global {4, 1, 3} -> 3 tunings; uniform {3, 1} -> 2
    assert (b.tunings, b.uniform_tunings) == (3, 2)
    assert b.cold_bytes == 30 and b.uniform_cold_bytes == 20


def test_budget_to_count_matches_design_example() -> None:
    bpe = 18_800_640  # DSv4.1-Flash, agreed geometry
    assert hot_count_for_cold_budget(parse_bytes("62.33 GiB"), bpe, 40, 384) == 384 - 88
    assert hot_count_for_cold_budget(parse_bytes("62.34 GiB"), bpe, 40, 384) == 384 - 89


def test_skew_statistics_by_hand() -> None:
    assert gini_per_layer(np.array([[1, 1, 1, 1], [0, 0, 0, 4], [0, 0, 0, 0]])).tolist() == \
        pytest.approx([0.0, 0.75, 0.0])
    counts = np.array([[4, 3, 2, 1]])
    assert top_share(counts, 0.25) == pytest.approx(0.4)
    assert top_share(counts, 0.50) == pytest.approx(0.7)
    assert top_share(counts, 0.73) == pytest.approx(0.9)  # round(2.92) = 3 experts


def test_spearman_by_hand() -> None:
    assert spearman(np.array([1, 2, 3, 4]), np.array([4, 3, 2, 1])) == pytest.approx(-1.0)
    # ties share average ranks: [1.5, 1.5, 3] vs [1, 2, 3] -> 1.5 / sqrt(1.5 * 2)
    assert spearman(np.array([1, 1, 2]), np.array([1, 2, 3])) == pytest.approx(1.5 / math.sqrt(3))
    assert math.isnan(spearman(np.array([2, 2, 2]), np.array([1, 2, 3])))


def test_leave_one_out_by_hand() -> None:
    h1, h2, h3 = H([[5, 1, 0, 0]]), H([[0, 4, 4, 0]]), H([[1, 1, 1, 9]])
    rm = build_top_n(h1, 2)
    loo = leave_one_out(rm, [h1, h2, h3], ["h1", "h2", "h3"])
    # h1 held out: h2+h3 = [1,5,5,9] -> hot {3,1}, cold {0,2} -> 5/6 of h1 cold
    # h2 held out: h1+h3 = [6,2,1,9] -> hot {3,0}, cold {1,2} -> 8/8
    # h3 held out: h1+h2 = [5,5,4,0] -> hot {0,1}, cold {2,3} -> 10/12
    assert [l.cold_share for l in loo] == pytest.approx([5 / 6, 1.0, 10 / 12])
    report = evaluate(rm, [h1, h2, h3], ["h1", "h2", "h3"], "m")
    assert report.histograms[0].cold_share == 0.0  # built from h1 itself
    assert report.combined is not None and report.combined.selections == 26
    # pooled [6, 6, 5, 9], cold {2, 3} -> 14 / 26
    assert report.combined.cold_share == pytest.approx(14 / 26)


def test_compare_by_hand() -> None:
    a, b = H([[5, 1, 0, 0]]), H([[0, 0, 1, 5]])
    r = compare(a, b, hot=2, name_a="a", name_b="b")
    assert r.cold_shares["A"] == {"a": 0.0, "b": 1.0}
    assert r.cold_shares["B"] == {"a": 1.0, "b": 0.0}
    # merged [5,1,1,5] -> hot {0,3} (tie at 5 -> e0 first, then e3), cold {1,2}
    assert r.cold_shares["merged"] == pytest.approx({"a": 1 / 6, "b": 1 / 6})
    assert r.mean_spearman == pytest.approx(-4 / 4.5)
    assert r.hot_overlap == 0.0 and r.cold_overlap == 0.0
    assert top_overlap_per_layer(a.counts, a.counts, 2).tolist() == [1.0]


def test_compare_equal_weights_rescales_the_smaller_class() -> None:
    a, b = H([[6, 4, 0, 0]]), H([[0, 0, 0, 1]])
    # by selections: merged [6, 4, 0, 1] -> e0 hot, all of b cold
    by_volume = compare(a, b, hot=1, name_a="a", name_b="b")
    assert by_volume.cold_shares["merged"] == pytest.approx({"a": 0.4, "b": 1.0})
    # equal weights: b scaled to 10 selections -> merged [6, 4, 0, 10] -> e3 hot
    equal = compare(a, b, hot=1, name_a="a", name_b="b", equal_weights=True)
    assert equal.cold_shares["merged"] == pytest.approx({"a": 1.0, "b": 0.0})
    assert equal.merge_weighting == "equal"


def test_diff_by_hand() -> None:
    a = RowMap((0, 1), 4, [[0, 1], [0, 1]], [[2, 3], [2, 3]])
    b = RowMap((0, 1), 4, [[0, 2], [1, 0]], [[1, 3], [2, 3]])
    r = diff(a, b)
    assert [l.cold_changed for l in r.layers] == [1, 0]
    assert [l.reordered for l in r.layers] == [False, True]
    assert r.same_shape and not r.same_content and r.mean_cold_changed == 0.5
    assert "reuses its tuned kernels" in r.verdict()
    c = RowMap((0, 1), 4, [[0], [0, 1]], [[1, 2, 3], [2, 3]])
    assert not diff(a, c).same_shape
    # more hot rows in B: no id turns cold, layer 0's id 1 is no longer cold; both directions said
    grown = diff(c, a, name_a="c", name_b="a")
    assert (grown.mean_cold_changed, grown.mean_left_cold) == (0.0, 0.5)
    assert (diff(a, c).mean_cold_changed, diff(a, c).mean_left_cold) == (0.5, 0.0)
    assert "0.0 newly cold and 0.5 no longer cold, of 2 cold in a" in diff_lines(grown)[4]
    assert diff(a, a).same_content
    with pytest.raises(InputError, match="different geometry"):
        diff(a, RowMap((0,), 4, [[0]], [[1, 2, 3]]))


def test_eval_notes_revision_and_partial_counts() -> None:
    rm = build_top_n(SMALL, 2, {"model_revision": "rev-a"})
    h = H([[5, 1, 3, 3], [0, 0, 0, 7]], model_revision="rev-b", top_k=2)
    h.tokens = 6  # 12 selections expected per layer; layer 1 holds 7
    report = evaluate(rm, [h], ["x.hist"], "m")
    assert any("model revision 'rev-b'" in n for n in report.notes)
    assert any("differ from tokens × top_k = 12" in n for n in report.notes)
    assert evaluate(rm, [SMALL], ["s"], "m").notes == []
