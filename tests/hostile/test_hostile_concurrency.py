"""Concurrent writers (recipegen.common.lock): real processes at once, never an interleaving.

Two `render --class` runs, a render beside a swap, two model imports to one target: one waits for
the other (or, told not to wait, fails cleanly naming the holder), and the end state is always one
process's whole work — recipe and rendering on one class, one complete model file. The lock is the
kernel's (flock): a holder killed with SIGKILL lets go by dying, with no process id to guess from.
Commands killed at their rename leave temps that the next run removes.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile_support import REFERENCE, REPO, SUBPROCESS_ENV, cli, killed_at_rename, refused, snapshot

from recipegen.common.errors import RecipegenError
from recipegen.common.lock import LockBusy, lock_file_for, locked, sweep_locks, sweep_temps, temp_file_for

RECIPE = Path("recipes") / f"{REFERENCE}.yaml"
OUT = Path("compose") / REFERENCE

# The CLI with every os.replace slowed down: a write takes long enough for a second process to
# arrive while the first is inside its read-modify-write.
SLOW = """
import os, sys, time
real = os.replace
def slow(*a, **k):
    time.sleep(float(os.environ.get("SLOW_S", "0.15")))
    return real(*a, **k)
os.replace = slow
from recipegen.cli import main
sys.argv = ["recipegen", *sys.argv[1:]]
main()
"""

# Holds the flock of a file until killed (another recipegen mid-swap, as far as the lock goes).
HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.write(fd, b"pid %d: recipegen render --class (test holder)\\n" % os.getpid())
print("held", flush=True)
time.sleep(600)
"""



def _active(project: Path) -> str:
    return re.search(r"^\s*active_class:\s*(\S+)", (project / RECIPE).read_text(), re.M).group(1)


def _served(project: Path) -> str:
    text = (project / OUT / "compose.yaml").read_text()
    block = text.split("  lane-agent:\n")[1].split("\n  lane-agent-profile:")[0]
    return re.search(r'io\.recipegen\.class: "([^"]*)"', block).group(1)


def _start(project: Path, script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=project,
                            env={**SUBPROCESS_ENV, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _hold(path: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def _leftovers(project: Path) -> list[str]:
    return sorted(str(p.relative_to(project)) for p in project.rglob("*")
                  if re.search(r"\.recipegen-(lock|tmp|swap\.)|\.recipegen-[0-9]+\.(new|old)$", p.name))


@pytest.mark.timeout(600)
def test_two_class_swaps_at_once_end_on_one_class(project: Path) -> None:
    """Each round starts `render --class agent=prose` and `--class agent=math` together; one
    waits for the other (it says so), both succeed, and recipe and rendering agree on the class
    of the one that ran last — the one that waited."""
    assert cli("render")[0] == 0
    waited = 0
    for round_ in range(3):
        a = _start(project, SLOW, "render", REFERENCE, "--class", "agent=prose")
        b = _start(project, SLOW, "render", REFERENCE, "--class", "agent=math")
        out_a, out_b = a.communicate(timeout=300)[0], b.communicate(timeout=300)[0]
        assert (a.returncode, b.returncode) == (0, 0), out_a + out_b
        assert _active(project) == _served(project), f"round {round_}"
        waiters = [cls for cls, out in (("prose", out_a), ("math", out_b)) if "waiting up to" in out]
        if waiters:
            waited += 1
            assert waiters == [_active(project)], (waiters, out_a, out_b)
        assert not _leftovers(project), _leftovers(project)
        assert cli("render", "--check")[0] == 0
        assert cli("render", REFERENCE, "--class", "agent=agent")[0] == 0
    assert waited >= 1, "the two processes never overlapped: the test proves nothing"


@pytest.mark.timeout(600)
def test_a_render_beside_a_swap_never_writes_the_old_class(project: Path) -> None:
    """A plain `render` reads the recipe and writes the rendering under the recipe's lock: it
    cannot read the old class, let a swap commit, and then write the old class's rendering."""
    assert cli("render")[0] == 0
    for cls in ("prose", "math"):
        swap = _start(project, SLOW, "render", REFERENCE, "--class", f"agent={cls}")
        time.sleep(0.3)
        plain = _start(project, SLOW, "render", REFERENCE)
        outs = swap.communicate(timeout=300)[0] + plain.communicate(timeout=300)[0]
        assert (swap.returncode, plain.returncode) == (0, 0), outs
        assert _active(project) == _served(project) == cls, outs
        assert cli("render", "--check")[0] == 0


def test_told_not_to_wait_a_second_writer_fails_naming_the_holder(project: Path, monkeypatch) -> None:
    assert cli("render")[0] == 0
    before = ((project / RECIPE).read_bytes(), snapshot(project / OUT))
    holder = _hold(lock_file_for(project / RECIPE))
    try:
        monkeypatch.setenv("RECIPEGEN_LOCK_WAIT_S", "0")
        for args in (("render", REFERENCE, "--class", "agent=prose"), ("render", REFERENCE)):
            out = refused(*args, expect="is locked by pid")
            assert f"pid {holder.pid}" in out and "RECIPEGEN_LOCK_WAIT_S" in out
        monkeypatch.setenv("RECIPEGEN_LOCK_WAIT_S", "1")
        t0 = time.monotonic()
        refused("render", REFERENCE, "--class", "agent=prose", expect="waited 1 s")
        assert time.monotonic() - t0 >= 1.0
        assert cli("render", "--check")[0] == 0   # reading needs no lock
        assert ((project / RECIPE).read_bytes(), snapshot(project / OUT)) == before
    finally:
        holder.kill()
        holder.wait()
    monkeypatch.setenv("RECIPEGEN_LOCK_WAIT_S", "0")
    code, out = cli("render", REFERENCE, "--class", "agent=prose")   # the kernel let go
    assert code == 0, out
    assert _active(project) == _served(project) == "prose"


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "ten", "1e9"])
def test_the_wait_setting_is_checked(project: Path, monkeypatch, value: str) -> None:
    monkeypatch.setenv("RECIPEGEN_LOCK_WAIT_S", value)
    holder = _hold(lock_file_for(project / RECIPE))
    try:
        refused("render", REFERENCE, expect="RECIPEGEN_LOCK_WAIT_S")
    finally:
        holder.kill()
        holder.wait()


def test_a_journal_under_a_live_lock_is_left_and_rolled_back_once_the_holder_dies(project: Path) -> None:
    """No process-id guess: while the recipe's lock is held the journal is a swap in progress;
    the moment its holder is SIGKILLed, the next command rolls it back."""
    from recipegen.load.recipe import load_recipe
    from recipegen.render.render import render_recipe
    from recipegen.render.swap import _folder_files, _journal_bytes, journal_path

    assert cli("render")[0] == 0
    recipe = project / RECIPE
    before = (recipe.read_bytes(), snapshot(project / OUT))
    rendering = render_recipe(load_recipe(recipe))
    folders = {d: _folder_files(d) for d in rendering.folders}
    holder = _hold(lock_file_for(recipe))
    try:
        journal = journal_path(recipe)
        journal.write_bytes(_journal_bytes(recipe, before[0], folders, [("agent", "agent", "prose")],
                                           rendering.root))
        recipe.write_text(recipe.read_text().replace("active_class: agent", "active_class: prose", 1))
        code, out = cli("render", "--check")          # mid-swap: nothing rolled back under it
        assert "rolled back" not in out
        assert journal.exists() and _active(project) == "prose"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    code, out = cli("render", "--check")
    assert code == 0 and "rolled back" in out, out
    assert (recipe.read_bytes(), snapshot(project / OUT)) == before
    assert not journal.exists() and not _leftovers(project)


def _import_args(target: Path, *extra: str) -> list[str]:
    return ["model", "import", str(REPO / "tests" / "fixtures" / "hf_configs" / "qwen3-30b-a3b"),
            "--name", "qwen3-30b-a3b", "-o", str(target), *extra]


@pytest.mark.timeout(600)
def test_two_imports_to_one_target(project: Path) -> None:
    """Without --force exactly one of two simultaneous imports writes, the other says the file
    exists; with --force both write, one after the other, and the file is one whole import."""
    target = project / "recipes" / "models" / "q.yaml"
    expected = subprocess.run([sys.executable, "-m", "recipegen", *_import_args(target)[:-2], "-o", "-"],
                              cwd=project, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=300).stdout
    assert expected.startswith("# Generated by")
    for _ in range(2):
        target.unlink(missing_ok=True)
        runs = [_start(project, SLOW, *_import_args(target)) for _ in range(2)]
        outs = [r.communicate(timeout=300)[0] for r in runs]
        codes = sorted(r.returncode for r in runs)
        assert codes == [0, 2], outs
        assert any("exists; pass --force" in o for o in outs), outs
        assert target.read_text() == expected
    runs = [_start(project, SLOW, *_import_args(target, "--force")) for _ in range(2)]
    outs = [r.communicate(timeout=300)[0] for r in runs]
    assert [r.returncode for r in runs] == [0, 0], outs
    assert target.read_text() == expected and not _leftovers(project)


def test_an_import_killed_at_its_rename_leaves_nothing_the_next_run_keeps(project: Path) -> None:
    target = project / "recipes" / "models" / "q.yaml"
    run = killed_at_rename(project, *_import_args(target))
    assert run.returncode == -9
    assert temp_file_for(target).exists() and not target.exists()   # killed before the rename
    code, out = cli(*_import_args(target))
    assert code == 0, out
    assert not _leftovers(project), _leftovers(project)
    assert target.read_text().startswith("# Generated by")


def test_k8s_killed_at_a_rename_is_cleaned_by_the_next_run(project: Path) -> None:
    import shutil

    shutil.copy(REPO / "recipes" / "dsv41-flash-gb300x2-pp2.yaml", project / "recipes")
    out_dir = project / "k8s" / "dsv41-flash-gb300x2-pp2"
    for step in range(1, 4):
        run = killed_at_rename(project, "k8s", "dsv41-flash-gb300x2-pp2", at=step)
        if run.returncode == 0:
            break
        assert run.returncode == -9, run.stdout + run.stderr
        code, out = cli("k8s", "--check", "dsv41-flash-gb300x2-pp2")
        assert code == 1, out                          # half a write is never current
        assert cli("k8s", "dsv41-flash-gb300x2-pp2")[0] == 0
        assert cli("k8s", "--check", "dsv41-flash-gb300x2-pp2")[0] == 0
        assert not _leftovers(project), _leftovers(project)
        assert sorted(p.name for p in out_dir.iterdir()) == [".recipegen-manifest", "agent.yaml"]
        shutil.rmtree(project / "k8s")


def test_the_lock_api(tmp_path: Path) -> None:
    """Re-entrant within a process, exclusive across processes, gone once released, never
    followed through a symlink; sweeps take only what nobody holds."""
    target = tmp_path / "x.yaml"
    with locked(target) as lock:
        with locked(target):   # the same process may take it again
            assert lock.is_file()
        assert lock.is_file()
        other = subprocess.run([sys.executable, "-c",
                                "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR);"
                                "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)", str(lock)],
                               capture_output=True, text=True)
        assert other.returncode != 0 and "BlockingIOError" in other.stderr
    assert not lock.exists()
    holder = _hold(lock_file_for(target))
    try:
        with pytest.raises(LockBusy, match=f"pid {holder.pid}"):
            with locked(target, wait_s=0):
                pass
        temp_file_for(target).write_text("half")
        assert sweep_temps(tmp_path) == [] and temp_file_for(target).exists()   # its writer lives
        assert sweep_locks(tmp_path) == [] and lock_file_for(target).exists()
    finally:
        holder.kill()
        holder.wait()
    assert sweep_temps(tmp_path) == [temp_file_for(target)]
    assert sorted(p.name for p in tmp_path.iterdir()) == []   # the lock taken for it went too
    holder = _hold(lock_file_for(target))
    holder.kill()
    holder.wait()
    assert sweep_locks(tmp_path) == [lock_file_for(target)]
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    lock_file_for(target).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RecipegenError, match="symlink"):
        with locked(target, wait_s=0):
            pass
    assert not (tmp_path / "elsewhere").exists()


def test_a_recipe_folder_this_process_cannot_write_still_renders(project: Path, monkeypatch) -> None:
    """No writer can replace a recipe in a folder nobody may create files in: a render (which only
    reads the recipe) goes on without the recipe's lock; a swap (which writes it) stops."""
    import errno

    from recipegen.common import lock

    real = lock.os.open

    def refusing(path, flags, *args):  # as a read-only recipes/ answers (root ignores chmod)
        if str(path).endswith(".yaml.recipegen-lock"):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real(path, flags, *args)

    monkeypatch.setattr(lock.os, "open", refusing)
    code, out = cli("render", REFERENCE)
    assert code == 0, out
    refused("render", REFERENCE, "--class", "agent=prose", expect="Read-only file system")
