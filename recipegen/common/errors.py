"""Errors a user sees: one clear message, never a traceback."""

from __future__ import annotations


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
        where = ""
        if file:
            where = f"{file}:{line}" if line else f"{file}"
        parts = [p for p in (where, f"field '{field}'" if field else "") if p]
        prefix = ": ".join(parts)
        super().__init__(f"{prefix}: {message}" if prefix else message, exit_code=2)
        self.file, self.line, self.field = file, line, field
