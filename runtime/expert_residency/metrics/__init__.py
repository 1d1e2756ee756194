"""Prometheus metrics of the expert residency runtime (docs/metrics.md).

- ``config``: the environment (``EXPERT_RESIDENCY_METRICS``, ``_INTERVAL_S``, ``_WINDOW_S``,
  ``_PREDICTED_COLD_SHARE``, ``PROMETHEUS_MULTIPROC_DIR``), standard library only;
- ``figures``: the arithmetic over successive counter reads (numpy);
- ``reader``: the counter read off the step path (torch: a pinned copy on a side stream);
- ``exporter``: the series (prometheus_client, a vLLM dependency) and the thread that sets them.

The series' names, labels and help text are ``expert_residency.contract.metrics``. The vLLM plugin
starts the exporter in the worker (``vllm_plugin.metrics_hook``); nothing here imports vLLM.
"""
