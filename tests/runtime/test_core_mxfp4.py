"""MXFP4 helpers: E2M1 decode, nibble order, ue8m0 scales, quantize/dequantize."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from expert_residency.mxfp4 import decode_e2m1, dequantize_mxfp4, e2m1_table, e8m0_to_float, quantize_mxfp4, unpack_fp4  # noqa: E402
from test_core_fixtures import single_torch_thread  # noqa: E402,F401

pytestmark = pytest.mark.torch

# OCP MX spec, E2M1: codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 = sign.
SPEC = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_e2m1_decode_matches_the_spec():
    values = decode_e2m1(torch.arange(16, dtype=torch.uint8)).tolist()
    assert values[:8] == SPEC and values[8:] == [-v for v in SPEC]
    assert torch.equal(e2m1_table(), decode_e2m1(torch.arange(16)))


def test_low_nibble_is_the_even_element():
    packed = torch.tensor([[0x21, 0xF7]], dtype=torch.uint8)  # elements: 1, 2, 7, 15
    assert unpack_fp4(packed).tolist() == [[0.5, 1.0, 6.0, -6.0]]


def test_e8m0_scales():
    s = torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.uint8)
    out = e8m0_to_float(s)
    assert out[:6].tolist() == [2.0 ** -127, 2.0 ** -126, 0.5, 1.0, 2.0, 2.0 ** 127]
    assert torch.isnan(out[6])


def test_dequantize_applies_one_scale_per_32_values():
    codes = torch.arange(64, dtype=torch.uint8) % 16
    packed = (codes[0::2] | (codes[1::2] << 4)).reshape(1, 32)
    scales = torch.tensor([[128, 125]], dtype=torch.uint8)  # x2 then x1/4
    out = dequantize_mxfp4(packed, scales)[0]
    expect = decode_e2m1(codes)
    assert torch.equal(out[:32], expect[:32] * 2) and torch.equal(out[32:], expect[32:] / 4)
    with pytest.raises(ValueError, match="one scale per 32"):
        dequantize_mxfp4(packed, torch.zeros(1, 3, dtype=torch.uint8))
    with pytest.raises(TypeError):
        unpack_fp4(packed.to(torch.int16))


def test_quantize_round_trips_representable_values_and_bounds_the_error():
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (4, 64), generator=g)
    exps = torch.randint(-10, 10, (4, 2), generator=g)
    exact = (decode_e2m1(codes).reshape(4, 2, 32) * torch.pow(2.0, exps.float()).unsqueeze(-1)).reshape(4, 64)
    # force each block's amax to 6 * 2^e so the shared exponent is e (a representable block)
    exact = exact.reshape(4, 2, 32)
    exact[..., 0] = 6 * torch.pow(2.0, exps.float())
    exact = exact.reshape(4, 64)
    packed, scales = quantize_mxfp4(exact)
    assert torch.equal(dequantize_mxfp4(packed, scales), exact)
    x = torch.randn(8, 128, generator=g)
    back = dequantize_mxfp4(*quantize_mxfp4(x))
    # E2M1 has one mantissa bit: relative error of a block's largest value <= 25%
    blocks_err = (back - x).abs().reshape(8, 4, 32).amax(-1)
    blocks_max = x.abs().reshape(8, 4, 32).amax(-1)
    assert (blocks_err <= 0.25 * blocks_max).all()
