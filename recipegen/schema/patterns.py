"""Every text pattern a recipe field is checked against, each with the hint a refusal gives.

One owner for both: a field names its pattern here (`Field(pattern=SECONDS.regex)`), the loader's
refusal of a value that does not match prints that pattern's `hint`
(`recipegen.load.document.describe_error`), and the field reference prints it beside the type
(`recipegen.schema.export`). A pattern without a hint here is a test failure
(tests/test_schema_field_hints.py), so no refusal falls back to advice written for another field.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TextPattern:
    """A regular expression a field's text must match, and what matching text looks like."""

    regex: str
    """The pattern, anchored (`^…$`), as pydantic applies it (`re.search`)."""
    hint: str
    """What a value that matches looks like, in the words of the field's own format, with an
    example: a refusal says "is not allowed: use <hint>", the reference's type cell
    "string (<hint>)"."""


SERVICE_NAME = TextPattern(
    r"^[a-z0-9][a-z0-9-]*$",
    "lowercase letters, digits and '-', starting with a letter or digit, e.g. agent or station-a")
"""Lane, class, profile and machine-key names: they become compose service, profile and folder
names and DNS host names, where '.' and '_' do not belong."""

FILE_NAME = TextPattern(
    r"^[a-z0-9][a-z0-9._-]*$",
    "lowercase letters, digits, '.', '_' and '-', starting with a letter or digit, "
    "e.g. dsv41-flash-gb300")
"""Recipe, model and machine names: file and folder names."""

ENV_KEY = TextPattern(
    r"^[A-Za-z_][A-Za-z0-9_]*$",
    "an environment variable name: letters, digits and '_', not starting with a digit, "
    "e.g. VLLM_LOGGING_LEVEL")
"""A container environment variable's name, as Compose and a shell read one."""

IMAGE = TextPattern(
    r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$",
    "a container image reference: letters, digits and '.', '_', '/', ':', '@', '+', '-', "
    "starting with a letter or digit (no spaces, no ${…} interpolation), e.g. vllm/vllm-openai:v0.33.0")
"""A container image reference; nothing that could start YAML structure or a Compose
interpolation."""

COMPUTE_CAPABILITY = TextPattern(
    r"^\d+\.\d+$",
    "the major and minor version as digits joined by '.', e.g. 9.0 or 10.3")
"""A CUDA compute capability."""

# Prometheus drops an instant series from a query 5 minutes after its last sample (the query
# lookback, `--query.lookback-delta`, default 5m): scrapes further apart than that leave `up` and
# the cold-share gauges absent between samples, and an alert fires or not by the scrape's phase.
# The `Monitoring.scrape_interval` validator refuses more; the pattern admits up to 9999.
PROMETHEUS_LOOKBACK_S = 300
MAX_SCRAPE_INTERVAL_S = PROMETHEUS_LOOKBACK_S

SECONDS = TextPattern(
    r"^[1-9][0-9]{0,3}s$",
    f"whole seconds with the unit s, 1 to {MAX_SCRAPE_INTERVAL_S}, e.g. 15s")
"""A Prometheus duration in whole seconds."""

MINUTES = TextPattern(
    r"^[1-9][0-9]{0,2}m$",
    "whole minutes with the unit m, 1 to 999, e.g. 5m")
"""A Prometheus duration in whole minutes."""

RETENTION = TextPattern(
    r"^[1-9][0-9]{0,3}[hdw]$",
    "a whole number from 1 to 9999 with the unit h, d or w, e.g. 15d")
"""Prometheus' retention time, in hours, days or weeks."""

IPV4 = TextPattern(
    r"^(?:(?:25[0-5]|2[0-4][0-9]|1?[0-9]{1,2})\.){3}(?:25[0-5]|2[0-4][0-9]|1?[0-9]{1,2})$",
    "an IPv4 address such as 127.0.0.1 (this machine only) or 0.0.0.0 (every network); "
    "no IPv6 address or host name")
"""An IPv4 address in dotted-decimal form."""

PATTERNS: tuple[TextPattern, ...] = (SERVICE_NAME, FILE_NAME, ENV_KEY, IMAGE, COMPUTE_CAPABILITY,
                                     SECONDS, MINUTES, RETENTION, IPV4)

_HINTS = {pattern.regex: pattern.hint for pattern in PATTERNS}
assert len(_HINTS) == len(PATTERNS), "two TextPatterns share a regex: give each regex one hint"


def pattern_hint(regex: str | None) -> str | None:
    """The hint of the field pattern `regex`, or None for a pattern not declared here."""
    return _HINTS.get(regex) if regex is not None else None
