"""The decode estimate against measurements, with nothing fitted to them.

1. The field reports' GB300 throughput (DeepSeek-V4.1-Flash, k = 5): positional (v14) and
   usage-aware (v15) at one, eight and sixteen streams — "vLLM: Pin Hot Experts" (2026-09-17),
   "Confirmed: second pair"; "Should a GB300 Prefetch Its Cold Experts?" (2026-10-23), section 3.
2. The full-depth decode simulation on one H200, five runs of the same command
   (`PYTHONPATH=runtime python3 bench/decode_sim.py ... --out $OUT`, BENCHMARKS.md, 'Decode step:
   full-depth simulation against the estimate'): run EB (2026-12-03,
   bench/results/decode_sim_h200.json), run EC (2026-12-04, after the cold-first launch order and
   the nine-operation MXFP4 decode, bench/results/decode_sim_h200_run_ec.json), run ED (the
   same day, after the dense layers' new T = 1 defaults, bench/results/decode_sim_h200_run_ed.json)
   and run EE (the same day, with the grouped warp-MMA MXFP4 kernels the default up to 16 tokens
   per step, bench/results/decode_sim_h200_run_ee.json), and run EF (2026-12-05, the same command
   with the grouped loop up to 48 tokens for gpt-oss, bench/results/decode_sim_h200_run_ef.json);
   the estimate reads each run's measured
   HBM and pinned read limits and the committed efficiency tables (the routed-expert rows come
   from other runs, not these).

The bands the estimate prints (`lane_estimate.BAND_*`) are checked to cover, and not to exceed by
more than 0.02, the ratios found here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from recipegen.costmodel.estimate import OperatingPoint, step_terms
from recipegen.costmodel.lane_estimate import (
    BAND_MEASURED_GPU,
    BAND_ONE_STREAM,
    BAND_OTHER_GPU_STREAMS,
    estimate_lane,
)
from recipegen.load.recipe import load_recipe

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from estimate_gap import sim_model  # noqa: E402  (the simulated placements as the estimate models them)

RUN_EB = ROOT / "bench" / "results" / "decode_sim_h200.json"
RUN_EC = ROOT / "bench" / "results" / "decode_sim_h200_run_ec.json"
RUN_ED = ROOT / "bench" / "results" / "decode_sim_h200_run_ed.json"
RUN_EE = ROOT / "bench" / "results" / "decode_sim_h200_run_ee.json"
RUN_EF = ROOT / "bench" / "results" / "decode_sim_h200_run_ef.json"
RUNS = (RUN_EB, RUN_EC, RUN_ED, RUN_EE, RUN_EF)
RUN_IDS = ["EB", "EC", "ED", "EE", "EF"]
# Points whose kernels the committed rows no longer describe: gpt-oss-120b's step of 8 tokens ran
# the tl.dot grouped kernels in runs EB-ED (the grouped warp-MMA loop, about a fifth shorter there,
# became the default up to 16 tokens after them, BENCHMARKS.md run GL; run EE measured it), and its
# step of 32 tokens ran them in runs EB-EE (the loop runs up to 48 tokens for gpt-oss's halved K
# tiles since run GT; run EF measured it).
GPTOSS_8, GPTOSS_32 = ("gpt-oss-120b", "all_hbm", 8), ("gpt-oss-120b", "all_hbm", 32)
SUPERSEDED = {RUN_EB: {GPTOSS_8, GPTOSS_32}, RUN_EC: {GPTOSS_8, GPTOSS_32}, RUN_ED: {GPTOSS_8, GPTOSS_32},
              RUN_EE: {GPTOSS_32}}


# measured tok/s (the field reports)
GB300 = {("usage-aware", 1): (153.28,), ("positional", 1): (88.74,),
         ("usage-aware", 8): (704.0,), ("positional", 8): (305.0,),
         ("usage-aware", 16): (955.0,), ("positional", 16): (386.0, 417.0)}


@pytest.fixture(scope="module")
def gb300():
    loaded = load_recipe("dsv41-flash-gb300")
    return {placement: estimate_lane(loaded, "agent", placement=placement, streams=[1, 8, 16])
            for placement in ("usage-aware", "positional")}


def test_the_positional_estimate_is_the_v14_lane():
    # the usage-aware recipe's positional column is the off60 twin's own placement (same 60 GiB walk)
    ledger_ua = __import__("recipegen.ledger", fromlist=["compute_ledger"]).compute_ledger
    a = ledger_ua(load_recipe("dsv41-flash-gb300")).lane("agent").positional
    b = ledger_ua(load_recipe("dsv41-flash-gb300-off60")).lane("agent").positional
    assert a.cold_per_layer == b.cold_per_layer and sum(a.cold_per_layer) > 0


def test_gb300_one_stream_positional_within_15_percent_usage_aware_not(gb300):
    # Known miss since the MXFP4 rows were measured on today's H200 kernels (run ER): the GB300
    # estimate borrows the H200's routed-expert efficiency for the GB300's own kernel, and at the
    # one-stream verify step (6 tokens) the H200 layer now reads 72% of HBM where it read 66%; the
    # GB300 measurement did not move. Positional (mostly link reads) stays inside ±15%.
    ratios = {}
    for placement in ("usage-aware", "positional"):
        estimate = gb300[placement].point(1)
        (measured,) = GB300[(placement, 1)]
        assert estimate.k == 5
        ratios[placement] = measured / estimate.tokens_per_s
        lo, hi = estimate.band
        assert lo <= ratios[placement] <= hi
    assert abs(1 / ratios["positional"] - 1) <= 0.15, ratios
    assert 0.15 < 1 / ratios["usage-aware"] - 1 <= 0.20, ratios     # the estimate 15-20% fast


def test_gb300_several_streams_the_estimate_is_low_and_the_band_covers_it(gb300):
    # Known miss: at eight and sixteen streams the estimate reads more expert bytes than those runs
    # did (independent streams under the synthetic histogram; the k the lane ran there is not
    # published), so it lies 26-37% low; the band printed above one stream says so.
    for (placement, streams), measured in GB300.items():
        if streams == 1:
            continue
        estimate = gb300[placement].point(streams)
        for m in measured:
            ratio = m / estimate.tokens_per_s
            assert 1.0 < ratio <= BAND_OTHER_GPU_STREAMS[1], (placement, streams, ratio)
        assert estimate.band == BAND_OTHER_GPU_STREAMS


KS = range(8)


@pytest.fixture(scope="module")
def gb300_by_k():
    loaded = load_recipe("dsv41-flash-gb300")
    return {(placement, k): estimate_lane(loaded, "agent", placement=placement, streams=[8, 16], k=k)
            for placement in ("usage-aware", "positional") for k in KS}


def test_gb300_no_k_brings_eight_and_sixteen_streams_within_15_percent(gb300_by_k):
    # The k the lane's DSpark schedule ran at eight and sixteen streams is not published; at every k
    # from 0 to 7 (a schedule, or vLLM's adaptive verification, picks one of them) the estimate stays
    # more than 15% below every measured figure, for both placements (docs/costmodel.md).
    for (placement, streams), measured in GB300.items():
        if streams == 1:
            continue
        best = max(gb300_by_k[(placement, k)].point(streams).tokens_per_s for k in KS)
        for m in measured:
            assert best / m < 0.85, (placement, streams, best, m)
    # k = 1 or 2 is the estimate's own best at sixteen streams; k = 5 is not
    for placement in ("usage-aware", "positional"):
        by_k = [gb300_by_k[(placement, k)].point(16).tokens_per_s for k in KS]
        assert by_k.index(max(by_k)) in (1, 2) and by_k[5] < max(by_k)


def test_the_docs_k_table_is_the_estimate(gb300_by_k):
    doc = (Path(__file__).resolve().parent.parent / "docs" / "costmodel.md").read_text()
    head = "| k | tokens per step per stream | positional C8 (305) | usage-aware C8 (704) |"
    rows = doc[doc.index(head):].splitlines()[2:2 + len(KS)]
    columns = [("positional", 8), ("usage-aware", 8), ("positional", 16), ("usage-aware", 16)]
    for k, row in zip(KS, rows):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert int(cells[0]) == k
        for (placement, streams), cell in zip(columns, cells[2:6]):
            printed = float(cell.split()[0])
            assert printed == pytest.approx(gb300_by_k[(placement, k)].point(streams).tokens_per_s, abs=0.06), (k, cell)


HBM_SCALES = {"4.2 TB/s (catalog)": 1.0, "1.5 ×": 1.5, "2 ×": 2.0}


def test_the_docs_hbm_rate_table_is_the_estimate():
    # docs/costmodel.md: how far each GB300 figure moves if the machine's HBM read rate were faster
    # than the catalog's 4.2 TB/s (estimate ÷ measured − 1; sixteen positional streams against the
    # 386 / 417 midpoint). Recomputed from the catalog's rate, scaled, so the table cannot go stale.
    doc = (ROOT / "docs" / "costmodel.md").read_text()
    head = "| HBM read rate | positional C1 | C8 | C16 | usage-aware C1 | C8 | C16 |"
    rows = doc[doc.index(head):].splitlines()[2:2 + len(HBM_SCALES)]
    columns = [(p, s) for p in ("positional", "usage-aware") for s in (1, 8, 16)]
    for (label, scale), row in zip(HBM_SCALES.items(), rows):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[0] == label
        loaded = load_recipe("dsv41-flash-gb300")
        for name, machine in loaded.recipe.machines.items():
            assert machine.gpus.hbm_bandwidth == 4.2e12          # the catalog's rate the first row names
            gpus = machine.gpus.model_copy(update={"hbm_bandwidth": machine.gpus.hbm_bandwidth * scale})
            loaded.recipe.machines[name] = machine.model_copy(update={"gpus": gpus})
        estimates = {p: estimate_lane(loaded, "agent", placement=p, streams=[1, 8, 16])
                     for p in ("positional", "usage-aware")}
        for (placement, streams), cell in zip(columns, cells[1:]):
            measured = GB300[(placement, streams)]
            off = estimates[placement].point(streams).tokens_per_s / (sum(measured) / len(measured)) - 1
            assert float(cell.rstrip("%").replace("−", "-")) == pytest.approx(100 * off, abs=0.06), (label, cell)


def implied_independent_streams(loaded, placement: str, streams: int, k: int, measured: float) -> float:
    """The independent-stream count at which the estimate equals a measured tok/s (bisection)."""
    lo, hi = 0.05, float(streams)

    def gap(x: float) -> float:
        return estimate_lane(loaded, "agent", placement=placement, streams=[streams], k=k,
                             independent_streams=x).point(streams).tokens_per_s - measured

    assert gap(lo) > 0 > gap(hi)
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) > 0 else (lo, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize("k", [1, 5])
def test_gb300_both_placements_imply_the_same_routing_overlap(k):
    # The positional step is mostly link reads, the usage-aware one mostly HBM reads; yet at a given
    # k each placement's measured tok/s implies about the same count of streams routing
    # independently — about half the streams. What the model lacks is the number of experts a step
    # touches (k, stream overlap), not a rate. A diagnostic: nothing here enters the estimate.
    loaded = load_recipe("dsv41-flash-gb300")
    for streams in (8, 16):
        positional = implied_independent_streams(loaded, "positional", streams, k,
                                                 sum(GB300[("positional", streams)]) / len(GB300[("positional", streams)]))
        usage_aware = implied_independent_streams(loaded, "usage-aware", streams, k, GB300[("usage-aware", streams)][0])
        assert abs(positional / usage_aware - 1) < 0.25, (streams, k, positional, usage_aware)   # found: 1.09-1.17
        assert 0.4 * streams < usage_aware < 0.75 * streams, (streams, k, usage_aware)


def gb300_ratios(gb300) -> list[float]:
    return [m / gb300[p].point(s).tokens_per_s for (p, s), ms in GB300.items() for m in ms]


def sim_points(results: Path) -> list[dict]:
    data = json.loads(results.read_text())
    assert data["env"]["gpu"] == "NVIDIA H200"
    out = []
    for name, run in data["models"].items():
        for case in ("all_hbm", "usage_aware", "positional"):
            if case not in run["per_T"]["1"]:
                continue
            model = sim_model(name, run, case, data["components"]["hbm_read_GBps"],
                              data["components"]["pinned_read_GBps"])
            for t, row in run["per_T"].items():
                assert row["split_equals_all_hbm"]
                terms = step_terms(model, OperatingPoint(int(t), 0, run["context"]))
                out.append({"model": name, "case": case, "T": int(t), "estimate_ms": terms.total * 1e3,
                            "measured_ms": row[case]["step_ms"], "unique": terms.unique_per_layer,
                            "unique_measured": row["unique_per_layer_mean"], "cold": terms.cold_per_step,
                            "cold_measured": row[case]["cold_experts_per_step_mean"]})
    return out


@pytest.mark.parametrize("results", RUNS, ids=RUN_IDS)
def test_h200_simulation_covers_the_cases_asked_for(results):
    points = sim_points(results)
    assert {(p["model"], p["case"]) for p in points} == {
        ("gpt-oss-120b", "all_hbm"), ("qwen3-30b-a3b", "all_hbm"), ("qwen3-30b-a3b", "usage_aware"),
        ("qwen3-30b-a3b", "positional")}
    assert {p["T"] for p in points} == {1, 8, 32}


@pytest.mark.parametrize("results", RUNS, ids=RUN_IDS)
def test_h200_unique_and_cold_experts_match_the_routing_drawn(results):
    for p in sim_points(results):
        assert p["unique"] == pytest.approx(p["unique_measured"], rel=0.02), p
        if p["cold_measured"]:
            assert p["cold"] == pytest.approx(p["cold_measured"], rel=0.06), p


def _ratios(results: Path) -> dict[tuple[str, str, int], float]:
    """(model, placement, T) -> estimated ÷ measured step = measured tok/s ÷ estimated tok/s, for
    the points whose kernels the efficiency rows describe."""
    ratios = {(p["model"], p["case"], p["T"]): p["estimate_ms"] / p["measured_ms"] for p in sim_points(results)}
    return {key: r for key, r in ratios.items() if key not in SUPERSEDED.get(results, set())}


@pytest.mark.parametrize("results", RUNS, ids=RUN_IDS)
def test_h200_step_time_against_the_simulation(results):
    ratios = _ratios(results)
    for key, r in ratios.items():
        assert BAND_MEASURED_GPU[0] <= r <= BAND_MEASURED_GPU[1], (key, r)
    outside = {key: round(r, 3) for key, r in ratios.items() if abs(r - 1) > 0.15}
    if results == RUN_EB:   # every point within ±15% (docs/costmodel.md)
        assert outside == {}
    else:
        # Runs EC to EF: the one point outside ±15% is the usage-aware Qwen3-30B step at T = 32,
        # where the estimate is slow (cold-first overlaps more of the hot reads with the cold stream
        # than the estimate's "longer stream + FUSED_SHORTER_SHARE x the shorter" assumes; not
        # re-fitted).
        point = ("qwen3-30b-a3b", "usage_aware", 32)
        assert list(outside) == [point] and outside[point] > 1.15, outside


def test_bands_are_what_the_validation_found(gb300):
    sim = [r for results in RUNS for r in _ratios(results).values()]
    assert BAND_MEASURED_GPU[0] <= min(sim) <= BAND_MEASURED_GPU[0] + 0.02
    assert BAND_MEASURED_GPU[1] - 0.02 <= max(sim) <= BAND_MEASURED_GPU[1]
    one = [m / gb300[p].point(1).tokens_per_s for (p, s), ms in GB300.items() if s == 1 for m in ms] + sim
    assert BAND_ONE_STREAM[0] <= min(one) and max(one) <= BAND_ONE_STREAM[1]
    several = [m / gb300[p].point(s).tokens_per_s for (p, s), ms in GB300.items() if s > 1 for m in ms]
    assert BAND_OTHER_GPU_STREAMS[1] - 0.02 <= max(several) <= BAND_OTHER_GPU_STREAMS[1]
