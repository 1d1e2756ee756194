"""docs/metrics.md against the one definition of the series (`expert_residency.contract.metrics`)
and of the runtime's variables (`contract.env`); every PromQL expression it shows parses in Debian's
promtool (as a rule of a rules file)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from expert_residency.contract import env
from expert_residency.contract import metrics as m
from prometheus_support import PROMTOOL, SKIP_REASON, prometheus_available

DOC = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


def table_rows(text: str, header: str) -> dict[str, list[str]]:
    """First cell (without backticks) → cells, for the table whose header row starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells
    return rows


def promql_expressions(text: str) -> list[str]:
    block = re.search(r"```promql\n(.*?)```", text, re.S).group(1)
    exprs: list[str] = []
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith((" ", "\t")):
            exprs[-1] += " " + line.strip()
        else:
            exprs.append(line.strip())
    return exprs


def test_every_series_is_documented_with_its_type_and_labels() -> None:
    rows = table_rows(DOC.read_text(), "| series |")
    assert set(rows) == {s.name for s in m.ALL}
    for series in m.ALL:
        _, kind, labels, _ = rows[series.name]
        assert kind == series.kind, series.name
        assert [label.strip() for label in labels.split(",")] == list(series.labels), series.name


def test_every_variable_in_the_table_is_the_runtimes() -> None:
    rows = table_rows(DOC.read_text(), "| variable |")
    assert set(rows) == {env.METRICS, env.METRICS_INTERVAL_S, env.METRICS_WINDOW_S,
                         env.PREDICTED_COLD_SHARE, m.MULTIPROC_DIR_ENV}


def test_the_documented_drift_expression_is_the_rendered_one() -> None:
    normalised = {re.sub(r"\s+", " ", e) for e in promql_expressions(DOC.read_text())}
    assert re.sub(r"\s+", " ", m.drift_expr("5m", hold="15m")).replace("( ", "(").replace(" )", ")") in {
        e.replace("( ", "(").replace(" )", ")") for e in normalised}


@pytest.mark.skipif(not prometheus_available(), reason=SKIP_REASON)
def test_every_promql_expression_in_the_doc_parses(tmp_path: Path) -> None:
    exprs = promql_expressions(DOC.read_text())
    assert len(exprs) >= 9
    rules = {"groups": [{"name": "doc", "rules": [{"record": f"doc:expr{i}", "expr": e}
                                                 for i, e in enumerate(exprs)]}]}
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    check = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.skipif(not prometheus_available(), reason=SKIP_REASON)
@pytest.mark.parametrize("boot, maps, shown", [
    # An adaptive lane after swaps: the boot map's series (0 now) and two later live maps, one of
    # them live: the query shows the live one.
    ("b00t", [("b00t", 0), ("aaaa", 0), ("cccc", 1)], ["cccc"]),
    # Swapped back to the boot map: nothing is shown.
    ("b00t", [("aaaa", 0), ("b00t", 1)], []),
    # A static lane: one series, the boot map: nothing.
    ("b00t", [("b00t", 1)], []),
])
def test_the_documented_live_map_query_shows_a_map_other_than_the_boot_one(
        tmp_path: Path, boot: str, maps: list[tuple[str, int]], shown: list[str]) -> None:
    (expr,) = [e for e in promql_expressions(DOC.read_text()) if "unless" in e and m.LIVE_MAP_INFO.name in e]
    rules = tmp_path / "doc.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "doc", "rules": [{"record": "doc:changed", "expr": expr}]}]}))
    series = [{"series": f'{m.LIVE_MAP_INFO.name}{{lane="agent",class="agent",content_hash="{h}",'
                         f'boot_content_hash="{boot}",shape_hash="s"}}', "values": f"{v}x5"} for h, v in maps]
    exp = [{"labels": f'doc:changed{{lane="agent",class="agent",content_hash="{h}",boot_content_hash="{boot}",'
                      f'shape_hash="s"}}', "value": 1} for h in shown]
    tests = tmp_path / "test.yml"
    tests.write_text(yaml.safe_dump({"rule_files": [str(rules)], "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{"expr": "doc:changed", "eval_time": "2m", "exp_samples": exp}]}]}))
    result = subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
