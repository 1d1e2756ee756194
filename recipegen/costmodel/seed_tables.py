"""The field reports' hand-computed tables, as printed, for tests and docs to reproduce.

"Should a GB300 Prefetch Its Cold Experts? Mostly No, and What to Build Instead" (2026-10-23), Figure 3: time per token spent
reading cold experts over C2C = 40 layers × 6 picks × cold share × 17.92 MiB ÷ 340 GB/s,
as a share of a 14.6 ms one-user step. Section 4 / Figure 4: the price of a 3-slot-per-layer
prefetch bank.
"""

from __future__ import annotations

from dataclasses import dataclass

from recipegen.costmodel.reports import PREFETCH_REPORT
from recipegen.costmodel.steps import STEP_C1_K5_USAGE_AWARE

FIGURE3_SOURCE = f"{PREFETCH_REPORT}, Figure 3"
FIGURE3_STEP_S = STEP_C1_K5_USAGE_AWARE.seconds  # the 14.6 ms one-user step (steps.py is its home)


@dataclass(frozen=True)
class Figure3Row:
    label: str
    cold_share: float
    printed_ms: str      # as printed: "3.2", "0.36"
    printed_share: str   # percent of the step, as printed: "22", "2.5"


FIGURE3_ROWS: tuple[Figure3Row, ...] = (
    Figure3Row("old map, by position", 0.24, "3.2", "22"),
    Figure3Row("usage map 295/89, right traffic", 0.027, "0.36", "2.5"),
    Figure3Row("usage map 295/89, wrong traffic (agent map on prose)", 0.205, "2.7", "19"),
    Figure3Row("bigger future model, 30% cold", 0.30, "4.0", "27"),
    Figure3Row("bigger future model, 50% cold", 0.50, "6.6", "45"),
)

PREFETCH_SOURCE = f"{PREFETCH_REPORT}, section 4 and Figure 4"
PREFETCH_SLOTS_PER_LAYER = 3
PREFETCH_PRINTED = {"experts": "120", "bank_gib": "2.1", "kv_tokens_m": "1.09", "share_pct": "43",
                    "pool_gib": "4.9", "pool_tokens_m": "2.54"}


def printed_like(value: float, printed: str) -> str:
    """Format `value` with as many decimals as the field reports printed."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return f"{value:.{decimals}f}"
