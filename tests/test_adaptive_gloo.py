"""Adaptive residency decides the same on every rank of a TP = 2 x PP = 2 lane: four real CPU
processes over gloo (tests/adaptive_gloo_support.py), copies on worker threads beside the forwards.

* tensor-parallel ranks of a stage (different bytes: each holds its shard) log the same barriers —
  flipped swaps, profile, window figures — and the same transfers in flight with the same chunks
  issued after every step, with the copies keeping up and with a copy budget that carries
  transfers over barriers;
* pipeline stages choose the same profile at every barrier (their class fits summed over the
  pipeline group), and each stage flips, barrier by barrier, exactly the swaps of its own layers
  that one process holding every layer whole flips (copies keeping up);
* every rank's split layers equal its unsplit shard bit for bit at every forward and after every
  barrier (asserted inside the ranks).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

pytestmark = [pytest.mark.torch, pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                                    reason="this torch build has no gloo backend")]


def _barriers(log):
    return [entry for entry in log if entry[0] == "barrier"]


def test_tp_and_pp_ranks_decide_the_same():
    import adaptive_gloo_support as support

    ranks, reference = support.run()
    by_rank = {r["rank"]: r for r in ranks}
    for name in support.CONFIGS:
        for stage in range(support.STAGES):
            a, b = (by_rank[stage * support.TP + t]["logs"][name] for t in range(support.TP))
            assert a == b, f"{name}: TP ranks of stage {stage} differ"
            assert a[-1][0] == "swaps" and a[-1][1] >= 2, f"{name}: stage {stage} swapped too little to compare"
        # the profile chosen at every barrier: one choice for the whole lane
        priors = {r["rank"]: [e[3] for e in _barriers(r["logs"][name])] for r in ranks}
        assert len({tuple(p) for p in priors.values()}) == 1, priors
        assert "prose" in priors[0] and "agent" in priors[0]   # the shift was seen
    # copies keeping up: each stage flips, barrier by barrier, the one-process lane's swaps of its layers
    whole = _barriers(reference["keep_up"])
    for stage in range(support.STAGES):
        mine = set(support.stage_layers(stage))
        log = _barriers(by_rank[stage * support.TP]["logs"]["keep_up"])
        assert len(log) == len(whole)
        for got, want in zip(log, whole):
            assert got[2] == [s for s in want[2] if s[0] in mine], (stage, got[1])   # (layer, promote, demote)
            assert got[3] == want[3]
    assert sum(len(e[2]) for e in whole) >= 4
