"""Host memory vLLM 0.33 pins at load: PyTorch's caching host allocator rounds each pinned
parameter up to a power of two (recipegen.ledger.pinning). Expected figures by hand."""

from __future__ import annotations

import pytest
from test_ledger import REFERENCE

from recipegen.common.units import GiB
from recipegen.ledger.pinning import caching_host_allocation, pinned_per_layer, rehoming_host_peak, vllm_parameters
from recipegen.load.recipe import load_recipe


def test_power_of_two_blocks() -> None:
    assert caching_host_allocation(0) == 0
    assert caching_host_allocation(1) == 1
    assert caching_host_allocation(GiB) == GiB            # already a power of two
    assert caching_host_allocation(GiB + 1) == 2 * GiB
    assert caching_host_allocation(int(4.5 * GiB)) == 8 * GiB   # what the H200 measurement showed


@pytest.fixture(scope="module")
def model():
    return load_recipe(REFERENCE, read_maps=False).recipe.model


def test_vllm_stores_values_and_scales_as_separate_parameters(model) -> None:
    # MXFP4, 384 experts: w13 4608x5120 (4 bits + one byte per 32 values), w2 5120x2304
    assert vllm_parameters(model) == [[4608 * 5120 // 2 * 384, 4608 * 5120 // 32 * 384],
                                      [5120 * 2304 // 2 * 384, 5120 * 2304 // 32 * 384]]


def test_pinned_per_layer_whole_partial_and_none(model) -> None:
    w13 = 4608 * 5120 * 384 * 17 // 32          # values + scales of one layer's w13
    w2 = 5120 * 2304 * 384 * 17 // 32
    whole, only_w13 = (8 + 0.5 + 4 + 0.25) * GiB, (8 + 0.5) * GiB
    assert pinned_per_layer(model, [w13 + w2, w13, 0]) == [whole, only_w13, 0]
    with pytest.raises(ValueError, match="whole number of expert parameters"):
        pinned_per_layer(model, [w13 - 1])


def test_rehoming_peak_releases_each_layer_after_its_new_bank() -> None:
    # two host layers pinned at 8 each (exact 5), final cold banks 2 and 3; one device layer
    # (nothing pinned) whose cold bank is 1. Order: device layer, then the host layers.
    pinned, final = [0, 8, 8], [1, 2, 3]
    # start 16; layer 0: 16 + 1 = 17, then 17; layer 1: 17 + 2 = 19, then 11; layer 2: 11 + 3 = 14
    assert rehoming_host_peak(pinned, final, [0, 1, 2]) == 19
    assert rehoming_host_peak(pinned, final, []) == 16      # no re-homing: the load is final
