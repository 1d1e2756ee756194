"""Small shared I/O helpers: atomic writes and layer-list notation."""

from __future__ import annotations

import os
import re
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
