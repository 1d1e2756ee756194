"""A ledger figure: a value with the formula and operands that produced it (for `--explain`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from recipegen.common.units import GiB, MiB, format_tokens

# "bytes/token" is a rate of bytes, not a count, and "tokens/GiB" one of tokens: --json readers convert by
# the unit they are given
Unit = Literal["bytes", "tokens", "count", "ratio", "sequences", "bytes/s", "bytes/token", "tokens/GiB"]


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
                return f"{_size(self.value)} ({_exact(self.value)} B)"
            return _size(self.value)
        if self.unit == "tokens":
            # a whole count (max_model_len, a block) exactly; a pool's tokens, a quotient, rounded
            if isinstance(self.value, int):
                return f"{self.value:,} tokens"
            return f"{format_tokens(self.value)} tokens"
        if self.unit == "bytes/token":
            return f"{_exact(self.value)} B/token"
        if self.unit == "tokens/GiB":
            return format_operand("tokens_per_gib", self.value)   # as its operands print
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
            ops = ", ".join(f"{k}={format_operand(k, v)}" for k, v in self.operands.items())
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


def _size(value: float) -> str:
    """A size as figures print it: GiB, or MiB below 1/8 GiB."""
    if 0 < abs(value) < GiB / 8:
        return f"{value / MiB:,.2f} MiB"
    return f"{value / GiB:,.2f} GiB"


def _exact(value: float) -> str:
    """A number to the unit: whole numbers in full, others to two decimals."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.2f}"


_TOKEN_OPERANDS = ("max_model_len", "window", "chunk", "block_rounding", "tokens_held", "align")


def operand_unit(name: str) -> str:
    """The unit of an operand, from its name (the one rule `explain` prints by):
    `tokens/GiB` for names with `tokens_per_gib`; `B/token` for bytes named per token; `B` for any other name
    with a `bytes` part (or ending `_b`); `tokens` for names ending `tokens` and max_model_len,
    window, chunk, block_rounding, tokens_held, align; "" (a count or a ratio) otherwise."""
    parts = name.split("_")
    if "tokens_per_gib" in name:
        return "tokens/GiB"
    if "bytes" in parts and "per_token" in name:
        return "B/token"
    if "bytes" in parts or name.endswith("_b"):
        return "B"
    if name.endswith("tokens") or name in _TOKEN_OPERANDS:
        return "tokens"
    return ""


def format_operand(name: str, value: Any) -> str:
    """An operand as `explain` prints it. Numbers carry their unit (`operand_unit`); sizes print in
    exact bytes, with the GiB (or MiB) figure beside them from 1 MiB up, so integer arithmetic (a
    ceil, a floor) can be redone from the text; lists print each element by the same rule."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_operand(name, v) for v in value) + "]"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    unit = operand_unit(name)
    if unit == "B":
        text = f"{_exact(value)} B"
        return text + (f" ({_size(value)})" if abs(value) >= MiB else "")
    if unit == "tokens/GiB":
        return f"{value:,.1f} tokens/GiB"
    if unit:
        return f"{_exact(value)} {unit}"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.6g}"
