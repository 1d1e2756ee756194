"""bench/context_allowance.py measures the ledger's assumed load-time allowance on a GPU; it runs where
recipegen's dependencies may be absent, so it carries the figure itself — this keeps the two equal."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from recipegen.ledger.reserves import LOAD_CONTEXT_ALLOWANCE

BENCH = Path(__file__).resolve().parent.parent / "bench" / "context_allowance.py"


def test_the_bench_checks_the_allowance_the_ledger_adds() -> None:
    spec = importlib.util.spec_from_file_location("context_allowance", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports no GPU library at module level
    assert module.ALLOWANCE_ASSUMED == LOAD_CONTEXT_ALLOWANCE
