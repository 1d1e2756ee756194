"""One figure worded one way across commands: a positional lane's pinned experts in `new`, `fit`
and `compare` as `check budgets` words them (the experts' bytes in vLLM's larger pinned blocks, so
the host line adds up), the budget tags and the validation band explained wherever they are
printed, a pipeline stage's reserve labelled by what it is derived from, a field measurement
printed only beside the lane it was measured on, and a 0 B workspace operand with its reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_support import invoke
from test_fit import REPO  # the repository root

from recipegen.common import glossary

NEMOTRON = REPO / "tests" / "fixtures" / "hf_configs" / "nemotron-3-nano-30b-a3b"
GIB = r"([0-9][0-9,]*\.[0-9]{2}) GiB"


def _gib(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import shutil

    shutil.copytree(REPO / "recipes", tmp_path / "recipes")
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ------------------------------------------------------------------ pinned experts, one wording


def test_new_prints_the_pinned_blocks_check_budgets_prints_and_the_host_line_adds_up(here: Path) -> None:
    new = invoke("new", str(NEMOTRON), "--machine", "rtx-5090", "-o", "n.yaml")
    assert new.code == 0, new.stdout + new.stderr
    assert "chose: positional" in new.stdout
    line = next(x for x in new.stdout.splitlines() if x.strip().startswith("host: "))
    m = re.search(rf"pinned experts {GIB} in {GIB} of vLLM's pinned blocks \(each parameter rounded up to a "
                  rf"power of two\) \+ reserve {GIB} = in use {GIB}", line)
    assert m, line
    exact, blocks, reserve, total = map(_gib, m.groups())
    assert blocks > exact
    assert blocks + reserve == pytest.approx(total, abs=0.011)   # the line adds up
    budgets = invoke("check", "budgets", "n.yaml")
    assert budgets.code == 0, budgets.stdout + budgets.stderr
    assert f"pinned experts {m[1]} GiB in {m[2]} GiB of vLLM's pinned blocks" in budgets.stdout
    assert f"= {m[4]} GiB of " in budgets.stdout


def test_compare_refusal_and_table_say_which_pinned_figure(here: Path) -> None:
    result = invoke("compare", "recipes/nemotron-3-nano-30b-a3b-rtx4090.yaml", "--machines",
                    "rtx-4090,rtx-5090")
    assert result.code == 0, result.stdout + result.stderr
    refusal = next(x for x in result.stdout.splitlines() if "breaks [host]" in x)
    m = re.search(rf"pinned experts {GIB} in {GIB} of vLLM's pinned blocks \(each parameter rounded up to a "
                  rf"power of two\) \+ reserve {GIB} = in use {GIB} > {GIB}", refusal)
    assert m, refusal
    exact, blocks, reserve, total, memory = map(_gib, m.groups())
    assert blocks > exact and blocks + reserve == pytest.approx(total, abs=0.011) and total > memory
    row = next(x for x in result.stdout.splitlines() if x.strip().startswith("rtx-5090") and "positional" in x)
    assert re.search(r"[0-9.]+ GiB \(blocks [0-9.]+ GiB\)", row), row
    assert "(blocks N GiB): the host memory they take" in result.stdout


# ------------------------------------------------------------------ shorthand explained where printed


def test_budget_tags_and_the_validation_band_are_explained_where_printed(here: Path) -> None:
    new = invoke("new", "qwen3-30b-a3b", "--machine", "rtx-4090", "-o", "q.yaml")
    assert new.code == 0, new.stdout + new.stderr
    body, footer = new.stdout.split(glossary.HEADING)
    tags = set(re.findall(r"\[(kv|hbm|host|load-host|load-hbm)\]", body))
    assert tags and "validation band" in body
    for tag in tags:
        assert re.search(rf"^  \[kv\] / .*: .*\[{tag}\] \w", footer, re.M), f"[{tag}] unexplained:\n{new.stdout}"
    assert re.search(r"^  validation band: the range of real speeds", new.stdout, re.M), new.stdout
    budgets = invoke("check", "budgets", "q.yaml")
    assert "validation band" in budgets.stdout, budgets.stdout
    assert re.search(r"^  validation band: ", budgets.stdout, re.M), budgets.stdout
    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    for term in glossary.TERMS:
        if term.name in ("validation band", "[kv] / [hbm] / [host] / [load-host]"):
            assert f"| {term.name} | {term.meaning} |" in design


# ------------------------------------------------------------------ a pipeline stage's reserve


def test_a_stage_reserve_reads_derived_in_the_headline_and_the_explain_note(here: Path) -> None:
    result = invoke("check", "budgets", "dsv41-flash-gb300x2-pp2", "--explain")
    assert result.code == 0, result.stdout + result.stderr
    stage_basis = re.findall(r"stage reserve [0-9.]+ GiB \(derived from the lane's (\S+) single-box reserve",
                             result.stdout)
    assert stage_basis and len(set(stage_basis)) == 1
    headlines = [x for x in result.stdout.splitlines() if x.strip().startswith("HBM / GPU:")]
    assert len(headlines) == 2
    for rank, line in enumerate(headlines):
        assert f"(stage {rank}'s share, derived from the lane's {stage_basis[0]} single-box reserve)" in line
        assert "measured boot" not in line
    assert "inside the declared reserve" not in result.stdout
    assert result.stdout.count("inside the stage reserve derived from the lane's single-box reserve") == 2


# ------------------------------------------------------------------ the field's measurement, on its own lane


def _cold_share_lines(recipe: str) -> list[str]:
    result = invoke("plan", recipe, "--explain")
    assert result.code == 0, result.stdout + result.stderr
    return [x for x in result.stdout.splitlines() if "mean per-layer cold share" in x and "positional:" in x]


def test_the_reference_lanes_positional_measurement_is_printed_only_beside_it(here: Path) -> None:
    other = _cold_share_lines("qwen3-235b-a22b-fp8-h200")
    assert other and not [x for x in other if "field reports measured" in x]
    own = _cold_share_lines("dsv41-flash-gb300-off60")
    assert own and all("the field reports measured ~23% / 24% of picks" in x for x in own)


# ------------------------------------------------------------------ a 0 B operand says why


def test_the_estimated_reserve_says_why_its_fused_moe_workspace_is_zero(here: Path) -> None:
    result = invoke("check", "budgets", "qwen3.5-35b-a3b-rtx5090", "--explain")
    assert result.code == 0, result.stdout + result.stderr
    formulas = [x for x in result.stdout.splitlines() if "fused-MoE workspace (" in x]
    zero = [x for x in formulas if "fused_moe_workspace_bytes=0 B" in x]
    nonzero = [x for x in formulas if "fused_moe_workspace_bytes=0 B" not in x]
    assert zero and nonzero
    for line in zero:
        assert "(0 B here: the runtime computes the experts, so vLLM's fused-MoE workspace is not allocated" in line
    for line in nonzero:   # the positional column's workspace is real: no such words there
        assert "0 B here" not in line
