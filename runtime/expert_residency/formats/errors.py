"""The one error type of the formats module: names the file, line and field at fault."""

from __future__ import annotations

import os


class FormatError(ValueError):
    """A row map, histogram, capture or report that cannot be read or does not validate.

    `path`, `line` and `field` are set where known; the message names them, so a caller
    (the recipegen CLI, the runtime at start-up) can print it as is.
    """

    def __init__(self, message: str, *, path: str | os.PathLike[str] | None = None,
                 line: int | None = None, field: str | None = None) -> None:
        self.path = str(path) if path is not None else None
        self.line = line
        self.field = field
        self.reason = message
        where = ""
        if self.path:
            where = f"{self.path}:{line}" if line else self.path
        parts = [p for p in (where, f"field '{field}'" if field else "") if p]
        prefix = ": ".join(parts)
        super().__init__(f"{prefix}: {message}" if prefix else message)
