"""`recipegen doctor`: verdicts from plain facts, and the real command against a private engine."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest
from docker_support.fixtures import docker_engine  # noqa: F401

from recipegen.ops.doctor import FAIL, OK, UNLIMITED, Facts, HostRequirement, evaluate, proc_memlock

GIB = 2**30


def _facts(**kw) -> Facts:
    base = dict(daemon_ok=True, daemon_detail="engine", runtimes=["nvidia", "runc"],
                compose="2.40.3", memlock_soft=UNLIMITED, mem_available=400 * GIB,
                mem_total=494 * GIB, nvidia_smi=True, gpus=["0: NVIDIA GB300, 288 GiB"])
    base.update(kw)
    return Facts(**base)


def _by_name(checks):
    return {c.name: c for c in checks}


def test_healthy_host_passes_every_check():
    checks = evaluate(_facts())
    assert [c.status for c in checks] == [OK] * len(checks)


def test_low_memlock_fails_and_says_how_to_fix():
    c = _by_name(evaluate(_facts(memlock_soft=64 * 1024)))["memlock limit"]
    assert c.status == FAIL
    assert "64 KiB" in c.detail
    assert "ulimit -l unlimited" in c.fix and "LimitMEMLOCK=infinity" in c.fix


def test_memlock_against_the_recipes_pinned_bytes():
    need = HostRequirement("ref", host_bytes=433 * GIB, pinned_bytes=int(62.33 * GIB), gpus=1)
    enough = _by_name(evaluate(_facts(memlock_soft=64 * GIB), need))["memlock limit"]
    short = _by_name(evaluate(_facts(memlock_soft=32 * GIB), need))["memlock limit"]
    assert enough.status == OK
    assert short.status == FAIL and "62.33 GiB" in short.detail


def test_daemon_limit_counts_too():
    c = _by_name(evaluate(_facts(daemon_memlock=8 * 2**20)))["memlock limit"]
    assert c.status == FAIL and "dockerd" in c.detail


def test_missing_nvidia_runtime_and_gpus():
    checks = _by_name(evaluate(_facts(runtimes=["runc"], nvidia_smi=False, gpus=[])))
    assert checks["nvidia runtime"].status == FAIL
    assert "nvidia-ctk runtime configure" in checks["nvidia runtime"].fix
    assert checks["gpus"].status == FAIL


def test_host_memory_against_the_ledger():
    need = HostRequirement("ref", host_bytes=433 * GIB, pinned_bytes=62 * GIB, gpus=1)
    assert _by_name(evaluate(_facts(mem_available=450 * GIB), need))["host memory"].status == OK
    low = _by_name(evaluate(_facts(mem_available=300 * GIB), need))["host memory"]
    assert low.status == FAIL and "433.00 GiB" in low.detail


def test_too_few_gpus_for_the_recipe():
    need = HostRequirement("ref", host_bytes=1, pinned_bytes=1, gpus=2)
    assert _by_name(evaluate(_facts(), need))["gpus"].status == FAIL


def test_proc_memlock_reads_this_process():
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    want = UNLIMITED if soft == resource.RLIM_INFINITY else soft
    assert proc_memlock(os.getpid()) == want


def _run_doctor(env: dict[str, str], memlock: int) -> subprocess.CompletedProcess[str]:
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (memlock, memlock))

    return subprocess.run([sys.executable, "-m", "recipegen", "doctor", "--json"], env=env,
                          capture_output=True, text=True, timeout=120, preexec_fn=lower)


@pytest.mark.docker
def test_doctor_against_the_real_engine_reports_a_low_memlock_limit(docker_engine):  # noqa: F811
    result = _run_doctor(docker_engine.env(), 64 * 1024)
    assert result.returncode == 1, result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert checks["docker daemon"]["status"] == "ok"
    assert "Docker 20.10" in checks["docker daemon"]["detail"] or "Docker" in checks["docker daemon"]["detail"]
    assert checks["compose v2"]["status"] == "ok"
    # the private engine has runc only: the NVIDIA runtime is correctly reported missing
    assert checks["nvidia runtime"]["status"] == "fail"
    assert checks["memlock limit"]["status"] == "fail"
    assert "this process: 64 KiB" in checks["memlock limit"]["detail"]


def test_recipe_checks_images_and_must_exist_bind_mounts():
    need = HostRequirement("ref", host_bytes=GIB, pinned_bytes=GIB, gpus=1,
                           images=["vllm/vllm-openai:v0.33.0"],
                           required_paths=["/srv/models/dsv41-flash-mxfp4", "/repo/runtime"])
    checks = _by_name(evaluate(_facts(local_images=set(), existing_paths={"/repo/runtime"}), need))
    assert checks["images"].status == "warn" and "docker pull vllm/vllm-openai:v0.33.0" in checks["images"].fix
    assert checks["bind mounts"].status == FAIL
    assert "/srv/models/dsv41-flash-mxfp4" in checks["bind mounts"].detail
    assert "RECIPEGEN_MODELS_DIR" in checks["bind mounts"].fix
    ok = _by_name(evaluate(_facts(local_images={"vllm/vllm-openai:v0.33.0"},
                                  existing_paths=set(need.required_paths)), need))
    assert ok["images"].status == OK and ok["bind mounts"].status == OK


def test_doctor_reads_the_recipes_mounts_and_ledger(repo_root, tmp_path):
    models = tmp_path / "models"
    (models / "dsv41-flash-mxfp4").mkdir(parents=True)
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent.sock", "RECIPEGEN_MODELS_DIR": str(models)}
    result = subprocess.run([sys.executable, "-m", "recipegen", "doctor", "dsv41-flash-gb300",
                             "--json"], cwd=repo_root, env=env, capture_output=True, text=True,
                            timeout=120)
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert result.returncode == 1  # no daemon, no GPU here
    assert checks["bind mounts"]["status"] == "ok"
    assert "379.58 GiB" in checks["host memory"]["detail"]  # 189.2 + 128.05 + 62.33 GiB host ledger
    env["RECIPEGEN_MODELS_DIR"] = str(tmp_path / "elsewhere")
    result = subprocess.run([sys.executable, "-m", "recipegen", "doctor", "dsv41-flash-gb300",
                             "--json"], cwd=repo_root, env=env, capture_output=True, text=True,
                            timeout=120)
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert checks["bind mounts"]["status"] == "fail"
    assert str(tmp_path / "elsewhere" / "dsv41-flash-mxfp4") in checks["bind mounts"]["detail"]
