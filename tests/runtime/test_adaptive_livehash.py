"""The live map's hash kept layer by layer (core.livehash) equals the hash of the whole map rebuilt
(``current_rowmap(...).content_hash()``) after every swap, and a bank whose expert counts changed
is refused."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import current_rowmap  # noqa: E402
from expert_residency.core.adaptive import AdaptiveConfig, AdaptivePolicy, Swap  # noqa: E402
from expert_residency.core.banks import SPARE  # noqa: E402
from expert_residency.core.livehash import LiveMapHash  # noqa: E402
from test_adaptive_policy import Engine  # noqa: E402
from test_core_fixtures import single_torch_thread  # noqa: E402,F401  (autouse)

pytestmark = pytest.mark.torch


def test_the_kept_hash_equals_the_rebuilt_map_after_every_swap():
    config = AdaptiveConfig(interval=1, swaps_per_layer=2)
    engine = Engine(config)
    policy = AdaptivePolicy(engine.counter, engine.split, config, lookahead=False)
    kept = LiveMapHash(engine.split)
    assert kept.digest() == current_rowmap(engine.split).content_hash() == policy.initial_content_hash
    rng = random.Random(5)
    seen = {kept.digest()}
    for _ in range(12):
        index = rng.choice(sorted(engine.split))
        layer = engine.split[index]
        swap = Swap(index, rng.choice(layer.cold_experts), rng.choice(layer.hot_experts))
        policy.apply([swap])
        kept.mark([index])
        rebuilt = current_rowmap(engine.split).content_hash()
        assert kept.digest() == rebuilt == policy.status()["live_content_hash"]
        seen.add(rebuilt)
    assert len(seen) > 6          # the swaps moved the map: the equality above was not of one constant


def test_an_unmarked_change_is_not_seen_and_a_changed_bank_shape_is_refused():
    engine = Engine(AdaptiveConfig(interval=1, swaps_per_layer=2))
    kept = LiveMapHash(engine.split)
    before = kept.digest()
    index = sorted(engine.split)[0]
    layer = engine.split[index]
    row = next(r for r, e in enumerate(layer.hot_ids) if e != SPARE)
    layer.hot_ids[row] = SPARE                           # one hot expert gone: 1 fewer hot
    assert kept.digest() == before                       # a layer nobody marked is not encoded again
    kept.mark([index])
    with pytest.raises(RuntimeError, match=f"layer {index}'s bank shapes changed"):
        kept.digest()
