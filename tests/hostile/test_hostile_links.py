"""Symlinks out of the project (recipegen.common.paths): every path recipegen reads or writes in
a project — model files and the folder `model import` writes to, row maps, histograms, dump
folders, `k8s/<recipe>/`, `compose/<recipe>/` — is refused (exit 2, naming the path and the link)
when a link on the way resolves outside the project; nothing outside is read or written. Links
that stay inside the project work as before."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml
from hostile_support import REPO, cli, reference_plain, refused, snapshot, write_recipe

from recipegen.common.paths import escaping_link, project_path

CONFIG = REPO / "tests" / "fixtures" / "hf_configs" / "qwen3-30b-a3b"
PP = "dsv41-flash-gb300x2-pp2"


@pytest.fixture()
def outside(project: Path) -> Path:
    folder = project.parent / "outside"
    folder.mkdir()
    (folder / "precious.txt").write_text("keep me")
    return folder


def test_the_resolver(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "recipes" / "maps").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (root / "recipes" / "inside").symlink_to(root / "recipes" / "maps")
    (root / "recipes" / "away").symlink_to(tmp_path / "out")
    (root / "recipes" / "up").symlink_to("..")                      # still inside (the root)
    (root / "recipes" / "loop").symlink_to("loop")
    assert escaping_link(root, root / "recipes" / "inside" / "x.rowmap") is None
    assert escaping_link(root, root / "recipes" / "up" / "recipes") is None
    assert escaping_link(root, root / "recipes" / "away" / "x") == (root / "recipes" / "away",
                                                                   str(tmp_path / "out"))
    assert escaping_link(root, root / "recipes" / "not-yet" / "x") is None   # may not exist yet
    with pytest.raises(Exception, match="outside the project"):
        project_path(root, tmp_path / "elsewhere", what="a file")
    with pytest.raises(Exception, match="through .*away, a symlink"):
        project_path(root, root / "recipes" / "away" / "x", what="a file")
    # a loop leads nowhere, in or out: reading it fails (ELOOP), cleanly, wherever it is read
    assert escaping_link(root, root / "recipes" / "loop") is None


def _replace_by_link(path: Path, target: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)   # the project's own folder (recipes/models/ may hold model files)
    path.symlink_to(target, target_is_directory=True)


@pytest.mark.parametrize("link", ["recipes/models", "recipes"])
def test_model_import_does_not_write_through_a_link_out(project: Path, outside: Path, link: str) -> None:
    _replace_by_link(project / link, outside)
    before = snapshot(outside)
    out = refused("model", "import", str(CONFIG), "--name", "q", expect="leaves the project")
    assert str(project / link) in out
    assert snapshot(outside) == before


def test_model_import_into_a_linked_folder_inside_the_project_works(project: Path) -> None:
    (project / "store").mkdir()
    _replace_by_link(project / "recipes" / "models", project / "store")
    code, out = cli("model", "import", str(CONFIG), "--name", "q")
    assert code == 0, out
    assert (project / "store" / "q.yaml").is_file()


@pytest.mark.parametrize("how", ["file", "folder"])
def test_a_model_file_linked_out_of_the_project_is_refused(project: Path, outside: Path, how: str) -> None:
    code, out = cli("model", "import", str(CONFIG), "--name", "q", "-o", str(outside / "q.yaml"))
    assert code == 0, out   # an explicit -o outside the project is the user's choice
    models = project / "recipes" / "models"
    if how == "file":
        models.mkdir(exist_ok=True)
        (models / "q.yaml").unlink(missing_ok=True)
        (models / "q.yaml").symlink_to(outside / "q.yaml")
    else:
        _replace_by_link(models, outside)
    doc = reference_plain()
    doc["model"] = {"file": "models/q.yaml"}
    write_recipe(project, "linked", doc)
    out = refused("check", "recipe", "linked", expect="leaves the project")
    assert "field 'model" in out


@pytest.mark.parametrize("field", ["rowmap", "histogram"])
@pytest.mark.parametrize("how", ["file", "folder"])
def test_maps_and_histograms_linked_out_are_refused(project: Path, outside: Path, field: str, how: str) -> None:
    doc = reference_plain()
    rel = doc["lanes"][0]["classes"]["agent"][field]
    real = project / "recipes" / rel
    if how == "file":
        shutil.move(real, outside / real.name)
        real.symlink_to(outside / real.name)
    else:
        shutil.move(real.parent, outside / "moved")
        real.parent.symlink_to(outside / "moved", target_is_directory=True)
    write_recipe(project, "linked", doc)
    out = refused("check", "recipe", "linked", expect="leaves the project")
    assert f"classes.agent.{field}" in out
    refused("render", "linked")
    assert not (project / "compose" / "linked").exists()


def test_maps_linked_inside_the_project_still_load(project: Path) -> None:
    shutil.move(project / "recipes" / "maps", project / "shared-maps")
    (project / "recipes" / "maps").symlink_to(project / "shared-maps", target_is_directory=True)
    code, out = cli("render", "dsv41-flash-gb300")
    assert code == 0, out


@pytest.mark.parametrize("link", ["k8s", f"k8s/{PP}"])
def test_kubernetes_output_is_not_written_through_a_link(project: Path, outside: Path, link: str) -> None:
    shutil.copy(REPO / "recipes" / f"{PP}.yaml", project / "recipes")
    if link != "k8s":
        (project / "k8s").mkdir()
    (project / link).symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    refused("k8s", PP, expect="symlink")
    assert snapshot(outside) == before


@pytest.mark.usefixtures("adaptive_project")
def test_a_dump_folder_linked_out_is_not_read(project: Path, outside: Path) -> None:
    """`rowmap save-live` reads compose/<recipe>/dumps/<lane> by default: a link there leading
    out of the project (a container can create one in its bind mount) is refused."""
    assert cli("render", "dsv41-flash-gb300")[0] == 0
    dumps = project / "compose" / "dsv41-flash-gb300" / "dumps"
    dumps.mkdir(exist_ok=True)
    (dumps / "agent").symlink_to(outside, target_is_directory=True)
    out = refused("rowmap", "save-live", "dsv41-flash-gb300", "agent", "--class", "prose",
                  expect="leaves the project")
    assert str(dumps / "agent") in out


def test_a_dump_file_that_is_a_link_is_not_followed(project: Path, outside: Path) -> None:
    from recipegen.common.errors import InputError
    from recipegen.ops.dumps import read_host_dir

    folder = project / "dumps"
    folder.mkdir()
    (folder / "agent__agent__residency__20261201T100000.000000Z__000001.hist").symlink_to(
        outside / "precious.txt")
    with pytest.raises(InputError, match="symlink"):
        read_host_dir(folder)
    os.unlink(folder / "agent__agent__residency__20261201T100000.000000Z__000001.hist")
    (folder / "unrelated.txt").symlink_to(outside / "precious.txt")   # not a dump name: never opened
    assert read_host_dir(folder) == {}


def test_save_live_does_not_write_a_class_map_through_a_link_out(project: Path, outside: Path) -> None:
    doc = yaml.safe_load((project / "recipes" / "dsv41-flash-gb300.yaml").read_text())
    target = project / "recipes" / doc["lanes"][0]["classes"]["prose"]["rowmap"]
    shutil.move(target, outside / "prose.rowmap")
    target.symlink_to(outside / "prose.rowmap")
    before = snapshot(outside)
    refused("rowmap", "save-live", "dsv41-flash-gb300", "agent", "--class", "prose",
            "--dump-dir", str(project / "nodumps"), expect="leaves the project")
    assert snapshot(outside) == before
