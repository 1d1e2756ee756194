"""The start-up report: one versioned, machine-parseable log line per worker.

The runtime logs it once its banks are placed; `recipegen verify` finds it in the container
log and checks the hashes and bank bytes against the recipe. Line layout::

    EXPERT_RESIDENCY_REPORT v1 {"content_hash": ..., "rank": 0, ...}

The tag may be preceded by anything a logger adds (time, level, process name); the JSON
object (keys sorted, no newlines) runs to the end of the line.
"""

from __future__ import annotations

import json
import numbers
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import FormatError

REPORT_TAG = "EXPERT_RESIDENCY_REPORT"
REPORT_VERSION = 1
MODES = ("residency", "count-only", "off")

_REPORT_RE = re.compile(REPORT_TAG + r" v(\d+) (\{.*\})\s*$")


def summarize_counts(counts: Sequence[int]) -> str:
    """Run-length form of per-layer counts, exact and short: `[295]*40` -> "295x40",
    `[295, 295, 290]` -> "295x2,290x1"; empty -> ""."""
    parts: list[str] = []
    i = 0
    values = [int(c) for c in counts]
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        parts.append(f"{values[i]}x{j - i + 1}")
        i = j + 1
    return ",".join(parts)


def expand_counts(summary: str) -> list[int]:
    """Inverse of `summarize_counts`; raises ValueError on malformed text."""
    out: list[int] = []
    for part in filter(None, summary.split(",")):
        value, sep, repeat = part.partition("x")
        if not sep:
            raise ValueError(f"bad run {part!r}")
        out.extend([int(value)] * int(repeat))
    return out


@dataclass
class StartupReport:
    """What one worker placed where. Hashes are None when no row map is loaded."""

    rank: int
    mode: str
    vllm_version: str
    runtime_version: str
    hot_bytes: int = 0
    cold_bytes: int = 0
    hot_counts: str = ""          # summarize_counts() of per-layer hot counts
    cold_counts: str = ""
    content_hash: str | None = None
    shape_hash: str | None = None
    world_size: int | None = None
    lane: str | None = None
    traffic_class: str | None = None
    rowmap_path: str | None = None
    version: int = REPORT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # numpy / torch integer scalars would not serialise to JSON: make them plain ints
        for name in ("rank", "hot_bytes", "cold_bytes", "world_size", "version"):
            value = getattr(self, name)
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                setattr(self, name, int(value))

    def hot_counts_list(self) -> list[int]:
        return expand_counts(self.hot_counts)

    def cold_counts_list(self) -> list[int]:
        return expand_counts(self.cold_counts)

    def validate(self) -> None:
        if self.mode not in MODES:
            raise FormatError(f"mode {self.mode!r} is not one of {', '.join(MODES)}",
                              field="mode")
        if self.rank < 0:
            raise FormatError("rank must be non-negative", field="rank")
        if self.hot_bytes < 0 or self.cold_bytes < 0:
            raise FormatError("bank bytes must be non-negative", field="hot_bytes")
        for name in ("hot_counts", "cold_counts"):
            try:
                expand_counts(getattr(self, name))
            except ValueError as exc:
                raise FormatError(str(exc), field=name) from None
        if self.mode == "residency" and (not self.content_hash or not self.shape_hash):
            raise FormatError("residency mode needs both hashes", field="content_hash")


def format_report_line(report: StartupReport) -> str:
    """The single line (no newline) the runtime logs."""
    report.validate()
    payload = asdict(report)
    payload.pop("version")
    return f"{REPORT_TAG} v{report.version} " + json.dumps(payload, sort_keys=True,
                                                           separators=(",", ":"))


_FIELDS = {f for f in StartupReport.__dataclass_fields__ if f != "version"}
_REQUIRED = ("rank", "mode", "vllm_version", "runtime_version")


def parse_report_line(line: str) -> StartupReport | None:
    """The report in `line`, None if the line carries no report tag.

    Raises FormatError for a tagged line that is malformed or of an unknown version.
    """
    if REPORT_TAG not in line:
        return None
    m = _REPORT_RE.search(line.rstrip("\r\n"))
    if not m:
        raise FormatError(f"malformed {REPORT_TAG} line: {line.strip()[:120]!r}")
    version = int(m.group(1))
    if version != REPORT_VERSION:
        raise FormatError(f"unknown start-up report version v{version} (this parser reads "
                          f"v{REPORT_VERSION})", field="version")
    try:
        payload = json.loads(m.group(2))
    except json.JSONDecodeError as exc:
        raise FormatError(f"start-up report is not valid JSON ({exc.msg})") from None
    if not isinstance(payload, dict):
        raise FormatError("start-up report payload is not an object")
    missing = [k for k in _REQUIRED if k not in payload]
    if missing:
        raise FormatError(f"start-up report lacks {', '.join(missing)}", field=missing[0])
    # Unknown keys from a newer runtime of the same version go to `extra`, not an error.
    known = {k: v for k, v in payload.items() if k in _FIELDS}
    extra = dict(known.pop("extra", {}) or {})
    extra.update({k: v for k, v in payload.items() if k not in _FIELDS})
    try:
        report = StartupReport(**known, extra=extra)
    except TypeError as exc:
        raise FormatError(f"start-up report fields: {exc}") from None
    report.validate()
    return report


def find_report_lines(log_text: str) -> list[StartupReport]:
    """Every start-up report in a log, in order (one per worker per boot)."""
    reports = []
    for line in log_text.splitlines():
        report = parse_report_line(line)
        if report is not None:
            reports.append(report)
    return reports


def report_for_rowmap(rowmap: Any, *, rank: int, mode: str, vllm_version: str,
                      runtime_version: str, bytes_per_expert: int, **kwargs: Any
                      ) -> StartupReport:
    """Convenience for the runtime: a residency report whose counts and hashes come from
    the loaded row map, with bank bytes = experts placed × bytes per expert."""
    hot, cold = rowmap.hot_counts(), rowmap.cold_counts()
    return StartupReport(rank=rank, mode=mode, vllm_version=vllm_version,
                         runtime_version=runtime_version,
                         hot_bytes=sum(hot) * bytes_per_expert,
                         cold_bytes=sum(cold) * bytes_per_expert,
                         hot_counts=summarize_counts(hot), cold_counts=summarize_counts(cold),
                         content_hash=rowmap.content_hash(), shape_hash=rowmap.shape_hash(),
                         **kwargs)
