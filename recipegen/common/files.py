"""Reading a user's file only when it is a regular file of bounded size, with an `InputError`
naming the file (the importer's config and shards, model files).

The reading itself is the one bounded reader recipegen and the runtime share
(`expert_residency.formats._io.read_regular_file`): the descriptor is opened non-blocking (a FIFO
opens at once and is then refused), its type and size are checked on the open descriptor, and the
read stops at `limit + 1` bytes. This module only words the refusal for a named kind of file.
"""

from __future__ import annotations

from pathlib import Path

from expert_residency.formats._io import UnreadableFile
from expert_residency.formats._io import read_regular_file as _read_bounded

from recipegen.common.errors import InputError


def read_regular_file(path: Path, *, limit: int, what: str, display: str | None = None) -> bytes:
    """The bytes of `path` when it is a regular file of at most `limit` bytes; an InputError
    naming `display` (or the path) and saying what the file is otherwise."""
    file = display or str(path)
    try:
        return _read_bounded(path, limit=limit)
    except UnreadableFile as exc:
        if exc.kind is not None:
            raise InputError(f"{what} must be a regular file; this is {exc.kind}", file=file) from None
        if exc.size is not None and "grew" in (exc.strerror or ""):
            raise InputError(f"{what} grew past {limit:,} bytes while being read", file=file) from None
        raise InputError(f"{what} is {exc.size:,} bytes, more than the {limit:,} a {what} can be",
                         file=file) from None
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror}", file=file) from None


def output_target(path: Path, option: str) -> None:
    """Refuse an output path the atomic write (temp file + rename) would misuse: something there
    that is not a regular file — a FIFO or a device (replaced by the file: as root even /dev/full),
    a folder, or a link (replaced, not followed). A regular file there is the caller's to allow
    (`--force`) or not."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        what = "a link" if path.is_symlink() else "a folder" if path.is_dir() else "not a regular file"
        raise InputError(f"is {what}; an output replaces only a regular file (name the file itself)",
                         file=str(path), field=option)
