"""`offload.adaptive` through the product: the recipe field, its ledger figures, its rendering.

Expected figures are hand arithmetic from the model's catalog entry (DSv4.1-Flash MXFP4: 18,800,640
B per expert, 40 MoE layers); rendered output is read back through the real Compose v2 binary.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest
from cli_support import invoke
from compose_support import needs_compose
from expert_residency.core.adaptive_config import AdaptiveConfig
from expert_residency.core.adaptive_setup import parse_adaptive_spec

from recipegen.common.errors import InputError
from recipegen.ledger import compute_ledger
from recipegen.load.recipe import load_recipe
from recipegen.render.compose_validate import compose_config_json
from recipegen.schema.adaptive import Adaptive
from recipegen.schema.lane import prior_classes

REPO = Path(__file__).resolve().parent.parent
REFERENCE = "dsv41-flash-gb300"
EXPERT = 18_800_640  # 4608 × 5120 + 5120 × 2304 FP4 values / 2 + one ue8m0 scale per 32


def with_adaptive(project: Path, block: str) -> Path:
    """The reference recipe with `block` (YAML lines under `offload:`) added to lane agent."""
    path = project / "recipes" / f"{REFERENCE}.yaml"
    text = path.read_text()
    anchor = "      hot_experts_per_layer: 295"
    assert text.count(anchor) == 1
    lines = text.splitlines(keepends=True)
    i = next(n for n, line in enumerate(lines) if line.startswith(anchor))
    lines.insert(i + 1, block)
    path.write_text("".join(lines))
    return path


# ------------------------------------------------------------------ schema


def test_defaults_and_names_are_the_runtimes() -> None:
    # One source: every runtime parameter is a recipe field with the runtime's default.
    runtime = {f.name: f.default for f in dataclasses.fields(AdaptiveConfig)}
    recipe = {k: v for k, v in Adaptive().model_dump().items() if k != "priors"}
    assert recipe == runtime
    assert Adaptive().runtime_config() == AdaptiveConfig()
    assert Adaptive(swaps_per_layer=4, decay=0.5).runtime_config() == AdaptiveConfig(swaps_per_layer=4, decay=0.5)


def test_adaptive_is_off_unless_declared(project: Path) -> None:
    lane = load_recipe(REFERENCE).recipe.lane("agent")
    assert lane.offload.adaptive is None and prior_classes(lane) == []
    with_adaptive(project, "      adaptive: {}\n")
    lane = load_recipe(REFERENCE).recipe.lane("agent")
    assert lane.offload.adaptive == Adaptive()
    assert prior_classes(lane) == ["agent", "prose", "math"]  # every class with a histogram


def test_positional_lane_refuses_adaptive(project: Path) -> None:
    path = project / "recipes" / "gpt-oss-120b-l40s.yaml"
    text = path.read_text()
    assert "placement: positional" in text
    line_no = text.splitlines().index(next(l for l in text.splitlines() if "placement: positional" in l)) + 2
    path.write_text(text.replace("placement: positional\n", "placement: positional\n      adaptive: {interval: 8}\n", 1))
    with pytest.raises(InputError) as info:
        load_recipe(path)
    assert info.value.field == "lanes[0].offload.adaptive"
    assert info.value.line == line_no
    assert "positional offload has none" in str(info.value)


def test_bad_values_name_the_value(project: Path) -> None:
    with_adaptive(project, "      adaptive: {margin: -0.5}\n")
    with pytest.raises(InputError) as info:
        load_recipe(REFERENCE)
    assert info.value.field == "lanes[0].offload.adaptive.margin"
    assert "got -0.5" in str(info.value)


# ------------------------------------------------------------------ ledger


def test_ledger_prices_spare_rows_and_copy_traffic(project: Path) -> None:
    lane_off = compute_ledger(load_recipe(REFERENCE)).lane("agent")
    with_adaptive(project, "      adaptive: {swaps_per_layer: 4, spare_rows: 3}\n")
    lane = compute_ledger(load_recipe(REFERENCE)).lane("agent")
    # 3 spare rows per layer, 40 MoE layers, one GPU: 3 × 18,800,640 × 40 = 2,256,076,800 B, in HBM
    # (out of the KV pool, with the runtime's start-up HBM) and as spare host rows (host_copies: spare)
    spare = 3 * EXPERT * 40
    assert spare == 2_256_076_800
    assert lane.fig("adaptive.spare_hbm_bytes").value == spare
    assert lane.fig("adaptive.spare_host_bytes").value == spare
    assert lane.fig("hbm.runtime_workspace").value - lane_off.fig("hbm.runtime_workspace").value == spare
    assert lane_off.fig("hbm.kv_pool").value - lane.fig("hbm.kv_pool").value == spare
    assert lane.fig("host.total").value - lane_off.fig("host.total").value == spare
    assert lane.fig("host.total").operands["adaptive_spare_host_bytes"] == spare
    # the copies beside the steps: 0.4 rows × 40 layers × 18,800,640 B = 300,810,240 B per step at most
    step = lane.fig("adaptive.copy_bytes_per_step")
    assert step.value == 300_810_240
    assert step.operands == {"copy_rows_per_layer": 0.4, "moe_layers": 40, "bytes_per_expert": EXPERT, "tp": 1}
    link = lane.fig("adaptive.link_bytes_per_plan")
    assert link.value == 2 * EXPERT * 4 * 40 == 6_016_204_800
    assert link.operands == {"bytes_per_expert": EXPERT, "tp": 1, "hot_per_layer": 295, "cold_per_layer": 89,
                             "swaps_per_layer": 4, "moe_layers": 40}
    # 300,810,240 B at the station's 340 GB/s pinned read: 0.88 ms of the link per step
    assert any("0.88 ms of the 340 GB/s host link" in note for note in lane.notes)


def test_ledger_host_copies_all_and_decode_ranking(project: Path) -> None:
    lane_off = compute_ledger(load_recipe(REFERENCE)).lane("agent")
    with_adaptive(project, "      adaptive: {host_copies: all, rank_picks: decode}\n")
    lane = compute_ledger(load_recipe(REFERENCE)).lane("agent")
    # the host keeps every hot expert too: its spare host bytes are the hot experts' HBM bytes
    hot = lane.fig("hbm.hot_experts").value
    assert hot == 295 * 40 * EXPERT
    assert lane.fig("adaptive.spare_host_bytes").value == hot
    # one row in per swap, none out: 18,800,640 × 16 × 40
    assert lane.fig("adaptive.link_bytes_per_plan").value == EXPERT * 16 * 40
    # decode ranking: a second int64 [40, 384] count and its per-step start (16 × 40 × 384 = 245,760 B)
    # and the decode rows: max_num_batched_tokens + 1 bools and one int64
    tokens = lane.fig("hbm.runtime_workspace.counter").operands["max_num_batched_tokens"]
    extra = lane.fig("hbm.runtime_workspace.counter").value - lane_off.fig("hbm.runtime_workspace.counter").value
    assert extra == 16 * 40 * 384 + tokens + 1 + 8


@pytest.mark.parametrize("swaps", [89, 90, 65_536])
def test_a_barrier_swaps_at_most_the_smaller_bank(project: Path, swaps: int) -> None:
    """295 hot and 89 cold per layer: a swap trades one of each, so no plan moves more than
    89 pairs per layer — 2 × 18,800,640 B × 89 × 40 = 133,860,556,800 B — however many it allows
    (10^12 once priced a barrier of 140 years and passed)."""
    with_adaptive(project, f"      adaptive: {{swaps_per_layer: {swaps}, spare_rows: 1}}\n")
    link = compute_ledger(load_recipe(REFERENCE)).lane("agent").fig("adaptive.link_bytes_per_plan")
    assert link.value == 2 * EXPERT * 89 * 40 == 133_860_556_800


def test_swaps_per_layer_past_any_model_is_refused_at_its_line(project: Path) -> None:
    with_adaptive(project, "      adaptive: {swaps_per_layer: 1000000000000}\n")
    result = invoke("check", "budgets", REFERENCE)
    assert result.code == 2 and "offload.adaptive.swaps_per_layer" in result.output, result.output
    assert "Traceback" not in result.output


def test_ledger_has_no_adaptive_figure_when_off(project: Path) -> None:
    lane = compute_ledger(load_recipe(REFERENCE)).lane("agent")
    assert not [k for k in lane.figures if k.startswith("adaptive")]
    assert not [n for n in lane.notes if "adaptive" in n]


def test_check_budgets_shows_the_figures(project: Path) -> None:
    with_adaptive(project, "      adaptive: {}\n")
    result = invoke("check", "budgets", REFERENCE, "--explain")
    assert result.code == 0, result.output
    # defaults: 4 spare rows × 18,800,640 × 40 = 3,008,102,400 B = 2.80 GiB; one plan at most
    # 2 × 18,800,640 × 16 × 40 = 24,064,819,200 B = 22.41 GiB
    assert "spare HBM rows (per GPU) = 2.80 GiB" in result.output
    assert "host-link traffic of one plan, at most (per GPU) = 22.41 GiB" in result.output
    assert "swaps_per_layer=16, moe_layers=40" in result.output
    result = invoke("check", "budgets", REFERENCE, "--json")
    assert '"adaptive.link_bytes_per_plan"' in result.output and "24064819200" in result.output
    assert '"adaptive.spare_hbm_bytes"' in result.output and "3008102400" in result.output


# ------------------------------------------------------------------ render


@needs_compose
def test_render_passes_settings_and_mounts_priors(project: Path) -> None:
    with_adaptive(project, "      adaptive:\n        swaps_per_layer: 4\n        decay: 0.8\n"
                           "        priors: [prose, math]\n")
    result = invoke("render", REFERENCE, "--validate")
    assert result.code == 0, result.output
    out = project / "compose" / REFERENCE
    model = compose_config_json(out / "compose.yaml")
    lane = model["services"]["lane-agent"]
    env = lane["environment"]
    assert parse_adaptive_spec(env["EXPERT_RESIDENCY_ADAPTIVE"]) == AdaptiveConfig(swaps_per_layer=4, decay=0.8)
    targets = env["EXPERT_RESIDENCY_ADAPTIVE_PRIORS"].split(",")
    assert targets == ["/etc/expert-residency/agent-prose.hist", "/etc/expert-residency/agent-math.hist"]
    volumes = {v["target"]: v for v in lane["volumes"]}
    for cls, target in zip(("prose", "math"), targets):
        mount = volumes[target]
        assert mount["type"] == "bind" and mount["read_only"] is True
        source = Path(mount["source"])
        assert source == out / "priors" / "agent" / f"{cls}.hist"
        assert source.read_bytes() == (project / "recipes" / "profiles" / "dsv41-flash" / f"{cls}.hist").read_bytes()
    assert not (out / "priors" / "agent" / "agent.hist").exists()
    # The count-only profile boot is not adaptive: it only counts.
    profile_env = model["services"]["lane-agent-profile"]["environment"]
    assert not [k for k in profile_env if "ADAPTIVE" in k]
    # Turning adaptive on changes the lane's config hash (compose recreates it), not the profile boot's.
    check = invoke("render", REFERENCE, "--check")
    assert check.code == 0, check.output


def test_reference_rendering_carries_nothing_adaptive() -> None:
    for compose_file in (REPO / "compose").rglob("compose.yaml"):
        assert "ADAPTIVE" not in compose_file.read_text()
    assert not list((REPO / "compose").rglob("priors"))


def test_render_refuses_a_prior_histogram_of_another_geometry(project: Path) -> None:
    with_adaptive(project, "      adaptive: {priors: [prose]}\n")
    hist = project / "recipes" / "profiles" / "dsv41-flash" / "prose.hist"
    other = next(p for p in (project / "recipes" / "profiles").rglob("*.hist") if "dsv41" not in str(p))
    shutil.copyfile(other, hist)
    before = sorted(p.relative_to(project) for p in project.rglob("*") if p.is_file())
    result = invoke("render", REFERENCE)
    assert result.code == 2
    assert re.search(r"dsv41-flash-gb300\.yaml:\d+: field 'lanes\[0\]\.classes\.prose\.histogram'", result.stderr)
    assert "experts per layer, the model has 384" in result.stderr
    assert sorted(p.relative_to(project) for p in project.rglob("*") if p.is_file()) == before
