"""An adaptive lane's live map through the tools: dumps written by the runtime's own dump writer
(`HistogramDumper` with a live-map source), read by `status`, `drift` and `rowmap save-live`.

The engine is a stand-in here (a counter and a policy with fixed answers, the container listing
patched); tests/test_ops_engine.py drives the same readers through a real Docker engine.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from cli_support import invoke
from expert_residency.core.dump import DumpConfig, HistogramDumper, LiveMap, live_map_file_name
from expert_residency.formats import Histogram, RowMap, load_histogram, load_rowmap

from recipegen.common.errors import RecipegenError
from recipegen.ops import labels
from recipegen.ops.dumps import read_host_dir, snapshots
from recipegen.ops.engine import ContainerInfo
from recipegen.ops.livemap import latest_live_map, live_map_of

REPO = Path(__file__).resolve().parent.parent
REFERENCE = "dsv41-flash-gb300"


@pytest.fixture
def project(project: Path) -> Path:
    """The scratch project with the reference lane made adaptive (as tests/test_ops_engine_adaptive.py
    does): save-live reads the live map only an adaptive lane writes, and refuses any other lane."""
    recipe = project / "recipes" / f"{REFERENCE}.yaml"
    text = recipe.read_text()
    anchor = "      hot_experts_per_layer: 295"
    end = text.index("\n", text.index(anchor)) + 1
    recipe.write_text(text[:end] + "      adaptive: {swaps_per_layer: 4, priors: [prose, math]}\n" + text[end:])
    return project


class FixedCounter:
    """What the dump writer reads from an `ExpertCounter`: its histogram."""

    def __init__(self, hist: Histogram) -> None:
        self.hist = hist

    def to_histogram(self, *, source: str, model_revision: str, meta: dict) -> Histogram:
        return Histogram(self.hist.moe_layer_indices, self.hist.num_experts, self.hist.counts,
                         self.hist.tokens, top_k=self.hist.top_k, source=source,
                         model_revision=model_revision, meta=meta)


class FixedPolicy:
    """What the dump writer reads from an `AdaptivePolicy`: the live map and the last window."""

    def __init__(self, rowmap: RowMap, share: float | None, prior: str | None) -> None:
        self.rowmap, self.share, self.prior = rowmap, share, prior

    def live_rowmap(self) -> RowMap:
        return self.rowmap

    def status(self) -> dict:
        return {"window_cold_share": self.share, "prior": self.prior}


def swapped(rowmap: RowMap, pairs: int, boot: str, barriers: int) -> RowMap:
    """`rowmap` after `pairs` hot/cold exchanges in its first layer (same shape, new content),
    with the provenance the policy's `live_rowmap` gives it."""
    hot = [list(ids) for ids in rowmap.hot]
    cold = [list(ids) for ids in rowmap.cold]
    for i in range(pairs):
        hot[0][i], cold[0][i] = cold[0][i], hot[0][i]
    return RowMap(rowmap.moe_layer_indices, rowmap.num_experts, hot, cold,
                  {"builder": "adaptive", "barriers": barriers, "swaps": pairs, "boot_content_hash": boot})


def write_dumps(folder: Path, agent_map: RowMap, traffic: Histogram) -> tuple[RowMap, RowMap]:
    """Two snapshots of lane agent through the real writer: after 3 swaps, then after 7."""
    boot = agent_map.content_hash()
    first, second = swapped(agent_map, 3, boot, 2), swapped(agent_map, 7, boot, 5)
    t0 = datetime(2026, 12, 1, 10, 0, 0, tzinfo=timezone.utc)
    config = DumpConfig(folder, 0.0, "agent", "agent", "residency")
    for i, (live, share) in enumerate(((first, 0.08), (second, 0.021))):
        HistogramDumper(FixedCounter(traffic), config, clock=lambda i=i: t0 + timedelta(minutes=i),
                        live_map=FixedPolicy(live, share, "prose")).dump_now("interval")
    return first, second


def test_dump_folder_reads_back_the_newest_live_map(project: Path) -> None:
    agent = load_rowmap(project / "recipes/maps/dsv41-flash/agent.rowmap")
    prose = load_histogram(project / "recipes/profiles/dsv41-flash/prose.hist")
    folder = project / "dumps"
    _, second = write_dumps(folder, agent, prose)
    files = read_host_dir(folder)
    assert len(files) == 4  # two histograms, each with its map beside it
    view = latest_live_map(files, where="dumps", lane="agent")
    assert view is not None
    assert view.rowmap.content_hash() == second.content_hash() == view.live.content_hash
    figures = view.against(agent.content_hash())
    assert figures["matches_recipe"] is False
    assert (figures["swaps"], figures["barriers"], figures["cold_share_now"]) == (7, 5, 0.021)
    assert figures["boot_content_hash"] == agent.content_hash()
    assert view.against(second.content_hash())["matches_recipe"] is True


def test_a_live_map_file_that_is_not_the_dumps_is_refused(project: Path) -> None:
    agent = load_rowmap(project / "recipes/maps/dsv41-flash/agent.rowmap")
    folder = project / "dumps"
    first, _ = write_dumps(folder, agent, load_histogram(project / "recipes/profiles/dsv41-flash/prose.hist"))
    files = read_host_dir(folder)
    newest = snapshots(files, where="dumps")[-1]
    live = LiveMap.from_meta(newest.histogram.meta)
    assert live is not None and live.file == live_map_file_name(newest.name)
    files[live.file] = files[live_map_file_name(snapshots(files, where="dumps")[0].name)]  # the older map
    with pytest.raises(RecipegenError, match="not the same write"):
        live_map_of(files, newest, where="dumps")
    del files[live.file]
    with pytest.raises(RecipegenError, match="not in the dump folder"):
        live_map_of(files, newest, where="dumps")


def test_static_lane_dumps_have_no_live_map(project: Path) -> None:
    folder = project / "dumps"
    prose = load_histogram(project / "recipes/profiles/dsv41-flash/prose.hist")
    HistogramDumper(FixedCounter(prose), DumpConfig(folder, 0.0, "agent", "agent", "residency")).dump_now()
    assert latest_live_map(read_host_dir(folder), where="dumps") is None


def test_save_live_keeps_the_live_map_as_a_class_map(project: Path) -> None:
    agent = load_rowmap(project / "recipes/maps/dsv41-flash/agent.rowmap")
    prose = load_histogram(project / "recipes/profiles/dsv41-flash/prose.hist")
    folder = project / "compose" / REFERENCE / "dumps" / "agent"  # where the rendering mounts them
    _, second = write_dumps(folder, agent, prose)
    result = invoke("rowmap", "save-live", REFERENCE, "agent", "--class", "prose", "--json")
    assert result.code == 0, result.output + (result.stderr or "")
    doc = json.loads(result.stdout)
    assert doc["content_hash"] == second.content_hash() and doc["swaps"] == 7
    saved = load_rowmap(project / "recipes/maps/dsv41-flash/prose.rowmap")
    assert saved.content_hash() == second.content_hash()
    assert saved.provenance["builder"] == "adaptive" and saved.provenance["class"] == "prose"
    assert saved.provenance["saved_from"] == snapshots(read_host_dir(folder), where="d")[-1].name
    # the recipe still validates with it (budget, geometry) and its budgets hold
    check = invoke("check", "budgets", REFERENCE)
    assert check.code == 0, check.output



def test_save_live_replaces_a_class_map_only_where_it_is_a_regular_file(project: Path) -> None:
    """A class's row-map file that is a link (to another map inside the project) is refused, as
    every output is, and neither the link nor the map it names changes."""
    agent = load_rowmap(project / "recipes/maps/dsv41-flash/agent.rowmap")
    prose = load_histogram(project / "recipes/profiles/dsv41-flash/prose.hist")
    write_dumps(project / "compose" / REFERENCE / "dumps" / "agent", agent, prose)
    link = project / "recipes/maps/dsv41-flash/prose.rowmap"
    kept = project / "recipes/maps/dsv41-flash/prose-kept.rowmap"
    link.rename(kept)
    link.symlink_to(kept.name)
    before = kept.read_bytes()
    result = invoke("rowmap", "save-live", REFERENCE, "agent", "--class", "prose")
    assert result.code == 2, result.output
    assert "is a link" in result.stderr and "lanes.agent.classes.prose.rowmap" in result.stderr
    assert "Traceback" not in result.output
    assert link.is_symlink() and kept.read_bytes() == before

def test_save_live_refuses_a_map_of_another_budget(project: Path, tmp_path: Path) -> None:
    agent = load_rowmap(project / "recipes/maps/dsv41-flash/agent.rowmap")
    boot = agent.content_hash()
    # one expert moved hot -> cold without a partner: 294 hot in layer 0, not the lane's 295
    hot = [list(ids) for ids in agent.hot]
    cold = [list(ids) for ids in agent.cold]
    cold[0].append(hot[0].pop())
    live = RowMap(agent.moe_layer_indices, agent.num_experts, hot, cold,
                  {"builder": "adaptive", "barriers": 1, "swaps": 1, "boot_content_hash": boot})
    folder = tmp_path / "d"
    prose = load_histogram(project / "recipes/profiles/dsv41-flash/prose.hist")
    HistogramDumper(FixedCounter(prose), DumpConfig(folder, 0.0, "agent", "agent", "residency"),
                    live_map=FixedPolicy(live, None, None)).dump_now()
    before = (project / "recipes/maps/dsv41-flash/prose.rowmap").read_bytes()
    result = invoke("rowmap", "save-live", REFERENCE, "agent", "--class", "prose", "--dump-dir", str(folder))
    assert result.code == 2
    assert "not the lane's budget" in result.stderr and "Traceback" not in result.output
    assert (project / "recipes/maps/dsv41-flash/prose.rowmap").read_bytes() == before
    unknown = invoke("rowmap", "save-live", REFERENCE, "agent", "--class", "poetry", "--dump-dir", str(folder))
    assert unknown.code == 2 and "no class 'poetry'" in unknown.stderr


def _container(folder: str, content_hash: str, adaptive: str) -> ContainerInfo:
    return ContainerInfo(id="abcdef0123456789", name="p-lane-agent-1", service="lane-agent", project="p",
                         state="running", health="healthy", started_at=None,
                         labels={labels.RECIPE: REFERENCE, labels.LANE: "agent", labels.CLASS: "agent",
                                 labels.CONTENT_HASH: content_hash, labels.CONFIG_HASH: "h"},
                         env={"EXPERT_RESIDENCY_DUMP_DIR": folder, "EXPERT_RESIDENCY_ADAPTIVE": adaptive},
                         mounts=[])


def test_status_shows_the_live_map_of_adaptive_lanes_only(project: Path, monkeypatch) -> None:
    from recipegen.ops import engine
    from recipegen.ops.lanes import LaneStatus, _with_live_map

    agent = load_rowmap(project / "recipes/maps/dsv41-flash/agent.rowmap")
    _, second = write_dumps(project / "dumps", agent, load_histogram(project / "recipes/profiles/dsv41-flash/prose.hist"))
    listed = []
    monkeypatch.setattr(engine, "list_dir", lambda client, cid, path: listed.append(path) or read_host_dir(project / "dumps"))
    base = LaneStatus(REFERENCE, "agent", "lane-agent", "agent", agent.content_hash(), agent.shape_hash(), "h",
                      "running", "healthy", 60.0, "abcdef012345", "current", "")
    on = _with_live_map(None, _container("/var/dumps", agent.content_hash(), "interval=16,swaps_per_layer=4"), base)
    assert on.live_map is not None and on.live_map["content_hash"] == second.content_hash()
    assert on.live_map["recipe_content_hash"] == agent.content_hash() and on.live_map["matches_recipe"] is False
    assert on.live_map["swaps"] == 7 and on.live_map["cold_share_now"] == 0.021
    assert "live_map" in on.as_dict()
    off = _with_live_map(None, _container("/var/dumps", agent.content_hash(), "off"), base)
    assert off.live_map is None and listed == ["/var/dumps"]  # a static lane's folder is not read


def test_drift_adds_the_live_map_and_its_cold_share(project: Path) -> None:
    from recipegen.ops.drift import judge
    from recipegen.ops.live import _with_live_map
    from recipegen.rowmap import cold_share

    agent = load_rowmap(project / "recipes/maps/dsv41-flash/agent.rowmap")
    prose_map = load_rowmap(project / "recipes/maps/dsv41-flash/prose.rowmap")
    traffic = load_histogram(project / "recipes/profiles/dsv41-flash/prose.hist")
    _, second = write_dumps(project / "dumps", agent, traffic)
    files = read_host_dir(project / "dumps")
    snap = snapshots(files, where="dumps")[-1]
    verdict = judge(snap.histogram, "agent", {"agent": agent, "prose": prose_map}, built_share=None,
                    built_source="-")
    assert verdict.live_map is None
    with_live = _with_live_map(verdict, files, snap, snap.histogram, agent, where="dumps")
    figures = with_live.live_map
    assert figures is not None and figures["content_hash"] == second.content_hash()
    # the judged counts under the live map, by the rowmap module's own formula on the saved map
    assert figures["cold_share_live_map"] == pytest.approx(cold_share(second, traffic))
    assert figures["cold_share_live_map"] != pytest.approx(with_live.live_share)
    # the live share under the recipe's map is unchanged
    assert with_live.live_share == verdict.live_share


def test_cold_share_by_hand() -> None:
    # 2 layers x 4 experts, hot {0,1}; counts layer0 [5,3,1,1], layer1 [2,2,4,2]: cold picks 2 + 6 of 20
    from recipegen.ops.livemap import LiveMapView, cold_share_under

    rowmap = RowMap((0, 1), 4, [[0, 1], [0, 1]], [[2, 3], [2, 3]], {})
    hist = Histogram((0, 1), 4, np.array([[5, 3, 1, 1], [2, 2, 4, 2]]), tokens=10, top_k=1)
    name = "agent__agent__residency__20261201T100000.000000Z__000001"
    live = LiveMap(rowmap.content_hash(), "b", rowmap.shape_hash(), 1, 0, name + ".rowmap")
    from recipegen.ops.dumps import Snapshot

    snap = Snapshot(name + ".hist", "agent", "agent", "residency", datetime.now(timezone.utc), 1, hist)
    assert cold_share_under(LiveMapView(snap, live, rowmap), hist) == pytest.approx(8 / 20)
