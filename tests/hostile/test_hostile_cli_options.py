"""Command-line values: numbers that are not finite, counts no lane can reach and paths the write
would misuse are refused with exit 2 before anything is computed or written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hostile_support import REFERENCE, cli, refused

SWEEP = ("--sweep", "hot=290..300")


@pytest.mark.parametrize("value", ["nan", "NaN", "-nan"])
def test_a_nan_acceptance_is_refused(project: Path, value: str) -> None:
    # click's FloatRange lets NaN through (every comparison with it is false): the estimate then
    # failed converting NaN to an integer, or printed bare NaN tokens as --json
    for extra in ((), ("--json",)):
        code, out = cli("plan", REFERENCE, "agent", "--acceptance", value, *extra)
        assert code == 2, out
        assert "'--acceptance'" in out and "not a finite number" in out and "Traceback" not in out


@pytest.mark.parametrize("option, value, expect", [
    ("--concurrency", "999999999999", "from 1 to 65,536"),
    ("--concurrency", "1,70000", "from 1 to 65,536"),
    # DeepSeek-V4.1-Flash has 384 routed experts per layer: no more spare slots than that
    ("--prefetch-slots", "385", "384 routed experts"),
    # the reference lane's max_model_len is 1,048,576 tokens
    ("--context", "1048577", "max_model_len (1,048,576)"),
])
def test_plan_counts_beyond_the_lane_are_refused(project: Path, option: str, value: str, expect: str) -> None:
    out = refused("plan", REFERENCE, "agent", option, value)
    assert f"field '{option}'" in out and expect in out


def test_plan_counts_at_the_bounds_pass(project: Path) -> None:
    code, out = cli("plan", REFERENCE, "agent", "--prefetch-slots", "384", "--context", "1048576", "--concurrency", "1")
    assert code == 0, out


@pytest.mark.parametrize("command", [("drift", REFERENCE, "agent", "--tolerance"), ("verify", REFERENCE, "agent",
                                                                                   "--kv-tolerance")])
def test_other_float_options_refuse_nan(project: Path, command: tuple[str, ...]) -> None:
    code, out = cli(*command, "nan")
    assert code == 2 and "not a finite number" in out, out


def test_plot_never_replaces_what_is_not_a_regular_file(project: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder_link = tmp_path / "link.png"
    folder_link.symlink_to(tmp_path / "elsewhere.png")
    for target, expect in ((fifo, "not a regular file"), (folder_link, "is a link"),
                           (tmp_path / "missing" / "sweep.png", "does not exist (it is never created)")):
        out = refused("plan", REFERENCE, "agent", *SWEEP, "--plot", str(target), expect=expect)
        assert "field '--plot'" in out
    assert fifo.exists() and not fifo.is_file()                 # still the FIFO
    assert folder_link.is_symlink() and not (tmp_path / "elsewhere.png").exists()
    assert not (tmp_path / "missing").exists()
    # a regular file is replaced, as asked
    png = tmp_path / "sweep.png"
    png.write_bytes(b"old")
    code, out = cli("plan", REFERENCE, "agent", *SWEEP, "--plot", str(png))
    assert code == 0, out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_names_its_own_option(project: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "machine.yaml"
    os.mkfifo(fifo)
    out = refused("compare", REFERENCE, "--machines", str(fifo), expect="field '--machines'")
    assert "field '--machine'" not in out


@pytest.mark.parametrize("command", [("model", "import", "{fixture}"), ("new", "qwen3-30b-a3b", "--machine", "rtx-4090")])
def test_force_replaces_a_regular_file_only(project: Path, tmp_path: Path, command: tuple[str, ...]) -> None:
    # --force lets an output replace the file there, never a FIFO standing where the file goes
    fixture = str(Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs" / "qwen3-30b-a3b")
    fifo = tmp_path / "out.yaml"
    os.mkfifo(fifo)
    args = [a.replace("{fixture}", fixture) for a in command]
    out = refused(*args, "-o", str(fifo), "--force", expect="not a regular file")
    assert "field '--output'" in out and not fifo.is_file()
