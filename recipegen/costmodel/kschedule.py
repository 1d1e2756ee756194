"""Checks of a speculative-decoding k schedule against a lane (pure).

vLLM 0.33 takes a batch-size schedule as `speculative_config.num_speculative_tokens_per_batch_size`:
inclusive `(range_start, range_end, k)` entries, the first starting at 1, sorted and
non-overlapping; gaps and the tail carry the previous k forward and every k is clamped to
`num_speculative_tokens` (vllm/v1/spec_decode/dynamic/utils.py). On the V1 model runner a
schedule also forces `cudagraph_mode` from FULL to PIECEWISE (vllm/config/vllm.py,
`_maybe_override_dynamic_sd_cudagraph_mode`), and users report throughput collapsing when
concurrency crosses a boundary (vllm-project/vllm#49548). So: a schedule must cover
1..max_num_seqs, k must not grow with batch size, k must stay within the method's limit, a
boundary inside the lane's expected concurrency range is a warning, and a constant k is the
recommendation unless a schedule is justified.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

Level = Literal["error", "warning", "note"]
ScheduleEntry = tuple[int, int, int]


@dataclass(frozen=True)
class Finding:
    level: Level
    message: str
    field: str = "k_schedule"


@dataclass(frozen=True)
class KScheduleCheck:
    """Result of checking one lane's k (constant or schedule)."""

    dense: list[int]                 # dense[batch_size] = effective k (index 0 unused)
    boundaries: list[int]            # batch sizes b where k(b) != k(b-1)
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(f.level == "error" for f in self.findings)

    def k_at(self, batch_size: int) -> int:
        return self.dense[min(max(batch_size, 1), len(self.dense) - 1)]


def check_k_schedule(schedule: int | Sequence[Sequence[int]], *, max_num_seqs: int,
                     method_max_k: int | None = None, num_speculative_tokens: int | None = None,
                     expected_concurrency: tuple[int, int] | None = None) -> KScheduleCheck:
    """Check a constant k or a batch-size schedule; never raises on a bad schedule, reports it.

    `num_speculative_tokens` is vLLM's startup maximum (defaults to the schedule's largest k);
    `method_max_k` the drafter's limit (e.g. DSpark's trained block size); `expected_concurrency`
    the (low, high) number of concurrent requests the lane is expected to serve.
    """
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    findings: list[Finding] = []
    if isinstance(schedule, int):
        entries: list[ScheduleEntry] = [(1, max_num_seqs, schedule)]
        constant = True
    else:
        entries, constant = [], False
        for i, raw in enumerate(schedule):
            if len(raw) != 3:
                findings.append(Finding("error", f"entry {i} must be [range_start, range_end, k], got {list(raw)}",
                                        f"k_schedule[{i}]"))
                continue
            start, end, k = (int(x) for x in raw)
            if start < 1 or end < start or k < 0:
                findings.append(Finding("error", f"entry {i} ({start}-{end}: k={k}) needs 1 <= start <= end "
                                        "and k >= 0", f"k_schedule[{i}]"))
                continue
            entries.append((start, end, k))
        if not entries:
            findings.append(Finding("error", "the k schedule has no valid entry"))
            return KScheduleCheck(dense=[0] * (max_num_seqs + 1), boundaries=[], findings=findings)
        if entries != sorted(entries):
            findings.append(Finding("warning", "entries are not sorted by batch size; vLLM sorts them"))
        entries.sort()
        for (s0, e0, _), (s1, e1, _) in zip(entries, entries[1:]):
            if s1 <= e0:
                findings.append(Finding("error", f"ranges {s0}-{e0} and {s1}-{e1} overlap"))
        if entries[0][0] != 1:
            findings.append(Finding("error", f"the first range starts at {entries[0][0]}; vLLM requires 1 so "
                                    "every batch size has a k"))
        for (_, e0, k0), (s1, _, _) in zip(entries, entries[1:]):
            if s1 > e0 + 1:
                findings.append(Finding("note", f"batch sizes {e0 + 1}-{s1 - 1} fall in a gap and inherit k={k0}"))
        if entries[-1][1] < max_num_seqs:
            findings.append(Finding("note", f"batch sizes {entries[-1][1] + 1}-{max_num_seqs} lie past the last "
                                    f"range and inherit k={entries[-1][2]}"))
        unreachable = [e for e in entries if e[0] > max_num_seqs]
        if unreachable:
            findings.append(Finding("warning", "ranges starting above max_num_seqs="
                                    f"{max_num_seqs} never apply: "
                                    + ", ".join(f"{s}-{e}" for s, e, _ in unreachable)))

    max_k = max(k for _, _, k in entries)
    limit = num_speculative_tokens if num_speculative_tokens is not None else max_k
    if method_max_k is not None and max_k > method_max_k:
        findings.append(Finding("error", f"k={max_k} exceeds the speculative method's limit of {method_max_k}"))
    if num_speculative_tokens is not None and max_k > num_speculative_tokens:
        findings.append(Finding("warning", f"k={max_k} exceeds num_speculative_tokens={num_speculative_tokens}; "
                                "vLLM clamps it"))

    dense = _expand(entries, max_num_seqs, limit)
    for b in range(2, max_num_seqs + 1):
        if dense[b] > dense[b - 1]:
            findings.append(Finding("error", f"k rises from {dense[b - 1]} to {dense[b]} at batch size {b}; "
                                    "k must not increase with batch size (more streams already touch more "
                                    "experts per step)"))
            break
    boundaries = [b for b in range(2, max_num_seqs + 1) if dense[b] != dense[b - 1]]

    if not constant and boundaries:
        findings.append(Finding("warning", "a batch-size k schedule makes vLLM's V1 runner fall back from "
                                "full to piecewise CUDA graphs; prefer a constant k per lane unless the "
                                "schedule is justified by a measurement"))
        if expected_concurrency is not None:
            low, high = expected_concurrency
            inside = [b for b in boundaries if low < b <= high]
            if inside:
                findings.append(Finding("warning", "schedule boundar" + ("ies" if len(inside) > 1 else "y")
                                        + f" at batch size {', '.join(map(str, inside))} "
                                        f"fall{'' if len(inside) > 1 else 's'} inside the lane's expected "
                                        f"concurrency {low}-{high}: throughput can collapse when concurrency "
                                        "crosses a boundary (vllm-project/vllm#49548); use a constant k="
                                        f"{dense[max(low, 1)]} for this lane"))
    return KScheduleCheck(dense=dense, boundaries=boundaries, findings=findings)


def _expand(entries: list[ScheduleEntry], max_num_seqs: int, limit: int) -> list[int]:
    """Dense batch size -> k lookup with vLLM's semantics (carry forward through gaps and tail, clamp)."""
    dense = [0] * (max_num_seqs + 1)
    for b in range(1, max_num_seqs + 1):
        k: int | None = None
        for start, end, entry_k in entries:
            if start <= b <= end:
                k = entry_k
                break
            if end < b:
                k = entry_k
        if k is None:
            k = entries[0][2]
        dense[b] = min(limit, k)
    return dense
