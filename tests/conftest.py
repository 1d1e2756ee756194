"""Shared test configuration, and the test tiers.

Every test that needs something heavy carries a marker (registered in pyproject.toml, which runs
pytest with ``--strict-markers``), so ``-m "not (vllm or docker or interpreter or gpu or slow)"`` (the
``--fast`` option below; ``./scripts/test --fast``) leaves exactly the pure tier. The markers are
given here, from what a test uses, instead of by hand in each file (a hand-written marker can be
forgotten):

* ``vllm``: the file lives in ``tests/vllm/``; or the test uses one of the engine fixtures
  (``ENGINE_FIXTURES``, directly or through another fixture); or its module imports
  ``vllm_support.server`` (which starts ``vllm serve``).
* ``docker``: the test uses the ``docker_engine`` fixture (tests/docker_support).
* ``interpreter``: the test function calls ``rerun_interpreted`` / ``_rerun_interpreted``
  (tests/interpreter_rerun.py), the one way a test runs Triton kernels under
  ``TRITON_INTERPRET=1``, directly or through a function of its own module (two calls deep).
* ``gpu``: the file is named ``*_gpu.py`` or ``*_cuda.py``, or the test is skipped for want of a
  CUDA GPU (a ``skipif`` whose reason says "CUDA GPU"); by hand elsewhere. A file that skips
  itself without CUDA collects nothing on a CPU machine, so tests/test_tiers.py checks each such
  file is named or marked for the tier.
* ``slow``: a pure test listed in ``tiers.SLOW_TESTS`` or in a file of ``tiers.SLOW_FILES`` (the slowest of a measured fast-tier run,
  each with its seconds); the full suite runs it, ``--fast`` leaves it out.

Markers written by hand in a file are kept. Two guards catch a test the rule missed, at run time:
``VllmServer.start`` and ``rerun_interpreted`` refuse to run inside a test that lacks the marker
(they read ``TEST_MARKS_ENV``, set here for each test), and a test that leaves
``TRITON_INTERPRET=1`` set without the ``interpreter`` marker fails. tests/test_tiers.py checks
the rule against known test ids.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import tiers
from tiers import FAST_TIER, TEST_MARKS_ENV, TIER_MARKERS, tier_markers

REPO_ROOT = Path(__file__).resolve().parent.parent
# TRITON_INTERPRET as it was when the test's setup began.
_INTERPRET_BEFORE = pytest.StashKey[str | None]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true",
                     help=f"the fast tier only: -m '{FAST_TIER}' (and-ed with any -m given)")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("fast"):
        given = config.option.markexpr
        config.option.markexpr = f"({given}) and {FAST_TIER}" if given else FAST_TIER


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch project, the current folder: a copy of recipes/ (with maps and profiles),
    runtime/ linked in (a test file may define its own `project` instead)."""
    shutil.copytree(REPO_ROOT / "recipes", tmp_path / "recipes")
    (tmp_path / "runtime").symlink_to(REPO_ROOT / "runtime", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: before `-m` deselects by marker.
    for item in items:
        for name in sorted(tier_markers(item)):
            item.add_marker(name)


def pytest_collection_finish(session: pytest.Session) -> None:
    tiers.SELECTED_INTERPRETER_TESTS[:] = [item.nodeid for item in session.items
                                           if item.get_closest_marker("interpreter")]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    # Set before the item's setup, so a session fixture started for it sees its markers too.
    marks = sorted({m.name for m in item.iter_markers()} & {*TIER_MARKERS, "torch"})
    before = os.environ.get(TEST_MARKS_ENV)
    os.environ[TEST_MARKS_ENV] = ",".join(marks) or "fast"
    try:
        return (yield)
    finally:
        if before is None:
            os.environ.pop(TEST_MARKS_ENV, None)
        else:
            os.environ[TEST_MARKS_ENV] = before


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_INTERPRET_BEFORE] = os.environ.get("TRITON_INTERPRET")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    before = item.stash.get(_INTERPRET_BEFORE, None)
    result = yield
    # After the test's own fixtures (monkeypatch) are undone: a test that switched the
    # interpreter on for the rest of the process is an interpreter test.
    if before != "1" and os.environ.get("TRITON_INTERPRET") == "1" and \
            item.get_closest_marker("interpreter") is None:
        raise AssertionError(f"{item.nodeid} left TRITON_INTERPRET=1 set without the "
                             "'interpreter' marker: run its kernels through "
                             "interpreter_rerun.rerun_interpreted (tests/conftest.py)")
    return result
