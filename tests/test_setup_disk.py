"""The setup's disk check (scripts/setup-lib.sh `disk_check`), with the real df and stat.

Each case runs `disk_check` in bash in a folder holding only the setup scripts and pyproject.toml,
so nothing counts as installed; the sizes the check adds are set per case (the script's DISK_*
variables) against what the filesystem really has free, read here by Python's statvfs. Claims:

* when the parts still to install do not fit, it stops, naming the folder, df's free figure,
  the total needed and each part;
* when they fit it says nothing and succeeds;
* the fast tier (FAST=1) does not count .venv-vllm; route pypi counts PyPI's larger torch build;
* a TMPDIR on another filesystem is checked on its own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SIZES = ("DISK_DEV_MIB_CPU", "DISK_DEV_MIB_PYPI", "DISK_VLLM_MIB_CPU", "DISK_VLLM_MIB_PYPI",
         "DISK_SRC_MIB", "DISK_WORK_MIB")


def free_mib(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize // 2**20


def disk_check(tmp_path: Path, route: str, fast: int, tmpdir: Path | None = None,
               **sizes: int) -> subprocess.CompletedProcess[str]:
    checkout = tmp_path / "checkout"
    if not checkout.exists():
        shutil.copytree(REPO / "scripts", checkout / "scripts")
        shutil.copy(REPO / "pyproject.toml", checkout)
    tmp = tmpdir or tmp_path
    settings = "; ".join(f"{name}={sizes.get(name, 1)}" for name in SIZES)
    script = f". scripts/step.sh; . scripts/setup-lib.sh; {settings}; disk_check {route} {fast}"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TMPDIR": str(tmp)}
    return subprocess.run(["bash", "-c", script], check=False, cwd=checkout, env=env, text=True,
                          capture_output=True, timeout=60)


def test_parts_that_do_not_fit_stop_the_setup_naming_each(tmp_path: Path) -> None:
    free = free_mib(tmp_path)
    dev = free + 10_000                      # more than is free, whatever else happens meanwhile
    r = disk_check(tmp_path, "configured", 0, DISK_DEV_MIB_CPU=dev, DISK_VLLM_MIB_CPU=7,
                   DISK_SRC_MIB=5, DISK_WORK_MIB=3)
    assert r.returncode == 1
    m = re.search(r"the filesystem holding (\S+) has (\d+) MiB free \(df\); this setup needs about "
                  r"(\d+) MiB there", r.stderr)
    assert m, r.stderr
    assert Path(m.group(1)) == tmp_path / "checkout"
    assert abs(int(m.group(2)) - free) <= max(64, free // 100)   # df and statvfs, moments apart
    assert int(m.group(3)) == dev + 7 + 5 + 3                  # TMPDIR is on the same filesystem
    assert (f"torch route 'configured': .venv {dev}, .venv-vllm 7, .cache 5, pip's downloads and "
            f"temporary files in {tmp_path} 3)") in r.stderr
    assert "Nothing was installed but an empty .venv" in r.stderr


def test_parts_that_fit_pass_silently(tmp_path: Path) -> None:
    r = disk_check(tmp_path, "configured", 0)
    assert (r.returncode, r.stderr) == (0, "")


def test_the_fast_tier_does_not_count_the_vllm_environment(tmp_path: Path) -> None:
    huge = free_mib(tmp_path) + 10_000
    assert disk_check(tmp_path, "configured", 1, DISK_VLLM_MIB_CPU=huge).returncode == 0
    r = disk_check(tmp_path, "configured", 0, DISK_VLLM_MIB_CPU=huge)
    assert r.returncode == 1 and f".venv-vllm {huge}" in r.stderr


def test_route_pypi_counts_pypis_torch_build(tmp_path: Path) -> None:
    huge = free_mib(tmp_path) + 10_000
    assert disk_check(tmp_path, "configured", 1, DISK_DEV_MIB_PYPI=huge).returncode == 0
    assert disk_check(tmp_path, "pytorch-cpu-index", 1, DISK_DEV_MIB_PYPI=huge).returncode == 0
    r = disk_check(tmp_path, "pypi", 1, DISK_DEV_MIB_PYPI=huge)
    assert r.returncode == 1 and "torch route 'pypi': .venv" in r.stderr


def test_a_tmpdir_on_another_filesystem_is_checked_on_its_own(tmp_path: Path) -> None:
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs a second filesystem (/dev/shm, not the test's own)")
    huge = free_mib(other) + 10_000
    r = disk_check(tmp_path, "configured", 1, tmpdir=other, DISK_WORK_MIB=huge)
    assert r.returncode == 1
    assert f"TMPDIR ({other}) has" in r.stderr and f"need about {huge} MiB there" in r.stderr
    # The same working room is not added to the checkout's filesystem.
    assert "the filesystem holding" not in r.stderr


def test_a_tmpdir_that_is_no_folder_stops_the_setup_saying_so(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    r = disk_check(tmp_path, "configured", 1, tmpdir=missing)
    assert r.returncode == 1
    assert r.stderr.startswith(f"setup: TMPDIR ({missing}) is not a folder"), r.stderr
    assert "No such file" not in r.stderr and "integer expression" not in r.stderr   # no shell noise
