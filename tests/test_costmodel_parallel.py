"""Fetch tax of lanes of several GPUs: each GPU reads its own share of the cold bytes over its own link.

TP: each rank reads its 1/TP shard of every cold pick, so the per-GPU time is the one-GPU figure / TP.
EP: each rank reads only its own experts' cold picks; the projection is the rank with the largest
cold share. Expected figures are counted by hand from the histogram and row map files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recipegen.costmodel.lane import fetch_summary
from recipegen.costmodel.parallel import ONE_LINK_PER_GPU, ep_rank_cold_shares, fullest_rank, gpu_reads
from recipegen.load.recipe import load_recipe

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "deepseek-v3-fp8-h200x8.yaml"
DSV3_EXPERT = 4096 * 7168 + 32 * 56 * 4 + 7168 * 2048 + 56 * 16 * 4          # 44,050,944 B
LINK = 64e9                                                                    # catalog h200-sxm-x8
TOP_K, LAYERS = 8, 58


def _files():
    """(counts[l][g], cold ids[l]) read straight from the committed text files."""
    from expert_residency.formats import load_histogram, load_rowmap

    hist = load_histogram(REPO / "recipes/profiles/deepseek-v3/chat.hist")
    rowmap = load_rowmap(REPO / "recipes/maps/deepseek-v3/chat.rowmap")
    return hist.counts.tolist(), rowmap.cold


def test_ep_rank_cold_shares_by_hand() -> None:
    # 2 layers, 4 experts, EP=2 linear: rank 0 holds 0,1; rank 1 holds 2,3.
    counts = [[10, 0, 5, 5], [1, 1, 1, 1]]
    cold = [[1, 2], [0, 3]]
    shares = ep_rank_cold_shares(counts, cold, 4, 2, "linear")
    assert shares == [(0 / 20, 1 / 4), (5 / 20, 1 / 4)]
    assert fullest_rank(shares) == (1, (0.25, 0.25))
    # round_robin: rank 0 holds 0,2; rank 1 holds 1,3
    rr = ep_rank_cold_shares(counts, cold, 4, 2, "round_robin")
    assert rr == [(5 / 20, 1 / 4), (0 / 20, 1 / 4)]
    assert fullest_rank(rr)[0] == 0


def test_tp8_per_gpu_fetch_is_one_eighth_over_its_own_link() -> None:
    loaded = load_recipe(RECIPE)
    lane = loaded.recipe.lanes[0]
    reads = gpu_reads(loaded.recipe.model, lane)
    assert (reads.mode, reads.gpus, reads.bytes_per_expert) == ("tp", 8, DSV3_EXPERT / 8)
    summary = fetch_summary(loaded, lane.name)
    c1 = summary.classes[0].points[0]
    assert (c1.streams, c1.k, c1.unique_per_layer) == (1, 0, TOP_K)   # one stream: the top-8 picks
    counts, cold = _files()
    shares = [sum(row[g] for g in c) / sum(row) for row, c in zip(counts, cold)]
    want_bytes = sum(TOP_K * s * DSV3_EXPERT / 8 for s in shares)
    assert c1.tax.cold_bytes.value == pytest.approx(want_bytes, rel=1e-12)
    assert c1.tax.fetch_time.value == pytest.approx(want_bytes / LINK, rel=1e-12)
    # the printed projection: 0.69 ms per GPU at C1 (5.53 ms were one link reading every cold byte)
    assert round(c1.tax.fetch_ms, 2) == 0.69
    text = "\n".join(summary.lines())
    assert "each of the 8 TP ranks reads its 1/8 shard" in text and ONE_LINK_PER_GPU in text


def test_ep8_per_gpu_fetch_is_the_rank_with_the_largest_cold_share() -> None:
    loaded = load_recipe(RECIPE)
    lane = loaded.recipe.lanes[0]
    loaded.recipe.lanes[0] = lane.model_copy(update={"extra_args": [*lane.extra_args, "--enable-expert-parallel"]})
    summary = fetch_summary(loaded, lane.name)
    c1 = summary.classes[0].points[0]
    counts, cold = _files()
    # linear EP=8 over 256 experts: rank r holds 32r .. 32r+31
    per_rank = []
    for r in range(8):
        mine = range(32 * r, 32 * r + 32)
        per_rank.append(sum(TOP_K * sum(row[g] for g in c if g in mine) / sum(row) * DSV3_EXPERT
                            for row, c in zip(counts, cold)))
    want = max(per_rank)
    assert c1.tax.cold_bytes.value == pytest.approx(want, rel=1e-12)
    assert want > sum(per_rank) / 8          # the fullest rank reads more than an even share
    assert c1.tax.hot_read_time is None      # a rank's hot reads are not projected under EP
    assert "the step waits for the rank with the largest cold share" in "\n".join(summary.lines())
