"""Quantities with units: parsing and formatting (pure, no I/O).

Bytes are integers internally. GiB = 2**30, GB = 10**9 (docs/design.md "Numbers and units").
Bandwidths are bytes per second (floats). A bare number where a unit is needed is an error:
"60" could be GiB, GB or bytes, and guessing is how budgets go wrong.
"""

from __future__ import annotations

import math
import re

KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40
KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12

BYTE_UNITS: dict[str, int] = {
    "B": 1,
    "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB,
    "KB": KB, "kB": KB, "MB": MB, "GB": GB, "TB": TB,
}
# Bandwidth units: bytes per second.
BANDWIDTH_UNITS: dict[str, int] = {f"{unit}/s": factor for unit, factor in BYTE_UNITS.items()}

# ASCII digits only ([0-9], not \d): the published JSON Schema allows nothing else.
_NUMBER = r"(?P<num>[+-]?(?:[0-9]+(?:[_,][0-9]{3})*(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
_QUANTITY_RE = re.compile(rf"^\s*{_NUMBER}\s*(?P<unit>[A-Za-z]+(?:/s)?)?\s*$")
# A leading minus is read (vLLM's int() reads '-5' too) so that a negative count is refused as
# not positive (`parse_positive_count`) rather than as unreadable; a plus is not (vLLM refuses
# '+32k': utils/argparse_utils.py:42, 74; the published JSON Schema's pattern has no sign).
_COUNT_RE = re.compile(r"^\s*(?P<sign>-?)(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<suffix>[kKmMgG]?)\s*$")
# Bounds far above any real figure (a GB300 has ~0.25 TiB of HBM, its host ~0.5 TiB), below
# where float arithmetic or an allocation sized from the figure would go wrong.
MAX_BYTES = 2**60          # 1 EiB
MAX_BANDWIDTH = 1e18       # 1 EB/s
MAX_COUNT = 2**53          # exact in a float


class UnitError(ValueError):
    """A quantity that cannot be read: no unit, unknown unit, not a number."""


def _split(text: object, what: str, units: dict[str, int], example: str) -> tuple[float, int]:
    if isinstance(text, bool):
        raise UnitError(f"expected {what} with a unit (e.g. '{example}'), got {text!r}")
    if isinstance(text, (int, float)):
        raise UnitError(f"missing unit: {text!r} needs a unit (e.g. '{example}'); "
                        f"known units: {', '.join(units)}")
    if not isinstance(text, str):
        raise UnitError(f"expected {what} with a unit (e.g. '{example}'), got {type(text).__name__}")
    match = _QUANTITY_RE.match(text)
    if not match:
        raise UnitError(f"cannot read {text!r} as {what} (e.g. '{example}')")
    unit = match.group("unit")
    if unit is None:
        raise UnitError(f"missing unit: {text!r} needs a unit (e.g. '{example}'); "
                        f"known units: {', '.join(units)}")
    if unit not in units:
        raise UnitError(f"unknown unit {unit!r} in {text!r}; known units: {', '.join(units)}")
    number = float(match.group("num").replace("_", "").replace(",", ""))
    if not math.isfinite(number):
        raise UnitError(f"{text!r} is not a finite number")
    return number, units[unit]


def parse_bytes(text: object) -> int:
    """'60 GiB' -> 64424509440. Rounds to the nearest byte (catalog figures have 2 decimals)."""
    number, factor = _split(text, "a size", BYTE_UNITS, "60 GiB")
    if abs(number * factor) > MAX_BYTES:
        raise UnitError(f"{text!r} is beyond any real size (at most 1 EiB)")
    return int(round(number * factor))


def parse_bandwidth(text: object) -> float:
    """'340 GB/s' -> 3.4e11 bytes per second."""
    number, factor = _split(text, "a bandwidth", BANDWIDTH_UNITS, "340 GB/s")
    if abs(number * factor) > MAX_BANDWIDTH:
        raise UnitError(f"{text!r} is beyond any real bandwidth (at most 1 EB/s)")
    return number * factor


def parse_count(value: object) -> int:
    """An integer count (see `_parse_count`), at most `MAX_COUNT`."""
    n = _parse_count(value)
    if abs(n) > MAX_COUNT:
        raise UnitError(f"{value!r} is beyond any real count (at most 2^53)")
    return n


def _parse_count(value: object) -> int:
    """An integer count, optionally with vLLM's suffixes ('1M' = 2**20, '1m' = 10**6, '25.6k').

    Mirrors vllm.utils.argparse_utils.human_readable_int so a recipe means what vLLM means.
    """
    if isinstance(value, bool):
        raise UnitError(f"expected a whole number, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise UnitError(f"expected a whole number, got {value!r}")
    if not isinstance(value, str):
        raise UnitError(f"expected a whole number, got {type(value).__name__}")
    match = _COUNT_RE.match(value)
    if not match:
        raise UnitError(f"cannot read {value!r} as a whole number (e.g. 1048576, '1M' or '128k')")
    number, suffix = match.group("num"), match.group("suffix")
    sign = -1 if match.group("sign") == "-" else 1
    if not suffix:
        if "." in number:
            raise UnitError(f"expected a whole number, got {value!r}")
        return sign * int(number)
    if suffix in "kmg":
        return sign * int(float(number) * {"k": KB, "m": MB, "g": GB}[suffix])
    if "." in number:
        raise UnitError(f"decimals are not allowed with binary suffix {suffix!r} in {value!r} "
                        f"(vLLM refuses them too); did you mean {number}{suffix.lower()}?")
    return sign * int(number) * {"K": KiB, "M": MiB, "G": GiB}[suffix]


def parse_positive_count(value: object) -> int:
    """A count that must be at least 1 (a token count, max_model_len): zero and negative numbers
    are refused alike, as not positive."""
    n = parse_count(value)
    if n <= 0:
        raise UnitError(f"must be positive, got {value!r}")
    return n


def parse_scaled_number(value: object) -> float:
    """A plain positive quantity that may carry a k/M suffix (decimal): '0.518M' -> 518000.0."""
    if isinstance(value, bool):
        raise UnitError(f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or abs(value) > MAX_COUNT:
            raise UnitError(f"expected a finite number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise UnitError(f"expected a number, got {type(value).__name__}")
    match = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmM]?)\s*$", value)
    if not match:
        raise UnitError(f"cannot read {value!r} as a number (e.g. 518000 or '0.518M')")
    factor = {"": 1, "k": KB, "K": KB, "m": MB, "M": MB}[match.group(2)]
    return float(match.group(1)) * factor


def gib(n_bytes: float) -> float:
    return n_bytes / GiB


def format_bytes(n_bytes: float, unit: str = "GiB", digits: int = 2) -> str:
    """Format bytes in one unit: format_bytes(221847552000) -> '206.61 GiB'."""
    return f"{n_bytes / BYTE_UNITS[unit]:,.{digits}f} {unit}"


def format_bandwidth(bytes_per_s: float) -> str:
    for unit in ("TB", "GB", "MB"):
        if bytes_per_s >= BYTE_UNITS[unit]:
            return f"{bytes_per_s / BYTE_UNITS[unit]:g} {unit}/s"
    return f"{bytes_per_s:g} B/s"


def format_tokens(tokens: float) -> str:
    """2538000 -> '2.54M'."""
    if abs(tokens) >= 1e6:
        return f"{tokens / 1e6:.2f}M"
    if abs(tokens) >= 1e3:
        return f"{tokens / 1e3:.1f}k"
    return f"{tokens:.0f}"


def format_count(count: int, noun: str, plural: str | None = None) -> str:
    """A count with its noun in the right number: format_count(1, "stream") -> '1 stream',
    format_count(4, "stream") -> '4 streams' (one wording wherever a count is printed)."""
    return f"{count} {noun if count == 1 else (plural or noun + 's')}"


def largest_count_within(budget_bytes: float, bytes_per_item: float) -> int:
    """The rounding rule (docs/design.md 'Budget ↔ count'): a byte budget buys the largest whole count that fits."""
    if bytes_per_item <= 0:
        raise ValueError("bytes_per_item must be positive")
    return max(0, math.floor(budget_bytes / bytes_per_item + 1e-12))
