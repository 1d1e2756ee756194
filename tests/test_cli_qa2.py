"""What a sweep of every command over the catalog's models and machines found: `plan` on a lane whose budgets fail
says so first; a reader of stdout that leaves ends the command quietly with SIGPIPE's status;
`plan` marks stream counts above --max-num-seqs; `render --check` documents its exit 2; `new`
names its own default context as its own; the shorthand footer explains what the output prints."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_support import invoke
from test_fit import REPO, project  # the repository root and the shipped-recipe project

from recipegen.common import glossary

RECIPE = "qwen3-30b-a3b-rtx4090"
GiB = 1 << 30
MiB = 1 << 20


@pytest.fixture
def over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shipped Qwen3-30B-A3B / RTX 4090 recipe at gpu_memory_utilization 0.70 (from 0.92).
    By hand: (24,564 − 485) MiB (CUDA's total: the catalog's driver reserve) × 0.70 = 16.46 GiB cap − reserve 5.50 GiB − 20 hot × 48 layers × 9,437,184 B
    (8.44 GiB) leaves at most 2.85 GiB for KV, less than one 32,768-token sequence at 98,304 B per
    token (3 GiB): the kv budget fails."""
    cap = (24564 - 485) * MiB * 0.70
    assert cap - 5.5 * GiB - 20 * 48 * 9_437_184 < 32768 * 98304
    recipe = project(tmp_path, RECIPE, edit=lambda t: t.replace("gpu_memory_utilization: 0.92",
                                                                "gpu_memory_utilization: 0.70", 1))
    assert "gpu_memory_utilization: 0.70" in recipe.read_text()
    monkeypatch.chdir(tmp_path)
    return recipe


# ------------------------------------------------------------------ finding 5: plan on a lane over budget

def test_plan_says_first_that_the_lanes_budgets_fail(over: Path) -> None:
    checked = invoke("check", "budgets", RECIPE)
    assert checked.code == 1 and "verdict: OVER BUDGET" in checked.stdout
    violation = next(line.strip() for line in checked.stdout.splitlines()
                     if line.strip().startswith("OVER BUDGET [kv]"))
    result = invoke("plan", RECIPE, "chat")
    assert result.code == 0, result.stderr   # plan documents no exit code for this: still a what-if estimate
    lines = result.stdout.splitlines()
    assert lines[0].startswith("warning: lane chat's budgets do not hold")
    assert "vLLM would not start it" in lines[0] and f"`recipegen check budgets {RECIPE}`" in lines[0]
    assert lines[1].strip() == violation                   # worded as `check budgets` words it
    assert result.stdout.index(violation) < result.stdout.index("decode speed estimate")


def test_plan_json_carries_the_same_violations_as_check_budgets(over: Path) -> None:
    checked = invoke("check", "budgets", RECIPE, "--json")
    lane = json.loads(checked.stdout)["recipes"][0]["lanes"][0]
    result = invoke("plan", RECIPE, "chat", "--json")
    assert result.code == 0, result.stderr
    budgets = json.loads(result.stdout)["budgets"]
    assert budgets["ok"] is False and [v["kind"] for v in budgets["violations"]] == ["kv"]
    assert budgets["violations"] == lane["violations"]
    assert "vLLM would not start it" in budgets["warning"] and "recipegen check budgets" in budgets["warning"]


def test_plan_on_a_lane_within_budget_warns_of_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project(tmp_path, RECIPE)
    monkeypatch.chdir(tmp_path)
    result = invoke("plan", RECIPE, "chat")
    assert result.code == 0 and "budgets do not hold" not in result.stdout and "OVER BUDGET" not in result.stdout
    result = invoke("plan", RECIPE, "chat", "--json")
    assert json.loads(result.stdout)["budgets"] == {"ok": True, "violations": [], "warning": None}


# ------------------------------------------------------------------ finding 7: a reader that leaves

def _closed_reader_run(*args: str) -> subprocess.CompletedProcess[bytes]:
    """`recipegen ARGS` with stdout a pipe whose reader has already gone (`| head` that exited)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "recipegen", *args], stdout=write_end,
                              stderr=subprocess.PIPE, cwd=REPO, timeout=120, check=False)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("args", [("check", "budgets", RECIPE), ("plan", RECIPE, "chat")])
def test_a_reader_that_leaves_gets_sigpipes_status_and_no_message(args: tuple[str, ...]) -> None:
    result = _closed_reader_run(*args)
    assert result.returncode == 128 + 13, result.stderr.decode()   # as a shell reports SIGPIPE
    assert result.stderr == b""                  # no "error: Broken pipe", no "Exception ignored"


def test_head_reads_the_first_line_and_the_status_is_not_bad_input() -> None:
    result = subprocess.run(["bash", "-c", f"{sys.executable} -m recipegen check budgets {RECIPE} | head -1; "
                             "echo \"status ${PIPESTATUS[0]}\""], capture_output=True, cwd=REPO, timeout=120,
                            check=False, text=True)
    first, status = result.stdout.splitlines()
    assert first.startswith(f"{RECIPE} (")
    assert status in ("status 0", "status 141"), status   # 0 when all was written before head left
    assert "Broken pipe" not in result.stderr and "Exception ignored" not in result.stderr


# ------------------------------------------------------------------ finding 8: beyond --max-num-seqs

def _rendered_max_num_seqs(root: Path) -> int:
    result = invoke("render", RECIPE)
    assert result.code == 0, result.stderr
    command = (root / "compose" / RECIPE / "compose.yaml").read_text()
    return int(re.search(r"--max-num-seqs\W+(\d+)", command).group(1))


def test_plan_marks_the_stream_counts_vllm_would_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = project(tmp_path, RECIPE)
    monkeypatch.chdir(tmp_path)
    assert yaml.safe_load(recipe.read_text())["lanes"][0]["concurrency"]["max"] == 2
    assert _rendered_max_num_seqs(tmp_path) == 2
    result = invoke("plan", RECIPE, "chat", "--concurrency", "1,2,4,16")
    assert result.code == 0, result.stderr
    steps = {int(m.group(1)): m.group(2) for m in re.finditer(r"^    C(\d+)(†?) k=", result.stdout, re.M)}
    assert steps == {1: "", 2: "", 4: "†", 16: "†"}
    fetch = next(line for line in result.stdout.splitlines() if "on the active map" in line)
    assert "C2 k=" in fetch and "C4† k=" in fetch and "C16† k=" in fetch
    note = next(line for line in result.stdout.splitlines() if line.startswith("  note: †"))
    assert "concurrency.max 2" in note and "--max-num-seqs 2" in note and "at most 2 sequences at once" in note
    assert "4, 16 streams" in note
    result = invoke("plan", RECIPE, "chat", "--concurrency", "1,2,4,16", "--json")
    limit = json.loads(result.stdout)["max_num_seqs"]
    assert limit["value"] == 2 and limit["streams_above"] == [4, 16]


def test_within_max_num_seqs_nothing_is_marked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project(tmp_path, RECIPE)
    monkeypatch.chdir(tmp_path)
    result = invoke("plan", RECIPE, "chat")
    assert "†" not in result.stdout
    result = invoke("plan", RECIPE, "chat", "--json")
    assert json.loads(result.stdout)["max_num_seqs"]["streams_above"] == []


def test_an_explicit_max_num_seqs_in_extra_args_is_the_limit(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = project(tmp_path, RECIPE, edit=lambda t: t.replace(
        "extra_args: [", "extra_args: [--max-num-seqs, '4', ", 1))
    assert "--max-num-seqs, '4'" in recipe.read_text()
    monkeypatch.chdir(tmp_path)
    assert _rendered_max_num_seqs(tmp_path) == 4
    result = invoke("plan", RECIPE, "chat", "--concurrency", "1,4,16")
    assert result.code == 0, result.stderr
    assert {int(m.group(1)): m.group(2) for m in re.finditer(r"^    C(\d+)(†?) k=", result.stdout, re.M)} == \
        {1: "", 4: "", 16: "†"}
    assert "--max-num-seqs 4 (the lane's extra_args)" in result.stdout


# ------------------------------------------------------------------ finding 9: render --check's exit 2

def test_render_check_documents_the_exit_2_it_gives(over: Path) -> None:
    result = invoke("render", "--help")
    flat = " ".join(result.stdout.split())
    assert "0 when current, 2 when a recipe cannot be rendered (invalid, or its budgets fail" in flat
    result = invoke("render", "--check", RECIPE)            # over budget
    assert result.code == 2 and "budgets fail" in result.stderr
    (over.parent / "broken.yaml").write_text("version: 1\nname: broken\n")
    result = invoke("render", "--check", "broken")            # invalid
    assert result.code == 2


# ------------------------------------------------------------------ finding 10: new's own default context

def test_new_names_its_default_context_as_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = yaml.safe_load((REPO / "recipegen" / "catalog" / "models.yaml").read_text())["dsv41-flash-mxfp4"]
    assert "max_position_embeddings" not in entry            # the model declares no limit
    monkeypatch.chdir(tmp_path)
    result = invoke("new", "dsv41-flash-mxfp4", "--machine", "gb300-station")
    assert result.code == 0, result.stderr
    context = next(line for line in result.stdout.splitlines() if line.strip().startswith("context:"))
    assert "max_model_len 32,768" in context
    assert "recipegen's default" in context and "no max_position_embeddings" in context
    assert "the lane's max_model_len" not in context
    result = invoke("new", "--help")
    assert "32,768 tokens where the model declares no max_position_embeddings" in " ".join(result.stdout.split())


def test_fit_on_a_lane_still_names_the_lanes_context() -> None:
    from recipegen.fit.search import FitOptions

    assert FitOptions(auto_context=True).default_context is None   # `fit`: the lane's, as before


# ------------------------------------------------------------------ finding 11: shorthand explained

PRINTED = {   # what the reports print -> words its footnote must carry
    "runtime workspace = kernels 94.13 MiB (… + split-K tickets)": ("split-K", "partial sums"),
    "kernels 0 B (FlashInfer TRT-LLM banks allocate per call)": ("TensorRT-LLM", "inside each call"),
    "experts: hot + cold, one after the other (one launch per bank on this GPU)": ("hot bank in HBM",
                                                                                   "runs once for each"),
    "vLLM 0.33 lays these experts out padded for TRITON: 1 B": ("not an acronym", "Triton"),
    "the runtime's fp8-block split is not verified: check split == unsplit": ("run whole", "128 × 128"),
}


@pytest.mark.parametrize("text", sorted(PRINTED))
def test_the_footer_explains_the_shorthand_qa_found_bare(text: str) -> None:
    footer = "\n".join(glossary.footnotes(text))
    for words in PRINTED[text]:
        assert words in footer, (text, footer)


def test_an_entry_is_printed_only_where_its_term_is() -> None:
    plain = "runtime workspace = kernels 88 MiB + counter and step masks 0.06 MiB: taken from the KV pool"
    names = {t.name for t in glossary.used_terms(plain)}
    assert not names & {"split-K tickets", "FlashInfer / TRT-LLM", "bank", "TRITON", "split / unsplit",
                        "fp8-block", "MLA"}


def test_check_budgets_explains_what_it_prints_on_the_gb300() -> None:
    result = invoke("check", "budgets", "dsv41-flash-gb300")
    assert result.code == 0
    report, _, footer = result.stdout.partition(glossary.HEADING)
    assert "FlashInfer TRT-LLM banks" in report and "split == unsplit" in report
    for words in ("TensorRT-LLM", "hot bank in HBM", "run whole"):
        assert words in footer
    assert "TRITON:" not in footer and "split-K" not in footer   # terms this report does not print


def test_plan_takes_the_only_lane_when_none_is_named() -> None:
    from recipegen.common.errors import InputError
    from recipegen.load.recipe import LoadedRecipe, load_recipe

    unnamed = invoke("plan", RECIPE)
    named = invoke("plan", RECIPE, "chat")
    assert unnamed.code == 0 and named.code == 0 and unnamed.stdout == named.stdout   # the recipe's one lane is chat
    loaded = load_recipe(RECIPE)
    lane = loaded.recipe.lanes[0]
    two = LoadedRecipe(recipe=loaded.recipe.model_copy(update={"lanes": [lane, lane.model_copy(update={"name": "b"})]}),
                       path=loaded.path)
    assert two.lane_at("b", "to plan")[0] == 1
    with pytest.raises(InputError, match=r"the recipe has 2 lanes \(chat, b\): name the one to plan"):
        two.lane_at(None, "to plan")
    with pytest.raises(InputError, match=r"no lane 'c' \(lanes: chat, b\)"):
        two.lane_at("c", "to plan")


def test_the_header_of_a_new_recipe_reproduces_it(tmp_path: Path) -> None:
    import shlex

    first, second = tmp_path / "a", tmp_path / "b"
    args = ["new", "qwen3-30b-a3b", "--machine", "rtx-5090", "--name", "my-q30", "--min-sequences", "2",
            "--max-model-len", "16k"]
    result = invoke(*args, "-o", str(first / "recipes" / "my-q30.yaml"), "--json")
    assert result.code == 0, result.stderr
    text = (first / "recipes" / "my-q30.yaml").read_text()
    header = re.search(r"^# Written by `([^`]+)`", text, re.M)
    assert header is not None, text[:300]
    written = shlex.split(header.group(1))
    assert written[:2] == ["recipegen", "new"] and "--json" not in written and "-o" not in written
    assert all(a in written for a in args[1:])          # every option that shapes the file is there
    result = invoke(*written[1:], "-o", str(second / "recipes" / "my-q30.yaml"))
    assert result.code == 0, result.stderr
    assert (second / "recipes" / "my-q30.yaml").read_text() == text


def test_new_names_the_recipe_after_its_output_file(tmp_path: Path) -> None:
    """`-o FILE.yaml` without --name: the recipe's name is FILE's name without .yaml (a recipe's name
    must be its file's), and the header names it so that it reproduces the recipe."""
    import shlex

    out = tmp_path / "recipes" / "small-q30.yaml"
    result = invoke("new", "qwen3-30b-a3b", "--machine", "rtx-5090", "-o", str(out))
    assert result.code == 0, result.stderr
    text = out.read_text()
    assert yaml.safe_load(text)["name"] == "small-q30"
    written = shlex.split(re.search(r"^# Written by `([^`]+)`", text, re.M).group(1))  # type: ignore[union-attr]
    assert written[written.index("--name") + 1] == "small-q30"
    result = invoke("check", "budgets", str(out))
    assert result.code == 0, result.stderr


def test_new_refuses_a_name_other_than_its_output_file(tmp_path: Path) -> None:
    """--name and -o that disagree: refused up front (exit 2, one error line naming both and the
    fix), nothing drafted or written."""
    out = tmp_path / "recipes" / "r.yaml"
    result = invoke("new", "qwen3-30b-a3b", "--machine", "rtx-5090", "--name", "my-q30", "-o", str(out))
    assert result.code == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "--name 'my-q30'" in lines[0] and f"-o {str(out)!r}" in lines[0]
    assert "drop --name" in lines[0] and "my-q30.yaml" in lines[0]
    assert not out.exists() and not (tmp_path / "recipes").exists()
    result = invoke("new", "qwen3-30b-a3b", "--machine", "rtx-5090", "-o", str(tmp_path / "R.yaml"))
    assert result.code == 2, result.stderr
    assert "is not a recipe name" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "R.yaml").exists()
