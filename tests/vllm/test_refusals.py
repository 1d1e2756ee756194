"""Each refusal against the real vLLM CPU engine: one clear `EXPERT_RESIDENCY_REFUSED` line and a
non-zero exit before the server ever answers /health.

Refusals the CPU build cannot trigger (EPLB needs expert parallelism; monolithic MoE backends are
GPU kernels) are tested on the pure checks in tests/test_vllm_plugin_unit.py, and the attributes
they read are checked against vLLM 0.33's source in tests/test_vllm033_contracts.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from expert_residency.formats import RowMap, save_rowmap
from expert_residency.vllm_plugin.refusal import REFUSAL_EXIT_CODE, REFUSAL_TAG
from vllm_support.server import RUNTIME_DIR, VLLM_PYTHON, base_env
from vllm_support.tiny_moe import TINY

pytestmark = pytest.mark.vllm


_REFUSAL_LINE = re.compile(r"^(\([^)]*pid=\d+\)\s*)?" + REFUSAL_TAG + ": ")


def _refusal_lines(log: str) -> list[str]:
    """The runtime's own refusal lines (vLLM may quote the message again in its tracebacks)."""
    return [line for line in log.splitlines() if _REFUSAL_LINE.match(line)]


def _assert_refused(server, expect: str, *, exit_code: int | None = None) -> str:
    rc = server.wait_until_exit()
    log = server.log_text()
    assert rc != 0, log[-3000:]
    if exit_code is not None:
        assert rc == exit_code, log[-3000:]
    lines = _refusal_lines(log)
    assert lines, f"no {REFUSAL_TAG} line in:\n{log[-3000:]}"
    # One refusal, said once (the first process that sees it stops the boot).
    assert len(lines) == 1, lines
    assert expect in lines[0], lines[0]
    assert "Application startup complete" not in log
    return lines[0]


def _tiny_rowmap(path: Path, *, experts: int = TINY.num_experts,
                 layers: tuple[int, ...] = TINY.moe_layer_indices) -> RowMap:
    hot = [list(range(experts - 3)) for _ in layers]
    cold = [list(range(experts - 3, experts)) for _ in layers]
    rowmap = RowMap(layers, experts, hot, cold, provenance={"source": "test"})
    save_rowmap(rowmap, path)
    return rowmap


def test_missing_rowmap_refused_before_engine_start(start_server, tmp_path: Path) -> None:
    server = start_server("refuse-missing", {
        "EXPERT_RESIDENCY_MODE": "residency",
        "EXPERT_RESIDENCY_ROWMAP": str(tmp_path / "absent.rowmap"),
        "EXPERT_RESIDENCY_CONTENT_HASH": "0" * 64}, wait=False)
    line = _assert_refused(server, "does not exist", exit_code=REFUSAL_EXIT_CODE)
    assert str(tmp_path / "absent.rowmap") in line
    assert "EngineCore" not in server.log_text(), "refused in the API server, before the engine"


def test_content_hash_mismatch_refused(start_server, tmp_path: Path) -> None:
    path = tmp_path / "tiny.rowmap"
    rowmap = _tiny_rowmap(path)
    server = start_server("refuse-hash", {
        "EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_ROWMAP": str(path),
        "EXPERT_RESIDENCY_CONTENT_HASH": "ab" * 32}, wait=False)
    line = _assert_refused(server, "content_hash", exit_code=REFUSAL_EXIT_CODE)
    assert rowmap.content_hash()[:16] in line and "abababababababab" in line


def test_bad_mode_value_refused(start_server) -> None:
    server = start_server("refuse-mode", {"EXPERT_RESIDENCY_MODE": "pinned"}, wait=False)
    _assert_refused(server, "EXPERT_RESIDENCY_MODE='pinned'", exit_code=REFUSAL_EXIT_CODE)


def test_geometry_mismatch_refused_in_the_worker(start_server, tmp_path: Path) -> None:
    """A map for 16 experts per layer (the model has 8): only the loaded model can tell."""
    path = tmp_path / "wrong-geometry.rowmap"
    rowmap = _tiny_rowmap(path, experts=16)
    server = start_server("refuse-geometry", {
        "EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_ROWMAP": str(path),
        "EXPERT_RESIDENCY_CONTENT_HASH": rowmap.content_hash()}, wait=False)
    line = _assert_refused(server, "geometry mismatch")
    assert "16 experts per layer" in line and "the model has 8" in line


def test_geometry_mismatch_in_layers_refused(start_server, tmp_path: Path) -> None:
    path = tmp_path / "wrong-layers.rowmap"
    rowmap = _tiny_rowmap(path, layers=(0, 1, 2))
    server = start_server("refuse-layers", {
        "EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_ROWMAP": str(path),
        "EXPERT_RESIDENCY_CONTENT_HASH": rowmap.content_hash()}, wait=False)
    line = _assert_refused(server, "geometry mismatch")
    assert "extra [2]" in line


def test_lora_with_residency_refused(start_server) -> None:
    server = start_server("refuse-lora", {"EXPERT_RESIDENCY_MODE": "unsplit"},
                          extra_args=["--enable-lora", "--max-lora-rank", "8"], wait=False)
    _assert_refused(server, "LoRA is enabled")


def test_unsupported_vllm_version_refused(vllm_required, tmp_path: Path) -> None:
    """The gate in the real vLLM environment: the plugin's entry point (found from runtime/ on
    PYTHONPATH) with the running vLLM's version replaced by an unsupported one."""
    code = ("import importlib.metadata as m, vllm\n"
            "vllm.__version__ = '0.31.0'\n"
            "[ep] = [e for e in m.entry_points(group='vllm.general_plugins') "
            "if e.name == 'expert_residency']\n"
            "ep.load()()\n")
    env = base_env(tmp_path)
    env.update({"PYTHONPATH": str(RUNTIME_DIR), "EXPERT_RESIDENCY_MODE": "count"})
    proc = subprocess.run([str(VLLM_PYTHON), "-c", code], env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == REFUSAL_EXIT_CODE, proc.stderr[-2000:]
    lines = [l for l in proc.stderr.splitlines() if REFUSAL_TAG in l]
    assert len(lines) == 1 and "vLLM 0.31.0 is not supported" in lines[0], proc.stderr[-2000:]
    assert "0.32.0, 0.33.0" in lines[0]


def test_plugin_is_inert_when_mode_unset(vllm_required, tmp_path: Path) -> None:
    """Loaded through the entry point with no runtime environment: nothing is registered."""
    code = ("import importlib.metadata as m\n"
            "[ep] = [e for e in m.entry_points(group='vllm.general_plugins') "
            "if e.name == 'expert_residency']\n"
            "ep.load()(); ep.load()()\n"
            "from vllm.model_executor.custom_op import op_registry_oot\n"
            "from expert_residency.vllm_plugin.worker_runtime import get_runtime\n"
            "assert 'RoutedExperts' not in op_registry_oot, op_registry_oot\n"
            "assert get_runtime() is None\n"
            "print('inert')\n")
    env = base_env(tmp_path)
    env.update({"PYTHONPATH": str(RUNTIME_DIR)})
    proc = subprocess.run([str(VLLM_PYTHON), "-c", code], env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0 and "inert" in proc.stdout, proc.stderr[-2000:]


def test_active_registration_is_idempotent(vllm_required, tmp_path: Path) -> None:
    code = ("import importlib.metadata as m\n"
            "[ep] = [e for e in m.entry_points(group='vllm.general_plugins') "
            "if e.name == 'expert_residency']\n"
            "register = ep.load(); register(); register()\n"
            "from vllm.model_executor.custom_op import op_registry_oot\n"
            "from expert_residency.vllm_plugin.routed_experts import ResidencyRoutedExperts\n"
            "assert op_registry_oot['RoutedExperts'] is ResidencyRoutedExperts\n"
            "from vllm.model_executor.model_loader.base_loader import BaseModelLoader\n"
            "assert BaseModelLoader.load_model._expert_residency_hook\n"
            "assert not hasattr(BaseModelLoader.load_model.__wrapped__, '_expert_residency_hook')\n"
            "print('once')\n")
    env = base_env(tmp_path)
    env.update({"PYTHONPATH": str(RUNTIME_DIR), "EXPERT_RESIDENCY_MODE": "count"})
    proc = subprocess.run([str(VLLM_PYTHON), "-c", code], env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0 and "once" in proc.stdout, proc.stderr[-2000:]
