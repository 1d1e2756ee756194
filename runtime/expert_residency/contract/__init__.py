"""What recipegen and the runtime agree on, in one place both import (standard library only: no
numpy, torch, triton or vLLM, so recipegen's ledger and renderer read it where none is installed).

- ``sizing``: the Triton kernels' default tiles and the bytes the runtime allocates at start-up
  (kernel workspace, split-K tickets, FP8-block inputs, usage counter, step masks) — the kernels'
  objects size themselves with these functions and the ledger budgets with the same ones.
- ``env``: the ``EXPERT_RESIDENCY_*`` environment variables the renderer writes and the runtime
  reads, one line each on what they mean.
- ``metrics``: the Prometheus series the runtime exports (names, labels, help text, type), read by
  the exporter in the worker, by the rendered dashboard and alert rule, and by docs/metrics.md.
- ``expert_formats``: the expert-format constants both sides name (gpt-oss's SwiGLU-OAI alpha and
  limit, the FP8 block).

``tests/test_layers.py`` keeps this package free of torch / triton / FlashInfer / vLLM imports.
"""
