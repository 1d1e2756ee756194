"""Click parameter types the standard ones leave open."""

from __future__ import annotations

import math
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
