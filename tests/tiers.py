"""The test tiers: which marker a test gets from what it uses (applied in tests/conftest.py), and
the guard the heavy helpers call. See tests/conftest.py for the rule in words."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent

# CPU tests of the runtime's GPU kernel module (its configuration, its compiled SASS) import
# torch and Triton, which the test extra brings; where either is absent they skip.
needs_gpu_experts = pytest.mark.skipif(importlib.util.find_spec("triton") is None
                                       or importlib.util.find_spec("torch") is None,
                                       reason="gpu.experts needs torch and triton")

# The tier markers (each registered in pyproject.toml); the fast tier is none of them.
TIER_MARKERS = ("vllm", "docker", "interpreter", "gpu", "slow")
FAST_TIER = "not (" + " or ".join(TIER_MARKERS) + ")"
# The markers of the running test, comma-separated, for the guards in the helpers (and for any
# subprocess a test starts).
TEST_MARKS_ENV = "RECIPEGEN_TEST_MARKS"

ENGINE_FIXTURES = frozenset({"vllm_required", "start_server", "count_profile"})
DOCKER_FIXTURES = frozenset({"docker_engine"})
INTERPRETER_CALLS = frozenset({"rerun_interpreted", "_rerun_interpreted"})
ENGINE_MODULES = ("vllm_support.server",)
# Pure tests too slow for the tier a developer runs on every change: the slowest of a fast-tier
# run on two shared cores (`pytest --fast -n 2 --durations=25`, 2026-12-03, load average about 4),
# seconds as measured there (the load inflates them; their share is what counts). Together they
# were about half of that run's test time.
SLOW_TESTS = {
    "tests/test_adaptive_gloo.py::test_tp_and_pp_ranks_decide_the_same": 121.6,
    "tests/hostile/test_hostile_swap.py::test_killed_at_every_step_the_next_run_recovers": 108.7,
    "tests/runtime/test_adaptive_lookahead_cpu.py::"
    "test_lookahead_through_a_shift_stays_exact_and_skips_swaps_a_flip_already_made": 58.3,
    "tests/test_adaptive_plugin.py::test_swap_rounds_through_the_entry_equal_unsplit_and_follow_the_traffic": 35.0,
    "tests/test_vllm_plugin_mxfp4.py::test_residency_with_swiglu_clamp_equals_unsplit_and_clamped_reference": 31.1,
    "tests/test_vllm_plugin_graphsafe.py::test_residency_equals_unsplit_on_real_rows_through_the_entry": 27.8,
    "tests/hostile/test_hostile_swap.py::test_a_recipe_named_by_path_is_recovered_from_any_folder": 27.3,
    "tests/hostile/test_hostile_concurrency.py::test_two_class_swaps_at_once_end_on_one_class": 21.2,
    "tests/test_vllm_plugin_mxfp4.py::test_residency_equals_unsplit_and_matches_dequantized_reference": 19.5,
    "tests/hostile/test_hostile_concurrency.py::test_a_render_beside_a_swap_never_writes_the_old_class": 16.0,
    "tests/test_output_plain.py::test_every_report_explains_its_shorthand": 14.6,
    "tests/test_adaptive_plugin.py::test_contexts_without_attention_metadata_neither_tick_nor_barrier": 14.5,
    "tests/runtime/test_adaptive_graphsafe.py::test_step_path_with_adaptive_counting_has_no_sync_and_fixed_shapes": 14.2,
    "tests/test_vllm_plugin_gptoss_mxfp4_padded.py::"
    "test_padded_layer_residency_equals_unsplit_and_the_unpadded_layer": 12.8,
    "tests/test_vllm_plugin_gptoss_mxfp4.py::test_gptoss_residency_equals_unsplit_and_the_written_out_reference": 12.7,
    "tests/test_estimate_validation.py::test_gb300_both_placements_imply_the_same_routing_overlap[5]": 12.1,
    "tests/hostile/test_hostile_concurrency.py::test_two_imports_to_one_target": 11.7,
    "tests/hostile/test_hostile_concurrency.py::test_k8s_killed_at_a_rename_is_cleaned_by_the_next_run": 11.5,
    "tests/hostile/test_hostile_leaks.py::test_yaml_bombs_and_deep_nesting_are_clean_errors": 10.8,
    "tests/test_vllm_plugin_expert_parallel.py::test_split_equals_unsplit_per_rank[linear-3-mxfp4]": 10.7,
    "tests/test_vllm_plugin_gptoss_mxfp4.py::test_gptoss_without_biases_is_swigluoai_alone": 10.5,
    "tests/test_hub.py::test_offline_from_the_hub_cache": 10.3,
    "tests/test_render.py::test_check_exits_1_when_stale_and_0_when_current": 10.1,
    # the slowest of the next run without those (same command, load average about 5)
    "tests/test_estimate_validation.py::test_gb300_both_placements_imply_the_same_routing_overlap[1]": 34.6,
    "tests/test_vllm_plugin_graphsafe.py::test_entry_has_no_sync_same_ops_and_exact_counts[residency]": 23.1,
    "tests/test_parallel_gloo.py::test_two_gloo_processes_tp2_split_equals_unsplit_and_sum_within_bound": 15.9,
    "tests/hostile/test_hostile_messages.py::test_deep_nesting_is_refused_with_its_line[flow]": 15.7,
    "tests/test_render.py::test_every_committed_recipe_renders_and_passes_compose_v2": 14.5,
    "tests/test_check_cli.py::test_default_checks_every_shipped_recipe": 14.0,
}
# Whole files of quick but many tests, with their seconds alone on one core (`pytest FILE`):
# the 704 payloads of the compose-data file were a quarter of the fast tier's time.
SLOW_FILES = {
    "tests/hostile/test_hostile_compose_data.py": 108.8,
}
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
    if item.nodeid in SLOW_TESTS or item.nodeid.split("::")[0] in SLOW_FILES:
        found.add("slow")
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
