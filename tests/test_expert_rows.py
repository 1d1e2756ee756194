"""The estimate's MXFP4 routed-expert rows are the committed H200 measurements they cite.

``bench/expert_rows.py`` reads run ER's result files (bench/results/expert_rows_h200/: the all-HBM
step of ``bench/gpu_residency.py`` for DeepSeek-V4.1-Flash, ``bench/format_peer.py`` for
gpt-oss-120b) and takes, for each T, the median share of the HBM read limit over the calls that
measured it. The table in ``recipegen.costmodel.efficiency`` must be exactly those figures, at
exactly those T: a row edited by hand, or a result file replaced, fails here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from recipegen.costmodel.efficiency import EXPERT_EFFICIENCY

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import expert_rows  # noqa: E402


@pytest.mark.parametrize("model", sorted(expert_rows.SOURCES))
def test_the_row_is_the_median_of_the_committed_calls(model):
    (row,) = [r for r in EXPERT_EFFICIENCY if r.model == model]
    assert row.expert_format == "mxfp4" and "run ER" in row.source
    assert dict(row.by_tokens) == expert_rows.derived_row(model)


def test_a_share_is_bytes_over_time_over_the_same_runs_limit():
    # recomputed here from the raw fields, not through the script's reader
    run = json.loads((expert_rows.RESULTS / "call7_residency13.json").read_text())
    case = run["per_T"]["16"]["cases"]["all_hbm"]
    share = case["hot_bytes_per_step"] / (case["step_ms_mean"] * 1e-3) / 1e9 / run["limits"]["hbm_read"]["GBps"]
    assert expert_rows.measured_shares("dsv41-flash-mxfp4")[16][2] == pytest.approx(share, rel=1e-9)
    fmt = json.loads((expert_rows.RESULTS / "call7_format_peer_gptoss.json").read_text())["formats"]["gptoss-mxfp4"]
    a = fmt["per_T"]["16"]["all_hbm"]
    share = a["bytes_per_layer"] / (a["us_per_layer"] * 1e-6) / 1e9 / fmt["hbm_GBps"]
    assert expert_rows.measured_shares("gpt-oss-120b")[16][2] == pytest.approx(share, rel=1e-9)


def test_every_call_ran_the_default_kernels():
    # the rows describe the default configuration: each call's printed kernel configuration is the same
    gptoss, dsv41 = set(), set()
    for call in expert_rows.CALLS:
        gptoss.add(json.loads((expert_rows.RESULTS / f"call{call}_format_peer_gptoss.json").read_text())
                   ["formats"]["gptoss-mxfp4"]["ours"])
        config = json.loads((expert_rows.RESULTS / f"call{call}_residency13.json").read_text())["config"]
        dsv41.add(json.dumps(config, sort_keys=True))
    assert len(gptoss) == len(dsv41) == 1
    config = json.loads(dsv41.pop())
    assert "warp-mma-grouped@2..16" in gptoss.pop()
    assert (config["gw_max_tokens"], config["t1_smem_stages"]) == (16, 0)
