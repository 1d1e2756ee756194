"""Which fitting placement `fit` takes, and the line that says why the others were not taken.

The higher speed figure wins; equal figures go to the larger KV pool, then to the placement tried
first (usage-aware before positional). Figures that differ only by floating-point rounding are
equal: two placements that leave every expert cold compute the same estimate by different sums,
and the last bits must not decide between them. The line never calls a placement faster for a
difference its printed figures do not show.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from recipegen.fit.judged import Candidate
from recipegen.fit.objective import ESTIMATE, Projection

# Relative difference below which two speed figures are the same figure (rounding, not speed).
SAME_SPEED = 1e-9


def same_speed(a: float, b: float) -> bool:
    """Two scores that differ by rounding only."""
    return math.isclose(a, b, rel_tol=SAME_SPEED, abs_tol=1e-12)


def choose(candidates: Sequence[Candidate]) -> Candidate:
    """The fastest; among the same speed, the most KV (whole tokens); among those, the first tried."""
    top = max(c.projection.score for c in candidates)
    fastest = [c for c in candidates if same_speed(c.projection.score, top)]
    return max(fastest, key=lambda c: round(c.kv_tokens))   # max keeps the first of equals


def shown(projection: Projection) -> str:
    """The speed figure as printed, without its band (what a reader compares)."""
    return projection.text.split(" (")[0]


def _unrounded(projection: Projection, digits: int) -> str:
    if projection.kind == ESTIMATE and projection.tokens_per_s is not None:
        return f"{projection.tokens_per_s:,.{digits}f} tok/s"
    return f"{-projection.score:,.{digits}f} ms of link reads"


def not_chosen_text(chosen: Candidate, other: Candidate) -> str:
    """Why `other`, which fits too, was not taken: in the words of the rule that decided."""
    mine, theirs = chosen.projection, other.projection
    if shown(mine) != shown(theirs):
        return f"{mine.text} is faster"
    if not same_speed(mine.score, theirs.score):
        # decided before rounding: print enough digits to show it, and say how small it is
        digits = next((d for d in range(2, 7) if _unrounded(mine, d) != _unrounded(theirs, d)), 6)
        return (f"the same {shown(mine)} at the printed precision; chosen on the estimate before rounding "
                f"({_unrounded(mine, digits)} against {_unrounded(theirs, digits)}), a difference below the "
                "printed precision")
    if round(chosen.kv_tokens) != round(other.kv_tokens):
        return (f"the same speed ({mine.text}); chosen for its larger KV pool "
                f"({round(chosen.kv_tokens):,} tokens against {round(other.kv_tokens):,})")
    return (f"the same speed ({mine.text}) and KV pool; chosen as the placement tried first "
            "(usage-aware before positional)")
