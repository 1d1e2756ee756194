"""Routing captures and the rowmap commands' options and outputs, written by someone hostile:
shapes that would allocate what they declare, top_k of 0 or past the experts, 5,000-digit sizes,
outputs that are FIFOs, links or the command's own input. Every one is exit 2 naming the file
(and line) and the field, before anything is allocated from it or written."""

from __future__ import annotations

import base64
import io
import json
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from expert_residency.formats import FormatError, decode_routed_experts, histogram_from_captures
from hostile_support import REFERENCE, cli, refused
from numpy.lib import format as npy_format

GEOMETRY = ("--experts", "8", "--layers", "0-3")


@pytest.fixture()
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _b64(array: np.ndarray) -> str:
    """vLLM's `routed_experts` string (vllm/utils/serial_utils.py::numpy2base64)."""
    return base64.b64encode(_npy_bytes(array)).decode("ascii")


def _header(shape: tuple[int, ...], descr: str) -> bytes:
    buf = io.BytesIO()
    npy_format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _sparse_npy(path: Path, shape: tuple[int, ...], descr: str = "|u1") -> Path:
    """A `.npy` whose data is a hole: the header and the declared size, nothing written."""
    header = _header(shape, descr)
    with open(path, "wb") as handle:
        handle.write(header)
        handle.truncate(len(header) + int(np.prod(shape)) * np.dtype(descr).itemsize)
    return path


def _ids(shape: tuple[int, ...], experts: int = 8) -> np.ndarray:
    return np.random.default_rng(1).integers(0, experts, shape).astype(np.uint8)


# --------------------------------------------------------------- 1. top_k of zero


@pytest.mark.parametrize("command", ["reduce", "build"])
def test_a_capture_with_top_k_zero_is_refused_naming_file_and_field(here: Path, command: str) -> None:
    np.save(here / "t0.npy", np.zeros((5, 4, 0), dtype=np.uint8))
    extra = ("--hot", "4") if command == "build" else ()
    out = refused("rowmap", command, "t0.npy", *GEOMETRY, *extra, "-o", "o.out", expect="t0.npy")
    assert "field 'top_k'" in out and "top_k 0" in out
    assert not (here / "o.out").exists()


def test_a_base64_capture_with_top_k_zero_is_refused_at_its_line(here: Path) -> None:
    (here / "cap.txt").write_text("\n" + _b64(np.zeros((5, 4, 0), np.uint8)) + "\n")
    out = refused("rowmap", "reduce", "cap.txt", *GEOMETRY, "-o", "o.hist", expect="cap.txt:2")
    assert "field 'top_k'" in out
    assert not (here / "o.hist").exists()


# --------------------------------------------------------------- 2. base64 .npy header lies


@pytest.mark.parametrize("shape,descr,data", [
    ((10_000_000_000, 4, 2), "<u2", 16),      # 160 GB declared, 16 bytes present
    ((2, 4, 2), "<u2", 16),                   # 32 bytes declared, 16 present
    ((2, 4, 2), "<u2", 64),                   # 32 declared, 64 present: trailing bytes
    ((2, 4, 2), "<f4", 64),                   # not integer ids
    ((2, 4), "<u2", 16),                      # not 3-D
])
def test_a_base64_npy_header_must_describe_the_bytes_after_it(shape: tuple[int, ...], descr: str,
                                                              data: int) -> None:
    b64 = base64.b64encode(_header(shape, descr) + b"\0" * data).decode("ascii")
    tracemalloc.start()
    try:
        with pytest.raises(FormatError) as info:
            decode_routed_experts(b64, path="cap.jsonl", line=7)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (info.value.path, info.value.line, info.value.field) == ("cap.jsonl", 7, "routed_experts")
    assert peak < 1 << 20  # nothing allocated from the declared shape


def test_a_huge_declared_shape_in_a_response_is_exit_2_at_its_line(here: Path) -> None:
    b64 = base64.b64encode(_header((10_000_000_000, 4, 2), "<u2") + b"\0" * 16).decode("ascii")
    (here / "cap.jsonl").write_text(json.dumps({"choices": [{"routed_experts": b64}]}) + "\n")
    out = refused("rowmap", "reduce", "cap.jsonl", *GEOMETRY, "-o", "o.hist", expect="cap.jsonl:1")
    assert "field 'routed_experts'" in out and "declares shape" in out
    # and without --layers (the layer count is read from the first capture)
    refused("rowmap", "reduce", "cap.jsonl", "--experts", "8", "-o", "o.hist", expect="cap.jsonl:1")


# --------------------------------------------------------------- 3. bounded before any chunk is read


def test_a_raw_capture_shape_is_checked_before_any_chunk_is_converted(tmp_path: Path) -> None:
    # a sparse file: 4 MiB of holes whose chunk would be a 32 MiB int64 work array
    path = _sparse_npy(tmp_path / "wide.npy", (1, 4, 1 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(FormatError) as info:
            histogram_from_captures([path], moe_layer_indices=range(4), num_experts=8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(info.value.path) == str(path) and info.value.field == "top_k"
    assert peak < 4 << 20


def test_a_layer_axis_past_any_model_is_refused_naming_file_and_field(here: Path) -> None:
    _sparse_npy(here / "tall.npy", (1, 70_000, 1))
    refused("rowmap", "reduce", "tall.npy", *GEOMETRY, "-o", "o.hist", expect="tall.npy")
    # without --layers the default layer list is the capture's layer axis: bounded before it is built
    _sparse_npy(here / "tall2.npy", (1, 5_000, 1))
    out = refused("rowmap", "reduce", "tall2.npy", "--experts", "8", "-o", "o.hist", expect="tall2.npy")
    assert "field 'layers'" in out
    assert not (here / "o.hist").exists()


# --------------------------------------------------------------- 4. top_k > experts names its file


def test_top_k_past_the_expert_count_is_refused_at_the_capture(here: Path) -> None:
    np.save(here / "t20.npy", _ids((5, 4, 20)))
    out = refused("rowmap", "reduce", "t20.npy", *GEOMETRY, "-o", "o20.hist", expect="t20.npy")
    assert "field 'top_k'" in out
    (here / "t20.txt").write_text(_b64(_ids((5, 4, 20))) + "\n")
    refused("rowmap", "reduce", "t20.txt", *GEOMETRY, "-o", "o20.hist", expect="t20.txt:1")
    assert not (here / "o20.hist").exists()


# --------------------------------------------------------------- 5. sizes on the command line


@pytest.fixture()
def hist(here: Path) -> str:
    np.save(here / "good.npy", _ids((50, 4, 2)))
    code, out = cli("rowmap", "reduce", "good.npy", *GEOMETRY, "-o", "good.hist")
    assert code == 0, out
    return "good.hist"


@pytest.mark.parametrize("value,expect", [
    ("9" * 5000, "5,000 characters"),
    ("99999999999999999999999999999", "at most 1 EiB"),
    ("2 EiB", ""),
    ("0", "must be positive"),
    ("0 B", "must be positive"),
    ("-5 GiB", "must be positive"),
    ("\u00b2", ""),          # SUPERSCRIPT TWO: str.isdigit() says yes, int() says no
    ("\u0663", ""),          # ARABIC-INDIC DIGIT THREE
])
def test_bytes_per_expert_is_bounded_before_int(hist: str, value: str, expect: str) -> None:
    out = refused("rowmap", "build", hist, "--cold-budget", "1 KiB", "--bytes-per-expert", value,
                  "-o", "c.rowmap", expect=expect)
    assert "field '--bytes-per-expert'" in out
    assert not Path("c.rowmap").exists()


@pytest.mark.parametrize("value", ["9" * 5000, "9" * 40 + " GiB", "-1 GiB"])
def test_cold_budget_is_bounded_before_int(hist: str, value: str) -> None:
    refused("rowmap", "build", hist, "--cold-budget", value, "--bytes-per-expert", "64",
            "-o", "c.rowmap", expect="field '--cold-budget'")


def test_show_bounds_bytes_per_expert_too(hist: str) -> None:
    code, out = cli("rowmap", "build", hist, "--hot", "4", "-o", "m.rowmap")
    assert code == 0, out
    refused("rowmap", "show", "m.rowmap", "--bytes-per-expert", "9" * 5000, expect="--bytes-per-expert")
    refused("rowmap", "show", "m.rowmap", "--bytes-per-expert", "0", expect="must be positive")


# --------------------------------------------------------------- 6. synth --tokens


@pytest.mark.parametrize("tokens", ["4611686018427387904", "1152921504606846976", "0", "-1"])
def test_synth_tokens_are_bounded(here: Path, tokens: str) -> None:
    refused("rowmap", "synth", *GEOMETRY, "--top-k", "2", "--tokens", tokens, "-o", "out",
            expect="field '--tokens'")
    assert not (here / "out").exists()


def test_synth_top_k_past_the_experts_is_refused(here: Path) -> None:
    refused("rowmap", "synth", *GEOMETRY, "--top-k", "9", "-o", "out", expect="field '--top-k'")
    assert not (here / "out").exists()


# --------------------------------------------------------------- 7. outputs


def _special(here: Path, kind: str) -> Path:
    path = here / f"out.{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        path.symlink_to(here / "elsewhere")
    else:
        (here / "target").write_text("x")
        path.symlink_to(here / "target")
    return path


@pytest.mark.parametrize("kind", ["fifo", "link", "link-to-file"])
@pytest.mark.parametrize("command", ["reduce", "build"])
def test_an_output_that_is_not_a_regular_file_is_refused(here: Path, hist: str, kind: str,
                                                         command: str) -> None:
    target = _special(here, kind)
    args = (["reduce", "good.npy", *GEOMETRY] if command == "reduce" else ["build", hist, "--hot", "4"])
    out = refused("rowmap", *args, "-o", target.name, expect=target.name)
    assert "field '--output'" in out
    assert target.is_symlink() or kind == "fifo"  # left as it was
    if kind == "fifo":
        assert not target.is_file()


@pytest.mark.parametrize("command", ["reduce", "build"])
def test_an_output_that_is_an_input_is_refused(here: Path, hist: str, command: str) -> None:
    os.link(here / "good.npy", here / "hard.npy")
    before = (here / "good.npy").read_bytes(), (here / hist).read_bytes()
    if command == "reduce":
        for output in ("good.npy", "./x/../good.npy", str(here / "good.npy"), "hard.npy"):
            refused("rowmap", "reduce", "good.npy", *GEOMETRY, "-o", output, expect="field '--output'")
    else:
        refused("rowmap", "build", hist, "--hot", "4", "-o", hist, expect="field '--output'")
    assert ((here / "good.npy").read_bytes(), (here / hist).read_bytes()) == before


def test_an_output_file_name_too_long_for_its_lock_is_refused_naming_it(hist: str) -> None:
    name = "m" * 245 + ".rowmap"
    out = refused("rowmap", "build", hist, "--hot", "4", "-o", name, expect="field '--output'")
    assert "recipegen-lock" not in out and "recipegen-tmp" not in out


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_save_live_output_is_checked_first(project: Path, kind: str) -> None:
    target = _special(project, kind)
    refused("rowmap", "save-live", REFERENCE, "agent", "--class", "prose", "-o", target.name,
            expect="field '--output'")
    assert target.is_symlink() or not target.is_file()


def test_save_live_refuses_to_write_over_its_recipe(project: Path) -> None:
    recipe = project / "recipes" / f"{REFERENCE}.yaml"
    before = recipe.read_bytes()
    refused("rowmap", "save-live", REFERENCE, "agent", "--class", "prose", "-o", str(recipe),
            expect="field '--output'")
    assert recipe.read_bytes() == before


def test_synth_class_file_that_is_a_fifo_is_refused_before_any_class_is_written(here: Path) -> None:
    (here / "out").mkdir()
    os.mkfifo(here / "out" / "second.hist")
    refused("rowmap", "synth", *GEOMETRY, "--top-k", "2", "--class", "first", "--class", "second",
            "-o", "out", expect="second.hist")
    assert sorted(p.name for p in (here / "out").iterdir()) == ["second.hist"]


# --------------------------------------------------------------- 8. class names


def test_a_class_name_too_long_for_a_file_is_refused_before_anything_is_written(here: Path) -> None:
    out = refused("rowmap", "synth", *GEOMETRY, "--top-k", "2", "--class", "first",
                  "--class", "c" * 250, "-o", "out", expect="field '--class'")
    assert "recipegen-lock" not in out and "recipegen-tmp" not in out
    assert not (here / "out").exists() or not any((here / "out").iterdir())


def test_the_longest_class_name_allowed_is_written(here: Path) -> None:
    code, out = cli("rowmap", "synth", *GEOMETRY, "--top-k", "2", "--tokens", "10",
                    "--class", "c" * 234, "-o", "out")
    assert code == 0, out
    assert [p.name for p in (here / "out").iterdir()] == ["c" * 234 + ".hist"]
