"""The committed synthetic example data of the reference recipe: honest labels, reproducible,
and showing the seeds' per-class effect (in-domain ~1.5%, cross-domain far above 10%)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from cli_support import invoke
from expert_residency.formats import load_histogram, load_rowmap

from recipegen.rowmap import cold_share, projected_cold_share
from recipegen.rowmap.evaluate import skew_of
from recipegen.rowmap.skew import spearman_per_layer

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "recipes" / "profiles" / "dsv41-flash"
MAPS = ROOT / "recipes" / "maps" / "dsv41-flash"
CLASSES = ("agent", "prose", "math")


@pytest.fixture(scope="module")
def hists() -> dict:
    return {c: load_histogram(PROFILES / f"{c}.hist") for c in CLASSES}


@pytest.fixture(scope="module")
def maps() -> dict:
    return {c: load_rowmap(MAPS / f"{c}.rowmap") for c in CLASSES}


def test_marked_synthetic_inside(hists: dict, maps: dict) -> None:
    for c in CLASSES:
        assert hists[c].meta["synthetic"] is True and hists[c].source.startswith("synthetic")
        assert (PROFILES / f"{c}.hist").read_text().startswith("# SYNTHETIC")
        assert maps[c].provenance["synthetic"] is True
        assert "SYNTHETIC" in (MAPS / f"{c}.rowmap").read_text().split("format:")[0]


def test_reference_geometry(hists: dict, maps: dict) -> None:
    for c in CLASSES:
        assert maps[c].moe_layer_indices == tuple(range(40)) and maps[c].num_experts == 384
        assert maps[c].hot_counts() == [295] * 40 and maps[c].cold_counts() == [89] * 40
        assert hists[c].top_k == 6 and hists[c].counts.shape == (40, 384)
    # one shape for every class: swapping classes never needs kernel tuning
    assert len({m.shape_hash() for m in maps.values()}) == 1
    assert len({m.content_hash() for m in maps.values()}) == 3


def test_in_domain_and_cross_domain_cold_share(hists: dict, maps: dict) -> None:
    for c in CLASSES:
        assert 0.015 <= cold_share(maps[c], hists[c]) <= 0.027
    for a, b in itertools.permutations(CLASSES, 2):
        assert cold_share(maps[a], hists[b]) > 0.10


def test_skew_and_class_correlation_match_the_seeds(hists: dict) -> None:
    for c in CLASSES:
        s = skew_of(hists[c])
        assert s.top_shares[0.25] == pytest.approx(0.714, abs=0.01)   # seeds 71.4%
        assert s.top_shares[0.50] == pytest.approx(0.918, abs=0.01)   # seeds 91.8%
        assert s.top_shares[0.73] == pytest.approx(0.987, abs=0.01)   # seeds 98.7%
        assert s.mean_gini == pytest.approx(0.61, abs=0.03)           # seeds 0.632
    for a, b in itertools.combinations(CLASSES, 2):
        rho = float(np.mean(spearman_per_layer(hists[a].counts, hists[b].counts)))
        assert 0.08 <= rho <= 0.22  # seeds: agent vs prose 0.15


def test_regeneration_is_byte_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1795910400")
    # run exactly what regenerate.sh runs, into a copy of the tree layout
    monkeypatch.chdir(tmp_path)
    args = ["rowmap", "synth", "--seed", "41", "--tokens", "47778", "--correlation", "0.15",
            "--experts", "384", "--layers", "0-39", "--top-k", "6",
            "-o", "recipes/profiles/dsv41-flash"]
    assert invoke(*args).code == 0
    for c in CLASSES:
        rel = f"recipes/profiles/dsv41-flash/{c}.hist"
        assert (tmp_path / rel).read_bytes() == (ROOT / rel).read_bytes()
        out = f"recipes/maps/dsv41-flash/{c}.rowmap"
        assert invoke("rowmap", "build", rel, "--hot", "295", "--bytes-per-expert", "18800640", "-o", out).code == 0
        assert (tmp_path / out).read_bytes() == (ROOT / out).read_bytes()


def test_projected_cold_share_for_check_budgets() -> None:
    p = projected_cold_share(MAPS / "agent.rowmap", PROFILES / "agent.hist")
    assert 0.015 <= p.overall <= 0.027 and p.synthetic
    assert len(p.per_layer) == 40 and p.worst_layer in range(40)
    assert p.positional == pytest.approx(0.232, abs=0.01)


def test_eval_command_on_the_examples() -> None:
    args = ["rowmap", "eval", str(MAPS / "agent.rowmap"), str(PROFILES / "agent.hist"),
            str(PROFILES / "prose.hist")]
    text = invoke(*args)
    assert text.code == 0
    assert "agent.hist [synthetic]" in text.stdout and "leave-one-out" in text.stdout
    report = json.loads(invoke(*args, "--json").stdout)
    agent, prose = report["histograms"]
    assert 0.015 <= agent["cold_share"] <= 0.027 and prose["cold_share"] > 0.10
    assert agent["synthetic"] and report["combined"]["selections"] == 2 * 47778 * 240
