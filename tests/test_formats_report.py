"""Start-up report line: round trip, log search, refusal of bad lines."""

from __future__ import annotations

import pytest
from expert_residency.formats import (
    FormatError,
    RowMap,
    StartupReport,
    expand_counts,
    find_report_lines,
    format_report_line,
    parse_report_line,
    report_for_rowmap,
    summarize_counts,
)


def test_counts_summary_round_trip() -> None:
    assert summarize_counts([295] * 40) == "295x40"
    assert summarize_counts([3, 3, 2, 3]) == "3x2,2x1,3x1"
    assert expand_counts("3x2,2x1,3x1") == [3, 3, 2, 3]
    assert summarize_counts([]) == "" and expand_counts("") == []


def _report() -> StartupReport:
    rm = RowMap.positional(range(40), 384, 295)
    return report_for_rowmap(rm, rank=1, mode="residency", vllm_version="0.33.0",
                             runtime_version="0.1.0", bytes_per_expert=18_800_640,
                             world_size=2, lane="agent", traffic_class="agent")


def test_report_for_rowmap_figures() -> None:
    r = _report()
    assert r.hot_bytes == 295 * 40 * 18_800_640 and r.cold_bytes == 89 * 40 * 18_800_640
    assert r.hot_counts_list() == [295] * 40 and r.cold_counts == "89x40"


def test_round_trip_with_log_prefix() -> None:
    r = _report()
    line = format_report_line(r)
    assert "\n" not in line and line.startswith("EXPERT_RESIDENCY_REPORT v1 {")
    assert parse_report_line(f"(Worker pid=12) INFO 11-29 10:00:00 [x.py:1] {line}") == r


def test_find_report_lines_in_log() -> None:
    a = _report()
    b = StartupReport(rank=0, mode="count-only", vllm_version="0.33.0", runtime_version="0.1.0")
    log = f"noise\n{format_report_line(a)}\nmore noise\nINFO {format_report_line(b)}\n"
    assert find_report_lines(log) == [a, b]
    assert parse_report_line("an ordinary log line") is None


def test_bad_lines_are_refused() -> None:
    with pytest.raises(FormatError, match="unknown start-up report version v2"):
        parse_report_line('EXPERT_RESIDENCY_REPORT v2 {"rank":0}')
    with pytest.raises(FormatError, match="malformed"):
        parse_report_line("EXPERT_RESIDENCY_REPORT garbage")
    with pytest.raises(FormatError, match="not valid JSON"):
        parse_report_line('EXPERT_RESIDENCY_REPORT v1 {"rank":0,}')
    with pytest.raises(FormatError, match="lacks"):
        parse_report_line('EXPERT_RESIDENCY_REPORT v1 {"rank":0}')
    with pytest.raises(FormatError, match="mode"):
        parse_report_line('EXPERT_RESIDENCY_REPORT v1 {"rank":0,"mode":"fast",'
                          '"vllm_version":"x","runtime_version":"y"}')
    with pytest.raises(FormatError, match="needs both hashes"):
        format_report_line(StartupReport(rank=0, mode="residency", vllm_version="x",
                                         runtime_version="y"))


def test_unknown_keys_go_to_extra() -> None:
    r = parse_report_line('EXPERT_RESIDENCY_REPORT v1 {"rank":0,"mode":"off",'
                          '"vllm_version":"x","runtime_version":"y","gpu":"H200"}')
    assert r is not None and r.extra == {"gpu": "H200"}


def test_numpy_integers_serialise() -> None:
    import numpy as np
    r = StartupReport(rank=np.int64(0), mode="off", vllm_version="0.33.0",
                      runtime_version="0.1.0", hot_bytes=np.int64(5), world_size=np.int32(2))
    back = parse_report_line(format_report_line(r))
    assert back is not None and back.hot_bytes == 5 and back.world_size == 2
