"""The FP8-activation layout (``gpu.layout_w4a8``) and its word decode, off the GPU.

* converting vLLM's MXFP4 tensors and decoding the result by hand gives the MXFP4 values exactly
  (fp32 ``torch.equal``), for scales spanning the allowed 11 powers of two, at the bottom and top
  of ue8m0's range, with all-zero blocks and rows;
* a row whose nonzero blocks span more, or a NaN scale, is refused with the tensor, expert and row
  named, and the tensors are left as they were;
* the kernel's PTX (run by a small interpreter of the six instructions it uses) turns every word
  into the E4M3 bytes of ``v * 2^(off - 6)`` for its codes, and the tile order places every value
  of a tile once.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from expert_residency.gpu import layout_w4a8 as lw  # noqa: E402
from expert_residency.mxfp4 import dequantize_mxfp4, e2m1_table  # noqa: E402

MASK = 0xFFFFFFFF


def prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode): byte i of the result is byte ``sel`` nibble i of {b, a}; a set
    bit 3 of the nibble would replicate that byte's sign, which the decode must never ask for."""
    src = [(a >> 8 * i) & 0xFF for i in range(4)] + [(b >> 8 * i) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        nibble = (sel >> 4 * i) & 0xF
        assert nibble < 8, "selector asks for sign replication"
        out |= src[nibble] << 8 * i
    return out


def run_ptx(text: str, word: int, off4: int) -> tuple[int, int]:
    regs = {"$2": word, "$3": off4}

    def val(token: str) -> int:
        return int(token, 0) if token[0].isdigit() else regs[token]

    for line in text.splitlines():
        m = re.match(r"\s*(\w+)\.\w+\s+([^;]+);", line)
        if not m or m.group(1) == "reg":
            continue
        op, args = m.group(1), [a.strip() for a in m.group(2).split(",")]
        dst, src = args[0], [val(a) for a in args[1:]]
        regs[dst] = {"and": lambda: src[0] & src[1], "or": lambda: src[0] | src[1],
                     "shl": lambda: (src[0] << src[1]) & MASK, "shr": lambda: src[0] >> src[1],
                     "add": lambda: (src[0] + src[1]) & MASK, "prmt": lambda: prmt(*src)}[op]()
    return regs["$0"], regs["$1"]


def word_ptx() -> str:
    pytest.importorskip("triton", reason="the kernel module imports Triton")
    from expert_residency.gpu import kernels_w4a8
    return str(kernels_w4a8._WORD_TO_E4M3_PTX.value)


def test_the_word_decode_gives_each_code_times_its_block_offset():
    gen = torch.Generator().manual_seed(5)
    words = torch.randint(0, 2 ** 32, (3000,), dtype=torch.int64, generator=gen).tolist()
    offsets = torch.randint(1, 13, (3000,), generator=gen).tolist()
    words[:2] = [0, MASK]                                   # all zeros / every sign and magnitude set
    for word, off in zip(words, offsets):
        even, odd = run_ptx(word_ptx(), word, off * 0x01010101)
        got = torch.tensor([(r >> 8 * d) & 0xFF for d in range(4) for r in (even, odd)], dtype=torch.uint8)
        want = e2m1_table()[lw.decode_words(torch.tensor(word))] * 2.0 ** (off - 6)    # code m = 2d + c
        assert torch.equal(got.view(torch.float8_e4m3fn).float(), want), (hex(word), off)


@pytest.mark.parametrize("bn", [64, 128])
def test_the_tile_order_places_every_value_once(bn: int):
    row, k = lw.w4a8_tile_index(bn, 128)
    assert torch.equal(torch.sort((row * 128 + k).flatten()).values, torch.arange(bn * 128))


def test_the_offset_order_places_every_block_once_and_matches_the_words():
    row, blk = lw.offset_index(128)
    assert torch.equal(torch.sort((row * 4 + blk).flatten()).values, torch.arange(128 * 4))
    wrow, wk = lw.w4a8_tile_index(128)
    widx = torch.arange(wrow.shape[0])
    j = (widx // 16) * 4 + widx % 4            # the offset byte the kernel pairs with word widx
    assert torch.equal(row[j][:, None].expand(-1, 8), wrow)
    assert torch.equal(blk[j][:, None].expand(-1, 8), wk // 32)


def random_layer(experts: int, i: int, h: int, lo: int, hi: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w13_weight": torch.randint(0, 256, (experts, 2 * i, h // 2), dtype=torch.uint8, generator=g),
            "w13_weight_scale": torch.randint(lo, hi + 1, (experts, 2 * i, h // 32), dtype=torch.uint8, generator=g),
            "w2_weight": torch.randint(0, 256, (experts, h, i // 2), dtype=torch.uint8, generator=g),
            "w2_weight_scale": torch.randint(lo, hi + 1, (experts, h, i // 32), dtype=torch.uint8, generator=g)}


CFG = SimpleNamespace(block_n1=128, block_n2=64)


@pytest.mark.parametrize("lo,hi", [(116, 127), (0, 11), (243, 254), (120, 120)])
def test_the_layout_decodes_to_the_mxfp4_values_exactly(lo: int, hi: int):
    layer = random_layer(3, 256, 384, lo, hi, seed=lo)
    want = {n: dequantize_mxfp4(layer[n], layer[n + "_scale"], torch.float32) for n in ("w13_weight", "w2_weight")}
    lw.to_w4a8_layout(layer, CFG)
    for name, bn in (("w13_weight", 128), ("w2_weight", 64)):
        got = lw.decode_w4a8(layer[name], layer[name + "_scale"], bn)
        assert torch.equal(got, want[name]), name


def test_zero_blocks_may_hold_any_scale():
    layer = random_layer(2, 128, 256, 120, 125, seed=3)
    w, s = layer["w13_weight"], layer["w13_weight_scale"]
    w[1, 7, 16:32] = 0x88                     # block 1 of row 7: every code a signed zero ...
    s[1, 7, 1] = 3                            # ... under a scale far below the row's others
    w[0, 9] = 0                               # a whole zero row
    s[0, 9] = 250
    want = dequantize_mxfp4(w, s, torch.float32)
    lw.to_w4a8_layout(layer, CFG)
    assert torch.equal(lw.decode_w4a8(layer["w13_weight"], layer["w13_weight_scale"], 128), want)


def test_a_row_spanning_more_than_eleven_powers_of_two_is_refused_untouched():
    layer = random_layer(3, 128, 256, 120, 125, seed=4)
    layer["w2_weight_scale"][2, 70, 3] = 137  # 12 above the row's lowest possible 125 ... 120 present
    before = {n: t.clone() for n, t in layer.items()}
    with pytest.raises(lw.W4a8LayoutError, match=r"w2_weight: expert 2 row 70 .* more than 11 powers of two"):
        lw.to_w4a8_layout(layer, CFG)
    for n, t in layer.items():
        assert torch.equal(t, before[n]), n


def test_a_nan_scale_is_refused():
    layer = random_layer(2, 128, 256, 120, 125, seed=5)
    layer["w13_weight_scale"][1, 3, 0] = 255
    layer["w13_weight"][1, 3, :16] = 0x11
    with pytest.raises(lw.W4a8LayoutError, match="w13_weight: expert 1 row 3 has a NaN scale"):
        lw.to_w4a8_layout(layer, CFG)


def test_tiles_that_do_not_fit_are_refused():
    layer = random_layer(1, 128, 256, 120, 125, seed=6)
    with pytest.raises(lw.W4a8LayoutError, match="multiple of 64 rows"):
        lw.to_w4a8_layout(layer, SimpleNamespace(block_n1=96, block_n2=64))
