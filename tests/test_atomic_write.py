"""The one atomic writer (`expert_residency.formats.atomic_write_*`), used by the formats and
by recipegen: file modes like a plain open(), and a failed pre-rename check leaves the old file."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from expert_residency.formats import RowMap, atomic_write_text, load_rowmap, save_rowmap

from recipegen.load.recipe import load_recipe, set_active_class


@pytest.fixture()
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_new_file_gets_0666_less_umask(tmp_path: Path, umask: None) -> None:
    rowmap = RowMap.positional((0, 1), 8, 5)
    save_rowmap(rowmap, tmp_path / "a.rowmap")
    assert _mode(tmp_path / "a.rowmap") == 0o644  # not mkstemp's 0600
    os.umask(0o027)
    save_rowmap(rowmap, tmp_path / "b.rowmap")
    assert _mode(tmp_path / "b.rowmap") == 0o640
    assert load_rowmap(tmp_path / "b.rowmap") == rowmap


def test_overwrite_keeps_the_old_mode(tmp_path: Path, umask: None) -> None:
    target = tmp_path / "f.txt"
    target.write_text("old\n")
    target.chmod(0o600)
    atomic_write_text(target, "new\n")
    assert target.read_text() == "new\n" and _mode(target) == 0o600


def test_failed_check_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "f.yaml"
    target.write_text("good\n")
    seen: list[Path] = []

    def refuse(tmp: Path) -> None:
        seen.append(tmp)
        assert tmp.read_text() == "bad\n" and tmp.name.endswith(".yaml")
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        atomic_write_text(target, "bad\n", check=refuse, suffix=".yaml")
    assert seen and target.read_text() == "good\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.yaml"]


def test_set_active_class_keeps_the_recipe_mode(tmp_path: Path, repo_root: Path,
                                                umask: None) -> None:
    for folder in ("maps", "profiles"):
        shutil.copytree(repo_root / "recipes" / folder, tmp_path / folder)  # links out are refused
    recipe = tmp_path / "dsv41-flash-gb300.yaml"
    shutil.copy(repo_root / "recipes" / "dsv41-flash-gb300.yaml", recipe)
    recipe.chmod(0o644)
    assert set_active_class(recipe, "agent", "prose") is True
    assert _mode(recipe) == 0o644  # a recipe in a repo must not turn 0600
    assert load_recipe(recipe).recipe.lane("agent").active_class == "prose"
