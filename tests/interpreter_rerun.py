"""Triton-interpreter tests in a process that already imported Triton without
``TRITON_INTERPRET=1``: ``triton.language``'s own helpers (``tl.sort``, ``tl.cumsum``) and the
runtime's kernels are then compiled-mode functions the interpreter cannot call, so such a test
runs itself again in a fresh process with the variable set (tests import this module directly)."""

from __future__ import annotations

import os
import subprocess
import sys

from tiers import require_tier_marker


def rerun_interpreted(test_file: str, test_id: str, *, only_if_triton_imported: bool = True) -> bool:
    """True after running ``test_file::test_id`` in a fresh ``TRITON_INTERPRET=1`` pytest process
    (asserting it passed); False when this process can run it itself: the variable is already
    set, or (``only_if_triton_imported``) Triton is not imported yet. Only in a test marked
    ``interpreter`` (tests/conftest.py gives it to every test that calls this)."""
    require_tier_marker("interpreter", "the Triton interpreter")
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if only_if_triton_imported and "triton" not in sys.modules:
        return False
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"{test_file}::{test_id}"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return True
