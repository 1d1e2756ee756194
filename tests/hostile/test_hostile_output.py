"""The output folder: a render never writes, reads or deletes outside it — not through an
edited manifest, not through symlinks — and never takes over a folder it did not write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hostile_support import REFERENCE, cli, refused, snapshot

OUT = Path("compose") / REFERENCE


def _rendered(project: Path) -> Path:
    code, out = cli("render", REFERENCE)
    assert code == 0, out
    return project / OUT


def _victim(project: Path) -> Path:
    victim = project.parent / "victim"
    victim.mkdir(exist_ok=True)
    (victim / "precious.txt").write_text("keep me")
    return victim


@pytest.mark.parametrize("entry", [
    "../../../victim/precious.txt",
    "../../victim/precious.txt",
    "maps/../../../../victim/precious.txt",
    "ABSOLUTE",
    "./../../../victim/precious.txt",
    "maps//x",
    "maps\\..\\..\\x",
    "",
])
def test_an_edited_manifest_cannot_delete_outside_the_folder(project: Path, entry: str) -> None:
    out = _rendered(project)
    victim = _victim(project)
    entry = str(victim / "precious.txt") if entry == "ABSOLUTE" else entry
    manifest = out / ".recipegen-manifest"
    manifest.write_text(manifest.read_text() + f"{'0' * 64}  {entry}\n")
    refused("render", REFERENCE, expect=".recipegen-manifest")
    assert (victim / "precious.txt").read_text() == "keep me"
    assert victim.is_dir()


def test_a_retired_machine_folder_with_an_edited_manifest_deletes_nothing_outside(project: Path) -> None:
    out = _rendered(project)
    victim = _victim(project)
    retired = out / "old-box"
    retired.mkdir()
    (retired / ".recipegen-manifest").write_text(f"{'0' * 64}  ../../../../victim/precious.txt\n")
    cli("render", REFERENCE)
    assert (victim / "precious.txt").read_text() == "keep me"


def test_manifest_lines_must_be_hash_and_path(project: Path) -> None:
    out = _rendered(project)
    manifest = out / ".recipegen-manifest"
    manifest.write_text(manifest.read_text() + "not a line\n")
    refused("render", REFERENCE, expect="manifest")
    refused("render", "--check", REFERENCE, expect="manifest")


@pytest.mark.parametrize("link", ["compose", f"compose/{REFERENCE}", f"compose/{REFERENCE}/maps",
                                  f"compose/{REFERENCE}/maps/agent"])
def test_symlinked_output_folders_are_refused(project: Path, link: str) -> None:
    _rendered(project)
    elsewhere = project.parent / "elsewhere"
    target = project / link
    os.rename(target, elsewhere)
    target.symlink_to(elsewhere, target_is_directory=True)
    before = snapshot(elsewhere)
    refused("render", REFERENCE, expect="symlink")
    assert snapshot(elsewhere) == before


def test_a_symlinked_manifest_or_compose_file_is_refused(project: Path) -> None:
    out = _rendered(project)
    outside = project.parent / "outside.yaml"
    outside.write_text("mine")
    (out / "compose.yaml").unlink()
    (out / "compose.yaml").symlink_to(outside)
    refused("render", REFERENCE, expect="symlink")
    assert outside.read_text() == "mine"


def test_a_symlinked_recipe_renders_into_its_own_project(project: Path) -> None:
    """A recipe linked from another tree renders here, not into the tree the link points to."""
    import shutil

    other = project.parent / "other"
    (other / "recipes").mkdir(parents=True)
    for folder in ("maps", "profiles"):
        shutil.copytree(project / "recipes" / folder, other / "recipes" / folder)
    real = other / "recipes" / "linked.yaml"
    real.write_text((project / "recipes" / f"{REFERENCE}.yaml").read_text().replace(
        f"name: {REFERENCE}", "name: linked"), encoding="utf-8")
    (project / "recipes" / "linked.yaml").symlink_to(real)
    code, out = cli("render", "linked")
    assert code == 0, out
    assert not (other / "compose").exists()
    assert (project / "compose" / "linked" / "compose.yaml").is_file()


def test_a_folder_without_manifest_is_not_taken_over_at_any_depth(project: Path) -> None:
    out = project / OUT
    (out / "maps" / "agent").mkdir(parents=True)
    (out / "maps" / "agent" / "agent.rowmap").write_text("somebody's file")
    refused("render", REFERENCE, expect="not written by")
    assert (out / "maps" / "agent" / "agent.rowmap").read_text() == "somebody's file"


def test_leftover_temp_files_are_stale_and_removed(project: Path) -> None:
    out = _rendered(project)
    (out / "compose.yaml.recipegen-99999.new").write_text("half")
    (out / "maps" / "agent" / "agent.rowmap.recipegen-99999.old").write_text("old")
    (out / ".doctor-ab12_cd.yaml").write_text("a killed doctor's staged compose file")
    code, output = cli("render", "--check", REFERENCE)
    assert code == 1 and "recipegen-99999" in output, output
    assert cli("render", REFERENCE)[0] == 0
    assert not list(out.rglob("*recipegen-99999*")) and not list(out.glob(".doctor-*"))
    assert cli("render", "--check", REFERENCE)[0] == 0


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_output_folder_is_a_clean_error(project: Path) -> None:
    out = _rendered(project)
    (project / "recipes" / f"{REFERENCE}.yaml").write_text(
        (project / "recipes" / f"{REFERENCE}.yaml").read_text().replace("port: 30006", "port: 30007"))
    out.chmod(0o500)
    try:
        refused("render", REFERENCE)
    finally:
        out.chmod(0o700)


def test_output_path_blocked_by_a_file_is_a_clean_error(project: Path) -> None:
    (project / "compose").write_text("a file where the folder goes")
    refused("render", REFERENCE)


@pytest.mark.parametrize("errno_, words", [(30, "Read-only file system"),
                                           (28, "No space left on device"),
                                           (13, "Permission denied")])
def test_unwritable_output_is_a_clean_error_and_keeps_the_previous_output(
        project: Path, monkeypatch, errno_: int, words: str) -> None:
    """As root a chmod does not stop a write, so the file system's refusal is simulated where
    the render opens its temp files."""
    import builtins

    from recipegen.render import output

    out = _rendered(project)
    before = snapshot(out)
    recipe = project / "recipes" / f"{REFERENCE}.yaml"
    recipe.write_text(recipe.read_text().replace("port: 30006", "port: 30007"))
    real_open = builtins.open

    def refusing_open(file, mode="r", *args, **kwargs):
        if "w" in mode and ".recipegen-" in str(file):
            raise OSError(errno_, words, str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(output, "open", refusing_open, raising=False)
    out_text = refused("render", REFERENCE, expect=words)
    assert "compose.yaml" in out_text or ".gitignore" in out_text
    assert snapshot(out) == before
    assert not list(out.rglob("*.recipegen-*.new"))
