"""A ledger figure: a value with the formula and operands that produced it (for `--explain`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from recipegen.common.units import GiB, MiB, format_tokens

# "bytes/token" is a rate of bytes, not a count: --json readers convert by the unit they are given
Unit = Literal["bytes", "tokens", "count", "ratio", "sequences", "bytes/s", "bytes/token"]


@dataclass(frozen=True)
class Figure:
    """One ledger figure. `value` is in bytes for sizes (never GiB)."""

    key: str
    """Stable machine name, e.g. `hbm.kv_pool`."""
    label: str
    """What it is, for people."""
    value: float
    unit: Unit
    formula: str
    """How it was computed, in words and symbols ("" for an input)."""
    operands: dict[str, Any] = field(default_factory=dict)
    """Named inputs of the formula, with their values (bytes for sizes)."""
    note: str = ""
    """Provenance: 'measured input (…)', 'back-solved', 'approximation: …'."""

    @property
    def gib(self) -> float:
        return self.value / GiB

    def display(self) -> str:
        if self.unit == "bytes":
            if 0 < abs(self.value) < GiB / 8:
                return f"{self.value / MiB:,.2f} MiB ({int(self.value):,} B)"
            return f"{self.value / GiB:,.2f} GiB"
        if self.unit == "tokens":
            if float(self.value).is_integer() and self.key == "kv.max_model_len":
                return f"{int(self.value):,} tokens"
            return f"{format_tokens(self.value)} tokens"
        if self.unit == "ratio":
            return f"{self.value * 100:.4g}%"     # shares print as % everywhere else in the output
        if self.unit == "bytes/s":
            return f"{self.value / 1e9:,.1f} GB/s"
        if float(self.value).is_integer():
            return f"{int(self.value):,}"
        return f"{self.value:,.2f}"

    def explain(self) -> str:
        parts = [f"{self.label} = {self.display()}"]
        if self.formula:
            ops = ", ".join(f"{k}={_fmt_operand(k, v)}" for k, v in self.operands.items())
            parts.append(f"    = {self.formula}" + (f"   [{ops}]" if ops else ""))
        if self.note:
            parts.append(f"    ({self.note})")
        return "\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"label": self.label, "value": self.value, "unit": self.unit}
        if self.unit == "bytes":
            out["gib"] = self.value / GiB
        out["formula"] = self.formula
        out["operands"] = self.operands
        if self.note:
            out["note"] = self.note
        return out


def _fmt_operand(name: str, value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and (
            name.endswith("bytes") or name.endswith("_b")) and abs(value) >= 2**20:
        return f"{value / GiB:,.4f} GiB"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
