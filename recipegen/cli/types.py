"""Click parameter types the standard ones leave open."""

from __future__ import annotations

import math
import re
from typing import Any

import click


class FiniteFloat(click.FloatRange):
    """A float in a range, refusing NaN and ±inf: click's FloatRange lets NaN through (every
    comparison with NaN is false), and one NaN turns an estimate into NaN or a traceback."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class FileNameText(click.ParamType):
    """A name that becomes a file's name (a recipe's, model's or machine entry's): checked as the
    option, before anything is read, with the pattern's own hint. An empty value is refused too:
    it would silently mean the default. `bounded`: at most the schema's NAME_MAX_LENGTH (looked up
    when a value is given: the schema package loads pydantic, which the CLI's start-up avoids)."""

    name = "name"

    def __init__(self, what: str, *, bounded: bool = False) -> None:
        self.what = what
        self.bounded = bounded

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from recipegen.schema.patterns import FILE_NAME, NAME_MAX_LENGTH

        text = str(value)
        shown = repr(text) if len(text) <= 70 else f"{text[:60]!r}… ({len(text):,} characters)"
        if not text:
            self.fail(f"an empty {self.what} name; leave the option out for the default", param, ctx)
        if not re.fullmatch(FILE_NAME.regex, text):
            self.fail(f"{shown} is not a {self.what} name: use {FILE_NAME.hint}", param, ctx)
        if self.bounded and len(text) > NAME_MAX_LENGTH:
            self.fail(f"{shown} is not a {self.what} name: at most {NAME_MAX_LENGTH} characters", param, ctx)
        return text
