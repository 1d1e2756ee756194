"""The pure parts of start-up progress: what a log line means (`ops.startup_log`), how times are
written and the heartbeat setting (`ops.startup`). The engine-side behaviour is tested on a real
Docker engine in tests/test_ops_progress_engine.py; the literals against vLLM 0.33's source in
tests/test_startup_log_contract.py."""

from __future__ import annotations

import pytest
from expert_residency.formats import StartupReport, format_report_line
from expert_residency.vllm_plugin.refusal import refusal_line

from recipegen.common.errors import InputError
from recipegen.ops.startup import duration, heartbeat_interval
from recipegen.ops.startup_log import PHASES, classify, clean, describe_report, progress_percent

PREFIX = "(EngineCore_DP0 pid=61) INFO 12-01 10:00:00 [x.py:1] "


def test_phases_are_listed_in_the_order_vllm_goes_through_them():
    keys = [m.key for m in PHASES]
    assert keys == ["load", "weights", "report", "loaded", "kv", "graphs", "graphs_done", "engine", "api"]
    assert [classify(PREFIX + m.literal).order for m in PHASES] == list(range(len(PHASES)))


def test_re_homing_only_for_a_residency_lane():
    line = PREFIX + "Loading weights took 12.50 seconds"
    assert classify(line, residency=True).phase == "re-homing experts into the hot and cold banks"
    assert classify(line, residency=False).phase == "finishing the model load"
    assert classify(line).detail == "weights read in 12.5 s"


def test_a_cuda_error_is_fatal_only_as_a_raised_exception():
    assert classify("RuntimeError: CUDA error: an illegal memory access was encountered").fatal \
        == "a CUDA error"
    assert classify("torch.AcceleratorError: CUDA error: out of memory").fatal == "a CUDA error"
    # prose that mentions one (a warning, a help text) does not stop a start
    assert classify("WARNING [x.py:3] retrying after CUDA error: busy").fatal == ""
    assert classify("INFO CUDA error: handling is verbose").fatal == ""


def test_the_specific_cause_outranks_the_generic_one():
    generic = classify(PREFIX + "EngineCore failed to start.")
    oom = classify("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    refused = classify(refusal_line("row map x has content_hash 00…"))
    assert generic.fatal == "vLLM's engine failed to start" and oom.fatal == "out of GPU memory"
    assert refused.fatal == "the expert residency runtime refused to start"
    assert generic.rank < oom.rank <= refused.rank
    # one line carrying both: the specific one wins
    both = classify("EngineCore failed to start. (original error: CUDA out of memory. Tried …)")
    assert both.fatal == "out of GPU memory"


def test_the_runtimes_report_in_plain_words():
    report = StartupReport(rank=1, mode="residency", vllm_version="0.33.0", runtime_version="0.1.0",
                           hot_bytes=3 * 2**30 + 2**29, cold_bytes=2**30, hot_counts="6x2",
                           cold_counts="2x2", content_hash="ab" * 32, shape_hash="cd" * 32,
                           world_size=2)
    words = classify("2026-12-01 " + format_report_line(report)).detail
    assert words == ("the runtime's start-up report: rank 1 of 2, mode residency, hot bank "
                     "3.50 GiB in GPU memory, cold bank 1.00 GiB in pinned host memory, row map "
                     "content hash abababababab")
    assert describe_report("EXPERT_RESIDENCY_REPORT v1 {not json").startswith(
        "the runtime's start-up report is unreadable")


def test_lines_are_cleaned_before_they_reach_a_terminal():
    out = clean("\x1b[1;32mINFO\x1b[0m loading\x07 weights\x1b]0;title\x07\r")
    assert out.startswith("INFO loading weights") and not any(c in out for c in "\x1b\x07\r")
    assert len(clean("x" * 1000)) == 400


def test_progress_bars():
    assert progress_percent("Capturing CUDA graphs (decode, FULL):  45%|####5 | 30/67") == 45
    assert progress_percent("Loading safetensors checkpoint shards:  50% Completed | 23/46") == 50
    assert progress_percent("GPU KV cache size: 100% of what was asked") is None


def test_durations_are_written_out():
    assert [duration(s) for s in (0, 7.9, 60, 245, 3600, 7385)] == \
        ["0 s", "7 s", "1 min 00 s", "4 min 05 s", "1 h 00 min", "2 h 03 min"]


def test_heartbeat_setting():
    assert heartbeat_interval({}) == 30.0
    assert heartbeat_interval({"RECIPEGEN_HEARTBEAT_S": "2.5"}) == 2.5
    for bad in ("0", "-1", "soon", "7200"):
        with pytest.raises(InputError, match="RECIPEGEN_HEARTBEAT_S"):
            heartbeat_interval({"RECIPEGEN_HEARTBEAT_S": bad})


def test_log_stream_entries_keep_their_engine_time():
    from recipegen.ops.startup import _entries

    chunk = b"2026-12-03T08:26:23.504548123Z Capturing 50%|x\r 60%|y\n"
    assert _entries(chunk) == [((1796286383, 504548123), "Capturing 50%|x\r 60%|y\n")]
    # a timestamp inside the text is text; text before the first one is a split entry's end
    split = b"end of an entry\n2026-12-03T08:26:23.5Z saw 2026-12-03T08:26:23.5Z here\n"
    assert _entries(split) == [(None, "end of an entry\n"),
                               ((1796286383, 500000000), "saw 2026-12-03T08:26:23.5Z here\n")]
