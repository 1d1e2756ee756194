"""Writers killed at their rename: `rowmap build`, `rowmap reduce`, `rowmap synth` and
`rowmap save-live` (with `model import` and `recipegen k8s` in test_hostile_concurrency.py).

Each command runs in a real process killed with SIGKILL at its first (or n-th) `os.replace`:
the temp file is complete on disk, no `finally` runs. The file the command was writing is the
old one or absent, never half of it; and the next run — of the same command, or of any command
writing into the same folder — leaves the folder holding exactly what it should: no temp and no
lock file survives, whatever its name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from expert_residency.core.dump import DumpConfig, HistogramDumper
from expert_residency.formats import RowMap, load_histogram, load_rowmap
from hostile_support import REFERENCE, cli, killed_at_rename
from live_map_support import FixedCounter, FixedLivePolicy, exchanged_map

from recipegen.common.lock import TEMP_SUFFIX, lock_file_for, temp_file_for

# routed-expert ids of 4 tokens, 2 MoE layers, top-2 of 4 experts (a raw capture)
IDS = np.array([[[0, 1], [3, 2]], [[0, 2], [3, 1]], [[0, 1], [2, 3]], [[1, 0], [3, 2]]])
GEOMETRY = ["--experts", "4", "--layers", "0-1"]


def _killed(project: Path, *args: str, at: int = 1) -> None:
    run = killed_at_rename(project, *args, at=at)
    assert run.returncode == -9, f"exit {run.returncode}: {run.stdout}{run.stderr}"


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_build_killed_at_its_rename_leaves_nothing_its_next_run_keeps(project: Path) -> None:
    folder = project / "maps"
    np.save(project / "cap.npy", IDS)
    build = ["rowmap", "build", "cap.npy", *GEOMETRY, "--hot", "2", "-o", "maps/m.rowmap"]
    _killed(project, *build)
    target = folder / "m.rowmap"
    assert not target.exists() and temp_file_for(target).is_file()   # killed before the rename
    assert temp_file_for(target).name == f".m.rowmap{TEMP_SUFFIX}"
    code, out = cli(*build)
    assert code == 0, out
    assert _names(folder) == ["m.rowmap"]
    # hand count: layer 0 picks 0,0,0,1 / 1,2,1,0 -> counts [4,3,1,0]: hot {0,1}; layer 1 picks
    # 3,3,2,3 / 2,1,3,2 -> counts [0,1,3,4]: hot {2,3}
    assert [list(h) for h in load_rowmap(target).hot] == [[0, 1], [2, 3]]


def test_a_rewrite_killed_keeps_the_old_file_and_another_target_sweeps_the_temp(project: Path) -> None:
    """Killed while replacing an existing map: the old map stays whole. A build of another file
    in the same folder removes the dead run's temp and lock (nobody holds them)."""
    folder = project / "maps"
    np.save(project / "cap.npy", IDS)
    assert cli("rowmap", "build", "cap.npy", *GEOMETRY, "--hot", "2", "-o", "maps/a.rowmap")[0] == 0
    before = (folder / "a.rowmap").read_bytes()
    _killed(project, "rowmap", "build", "cap.npy", *GEOMETRY, "--hot", "1", "-o", "maps/a.rowmap")
    assert (folder / "a.rowmap").read_bytes() == before
    assert temp_file_for(folder / "a.rowmap").is_file()
    assert lock_file_for(folder / "a.rowmap").is_file()   # the killed holder's, let go by dying
    code, out = cli("rowmap", "build", "cap.npy", *GEOMETRY, "--hot", "3", "-o", "maps/b.rowmap")
    assert code == 0, out
    assert _names(folder) == ["a.rowmap", "b.rowmap"]
    assert (folder / "a.rowmap").read_bytes() == before


def test_a_reduce_killed_at_its_rename_is_cleaned_by_the_next_run(project: Path) -> None:
    np.save(project / "cap.npy", IDS)
    reduce = ["rowmap", "reduce", "cap.npy", *GEOMETRY, "-o", "out/h.hist"]
    _killed(project, *reduce)
    assert _names(project / "out") == sorted([f".h.hist{TEMP_SUFFIX}", lock_file_for(project / "out" / "h.hist").name])
    code, out = cli(*reduce)
    assert code == 0, out
    assert _names(project / "out") == ["h.hist"]
    hist = load_histogram(project / "out" / "h.hist")
    assert hist.tokens == 4 and hist.counts.tolist() == [[4, 3, 1, 0], [0, 1, 3, 4]]


def test_a_synth_killed_between_two_classes_is_cleaned_by_the_next_run(project: Path) -> None:
    synth = ["rowmap", "synth", *GEOMETRY, "--top-k", "2", "--tokens", "20", "--class", "a",
             "--class", "b", "-o", "syn"]
    _killed(project, *synth, at=2)   # a.hist renamed into place, b.hist's temp complete
    assert _names(project / "syn") == sorted(["a.hist", f".b.hist{TEMP_SUFFIX}",
                                              lock_file_for(project / "syn" / "b.hist").name])
    code, out = cli(*synth)
    assert code == 0, out
    assert _names(project / "syn") == ["a.hist", "b.hist"]


def _live_dumps(project: Path) -> RowMap:
    """Lane agent's dump folder, written by the runtime's own dump writer, with a live map that
    differs from the boot map by 3 hot/cold exchanges in its first layer."""

    boot = load_rowmap(project / "recipes/maps/dsv41-flash/agent.rowmap")
    live = exchanged_map(boot, layers=1, pairs=3, barriers=1)
    traffic = load_histogram(project / "recipes/profiles/dsv41-flash/prose.hist")
    folder = project / "compose" / REFERENCE / "dumps" / "agent"
    HistogramDumper(FixedCounter(traffic), DumpConfig(folder, 0.0, "agent", "agent", "residency"),
                    live_map=FixedLivePolicy(live, window_cold_share=0.02, prior="agent")).dump_now("interval")
    return live


@pytest.mark.usefixtures("adaptive_project")
def test_a_save_live_killed_at_its_rename_keeps_the_old_map_and_is_cleaned_next(project: Path) -> None:
    live = _live_dumps(project)
    maps = project / "recipes" / "maps" / "dsv41-flash"
    target = maps / "prose.rowmap"
    before, listing = target.read_bytes(), _names(maps)
    _killed(project, "rowmap", "save-live", REFERENCE, "agent", "--class", "prose")
    assert target.read_bytes() == before                  # the old map, whole
    assert temp_file_for(target).is_file()
    code, out = cli("rowmap", "save-live", REFERENCE, "agent", "--class", "prose")
    assert code == 0, out
    assert _names(maps) == listing                         # no temp, no lock file
    assert load_rowmap(target).content_hash() == live.content_hash()
    assert not [p for p in (project / "recipes").iterdir() if p.name.startswith(".")]
