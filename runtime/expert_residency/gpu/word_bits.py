"""The bits of one MMA-order word: where ``gpu.layout`` puts its eight E2M1 codes and how the
kernels' decode (``gpu.kernels.word_decode_ptx`` and its interpreter twin) reads them back.

A word holds the codes of one thread's A fragment for one k16 step; its four outputs are bf16x2
registers, each lane needing the code's sign at bit 15 and its ``(e1 e0 m)`` at bits 8..6
(``LANE_MASK``; bf16 then holds the code's value × 2^-126, which the decode's multiply by
``2^(s-1)`` scales exactly). Output ``j`` is the OR of its pieces: the word rotated left by ``r``,
masked. No four single rotations of the word cover its 32 bits (exhaustive search), so output 3 takes
two: nine integer operations per word. Pure data, no imports: the layout (torch) and the kernels
(Triton) both read it.
"""

from __future__ import annotations

LANE_MASK = 0x81C081C0   # sign at 15, (e1 e0 m) at 8..6, in both 16-bit lanes

# output j -> ((mask, left rotation), ...): the word rotated left by r, masked, OR-ed over pieces
DECODE_PIECES: tuple[tuple[tuple[int, int], ...], ...] = (
    ((LANE_MASK, 0),),
    ((LANE_MASK, 4),),
    ((LANE_MASK, 10),),
    ((0x80C080C0, 6), (0x01000100, 14)),   # sign, e0, m from the rotation by 6; e1 from 14
)

# Where a code's bit sits in the output lane: 3 = sign, 2 = e1, 1 = e0, 0 = m (lane 1: + 16).
CODE_BIT_IN_LANE = {3: 15, 2: 8, 1: 7, 0: 6}


def wraps(mask: int, rotation: int) -> bool:
    """Whether rotating left by ``rotation`` brings any bit ``mask`` keeps around from the top:
    if not, a plain left shift gives the same masked bits (and may issue on another pipe)."""
    return any(mask >> bit & 1 for bit in range(rotation))


def word_bit(j: int, lane: int, code_bit: int) -> int:
    """The word bit holding ``code_bit`` of output ``j``'s lane ``lane``: (its output bit − the
    rotation of the piece whose mask keeps that bit) mod 32."""
    target = CODE_BIT_IN_LANE[code_bit] + 16 * lane
    for mask, rotation in DECODE_PIECES[j]:
        if mask >> target & 1:
            return (target - rotation) % 32
    raise AssertionError(f"no piece of output {j} keeps bit {target}")
