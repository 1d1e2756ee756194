"""`recipegen doctor`'s machine row when this box cannot be read through NVML: the pip hint only when
nvidia-ml-py does not import; when it imports and NVML cannot start (no driver library), the driver."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.ops import doctor
from recipegen.ops.doctor import WARN, Facts, evaluate

PIP = "pip install 'recipegen[nvml]'"


def _fake_pynvml(monkeypatch: pytest.MonkeyPatch, init_error: Exception) -> None:
    """A pynvml whose nvmlInit fails as the real one does without the driver's libnvidia-ml.so."""
    module = types.ModuleType("pynvml")

    def nvml_init() -> None:
        raise init_error

    module.nvmlInit = nvml_init
    module.nvmlShutdown = lambda: None
    monkeypatch.setitem(sys.modules, "pynvml", module)


def _machine_row(facts: Facts):
    return {check.name: check for check in evaluate(facts)}["machine"]


def test_nvml_without_the_driver_points_to_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pynvml(monkeypatch, RuntimeError("NVML Shared Library Not Found"))
    facts = Facts()
    doctor._detect_machine(facts)
    assert "nvmlInit" in facts.detect_error and "NVML Shared Library Not Found" in facts.detect_error
    row = _machine_row(facts)
    assert row.status == WARN
    assert PIP not in row.fix and "NVIDIA driver" in row.fix and "nvidia-smi" in row.fix, row.fix


def test_no_nvidia_ml_py_gets_the_pip_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)    # `import pynvml` raises ImportError
    facts = Facts()
    doctor._detect_machine(facts)
    assert "nvidia-ml-py" in facts.detect_error
    row = _machine_row(facts)
    assert row.status == WARN and row.fix.startswith(PIP), row.fix
    assert "driver" not in row.fix


def test_the_doctor_command_says_the_same(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_pynvml(monkeypatch, RuntimeError("NVML Shared Library Not Found"))
    monkeypatch.chdir(tmp_path)
    result = invoke("doctor", "--json", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock",
                                             "RECIPEGEN_COMPOSE": "/nonexistent/docker-compose"})
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert "recipegen[nvml]" not in checks["machine"]["fix"] and "NVIDIA driver" in checks["machine"]["fix"]


def test_a_working_nvml_without_a_figure_is_not_sent_to_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML answered but gives no figure the entry needs (here: no GPU at all): the fix is the
    machine entry, not the driver, which works."""
    from recipegen.catalog import detect as detect_module

    def no_gpu(*_args: object, **_kwargs: object) -> None:
        raise detect_module.RecipegenError("NVML lists no GPU on this machine")

    monkeypatch.setitem(sys.modules, "pynvml", types.ModuleType("pynvml"))
    monkeypatch.setattr(detect_module, "PynvmlTable", lambda: object())
    monkeypatch.setattr(detect_module, "detect", no_gpu)
    facts = Facts()
    doctor._detect_machine(facts)
    row = _machine_row(facts)
    assert row.status == WARN and "NVML lists no GPU" in row.detail
    assert "driver" not in row.fix and PIP not in row.fix and "write the machine entry by hand" in row.fix
