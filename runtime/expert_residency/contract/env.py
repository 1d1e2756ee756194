"""The environment variables of the runtime: the renderer writes them into a lane's service, the
plugin and the dump writer read them (``vllm_plugin.settings``, ``core.dump``, ``core.adaptive_setup``,
``blackwell.select``). One definition of each name, with what it means."""

from __future__ import annotations

PREFIX = "EXPERT_RESIDENCY_"
"""Every variable of the runtime starts with this (render refuses a recipe's own env with it)."""

MODE = "EXPERT_RESIDENCY_MODE"
"""``off`` (default) | ``count`` (count every routed pick; vLLM's kernel serves) | ``residency``
(hot/cold banks per the row map) | ``unsplit`` (every expert in one bank: the bit-identity reference)."""
ROWMAP = "EXPERT_RESIDENCY_ROWMAP"
"""The row-map file inside the container (residency; optional for count / unsplit)."""
CONTENT_HASH = "EXPERT_RESIDENCY_CONTENT_HASH"
"""The ``content_hash`` the row map must have (residency: required; a changed file is refused)."""
DUMP_DIR = "EXPERT_RESIDENCY_DUMP_DIR"
"""Folder the usage-histogram dumps are written to (mounted from the host)."""
DUMP_INTERVAL_S = "EXPERT_RESIDENCY_DUMP_INTERVAL_S"
"""Seconds between histogram snapshots (default 60; 0: only on request and at shutdown)."""
LANE = "EXPERT_RESIDENCY_LANE"
"""The lane's name (start-up report line, dump file names)."""
CLASS = "EXPERT_RESIDENCY_CLASS"
"""The active traffic class (start-up report line, dump file names)."""
PER_PICK = "EXPERT_RESIDENCY_PER_PICK"
"""The per-pick expert function of the CPU split path: ``auto`` (default), ``cpu``, ``modular``
(vLLM's modular kernel per pick)."""
ADAPTIVE = "EXPERT_RESIDENCY_ADAPTIVE"
"""Adaptive residency: unset / ``off`` = off, ``on`` = defaults, else ``name=value,...`` over
``AdaptiveConfig``'s fields."""
ADAPTIVE_PRIORS = "EXPERT_RESIDENCY_ADAPTIVE_PRIORS"
"""Comma-separated class histograms the adaptive policy starts from as priors."""
BANK_KERNEL = "EXPERT_RESIDENCY_BANK_KERNEL"
"""The MXFP4 bank kernel (``auto`` default, ``flashinfer-trtllm``, ``triton``, ``triton-dot-scaled``,
``torch-reference``): ``blackwell.select``."""

METRICS = "EXPERT_RESIDENCY_METRICS"
"""Prometheus metrics from the worker: unset / ``off`` = none, ``on`` = the ``expert_residency_*``
series (``contract.metrics``) reach the lane's ``/metrics`` through prometheus_client's multiprocess
folder, which ``PROMETHEUS_MULTIPROC_DIR`` must name (docs/metrics.md)."""
METRICS_INTERVAL_S = "EXPERT_RESIDENCY_METRICS_INTERVAL_S"
"""Seconds between two reads of the usage counter for the metrics (default 15; > 0): a background
thread reads the device counts off the step path and updates the series."""
METRICS_WINDOW_S = "EXPERT_RESIDENCY_METRICS_WINDOW_S"
"""Seconds the window gauges (cold share, hot-hit ratio per layer) cover (default 300; >= the
read interval)."""
PREDICTED_COLD_SHARE = "EXPERT_RESIDENCY_PREDICTED_COLD_SHARE"
"""The cold share the recipe's ledger projects for the active class (its row map on its
histogram, as ``recipegen check budgets`` prints it), in [0, 1]: exported as
``expert_residency_predicted_cold_share`` so that drift is one PromQL expression. Unset: not
exported (the class declares no histogram)."""

ALL = (MODE, ROWMAP, CONTENT_HASH, DUMP_DIR, DUMP_INTERVAL_S, LANE, CLASS, PER_PICK, ADAPTIVE,
       ADAPTIVE_PRIORS, BANK_KERNEL, METRICS, METRICS_INTERVAL_S, METRICS_WINDOW_S, PREDICTED_COLD_SHARE)
