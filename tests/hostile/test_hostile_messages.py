"""Message quality and leftovers: every refusal names the file, the line and the field a user can
open (never one of our temp files), special and oversized files are refused before any read, and
what a command killed at its rename leaves is removed by the next run."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from hostile_support import REFERENCE, cli, killed_at_rename, reference_plain, refused, snapshot, write_recipe


def _reference_text(project: Path) -> str:
    return (project / "recipes" / f"{REFERENCE}.yaml").read_text(encoding="utf-8")


def _write(project: Path, name: str, text: str | bytes) -> Path:
    path = project / "recipes" / f"{name}.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _line(text: str, needle: str) -> int:
    return text[:text.index(needle)].count("\n") + 1


@pytest.mark.parametrize("value", ["true", "false", "'1'", "1.0", "yes", "2"])
def test_the_schema_version_is_the_integer_1(project: Path, value: str) -> None:
    text = _reference_text(project).replace("version: 1\n", f"version: {value}\n", 1)
    _write(project, "v", text.replace(f"name: {REFERENCE}", "name: v", 1))
    out = refused("check", "recipe", "v")
    assert f"v.yaml:{_line(text, 'version:')}: field 'version'" in out


@pytest.mark.parametrize("where,length", [("lane", 300), ("lane", 64), ("class", 200), ("recipe", 64),
                                          ("profile", 100)])
def test_long_names_are_refused_at_their_line_and_leave_no_folder(project: Path, where: str, length: int) -> None:
    doc = reference_plain()
    long = "a" * length
    if where == "lane":
        doc["lanes"][0]["name"] = long
    elif where == "class":
        doc["lanes"][0]["classes"][long] = doc["lanes"][0]["classes"].pop("math")
    elif where == "recipe":
        doc["name"] = long
    else:
        doc["lanes"][0]["profile"] = long
    write_recipe(project, "longname", doc, keep_name=True)
    out = refused("render", "longname", expect="at most 63 characters")
    assert re.search(r"longname\.yaml:\d+: field '", out), out
    assert len(out) < 600   # the 300 characters are not echoed whole
    assert not (project / "compose").exists() or not any((project / "compose").iterdir())


@pytest.mark.parametrize("char", ["\x00", "\x01", "\x07", "\x1b", "\x7f", "\ufffe"])
def test_control_characters_in_a_recipe_are_refused_with_their_line(project: Path, char: str) -> None:
    text = _reference_text(project)
    needle = "  - name: agent"
    bad = text.replace(needle, needle + char, 1)
    _write(project, "ctl", bad)
    out = refused("check", "recipe", "ctl")
    assert f"ctl.yaml:{_line(text, needle)}" in out, out


@pytest.mark.parametrize("nesting", ["flow", "block"])
def test_deep_nesting_is_refused_with_its_line(project: Path, nesting: str) -> None:
    if nesting == "flow":
        text = "version: 1\nname: deep\n\nx: " + "[" * 5000 + "]" * 5000 + "\n"
        line = 4
    else:
        text = "version: 1\nname: deep\n" + "".join("  " * i + f"k{i}:\n" for i in range(100)) + "  " * 100 + "v: 1\n"
        line = None
    _write(project, "deep", text)
    out = refused("check", "recipe", "deep", expect="nested")
    if line is not None:
        assert f"deep.yaml:{line}:" in out, out
    else:
        assert re.search(r"deep\.yaml:\d+:", out), out


def test_a_number_past_pythons_digit_limit_is_refused_at_its_line(project: Path) -> None:
    text = _reference_text(project)
    bad = text.replace("port: 30006", "port: " + "9" * 5000, 1)
    _write(project, "digits", bad)
    out = refused("check", "recipe", "digits", expect="5,000 digits")
    assert f"digits.yaml:{_line(text, 'port: 30006')}:" in out and len(out) < 400


def test_undecodable_bytes_are_refused_with_their_line(project: Path) -> None:
    text = _reference_text(project)
    data = text.encode("utf-8").replace(b"  - name: agent", b"  - name: ag\xffent", 1)
    _write(project, "bytes", data)
    out = refused("check", "recipe", "bytes", expect="not UTF-8")
    assert f"bytes.yaml:{_line(text, '  - name: agent')}:" in out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_recipe_that_is_no_regular_file_is_refused_without_a_read(project: Path, kind: str) -> None:
    path = project / "recipes" / "odd.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as handle:
            handle.truncate(6 << 30)
    out = refused("check", "recipe", str(path))
    assert "odd.yaml" in out


@pytest.mark.timeout(120)
def test_a_generated_file_replaced_by_a_fifo_is_stale_not_a_hang(project: Path) -> None:
    assert cli("render", REFERENCE)[0] == 0
    compose = project / "compose" / REFERENCE / "compose.yaml"
    compose.unlink()
    os.mkfifo(compose)
    code, out = cli("render", "--check", REFERENCE)
    assert code == 1 and "compose.yaml" in out
    code, out = cli("render", REFERENCE)
    assert code == 0, out
    assert compose.is_file() and cli("render", "--check", REFERENCE)[0] == 0


def test_a_failed_write_names_the_file_not_our_temp(project: Path, monkeypatch) -> None:
    from recipegen.render import output

    assert cli("render", REFERENCE)[0] == 0
    recipe = project / "recipes" / f"{REFERENCE}.yaml"
    recipe.write_text(recipe.read_text().replace("port: 30006", "port: 30007"))
    real = output.os.replace

    def failing(src, dst):
        if str(dst).endswith("compose.yaml"):
            raise OSError(28, "No space left on device", str(src), None, str(dst))
        return real(src, dst)

    monkeypatch.setattr(output.os, "replace", failing)
    out = refused("render", REFERENCE, expect="No space left")
    monkeypatch.setattr(output.os, "replace", real)
    assert "compose.yaml" in out and ".recipegen-" not in out


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e-300", "0.01", "-1", "1e300", "ten"])
def test_dump_interval_values_the_runtime_cannot_keep_are_refused(value: str, tmp_path: Path) -> None:
    from expert_residency.core.dump import DumpConfig

    from recipegen.ops.dumps import SNAPSHOT_MARGIN_S, snapshot_wait_s

    env = {"EXPERT_RESIDENCY_DUMP_DIR": str(tmp_path), "EXPERT_RESIDENCY_DUMP_INTERVAL_S": value}
    with pytest.raises(ValueError, match="EXPERT_RESIDENCY_DUMP_INTERVAL_S"):
        DumpConfig.from_env(env)
    assert snapshot_wait_s(env) == 60.0 + SNAPSHOT_MARGIN_S   # the default, never nan or inf


@pytest.mark.parametrize("value,seconds", [("0", 0.0), ("0.1", 0.1), ("2.5", 2.5), ("604800", 604800.0)])
def test_dump_intervals_in_range_pass(value: str, seconds: float, tmp_path: Path) -> None:
    from expert_residency.core.dump import DumpConfig

    config = DumpConfig.from_env({"EXPERT_RESIDENCY_DUMP_DIR": str(tmp_path),
                                  "EXPERT_RESIDENCY_DUMP_INTERVAL_S": value})
    assert config is not None and config.interval_s == seconds


CAPTURES = {
    "digits": '{"choices": [{"routed_experts": "x", "token_ids": [%s]}]}\n' % ("9" * 5000),
    "choices": '{"choices": 5}\n',
    "usage": '{"usage": [1], "choices": [{"routed_experts": 7}]}\n',
    "nan": '{"choices": [{"routed_experts": "AAAA", "token_ids": [NaN]}]}\n',
    "list": '[1, 2, 3]\n',
    "bytes": b'{"choices": [{"routed_experts": "\xff"}]}\n',
    "nested": "[" * 100_000 + "]" * 100_000 + "\n",
}


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_hostile_capture_files_are_clean_errors(project: Path, name: str) -> None:
    path = project / f"{name}.jsonl"
    content = CAPTURES[name]
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    refused("rowmap", "reduce", str(path), "--experts", "4", "--layers", "0", "-o",
            str(project / "out.hist"))
    assert not (project / "out.hist").exists()




@pytest.mark.usefixtures("adaptive_project")
def test_save_live_killed_at_its_rename_leaves_nothing_the_next_run_keeps(project: Path) -> None:
    import shutil

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from expert_residency.formats import load_histogram, load_rowmap
    from test_ops_livemap import write_dumps

    agent = load_rowmap(project / "recipes/maps/dsv41-flash/agent.rowmap")
    folder = project / "compose" / REFERENCE / "dumps" / "agent"
    write_dumps(folder, agent, load_histogram(project / "recipes/profiles/dsv41-flash/prose.hist"))
    target = project / "recipes" / "maps" / "dsv41-flash" / "prose.rowmap"
    before = target.read_bytes()
    args = ["rowmap", "save-live", REFERENCE, "agent", "--class", "prose"]
    run = killed_at_rename(project, *args)
    assert run.returncode == -9, run.stdout + run.stderr
    assert target.read_bytes() == before          # killed before its rename: nothing half-written
    leftovers = [p.name for p in target.parent.iterdir() if ".recipegen-" in p.name]
    assert leftovers, "the kill left no temp: the test did not hit the rename"
    code, out = cli(*args)
    assert code == 0, out
    assert not [p.name for p in target.parent.iterdir() if ".recipegen-" in p.name]
    assert not [p.name for p in (project / "recipes").iterdir() if ".recipegen-" in p.name]
    assert target.read_bytes() != before
    shutil.rmtree(folder)
    assert snapshot(project / "recipes" / "maps")   # still there, whole
