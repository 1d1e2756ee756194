"""Fixtures of the hostile-input corpus: a scratch project (recipes copied, runtime linked)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    # the reference recipe and its maps/profiles only: commands without a recipe name see
    # exactly one recipe, whatever else recipes/ holds
    shutil.copytree(REPO / "recipes", root / "recipes",
                    ignore=lambda folder, names: [n for n in names if n.startswith(".") or (
                        Path(folder) == REPO / "recipes" and n.endswith(".yaml")
                        and n != "dsv41-flash-gb300.yaml")])
    (root / "runtime").symlink_to(REPO / "runtime", target_is_directory=True)
    monkeypatch.chdir(root)
    return root


@pytest.fixture()
def adaptive_project(project: Path) -> Path:
    """The scratch project with the reference lane made adaptive (`offload.adaptive`): `rowmap
    save-live` reads the live map only an adaptive lane writes, and refuses any other lane first."""
    recipe = project / "recipes" / "dsv41-flash-gb300.yaml"
    text = recipe.read_text()
    anchor = "      hot_experts_per_layer: 295"
    assert text.count(anchor) == 1, "the reference lane's offload block moved: update this fixture"
    end = text.index("\n", text.index(anchor)) + 1
    recipe.write_text(text[:end] + "      adaptive: {swaps_per_layer: 4, priors: [prose, math]}\n" + text[end:])
    return project
