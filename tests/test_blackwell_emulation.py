"""The Blackwell bank kernel on CPU (``expert_residency.blackwell``), against a torch model of
FlashInfer's ``do_finalize=False`` output (``blackwell.emulation``).

Claims, each able to fail:
* the layout rules reproduce hand-derived positions: the 32-row epilogue shuffle, the up/gate row
  interleave, the 128x4 scale swizzle (offsets worked out by hand from the tile formula);
* the layout is a per-expert slice: converting a whole layer and taking a bank's rows gives the
  same bytes as converting the bank's rows alone (so re-homing after conversion is exact); a
  geometry where that fails is refused;
* bank ids are numbered like two EP ranks (hand example) and the gather reads only local routes
  (a pad row or a ``-1`` route read would bring the emulation's NaN fill into the output);
* split == unsplit == the core's torch reference, bit for bit (``torch.equal``), for several hot/cold
  partitions, with and without a SwiGLU clamp, through ``forward`` and the core's per-pick
  contract; a wrong remap (cold ids not offset) is caught by the same comparison;
* the emulated launcher refuses what FlashInfer's launcher refuses (local range past num_experts).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from expert_residency.blackwell import layout as L  # noqa: E402
from expert_residency.blackwell.emulation import LaunchError, emulated_routed_moe  # noqa: E402
from expert_residency.blackwell.trtllm import (  # noqa: E402
    TrtllmMxfp4Banks,
    bank_slots,
    gather_pick_rows,
    max_tokens_per_launch,
)
from expert_residency.core.banks import (  # noqa: E402
    build_unsplit_layer,
    device_allocator,
    host_allocator,
    rehome_layer,
)
from expert_residency.core.devmap import encode_row_codes  # noqa: E402
from expert_residency.core.reference import mxfp4_swiglu_per_pick  # noqa: E402
from expert_residency.core.split import residency_forward  # noqa: E402
from expert_residency.mxfp4 import quantize_mxfp4  # noqa: E402

# Smallest geometry whose TRT-LLM layout is bank-separable: 2I and H multiples of 128 rows,
# H/32 and I/32 multiples of 4 scale columns (H, I multiples of 128).
EXPERTS, HIDDEN, INTER, TOP_K, TOKENS = 10, 128, 128, 4, 5


def checkpoint(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=g) * 0.1
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, generator=g) * 0.1
    q13, s13 = quantize_mxfp4(w13)
    q2, s2 = quantize_mxfp4(w2)
    return {"w13_weight": q13, "w13_weight_scale": s13, "w2_weight": q2, "w2_weight_scale": s2}


def routing(seed: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(TOKENS, HIDDEN, generator=g)).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(EXPERTS, generator=g)[:TOP_K] for _ in range(TOKENS)])
    weights = torch.softmax(torch.randn(TOKENS, TOP_K, generator=g), dim=-1)
    return x, ids, weights


def kernel(**kw) -> TrtllmMxfp4Banks:
    return TrtllmMxfp4Banks(HIDDEN, INTER, EXPERTS, TOP_K, activation="bf16",
                            routed_moe=emulated_routed_moe, convert=L.to_trtllm_layout, **kw)


# -- layout rules ---------------------------------------------------------------------------
def test_epilogue_shuffle_positions_by_hand() -> None:
    perm = L.epilogue_row_permutation(64)
    # Within a 32-row block old row r lands at 8*(r % 4) + r // 4: old 1 -> new 8, old 4 -> new 1,
    # old 31 -> new 31; the second block repeats it 32 rows down (old 33 -> new 40).
    assert int(perm[8]) == 1 and int(perm[1]) == 4 and int(perm[31]) == 31
    assert int(perm[40]) == 33 and int(perm[0]) == 0
    assert sorted(perm.tolist()) == list(range(64))
    with pytest.raises(ValueError):
        L.epilogue_row_permutation(48)


def test_up_gate_interleave_by_hand() -> None:
    t = torch.arange(2 * 3 * 6).reshape(2, 6, 3)  # 2 experts, I = 3
    out = L.interleave_up_gate(t)
    # row 2j = up j (checkpoint row 3 + j), row 2j+1 = gate j (checkpoint row j)
    assert torch.equal(out[0, 0], t[0, 3]) and torch.equal(out[0, 1], t[0, 0])
    assert torch.equal(out[1, 4], t[1, 5]) and torch.equal(out[1, 5], t[1, 2])
    assert torch.equal(L.deinterleave_up_gate(out), t)


def test_scale_swizzle_offsets_by_hand() -> None:
    m, c = 256, 8
    sf = torch.arange(m * c, dtype=torch.int64).reshape(m, c)
    flat = L.swizzle_128x4(sf).reshape(-1)
    # offset = tile*(C/4)*512 + (k//4)*512 + (m%32)*16 + ((m%128)//32)*4 + k%4, C/4 = 2
    by_hand = {(0, 0): 0, (0, 1): 1, (1, 0): 16, (32, 0): 4, (33, 2): 22, (0, 4): 512,
               (128, 0): 1024, (255, 7): 1024 + 512 + 31 * 16 + 3 * 4 + 3}
    for (row, col), offset in by_hand.items():
        assert int(flat[offset]) == int(sf[row, col]), (row, col, offset)
    assert torch.equal(L.unswizzle_128x4(L.swizzle_128x4(sf)), sf)


def test_layout_round_trip_and_dtypes() -> None:
    t = checkpoint()
    original = {k: v.clone() for k, v in t.items()}
    L.to_trtllm_layout(t)
    assert t["w13_weight"].dtype == torch.uint8 and t["w13_weight_scale"].dtype == torch.float8_e4m3fn
    # Same bytes per expert as the checkpoint layout: the ledger's bank bytes hold for both kernels.
    for name, value in original.items():
        assert t[name].shape == value.shape and t[name].element_size() == value.element_size(), name
    assert not torch.equal(t["w13_weight"], original["w13_weight"])
    L.from_trtllm_layout(t)
    for name, value in original.items():
        assert torch.equal(t[name], value), name


def test_bank_rows_of_the_converted_layer_are_the_banks_own_conversion() -> None:
    full = checkpoint()
    L.to_trtllm_layout(full)
    rows = [7, 2, 9]
    alone = {k: v[rows].clone() for k, v in checkpoint().items()}
    L.to_trtllm_layout(alone)
    for name in L.NAMES:
        assert torch.equal(full[name][rows].view(torch.uint8), alone[name].view(torch.uint8)), name


@pytest.mark.parametrize("hidden,inter", [(96, 64), (128, 32), (128, 48)])
def test_unseparable_geometry_is_refused(hidden: int, inter: int) -> None:
    with pytest.raises(ValueError, match="cannot be split into banks"):
        L.check_bank_separable(hidden, inter)


# -- remap and gather -----------------------------------------------------------------------
def test_bank_slots_number_banks_like_two_ranks() -> None:
    hot, cold = [4, 0, 2], [1, 3]
    codes = encode_row_codes(hot, cold, 5)
    ids = torch.tensor([[0, 1], [3, 4], [2, 2]])
    # hot rows: 4->0, 0->1, 2->2; cold rows offset by 3 hot rows: 1->3, 3->4
    assert bank_slots(codes, ids, 3).tolist() == [[1, 3], [4, 0], [2, 2]]
    assert bank_slots(codes, ids, 3).dtype == torch.int32


def test_gather_reads_only_local_routes() -> None:
    gemm2 = torch.full((8, 3), float("nan"), dtype=torch.bfloat16)
    gemm2[5] = torch.tensor([1.0, 2.0, 3.0])
    out = torch.full((2, 2, 3), 7.0, dtype=torch.bfloat16)
    gather_pick_rows(gemm2, torch.tensor([[-1, 5], [-1, -1]], dtype=torch.int32), out)
    assert out[0, 1].tolist() == [1.0, 2.0, 3.0]
    assert out[0, 0].tolist() == [7.0] * 3 and out[1].tolist() == [[7.0] * 3] * 2


def test_launch_bound_matches_vllm_formula() -> None:
    # (65535 - 384) * 8 // 6 = 521208 // 6 = 86868 tokens per launch at DeepSeek-V4.1's 384 x top-6
    assert max_tokens_per_launch(6, 384) == 86868


# -- split == unsplit == reference ----------------------------------------------------------
PARTITIONS = [
    ([3, 7, 1, 0, 5], [2, 4, 6, 8, 9]),        # scattered, half and half
    (list(range(8)), [8, 9]),                   # positional
    ([9], list(range(9))),                      # one hot row
]


@pytest.mark.parametrize("limit", [None, 0.05])
def test_split_equals_unsplit_equals_reference(limit: float | None) -> None:
    x, ids, weights = routing()
    reference = residency_forward(build_unsplit_layer(checkpoint(), layer_index=0), x, weights,
                                  ids, mxfp4_swiglu_per_pick(swiglu_limit=limit))
    k = kernel(swiglu_limit=limit)
    converted = checkpoint()
    k.to_kernel_layout(converted)
    unsplit = k.forward(build_unsplit_layer(dict(converted), layer_index=0), x, weights, ids)
    assert torch.equal(unsplit, reference)
    for hot, cold in PARTITIONS:
        layer = rehome_layer(dict(converted), hot, cold, layer_index=0,
                             hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
        split = k.forward(layer, x, weights, ids)
        assert torch.equal(split, reference), (hot, cold)
        assert not torch.isnan(split).any()
        via_core = residency_forward(layer, x, weights, ids, k.per_pick_fn())
        assert torch.equal(via_core, reference), (hot, cold)


def test_clamp_changes_the_output() -> None:
    x, ids, weights = routing()
    converted = checkpoint()
    L.to_trtllm_layout(converted)
    layer = build_unsplit_layer(converted, layer_index=0)
    assert not torch.equal(kernel().forward(layer, x, weights, ids),
                           kernel(swiglu_limit=0.05).forward(layer, x, weights, ids))


def test_a_wrong_remap_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    import expert_residency.blackwell.trtllm as trtllm

    x, ids, weights = routing()
    reference = residency_forward(build_unsplit_layer(checkpoint(), layer_index=0), x, weights,
                                  ids, mxfp4_swiglu_per_pick())
    converted = checkpoint()
    L.to_trtllm_layout(converted)
    hot, cold = PARTITIONS[0]
    layer = rehome_layer(converted, hot, cold, layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    # Cold rows numbered from 0 instead of from the hot count: they collide with hot rows.
    monkeypatch.setattr(trtllm, "bank_slots", lambda codes, ids, hot_rows: bank_slots(codes, ids, 0))
    assert not torch.equal(kernel().forward(layer, x, weights, ids), reference)


def test_emulated_launcher_refuses_what_flashinfer_refuses() -> None:
    converted = checkpoint()
    L.to_trtllm_layout(converted)
    x, ids, weights = routing()
    bank = build_unsplit_layer(converted, layer_index=0).hot
    with pytest.raises(LaunchError, match="outside num_experts"):
        kernel().bank_call(x, None, ids.to(torch.int32), weights, bank, 2, EXPERTS)
    with pytest.raises(LaunchError, match="int32"):
        kernel().bank_call(x, None, ids, weights, bank, 0, EXPERTS)


def test_selfcheck_dry_run_passes(tmp_path) -> None:
    import json

    from expert_residency.blackwell.selfcheck import main

    out = tmp_path / "selfcheck.json"
    assert main(["--emulate", "--tokens", "1,6", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["ok"] and [r["tokens"] for r in result["results"]] == [1, 6]
    assert all(r["split_equal"] and r["per_pick_equal"] for r in result["results"])
    assert sum(r["cold_picks"] for r in result["results"]) > 0  # the cold bank was exercised
    assert main(["--emulate", "--hot", "0"]) == 2  # an empty bank is no split


def test_fused_signature_counts_picks() -> None:
    from expert_residency.core.counter import ExpertCounter

    x, ids, weights = routing()
    converted = checkpoint()
    L.to_trtllm_layout(converted)
    layer = build_unsplit_layer(converted, layer_index=3)
    counter = ExpertCounter([3], EXPERTS, device="cpu", top_k=TOP_K)
    mask = torch.tensor([True, True, False, True, True])
    out = torch.empty(TOKENS, HIDDEN, dtype=torch.bfloat16)
    y = kernel().forward(layer, x, weights, ids, counter=counter, token_mask=mask, out=out)
    assert y is out
    expected = torch.bincount(ids[mask].reshape(-1), minlength=EXPERTS)
    assert counter.counts[counter.row_of(3)].tolist() == expected.tolist()


def test_gather_depends_on_the_permute_map_only() -> None:
    """FlashInfer's row order is an implementation detail (and tactic-dependent); with the routes'
    rows scattered at random over the padded buffer the result is the same bits."""
    import functools

    x, ids, weights = routing()
    reference = residency_forward(build_unsplit_layer(checkpoint(), layer_index=0), x, weights,
                                  ids, mxfp4_swiglu_per_pick())
    converted = checkpoint()
    L.to_trtllm_layout(converted)
    hot, cold = PARTITIONS[0]
    layer = rehome_layer(converted, hot, cold, layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    for seed in (1, 2):
        scattered = TrtllmMxfp4Banks(HIDDEN, INTER, EXPERTS, TOP_K, activation="bf16",
                                     routed_moe=functools.partial(emulated_routed_moe,
                                                                  row_order_seed=seed))
        assert torch.equal(scattered.forward(layer, x, weights, ids), reference)


def test_selfcheck_without_a_gpu_says_so(capsys: pytest.CaptureFixture) -> None:
    from expert_residency.blackwell.selfcheck import main

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert main(["--tokens", "1"]) == 2
    assert "no CUDA device" in capsys.readouterr().out


def test_mxfp8_activations_quantized_once_for_both_banks() -> None:
    """The MXFP8 variant quantizes the layer input once; both launches get the same bytes, the
    scales as given, and the call arguments FlashInfer's launcher needs for each bank."""
    x, ids, weights = routing()
    calls: list[dict] = []
    quantized: list[torch.Tensor] = []

    def quantize(a: torch.Tensor):
        quantized.append(a)
        return a.to(torch.float8_e4m3fn), torch.full((a.shape[0], HIDDEN // 32), 127, dtype=torch.uint8)

    def routed_moe(**kw):
        calls.append(kw)
        t, k = kw["topk_ids"][0].shape
        return [torch.zeros(8, HIDDEN, dtype=torch.bfloat16), kw["topk_ids"][1],
                torch.full((t * k,), -1, dtype=torch.int32)]

    converted = checkpoint()
    L.to_trtllm_layout(converted)
    hot, cold = PARTITIONS[1]
    layer = rehome_layer(converted, hot, cold, layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    k = TrtllmMxfp4Banks(HIDDEN, INTER, EXPERTS, TOP_K, activation="mxfp8", swiglu_limit=7.0,
                         routed_moe=routed_moe, quantize=quantize)
    k.forward(layer, x, weights, ids)
    assert len(quantized) == 1 and len(calls) == 2
    hot_call, cold_call = calls
    # the same buffer (a view per launch chunk), not a second quantization
    for name in ("hidden_states", "hidden_states_scale"):
        assert hot_call[name].data_ptr() == cold_call[name].data_ptr(), name
    assert hot_call["hidden_states"].dtype == torch.float8_e4m3fn
    assert (hot_call["local_expert_offset"], hot_call["local_num_experts"]) == (0, 8)
    assert (cold_call["local_expert_offset"], cold_call["local_num_experts"]) == (8, 2)
    assert hot_call["num_experts"] == cold_call["num_experts"] == EXPERTS
    assert hot_call["do_finalize"] is False and cold_call["gemm1_weights"].shape[0] == 2
    assert cold_call["gemm1_clamp_limit"].tolist() == [7.0, 7.0]
    assert torch.equal(hot_call["topk_ids"][0], cold_call["topk_ids"][0])  # one remap, two ranges
