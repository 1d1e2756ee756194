"""Performance model: decode step time and tokens/s, fetch tax, unique experts, prefetch price,
k-schedule checks, calibration.

Pure arithmetic on explicit inputs (`estimate` with the measured tables of `efficiency`, `fetch`,
`unique_experts`, `prefetch`, `kschedule`, `calibration`); `lane_estimate` and `lane` read a loaded
recipe and its ledger to feed them (`estimate_lane` is the decode estimate other commands call), and
`plot` draws a sweep (matplotlib, imported only when plotting). Budgets (HBM, host, KV tokens) come from
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
    "fetch_summary", "estimate_lane",
]


def __getattr__(name: str):  # lazy: the lane bridge imports the recipe and ledger modules
    if name == "fetch_summary":
        from recipegen.costmodel.lane import fetch_summary
        return fetch_summary
    if name == "estimate_lane":
        from recipegen.costmodel.lane_estimate import estimate_lane
        return estimate_lane
    raise AttributeError(name)
