"""Where ``config_for_shape`` halves the K tiles below 128 values (gpt-oss's hidden 2,880 = 45 x 64),
the grouped warp-MMA loop runs up to ``gw_max_tokens_small_tiles`` tokens per step instead of
``gw_max_tokens``: on the H200 the ``tl.dot`` grouped kernels' 64-value tiles read 60-63% of the
HBM limit there against the loop's 73-77% (BENCHMARKS.md, run GT). Geometries that keep 128-value
K tiles keep ``gw_max_tokens``; the loop switched off stays off; a larger setting is kept."""

from __future__ import annotations

import pytest
from tiers import needs_gpu_experts

pytestmark = needs_gpu_experts

GPTOSS = (2880, 2880)          # hidden, intermediate: 45 x 64
DSV41 = (5120, 2304)           # 40 x 128 and 18 x 128


def _fitted(shape, **fields):
    from expert_residency.gpu.experts import ExpertShape, KernelConfig, config_for_shape
    return config_for_shape(ExpertShape(*shape), KernelConfig(**fields))


def test_halved_k_tiles_raise_the_grouped_loop_to_its_own_limit() -> None:
    from expert_residency.gpu.experts import KernelConfig
    default = KernelConfig()
    fitted = _fitted(GPTOSS)
    assert fitted.block_k1 == 64 < default.block_k1
    assert fitted.gw_max_tokens == default.gw_max_tokens_small_tiles == 48 > default.gw_max_tokens
    assert "warp-mma-grouped@2..48" in fitted.describe()


def test_full_k_tiles_keep_gw_max_tokens() -> None:
    fitted = _fitted(DSV41)
    assert fitted.block_k1 == 128 and fitted.gw_max_tokens == 16
    assert "warp-mma-grouped@2..16" in fitted.describe()


@pytest.mark.parametrize("fields, expect", [
    ({"gw_max_tokens": 0}, 0),                          # the loop off stays off
    ({"gw_max_tokens_small_tiles": 0}, 16),             # the rule off leaves gw_max_tokens
    ({"gw_max_tokens": 64}, 64),                        # a larger setting is kept
    ({"gw_max_tokens": 8, "gw_max_tokens_small_tiles": 24}, 24),
])
def test_the_rule_never_lowers_or_switches_on(fields, expect) -> None:
    assert _fitted(GPTOSS, **fields).gw_max_tokens == expect
