"""Each refusal against the real vLLM CPU engine: one clear `EXPERT_RESIDENCY_REFUSED` line and a
non-zero exit before the server ever answers /health.

Refusals the CPU build cannot trigger (EPLB needs expert parallelism; monolithic MoE backends are
GPU kernels) are tested on the pure checks in tests/test_vllm_plugin_unit.py, and the attributes
they read are checked against vLLM 0.33's source in tests/test_vllm033_contracts.py.

The refused servers are boots of the session's boot plan (``vllm_support.shared``), started
while other servers serve.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from expert_residency.formats import RowMap, load_rowmap, save_rowmap
from expert_residency.vllm_plugin.refusal import REFUSAL_EXIT_CODE, REFUSAL_TAG
from vllm_support.server import RUNTIME_DIR, VLLM_PYTHON, base_env
from vllm_support.shared import Boot, SharedBoot, register_boot, shared_job
from vllm_support.tiny_moe import TINY

pytestmark = pytest.mark.vllm


_REFUSAL_LINE = re.compile(r"^(\([^)]*pid=\d+\)\s*)?" + REFUSAL_TAG + ": ")


def _refusal_lines(log: str) -> list[str]:
    """The runtime's own refusal lines (vLLM may quote the message again in its tracebacks)."""
    return [line for line in log.splitlines() if _REFUSAL_LINE.match(line)]


def _assert_refused(boot: SharedBoot, expect: str, *, exit_code: int | None = None) -> str:
    log = boot.log
    rc = boot.result("refusal")
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


def _map_env(ctx, name: str, content_hash: str | None = None, **geometry) -> dict[str, str]:
    path = ctx.work.parent / name
    rowmap = _tiny_rowmap(path, **geometry)
    return {"EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_ROWMAP": str(path),
            "EXPERT_RESIDENCY_CONTENT_HASH": content_hash or rowmap.content_hash()}


# Each refusal is a boot of the plan (vllm_support.shared) expected to exit before it is ready;
# they start while other servers serve.
REFUSALS = {
    "refuse-missing": lambda ctx: {
        "EXPERT_RESIDENCY_MODE": "residency",
        "EXPERT_RESIDENCY_ROWMAP": str(ctx.work.parent / "absent.rowmap"),
        "EXPERT_RESIDENCY_CONTENT_HASH": "0" * 64},
    "refuse-hash": lambda ctx: _map_env(ctx, "tiny.rowmap", "ab" * 32),
    "refuse-mode": lambda ctx: {"EXPERT_RESIDENCY_MODE": "pinned"},
    # a map for 16 experts per layer (the model has 8): only the loaded model can tell
    "refuse-geometry": lambda ctx: _map_env(ctx, "wrong-geometry.rowmap", experts=16),
    "refuse-layers": lambda ctx: _map_env(ctx, "wrong-layers.rowmap", layers=(0, 1, 2)),
    "refuse-lora": lambda ctx: {"EXPERT_RESIDENCY_MODE": "unsplit"},
}
for _name, _env in REFUSALS.items():
    register_boot(Boot(_name, _env, refused=True, extra_args=(
        ("--enable-lora", "--max-lora-rank", "8") if _name == "refuse-lora" else ())))
    shared_job(_name, "refusal")(lambda server, ctx: server.returncode)


def test_missing_rowmap_refused_before_engine_start(engine_plan) -> None:
    boot = engine_plan["refuse-missing"]
    line = _assert_refused(boot, "does not exist", exit_code=REFUSAL_EXIT_CODE)
    assert boot.env["EXPERT_RESIDENCY_ROWMAP"] in line
    assert boot.env["EXPERT_RESIDENCY_ROWMAP"].endswith("absent.rowmap")
    assert "EngineCore" not in boot.log, "refused in the API server, before the engine"


def test_content_hash_mismatch_refused(engine_plan) -> None:
    boot = engine_plan["refuse-hash"]
    line = _assert_refused(boot, "content_hash", exit_code=REFUSAL_EXIT_CODE)
    rowmap = load_rowmap(boot.env["EXPERT_RESIDENCY_ROWMAP"])
    assert rowmap.content_hash()[:16] in line and "abababababababab" in line


def test_bad_mode_value_refused(engine_plan) -> None:
    _assert_refused(engine_plan["refuse-mode"], "EXPERT_RESIDENCY_MODE='pinned'",
                    exit_code=REFUSAL_EXIT_CODE)


def test_geometry_mismatch_refused_in_the_worker(engine_plan) -> None:
    """A map for 16 experts per layer (the model has 8): only the loaded model can tell."""
    line = _assert_refused(engine_plan["refuse-geometry"], "geometry mismatch")
    assert "16 experts per layer" in line and "the model has 8" in line


def test_geometry_mismatch_in_layers_refused(engine_plan) -> None:
    line = _assert_refused(engine_plan["refuse-layers"], "geometry mismatch")
    assert "extra [2]" in line


def test_lora_with_residency_refused(engine_plan) -> None:
    _assert_refused(engine_plan["refuse-lora"], "LoRA is enabled")


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
