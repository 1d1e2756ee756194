"""Shared pieces of the recipe language: a strict base model and unit-carrying field types."""

from __future__ import annotations

from typing import Annotated, Any, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, WithJsonSchema

from recipegen.common.units import (
    UnitError,
    parse_bandwidth,
    parse_bytes,
    parse_positive_count,
    parse_scaled_number,
)


class StrictModel(BaseModel):
    """Unknown fields are errors; each field's docstring is its description (JSON Schema, docs)."""

    # strict: a YAML `true` is not the integer 1 nor a port, a string is not a number;
    # no NaN/inf: a non-finite figure would poison every sum it enters.
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=False,
                              validate_default=True, strict=True, allow_inf_nan=False)


def reachable_models(root: type[StrictModel]) -> list[type[StrictModel]]:
    """`root` and every model its fields can hold (nested in lists, unions, optionals), each
    once, in first-reached depth-first order."""
    order: list[type[StrictModel]] = []

    def visit(model: type[StrictModel]) -> None:
        if model in order:
            return
        order.append(model)
        for info in model.model_fields.values():
            for arg in _nested_models(info.annotation):
                visit(arg)
    visit(root)
    return order


def _nested_models(annotation: Any) -> list[type[StrictModel]]:
    found: list[type[StrictModel]] = []
    if isinstance(annotation, type) and issubclass(annotation, StrictModel):
        found.append(annotation)
    for arg in get_args(annotation):
        found.extend(_nested_models(arg))
    return found


class PathError(ValueError):
    """A cross-field error that belongs to a sub-field: `path` is appended to the error's location."""

    def __init__(self, message: str, path: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.path = path


def _bytes_any(value: Any) -> int:
    n = parse_bytes(value)
    if n < 0:
        raise UnitError(f"size must not be negative, got {value!r}")
    return n


def _bytes_positive(value: Any) -> int:
    n = parse_bytes(value)
    if n <= 0:
        raise UnitError(f"size must be positive, got {value!r}")
    return n


def _bandwidth_positive(value: Any) -> float:
    bw = parse_bandwidth(value)
    if bw <= 0:
        raise UnitError(f"bandwidth must be positive, got {value!r}")
    return bw


def _count(value: Any) -> int:
    if isinstance(value, float):
        # YAML reads 1.5e4 or 32768.0 as a float; vLLM's --max-model-len takes digits and suffixes only
        raise UnitError(f"write a whole number (32768) or vLLM's suffixes (32K), not a float ({value!r})")
    return parse_positive_count(value)


def _scaled_positive(value: Any) -> float:
    x = parse_scaled_number(value)
    if x <= 0:
        raise UnitError(f"must be positive, got {value!r}")
    return x


_SIZE_SCHEMA = {"type": "string", "pattern": r"^\s*[0-9][0-9_,.]*\s*(B|KiB|MiB|GiB|TiB|kB|KB|MB|GB|TB)\s*$",
                "examples": ["60 GiB", "141 GB", "18800640 B"]}

Bytes = Annotated[int, BeforeValidator(_bytes_any), WithJsonSchema(
    {**_SIZE_SCHEMA, "description": "A size with its unit (GiB = 2^30 bytes, GB = 10^9); zero allowed."})]
"""A size in bytes, written with a unit ('60 GiB'); 0 allowed."""

PositiveBytes = Annotated[int, BeforeValidator(_bytes_positive), WithJsonSchema(
    {**_SIZE_SCHEMA, "description": "A positive size with its unit (GiB = 2^30 bytes, GB = 10^9)."})]
"""A positive size in bytes, written with a unit."""

Bandwidth = Annotated[float, BeforeValidator(_bandwidth_positive), WithJsonSchema(
    {"type": "string", "pattern": r"^\s*[0-9][0-9_,.]*\s*(B|KiB|MiB|GiB|TiB|kB|KB|MB|GB|TB)/s\s*$",
     "examples": ["340 GB/s", "4.2 TB/s"],
     "description": "A positive bandwidth with its unit, in bytes per second (GB/s = 10^9 B/s)."})]
"""A bandwidth in bytes per second, written with a unit ('340 GB/s')."""

TokenCount = Annotated[int, BeforeValidator(_count), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 1},
               {"type": "string", "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*[kKmMgG]?\s*$"}],
     "examples": [1048576, "1M", "128k"],
     "description": "A positive whole number (1 or more, at most 2^53; not a float such as 32768.0), or text: "
                    "digits with an optional vLLM suffix, k/m/g decimal (x 10^3 / 10^6 / 10^9; a fraction allowed, "
                    "25.6k = 25600) or K/M/G binary (x 2^10 / 2^20 / 2^30; whole numbers only, 1M = 1048576)."})]
"""A positive whole number that may use vLLM's k/K/m/M suffixes."""

ScaledNumber = Annotated[float, BeforeValidator(_scaled_positive), WithJsonSchema(
    {"anyOf": [{"type": "number", "exclusiveMinimum": 0},
               {"type": "string", "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*[kKmM]?\s*$"}],
     "examples": [518000, "0.518M"]})]
"""A positive number that may carry a decimal k/M suffix ('0.518M' = 518000)."""
