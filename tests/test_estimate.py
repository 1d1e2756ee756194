"""The decode step-time estimate: its formula against hand arithmetic, and its lane bridge."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from recipegen.costmodel.efficiency import (
    EXPERT_EFFICIENCY,
    ExpertEfficiency,
    LaunchCost,
    expert_efficiency,
    log_interpolate,
)
from recipegen.costmodel.estimate import (
    AttentionGroup,
    MoeLayer,
    OperatingPoint,
    StepModel,
    default_skew,
    expected_unique,
    inclusion,
    one_stream_tokens,
    poisson_binomial,
    step_terms,
)

FLAT = ExpertEfficiency("bf16", "test", 1_000_000, {1: 0.5, 96: 0.5}, "test")
GEMM = LaunchCost("gemm", {1: (1e-6, 1.0), 96: (1e-6, 1.0)}, "test")
ATTN = LaunchCost("attention", {1: (2e-6, 0.5), 96: (2e-6, 0.5)}, "test")


def tiny_model(layer: MoeLayer, *, top_k: int = 1, fused: bool = True) -> StepModel:
    return StepModel(decoder_layers=1, moe=(layer,), top_k=top_k, bytes_per_expert=1e6, expert_efficiency=FLAT,
                     dense_bytes_per_layer=2e6, head_bytes=1e6, attention=(AttentionGroup(1, 1000.0),),
                     hbm_read=1e12, pinned_read=1e10, fused_split=fused, gemm=GEMM, attention_cost=ATTN,
                     small_kernel_s=1e-6)


def test_inclusion_of_uniform_picks_is_top_k_over_experts():
    q = inclusion(np.full(8, 1 / 8), 2)
    assert q == pytest.approx(np.full(8, 0.25))
    skew = inclusion(default_skew(128), 8)
    assert skew.sum() == pytest.approx(8.0)
    assert (np.diff(skew) <= 0).all()             # more popular, more often picked


def test_unique_experts_of_independent_uniform_tokens():
    # 128 experts, top-8, four tokens: 128 * (1 - (1 - 8/128)^4) = 128 * (1 - 0.7724761962890625)
    q = inclusion(np.full(128, 1 / 128), 8)
    assert expected_unique(q, 4) == pytest.approx(29.1230469, rel=1e-6)


def test_poisson_binomial_by_hand():
    assert poisson_binomial(np.array([0.5, 0.5])) == pytest.approx([0.25, 0.5, 0.25])
    assert poisson_binomial(np.array([0.2, 0.5, 1.0])) == pytest.approx([0.0, 0.4, 0.5, 0.1])


def test_one_stream_tokens_reproduce_the_measured_unique_counts():
    # the field reports' one-stream counts (DSv4.1-Flash, 384 experts, top-6) under the default skew
    q = inclusion(default_skew(384), 6)
    for k, unique in {1: 10.1, 3: 16.8, 5: 22.5, 7: 27.4}.items():
        assert expected_unique(q, one_stream_tokens(k)) == pytest.approx(unique, rel=1e-6)
        assert 1 < one_stream_tokens(k) < k + 1   # a verify window shares experts across its tokens
    assert one_stream_tokens(0) == 1.0
    assert one_stream_tokens(3) < one_stream_tokens(4) < one_stream_tokens(5)   # the fitted power law between


def test_tokens_per_step_from_acceptance():
    assert OperatingPoint(1, 3, acceptance=0.5).tokens_per_step_per_stream == pytest.approx(1.875)  # (1-0.5^4)/0.5
    assert OperatingPoint(4, 0).tokens_per_step_per_stream == 1.0
    assert OperatingPoint(4, 2).tokens == 12
    with pytest.raises(ValueError, match="acceptance"):
        _ = OperatingPoint(1, 2).tokens_per_step_per_stream


def test_log_interpolation_by_hand():
    row = next(r for r in EXPERT_EFFICIENCY if r.model == "gpt-oss-120b")
    # 0.61 + (0.68 - 0.61) * ln(8/6) / ln(16/6)
    assert row.at(8) == pytest.approx(0.61 + 0.07 * math.log(8 / 6) / math.log(16 / 6))
    assert log_interpolate({1: 0.3, 16: 0.9}, 0.5) == 0.3 and log_interpolate({1: 0.3, 16: 0.9}, 64) == 0.9


def test_expert_efficiency_row_choice():
    assert expert_efficiency("mxfp4", "gpt-oss-120b", 13e6).model == "gpt-oss-120b"
    # another MXFP4 model takes the row nearest in bytes per expert
    assert expert_efficiency("mxfp4", "gpt-oss-20b", 13_236_480).model == "gpt-oss-120b"
    assert expert_efficiency("mxfp4", "some-big-model", 20e6).model == "dsv41-flash-mxfp4"
    assert expert_efficiency("nvfp4", "x", 1e6) is None


def test_step_terms_by_hand_all_in_hbm():
    # four experts, top-1, uniform: one token touches exactly one expert.
    terms = step_terms(tiny_model(MoeLayer((0.25,) * 4)), OperatingPoint(1, 0, context=100))
    assert terms.unique_per_layer == pytest.approx(1.0)
    assert terms.experts == pytest.approx(1e6 / (1e12 * 0.5))                    # 2 us
    assert terms.dense == pytest.approx(4 * 1e-6 + (2e6 + 1e6) / 1e12)          # 3 GEMMs + LM head: 7 us
    assert terms.attention == pytest.approx(2e-6 + 100 * 1000 / (1e12 * 0.5))   # 2.2 us
    assert terms.small_kernels == pytest.approx((7 + 4) * 1e-6)                 # 11 us
    assert terms.total == pytest.approx(22.2e-6)


def test_step_terms_by_hand_cold_reads():
    # two experts, top-1, uniform; expert 1 cold: the hot one touched with p 1/2 (1 MB at
    # 1e12 B/s x 0.5 = 2 us, so 1 us expected), the cold one with p 1/2 (1 MB over 10 GB/s = 100 us).
    layer = MoeLayer((0.5, 0.5), (False, True))
    fused = step_terms(tiny_model(layer), OperatingPoint(1, 0, context=100))
    assert fused.hot_experts == pytest.approx(1e-6)
    assert fused.cold_experts == pytest.approx(50e-6)
    # no cold pick (p 1/2): 1 us; one: max(1, 100) + 1/2 x 1 us
    assert fused.experts == pytest.approx(0.5 * 1e-6 + 0.5 * (100e-6 + 0.5e-6))
    two = step_terms(tiny_model(layer, fused=False), OperatingPoint(1, 0, context=100))
    assert two.experts == pytest.approx(1e-6 + 50e-6)
    # a positional layer: every touched expert's bytes over the link
    positional = step_terms(tiny_model(MoeLayer((0.5, 0.5), None, 1.0)), OperatingPoint(1, 0, context=100))
    assert positional.experts == pytest.approx(1e6 / 1e10) and positional.hot_experts == 0
    assert positional.cold_per_step == pytest.approx(1.0)


def test_sliding_layers_read_at_most_their_window():
    model = dataclasses.replace(tiny_model(MoeLayer((0.25,) * 4)), attention=(AttentionGroup(1, 1000.0, window=10),))
    terms = step_terms(model, OperatingPoint(3, 0, context=100))
    assert terms.kv_bytes == 3 * 10 * 1000


def test_the_drafter_streams_its_weights_once_per_step():
    model = dataclasses.replace(tiny_model(MoeLayer((0.25,) * 4)), drafter_bytes=1e6)
    terms = step_terms(model, OperatingPoint(1, 2, context=100, acceptance=0.5))
    assert terms.drafter == pytest.approx(1e6 / 1e12)          # 1 MB at 1e12 B/s x GEMM efficiency 1.0
    assert terms.total == pytest.approx(terms.experts + terms.dense + terms.attention + terms.small_kernels + 1e-6)
