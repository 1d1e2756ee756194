"""The test tiers: which marker a test gets from what it uses (applied in tests/conftest.py), and
the guard the heavy helpers call. See tests/conftest.py for the rule in words."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent

# The tier markers (each registered in pyproject.toml); the fast tier is none of them.
TIER_MARKERS = ("vllm", "docker", "interpreter", "gpu")
FAST_TIER = "not (" + " or ".join(TIER_MARKERS) + ")"
# The markers of the running test, comma-separated, for the guards in the helpers (and for any
# subprocess a test starts).
TEST_MARKS_ENV = "RECIPEGEN_TEST_MARKS"

ENGINE_FIXTURES = frozenset({"vllm_required", "start_server", "count_profile"})
DOCKER_FIXTURES = frozenset({"docker_engine"})
INTERPRETER_CALLS = frozenset({"rerun_interpreted", "_rerun_interpreted"})
ENGINE_MODULES = ("vllm_support.server",)
# A file named for the GPU (``*_gpu.py``, ``*_cuda.py``) holds GPU tests only; a test skipped for
# want of CUDA (its skipif reason says "CUDA GPU", as every such skip here does) is one too.
GPU_FILE_SUFFIXES = ("_gpu.py", "_cuda.py")
GPU_SKIP_REASON = "CUDA GPU"
# The session's selected interpreter tests (tests/conftest.py, after collection): run together in
# one TRITON_INTERPRET=1 process by interpreter_rerun.
SELECTED_INTERPRETER_TESTS: list[str] = []


def _imports_engine_helper(module: object) -> bool:
    """The module holds vllm_support.server itself or a name defined there."""
    for value in vars(module).values():
        name = getattr(value, "__name__", None) if isinstance(value, type(os)) else \
            getattr(value, "__module__", None)
        if isinstance(name, str) and name in ENGINE_MODULES:
            return True
    return False


def _calls_interpreter(function: object, module: object, depth: int = 2) -> bool:
    """``function`` calls one of ``INTERPRETER_CALLS``, or a function of its module that does
    (a file's own wrapper around it), up to ``depth`` calls deep."""
    code = getattr(function, "__code__", None)
    if code is None:
        return False
    names = set(code.co_names)
    if names & INTERPRETER_CALLS:
        return True
    return depth > 0 and module is not None and any(
        _calls_interpreter(vars(module)[name], module, depth - 1)
        for name in names if callable(vars(module).get(name)) and
        getattr(vars(module)[name], "__module__", None) == getattr(module, "__name__", None))


def tier_markers(item: pytest.Item) -> set[str]:
    """The tier markers the rule gives ``item`` (markers written in the file come on top)."""
    found: set[str] = set()
    path = Path(str(item.fspath)).resolve()
    fixtures = set(getattr(item, "fixturenames", ()))
    module = getattr(item, "module", None)
    function = getattr(item, "function", None)
    if (TESTS_DIR / "vllm") in path.parents or fixtures & ENGINE_FIXTURES or \
            (module is not None and _imports_engine_helper(module)):
        found.add("vllm")
    if fixtures & DOCKER_FIXTURES:
        found.add("docker")
    if function is not None and _calls_interpreter(function, module):
        found.add("interpreter")
    if path.name.endswith(GPU_FILE_SUFFIXES) or any(
            GPU_SKIP_REASON in str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif")):
        found.add("gpu")
    return found



def require_tier_marker(marker: str, what: str) -> None:
    """For helpers that start something heavy: refuse inside a test that lacks ``marker`` (so it
    cannot run in the fast tier unnoticed). Outside pytest (no ``TEST_MARKS_ENV``) it allows."""
    marks = os.environ.get(TEST_MARKS_ENV)
    if marks is not None and marker not in marks.split(","):
        raise AssertionError(f"{what} in a test without the {marker!r} marker "
                             f"({os.environ.get('PYTEST_CURRENT_TEST', '?')}): the rule in "
                             "tests/conftest.py does not see it; use the fixtures it names, or "
                             f"mark the test @pytest.mark.{marker}")
