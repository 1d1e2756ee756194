"""Triton-interpreter tests in a process that already imported Triton without
``TRITON_INTERPRET=1``: ``triton.language``'s own helpers (``tl.sort``, ``tl.cumsum``) and the
runtime's kernels are then compiled-mode functions the interpreter cannot call, so such a test
runs again in a fresh process with the variable set (tests import this module directly).

One fresh process for all of them: the first interpreter test of the session that needs one runs
every interpreter test pytest selected (tests/conftest.py lists them in ``tiers``) in a single
``TRITON_INTERPRET=1`` pytest process, on two workers where pytest-xdist is installed, and each
test then asserts its own outcome there. A process per test paid Python, torch and Triton's start
(seconds) 22 times over. This module is also that process's pytest plugin (``-p
interpreter_rerun``): it writes each test's outcome to ``BATCH_OUT_ENV``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import tiers
from tiers import require_tier_marker

REPO_ROOT = Path(__file__).resolve().parent.parent
BATCH_OUT_ENV = "RECIPEGEN_INTERPRETER_BATCH_OUT"
_outcomes: dict[str, dict] | None = None   # node id -> {"outcome", "text"} of the batch process


def rerun_interpreted(test_file: str, test_id: str, *, only_if_triton_imported: bool = True) -> bool:
    """True after ``test_file::test_id`` ran in a fresh ``TRITON_INTERPRET=1`` pytest process
    (asserting it passed there); False when this process can run it itself: the variable is
    already set, or (``only_if_triton_imported``) Triton is not imported yet. Only in a test
    marked ``interpreter`` (tests/conftest.py gives it to every test that calls this)."""
    require_tier_marker("interpreter", "the Triton interpreter")
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if only_if_triton_imported and "triton" not in sys.modules:
        return False
    nodeid = f"{Path(test_file).resolve().relative_to(REPO_ROOT).as_posix()}::{test_id}"
    batch = list(tiers.SELECTED_INTERPRETER_TESTS)
    if nodeid not in batch:          # not selected through tests/conftest.py: on its own
        batch = [nodeid]
    global _outcomes
    if _outcomes is None or nodeid not in _outcomes:
        _outcomes = {**(_outcomes or {}), **_run_batch(batch)}
    got = _outcomes[nodeid]
    if got["outcome"] == "skipped":
        import pytest

        pytest.skip(f"under TRITON_INTERPRET=1: {got['text'][-500:]}")
    assert got["outcome"] == "passed", f"{nodeid} {got['outcome']} under TRITON_INTERPRET=1:\n" \
        + got["text"][-6000:]
    return True


def interpreter_only_marks(*gpu_tests: str) -> list:
    """The ``pytestmark`` of a file of interpreter tests: skip without Triton, and where a GPU is
    present, since ``gpu_tests`` (named in both reasons) check the compiled kernels there. Call
    after ``pytest.importorskip("torch")``."""
    import importlib.util

    import pytest
    import torch

    named = " and ".join(gpu_tests)
    checks = "checks" if len(gpu_tests) == 1 else "check"
    return [
        pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                           reason=f"needs Triton for TRITON_INTERPRET=1 (the H200 runs {named} on the real kernels)"),
        pytest.mark.skipif(torch.cuda.is_available(),
                           reason=f"a GPU is present: {named} {checks} the compiled kernels instead"),
    ]


def _run_batch(nodeids: list[str]) -> dict[str, dict]:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "outcomes.jsonl"
        env = dict(os.environ, TRITON_INTERPRET="1", **{BATCH_OUT_ENV: str(out)})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT / "tests"),
                                                         env.get("PYTHONPATH")]))
        workers = ["-n", "2"] if len(nodeids) > 1 and _has_xdist() else []
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "-p", "interpreter_rerun", *workers, *nodeids], cwd=REPO_ROOT,
                              env=env, capture_output=True, text=True)
        outcomes: dict[str, dict] = {}
        if out.exists():
            for line in out.read_text().splitlines():
                rec = json.loads(line)
                if rec["outcome"] != "passed" or rec["nodeid"] not in outcomes:
                    outcomes[rec["nodeid"]] = rec
    tail = done.stdout[-4000:] + done.stderr[-2000:]
    for nodeid in nodeids:    # a crash of the process fails every test it did not report
        outcomes.setdefault(nodeid, {"outcome": "not reported", "text": tail})
    return outcomes


def _has_xdist() -> bool:
    import importlib.util

    return importlib.util.find_spec("xdist") is not None


_XDIST_WORKER = False


def pytest_configure(config) -> None:
    global _XDIST_WORKER
    _XDIST_WORKER = hasattr(config, "workerinput")   # the controller writes the outcomes


def pytest_runtest_logreport(report) -> None:
    """In the interpreter process: each phase's outcome (a failed setup or teardown fails the
    test too), with its failure text."""
    path = os.environ.get(BATCH_OUT_ENV)
    if not path or _XDIST_WORKER or (report.when != "call" and report.outcome == "passed"):
        return
    with open(path, "a") as f:
        f.write(json.dumps({"nodeid": report.nodeid, "outcome": report.outcome,
                            "text": report.longreprtext}) + "\n")
