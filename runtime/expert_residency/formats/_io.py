"""Small shared I/O helpers: atomic writes and layer-list notation."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *,
                       check: Callable[[Path], object] | None = None,
                       suffix: str = ".tmp") -> None:
    """Write `data` to `path` via a temp file in the same folder and a rename.

    A reader never sees a half-written file, and a crash leaves the old file intact. The
    file gets the old file's mode, or what a plain open() would give (0666 less the umask).
    `check(temp_path)` runs on the complete temp file before the rename; if it raises, the
    target is untouched (e.g. a recipe is re-validated before it replaces the good one).
    `suffix` ends the temp file's name, for checks that look at the file type.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    try:
        # mkstemp creates 0600; give the file what a plain open() would (or keep the old mode).
        try:
            mode = os.stat(target).st_mode & 0o777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if check is not None:
            check(Path(tmp))
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str, *,
                      check: Callable[[Path], object] | None = None,
                      suffix: str = ".tmp") -> None:
    """`atomic_write_bytes` of `text` as UTF-8, newlines written as given."""
    atomic_write_bytes(path, text.encode("utf-8"), check=check, suffix=suffix)


def format_index_ranges(indices: tuple[int, ...] | list[int]) -> str:
    """`(0,1,2,3,7,9,10)` -> `"0-3,7,9-10"`: compact and exact, in the given order."""
    parts: list[str] = []
    i = 0
    values = list(indices)
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(parts)


def parse_index_ranges(text: str) -> tuple[int, ...]:
    """Inverse of `format_index_ranges`; raises ValueError on malformed text."""
    text = text.strip()
    if not text:
        return ()
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo_s, hi_s = part.split("-", 1)
            lo, hi = int(lo_s), int(hi_s)
            if hi < lo:
                raise ValueError(f"descending range {part!r}")
            out.extend(range(lo, hi + 1))
        else:
            out.append(int(part))
    return tuple(out)
