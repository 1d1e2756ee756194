"""`recipegen verify`: what the running lane reports against what the ledger predicts.

Pure comparison of plain values; gathering (container logs, /metrics, the ledger) is done by
the caller. Bank bytes and per-layer counts come from the runtime's start-up report lines
(one per worker; bytes are summed over ranks), KV capacity from vLLM itself.

Tolerances (stated in every output): bank bytes must agree within 0.5% (the field reports: measured
206.61 / 62.33 GiB against predicted 206.6 / 62.4 — within 0.2%); KV tokens within 2% (vLLM
rounds the pool to whole blocks and the ledger's reserve is back-solved); hashes and per-layer
counts must match exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from expert_residency.formats import StartupReport

from recipegen.common.units import GiB as GIB

BYTES_TOLERANCE = 0.005
KV_TOLERANCE = 0.02


@dataclass(frozen=True)
class Expected:
    """The ledger's figures for one lane under its active class."""

    hot_bytes: int
    cold_bytes: int
    kv_tokens: int | None
    hot_counts: list[int]
    cold_counts: list[int]
    content_hash: str
    shape_hash: str
    traffic_class: str
    workspace_bytes: int | None = None
    """Per GPU: the runtime's split-layer kernel workspace (`ledger.workspace`); None: not predicted."""
    counter_bytes: int | None = None
    """Per GPU: the runtime's usage counter and step masks (`ledger.workspace`)."""


@dataclass(frozen=True)
class Row:
    figure: str
    expected: str
    observed: str
    ok: bool
    note: str = ""


def latest_per_rank(reports: Sequence[StartupReport]) -> list[StartupReport]:
    """The last report of each worker rank (a log may hold earlier boots' lines)."""
    by_rank: dict[int, StartupReport] = {}
    for r in reports:
        by_rank[r.rank] = r
    return [by_rank[k] for k in sorted(by_rank)]


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _rel(observed: float, expected: float) -> float:
    if expected == 0:
        return 0.0 if observed == 0 else float("inf")
    return abs(observed - expected) / abs(expected)


def compare(expected: Expected, reports: Sequence[StartupReport], kv_tokens: int | None, *,
            kv_source: str = "", bytes_tolerance: float = BYTES_TOLERANCE,
            kv_tolerance: float = KV_TOLERANCE) -> list[Row]:
    rows: list[Row] = []
    workers = latest_per_rank(reports)
    if not workers:
        return [Row("start-up report", "one line per worker", "none found", False,
                    "the runtime did not report (not mounted, not activated, or still loading)")]
    modes = sorted({w.mode for w in workers})
    rows.append(Row("runtime mode", "residency", ", ".join(modes), modes == ["residency"]))
    world = workers[0].world_size or 1
    rows.append(Row("workers reporting", str(world), str(len(workers)), len(workers) == world))
    for name, want in (("content_hash", expected.content_hash), ("shape_hash", expected.shape_hash)):
        seen = sorted({str(getattr(w, name)) for w in workers})
        rows.append(Row(name, want[:16], ", ".join(s[:16] for s in seen), seen == [want]))
    for name, want, get in (("hot experts per layer", expected.hot_counts, StartupReport.hot_counts_list),
                            ("cold experts per layer", expected.cold_counts, StartupReport.cold_counts_list)):
        seen_lists = [get(w) for w in workers]
        ok = all(s == want for s in seen_lists)
        note = "" if ok else _first_layer_diff(want, seen_lists[0])
        rows.append(Row(name, _summary(want), _summary(seen_lists[0]), ok, note))
    for name, want, got in (("HBM expert bytes (hot bank)", expected.hot_bytes, sum(w.hot_bytes for w in workers)),
                            ("pinned host bytes (cold bank)", expected.cold_bytes, sum(w.cold_bytes for w in workers))):
        rel = _rel(got, want)
        rows.append(Row(name, _gib(want), _gib(got), rel <= bytes_tolerance,
                        f"off by {rel:.2%} (tolerance {bytes_tolerance:.1%})"))
    rows.extend(_workspace_rows(expected, workers))
    if expected.kv_tokens is None:
        rows.append(Row("KV cache tokens", "not predicted", f"{kv_tokens:,}" if kv_tokens else "unknown",
                        True, "the ledger has no KV figure for this lane"))
    elif kv_tokens is None:
        rows.append(Row("KV cache tokens", f"{expected.kv_tokens:,}", "unknown", False,
                        "neither /metrics nor the log gave vLLM's KV capacity"))
    else:
        rel = _rel(kv_tokens, expected.kv_tokens)
        rows.append(Row("KV cache tokens", f"{expected.kv_tokens:,}", f"{kv_tokens:,}",
                        rel <= kv_tolerance,
                        f"off by {rel:.2%} (tolerance {kv_tolerance:.1%}); {kv_source}".rstrip("; ")))
    return rows


def _workspace_rows(expected: Expected, workers: Sequence[StartupReport]) -> list[Row]:
    """The runtime's start-up HBM besides the banks, per worker (each GPU allocates its own),
    exactly: the ledger took these bytes from the KV pool."""
    rows: list[Row] = []
    for key, label, want in (("workspace_bytes", "runtime kernel workspace / GPU", expected.workspace_bytes),
                             ("counter_bytes", "runtime counter + step masks / GPU", expected.counter_bytes)):
        if want is None:
            continue
        seen = sorted({w.extra.get(key) for w in workers}, key=str)
        if seen == [None]:
            rows.append(Row(label, f"{want:,} B", "not reported", True,
                            "this runtime's start-up report has no such field"))
            continue
        rows.append(Row(label, f"{want:,} B", ", ".join(f"{v:,} B" if isinstance(v, int) else str(v) for v in seen),
                        seen == [want], "exact: the ledger takes these bytes from the KV pool"))
    return rows


def _summary(counts: list[int]) -> str:
    if not counts:
        return "none"
    distinct = sorted(set(counts))
    if len(distinct) == 1:
        return f"{distinct[0]} × {len(counts)} layers"
    return f"{min(counts)}..{max(counts)} over {len(counts)} layers"


def _first_layer_diff(want: list[int], got: list[int]) -> str:
    if len(want) != len(got):
        return f"{len(got)} layers reported, {len(want)} expected"
    for i, (a, b) in enumerate(zip(want, got)):
        if a != b:
            return f"first difference at MoE layer row {i}: expected {a}, reported {b}"
    return ""
