"""Performance model: fetch tax, unique experts, prefetch price, k-schedule checks, calibration.

Pure arithmetic on explicit inputs (`fetch`, `unique_experts`, `prefetch`, `kschedule`,
`calibration`); `lane` reads a loaded recipe and its ledger to feed them, and `plot` draws a
sweep (matplotlib, imported only when plotting). Budgets (HBM, host, KV tokens) come from
`recipegen.ledger`, never from here.
"""

from recipegen.costmodel.fetch import FetchTax, cold_bytes_per_step, fetch_tax
from recipegen.costmodel.figures import Figure, Operand
from recipegen.costmodel.kschedule import Finding, KScheduleCheck, check_k_schedule
from recipegen.costmodel.prefetch import PrefetchPrice, lane_prefetch_price
from recipegen.costmodel.unique_experts import UniqueExpertsModel, calibrated_model

__all__ = [
    "Figure", "Operand", "FetchTax", "cold_bytes_per_step", "fetch_tax", "Finding", "KScheduleCheck",
    "check_k_schedule", "PrefetchPrice", "lane_prefetch_price", "UniqueExpertsModel", "calibrated_model",
    "fetch_summary",
]


def __getattr__(name: str):  # lazy: the lane bridge imports the recipe and ledger modules
    if name == "fetch_summary":
        from recipegen.costmodel.lane import fetch_summary
        return fetch_summary
    raise AttributeError(name)
