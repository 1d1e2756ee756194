"""One lock per recipe and per output: every read-modify-write recipegen does runs under it.

A lock is an advisory `flock` on a lock file beside what it guards, `.<name>.recipegen-lock`
(a recipe `recipes/x.yaml` → `recipes/.x.yaml.recipegen-lock`; an output folder `compose/x/` →
`compose/.x.recipegen-lock`; a model file, a class's row map likewise). The kernel drops the lock
when its process ends, however it ends, so a lock is never stale and nothing guesses from process
ids: a lock that can be taken is free, one that cannot is held by a live process. The lock file
holds a line saying who holds it (pid, command, since when), printed to whoever waits; it is never
used to decide anything. The holder removes the file as it lets go (a waiter that then gets the
flock of the removed file sees the name no longer leads to it and starts over), so lock files
exist only while held — or after a killed holder, until the next run takes and removes them.

Who takes what (always in this order: the recipe first, then its outputs):

- `recipegen render` (with or without `--class`), `recipegen swap`: the recipe, then each output
  folder it writes;
- `recipegen k8s`: the recipe, then `k8s/<recipe>/`;
- `recipegen rowmap save-live`: the recipe, then the class's row-map file;
- `recipegen model import`: the model file it writes;
- `recipegen fit` / `recipegen new` (and anything else that writes a recipe back): the recipe,
  through `recipe_lock`.

A second process waits up to `RECIPEGEN_LOCK_WAIT_S` seconds (default 60; 0 = do not wait) and then
fails with exit 2 naming the lock and its holder: two `render --class` runs never interleave, so
recipe and rendering always end on one class. Locks are re-entrant within one process (a command
that holds the recipe's lock may call code that takes it again).

`write_atomically` is the one locked file writer for single files (a fixed temp name
`.<name>.recipegen-tmp` beside the target, fsynced, renamed): under the target's lock any such temp
is an interrupted write's and is removed first, and `sweep_temps` removes those of a folder whose
lock is free — what a `kill -9` at the rename left behind goes away on the next run.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from recipegen.common.errors import RecipegenError

LOCK_SUFFIX = ".recipegen-lock"
TEMP_SUFFIX = ".recipegen-tmp"
WAIT_ENV = "RECIPEGEN_LOCK_WAIT_S"
DEFAULT_WAIT_S = 60.0
_POLL_S = 0.1

# lock file (absolute, lexical) -> [descriptor, depth] of the locks this process holds
_HELD: dict[str, list[int]] = {}


class LockBusy(RecipegenError):
    """Another process holds the lock and did not let go within the wait."""


class LockUnavailable(RecipegenError):
    """The lock file cannot be created: the folder is read-only to this process."""


def lock_file_for(target: Path) -> Path:
    """The lock file guarding `target` (a file or a folder): a dot file beside it."""
    target = Path(os.path.abspath(target))
    return target.parent / f".{target.name}{LOCK_SUFFIX}"


def temp_file_for(target: Path) -> Path:
    """The one temp name `write_atomically` uses for `target`."""
    return target.parent / f".{target.name}{TEMP_SUFFIX}"


def wait_seconds() -> float:
    """How long to wait for a held lock: `RECIPEGEN_LOCK_WAIT_S`, else 60 s."""
    raw = os.environ.get(WAIT_ENV, "").strip()
    if not raw:
        return DEFAULT_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        raise RecipegenError(f"{WAIT_ENV}={raw[:40]!r}: not a number of seconds") from None
    if not 0 <= value <= 86_400:  # also refuses nan and inf
        raise RecipegenError(f"{WAIT_ENV}={raw[:40]!r}: give 0 to 86400 seconds")
    return value


def _open_lock(path: Path, what: str) -> int:
    import stat

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RecipegenError(f"{path} (the lock of {what}) is a symlink: refusing to follow it; "
                                 "delete the link") from None
        kind = LockUnavailable if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else RecipegenError
        raise kind(f"{path}: cannot open the lock of {what}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RecipegenError(f"{path} (the lock of {what}) is not a regular file; delete it")
    return fd


def _holder(fd: int) -> str:
    """The holder's note, for people: its first line, escaped (a lock file is anybody's to
    write, and what it says must not reach a terminal as control sequences)."""
    from expert_residency.formats._io import comment_text

    try:
        text = os.pread(fd, 512, 0).decode("utf-8", errors="replace").strip()
    except OSError:
        return ""
    return comment_text(text.split("\n")[0][:300]) if text else ""


def _try_lock(fd: int) -> bool:
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


@contextmanager
def locked(target: Path, *, what: str | None = None, wait_s: float | None = None,
           echo: Callable[[str], None] | None = None, readers_only: bool = False) -> Iterator[Path]:
    """Hold the lock of `target` (a recipe, an output folder, a written file) for the block.

    Waits up to `wait_s` (default: `wait_seconds()`) for another process to let go, telling
    `echo` (default: stderr) once who holds it; raises LockBusy after that. Yields the lock
    file's path. `readers_only`: the block only reads `target` (a render reading its recipe);
    when the folder is read-only to this process no writer can replace `target` either, so the
    block runs without the lock instead of failing."""
    lock = lock_file_for(target)
    key = str(lock)
    what = what or str(target)
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield lock
        finally:
            _HELD[key][1] -= 1
        return
    try:
        fd = _acquire(lock, what, wait_s, echo)
    except LockUnavailable:
        if not readers_only:
            raise
        yield lock
        return
    try:
        note = (f"pid {os.getpid()}: {_command()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, note.encode("utf-8", errors="replace"), 0)
        except OSError:
            pass  # the note is for people; the lock is the flock
        _HELD[key] = [fd, 1]
        try:
            yield lock
        finally:
            del _HELD[key]
            # Removed while still held: a process waiting on this file finds, once it gets the
            # flock, that the name no longer leads to it, and starts over on a fresh file.
            try:
                os.unlink(lock)
            except OSError:
                pass
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def _command() -> str:
    argv = [os.path.basename(sys.argv[0]) if sys.argv else "python", *sys.argv[1:]]
    return " ".join(argv)[:200]


def _still_named(fd: int, lock: Path) -> bool:
    """Whether the locked descriptor is still the file at `lock` (not unlinked by its last holder)."""
    try:
        named = os.stat(lock, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _acquire(lock: Path, what: str, wait_s: float | None,
             echo: Callable[[str], None] | None) -> int:
    """A descriptor of `lock` holding its flock (see `locked`)."""
    deadline: float | None = None
    told = False
    while True:
        fd = _open_lock(lock, what)
        if _try_lock(fd):
            if _still_named(fd, lock):
                return fd
            os.close(fd)  # its holder removed it on release: lock the new file
            continue
        holder = _holder(fd) or "another recipegen process"
        os.close(fd)
        if deadline is None:
            wait = wait_seconds() if wait_s is None else wait_s
            deadline = time.monotonic() + wait
        if time.monotonic() >= deadline:
            raise LockBusy(f"{what} is locked by {holder} (lock file {lock}); wait for it to "
                           f"finish, or raise {WAIT_ENV} (waited {wait:g} s)")
        if not told and wait > 0:
            say = echo or (lambda line: print(line, file=sys.stderr))
            say(f"waiting up to {wait:g} s for {what}: locked by {holder}")
            told = True
        time.sleep(_POLL_S)


def recipe_lock(recipe_path: Path, **kwargs: object) -> object:
    """The lock of a recipe file: held around every read-modify-write of it (`render --class`,
    `swap`, `save-live`, `fit`, `new`) and around a render that reads it."""
    return locked(recipe_path, what=f"recipe {recipe_path}", **kwargs)  # type: ignore[arg-type]


def output_lock(folder: Path, **kwargs: object) -> object:
    """The lock of an output folder (`compose/<recipe>/`, `k8s/<recipe>/`)."""
    return locked(folder, what=f"output folder {folder}", **kwargs)  # type: ignore[arg-type]


def write_atomically(target: Path, data: bytes, *, mode: int | None = None) -> None:
    """`data` into `target` under the target's lock: a fixed temp name beside it (a leftover of
    an interrupted write is removed first), fsynced, renamed, the folder entry flushed. Keeps
    the target's mode (a new file gets 0666 less the umask, or `mode`). Never follows a symlink
    at the temp's name."""
    target = Path(target)
    with locked(target, what=str(target)):
        temp = temp_file_for(target)
        temp.unlink(missing_ok=True)   # an interrupted write's: we hold the lock
        try:
            keep = os.stat(target).st_mode & 0o777
        except FileNotFoundError:
            if mode is None:
                umask = os.umask(0)
                os.umask(umask)
                keep = 0o666 & ~umask
            else:
                keep = mode
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_CLOEXEC", 0), keep)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temp, keep)
            os.replace(temp, target)
        except BaseException as exc:
            temp.unlink(missing_ok=True)
            if isinstance(exc, OSError):  # named by the file the user asked for, not our temp
                raise OSError(exc.errno, exc.strerror, str(target)) from None
            raise
        folder = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def sweep_locks(folder: Path) -> list[Path]:
    """Remove the lock files in `folder` (not below it) that nobody holds: left by a process
    killed while holding them. Each is taken without waiting (and removed as it is let go); one
    that is held stays. Returns what was removed."""
    removed: list[Path] = []
    if not folder.is_dir() or folder.is_symlink():
        return removed
    for lock in sorted(folder.glob(f".*{LOCK_SUFFIX}")):
        if str(lock) in _HELD or lock.is_symlink():
            continue
        target = folder / lock.name[1:-len(LOCK_SUFFIX)]
        try:
            with locked(target, wait_s=0):
                pass
        except (LockBusy, RecipegenError, OSError):
            continue
        removed.append(lock)
    return removed


def sweep_temps(folder: Path) -> list[Path]:
    """Remove the temps `write_atomically` left in `folder` (not below it): each under its
    target's lock, taken without waiting — a temp whose target is locked belongs to a write in
    progress and stays. Returns what was removed."""
    removed: list[Path] = []
    if not folder.is_dir() or folder.is_symlink():
        return removed
    for temp in sorted(folder.glob(f".*{TEMP_SUFFIX}")):
        if temp.is_symlink() or not temp.is_file():
            continue
        target = folder / temp.name[1:-len(TEMP_SUFFIX)]
        if str(lock_file_for(target)) in _HELD:
            continue  # ours: a write of this process is under way
        try:
            with locked(target, wait_s=0):
                temp.unlink(missing_ok=True)
        except (LockBusy, RecipegenError, OSError):
            continue  # held (a write in progress), or a folder this process cannot write
        removed.append(temp)
    return removed
