"""The atomic output-folder writer and the staleness comparison (pure file-system tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipegen.common.errors import RecipegenError
from recipegen.render import output
from recipegen.render.output import MANIFEST_NAME, compare_output_dir, read_manifest, write_output_dir


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if p.name.endswith((".new", ".old"))]


def test_write_replaces_generated_files_and_keeps_the_users(tmp_path: Path) -> None:
    out = tmp_path / "compose" / "r"
    write_output_dir(out, {"compose.yaml": b"a\n", "maps/x/old.rowmap": b"m1"})
    (out / "secrets.env").write_text("TOKEN=1\n")
    (out / "dumps" / "agent").mkdir(parents=True)
    (out / "dumps" / "agent" / "h.hist").write_text("counts")
    folder_inode = out.stat().st_ino
    dumps_inode = (out / "dumps" / "agent").stat().st_ino
    write_output_dir(out, {"compose.yaml": b"b\n", "maps/x/new.rowmap": b"m2"})
    assert (out / "compose.yaml").read_bytes() == b"b\n"
    assert not (out / "maps" / "x" / "old.rowmap").exists()      # no longer generated: gone
    assert (out / "secrets.env").read_text() == "TOKEN=1\n"        # the user's: untouched
    assert (out / "dumps" / "agent" / "h.hist").read_text() == "counts"
    # Same folders: a running container's bind mounts (dumps/<lane>) still point at them.
    assert out.stat().st_ino == folder_inode
    assert (out / "dumps" / "agent").stat().st_ino == dumps_inode
    assert set(read_manifest(out) or {}) == {"compose.yaml", "maps/x/new.rowmap"}
    assert _leftovers(out) == []


def test_a_failure_while_staging_leaves_the_previous_output(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "r"
    write_output_dir(out, {"compose.yaml": b"first\n"})
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full_disk(root: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output, "_fsync_tree", full_disk)
    with pytest.raises(OSError):
        write_output_dir(out, {"compose.yaml": b"second\n", "maps/a.rowmap": b"m"})
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert _leftovers(out) == []


def test_a_failed_rename_puts_the_previous_output_back(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "r"
    write_output_dir(out, {"compose.yaml": b"first\n", "maps/a.rowmap": b"m1"})
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    real_replace = output.os.replace

    def flaky_replace(src, dst):  # type: ignore[no-untyped-def]
        if Path(dst).name == MANIFEST_NAME and str(src).endswith(".new"):
            raise OSError(5, "I/O error")  # the last rename: everything else already moved
        return real_replace(src, dst)

    monkeypatch.setattr(output.os, "replace", flaky_replace)
    with pytest.raises(OSError):
        write_output_dir(out, {"compose.yaml": b"second\n", "maps/a.rowmap": b"m2",
                               "maps/b.rowmap": b"new"})
    after = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert _leftovers(out) == []


def test_refuses_to_replace_a_folder_it_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "r"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(RecipegenError, match="was not written by `recipegen render`"):
        write_output_dir(out, {"compose.yaml": b"x"})
    assert (out / "notes.txt").read_text() == "mine"


def test_paths_must_stay_inside_the_folder(tmp_path: Path) -> None:
    with pytest.raises(RecipegenError):
        write_output_dir(tmp_path / "r", {"../escape": b"x"})
    assert not (tmp_path / "escape").exists()


def test_compare_finds_changed_missing_and_extra(tmp_path: Path) -> None:
    out = tmp_path / "r"
    write_output_dir(out, {"a": b"1", "b": b"2"})
    assert not compare_output_dir(out, {"a": b"1", "b": b"2"}).stale
    result = compare_output_dir(out, {"a": b"changed", "c": b"3"})
    assert set(result.changed) == {"a", MANIFEST_NAME} and result.missing == ("c",)
    assert result.extra == ("b",)
    (out / "user.env").write_text("x")  # not in the manifest: not ours, not stale
    assert not compare_output_dir(out, {"a": b"1", "b": b"2"}).stale
