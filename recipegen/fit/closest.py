"""Which hot count a usage-aware search tried came closest to fitting, in words. A refusal names
that count and quotes its own figures: the counts fail by different amounts (the lowest, which the
search tries last, holds the most cold experts and is usually the farthest), and an operator sizes a
host or a GPU from the shortfall printed, so it must be the least any count tried needs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from recipegen.common.units import format_bytes
from recipegen.fit.judged import Evaluation, Problem


@dataclass(frozen=True)
class Tried:
    """One hot count per layer, at the load offload the search gave it, and how it was judged."""

    hot: int
    offload_gib: int
    evaluation: Evaluation


def distance(tried: Tried) -> tuple[int, float, int]:
    """How far a count is from fitting: the fewest budgets broken, then the fewest bytes over them (a
    budget that is not one of bytes, such as the runtime refusing the split, counts as farthest),
    then the most hot experts (the faster split)."""
    problems = tried.evaluation.problems
    over = sum(math.inf if p.over_bytes is None else p.over_bytes for p in problems)
    return len(problems), over, -tried.hot


def closest_text(tried: Sequence[Tried]) -> str:
    """The closest count and what it breaks; where a count that breaks more budgets comes nearer on
    one of them, that count and its shortfall too (so no shortfall printed overstates the least)."""
    best = min(tried, key=distance)
    text = (f"the closest to fitting, {best.hot} hot per layer (--cpu-offload-gb {best.offload_gib} at load), "
            "breaks " + "; ".join(p.text() for p in best.evaluation.problems))
    notes = []
    for problem in best.evaluation.problems:
        if problem.over_bytes is None:
            continue
        nearer = [(other.over_bytes, t) for t in tried if t is not best for other in t.evaluation.problems
                  if other.kind == problem.kind and other.over_bytes is not None
                  and other.over_bytes < problem.over_bytes]
        if nearer:
            over, t = min(nearer, key=lambda x: (x[0], -x[1].hot))
            others = sorted((p for p in t.evaluation.problems if p.kind != problem.kind), key=lambda p: p.kind)
            shared = [_shortfall(p) for p in others if p.kind in best.evaluation.kinds()]
            extra = [_shortfall(p) for p in others if p.kind not in best.evaluation.kinds()]
            parts = ([_and(shared)] if shared else []) + ([f"{_and(extra)} too"] if extra else [])
            notes.append(f"{t.hot} hot per layer is only {format_bytes(over)} over [{problem.kind}]"
                         + (f" but {', and '.join(parts)}" if parts else ""))
    return text + (f" ({'; '.join(notes)})" if notes else "")


def _shortfall(problem: Problem) -> str:
    """A budget broken, with by how much where it is one of bytes."""
    if problem.over_bytes is None:
        return f"breaks [{problem.kind}]"
    return f"{format_bytes(problem.over_bytes)} over [{problem.kind}]"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
