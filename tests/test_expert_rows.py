"""The estimate's routed-expert rows are the committed H200 measurements they cite.

``bench/expert_rows.py`` reads run ER's result files (bench/results/expert_rows_h200/: the all-HBM
step of ``bench/gpu_residency.py`` for DeepSeek-V4.1-Flash, ``bench/format_peer.py`` for
gpt-oss-120b, Qwen3-30B-A3B's bf16 and DeepSeek-V3's FP8-block layers) and takes, for each T, the median share of the HBM read limit over the calls that
ran today's kernels at that T (the grouped warp-MMA loop up to the geometry's limit, tl.dot above). The table in ``recipegen.costmodel.efficiency`` must be exactly those figures, at
exactly those T: a row edited by hand, or a result file replaced, fails here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tiers import needs_gpu_experts

from recipegen.costmodel.efficiency import EXPERT_EFFICIENCY

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import expert_rows  # noqa: E402


@pytest.mark.parametrize("model", sorted(expert_rows.SOURCES))
def test_the_row_is_the_median_of_the_committed_calls(model):
    (row,) = [r for r in EXPERT_EFFICIENCY if r.model == model]
    assert "run ER" in row.source
    assert dict(row.by_tokens) == expert_rows.derived_row(model)


def test_a_share_is_bytes_over_time_over_the_same_runs_limit():
    # recomputed here from the raw fields, not through the script's reader
    run = json.loads((expert_rows.RESULTS / "call7_residency13.json").read_text())
    case = run["per_T"]["16"]["cases"]["all_hbm"]
    share = case["hot_bytes_per_step"] / (case["step_ms_mean"] * 1e-3) / 1e9 / run["limits"]["hbm_read"]["GBps"]
    assert dict(expert_rows.measured_shares("dsv41-flash-mxfp4")[16])["call7_residency13.json"] == pytest.approx(share)
    name = "call9_format_peer_gptoss_gw48.json"
    fmt = json.loads((expert_rows.RESULTS / name).read_text())["formats"]["gptoss-mxfp4"]
    a = fmt["per_T"]["32"]["all_hbm"]
    share = a["bytes_per_layer"] / (a["us_per_layer"] * 1e-6) / 1e9 / fmt["hbm_GBps"]
    assert dict(expert_rows.measured_shares("gpt-oss-120b")[32]) == {name: pytest.approx(share)}


def test_only_calls_that_ran_todays_kernels_count():
    # gpt-oss's T = 17..48 figures from calls that ran the tl.dot kernels there (grouped loop up to
    # 16) are left out; DeepSeek-V4.1's from the call that ran the grouped loop up to 48 likewise
    gptoss = expert_rows.measured_shares("gpt-oss-120b")
    assert [n for n, _ in gptoss[24]] == ["call9_format_peer_gptoss_gw48.json"]
    assert "call7_format_peer_gptoss.json" in dict(gptoss[96]) and "call7_format_peer_gptoss.json" in dict(gptoss[16])
    dsv41 = expert_rows.measured_shares("dsv41-flash-mxfp4")
    assert "call6_residency13_gw48.json" not in dict(dsv41[32]) and "call6_residency13_gw48.json" in dict(dsv41[16])
    assert 48 not in dsv41


def test_the_first_t_above_the_loop_is_measured_on_the_tl_dot_kernels():
    # gpt-oss at T = 49 (call 10): the tl.dot kernels of a call whose grouped loop ends at 48, read
    # here from the raw fields; the step down from 48 is the kernel change. DeepSeek-V4.1 measured 17.
    name = "call10_format_peer_gptoss.json"
    fmt = json.loads((expert_rows.RESULTS / name).read_text())["formats"]["gptoss-mxfp4"]
    a = fmt["per_T"]["49"]["all_hbm"]
    share = a["bytes_per_layer"] / (a["us_per_layer"] * 1e-6) / 1e9 / fmt["hbm_GBps"]
    assert "warp-mma-grouped@2..48" in fmt["ours"]
    assert expert_rows.measured_shares("gpt-oss-120b")[49] == [(name, pytest.approx(share))]
    assert share < 0.66 < expert_rows.derived_row("gpt-oss-120b")[48]
    assert 17 in expert_rows.measured_shares("dsv41-flash-mxfp4")


@needs_gpu_experts
def test_todays_grouped_loop_limits_are_the_runtimes():
    from expert_residency.gpu.experts import ExpertShape, config_for_shape
    shapes = {"dsv41-flash-mxfp4": ExpertShape(5120, 2304), "gpt-oss-120b": ExpertShape(2880, 2880)}
    for model, shape in shapes.items():
        assert expert_rows.TODAY_GW_MAX_TOKENS[model] == config_for_shape(shape).gw_max_tokens, model
