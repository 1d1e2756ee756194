"""verify / drift / KV-capacity logic on plain values (no engine)."""

from __future__ import annotations

import numpy as np
import pytest
from expert_residency.formats import Histogram, RowMap, StartupReport
from expert_residency.formats.report import summarize_counts

from recipegen.common.errors import InputError, RecipegenError
from recipegen.ops.drift import judge, live_cold_share
from recipegen.ops.kvcapacity import kv_from_log, kv_from_metrics
from recipegen.ops.verify import Expected, compare, latest_per_rank

GIB = 2**30
PER_EXPERT = 18_800_640
LAYERS = tuple(range(40))


def _expected(**kw) -> Expected:
    base = dict(hot_bytes=295 * 40 * PER_EXPERT, cold_bytes=89 * 40 * PER_EXPERT,
                kv_tokens=2_540_000, hot_counts=[295] * 40, cold_counts=[89] * 40,
                content_hash="c" * 64, shape_hash="s" * 64, traffic_class="agent")
    base.update(kw)
    return Expected(**base)


def _report(**kw) -> StartupReport:
    base = dict(rank=0, mode="residency", vllm_version="0.33.0", runtime_version="0.1.0",
                hot_bytes=295 * 40 * PER_EXPERT, cold_bytes=89 * 40 * PER_EXPERT,
                hot_counts=summarize_counts([295] * 40), cold_counts=summarize_counts([89] * 40),
                content_hash="c" * 64, shape_hash="s" * 64, world_size=1)
    base.update(kw)
    return StartupReport(**base)


def _failed(rows):
    return [r.figure for r in rows if not r.ok]


def test_reference_figures_agree():
    # the seeds' v15 boot: 206.61 GiB hot, 62.33 GiB pinned, as the geometry gives them
    exp = _expected()
    assert round(exp.hot_bytes / GIB, 2) == 206.61 and round(exp.cold_bytes / GIB, 2) == 62.33
    assert _failed(compare(exp, [_report()], 2_530_000)) == []


@pytest.mark.parametrize("change, figure", [
    (dict(cold_bytes=int(64 * GIB)), "pinned host bytes (cold bank)"),
    (dict(hot_bytes=int(200 * GIB)), "HBM expert bytes (hot bank)"),
    (dict(content_hash="d" * 64), "content_hash"),
    (dict(shape_hash="t" * 64), "shape_hash"),
    (dict(cold_counts=summarize_counts([89] * 39 + [90])), "cold experts per layer"),
    (dict(mode="count-only", content_hash=None, shape_hash=None), "runtime mode"),
])
def test_one_wrong_figure_fails_exactly_that_row(change, figure):
    assert figure in _failed(compare(_expected(), [_report(**change)], 2_540_000))


def test_kv_tokens_beyond_tolerance_fail():
    rows = compare(_expected(), [_report()], 2_000_000, kv_source="metrics")
    assert _failed(rows) == ["KV cache tokens"]
    assert "off by 21.26%" in [r for r in rows if r.figure == "KV cache tokens"][0].note
    assert _failed(compare(_expected(), [_report()], None)) == ["KV cache tokens"]


def test_no_report_is_a_failure():
    assert _failed(compare(_expected(), [], 2_540_000)) == ["start-up report"]


def test_bytes_sum_over_ranks_and_latest_boot_wins():
    half = dict(hot_bytes=295 * 20 * PER_EXPERT, cold_bytes=89 * 20 * PER_EXPERT, world_size=2)
    stale = _report(rank=0, cold_bytes=1, world_size=2)
    reports = [stale, _report(rank=0, **half), _report(rank=1, **half)]
    assert len(latest_per_rank(reports)) == 2
    assert _failed(compare(_expected(), reports, 2_540_000)) == []
    assert "workers reporting" in _failed(compare(_expected(), reports[:2], 2_540_000))


def test_kv_capacity_from_metrics_and_log():
    text = ('# HELP x\nvllm:cache_config_info{block_size="256",engine="0",'
            'kv_cache_size_tokens="2540000",num_gpu_blocks="9921"} 1.0\n')
    assert kv_from_metrics(text).tokens == 2_540_000
    blocks_only = 'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0'
    assert kv_from_metrics(blocks_only).tokens == 1600
    assert kv_from_metrics("vllm:other 1") is None
    log = ("(EngineCore pid=1) INFO GPU KV cache size: 1,000 tokens\n"
           "(EngineCore pid=9) INFO GPU KV cache size: 2,540,000 tokens, Maximum concurrency")
    assert kv_from_log(log).tokens == 2_540_000
    assert kv_from_log("nothing") is None


def _map(cold_ids: list[int], experts: int = 8, layers: tuple[int, ...] = (0, 1)) -> RowMap:
    hot = [i for i in range(experts) if i not in cold_ids]
    return RowMap(layers, experts, [list(hot) for _ in layers], [list(cold_ids) for _ in layers])


def _hist(weights: list[int], layers: tuple[int, ...] = (0, 1)) -> Histogram:
    counts = np.array([weights for _ in layers], dtype=np.int64)
    return Histogram(layers, len(weights), counts, tokens=int(counts.sum()) // 2)


def test_cold_share_counts_selections_on_cold_experts():
    assert live_cold_share(_hist([10, 10, 0, 0, 0, 0, 0, 80]), _map([6, 7])) == pytest.approx(0.8)
    with pytest.raises(InputError, match="MoE layers"):
        live_cold_share(_hist([1] * 8, layers=(0,)), _map([7]))
    with pytest.raises(RecipegenError, match="no selections"):
        live_cold_share(_hist([0] * 8), _map([7]))


def test_drift_flags_mismatch_and_names_the_better_class():
    maps = {"agent": _map([6, 7]), "prose": _map([0, 1])}
    prose_traffic = _hist([0, 0, 5, 5, 5, 5, 40, 40])
    verdict = judge(prose_traffic, "agent", maps, built_share=0.02, built_source="test")
    assert verdict.drifted and verdict.live_share == pytest.approx(0.8)
    assert verdict.better_class == "prose"
    agent_traffic = _hist([40, 40, 5, 5, 5, 5, 0, 1])
    calm = judge(agent_traffic, "agent", maps, built_share=0.0, built_source="test")
    assert not calm.drifted and calm.better_class is None
