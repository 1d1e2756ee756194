"""A figure with its formula and operands, so every number can be explained (`--explain`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Operand:
    """One named input of a formula, with where it came from."""

    name: str
    value: float
    unit: str = ""
    source: str = ""

    def describe(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        source = f"  [{self.source}]" if self.source else ""
        return f"{self.name} = {_fmt(self.value)}{unit}{source}"


@dataclass(frozen=True)
class Figure:
    """A derived number: value, unit, the formula that made it and the operands it used."""

    name: str
    value: float
    unit: str
    formula: str
    operands: tuple[Operand, ...] = field(default_factory=tuple)

    def explain(self) -> str:
        lines = [f"{self.name} = {display(self.value, self.unit)}", f"  = {self.formula}"]
        lines += [f"    {operand.describe()}" for operand in self.operands]
        return "\n".join(lines)


def display(value: float, unit: str) -> str:
    """A figure's value for people: bytes with MiB, seconds as ms, a bare share as a percentage."""
    if unit == "B":
        return f"{value:,.0f} B ({value / 2**20:,.1f} MiB)"
    if unit == "s":
        return f"{value * 1e3:.3f} ms"
    if unit == "" and 0 <= value <= 1:
        return f"{value:.2%}"
    return f"{_fmt(value)} {unit}".rstrip()


def _fmt(value: float) -> str:
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:,.6g}"
