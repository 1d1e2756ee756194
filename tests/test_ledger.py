"""The budget ledger: reference numbers derived from the recipe, placements, peaks, failures."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import pytest
from expert_residency.formats import RowMap, save_rowmap

from recipegen.common.units import GiB, parse_bytes
from recipegen.ledger import compute_lane, compute_ledger, declared_split, positional_walk, rehoming_peaks
from recipegen.load.recipe import load_recipe

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO / "recipes" / "dsv41-flash-gb300.yaml"
OFF60 = REPO / "recipes" / "dsv41-flash-gb300-off60.yaml"
FAILURES = sorted((Path(__file__).parent / "budget_failures").glob("*.yaml"))


def gib(value: float) -> float:
    return value / GiB


@pytest.fixture(scope="module")
def reference():
    loaded = load_recipe(REFERENCE)
    return loaded, compute_ledger(loaded).lane("agent")


def test_reference_expert_figures(reference) -> None:
    loaded, lane = reference
    model = loaded.recipe.model
    per_expert = sum(math.prod(t.shape) for t in model.expert_tensors) * (4 / 8 + 1 / 32)
    assert lane.fig("experts.bytes_per_expert").value == per_expert
    assert lane.fig("experts.per_layer").value == model.routed_experts * per_expert
    assert lane.fig("experts.total").value == len(model.moe_layers) * model.routed_experts * per_expert
    # Seed "vLLM: Pin Hot Experts": 6.72 GiB per layer, 268.95 GiB in all.
    assert gib(lane.fig("experts.per_layer").value) == pytest.approx(6.72, abs=0.005)
    assert gib(lane.fig("experts.total").value) == pytest.approx(268.95, abs=0.005)


def test_reference_hot_cold_split(reference) -> None:
    loaded, lane = reference
    model, spec = loaded.recipe.model, loaded.recipe.lane("agent")
    hot = spec.offload.hot_experts_per_layer
    cold = model.routed_experts - hot
    layers = len(model.moe_layers)
    assert lane.usage_aware.hot_per_layer == [hot] * layers  # read from the row map
    assert lane.fig("hbm.hot_experts").value == hot * layers * model.expert_bytes
    assert lane.fig("host.cold_experts").value == cold * layers * model.expert_bytes
    assert "row map maps/dsv41-flash/agent.rowmap" in lane.usage_aware.basis
    # 295 hot / 89 cold -> 206.61 GiB hot in HBM, 62.33 GiB pinned in host.
    assert gib(lane.fig("hbm.hot_experts").value) == pytest.approx(206.61, abs=0.005)
    assert gib(lane.fig("host.cold_experts").value) == pytest.approx(62.33, abs=0.005)


def test_reference_hbm_and_kv(reference) -> None:
    loaded, lane = reference
    spec = loaded.recipe.lane("agent")
    machine = loaded.recipe.machines[spec.machine]
    model = loaded.recipe.model
    cap = machine.gpus.hbm * spec.gpu_memory_utilization
    measured = spec.reserves.hbm.back_solved_from
    reserve = (machine.gpus.hbm * measured.gpu_memory_utilization
               - measured.hot_experts_per_layer * len(model.moe_layers) * model.expert_bytes - measured.kv_pool)
    assert lane.fig("hbm.cap").value == pytest.approx(cap)
    assert lane.fig("hbm.reserve").value == pytest.approx(reserve)
    assert "back-solved" in lane.fig("hbm.reserve").note
    # The runtime's start-up HBM (ledger.workspace), by hand: on the GB300 (SM103) the MXFP4 banks
    # run FlashInfer's TRT-LLM kernel (no held workspace); the counter is int64 [40 layers, 384] +
    # 2 x int64 [40], the step masks bool [16,385] + int32 [16,384] + one int64 at vLLM's 16,384
    # batched tokens for a GPU of >= 160 GiB.
    workspace = 8 * 40 * 384 + 2 * 8 * 40 + 16_385 + 4 * 16_384 + 8
    assert workspace == 205_449
    assert lane.fig("hbm.runtime_workspace").value == workspace
    kv = cap - reserve - lane.fig("hbm.hot_experts").value - workspace
    assert lane.fig("hbm.kv_pool").value == pytest.approx(kv, abs=1)
    assert lane.fig("kv.tokens").value == pytest.approx(kv / model.kv_token_bytes)
    assert lane.fig("kv.full_sequences").value == math.floor(kv / model.kv_token_bytes / spec.max_model_len)
    # Seeds: util 0.97 of 250.7 GiB; KV 4.9 GiB ~ 2.54M tokens; reserve 31.67 GiB (DESIGN).
    assert gib(lane.fig("hbm.cap").value) == pytest.approx(243.18, abs=0.005)
    assert gib(lane.fig("hbm.kv_pool").value) == pytest.approx(4.9, abs=0.005)
    assert lane.fig("kv.tokens").value / 1e6 == pytest.approx(2.54, abs=0.005)
    assert gib(lane.fig("hbm.reserve").value) == pytest.approx(31.67, abs=0.005)
    # Declared dense weights are part of the reserve, not added on top of it.
    assert lane.fig("hbm.reserve.dense").value + lane.fig("hbm.reserve.runtime").value == \
        pytest.approx(lane.fig("hbm.reserve").value)


def test_reference_host(reference) -> None:
    loaded, lane = reference
    model = loaded.recipe.model
    tables = sum(t.bytes for t in model.host_tables)
    cold = lane.fig("host.cold_experts").value
    assert lane.fig("host.before_reserve").value == tables + cold
    assert gib(lane.fig("host.tables").value) == pytest.approx(189.2, abs=0.005)
    assert gib(lane.fig("host.before_reserve").value) == pytest.approx(251.53, abs=0.005)
    # DESIGN: the v14-measured host reserve is 432 − 114.75 (v14's 9 layers pinned as 8 + 0.5 + 4 +
    # 0.25 GiB each) − 189.2 = 128.05 GiB; with it 62.33 GiB of cold experts fit (379.58 <= 494).
    assert gib(lane.fig("host.total").value) == pytest.approx(189.2 + 128.05 + 62.33, abs=0.01)
    assert lane.fig("host.total").value <= lane.fig("host.memory").value
    assert lane.ok, lane.violations


def test_reserve_is_fixed_when_the_budget_moves(tmp_path: Path) -> None:
    """The back-solved reserve belongs to the model on the machine: 5 fewer hot experts per layer
    free exactly 5 x 40 experts of HBM for KV."""
    _copy_with_maps(tmp_path, hot=290)
    text = REFERENCE.read_text().replace("hot_experts_per_layer: 295      #", "hot_experts_per_layer: 290      #")
    (tmp_path / "r.yaml").write_text(_named(text.replace("maps/dsv41-flash/", "maps/x/"), "r"))
    moved = compute_ledger(load_recipe(tmp_path / "r.yaml")).lane("agent")
    base = compute_ledger(load_recipe(REFERENCE)).lane("agent")
    e = load_recipe(REFERENCE).recipe.model.expert_bytes
    assert moved.fig("hbm.reserve").value == base.fig("hbm.reserve").value
    assert moved.fig("hbm.kv_pool").value - base.fig("hbm.kv_pool").value == pytest.approx(5 * 40 * e)


def _named(text: str, name: str) -> str:
    """A recipe copy declares the name of the file it is written to (`name` must be the file's stem)."""
    renamed, count = re.subn(r"^name: .*$", f"name: {name}", text, count=1, flags=re.M)
    assert count == 1
    return renamed


def _copy_with_maps(folder: Path, hot: int) -> None:
    (folder / "maps" / "x").mkdir(parents=True)
    shutil.copytree(REPO / "recipes" / "profiles", folder / "profiles")  # a link out would be refused
    for cls in ("agent", "prose", "math"):
        save_rowmap(RowMap.positional(range(40), 384, hot), folder / "maps" / "x" / f"{cls}.rowmap")


def test_map_is_the_truth_for_a_byte_budget(tmp_path: Path) -> None:
    """A byte budget with a non-uniform map: the ledger uses the map's real per-layer counts."""
    (tmp_path / "maps" / "x").mkdir(parents=True)
    shutil.copytree(REPO / "recipes" / "profiles", tmp_path / "profiles")
    hot = [296 if i % 2 else 294 for i in range(40)]  # 295 on average: same total
    rowmap = RowMap(tuple(range(40)), 384, [list(range(h)) for h in hot], [list(range(h, 384)) for h in hot])
    for cls in ("agent", "prose", "math"):
        save_rowmap(rowmap, tmp_path / "maps" / "x" / f"{cls}.rowmap")
    text = REFERENCE.read_text().replace("hot_experts_per_layer: 295 ", "cold_experts_budget: 62.34 GiB ")
    (tmp_path / "r.yaml").write_text(_named(text.replace("maps/dsv41-flash/", "maps/x/"), "r"))
    lane = compute_ledger(load_recipe(tmp_path / "r.yaml")).lane("agent")
    assert lane.usage_aware.hot_per_layer == hot
    assert gib(lane.fig("hbm.hot_experts").value) == pytest.approx(206.61, abs=0.005)
    assert "62.34 GiB buys 89 cold per layer" in lane.usage_aware.basis
    # Both forms of the budget are printed: the count the bytes buy and the bytes the count implies.
    assert lane.fig("budget.cold_per_layer").value == 89 and lane.fig("budget.hot_per_layer").value == 295
    assert gib(lane.fig("budget.cold_bytes").value) == pytest.approx(62.33, abs=0.005)


def test_budget_rounding_rule() -> None:
    loaded = load_recipe(REFERENCE)
    model, offload = loaded.recipe.model, loaded.recipe.lane("agent").offload
    for budget, cold in (("62.33 GiB", 88), ("62.34 GiB", 89), ("0 GiB", 0), ("300 GiB", 384)):
        split = declared_split(model, offload.model_copy(update={"hot_experts_per_layer": None,
                                                                 "cold_experts_budget": parse_bytes(budget)}))
        assert (split.cold_per_layer, split.hot_per_layer) == (cold, 384 - cold), budget


def test_positional_walk_and_measured_comparison(reference) -> None:
    loaded, lane = reference
    model = loaded.recipe.model
    w13 = 4608 * 5120 * 17 // 32 * 384
    w2 = 5120 * 2304 * 17 // 32 * 384
    walk = positional_walk(model, 60 * GiB)
    # 8 layers + w13 of the 9th stay below 60 GiB, so the 9th layer's w2 goes too.
    assert 8 * (w13 + w2) + w13 < 60 * GiB <= 9 * (w13 + w2)
    assert walk.offloaded_bytes == 9 * (w13 + w2) and walk.layers_whole == 9 and walk.layers_partial == 0
    assert positional_walk(model, 1).host_per_layer[:2] == [w13, 0]  # one parameter overshoots
    pos = lane.positional
    assert pos is not None and pos.figures["positional.offloaded"].value == walk.offloaded_bytes
    measured = pos.figures["positional.measured"].value
    assert gib(measured) == pytest.approx(61.17, abs=0.005)  # catalog input (the field report 'vLLM: Pin Hot Experts' (2026-09-17))
    assert pos.figures["positional.measured_delta"].value == measured - walk.offloaded_bytes
    # Positional leaves less KV than usage-aware at about the same host bytes.
    assert pos.figures["hbm.kv_pool"].value < lane.usage_aware.figures["hbm.kv_pool"].value


def test_load_time_peaks(reference) -> None:
    loaded, lane = reference
    e = loaded.recipe.model.expert_bytes
    layer = 384 * e
    walk = positional_walk(loaded.recipe.model, 60 * GiB)
    assert lane.fig("load.host_experts_initial").value == walk.offloaded_bytes
    hbm_initial = lane.fig("load.hbm_experts_initial").value
    dense = lane.fig("hbm.reserve.dense").value
    # the peak also holds what the worker has on the GPU before loading: on one GPU the CUDA context and
    # cuBLAS, 717 MiB measured on an H100, counted as 768 MiB
    assert lane.fig("load.hbm_peak").operands["cuda_context_bytes"] == 768 * 2**20
    peak_experts = lane.fig("load.hbm_peak").value - dense - 768 * 2**20
    # Neither side rises more than one layer above the higher of its load and final levels.
    assert max(hbm_initial, lane.fig("hbm.hot_experts").value) < peak_experts <= \
        max(hbm_initial, lane.fig("hbm.hot_experts").value) + layer
    # vLLM pins each offloaded parameter, and PyTorch reserves the next power of two: per MXFP4
    # layer w13 4,529,848,320 B -> 8 GiB, its scales 283,115,520 B -> 512 MiB, w2 2,264,924,160 B
    # -> 4 GiB, its scales 141,557,760 B -> 256 MiB; 9 whole layers at 60 GiB = 9 x 12.75 GiB.
    assert (walk.layers_whole, walk.layers_partial) == (9, 0)
    pinned = lane.fig("load.host_pinned_initial").value
    assert pinned == 9 * (8 + 0.5 + 4 + 0.25) * GiB
    host_fixed = lane.fig("host.tables").value + lane.fig("host.reserve").value
    host_peak = lane.fig("load.host_peak").value - host_fixed
    # from the pinned load up to, at most, every final cold bank allocated before any is released
    assert pinned <= host_peak <= pinned + lane.fig("host.cold_experts").value
    assert lane.fig("load.hbm_peak").value <= lane.fig("hbm.capacity").value


def test_rehoming_ends_at_the_map() -> None:
    e = 1000
    initial_host = [384 * e] * 3 + [0] * 7
    initial_hbm = [384 * e - h for h in initial_host]
    peaks = rehoming_peaks(initial_hbm, initial_host, [300 * e] * 10, [84 * e] * 10)
    assert (peaks.hbm_final, peaks.host_final) == (3000 * e, 840 * e)
    assert sorted(peaks.order) == list(range(10))
    everything_first = rehoming_peaks(initial_hbm, initial_host, initial_hbm, initial_host)
    assert everything_first.hbm_peak == sum(initial_hbm) and everything_first.order == []


def test_rehoming_plans_a_partly_offloaded_layer_exactly() -> None:
    # One layer loaded 40 in HBM / 60 on the host, re-homed to 70 hot / 30 cold: the new banks
    # are allocated before the loaded tensors are freed, so HBM peaks at 40 + 70 and host at
    # 60 + 30 (counting the layer as wholly offloaded would say 70 and 130).
    peaks = rehoming_peaks([40], [60], [70], [30])
    assert (peaks.hbm_initial, peaks.host_initial) == (40, 60)
    assert (peaks.hbm_peak, peaks.host_peak) == (110, 90)
    assert (peaks.hbm_final, peaks.host_final) == (70, 30)


def test_positional_twin_ledger() -> None:
    lane = compute_ledger(load_recipe(OFF60)).lane("agent")
    walk_bytes = lane.positional.figures["positional.offloaded"].value
    assert lane.placement == "positional"
    assert lane.fig("host.cold_experts").value == walk_bytes
    assert lane.fig("hbm.hot_experts").value == lane.fig("experts.total").value - walk_bytes
    assert lane.ok


# ------------------------------------------------------------------ must-fail recipes

@pytest.mark.parametrize("path", FAILURES, ids=[p.stem for p in FAILURES])
def test_budget_failures(path: Path) -> None:
    import re
    text = path.read_text()
    kind = re.search(r"^# expect-kind: (.*)$", text, re.M).group(1).strip()
    suggestion = re.search(r"^# expect-suggestion: (.*)$", text, re.M).group(1).strip()
    ledger = compute_ledger(load_recipe(path))
    assert not ledger.ok
    kinds = {v.kind: v for v in ledger.violations}
    assert kind in kinds, ledger.violations
    assert suggestion in kinds[kind].suggestion
    assert kinds[kind].over_bytes and kinds[kind].over_bytes > 0


def _lane_with(hot: int, offload_updates: dict | None = None, model_updates: dict | None = None,
               **lane_updates):
    loaded = load_recipe(REFERENCE, read_maps=False)
    spec = loaded.recipe.lane("agent")
    offload = spec.offload.model_copy(update={"hot_experts_per_layer": hot, **(offload_updates or {})})
    spec = spec.model_copy(update={"offload": offload, **lane_updates})
    model = loaded.recipe.model.model_copy(update=model_updates or {})
    return compute_lane(model, loaded.recipe.machines["station"], spec)


def test_prefetch_bank_is_priced_out_of_kv() -> None:
    """The field report "Should a GB300 Prefetch Its Cold Experts?" (2026-10-23): a 3-slot-per-layer bank is 120 experts = 2.1 GiB, ~1.09M tokens, 43% of the pool."""
    base = _lane_with(295)
    banked = _lane_with(295, {"prefetch_slots_per_layer": 3})
    e = base.fig("experts.bytes_per_expert").value
    assert banked.fig("hbm.prefetch_bank").value == 3 * 40 * e
    assert gib(banked.fig("hbm.prefetch_bank").value) == pytest.approx(2.1, abs=0.01)
    lost = base.fig("kv.tokens").value - banked.fig("kv.tokens").value
    assert lost / 1e6 == pytest.approx(1.09, abs=0.01)
    assert lost / base.fig("kv.tokens").value == pytest.approx(0.43, abs=0.005)
    assert banked.fig("kv.tokens").value / 1e6 == pytest.approx(1.45, abs=0.01)  # "leaving about 1.45 million"
    assert banked.ok  # still one 1M-token sequence
    # A 5-slot bank does not leave one, and the fix says what to drop.
    kv = [v for v in _lane_with(295, {"prefetch_slots_per_layer": 5}).violations if v.kind == "kv"]
    assert kv and "drop the prefetch bank" in kv[0].suggestion


def test_declared_drafter_kv_adds_to_the_token_cost() -> None:
    from recipegen.schema import Drafter
    base = _lane_with(295)
    with_kv = _lane_with(295, model_updates={"drafter": Drafter(method="dspark", kv_bytes_per_token="1 KiB")})
    per_token = base.fig("kv.tokens").operands["lane_kv_bytes_per_token"]
    assert with_kv.fig("kv.bytes_per_token").value == per_token + 1024
    assert with_kv.fig("kv.tokens").value == pytest.approx(base.fig("hbm.kv_pool").value / (per_token + 1024))


def test_suggestions_are_exact() -> None:
    """The fixes the failures suggest are the boundary: one step further fails."""
    # KV: "lower hot experts per layer to 299" (1M context).
    assert _lane_with(299).ok and {v.kind for v in _lane_with(300).violations} == {"kv"}
    # Host: "raise hot experts per layer to at least 132": 494 − 189.2 − 128.05 = 176.75 GiB holds
    # ⌊176.75 GiB / (40 × 18,800,640 B)⌋ = 252 cold per layer, so 384 − 252 = 132 hot.
    assert "host" not in {v.kind for v in _lane_with(132).violations}
    assert "host" in {v.kind for v in _lane_with(131).violations}
    # "lower max_model_len to at most N" holds N tokens and not N + 1. vLLM sizes a sequence in whole
    # blocks (up to 128 tokens: CUTLASS MLA), so N is the pool's tokens rounded down to 128, and N + 1
    # needs one more block than the pool holds.
    failing = _lane_with(300)
    tokens = failing.fig("kv.tokens").value
    limit = int(tokens) // 128 * 128
    assert limit <= tokens < limit + 128
    assert f"lower max_model_len to at most {limit:,}" in failing.violations[0].suggestion
    assert _lane_with(300, max_model_len=limit).ok
    assert not _lane_with(300, max_model_len=limit + 1).ok
    # A length that is not a whole number of blocks needs the whole last block: the pool's own token
    # count, written as max_model_len, does not start (it did before blocks were counted).
    if int(tokens) % 128:
        assert not _lane_with(300, max_model_len=int(tokens)).ok


def test_fixed_kv_pool_over_the_gpu() -> None:
    lane = _lane_with(295, gpu_memory_utilization=None, kv_cache_bytes=40 * GiB)
    hbm = [v for v in lane.violations if v.kind == "hbm"]
    assert hbm and "fixed KV pool" in hbm[0].message
    ok = _lane_with(295, gpu_memory_utilization=None, kv_cache_bytes=5 * GiB)
    assert ok.fig("hbm.kv_pool").value == 5 * GiB and ok.ok


def test_two_always_on_lanes_on_one_gpu(tmp_path: Path) -> None:
    base = Path(__file__).parent / "bad_recipes"
    shutil.copytree(base / "maps", tmp_path / "maps")
    text = _named((base / "valid" / "tiny.yaml").read_text().replace("../maps/", "maps/"), "two")
    second = text[text.index("  - name: main"):].replace("name: main", "name: side").replace("port: 8000", "port: 8001")
    (tmp_path / "two.yaml").write_text(text + second)
    ledger = compute_ledger(load_recipe(tmp_path / "two.yaml"))
    shared = [v for v in ledger.machine_violations if v.kind == "gpu-shared"]
    assert shared and "sum to 1.80 > 1" in shared[0].message
    (tmp_path / "two.yaml").write_text(text + second.replace("    active_class: chat\n",
                                                             "    active_class: chat\n    profile: batch\n"))
    assert compute_ledger(load_recipe(tmp_path / "two.yaml")).ok  # a profiled lane is not always on


def test_every_figure_explains_itself(reference) -> None:
    _, lane = reference
    for key, fig in lane.figures.items():
        assert fig.unit in ("bytes", "tokens", "count", "ratio", "sequences", "bytes/token"), key
        if fig.formula:
            assert fig.operands, key
        else:
            assert fig.note or key.startswith("kv.max_model_len"), f"{key}: an input needs its source"


def test_more_streams_than_full_sequences_is_a_stated_warning(reference) -> None:
    """16 expected streams at 1M context against a pool of two full sequences: no budget fails
    (short requests share the pool), but a warning gives the numbers. By hand: (4.9 GiB − the
    runtime's 205,449 B counter, test_reference_hbm_and_kv) × 0.518M tokens per GiB = 2,538,200 −
    205,449 × 518,000 / 2^30 (99.1) = 2,538,100.9 tokens = 2 sequences of 1,048,576;
    2,538,100.9 / 16 = 158,631.3."""
    _, lane = reference
    assert lane.ok
    [warning] = [n for n in lane.notes if n.startswith("warning: concurrency")]
    assert "up to 16 streams" in warning and "2.54M tokens = 2 full-length sequences" in warning
    assert "max_model_len 1,048,576" in warning and "≤ 158,631 tokens each" in warning
    from recipegen.schema.lane import Concurrency

    two = _lane_with(295, concurrency=Concurrency(min=1, max=2))
    assert not [n for n in two.notes if n.startswith("warning: concurrency")]
    three = _lane_with(295, concurrency=Concurrency(min=1, max=3))
    assert [n for n in three.notes if n.startswith("warning: concurrency up to 3 streams")]
