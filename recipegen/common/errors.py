"""Errors a user sees: one clear message, never a traceback."""

from __future__ import annotations

import re

_BREAKING = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` with line breaks and control characters as `\\uXXXX` escapes (backslashes kept)."""
    return _BREAKING.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


class RecipegenError(Exception):
    """A user-facing error. The CLI prints it and exits with `exit_code`."""

    exit_code: int = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(RecipegenError):
    """Bad input (recipe, map, histogram, flag): names file, line and field where known."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        from expert_residency.formats._io import comment_text

        # the file's name is printed escaped, the field path (already escaped by format_loc, or a
        # name typed on the command line) with its line breaks and controls escaped: a newline in
        # either cannot start a second line that reads as another message
        where = ""
        if file:
            where = f"{comment_text(file)}:{line}" if line else comment_text(file)
        parts = [p for p in (where, f"field '{one_line(field)}'" if field else "") if p]
        prefix = ": ".join(parts)
        super().__init__(f"{prefix}: {message}" if prefix else message, exit_code=2)
        self.file, self.line, self.field, self.message = file, line, field, message
