"""Histogram dumps of an adaptive lane carry the live map: its description in ``meta.live_map``
and the map itself beside the histogram, consistent with what the banks hold."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import DumpConfig, HistogramDumper, current_rowmap  # noqa: E402
from expert_residency.core.adaptive import AdaptiveConfig  # noqa: E402
from expert_residency.core.dump import LiveMap, live_map_file_name, parse_dump_name  # noqa: E402
from expert_residency.formats import load_histogram, load_rowmap  # noqa: E402
from expert_residency.formats.hashes import content_hash  # noqa: E402
from test_adaptive_policy import Engine, decode_live  # noqa: E402
from test_core_fixtures import single_torch_thread  # noqa: E402,F401  (autouse)

pytestmark = pytest.mark.torch


def _config(tmp_path):
    return DumpConfig(tmp_path / "dumps", 0.0, "agent", "agent", "residency")


def test_dump_carries_the_live_map_after_swaps(tmp_path):
    engine = Engine(AdaptiveConfig(interval=1, swaps_per_layer=1, decay=0.5, margin=0.0, evidence=0.0,
                                   counts_evidence=0.0))
    boot = engine.policy.initial_content_hash
    cold = engine.split[3].cold_experts
    engine.counter.count(3, torch.tensor([[cold[0], cold[1], cold[2], cold[3]]] * 2, dtype=torch.int32))
    report = engine.policy.barrier()
    assert len(report.swaps) == 1  # one pair in layer 3 (cap 1), none in layer 5 (no counts)
    dumper = HistogramDumper(engine.counter, _config(tmp_path), live_map=engine.policy)
    path = dumper.dump_now()

    hist = load_histogram(path)
    live = LiveMap.from_meta(hist.meta)
    assert live is not None
    assert live.file == path.name[:-len(".hist")] + ".rowmap" == live_map_file_name(path.name)
    saved = load_rowmap(path.parent / live.file)
    # what the device map holds, decoded independently of the policy
    hot, cold_ids = zip(*(decode_live(engine.split[i].row_codes) for i in (3, 5)))
    assert saved.content_hash() == content_hash((3, 5), 16, hot, cold_ids) == live.content_hash
    assert live.content_hash != boot and live.boot_content_hash == boot
    assert live.shape_hash == current_rowmap(engine.split).shape_hash()
    assert (live.barriers, live.swaps) == (1, 1)
    # the window: 8 picks in layer 3, all cold under the boot map; layer 5 none -> 8 / 8
    assert live.window_cold_share == 1.0
    assert cold[0] in saved.hot[0] or cold[1] in saved.hot[0]
    # only the histogram is a dump file; the map beside it is not mistaken for one
    names = sorted(p.name for p in (tmp_path / "dumps").iterdir())
    assert names == sorted([path.name, live.file])
    assert parse_dump_name(live.file) is None


def test_static_lane_dump_has_no_live_map(tmp_path):
    engine = Engine(AdaptiveConfig())
    path = HistogramDumper(engine.counter, _config(tmp_path)).dump_now()
    assert "live_map" not in load_histogram(path).meta
    assert LiveMap.from_meta(load_histogram(path).meta) is None
    assert [p.name for p in (tmp_path / "dumps").iterdir()] == [path.name]


@pytest.mark.parametrize("meta, message", [
    ({"live_map": 3}, "not an object"),
    ({"live_map": {"content_hash": "a"}}, "lacks"),
    ({"live_map": {"content_hash": "a", "boot_content_hash": "b", "shape_hash": "c", "barriers": -1,
                   "swaps": 0, "file": "x"}}, "barriers is not a count"),
    ({"live_map": {"content_hash": "a", "boot_content_hash": "b", "shape_hash": "c", "barriers": 1,
                   "swaps": 0, "file": "../../etc/passwd.rowmap"}}, "not a dump's live-map name"),
    ({"live_map": {"content_hash": "a", "boot_content_hash": "b", "shape_hash": "c", "barriers": 1,
                   "swaps": 0, "file": "a__b__residency__20261201T101010.000000Z__000001.rowmap",
                   "window_cold_share": 2}}, "share in"),
])
def test_malformed_live_map_meta_is_refused_by_name(meta, message):
    with pytest.raises(ValueError, match=message):
        LiveMap.from_meta(meta)
