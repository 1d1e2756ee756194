"""Units: sizes, bandwidths, counts and the budget rounding rule."""

from __future__ import annotations

import pytest

from recipegen.common.units import (
    GB,
    TB,
    GiB,
    MiB,
    UnitError,
    format_bytes,
    format_tokens,
    largest_count_within,
    parse_bandwidth,
    parse_bytes,
    parse_count,
    parse_scaled_number,
)


@pytest.mark.parametrize("text, expected", [
    ("60 GiB", 60 * 2**30),
    ("250.7 GiB", round(250.7 * 2**30)),
    ("141 GB", 141 * 10**9),
    ("17.93 MiB", round(17.93 * 2**20)),
    ("18800640 B", 18_800_640),
    ("18,800,640 B", 18_800_640),
    ("15 TB", 15 * 10**12),
    ("0 GiB", 0),
    ("1KiB", 1024),
])
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad, message", [
    (60, "missing unit"),
    (60.5, "missing unit"),
    ("60", "missing unit"),
    ("60 gib", "unknown unit 'gib'"),
    ("60 GiB/s", "unknown unit"),
    ("sixty GiB", "cannot read"),
    (True, "with a unit"),
    (None, "with a unit"),
])
def test_parse_bytes_rejects(bad: object, message: str) -> None:
    with pytest.raises(UnitError, match=message):
        parse_bytes(bad)


def test_parse_bandwidth() -> None:
    assert parse_bandwidth("340 GB/s") == 340 * GB
    assert parse_bandwidth("4.2 TB/s") == pytest.approx(4.2 * TB)
    assert parse_bandwidth("1 GiB/s") == GiB
    with pytest.raises(UnitError, match="unknown unit 'GB'"):
        parse_bandwidth("340 GB")
    with pytest.raises(UnitError, match="missing unit"):
        parse_bandwidth(340)


@pytest.mark.parametrize("value, expected", [
    # vLLM's human_readable_int: lowercase decimal, uppercase binary.
    ("1M", 1_048_576), ("1m", 1_000_000), ("128k", 128_000), ("128K", 131_072),
    ("25.6k", 25_600), (4096, 4096), ("4096", 4096), (4096.0, 4096),
])
def test_parse_count_matches_vllm(value: object, expected: int) -> None:
    assert parse_count(value) == expected


@pytest.mark.parametrize("bad", ["1.5M", "1.5", 1.5, "lots", True])
def test_parse_count_rejects(bad: object) -> None:
    with pytest.raises(UnitError):
        parse_count(bad)


def test_scaled_number() -> None:
    assert parse_scaled_number("0.518M") == pytest.approx(518_000)
    assert parse_scaled_number(518000) == 518000
    with pytest.raises(UnitError):
        parse_scaled_number("0.5 GiB")


def test_rounding_rule_largest_whole_count_that_fits() -> None:
    # DESIGN: 62.33 GiB of cold DSv4.1-Flash experts buys 88 per layer, 62.34 GiB buys 89.
    per_layer_expert = 40 * (4608 * 5120 + 5120 * 2304) * 17 // 32  # 40 layers, 4.25 bits/value
    assert largest_count_within(parse_bytes("62.33 GiB"), per_layer_expert) == 88
    assert largest_count_within(parse_bytes("62.34 GiB"), per_layer_expert) == 89
    assert largest_count_within(89 * per_layer_expert, per_layer_expert) == 89  # exact fit counts
    assert largest_count_within(-1, per_layer_expert) == 0


def test_formatting() -> None:
    assert format_bytes(221_847_552_000) == "206.61 GiB"
    assert format_bytes(18_800_640, "MiB") == "17.93 MiB"
    assert format_tokens(2_538_200) == "2.54M"
    assert MiB == 2**20
