"""Every text pattern a recipe field is checked against, each with the hint a refusal gives.

One owner for both: a field names its pattern here (`Field(pattern=SECONDS.regex)`), the loader's
refusal of a value that does not match prints that pattern's `hint`
(`recipegen.load.document.describe_error`), and the field reference prints it beside the type
(`recipegen.schema.export`). A pattern without a hint here is a test failure
(tests/test_schema_field_hints.py), so no refusal falls back to advice written for another field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Names of recipes, machines, lanes and classes become folder and file names (a dump file holds
# a lane's and a class's name), Compose service names and Kubernetes labels (at most 63
# characters): longer ones are refused at their line.
NAME_MAX_LENGTH = 63


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

# A model checkpoint (`model.checkpoint`) is one of the two things the rendering can mount
# (`recipegen.render.services._model_source`): a Hugging Face repo id, served from the host's hub
# cache, or an absolute path on the machine that runs the lane; `_model_source` tells them apart
# with `is_hf_repo_id` below. A repo id follows the Hub's rule, with the namespace required
# (huggingface_hub `validate_repo_id`, whose `REPO_ID_REGEX` makes the namespace optional): each
# part 1 to 96 ASCII letters, digits, '_', '-' and '.', starting and ending with a letter, digit or
# '_'; no '--' or '..'; not ending in '.git'. The namespace is required: one word (`gpt2`, `models`)
# reads as a relative folder just as well, and the Hub serves its old single-word ids under a
# namespace (`gpt2` is `openai-community/gpt2`); `recipegen new/fit MODEL` reads ids by the same
# rule (`recipegen.fit.hub.parse_hub_id`). So `./x` and `../x` are relative paths, not ids, and are
# refused; so is anything else that is neither (a relative path, `~/…`), which Compose would resolve
# against the rendered compose folder or the invoking user's home, and nothing in Kubernetes.
HF_PART_MAX = 96
_HF_PART = rf"\w(?:[\w.-]{{0,{HF_PART_MAX - 2}}}\w)?"
HF_REPO_ID = re.compile(rf"{_HF_PART}/{_HF_PART}", re.ASCII)
"""The characters and lengths of a Hugging Face repo id `org/name`, matched whole (`fullmatch`);
`is_hf_repo_id` adds the Hub's rule's remaining refusals ('--', '..', a '.git' ending)."""
_HF_NAME = re.compile(_HF_PART, re.ASCII)

CHECKPOINT_HINT = ("an absolute path on the machine that runs the lane, or a Hugging Face repo id "
                   "'org/name' (e.g. /srv/models/my-model or deepseek-ai/DeepSeek-V3)")
"""What `model.checkpoint` accepts, in the words of its refusal."""

HF_NAMESPACE_NEEDED = ("a Hugging Face repo id needs its namespace: org/name "
                       "(e.g. openai-community/gpt2)")
"""The refusal of a repo id without its namespace (`gpt2`): the Hub's rule allows one, a checkpoint
does not (one word reads as a relative folder too; see above)."""


def _hub_rule_extras(text: str) -> bool:
    return ".." not in text and "--" not in text and not text.endswith(".git")


def is_hf_repo_id(text: str) -> bool:
    """Whether `text` is a Hugging Face repo id `org/name`: the Hub's rule, with the namespace
    required (see `HF_REPO_ID`)."""
    return HF_REPO_ID.fullmatch(text) is not None and _hub_rule_extras(text)


def is_hf_repo_name(text: str) -> bool:
    """Whether `text` is a Hugging Face repo id without its namespace (`gpt2`), which the Hub's rule
    allows and `is_hf_repo_id` does not."""
    return _HF_NAME.fullmatch(text) is not None and _hub_rule_extras(text)


def checkpoint_refusal(text: str) -> str | None:
    """Why `text` cannot be a `model.checkpoint`, or None when it is an absolute path or a repo id."""
    if text.startswith("/") or is_hf_repo_id(text):
        return None
    shown = repr(text) if len(repr(text)) <= 80 else f"{repr(text)[:60]}… ({len(text):,} characters)"
    relative = ("a relative path would resolve against the rendered compose folder "
                "(compose/<recipe>/<machine>/), not against the recipe")
    if is_hf_repo_name(text):
        # `gpt2` is most likely a repo id without its namespace, `models` a folder: say both
        return (f"{shown} is not a checkpoint: {HF_NAMESPACE_NEEDED}; read as a path it is relative, and "
                f"{relative}; use {CHECKPOINT_HINT}")
    message = f"{shown} is not a checkpoint: use {CHECKPOINT_HINT}; {relative}"
    if text.startswith("~"):
        message += ("; and Compose expands '~' to the home of whoever runs docker compose, which a "
                    "Kubernetes hostPath cannot")
    return message


PATTERNS: tuple[TextPattern, ...] = (SERVICE_NAME, FILE_NAME, ENV_KEY, IMAGE, COMPUTE_CAPABILITY,
                                     SECONDS, MINUTES, RETENTION, IPV4)

_HINTS = {pattern.regex: pattern.hint for pattern in PATTERNS}
assert len(_HINTS) == len(PATTERNS), "two TextPatterns share a regex: give each regex one hint"


def pattern_hint(regex: str | None) -> str | None:
    """The hint of the field pattern `regex`, or None for a pattern not declared here."""
    return _HINTS.get(regex) if regex is not None else None
