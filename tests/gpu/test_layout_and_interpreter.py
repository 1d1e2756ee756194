"""CPU checks of the GPU path that need no GPU.

* ``gpu.layout``: tile-major re-ordering is a lossless permutation inside each expert whose every
  tile is one contiguous run (pure torch; runs in CI).
* The Triton kernels under ``TRITON_INTERPRET=1`` (needs Triton installed; the CI venv has none,
  so it skips there): indexing, grouping, both layouts, banks, counter and the torch-grouping
  fallback against the core's torch reference. The interpreter rounds fp32 -> bf16 by truncation
  and has no true fma, so only split == unsplit is checked bit for bit here; the tolerance is
  wider than on the GPU (where ``tests/gpu/test_gpu_residency.py`` checks the real numerics).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))
from expert_residency.gpu.layout import from_kernel_layout, to_kernel_layout  # noqa: E402
from interpreter_rerun import rerun_interpreted  # noqa: E402


def _config(**kw):
    base = dict(block_n1=4, block_k1=64, block_n2=8, block_k2=32, tile_major=True)
    base.update(kw)
    return SimpleNamespace(**base)


def _tensors(experts: int = 3, h: int = 128, i: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {"w13_weight": (experts, 2 * i, h // 2), "w13_weight_scale": (experts, 2 * i, h // 32),
              "w2_weight": (experts, h, i // 2), "w2_weight_scale": (experts, h, i // 32)}
    return {n: torch.randint(0, 256, s, generator=g, dtype=torch.int32).to(torch.uint8) for n, s in shapes.items()}


def test_tile_major_round_trip_and_contiguous_tiles() -> None:
    original = _tensors()
    tiled = {n: t.clone() for n, t in original.items()}
    cfg = _config()
    to_kernel_layout(tiled, cfg)
    w = original["w13_weight"]
    # First tile of expert 1: rows 0..3, bytes 0..31 (BK=64 values = 32 bytes), one run.
    assert torch.equal(tiled["w13_weight"][1].reshape(-1)[:4 * 32], w[1, :4, :32].reshape(-1))
    # Second tile along k: rows 0..3, bytes 32..63.
    assert torch.equal(tiled["w13_weight"][1].reshape(-1)[4 * 32:8 * 32], w[1, :4, 32:64].reshape(-1))
    s = original["w2_weight_scale"]  # tiles of 8 rows x (32/32 = 1) byte
    assert torch.equal(tiled["w2_weight_scale"][2].reshape(-1)[:8], s[2, :8, 0])
    assert not torch.equal(tiled["w13_weight"], w)
    from_kernel_layout(tiled, cfg)
    assert all(torch.equal(tiled[n], original[n]) for n in original)
    untouched = {n: t.clone() for n, t in original.items()}
    to_kernel_layout(untouched, _config(tile_major=False))
    assert all(torch.equal(untouched[n], original[n]) for n in original)


def test_layout_refuses_partial_tiles() -> None:
    with pytest.raises(ValueError, match="whole number"):
        to_kernel_layout(_tensors(), _config(block_n1=5))


def _mma_tensors(h: int = 128, i: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    shapes = {"w13_weight": (2, 2 * i, h // 2), "w13_weight_scale": (2, 2 * i, h // 32),
              "w2_weight": (2, h, i // 2), "w2_weight_scale": (2, h, i // 32)}
    out = {n: torch.randint(0, 256, s, generator=g, dtype=torch.int32).to(torch.uint8) for n, s in shapes.items()}
    for n in ("w13_weight_scale", "w2_weight_scale"):
        out[n] = torch.randint(117, 126, shapes[n], generator=g, dtype=torch.int32).to(torch.uint8)
    return out


def _mma_config():
    return SimpleNamespace(dequant=3, block_n1=64, block_k1=128, block_n2=64, block_k2=64, tile_major=True)


def test_every_code_bit_has_its_own_word_bit_and_its_piece_keeps_it() -> None:
    """The 32 code bits of a word (4 outputs x 2 lanes x sign, e1, e0, m) land on 32 distinct word
    bits, and rotating the word by the piece that serves each one brings it back under that piece's
    mask at the lane position the bf16 decode reads (sign 15, e1 8, e0 7, m 6; + 16 in lane 1)."""
    from expert_residency.gpu.word_bits import DECODE_PIECES, word_bit
    seen = set()
    for j, pieces in enumerate(DECODE_PIECES):
        for lane in range(2):
            for code_bit, lane_bit in ((3, 15), (2, 8), (1, 7), (0, 6)):
                src = word_bit(j, lane, code_bit)
                seen.add(src)
                word = 1 << src
                out = 0
                for mask, r in pieces:
                    out |= ((word << r | word >> (32 - r)) & 0xFFFFFFFF) & mask
                assert out == 1 << (lane_bit + 16 * lane), (j, lane, code_bit)
    assert seen == set(range(32))


@pytest.mark.parametrize("code, word_bytes", [(0x0B, [0x03, 0x02, 0x00, 0x00]), (0x0D, [0x01, 0x02, 0x00, 0x04])])
def test_mma_order_layout_places_one_code_where_the_decode_reads_it(code: int, word_bytes: list[int]) -> None:
    """Hand-placed: w13 of expert 1, row 9, value 42. Row 9 = warp 0, h 1, g 1; value 42 = block
    b 1 (bh 0, b0 1), c 0, d 1, q 1, e 0. Thread (w 0, g 1, q 1) owns 16-byte row 4g+q = 5 (byte 80)
    of tile 0; word c + 2*b0 = 2 (bytes 88..91); code (h 1, d 1, e 0) is output j = 2d + h = 3,
    lane 0, which the decode builds from the word rotated left by 6 (sign to bit 15, e0 to 7, m to
    6) and by 14 (e1 to bit 8): so the sign sits at word bit 9, e0 at 1, m at 0 and e1 at
    (8 - 14) mod 32 = 26. Code 0b1011 (-1.5: sign, e0, m) -> bits 9, 1, 0 = bytes 03 02 00 00;
    code 0b1101 (-3: sign, e1, m) -> bits 9, 26, 0 = bytes 01 02 00 04 (e1 wraps around the word).
    Its scale (row 9, block 1) goes to byte ((w*8 + g)*4) + h + 2*b0 = 4 + 3 = 7 of the tile."""
    t = _mma_tensors()
    for n in t:
        t[n].zero_()
    t["w13_weight"][1, 9, 21] = code          # value 42 = low nibble of byte 21
    t["w13_weight_scale"][1, 9, 1] = 121
    to_kernel_layout(t, _mma_config())
    flat = t["w13_weight"][1].reshape(-1)
    assert flat[88:92].tolist() == word_bytes
    assert int(torch.count_nonzero(flat)) == sum(1 for b in word_bytes if b)
    sflat = t["w13_weight_scale"][1].reshape(-1)
    assert int(sflat[7]) == 121 and int(torch.count_nonzero(sflat)) == 1
    assert int(torch.count_nonzero(t["w13_weight"][0])) == 0  # other experts untouched


def test_mma_order_round_trip_and_refusals() -> None:
    original = _mma_tensors()
    tiled = {n: v.clone() for n, v in original.items()}
    to_kernel_layout(tiled, _mma_config())
    assert not torch.equal(tiled["w13_weight"], original["w13_weight"])
    assert all(tiled[n].shape == original[n].shape for n in original)
    from_kernel_layout(tiled, _mma_config())
    assert all(torch.equal(tiled[n], original[n]) for n in original)
    big = _mma_tensors()
    big["w2_weight_scale"][0, 0, 0] = 129     # 2^(s-1) = 2^128 is no bf16
    with pytest.raises(ValueError, match="above 128"):
        to_kernel_layout(big, _mma_config())
    with pytest.raises(ValueError, match="multiple of 64"):
        to_kernel_layout(_mma_tensors(), SimpleNamespace(**{**vars(_mma_config()), "block_n1": 32}))


def _rerun_interpreted(test_id: str) -> bool:
    """This file's test ``test_id`` in a fresh ``TRITON_INTERPRET=1`` process when needed
    (``interpreter_rerun``)."""
    return rerun_interpreted(__file__, test_id)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="needs Triton for TRITON_INTERPRET=1 (the test extra installs it; the H200 "
                           "runs tests/gpu/test_gpu_residency.py on the real kernels)")
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: tests/gpu/test_gpu_residency.py "
                    "checks the compiled kernels instead")
@pytest.mark.parametrize("tile_major", [True, False])
def test_kernels_under_triton_interpreter(tile_major: bool) -> None:
    if _rerun_interpreted(f"test_kernels_under_triton_interpreter[{tile_major}]"):
        return
    os.environ["TRITON_INTERPRET"] = "1"   # read when the kernels module is first imported
    from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer
    from expert_residency.core.counter import ExpertCounter
    from expert_residency.core.reference import mxfp4_swiglu_per_pick
    from expert_residency.core.split import residency_forward
    from expert_residency.gpu import experts as gx
    from expert_residency.mxfp4 import quantize_mxfp4

    torch.manual_seed(0)
    e, k, h, i, t = 8, 2, 256, 128, 5
    p13, s13 = quantize_mxfp4(torch.randn(e, 2 * i, h) * 0.05)
    p2, s2 = quantize_mxfp4(torch.randn(e, h, i) * 0.05)
    original = {"w13_weight": p13, "w13_weight_scale": s13, "w2_weight": p2, "w2_weight_scale": s2}
    x = torch.randn(t, h).bfloat16()
    weights, ids = torch.topk(torch.softmax(torch.randn(t, e), -1), k)
    ids[0] = torch.tensor([2, 6])  # a token entirely in the cold bank
    ref = residency_forward(build_unsplit_layer(original, layer_index=0), x, weights, ids,
                            mxfp4_swiglu_per_pick(), pick_dtype=torch.bfloat16)
    cfg = gx.KernelConfig(dequant=0, block_m=4, block_n1=32, block_k1=64, block_n2=32, block_k2=64,
                          tile_major=tile_major)
    full = {n: v.clone() for n, v in original.items()}
    to_kernel_layout(full, cfg)
    unsplit = build_unsplit_layer(full, layer_index=0)
    split = rehome_layer(dict(full), [5, 1, 7, 0, 3], [2, 6, 4], layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    ex = gx.TritonMxfp4Experts(gx.ExpertShape(h, i), e, k, max_tokens=8, device="cpu", config=cfg)
    counter = ExpertCounter([0], e)
    out_split = ex.forward(split, x, weights, ids, counter=counter).clone()
    assert torch.equal(out_split, ex.forward(unsplit, x, weights, ids))
    assert torch.equal(counter.counts[0], torch.bincount(ids.flatten(), minlength=e))
    assert int(counter.tokens[0]) == t
    rel = ((out_split.float() - ref.float()).norm() / ref.float().norm()).item()
    assert rel < 2e-2  # bf16 truncation in the interpreter; ~1e-3 on the GPU
    mask = torch.tensor([True, False, True, True, True])
    masked = ExpertCounter([0], e)
    ex.forward(split, x, weights, ids, counter=masked, token_mask=mask)
    assert torch.equal(masked.counts[0], torch.bincount(ids[mask].flatten(), minlength=e))
    assert int(masked.tokens[0]) == 4


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="needs Triton for TRITON_INTERPRET=1 (the H200 runs "
                           "tests/gpu/test_gpu_residency.py on the real kernels)")
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: tests/gpu/test_gpu_residency.py "
                    "checks the compiled kernels instead")
def test_kernels_with_swiglu_clamp_under_triton_interpreter() -> None:
    """``swiglu_limit``: split == unsplit bit for bit, within bf16 tolerance of the clamped torch
    reference, and clearly not the unclamped one (the limit bites)."""
    if _rerun_interpreted("test_kernels_with_swiglu_clamp_under_triton_interpreter"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer
    from expert_residency.core.reference import mxfp4_swiglu_per_pick
    from expert_residency.core.split import residency_forward
    from expert_residency.gpu import experts as gx
    from expert_residency.mxfp4 import quantize_mxfp4

    torch.manual_seed(1)
    e, k, h, i, t, limit = 8, 2, 256, 128, 5, 0.5
    p13, s13 = quantize_mxfp4(torch.randn(e, 2 * i, h) * 0.08)  # products ~N(0, 1.3)
    p2, s2 = quantize_mxfp4(torch.randn(e, h, i) * 0.05)
    original = {"w13_weight": p13, "w13_weight_scale": s13, "w2_weight": p2, "w2_weight_scale": s2}
    x = torch.randn(t, h).bfloat16()
    weights, ids = torch.topk(torch.softmax(torch.randn(t, e), -1), k)
    unsplit_ref = build_unsplit_layer(original, layer_index=0)
    ref = residency_forward(unsplit_ref, x, weights, ids, mxfp4_swiglu_per_pick(swiglu_limit=limit),
                            pick_dtype=torch.bfloat16)
    plain = residency_forward(unsplit_ref, x, weights, ids, mxfp4_swiglu_per_pick(),
                              pick_dtype=torch.bfloat16)
    cfg = gx.KernelConfig(dequant=0, block_m=4, block_n1=32, block_k1=64, block_n2=32, block_k2=64)
    full = {n: v.clone() for n, v in original.items()}
    to_kernel_layout(full, cfg)
    unsplit = build_unsplit_layer(full, layer_index=0)
    split = rehome_layer(dict(full), [5, 1, 7, 0, 3], [2, 6, 4], layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    ex = gx.TritonMxfp4Experts(gx.ExpertShape(h, i), e, k, max_tokens=8, device="cpu", config=cfg,
                               swiglu_limit=limit)
    out_split = ex.forward(split, x, weights, ids).clone()
    assert torch.equal(out_split, ex.forward(unsplit, x, weights, ids))

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    assert rel(out_split, ref) < 2e-2
    assert rel(plain, ref) > 0.1
    with pytest.raises(ValueError, match="swiglu_limit"):
        gx.TritonMxfp4Experts(gx.ExpertShape(h, i), e, k, max_tokens=8, device="cpu", config=cfg,
                              swiglu_limit=0.0)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="needs Triton for TRITON_INTERPRET=1 (the H200 runs "
                           "tests/gpu/test_gpu_residency.py on the real kernels)")
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: tests/gpu/test_gpu_residency.py "
                    "checks the compiled kernels instead")
def test_mma_order_kernels_under_triton_interpreter() -> None:
    """The default MMA-order kernels (their integer twin of the PTX decode): split == unsplit bit
    for bit, the counter exact, within bf16 tolerance of the torch reference on vLLM's layout."""
    if _rerun_interpreted("test_mma_order_kernels_under_triton_interpreter"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer
    from expert_residency.core.counter import ExpertCounter
    from expert_residency.core.reference import mxfp4_swiglu_per_pick
    from expert_residency.core.split import residency_forward
    from expert_residency.gpu import experts as gx
    from expert_residency.mxfp4 import quantize_mxfp4

    torch.manual_seed(2)
    e, k, h, i, t = 6, 2, 256, 128, 4
    p13, s13 = quantize_mxfp4(torch.randn(e, 2 * i, h) * 0.05)
    p2, s2 = quantize_mxfp4(torch.randn(e, h, i) * 0.05)
    original = {"w13_weight": p13, "w13_weight_scale": s13, "w2_weight": p2, "w2_weight_scale": s2}
    x = torch.randn(t, h).bfloat16()
    weights, ids = torch.topk(torch.softmax(torch.randn(t, e), -1), k)
    ids[0] = torch.tensor([2, 4])  # a token entirely in the cold bank
    ref = residency_forward(build_unsplit_layer(original, layer_index=0), x, weights, ids,
                            mxfp4_swiglu_per_pick(), pick_dtype=torch.bfloat16)
    cfg = gx.KernelConfig(block_m=4, block_n1=64, block_k1=128, block_n2=64, block_k2=64)
    assert cfg.dequant == 3  # the default kernel
    full = {n: v.clone() for n, v in original.items()}
    to_kernel_layout(full, cfg)
    unsplit = build_unsplit_layer(full, layer_index=0)
    split = rehome_layer(dict(full), [5, 1, 0, 3], [2, 4], layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    ex = gx.TritonMxfp4Experts(gx.ExpertShape(h, i), e, k, max_tokens=8, device="cpu", config=cfg)
    counter = ExpertCounter([0], e)
    out_split = ex.forward(split, x, weights, ids, counter=counter).clone()
    assert torch.equal(out_split, ex.forward(unsplit, x, weights, ids))
    assert torch.equal(counter.counts[0], torch.bincount(ids.flatten(), minlength=e))
    rel = ((out_split.float() - ref.float()).norm() / ref.float().norm()).item()
    assert rel < 2e-2  # bf16 truncation in the interpreter; ~1e-3 on the GPU


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="needs Triton for TRITON_INTERPRET=1 (the H200 runs "
                           "tests/gpu/test_gpu_residency.py on the real kernels)")
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: tests/gpu/test_gpu_residency.py "
                    "checks the compiled kernels instead")
def test_one_token_fused_finalize_under_triton_interpreter() -> None:
    """T=1: the finalize folded into the w2 launch (each row tile's last program adds the K rows in
    router order) gives the very bits of the separate finalize launch and of the core's torch
    finalize over the same pick rows, split == unsplit, the tickets back at zero, the counter
    exact; a skipped pick (id -1) and a padded token still take their tickets (the next step is
    right again)."""
    if _rerun_interpreted("test_one_token_fused_finalize_under_triton_interpreter"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer
    from expert_residency.core.counter import ExpertCounter
    from expert_residency.core.fma_finalize import finalize as core_finalize
    from expert_residency.gpu import experts as gx
    from expert_residency.mxfp4 import quantize_mxfp4

    torch.manual_seed(3)
    e, k, h, i = 6, 3, 256, 128
    p13, s13 = quantize_mxfp4(torch.randn(e, 2 * i, h) * 0.05)
    p2, s2 = quantize_mxfp4(torch.randn(e, h, i) * 0.05)
    original = {"w13_weight": p13, "w13_weight_scale": s13, "w2_weight": p2, "w2_weight_scale": s2}
    fused_cfg = gx.KernelConfig(block_m=4, block_n1=64, block_k1=128, block_n2=64, block_k2=64)
    assert fused_cfg.fuse_finalize and fused_cfg.one_token  # the defaults
    plain_cfg = gx.KernelConfig(block_m=4, block_n1=64, block_k1=128, block_n2=64, block_k2=64,
                                fuse_finalize=False)
    full = {n: v.clone() for n, v in original.items()}
    to_kernel_layout(full, fused_cfg)
    unsplit = build_unsplit_layer(full, layer_index=0)
    split = rehome_layer(dict(full), [5, 1, 0, 3], [2, 4], layer_index=0,
                         hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
    fused = gx.TritonMxfp4Experts(gx.ExpertShape(h, i), e, k, max_tokens=4, device="cpu", config=fused_cfg)
    plain = gx.TritonMxfp4Experts(gx.ExpertShape(h, i), e, k, max_tokens=4, device="cpu", config=plain_cfg)
    assert fused._fuses_finalize(1) and not fused._fuses_finalize(2) and not plain._fuses_finalize(1)
    counter = ExpertCounter([0], e)
    tickets = fused.split_scratch.tickets2
    for _step, ids_row in enumerate(([2, 0, 4], [1, -1, 3], [4, 2, 5])):  # straddling; a skipped pick
        x = torch.randn(1, h).bfloat16()
        weights = torch.softmax(torch.randn(1, k), -1)
        ids = torch.tensor([ids_row])
        out = fused.forward(split, x, weights, ids, counter=counter).clone()
        rows = fused.workspace.pick_out[:k].view(1, k, h).clone()  # the fused launch's pick rows
        assert int(tickets.abs().sum()) == 0
        assert torch.equal(out, fused.forward(unsplit, x, weights, ids))
        # Same bits as the finalize the core does on the same rows (the interpreter's fma is a
        # plain multiply-add, and both the fused and the separate kernel use it; on the GPU both
        # are the correctly rounded fmaf of core.finalize, tested there).
        assert torch.equal(out, plain.finalize(rows, weights, topk_ids=ids))  # -1: fma(0, 0, acc)
        if -1 not in ids_row:
            assert torch.equal(out, plain.forward(split, x, weights, ids))
            assert torch.allclose(out.float(), core_finalize(rows, weights, torch.bfloat16).float(),
                                  rtol=2e-2, atol=1e-3)
    valid = torch.tensor([2, 0, 4, 1, 3, 4, 2, 5])
    assert torch.equal(counter.counts[0], torch.bincount(valid, minlength=e))
    # A padded token: nothing computed or counted, every ticket still taken and reset.
    before = counter.counts[0].clone()
    fused.forward(split, torch.randn(1, h).bfloat16(), weights, torch.tensor([[0, 1, 2]]), counter=counter,
                  token_mask=torch.tensor([False]))
    assert torch.equal(counter.counts[0], before) and int(tickets.abs().sum()) == 0
