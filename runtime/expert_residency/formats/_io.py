"""Small shared I/O helpers: atomic writes, bounded reads of regular files, comment text and
layer-list notation."""

from __future__ import annotations

import os
import re
import stat
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


# docs/formats.md: "Integers are decimal, no sign, no leading zeros, no thousands separators"
# (ASCII digits only: Python's int() would also take '+7', '0_7', ' 7' and '٧').
DECIMAL = re.compile(r"0|[1-9][0-9]*")
# Bounds checked before anything is allocated: far above any model (DeepSeek-V4.1-Flash has 40
# MoE layers of 384 experts), far below what a few bytes of `1-300000000` would ask for.
MAX_LAYER_INDEX = 65_535
MAX_LAYERS = 4_096
MAX_EXPERTS = 65_536


def parse_decimal(text: str, *, limit: int | None = None) -> int:
    """A canonical non-negative decimal integer (at most `limit`); ValueError otherwise."""
    if not DECIMAL.fullmatch(text):
        raise ValueError(f"not a plain decimal integer: {text[:24]!r}")
    if limit is not None and (len(text) > len(str(limit)) or int(text) > limit):
        raise ValueError(f"{text[:24]} is larger than {limit}")
    return int(text)


def parse_index_ranges(text: str, *, max_index: int = MAX_LAYER_INDEX,
                       max_count: int = MAX_LAYERS) -> tuple[int, ...]:
    """Inverse of `format_index_ranges`; raises ValueError on malformed text, on an index
    above `max_index` or on more than `max_count` indices (checked before expanding)."""
    text = text.strip(" ")
    if not text:
        return ()
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo_s, hi_s = part.split("-", 1)
            lo, hi = parse_decimal(lo_s, limit=max_index), parse_decimal(hi_s, limit=max_index)
            if hi < lo:
                raise ValueError(f"descending range {part!r}")
            if len(out) + hi - lo + 1 > max_count:
                raise ValueError(f"more than {max_count} indices")
            out.extend(range(lo, hi + 1))
        else:
            out.append(parse_decimal(part, limit=max_index))
            if len(out) > max_count:
                raise ValueError(f"more than {max_count} indices")
    return tuple(out)


class UnreadableFile(OSError):
    """A path that is not a regular file of bounded size (a FIFO, a device, a folder, a socket,
    or more bytes than the reader takes): refused before any read blocks or runs away. `kind`
    says what it is instead (`file_kind`), or `size` how large it is, for callers that word
    their own message."""

    kind: str | None = None
    size: int | None = None


def file_kind(mode: int) -> str:
    """Words for a file type that is not a regular file."""
    return ("a folder" if stat.S_ISDIR(mode) else "a pipe (FIFO)" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def open_regular_file(path: str | os.PathLike[str], *, limit: int | None = None) -> int:
    """An open, read-only descriptor of `path` once it is known to be a regular file of at
    most `limit` bytes (None: any size); UnreadableFile otherwise.

    Opened non-blocking, so a FIFO opens at once and is then refused instead of waiting for a
    writer; the type and size are checked on the open descriptor (what is read is what was
    checked, whatever a link or a rename does meanwhile). The caller closes the descriptor.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            error = UnreadableFile(None, f"{file_kind(info.st_mode)}, not a regular file", os.fspath(path))
            error.kind = file_kind(info.st_mode)
            raise error
        if limit is not None and info.st_size > limit:
            error = UnreadableFile(None, f"{info.st_size:,} bytes, more than the {limit:,} this file can be",
                                   os.fspath(path))
            error.size = info.st_size
            raise error
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular_file(path: str | os.PathLike[str], *, limit: int) -> bytes:
    """The bytes of `path` when it is a regular file of at most `limit` bytes.

    The one bounded reader of the files recipegen and the runtime read from a folder a user or
    a container controls (row maps, histograms, dumps, priors, recipes, manifests): a FIFO, a
    device (`/dev/zero`), a folder or an oversized file raises UnreadableFile (an OSError, with
    `filename` set) before anything is read; the read stops at `limit + 1` bytes, so a file that
    grows meanwhile is refused too. Other OSErrors (missing, permission) pass through.
    """
    fd = open_regular_file(path, limit=limit)
    try:
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > limit:
        error = UnreadableFile(None, f"grew past {limit:,} bytes while being read", os.fspath(path))
        error.size = total
        raise error
    return b"".join(chunks)


# Characters that must never reach a generated file's comment raw: every C0/C1 control (line
# feed, carriage return, tab, NUL, ESC, NEL), DEL, the Unicode line/paragraph separators YAML
# and Compose break lines on, the BOM, lone surrogates and non-characters.
_COMMENT_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff\\\\]")
_COMMENT_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def comment_text(text: str) -> str:
    """`text` as one line of a `#` comment in any file recipegen or the runtime writes: every
    line-breaking, control or non-character escaped (`\\n`, `\\u2028`, a backslash doubled),
    so a name with a newline in it stays inside its comment and can never start a key."""
    return _COMMENT_UNSAFE.sub(
        lambda m: _COMMENT_ESCAPES.get(m.group(0), f"\\u{ord(m.group(0)):04x}"), str(text))
