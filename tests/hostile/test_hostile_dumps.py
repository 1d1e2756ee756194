"""Dump files are checked, not believed (recipegen.ops.dumps, recipegen.ops.livemap), and read
only as what the runtime writes: bounded regular files with the runtime's names.

A dump whose meta contradicts its name, whose counts exceed what its token counter allows, whose
live map's hashes, name, barriers or swaps do not match the map file, or a window with negative
tokens is refused (exit 2, naming the file and the field); what cannot be recomputed (the runtime's
window cold share, its chosen profile) is labelled as the runtime's report. A 6 GiB file, a FIFO or
a device in the dump folder is never read into memory or waited on; nor is one given to the
runtime's priors loader."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tarfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
import yaml
from expert_residency.contract import env as runtime_env
from expert_residency.core.dump import DumpConfig, HistogramDumper, dump_file_name
from expert_residency.formats import FormatError, Histogram, load_histogram, load_rowmap
from hostile_support import cli, refused

from recipegen.common.errors import InputError, RecipegenError
from recipegen.ops.dumps import difference, read_host_dir, snapshots
from recipegen.ops.livemap import REPORTED, describe, latest_live_map

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_ops_livemap import FixedCounter, FixedPolicy, write_dumps  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
REFERENCE = "dsv41-flash-gb300"
NAME = "agent__agent__residency__20261201T100000.000000Z__000001.hist"


@pytest.fixture()
def dumps(project: Path) -> Path:
    """compose/<reference>/dumps/agent with two snapshots of an adaptive lane (the real writer)."""
    folder = project / "compose" / REFERENCE / "dumps" / "agent"
    agent = load_rowmap(project / "recipes/maps/dsv41-flash/agent.rowmap")
    write_dumps(folder, agent, load_histogram(project / "recipes/profiles/dsv41-flash/prose.hist"))
    return folder


def _newest(folder: Path) -> Path:
    return sorted(folder.glob("*.hist"))[-1]


def _edit_meta(path: Path, key: str, value: object) -> None:
    lines = path.read_text().splitlines()
    index = next(i for i, l in enumerate(lines) if l.startswith(f"meta.{key}: "))
    lines[index] = f"meta.{key}: {json.dumps(value, sort_keys=True)}"
    path.write_text("\n".join(lines) + "\n")


# save-live reads the live map an adaptive lane writes: the reference lane made adaptive
pytestmark = pytest.mark.usefixtures("adaptive_project")


def _meta(path: Path, key: str) -> object:
    line = next(l for l in path.read_text().splitlines() if l.startswith(f"meta.{key}: "))
    return json.loads(line.split(": ", 1)[1])


def _save_live(*extra: str, expect: str = "") -> str:
    return refused("rowmap", "save-live", REFERENCE, "agent", "--class", "prose", *extra, expect=expect)


def test_the_writers_own_dumps_pass(project: Path, dumps: Path) -> None:
    code, out = cli("rowmap", "save-live", REFERENCE, "agent", "--class", "prose")
    assert code == 0, out
    assert "as the runtime counted them, cross-checked" in out and "hashes recomputed" in out


@pytest.mark.parametrize("key,value", [("lane", "other"), ("class", "prose"), ("mode", "unsplit"),
                                       ("seq", 99), ("seq", "2")])
def test_meta_that_contradicts_the_file_name_is_refused(project: Path, dumps: Path, key: str, value: object) -> None:
    _edit_meta(_newest(dumps), key, value)
    out = _save_live(expect="contradicts itself")
    assert f"meta.{key}" in out and _newest(dumps).name in out


def _profile_boot_config(folder: Path) -> DumpConfig:
    """The dump settings of the reference's profile boot as rendered (count mode, no class set),
    read by the runtime's own reader of that environment."""
    compose = yaml.safe_load((REPO / "compose" / REFERENCE / "compose.yaml").read_text())
    environment = {k: str(v) for k, v in compose["services"]["lane-agent-profile"]["environment"].items()}
    environment[runtime_env.DUMP_DIR] = str(folder)
    config = DumpConfig.from_env(environment)
    assert config is not None
    return config


def test_a_profile_boots_own_count_only_dumps_pass(project: Path, tmp_path: Path) -> None:
    """A count-only boot runs no class: the runtime names its dumps class 'none' and writes the same
    in their meta, whatever traffic it counted (here the math histogram, whose meta says 'math')."""
    folder = tmp_path / "profile"
    config = _profile_boot_config(folder)
    assert (config.lane, config.traffic_class, config.mode) == ("agent", "none", "count-only")
    math = load_histogram(project / "recipes/profiles/dsv41-flash/math.hist")
    assert math.meta["class"] == "math"
    dumper = HistogramDumper(FixedCounter(math), config)
    written = [dumper.dump_now("signal"), dumper.dump_now("shutdown")]
    found = snapshots(read_host_dir(folder), where="profile")
    assert [s.name for s in found] == [p.name for p in written]
    assert [(s.lane, s.traffic_class, s.mode, s.seq) for s in found] == [("agent", "none", "count-only", 1),
                                                                        ("agent", "none", "count-only", 2)]
    assert [(s.histogram.meta["class"], s.histogram.meta["mode"]) for s in found] == [("none", "count-only")] * 2


@pytest.mark.parametrize("key,value", [("class", "math"), ("lane", "prose"), ("mode", "residency"), ("seq", 2)])
def test_a_count_only_dump_whose_meta_contradicts_its_name_is_refused(project: Path, tmp_path: Path, key: str,
                                                                      value: object) -> None:
    folder = tmp_path / "profile"
    math = load_histogram(project / "recipes/profiles/dsv41-flash/math.hist")
    path = HistogramDumper(FixedCounter(math), _profile_boot_config(folder)).dump_now("signal")
    _edit_meta(path, key, value)
    with pytest.raises(InputError, match="contradicts itself") as err:
        snapshots(read_host_dir(folder), where="profile")
    assert f"meta.{key}" in str(err.value) and path.name in str(err.value)


def test_a_class_histogram_copied_under_a_profile_boots_name_is_refused(project: Path, tmp_path: Path) -> None:
    """Not written by the runtime: a committed class histogram (meta.class 'math') put in the dump
    folder under the name a count-only boot gives its snapshots."""
    folder = tmp_path / "profile"
    folder.mkdir()
    name = dump_file_name("agent", "none", "count-only", datetime(2026, 12, 3, 10, 20, 45, tzinfo=timezone.utc), 1)
    shutil.copy(project / "recipes/profiles/dsv41-flash/math.hist", folder / name)
    with pytest.raises(InputError, match="meta.class 'math' but the file name says 'none'") as err:
        snapshots(read_host_dir(folder), where="profile")
    assert name in str(err.value)


def test_more_selections_than_tokens_times_top_k_is_refused(project: Path, dumps: Path) -> None:
    path = _newest(dumps)
    text = path.read_text()
    tokens = next(l for l in text.splitlines() if l.startswith("tokens: "))
    path.write_text(text.replace(tokens, "tokens: 1", 1))
    _save_live(expect="more than tokens × top_k")


@pytest.mark.parametrize("field,value", [
    ("shape_hash", "0" * 64), ("boot_content_hash", "f" * 64), ("barriers", 1), ("swaps", 6),
    ("file", "agent__agent__residency__20261201T100000.000000Z__000001.rowmap"), ("prior", "x\ny"),
])
def test_a_live_map_that_contradicts_its_map_file_is_refused(project: Path, dumps: Path, field: str,
                                                            value: object) -> None:
    path = _newest(dumps)
    live = dict(_meta(path, "live_map"))  # type: ignore[arg-type]
    live[field] = value
    _edit_meta(path, "live_map", live)
    out = _save_live()
    assert "live map" in out or "live_map" in out, out


def test_swaps_past_what_any_barrier_allows_are_refused(project: Path, dumps: Path) -> None:
    """Edited in both places (the histogram's meta and the map's provenance) so they agree:
    7 swaps are claimed as 10^9, more than barriers × 40 layers × 384 experts."""
    path = _newest(dumps)
    live = dict(_meta(path, "live_map"))  # type: ignore[arg-type]
    live["swaps"] = 10**9
    _edit_meta(path, "live_map", live)
    rowmap = dumps / live["file"]
    rowmap.write_text(rowmap.read_text().replace("provenance.swaps: 7", f"provenance.swaps: {10**9}"))
    _save_live(expect="possible")


def test_swaps_past_the_lanes_own_cap_are_refused_by_save_live(project: Path, dumps: Path) -> None:
    recipe = project / "recipes" / f"{REFERENCE}.yaml"
    text = recipe.read_text()
    adaptive = "      adaptive: {swaps_per_layer: 4, priors: [prose, math]}\n"   # adaptive_project's
    assert text.count(adaptive) == 1
    recipe.write_text(text.replace(adaptive, "      adaptive: {swaps_per_layer: 0}\n"))
    _save_live(expect="swaps_per_layer 0 allows")


def test_what_cannot_be_recomputed_is_labelled_as_the_runtimes_report(project: Path, dumps: Path) -> None:
    view = latest_live_map(read_host_dir(dumps), where="d", lane="agent")
    assert view is not None
    figures = view.against(None)
    assert figures["reported"] == list(REPORTED) == ["cold_share_now", "prior"]
    assert any("shape_hash" in v for v in figures["verified"])
    assert "the runtime's report" in describe(figures)


def test_a_window_with_negative_tokens_is_refused() -> None:
    counts = np.array([[5, 5]])
    after = Histogram((0,), 2, counts, 10, top_k=1)
    before = Histogram((0,), 2, np.array([[1, 1]]), 20, top_k=1)
    with pytest.raises(RecipegenError, match="negative tokens"):
        difference(after, before, source="w")
    after = Histogram((0,), 2, counts, 30, decode_tokens=10, prefill_tokens=20, top_k=1)
    before = Histogram((0,), 2, np.array([[1, 1]]), 20, decode_tokens=15, prefill_tokens=5, top_k=1)
    with pytest.raises(RecipegenError, match="negative decode_tokens"):
        difference(after, before, source="w")


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as handle:
        handle.truncate(size)


@pytest.mark.timeout(60)
def test_an_unrelated_huge_file_in_the_dump_folder_is_never_read(project: Path, dumps: Path) -> None:
    _sparse(dumps / "core.dump", 6 << 30)          # 6 GiB, not a dump name: never opened
    os.mkfifo(dumps / "pipe")
    code, out = cli("rowmap", "save-live", REFERENCE, "agent", "--class", "prose")
    assert code == 0, out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["huge", "fifo", "device"])
def test_a_dump_named_special_file_is_refused_not_read(project: Path, dumps: Path, kind: str) -> None:
    target = dumps / "agent__agent__residency__20261201T110000.000000Z__000009.hist"
    if kind == "huge":
        _sparse(target, 6 << 30)
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    out = _save_live()
    assert target.name in out


def test_the_container_archive_is_streamed_and_filtered() -> None:
    """`list_dir` through the engine: unrelated and oversized members are not kept in memory."""
    from recipegen.ops.dumps import DUMP_FILE_LIMIT
    from recipegen.ops.engine import EngineError, list_dir

    def archive(members: dict[str, int]) -> list[bytes]:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name, size in members.items():
                info = tarfile.TarInfo(f"agent/{name}")
                info.size = size
                tar.addfile(info, io.BytesIO(b"x" * size))
        data = buffer.getvalue()
        return [data[i:i + 65536] for i in range(0, len(data), 65536)]

    class Client:
        def __init__(self, chunks: list[bytes]) -> None:
            self.containers = self
            self.chunks = chunks

        def get(self, _id: str) -> Client:
            return self

        def get_archive(self, _path: str) -> tuple[list[bytes], dict]:
            return self.chunks, {}

    files = list_dir(Client(archive({NAME: 10, "unrelated.bin": 3 << 20, "notes.txt": 5})), "c" * 12, "/d")
    assert files == {NAME: b"x" * 10}
    assert list_dir(Client(archive({"notes.txt": 5})), "c" * 12, "/d", keep=None) == {"notes.txt": b"xxxxx"}
    big = archive({NAME: 0})
    with pytest.raises(EngineError, match="more than a dump file"):
        # the header says more than the limit: refused from the header, before reading it
        header = tarfile.TarInfo(f"agent/{NAME}")
        header.size = DUMP_FILE_LIMIT + 1
        buffer = io.BytesIO(header.tobuf())
        list_dir(Client([buffer.getvalue(), b"\0" * 1024]), "c" * 12, "/d")
    assert big


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_the_runtimes_priors_loader_refuses_special_files(tmp_path: Path, kind: str) -> None:
    from expert_residency.core.adaptive_setup import priors_from_histograms

    path = tmp_path / "prior.hist"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    with pytest.raises(FormatError, match="not a regular file|folder"):
        priors_from_histograms([path], [0], 4)


def test_a_dump_written_by_the_runtime_with_a_hostile_source_reads_back(tmp_path: Path) -> None:
    """The dump writer's own strings (source, meta) can hold any character: they are written as
    JSON escapes the reader takes back."""
    hist = Histogram((0,), 2, np.array([[3, 1]]), 2, top_k=2, source="a\u2028b\x85c\nd")
    config = DumpConfig(tmp_path, 0.0, "agent", "agent", "residency")
    path = HistogramDumper(FixedCounter(hist), config, source="s\u2029x",
                           live_map=None).dump_now()
    assert load_histogram(path).source == "s\u2029x"
    assert snapshots(read_host_dir(tmp_path), where="d")[0].histogram.source == "s\u2029x"
    assert FixedPolicy and InputError  # imported helpers used by the other tests
