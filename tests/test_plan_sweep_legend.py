"""`recipegen plan --sweep`: every column and marker of the sweep table is explained under it, as
knee's report and `compare` explain theirs (QA: rows ended in `✗ kv` / `✗ hbm` and the footer
explained only the bracketed `[kv]` / `[hbm]`, and no column such as "host free")."""

from __future__ import annotations

import re
from pathlib import Path

from cli_support import invoke

REFERENCE = "dsv41-flash-gb300"
COLUMNS = ("hot / cold: experts per MoE layer kept in HBM / in pinned host memory",
           "HBM experts: the hot experts' bytes per GPU",
           "KV pool: the HBM per GPU left for the KV cache",
           "KV tokens: the tokens that pool holds",
           "host pinned: the cold experts' bytes in pinned host memory",
           "host free: the machine's host memory less the host memory in use",
           "cold share: the share of the class's routed picks that fall on cold experts",
           "fetch C<n>: the projected fetch tax per decode step at n concurrent streams")


def _table(stdout: str) -> list[str]:
    """The sweep table's lines: its heading, header and rows, down to its notes."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("lane agent, class"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("note: cold share per row")
               or lines[i].startswith("note: no histogram"))
    return lines[start:end]


def test_the_qa_sweep_explains_every_column_and_marker(tmp_path: Path) -> None:
    result = invoke("plan", REFERENCE, "agent", "--sweep", "hot=250..384", "--plot", str(tmp_path / "x.png"))
    assert result.code == 0, result.output
    table = "\n".join(_table(result.stdout))
    for words in COLUMNS:
        assert words in table, words
    # the markers the rows carry, each explained in the lines under the table
    assert " ◀ lane now" in table
    assert "◀ lane now: the lane's hot experts per layer as its recipe stands" in table
    kinds = {k for line in table.splitlines() if (m := re.search(r"  ✗ (.+)$", line))
             for k in m.group(1).split(", ")}
    assert kinds == {"kv", "hbm"}
    assert "✗ <kind>: a budget the row breaks, as `check budgets` names it" in table
    assert "hbm: HBM per GPU (reserve + hot experts over the cap)" in table
    assert "kv: the KV pool (less than one max_model_len sequence)" in table


def test_only_the_markers_printed_are_explained() -> None:
    result = invoke("plan", REFERENCE, "agent", "--sweep", "hot=280..290:5")
    assert result.code == 0, result.output
    table = "\n".join(_table(result.stdout))
    assert "✗" not in table and "◀" not in table     # no row breaks a budget, 295 is not in the range
    for words in COLUMNS:
        assert words in table, words
    assert "†" not in table


def test_a_positional_lanes_marker_and_streams_above_max_num_seqs_are_explained() -> None:
    result = invoke("plan", "dsv41-flash-gb300-off60", "--sweep", "hot=290..300:10", "--concurrency", "1,300")
    assert result.code == 0, result.output
    table = "\n".join(_table(result.stdout))
    assert "fetch C300†" in table
    assert "†: above --max-num-seqs (the note under the decode speed estimate)" in table
    assert " ◀ lane's offload budget, usage-aware" in table
    assert ("◀ lane's offload budget, usage-aware: the hot count the positional lane's --cpu-offload-gb bytes "
            "would buy as a usage-aware lane") in table
    assert "✗ kv" in table and "kv: the KV pool (less than one max_model_len sequence)" in table
    assert "hbm: HBM per GPU" not in table           # no row breaks the HBM budget here


def test_every_budget_kind_has_words_for_the_sweep_and_the_bracketed_tag() -> None:
    from recipegen.common import glossary

    term = next(t for t in glossary.TERMS if t.name.startswith("[kv]"))
    for kind in glossary.BUDGET_KINDS:
        assert term.used_in(f"[{kind}]"), kind
        assert f"[{kind}]" in term.meaning, kind
