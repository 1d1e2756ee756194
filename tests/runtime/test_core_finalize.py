"""The finalize is a correctly rounded fp32 fma chain in original top-k order, cast once."""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import finalize, fma_f32  # noqa: E402
from test_core_fixtures import single_torch_thread  # noqa: E402,F401

pytestmark = pytest.mark.torch

F32_MAX = Fraction(struct.unpack("<f", struct.pack("<I", 0x7F7FFFFF))[0])


def round_to_f32(x: Fraction) -> float:
    """Round an exact rational to the nearest fp32 (ties to even), independently of any float path."""
    if x == 0:
        return 0.0
    sign = -1 if x < 0 else 1
    mag = abs(x)
    exponent = mag.numerator.bit_length() - mag.denominator.bit_length()
    if Fraction(2) ** exponent > mag:
        exponent -= 1
    quantum = Fraction(2) ** (max(exponent, -126) - 23)
    q = mag / quantum
    n = math.floor(q)
    rest = q - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1):
        n += 1
    value = n * quantum
    if value > F32_MAX:
        return sign * math.inf
    return sign * float(value)


def exact_fma(a: float, b: float, c: float) -> float:
    return round_to_f32(Fraction(a) * Fraction(b) + Fraction(c))


def f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


ADVERSARIAL = [
    # (1+2^-12)^2 = 1 + 2^-11 + 2^-24 sits exactly on an fp32 midpoint; a tiny c must break the tie.
    (1 + 2 ** -12, 1 + 2 ** -12, 2 ** -100),
    (1 + 2 ** -12, 1 + 2 ** -12, -2 ** -100),
    (1 + 2 ** -12, -(1 + 2 ** -12), 2 ** -100),
    (1 + 2 ** -12, 1 + 2 ** -12, 0.0),
    (3.0, 1 / 3, -1.0),
    (2 ** 64, 2 ** 64, -(2 ** 127)),
    (2 ** -75, 2 ** -75, 2 ** -149),          # subnormal result region
    (1.5, 2 ** -140, 2 ** -149),
    (2 ** 100, 2 ** 100, 1.0),                 # overflow to inf
]


def test_fma_matches_exact_rounding_on_adversarial_cases():
    a, b, c = (f32([case[i] for case in ADVERSARIAL]) for i in range(3))
    got = fma_f32(a, b, c).tolist()
    want = [exact_fma(float(x), float(y), float(z)) for x, y, z in zip(a.tolist(), b.tolist(), c.tolist())]
    assert got == want


def test_fma_is_not_the_naive_double_rounding():
    """The midpoint case is where fp64-then-fp32 rounding goes wrong; fma_f32 must not."""
    a = f32([1 + 2 ** -12])
    c = f32([2 ** -100])
    naive = (a.double() * a.double() + c.double()).float()
    assert naive.item() != exact_fma(a.item(), a.item(), c.item())
    assert fma_f32(a, a, c).item() == exact_fma(a.item(), a.item(), c.item())


def test_fma_matches_exact_rounding_on_random_values():
    g = torch.Generator().manual_seed(0)
    n = 4000
    # mix magnitudes so products and addends cancel, dominate, or sit far apart
    a = torch.randn(n, generator=g) * torch.pow(2.0, torch.randint(-30, 30, (n,), generator=g).float())
    b = torch.randn(n, generator=g)
    c = torch.randn(n, generator=g) * torch.pow(2.0, torch.randint(-40, 40, (n,), generator=g).float())
    # and values built to land near fp32 midpoints: b = 1 + 2^-12-ish patterns
    k = torch.randint(1, 2 ** 12, (n,), generator=g).float()
    a[: n // 4] = 1 + k[: n // 4] * 2 ** -12
    b[: n // 4] = 1 + k[: n // 4] * 2 ** -12
    c[: n // 8] = torch.pow(2.0, -torch.randint(60, 120, (n // 8,), generator=g).float())
    got = fma_f32(a, b, c).tolist()
    want = [exact_fma(x, y, z) for x, y, z in zip(a.tolist(), b.tolist(), c.tolist())]
    assert got == want


def _scalar_finalize(picks: torch.Tensor, weights: torch.Tensor, order) -> list[list[float]]:
    rows = []
    for t in range(picks.shape[0]):
        row = []
        for h in range(picks.shape[2]):
            acc = 0.0
            for k in order:
                acc = exact_fma(float(weights[t, k]), float(picks[t, k, h].float()), acc)
            row.append(acc)
        rows.append(row)
    return rows


def test_finalize_is_an_fma_chain_in_topk_order_cast_once():
    g = torch.Generator().manual_seed(1)
    picks = torch.randn(5, 6, 7, generator=g).to(torch.bfloat16)
    weights = torch.softmax(torch.randn(5, 6, generator=g), dim=-1)
    got = finalize(picks, weights, torch.bfloat16)
    acc = torch.tensor(_scalar_finalize(picks, weights, range(6)), dtype=torch.float32)
    assert torch.equal(got, acc.to(torch.bfloat16))
    assert torch.equal(finalize(picks, weights, torch.float32), acc)


def test_finalize_order_matters():
    """Sanity check that the order is observable: accumulating in another order changes bits."""
    g = torch.Generator().manual_seed(2)
    picks = (torch.randn(64, 6, 32, generator=g) * 100).to(torch.bfloat16)
    weights = torch.softmax(torch.randn(64, 6, generator=g), dim=-1)
    forward = finalize(picks, weights, torch.float32)
    reversed_ = finalize(picks.flip(1), weights.flip(1), torch.float32)
    assert not torch.equal(forward, reversed_)


def test_finalize_writes_out_and_checks_shapes():
    picks = torch.ones(2, 3, 4)
    weights = torch.full((2, 3), 0.25)
    out = torch.empty(2, 4, dtype=torch.bfloat16)
    assert finalize(picks, weights, torch.bfloat16, out=out) is out
    assert out.float().tolist() == [[0.75] * 4] * 2
    with pytest.raises(ValueError, match="topk_weights"):
        finalize(picks, torch.ones(2, 2), torch.float32)
