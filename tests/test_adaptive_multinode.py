"""The multi-node ledger of an adaptive lane: only stages that run the residency runtime carry the
adaptive figures (a stage holding every expert in HBM has nothing to swap), each over its own MoE
layers, and the lane sums the spare rows and names the busiest stage's copy traffic per step."""

from __future__ import annotations

from pathlib import Path

from cli_support import invoke
from test_adaptive_k8s import _adaptive_recipe

from recipegen.ledger import compute_ledger
from recipegen.load.recipe import load_recipe

E = 18_800_640   # DSv4.1-Flash MXFP4 bytes per expert (the catalog's figure)


def test_adaptive_figures_per_stage_and_for_the_lane(tmp_path: Path) -> None:
    lane = compute_ledger(load_recipe(_adaptive_recipe(tmp_path))).lane("agent")
    head, tail = lane.stages
    assert head.all_experts_in_hbm and not any(k.startswith("adaptive.") for k in head.ledger.figures)
    # stage 1: MoE layers 20-39, one GPU, tp 1, defaults (4 spare rows per layer, 0.4 rows copied
    # per layer and step, 16 swaps per layer per plan)
    assert tail.ledger.fig("adaptive.spare_hbm_bytes").value == 4 * E * 20 == 1_504_051_200
    assert tail.ledger.fig("adaptive.copy_bytes_per_step").value == 0.4 * 20 * E == 150_405_120
    assert tail.ledger.fig("adaptive.link_bytes_per_plan").value == 2 * E * 16 * 20 == 12_032_409_600
    assert lane.fig("lane.adaptive.spare_hbm_bytes").value == 4 * E * 20 * len(tail.gpus) == 1_504_051_200
    assert lane.fig("lane.adaptive.copy_bytes_per_step").value == 150_405_120
    assert lane.fig("lane.adaptive.copy_bytes_per_step").operands == {"stage1_bytes": 150_405_120}


def test_check_budgets_shows_the_lane_adaptive_line(tmp_path: Path) -> None:
    result = invoke("check", "budgets", str(_adaptive_recipe(tmp_path)))
    assert result.code in (0, 1), result.output
    # 1,504,051,200 B = 1.40 GiB; 150,405,120 B = 0.14 GiB
    assert "adaptive residency: spare rows 1.40 GiB of HBM over the adaptive stages' GPUs" in result.output
    assert "at most 0.14 GiB per step and GPU over the busiest stage's host link" in result.output
