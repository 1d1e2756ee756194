"""Two real processes on CPU, torch.distributed over gloo, one TP rank each (TP = 2).

Each rank builds its own MXFP4 shard of one layer (hot 5 / cold 3 rows with the one shared row map),
checks split == unsplit bit for bit, and all-reduces its bf16 output as vLLM's
``tensor_model_parallel_all_reduce`` does. The sum must match one process holding whole experts
within the rounding bound stated in ``parallel/tp.py`` (``TP_SUM_TOLERANCE``), which is a few bf16
ulps: every rank rounds its partial w2 product and its finalize before the reduction.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from expert_residency.parallel import selfcheck  # noqa: E402


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="this torch build has no gloo backend")
def test_two_gloo_processes_tp2_split_equals_unsplit_and_sum_within_bound() -> None:
    result = selfcheck.run(world=2, backend="gloo", device="cpu")
    assert result["split_equals_unsplit"] == [True, True]
    assert result["all_ranks_same_sum"]          # the all-reduce really ran on both
    assert result["sum_within_bound"], result
    assert result["max_abs_out"] > 0.01          # the layer output is not ~0
    # 8 experts, hot 5 / cold 3 on every rank (the map is global; each rank's rows are its shard)
    assert result["banks"] == [(5, 3, "cpu"), (5, 3, "cpu")]
    # The bound is a few bf16 ulps of the outputs (|y| < 0.06 here: 2^-8 * ~0.3 ~ 1e-3), not a
    # loose tolerance: a missing rank's share (order 0.03) would fail it.
    assert result["max_bound"] < 5e-3


def test_one_rank_alone_is_not_the_sum() -> None:
    """The comparison can fail: one rank's output without the all-reduce is far off the whole."""
    full, x, weights, ids = selfcheck.make_case()
    from expert_residency.core.banks import build_unsplit_layer
    from expert_residency.core.formats_ref import mxfp4_per_pick
    from expert_residency.core.split import residency_forward
    from expert_residency.parallel import TensorShard, unsplit_tp_rank

    fn = mxfp4_per_pick()
    one = residency_forward(build_unsplit_layer(full, layer_index=0), x, weights, ids, fn, pick_dtype=torch.bfloat16)
    r0 = residency_forward(unsplit_tp_rank(full, TensorShard(2, 0, 128), layer_index=0), x, weights, ids, fn,
                           pick_dtype=torch.bfloat16)
    assert float((r0.float() - one.float()).abs().max()) > 5e-3
