"""The multi-node ledger of an adaptive lane: only stages that run the residency runtime carry the
adaptive figures (a stage holding every expert in HBM has nothing to swap), each over its own MoE
layers, and the lane sums the staging rows and names the busiest stage's barrier traffic."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from test_adaptive_k8s import _adaptive_recipe

from recipegen.cli import main
from recipegen.ledger import compute_ledger
from recipegen.load.recipe import load_recipe

E = 18_800_640   # DSv4.1-Flash MXFP4 bytes per expert (the catalog's figure)


def test_adaptive_figures_per_stage_and_for_the_lane(tmp_path: Path) -> None:
    lane = compute_ledger(load_recipe(_adaptive_recipe(tmp_path))).lane("agent")
    head, tail = lane.stages
    assert head.all_experts_in_hbm and not any(k.startswith("adaptive.") for k in head.ledger.figures)
    # stage 1: MoE layers 20-39, one GPU, tp 1, defaults (16 swaps per layer)
    assert tail.ledger.fig("adaptive.staging_bytes").value == E
    assert tail.ledger.fig("adaptive.link_bytes_per_barrier").value == 2 * E * 16 * 20 == 12_032_409_600
    assert lane.fig("lane.adaptive.staging_bytes").value == E * len(tail.gpus) == E
    assert lane.fig("lane.adaptive.link_bytes_per_barrier").value == 12_032_409_600
    assert lane.fig("lane.adaptive.link_bytes_per_barrier").operands == {"stage1": 12_032_409_600}


def test_check_budgets_shows_the_lane_adaptive_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["check", "budgets", str(_adaptive_recipe(tmp_path))])
    assert result.exit_code in (0, 1), result.output
    assert "adaptive residency: staging 17.93 MiB over the adaptive stages' GPUs" in result.output
    assert "11.21 GiB per GPU over the busiest stage's host link" in result.output
