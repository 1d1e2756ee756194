"""The estimate's routed-expert rows are the committed H200 measurements they cite.

``bench/expert_rows.py`` reads run ER's result files (bench/results/expert_rows_h200/: the all-HBM
step of ``bench/gpu_residency.py`` for DeepSeek-V4.1-Flash, ``bench/format_peer.py`` for
gpt-oss-120b, Qwen3-30B-A3B's bf16 and DeepSeek-V3's FP8-block layers) and takes, for each T, the median share of the HBM read limit over the calls that
ran today's kernels at that T (the T = 1 loops; DeepSeek-V4.1's warp-specialized launches from 2 tokens on
Hopper; gpt-oss's grouped warp-MMA loop up to its limit, tl.dot above). The table in ``recipegen.costmodel.efficiency`` must be exactly those figures, at
exactly those T: a row edited by hand, or a result file replaced, fails here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tiers import needs_gpu_experts

from recipegen.costmodel.efficiency import EXPERT_EFFICIENCY, expert_efficiency

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import expert_rows  # noqa: E402


@pytest.mark.parametrize("key", sorted(expert_rows.SOURCES))
def test_the_row_is_the_median_of_the_committed_calls(key):
    (row,) = [r for r in EXPERT_EFFICIENCY if r.key == key]
    assert ("Run WH" if row.compute_capability_major else "run ER") in row.source
    assert dict(row.by_tokens) == expert_rows.derived_row(key)


def test_every_row_is_derived():
    assert sorted(r.key for r in EXPERT_EFFICIENCY) == sorted(expert_rows.SOURCES)


def test_a_gpu_gets_the_row_of_the_kernels_it_runs():
    # Hopper runs the warp-specialized launches; a GB300 (10.3), an L40S (8.9) or a GPU of unknown
    # capability the runtime's other kernels, whose row keeps the step at 16 / 17 tokens
    assert expert_efficiency("mxfp4", "dsv41-flash-mxfp4", 18_800_640, "9.0").key == "dsv41-flash-mxfp4@sm90"
    for cc in ("10.3", "8.9", None):
        row = expert_efficiency("mxfp4", "dsv41-flash-mxfp4", 18_800_640, cc)
        assert row.key == "dsv41-flash-mxfp4" and 17 in row.by_tokens, cc
    # a model with no row of its own takes the nearest in bytes per expert among the GPU's rows
    assert expert_efficiency("mxfp4", "some-mxfp4", 17_000_000, "9.0").key == "dsv41-flash-mxfp4@sm90"
    assert expert_efficiency("mxfp4", "some-mxfp4", 17_000_000, "10.0").key == "dsv41-flash-mxfp4"
    assert expert_efficiency("mxfp4", "some-mxfp4", 12_000_000, "9.0").key == "gpt-oss-120b"
    # experts the warp-specialized launches do not take (biases, SwiGLU-OAI) keep the other GPUs' row
    assert expert_efficiency("mxfp4", "some-mxfp4", 17_000_000, "9.0", warp_specialized=False).key == \
        "dsv41-flash-mxfp4"
    assert expert_efficiency("mxfp4", "dsv41-flash-mxfp4", 18_800_640, "9.0", warp_specialized=False).key == \
        "dsv41-flash-mxfp4"


def test_a_share_is_bytes_over_time_over_the_same_runs_limit():
    # recomputed here from the raw fields, not through the script's reader
    run = json.loads((expert_rows.RESULTS / "call12_residency13_ws.json").read_text())
    case = run["per_T"]["16"]["cases"]["all_hbm"]
    share = case["hot_bytes_per_step"] / (case["step_ms_mean"] * 1e-3) / 1e9 / run["limits"]["hbm_read"]["GBps"]
    assert dict(expert_rows.measured_shares("dsv41-flash-mxfp4@sm90")[16])["call12_residency13_ws.json"] == pytest.approx(share)
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
    # DeepSeek-V4.1: the calls before the warp-specialized launches count at T = 1 only (the same T = 1
    # loops); from 2 tokens only the call that ran those launches (it recorded that they ran)
    dsv41 = expert_rows.measured_shares("dsv41-flash-mxfp4@sm90")
    assert "call7_residency13.json" in dict(dsv41[1]) and "call12_residency13_ws.json" in dict(dsv41[1])
    for t in (2, 6, 16, 96):
        assert [n for n, _ in dsv41[t]] == ["call12_residency13_ws.json"], t
    run = json.loads((expert_rows.RESULTS / "call12_residency13_ws.json").read_text())
    assert run["warp_specialized"] is True and run["config"]["ws_min_tokens"] == 2
    assert 48 not in dsv41
    # the other GPUs' row: the calls that ran the grouped loop up to 16 and tl.dot above (call 6's loop
    # went to 48: it counts up to 16 only), not the warp-specialized call above T = 1
    other = expert_rows.measured_shares("dsv41-flash-mxfp4")
    assert "call12_residency13_ws.json" in dict(other[1]) and "call12_residency13_ws.json" not in dict(other[16])
    assert "call6_residency13_gw48.json" not in dict(other[32]) and "call6_residency13_gw48.json" in dict(other[16])


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
    # DeepSeek-V4.1 changes kernels nowhere above 2 tokens on Hopper: no step at 17 to keep; elsewhere
    # its row steps down from 16 to 17
    assert 17 not in expert_rows.derived_row("dsv41-flash-mxfp4@sm90")
    other = expert_rows.derived_row("dsv41-flash-mxfp4")
    assert other[17] < other[16]


@needs_gpu_experts
def test_todays_grouped_loop_limits_are_the_runtimes():
    from expert_residency.gpu.experts import WS_TILES, ExpertShape, config_for_shape
    shapes = {"dsv41-flash-mxfp4": ExpertShape(5120, 2304), "gpt-oss-120b": ExpertShape(2880, 2880)}
    for model, shape in shapes.items():
        config = config_for_shape(shape)
        assert expert_rows.TODAY[model].gw_max_tokens == config.gw_max_tokens, model
    assert expert_rows.TODAY["dsv41-flash-mxfp4@sm90"].gw_max_tokens == config_for_shape(shapes["dsv41-flash-mxfp4"]).gw_max_tokens
    # DeepSeek-V4.1's tiles are the ones the warp-specialized launches read, from ws_min_tokens on
    config = config_for_shape(shapes["dsv41-flash-mxfp4"])
    assert (config.block_n1, config.block_k1, config.block_n2, config.block_k2) == WS_TILES and config.ws_grouped
    assert expert_rows.TODAY["dsv41-flash-mxfp4@sm90"].ws_min_tokens == config.ws_min_tokens
    assert expert_rows.TODAY["dsv41-flash-mxfp4"].ws_min_tokens is None     # the row of the other GPUs
    # gpt-oss's biased SwiGLU-OAI experts: the grouped steps take the other kernels (experts.py's ws_step)
    assert expert_rows.TODAY["gpt-oss-120b"].ws_min_tokens is None
