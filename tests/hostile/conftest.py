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
