"""The public field reports the cost model's measured inputs come from, as users cite them
(title and date). One home: calibration, steps, unique_experts and the printed tables read these."""

PIN_REPORT = "the field report \"vLLM: Pin Hot Experts\" (2026-09-17)"
PREFETCH_REPORT = ("the field report \"Should a GB300 Prefetch Its Cold Experts? Mostly No, and What to "
                   "Build Instead\" (2026-10-23)")
# Undated; published before the 2026-09-17 report, which follows up on it.
OFFLOAD_REPORT = "the field report \"Offload by Expert on GB300: The Skew Is Real, the Kernel Is Not\" (undated)"
