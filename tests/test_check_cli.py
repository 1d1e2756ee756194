"""`recipegen check budgets` end to end: the table, --explain, --json, exit codes 0/1/2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import CliResult, invoke

REPO = Path(__file__).resolve().parent.parent
FAILURES = Path(__file__).parent / "budget_failures"


def check_budgets(*args: str) -> CliResult:
    return invoke("check", "budgets", *args)


def test_json_reproduces_the_reference_numbers() -> None:
    result = check_budgets(str(REPO / "recipes" / "dsv41-flash-gb300.yaml"), "--json")
    assert result.code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is True
    lane = doc["recipes"][0]["lanes"][0]
    figs = lane["figures"]
    expected = {  # seed "vLLM: Pin Hot Experts" (v15), to 0.01 GiB
        "experts.per_layer": 6.72, "experts.total": 268.95, "hbm.hot_experts": 206.61,
        "host.cold_experts": 62.33, "hbm.cap": 243.18, "hbm.kv_pool": 4.9, "hbm.reserve": 31.67,
        "host.tables": 189.2, "host.before_reserve": 251.53,
    }
    for key, gib in expected.items():
        assert figs[key]["gib"] == pytest.approx(gib, abs=0.01), key
        assert figs[key]["value"] == pytest.approx(figs[key]["gib"] * 2**30)
    assert figs["kv.tokens"]["value"] / 1e6 == pytest.approx(2.54, abs=0.01)
    assert lane["usage_aware"]["hot_per_layer"] == 295 and lane["usage_aware"]["cold_per_layer"] == 89
    assert lane["positional"]["figures"]["positional.measured"]["gib"] == pytest.approx(61.17, abs=0.01)
    assert figs["hbm.kv_pool"]["formula"] == "hbm_cap − reserve − hot_experts − runtime_workspace"
    assert set(figs["hbm.kv_pool"]["operands"]) == {"hbm_cap_bytes", "reserve_bytes", "hot_experts_bytes",
                                                    "runtime_workspace_bytes"}


def test_human_table_shows_the_numbers() -> None:
    result = check_budgets(str(REPO / "recipes" / "dsv41-flash-gb300.yaml"))
    assert result.code == 0
    out = result.stdout
    for text in ("295 hot / 89 cold", "206.61 GiB", "62.33 GiB", "4.90 GiB", "2.54M tokens",
                 "250.70 GiB × 0.97 = 243.18 GiB cap", "reserve 31.67 GiB (back-solved from a measured boot",
                 "= 251.53 GiB before page cache", "positional at --cpu-offload-gb 60 (the lane's load offload)",
                 "(measured 61.17 GiB)", "verdict: OK"):
        assert text in out, text


def test_explain_prints_formulas() -> None:
    result = check_budgets(str(REPO / "recipes" / "dsv41-flash-gb300.yaml"), "--explain")
    assert result.code == 0
    assert "KV pool (per GPU) = 4.90 GiB" in result.stdout
    assert "= hbm_cap − reserve − hot_experts" in result.stdout
    assert "back-solved from a measured boot" in result.stdout
    assert "[positional] experts offloaded by --cpu-offload-gb (approximation)" in result.stdout


def test_default_checks_every_shipped_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    result = check_budgets()
    assert result.code == 0, result.output
    shipped = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))
    for name in shipped:
        assert f"verdict: OK ({name})" in result.stdout


@pytest.mark.parametrize("name, text", [
    # 189.2 GiB tables + 268.95 GiB experts + 128.05 GiB reserve (432 − 114.75 − 189.2) − 494 GiB
    ("all-experts-pinned", "host memory over by 92.20 GiB"),
    ("hot-over-hbm-cap", "exceed the HBM cap by 57.43 GiB"),
    ("kv-below-max-model-len", "less than one max_model_len sequence"),
])
def test_failures_exit_1_with_explanation(name: str, text: str) -> None:
    result = check_budgets(str(FAILURES / f"{name}.yaml"))
    assert result.code == 1, result.output
    assert text in result.stdout and "→ " in result.stdout
    assert "verdict: OVER BUDGET" in result.stdout


def test_worst_exit_code_wins() -> None:
    good = str(REPO / "recipes" / "dsv41-flash-gb300.yaml")
    bad = str(FAILURES / "kv-below-max-model-len.yaml")
    invalid = str(Path(__file__).parent / "bad_recipes" / "missing_unit.yaml")
    assert check_budgets(good, bad).code == 1
    result = check_budgets(good, bad, invalid, "--json")
    assert result.code == 2
    doc = json.loads(result.stdout)
    assert [r["ok"] for r in doc["recipes"]] == [True, False, False]
    assert "missing unit" in doc["recipes"][2]["error"]


def test_lane_filter() -> None:
    result = check_budgets(str(REPO / "recipes" / "dsv41-flash-gb300.yaml"), "--lane", "nope")
    assert result.code == 2 and "field '--lane': the recipe has no lane 'nope' (lanes: agent)" in result.stderr


def test_real_console_script(tmp_path: Path) -> None:
    """Through the installed entry point, as a user runs it."""
    exe = Path(sys.executable).parent / "recipegen"
    proc = subprocess.run([str(exe), "check", "budgets", "dsv41-flash-gb300", "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["recipes"][0]["recipe"] == "dsv41-flash-gb300"
    proc = subprocess.run([str(exe), "check", "budgets", str(FAILURES / "hot-over-hbm-cap.yaml")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "lower hot experts per layer to 299" in proc.stdout


@pytest.mark.parametrize("argv, message", [
    (["plan", "qwen3-30b-a3b-rtx4090", "chat", "--json", "--concurrency", "0"], "field '--concurrency'"),
    (["new", "qwen3-30b-a3b", "--machine", "nope", "--json"], "field '--machine': 'nope' is not a catalog machine"),
    (["plan", "qwen3-30b-a3b-rtx4090", "chat", "--json", "--bogus"], "No such option '--bogus'"),
])
def test_a_failure_under_json_is_a_json_document_on_stdout_too(argv: list[str], message: str) -> None:
    # as `check budgets --json` reports an invalid recipe: a script reading stdout gets a document,
    # and stderr still carries the message for people
    result = invoke(*argv)
    assert result.code == 2
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2 and message in doc["error"]
    assert message in result.stderr
    plain = invoke(*(a for a in argv if a != "--json"))
    assert plain.code == 2 and plain.stdout == "" and message in plain.stderr
