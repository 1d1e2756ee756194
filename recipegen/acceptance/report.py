"""Text and JSON forms of parity and knee results (no I/O)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from recipegen.acceptance.knee import KneeResult, compare_levels
from recipegen.acceptance.parity import ParityReport


def identity_lines(label: str, info: dict[str, Any]) -> list[str]:
    models = ", ".join(str(m.get("id")) for m in info.get("models", [])) or info.get("models_error", "?")
    lines = [f"{label}: {info.get('url')}  model {models}"
             + (f"  {_server(info)}" if info.get("server_version") or info.get("server") else "")
             + (f"  (recorded in {info['recording']})" if info.get("recording") else "")]
    if info.get("lane_reports"):
        lane = info.get("lane") or "?"
        cls = info.get("traffic_class") or "?"
        lines.append(f"    lane {lane} class {cls} mode {'/'.join(info.get('residency_mode', []))}  "
                     f"content {_short(info.get('content_hashes'))} shape {_short(info.get('shape_hashes'))}  "
                     f"[{info.get('lane_report_source')}]")
    elif info.get("lane_report_error"):
        lines.append(f"    start-up report: {info['lane_report_error']} [{info.get('lane_report_source')}]")
    else:
        lines.append("    start-up report: none found (not a local recipegen lane; pass --lane-log to name one)")
    return lines


def _server(info: dict[str, Any]) -> str:
    """What the server said it is: "vLLM 0.33.0" only when its model cards say vLLM owns them,
    else the bare /version string ("server version X")."""
    version = info.get("server_version")
    if info.get("server"):
        return f"{info['server']} {version}" if version else str(info["server"])
    return f"server version {version}"


def identity_user_text(info: dict[str, Any]) -> list[str]:
    """The values of `identity_lines` that are not recipegen's words: the endpoint's URL, what its
    server said (model names, version), the recording and log it was read from, the lane and class
    its start-up report named. The glossary leaves them out (recipegen.cli.output)."""
    values = [info.get("url"), info.get("recording"), info.get("server_version"), info.get("lane"),
              info.get("traffic_class"), info.get("lane_report_source")]
    values += [m.get(k) for m in info.get("models", []) if isinstance(m, dict) for k in ("id", "root")]
    return [str(v) for v in values if v]


def _short(hashes: Any) -> str:
    if not hashes:
        return "-"
    return ",".join(h[:12] for h in hashes)


def parity_text(report: ParityReport, identities: dict[str, dict[str, Any]], *, fixture_name: str,
                settings: dict[str, Any] | None = None) -> str:
    lines = []
    for label in ("A", "B"):
        if label in identities:
            lines += identity_lines(label, identities[label])
    n = len(report.verdicts)
    lines.append(f"fixture {fixture_name}: {n} prompts, {report.runs_a} run(s) of A, {report.runs_b} run(s) of B")
    if settings:
        s = settings
        lines.append(f"each request: temperature {s.get('temperature', 0.0):g} (greedy), seed {s.get('seed')}, "
                     f"--max-tokens {s.get('max_tokens')}; --concurrency {s.get('concurrency')}")
    lines.append("")
    lines.append(f"{'prompt':<16} {'category':<12} {'verdict':<17} detail")
    for v in report.verdicts:
        detail = v.reason   # judge_prompt says why: where A left B, and A's own jitter point
        lines.append(f"{v.prompt_id:<16} {v.category:<12} {v.status:<17} {detail}")
    lines.append("")
    lines.append("pairwise exact: " + "  ".join(f"{pair} {e}/{t}" for pair, (e, t) in report.pair_counts.items()))
    lines.append(f"exact {report.count('exact')}/{n}, nondeterministic {report.count('nondeterministic')}/{n}, "
                 f"diverges {report.count('diverges')}/{n}")
    if report.runs_a < 2:
        lines.append("note: one run of A cannot tell serving nondeterminism from a placement effect; "
                     "every divergence counts (use --runs 2 or more)")
    lines.append("PASS: every difference of A from B starts at or after A's own run-to-run disagreement, "
                 "or B reproduces it" if report.passed
                 else "FAIL: A departs from B before A's own runs disagree, and no run of B reproduces it")
    return "\n".join(lines)


def parity_user_text(report: ParityReport, identities: dict[str, dict[str, Any]], *, fixture_name: str
                     ) -> list[str]:
    """What `parity_text` prints that is not recipegen's words: the endpoints' identities, the
    fixture's name, prompt ids and categories, and the model's own text quoted where outputs part."""
    values = [fixture_name]
    for info in identities.values():
        values += identity_user_text(info)
    for v in report.verdicts:
        values += [v.prompt_id, v.category]
        for d in (v.divergence, v.self_divergence):
            if d is not None:
                values += [repr(d.common), repr(d.left), repr(d.right)]
    return values


def parity_json(report: ParityReport, identities: dict[str, dict[str, Any]], settings: dict[str, Any]
                ) -> dict[str, Any]:
    return {"passed": report.passed, "settings": settings, "endpoints": identities,
            "summary": {s: report.count(s) for s in ("exact", "nondeterministic", "diverges")},
            "pairwise_exact": {k: {"exact": e, "total": t} for k, (e, t) in report.pair_counts.items()},
            "prompts": [asdict(v) for v in report.verdicts]}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.0f}"


def knee_user_text(result: KneeResult) -> list[str]:
    """What `knee_text` prints that is not recipegen's words: the endpoints' identities."""
    return [v for info in result.endpoints.values() for v in identity_user_text(info)]


def knee_text(result: KneeResult) -> str:
    lines = []
    for label, info in result.endpoints.items():
        lines += identity_lines(label, info)
    s = result.settings
    lines.append(f"warm-up {s.get('warmup_s')} s excluded; {s.get('repetitions')} window(s) of {s.get('duration_s')} s; "
                 f"max_tokens {s.get('max_tokens')}")
    lines.append("")
    lines.append(f"{'leg':<4} {'conc':>4} {'tok/s mean':>10} {'min':>8} {'max':>8} {'spread':>7} "
                 f"{'p50 lat ms':>10} {'p90 lat ms':>10} {'ttft ms':>8} {'tok/s/req':>9} {'req':>5}")
    for level in result.levels:
        t = level.tok_s
        p90 = max((w.latency_p90_s for w in level.windows if w.latency_p90_s is not None), default=None)
        ttft = [w.ttft_p50_s for w in level.windows if w.ttft_p50_s is not None]
        requests = sum(w.requests for w in level.windows)
        rate = level.decode_rate
        lines.append(f"{level.label:<4} {level.concurrency:>4} {t.mean:>10.1f} {t.min:>8.1f} {t.max:>8.1f} "
                     f"{t.relative:>7.1%} {_ms(level.latency_p50):>10} {_ms(p90):>10} "
                     f"{_ms(sorted(ttft)[len(ttft) // 2] if ttft else None):>8} "
                     f"{'-' if rate is None else f'{rate:.1f}':>9} {requests:>5}")
    labels = {level.label for level in result.levels}
    lines.append("")
    lines.append("leg A: the candidate (URL)" + ("; B: the control (--compare); A2: the candidate again, after B "
                                                 "(A B A)" if "B" in labels else ""))
    lines.append("conc: concurrent request streams; tok/s: output tokens per second of a window (mean, min, max "
                 "over the windows); spread: (max - min) / mean of the windows' tok/s")
    lines.append("p50 lat ms: median of the windows' median request latency; p90 lat ms: the highest window's "
                 "90th percentile; ttft ms: median of the windows' median time to first token; req: requests that started after the "
                 "warm-up and finished inside a window, all windows together")
    lines.append("tok/s/req: the per-request decode rate, each request's output tokens ÷ its latency (time to "
                 "first token included), averaged over the requests counted in req")
    comparisons = compare_levels(result)
    if comparisons:
        lines.append("")
        lines.append("candidate (A, A2) vs control (B):")
        for c in comparisons:
            noise = max(c.candidate.relative, c.control.relative)
            verdict = "; within the spread, not a measured difference" if abs(c.change) <= noise else ""
            lines.append(f"  C{c.concurrency}: {c.candidate.mean:.1f} (spread {c.candidate.relative:.1%}) vs "
                         f"{c.control.mean:.1f} (spread {c.control.relative:.1%}) tok/s: {c.change:+.1%}{verdict}; "
                         f"candidate drift between A and A2 {c.candidate_drift:.1%}")
    return "\n".join(lines)


def knee_json(result: KneeResult) -> dict[str, Any]:
    levels = []
    for level in result.levels:
        item = asdict(level)
        item["tok_s"] = asdict(level.tok_s)
        item["tok_s"]["relative_spread"] = level.tok_s.relative
        levels.append(item)
    return {"settings": result.settings, "endpoints": result.endpoints, "levels": levels,
            "comparisons": [{**asdict(c), "change": c.change} for c in compare_levels(result)]}
