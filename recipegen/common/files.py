"""Reading a user's file only when it is a regular file of bounded size.

A path can name a FIFO (a read blocks until someone writes), a device (`/dev/zero` never ends)
or a file far larger than anything recipegen reads; each is refused before reading, with the
file named. The descriptor is opened non-blocking (a FIFO opens at once and is then refused),
its type and size are checked on the open descriptor, and the read stops at `limit + 1` bytes.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from recipegen.common.errors import InputError


def read_regular_file(path: Path, *, limit: int, what: str, display: str | None = None) -> bytes:
    """The bytes of `path` when it is a regular file of at most `limit` bytes.

    Opened non-blocking (a FIFO opens at once and is then refused, instead of waiting for a
    writer); the type and size are checked on the open descriptor, and the read stops at
    `limit + 1` bytes, so a file that grows meanwhile is refused too."""
    file = display or str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror}", file=file) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a folder" if stat.S_ISDIR(info.st_mode) else "a pipe (FIFO)" if stat.S_ISFIFO(info.st_mode)
                    else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                    else "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file")
            raise InputError(f"{what} must be a regular file; this is {kind}", file=file)
        if info.st_size > limit:
            raise InputError(f"{what} is {info.st_size:,} bytes, more than the {limit:,} a {what} can be",
                             file=file)
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise InputError(f"{what} grew past {limit:,} bytes while being read", file=file)
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror}", file=file) from None
    finally:
        os.close(fd)
