"""bench/w4a8_probe.py off the GPU: its word decode (the PTX text, run by a small interpreter of
the six instructions it uses) gives the E4M3 bytes of ``v * 2^(off-6)`` for every code of a word,
the values the probe's hand decode (``word_codes``) checks the GPU against; and its tile order
places every (row, k) of a tile exactly once."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="the probe's kernel module imports Triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import w4a8_probe as wp  # noqa: E402

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


def test_the_word_decode_gives_each_code_times_its_block_offset():
    gen = torch.Generator().manual_seed(5)
    words = torch.randint(0, 2 ** 32, (3000,), dtype=torch.int64, generator=gen).tolist()
    offsets = torch.randint(1, 13, (3000,), generator=gen).tolist()
    words[:2] = [0, MASK]                                   # all zeros / every sign and magnitude set
    for word, off in zip(words, offsets):
        even, odd = run_ptx(str(wp._W4A8_WORD_PTX.value), word, off * 0x01010101)
        got = torch.tensor([(r >> 8 * d) & 0xFF for d in range(4) for r in (even, odd)], dtype=torch.uint8)
        want = wp.word_codes(torch.tensor([[word]]))[0] * 2.0 ** (off - 6)    # code m = 2d + c
        assert torch.equal(got.view(torch.float8_e4m3fn).float(), want), (hex(word), off)


@pytest.mark.parametrize("bn", [64, 128])
def test_the_tile_order_places_every_value_once(bn: int):
    row, k = wp.mma_tile_index(bn, 128)
    assert torch.equal(torch.sort((row * 128 + k).flatten()).values, torch.arange(bn * 128))
