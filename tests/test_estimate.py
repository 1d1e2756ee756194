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
    successive_inclusion,
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


def test_a_histograms_inclusion_is_its_picks_per_token():
    """Tokens that each pick top_k distinct experts (here: weighted draws without replacement):
    the chance that a token picked expert e is its count ÷ tokens, whatever drew the picks."""
    rng = np.random.default_rng(7)
    experts, top_k, tokens = 64, 6, 20000
    weights = default_skew(experts)
    counts = np.zeros(experts)
    for _ in range(tokens):
        counts[rng.choice(experts, size=top_k, replace=False, p=weights)] += 1
    q = inclusion(counts / counts.sum(), top_k)
    assert q == pytest.approx(counts / tokens, rel=1e-12)
    # such draws leave shares flatter than their weights: taking the weights for shares is far off,
    # successive_inclusion (what the H200 simulation's validation uses) much nearer
    off_by_weights = abs(top_k * weights - counts / tokens).max()
    off_by_model = abs(successive_inclusion(weights, top_k) - counts / tokens).max()
    assert off_by_weights > 0.04 and off_by_model < 0.015 and off_by_model < off_by_weights / 4


def test_shares_no_histogram_can_have_are_capped():
    # the default skew at 16 experts, top-4: 4 × the top share is 1.06, more than every token
    q = inclusion(default_skew(16), 4)
    p = default_skew(16)
    assert 4 * p[0] > 1
    assert q[0] == 1.0 and (q <= 1.0).all() and q.sum() == pytest.approx(4.0)
    free = q < 1.0
    assert q[free] / p[free] == pytest.approx(np.full(free.sum(), 3.0 / p[free].sum()))


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
    # 0.69 + (0.76 - 0.69) * ln(8/6) / ln(16/6); from 49 tokens the tl.dot kernels (0.63 at 49, 0.64 at 64)
    assert row.at(8) == pytest.approx(0.69 + 0.07 * math.log(8 / 6) / math.log(16 / 6))
    assert row.at(56) == pytest.approx(0.63 + 0.01 * math.log(56 / 49) / math.log(64 / 49))
    assert row.at(48) == 0.73 and row.at(49) == 0.63
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


def test_acceptance_from_a_mean_length_by_hand():
    from recipegen.costmodel.estimate import acceptance_from_mean_length, tokens_per_step
    # α = 0.5, k = 3: 1 + 0.5 + 0.25 + 0.125 = 1.875 tokens per step
    assert tokens_per_step(0.5, 3) == pytest.approx(1.875)
    assert acceptance_from_mean_length(1.875, 3) == pytest.approx(0.5, abs=1e-9)
    # the reference lane's 2.13 tokens at k = 5 is the 0.5425 the estimate defaults to
    assert acceptance_from_mean_length(2.13, 5) == pytest.approx(0.5425, abs=5e-5)
    for bad in (1.0, 4.0, 4.5):
        with pytest.raises(ValueError, match="outside"):
            acceptance_from_mean_length(bad, 3)


def test_state_layers_read_once_and_write_once_per_token():
    from recipegen.costmodel.estimate import StateGroup
    # two state layers, 1,000 B of convolution state and 10,000 B of recurrent state per sequence
    model = dataclasses.replace(tiny_model(MoeLayer((0.25,) * 4)), state=(StateGroup("gdn", 2, 1000.0, 10000.0),))
    plain = step_terms(tiny_model(MoeLayer((0.25,) * 4)), OperatingPoint(3, 0, context=100))
    terms = step_terms(model, OperatingPoint(3, 0, context=100))
    # k = 0: 2 layers x 3 sequences x (read + write) x 11,000 B = 132,000 B at 1e12 B/s
    assert terms.state_bytes == 132_000
    assert terms.state == pytest.approx(132_000 / 1e12)
    assert terms.unmeasured == pytest.approx(terms.state)
    assert terms.total == pytest.approx(plain.total + terms.state)
    # k = 2: the recurrent state is written once per token of the verify window (3 writes + 1 read)
    spec = step_terms(model, OperatingPoint(3, 2, context=100, acceptance=0.5))
    assert spec.state_bytes == 2 * 3 * (2 * 1000 + 4 * 10000)


def test_sparse_attention_reads_topk_latents_and_every_indexer_key():
    # one layer, 100 B of latent KV and 10 B of indexer key per token, top-20 of 1,000 held tokens
    model = dataclasses.replace(tiny_model(MoeLayer((0.25,) * 4)),
                                attention=(AttentionGroup(1, 100.0, None, 20, 10.0),))
    terms = step_terms(model, OperatingPoint(2, 1, context=1000, acceptance=0.5))
    latent = 4 * 20 * 100            # 2 streams x 2 query tokens x 20 picked tokens x 100 B
    index = 2 * 1000 * 10            # every held key, once per sequence
    assert terms.kv_bytes == latent + index
    assert terms.attention == pytest.approx(2e-6 + latent / (1e12 * 0.5) + index / 1e12)
    assert terms.unmeasured == pytest.approx(index / 1e12)
    # a context shorter than top-k reads every held token's latent
    short = step_terms(model, OperatingPoint(1, 0, context=5))
    assert short.kv_bytes == 5 * 100 + 5 * 10


def test_weights_left_in_host_memory_cross_the_link_once_per_step():
    model = dataclasses.replace(tiny_model(MoeLayer((0.25,) * 4)), host_dense_bytes=5e6)
    terms = step_terms(model, OperatingPoint(1, 0, context=100))
    assert terms.host_dense == pytest.approx(5e6 / 1e10)          # 5 MB over 10 GB/s: 0.5 ms
    assert terms.total == pytest.approx(22.2e-6 + 5e-4)


def test_independent_streams_what_if():
    layer = MoeLayer(tuple(default_skew(64)))
    model = dataclasses.replace(tiny_model(layer), top_k=4)
    one = step_terms(model, OperatingPoint(1, 0, context=100))
    four_as_one = step_terms(model, OperatingPoint(4, 0, context=100, independent_streams=1))
    four = step_terms(model, OperatingPoint(4, 0, context=100))
    assert four_as_one.unique_per_layer == pytest.approx(one.unique_per_layer)
    assert four.unique_per_layer > 3 * one.unique_per_layer
    assert four_as_one.attention == pytest.approx(four.attention)   # KV reads still per stream


def test_explicit_launch_counts_replace_the_per_layer_rule():
    base = tiny_model(MoeLayer((0.25,) * 4))
    counted = dataclasses.replace(base, gemm_launches=10, small_launches=20)
    t0 = step_terms(base, OperatingPoint(1, 0, context=100))
    t1 = step_terms(counted, OperatingPoint(1, 0, context=100))
    assert t1.dense - t0.dense == pytest.approx((10 - 3) * 1e-6)            # GEMM fixed time 1 us each
    assert t1.small_kernels - t0.small_kernels == pytest.approx((20 - 7) * 1e-6)
