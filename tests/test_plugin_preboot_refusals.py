"""QA10: refusals the plugin's ``register()`` now makes in vLLM's API server, before any engine
process starts — one ``EXPERT_RESIDENCY_REFUSED`` line and exit 3, like a non-folder
``PROMETHEUS_MULTIPROC_DIR``:

* ``EXPERT_RESIDENCY_DUMP_DIR`` naming a file, or a folder that cannot be created (finding 1;
  it used to fail in the worker's dump writer with ``FileExistsError`` tracebacks);
* a bad ``EXPERT_RESIDENCY_ADAPTIVE`` (finding 2; it used to be refused only in the worker);
* ``EXPERT_RESIDENCY_ROWMAP`` naming a folder is said to be a folder, not "does not exist" (finding 3).

Each runs the real ``register()`` the entry point calls (no vLLM here: only the installed version
it reads is replaced; every refusal below fires before vLLM is imported), plus the worker's own
check of the dump folder.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from expert_residency.core.adaptive_config import AdaptiveConfig
from expert_residency.formats import RowMap, save_rowmap
from expert_residency.vllm_plugin import register, version
from expert_residency.vllm_plugin.refusal import REFUSAL_EXIT_CODE, REFUSAL_TAG, ResidencyRefused

DUMP_FIX = "name a folder for the histogram dumps (created if missing), or unset it"


@pytest.fixture
def plugin_env(monkeypatch: pytest.MonkeyPatch):
    """A clean runtime environment, vLLM 0.32.0 as the installed version; returns ``setenv``."""
    for name in list(os.environ):
        if name.startswith("EXPERT_RESIDENCY_") or name == "PROMETHEUS_MULTIPROC_DIR":
            monkeypatch.delenv(name)
    monkeypatch.setattr(version, "installed_vllm_version", lambda: "0.32.0")

    def setenv(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return setenv


def _refusal(capsys: pytest.CaptureFixture[str]) -> str:
    """register() in the API server: exit 3 and exactly one refusal line on stderr."""
    with pytest.raises(SystemExit) as exc:
        register()
    assert exc.value.code == REFUSAL_EXIT_CODE == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{REFUSAL_TAG}: "), err
    return err.rstrip("\n")


def _rowmap(path: Path) -> str:
    rowmap = RowMap((0, 1), 8, [list(range(5))] * 2, [list(range(5, 8))] * 2, provenance={"source": "test"})
    save_rowmap(rowmap, path)
    return rowmap.content_hash()


# --- finding 1: EXPERT_RESIDENCY_DUMP_DIR ------------------------------------------------------

def test_dump_dir_naming_a_file_is_refused_in_the_api_server(plugin_env, capsys, tmp_path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    plugin_env(EXPERT_RESIDENCY_MODE="count", EXPERT_RESIDENCY_DUMP_DIR=str(afile))
    assert _refusal(capsys) == (f"{REFUSAL_TAG}: EXPERT_RESIDENCY_DUMP_DIR='{afile}' is not a folder: "
                                f"{DUMP_FIX}")


def test_dump_dir_that_cannot_be_created_is_refused(plugin_env, capsys, tmp_path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    folder = afile / "dumps" / "lane"
    plugin_env(EXPERT_RESIDENCY_MODE="count", EXPERT_RESIDENCY_DUMP_DIR=str(folder))
    assert _refusal(capsys) == (f"{REFUSAL_TAG}: EXPERT_RESIDENCY_DUMP_DIR='{folder}' cannot be created: "
                                f"{afile} is not a folder; {DUMP_FIX}")


def test_dump_dir_checked_before_the_row_map_in_residency_mode(plugin_env, capsys, tmp_path) -> None:
    path = tmp_path / "tiny.rowmap"
    link = tmp_path / "gone"
    link.symlink_to(tmp_path / "nowhere")   # a dangling link: mkdir(exist_ok=True) would fail on it
    plugin_env(EXPERT_RESIDENCY_MODE="residency", EXPERT_RESIDENCY_ROWMAP=str(path),
               EXPERT_RESIDENCY_CONTENT_HASH=_rowmap(path), EXPERT_RESIDENCY_DUMP_DIR=str(link))
    assert _refusal(capsys) == f"{REFUSAL_TAG}: EXPERT_RESIDENCY_DUMP_DIR='{link}' is not a folder: {DUMP_FIX}"


def test_dump_dir_under_a_read_only_folder_is_refused(plugin_env, capsys, tmp_path, monkeypatch) -> None:
    parent = tmp_path / "ro"
    parent.mkdir(mode=0o555)
    if os.geteuid() == 0:  # root may write there anyway: answer as a read-only mount would
        access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == parent else access(p, mode))
    plugin_env(EXPERT_RESIDENCY_MODE="count", EXPERT_RESIDENCY_DUMP_DIR=str(parent / "dumps"))
    assert _refusal(capsys) == (f"{REFUSAL_TAG}: EXPERT_RESIDENCY_DUMP_DIR='{parent / 'dumps'}' cannot be "
                                f"created: {parent} is not writable by this process; {DUMP_FIX}")


def test_a_usable_dump_dir_passes_and_is_not_created_by_the_check(tmp_path) -> None:
    from expert_residency.core.dump import check_dump_folder

    check_dump_folder(tmp_path)
    check_dump_folder(tmp_path / "new" / "deeper")
    assert not (tmp_path / "new").exists()


def test_the_worker_refuses_the_folder_too_before_its_writer_starts(capsys, tmp_path) -> None:
    """The folder changed between the API server's check and the worker's start: the worker's
    refusal line, not the writer's FileExistsError."""
    torch = pytest.importorskip("torch")
    from plugin_entry_support import plugin_runtime

    afile = tmp_path / "afile"
    afile.write_text("x")
    tensors = {i: {"w13_weight": torch.zeros(4, 8, 4), "w13_weight_scale": torch.zeros(4, 8, 1),
                   "w2_weight": torch.zeros(4, 4, 4), "w2_weight_scale": torch.zeros(4, 4, 1)}
               for i in (0, 1)}
    runtime, _ = plugin_runtime(tensors, "count", top_k=2, max_num_tokens=8)
    runtime.settings = dataclasses.replace(runtime.settings, dump_dir=str(afile))
    with pytest.raises(ResidencyRefused, match="EXPERT_RESIDENCY_DUMP_DIR="):
        runtime._start_counter()
    assert capsys.readouterr().err == (f"{REFUSAL_TAG}: EXPERT_RESIDENCY_DUMP_DIR='{afile}' is not a folder: "
                                       f"{DUMP_FIX}\n")


# --- finding 2: EXPERT_RESIDENCY_ADAPTIVE ------------------------------------------------------

_FIELDS = ", ".join(f.name for f in dataclasses.fields(AdaptiveConfig))


@pytest.mark.parametrize("spec, reason", [
    ("interval=abc", "EXPERT_RESIDENCY_ADAPTIVE: field 'interval' = 'abc' is not an integer"),
    ("intervall=4", f"EXPERT_RESIDENCY_ADAPTIVE: unknown field 'intervall' (fields: {_FIELDS})"),
    ("interval", "EXPERT_RESIDENCY_ADAPTIVE='interval': 'interval' is not name=value"),
    ("interval=0", "EXPERT_RESIDENCY_ADAPTIVE: adaptive interval must be an integer >= 1 forward, got 0"),
])
def test_a_bad_adaptive_spec_is_refused_in_the_api_server(plugin_env, capsys, tmp_path, spec, reason) -> None:
    """The worker's parser (core.adaptive_setup), run by the API server's environment check."""
    path = tmp_path / "tiny.rowmap"
    plugin_env(EXPERT_RESIDENCY_MODE="residency", EXPERT_RESIDENCY_ROWMAP=str(path),
               EXPERT_RESIDENCY_CONTENT_HASH=_rowmap(path), EXPERT_RESIDENCY_ADAPTIVE=spec)
    assert _refusal(capsys) == f"{REFUSAL_TAG}: {reason}"
    assert "swaps_per_layer, " in _FIELDS and "prior_weight" in _FIELDS


def test_a_good_adaptive_spec_passes_the_environment_check() -> None:
    from expert_residency.vllm_plugin.settings import load_settings

    for spec in ("", "off", "on", "interval=2,swaps_per_layer=2,margin=0.25,evidence=0"):
        load_settings({"EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_ROWMAP": "/m",
                       "EXPERT_RESIDENCY_CONTENT_HASH": "a" * 64, "EXPERT_RESIDENCY_ADAPTIVE": spec})


# --- finding 3: EXPERT_RESIDENCY_ROWMAP naming a folder ----------------------------------------

def test_a_row_map_that_is_a_folder_is_said_to_be_a_folder(plugin_env, capsys, tmp_path) -> None:
    folder = tmp_path / "notdir"
    folder.mkdir()
    plugin_env(EXPERT_RESIDENCY_MODE="residency", EXPERT_RESIDENCY_ROWMAP=str(folder),
               EXPERT_RESIDENCY_CONTENT_HASH="0" * 64)
    assert _refusal(capsys) == (
        f"{REFUSAL_TAG}: row map {folder} (EXPERT_RESIDENCY_ROWMAP) is a folder, not a row map file: "
        "set EXPERT_RESIDENCY_ROWMAP to the .rowmap file itself (a bind mount of a host file that "
        "does not exist is created as an empty folder)")


def test_a_missing_row_map_still_does_not_exist(plugin_env, capsys, tmp_path) -> None:
    absent = tmp_path / "absent.rowmap"
    plugin_env(EXPERT_RESIDENCY_MODE="residency", EXPERT_RESIDENCY_ROWMAP=str(absent),
               EXPERT_RESIDENCY_CONTENT_HASH="0" * 64)
    assert _refusal(capsys) == f"{REFUSAL_TAG}: row map {absent} (EXPERT_RESIDENCY_ROWMAP) does not exist"
