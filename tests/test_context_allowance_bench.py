"""bench/context_allowance.py measures the ledger's load-time allowance on a GPU; it runs where
recipegen's dependencies may be absent, so it carries the figure itself — this keeps the two equal."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from recipegen.ledger.reserves import LOAD_CONTEXT_ONE_GPU, LOAD_CONTEXT_WITH_NCCL, load_context_allowance

BENCH = Path(__file__).resolve().parent.parent / "bench" / "context_allowance.py"


def test_the_bench_checks_the_allowance_the_ledger_adds() -> None:
    spec = importlib.util.spec_from_file_location("context_allowance", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports no GPU library at module level
    assert module.ALLOWANCE_ONE_GPU == LOAD_CONTEXT_ONE_GPU == load_context_allowance(1)
    assert module.ALLOWANCE_WITH_NCCL == LOAD_CONTEXT_WITH_NCCL == load_context_allowance(8)
    # the measured run (one H100 80GB HBM3, 2026-12-05, context_allowance.json): 751,632,384 B on one
    # GPU, 1,343,029,248 B with NCCL; the ledger's figures are those rounded up to 64 MiB
    step = 64 * 2**20
    assert LOAD_CONTEXT_ONE_GPU == -(-751_632_384 // step) * step
    assert LOAD_CONTEXT_WITH_NCCL == -(-1_343_029_248 // step) * step
