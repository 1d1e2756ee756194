"""Split invoke + finalize is bit-identical to the unsplit reference (exact equality)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import (  # noqa: E402
    ExpertBank,
    build_unsplit_layer,
    dense_per_pick,
    device_allocator,
    finalize,
    host_allocator,
    rehome_layer,
    residency_forward,
    route_picks,
    split_invoke,
)
from expert_residency.core.reference import mxfp4_swiglu_per_pick, swiglu_per_pick  # noqa: E402
from expert_residency.mxfp4 import dequantize_mxfp4  # noqa: E402
from test_core_fixtures import (  # noqa: E402
    EXPERTS,
    TOP_K,
    clone_tensors,
    float_layer,
    hidden_states,
    mxfp4_layer,
    random_partition,
    routing,
    single_torch_thread,  # noqa: E402,F401  (autouse)
)

pytestmark = pytest.mark.torch


def _split_layer(tensors, hot, cold):
    return rehome_layer(clone_tensors(tensors), hot, cold, layer_index=3,
                        hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())


def _categories(ids, hot):
    in_hot = torch.isin(ids, torch.tensor(hot, dtype=ids.dtype))
    return int(in_hot.all(1).sum()), int((~in_hot).all(1).sum()), int((in_hot.any(1) & (~in_hot).any(1)).sum())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("hot_count", [1, 5, 11, 15])
def test_float_split_equals_unsplit(dtype, bias, hot_count):
    tensors = float_layer(7, dtype, bias=bias)
    hot, cold = random_partition(100 + hot_count, EXPERTS, hot_count)
    reference = build_unsplit_layer(tensors, layer_index=3)
    split = _split_layer(tensors, hot, cold)
    fn = swiglu_per_pick()
    for seed in range(3):
        x = hidden_states(seed, 24, dtype)
        ids, weights = routing(seed, 24, hot_ids=hot, cold_ids=cold)
        all_hot, all_cold, straddling = _categories(ids, hot)
        assert straddling > 0 and (all_hot > 0 or hot_count < TOP_K) and (all_cold > 0 or EXPERTS - hot_count < TOP_K)
        want = residency_forward(reference, x, weights, ids, fn)
        got = residency_forward(split, x, weights, ids, fn)
        assert got.dtype == dtype
        assert torch.equal(got, want)
        # uniformly random routing too
        x2 = hidden_states(50 + seed, 31, dtype)
        ids, weights = routing(50 + seed, 31)
        assert torch.equal(residency_forward(split, x2, weights, ids, fn),
                           residency_forward(reference, x2, weights, ids, fn))


def test_every_expert_alone_in_its_bank_matches():
    """Tokens entirely in one bank, one pick per expert position: every expert checked once."""
    tensors = float_layer(3, torch.bfloat16)
    hot, cold = random_partition(4, EXPERTS, 9)
    reference = build_unsplit_layer(tensors, layer_index=0)
    split = _split_layer(tensors, hot, cold)
    ids = torch.tensor([[e, (e + 1) % EXPERTS] for e in range(EXPERTS)], dtype=torch.int32)
    weights = torch.full((EXPERTS, 2), 0.5)
    x = hidden_states(9, EXPERTS, torch.bfloat16)
    fn = swiglu_per_pick()
    assert torch.equal(split_invoke(split, x, ids, fn), split_invoke(reference, x, ids, fn))
    assert torch.equal(residency_forward(split, x, weights, ids, fn),
                       residency_forward(reference, x, weights, ids, fn))


@pytest.mark.parametrize("hot_count", [2, 10, 14])
def test_mxfp4_split_equals_unsplit(hot_count):
    tensors = mxfp4_layer(11)
    hot, cold = random_partition(hot_count, EXPERTS, hot_count)
    reference = build_unsplit_layer(tensors, layer_index=1)
    split = _split_layer(tensors, hot, cold)
    # every tensor, scales included, was split with the same partition
    for name, full in tensors.items():
        assert torch.equal(split.hot[name], full[hot]) and torch.equal(split.cold[name], full[cold])
    fn = mxfp4_swiglu_per_pick()
    for seed in range(3):
        x = hidden_states(seed, 20, torch.bfloat16)
        ids, weights = routing(seed, 20, hot_ids=hot, cold_ids=cold)
        assert torch.equal(residency_forward(split, x, weights, ids, fn),
                           residency_forward(reference, x, weights, ids, fn))


def test_reference_math_matches_float64_moe():
    """The per-pick reference and finalize compute the usual SwiGLU MoE (loose check, float64)."""
    tensors = float_layer(5, torch.float32, bias=True)
    layer = _split_layer(tensors, *random_partition(1, EXPERTS, 6))
    x = hidden_states(2, 12, torch.float32)
    ids, weights = routing(2, 12)
    got = residency_forward(layer, x, weights, ids, swiglu_per_pick()).double()
    want = torch.zeros(12, x.shape[1], dtype=torch.float64)
    inter = tensors["w2_weight"].shape[2]
    for t in range(12):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            g = tensors["w13_weight"][e].double() @ x[t].double() + tensors["w13_bias"][e].double()
            a = torch.nn.functional.silu(g[:inter]) * g[inter:]
            want[t] += weights[t, k].double() * (tensors["w2_weight"][e].double() @ a + tensors["w2_bias"][e].double())
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)


def test_mxfp4_reference_matches_dequantized_float_reference():
    """The MXFP4 per-pick function equals the float one run on exactly dequantized weights."""
    packed = mxfp4_layer(21)
    dequant = {"w13_weight": dequantize_mxfp4(packed["w13_weight"], packed["w13_weight_scale"]),
               "w2_weight": dequantize_mxfp4(packed["w2_weight"], packed["w2_weight_scale"])}
    x = hidden_states(1, 10, torch.bfloat16)
    ids, weights = routing(1, 10)
    a = residency_forward(build_unsplit_layer(packed, layer_index=0), x, weights, ids, mxfp4_swiglu_per_pick())
    b = residency_forward(build_unsplit_layer(dequant, layer_index=0), x, weights, ids, swiglu_per_pick())
    assert torch.equal(a, b)


def test_bank_size_dependent_kernel_is_caught():
    """Negative control: a per-pick function whose arithmetic depends on the bank size breaks
    bit-identity, and the exact comparison sees it (the test is not vacuous)."""
    tensors = float_layer(8, torch.float32)
    hot, cold = random_partition(8, EXPERTS, 10)
    good = swiglu_per_pick()

    def tiled_by_bank_size(x, bank, rows, mask, out):
        good(x, bank, rows, mask, out)
        # e.g. a kernel whose tile count follows num_rows and re-associates the last reduction
        out.copy_(torch.where(mask.unsqueeze(-1), out * (1 + 2 ** -20 * (bank.num_rows % 3)), out))

    x = hidden_states(0, 16, torch.float32)
    ids, weights = routing(0, 16, hot_ids=hot, cold_ids=cold)
    reference = residency_forward(build_unsplit_layer(tensors, layer_index=0), x, weights, ids, tiled_by_bank_size)
    split = residency_forward(_split_layer(tensors, hot, cold), x, weights, ids, tiled_by_bank_size)
    assert not torch.equal(split, reference)


def test_summing_two_finalized_banks_is_not_bit_identical():
    """Why the finalize sees the picks, not the banks: finalizing each bank and adding the two
    outputs (the obvious split) changes bf16 bits on straddling tokens."""
    tensors = float_layer(12, torch.bfloat16)
    hot, cold = random_partition(12, EXPERTS, 8)
    split = _split_layer(tensors, hot, cold)
    fn = swiglu_per_pick()
    x = hidden_states(3, 64, torch.bfloat16)
    ids, weights = routing(3, 64, hot_ids=hot, cold_ids=cold)
    picks = split_invoke(split, x, ids, fn)
    routed = route_picks(split.row_codes, ids)
    naive = (finalize(picks, weights * routed.hot_mask, torch.bfloat16)
             + finalize(picks, weights * routed.cold_mask, torch.bfloat16))
    exact = finalize(picks, weights, torch.bfloat16)
    assert torch.equal(exact, residency_forward(build_unsplit_layer(tensors, layer_index=0), x, weights, ids, fn))
    assert not torch.equal(naive, exact)


def test_per_pick_contract_leaves_other_bank_rows_untouched():
    tensors = float_layer(2, torch.float32)
    hot, cold = random_partition(2, EXPERTS, 7)
    split = _split_layer(tensors, hot, cold)
    ids, _ = routing(4, 9, hot_ids=hot, cold_ids=cold)
    routed = route_picks(split.row_codes, ids)
    sentinel = torch.full((9, ids.shape[1], tensors["w2_weight"].shape[1]), 12345.0)
    swiglu_per_pick()(hidden_states(4, 9, torch.float32), split.hot, routed.hot_rows, routed.hot_mask, sentinel)
    assert (sentinel[routed.cold_mask] == 12345.0).all()
    assert (sentinel[routed.hot_mask] != 12345.0).all()


def test_dense_per_pick_adapter_masks_writes():
    bank = ExpertBank({"w": torch.arange(4.0).reshape(4, 1)}, 4)
    fn = dense_per_pick(lambda x, b, rows: b["w"][rows].expand(*rows.shape, 3))
    rows = torch.tensor([[1, 2]])
    mask = torch.tensor([[True, False]])
    out = torch.full((1, 2, 3), -1.0)
    fn(torch.zeros(1, 3), bank, rows, mask, out)
    assert out.tolist() == [[[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]]


def test_route_picks_resolves_banks_and_rows():
    from expert_residency.core import decode_row_codes, encode_row_codes
    codes = encode_row_codes([5, 0, 3], [1, 4, 2], 6)
    assert codes.dtype == torch.int32 and codes.tolist() == [1, -1, -3, 2, -2, 0]
    assert decode_row_codes(codes) == ([5, 0, 3], [1, 4, 2])
    r = route_picks(codes, torch.tensor([[5, 2], [4, 3]], dtype=torch.int32))
    assert r.hot_mask.tolist() == [[True, False], [False, True]]
    assert r.hot_rows.tolist() == [[0, 0], [0, 2]] and r.cold_rows.tolist() == [[0, 2], [1, 0]]
    assert torch.equal(r.cold_mask, ~r.hot_mask)
    with pytest.raises(ValueError, match="appears twice"):
        encode_row_codes([1, 2], [2, 0], 3)
    with pytest.raises(ValueError, match="neither bank"):
        encode_row_codes([1], [2], 3)
