"""`fit`, `new` and `compare` against what the written recipe and the other commands say: an
unchanged context spelled with vLLM's suffixes stays as written, `new`'s speed figure is the one
`fit`, `plan` and `check budgets` print on the recipe it wrote, a refusal names each placement's own
reason (and the one that bounds the context), the row-map line names where its histogram came
from, and `new` / `compare` do not claim a dry run or a write they do not do."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from cli_support import invoke
from test_fit import REPO, project  # the repository root and the shipped-recipe project


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def fit_json(*args: str) -> dict:
    result = invoke("fit", *args, "--json")
    assert result.code in (0, 1), result.stderr
    return json.loads(result.stdout)


# ------------------------------------------------------------------ a value spelled another way is no change

def test_an_unchanged_suffixed_context_keeps_its_spelling_and_comment(tmp_path: Path) -> None:
    """`32K` is 32,768 tokens, the lane's context: the fit moves the hot count and the load offload
    only, and the line with the user's note stays byte for byte."""
    line = "max_model_len: 32K    # my note: 32K = 32,768"
    recipe = project(tmp_path, "qwen3-30b-a3b-rtx4090",
                     edit=lambda t: re.sub(r"max_model_len: 32768\b.*", line, t, count=1))
    assert line in recipe.read_text()
    doc = fit_json(str(recipe), "--dry-run")
    assert doc["max_model_len"] == 32768 and doc["changed"]
    assert not [c for c in doc["changed"] if c.startswith("max_model_len")], doc["changed"]
    result = invoke("fit", str(recipe))
    assert result.code == 0, result.stdout + result.stderr
    after = recipe.read_text()
    assert line in after
    assert yaml.safe_load(after)["lanes"][0]["max_model_len"] == "32K"


def test_the_shipped_1m_context_is_no_change(tmp_path: Path) -> None:
    """dsv41-flash-gb300 writes `max_model_len: 1M` (1,048,576 tokens, vLLM's reading)."""
    recipe = project(tmp_path, "dsv41-flash-gb300")
    assert "max_model_len: 1M " in recipe.read_text()
    doc = fit_json(str(recipe), "--dry-run")
    assert doc["max_model_len"] == 2**20
    assert not [c for c in doc["changed"] if c.startswith("max_model_len")], doc["changed"]


def test_a_load_offload_in_other_units_is_no_change(tmp_path: Path) -> None:
    """After a fit, `load_cpu_offload: N GiB` written as N × 1,024 MiB with a note is the same size:
    a second fit writes nothing."""
    recipe = project(tmp_path, "qwen3-30b-a3b-rtx4090")
    result = invoke("fit", str(recipe))
    assert result.code == 0, result.stdout + result.stderr
    gib = yaml.safe_load(recipe.read_text())["lanes"][0]["offload"]["load_cpu_offload"]
    n = int(gib.removesuffix(" GiB"))
    text = re.sub(r"load_cpu_offload: .*", f"load_cpu_offload: {n * 1024} MiB   # my note", recipe.read_text(), count=1)
    recipe.write_text(text)
    result = invoke("fit", str(recipe))
    assert result.code == 0, result.stdout + result.stderr
    assert "unchanged: the recipe already holds this fit" in result.stdout
    assert recipe.read_text() == text


# ------------------------------------------------------------------ one speed figure for one lane

def _check_budgets_tokens_per_s(recipe: Path) -> float:
    result = invoke("check", "budgets", str(recipe), "--json")
    assert result.code == 0, result.stdout + result.stderr
    return json.loads(result.stdout)["recipes"][0]["lanes"][0]["estimate"]["tokens_per_s"]["1"]


def _plan_tokens_per_s(recipe: Path) -> float:
    result = invoke("plan", str(recipe), "chat")
    assert result.code == 0, result.stdout + result.stderr
    return float(re.search(r"C1 k=0: ([0-9.,]+) tok/s", result.stdout).group(1).replace(",", ""))


def test_new_prints_the_speed_the_written_recipe_gets(here: Path) -> None:
    """`new` estimates on the synthetic histogram it writes, so its figure is `fit --dry-run`'s,
    `check budgets`'s and `plan`'s on the written recipe."""
    result = invoke("new", "qwen3-30b-a3b", "--machine", "rtx-5090", "--json")
    assert result.code == 0, result.stdout + result.stderr
    made = json.loads(result.stdout)
    assert made["chosen"]["placement"] == "usage-aware" and made["rowmaps"][0]["synthetic"]
    recipe = here / made["recipe_path"]
    refit = fit_json(str(recipe), "--dry-run")
    assert refit["changed"] == [] and refit["writes"] == []
    speed = made["chosen"]["speed"]["tokens_per_s"]
    assert refit["chosen"]["speed"]["tokens_per_s"] == pytest.approx(speed, rel=1e-12)
    assert _check_budgets_tokens_per_s(recipe) == pytest.approx(speed, rel=1e-12)
    assert _plan_tokens_per_s(recipe) == pytest.approx(speed, abs=0.05)   # printed to 0.1 tok/s
    step = re.search(r"step ([0-9.]+) ms", made["chosen"]["speed"]["basis"]).group(1)
    assert f"step {step} ms" in refit["chosen"]["speed"]["basis"]


def test_compare_on_an_unprofiled_lane_prints_the_speed_fit_writes(tmp_path: Path) -> None:
    """gpt-oss-120b on the L40S has no class: compare and fit both estimate the usage-aware lane on
    the synthetic default the fit writes; `check budgets` on the written recipe says the same."""
    recipe = project(tmp_path, "gpt-oss-120b-l40s")
    result = invoke("compare", str(recipe), "--machines", "l40s", "--json")
    assert result.code == 0, result.stdout + result.stderr
    row = json.loads(result.stdout)["machines"][0]
    assert row["chosen"]["placement"] == "usage-aware"
    result = invoke("fit", str(recipe))
    assert result.code == 0, result.stdout + result.stderr
    assert _check_budgets_tokens_per_s(recipe) == pytest.approx(row["chosen"]["speed"]["tokens_per_s"], rel=1e-12)


# ------------------------------------------------------------------ why nothing fits

def test_compare_names_every_placements_reason_when_nothing_fits(here: Path) -> None:
    """Qwen3-30B-A3B's recipe for the RTX 5090 (40,960 tokens) on the RTX 4090: each placement is
    refused for its own budget; the table's note names all of them, as --json lists them."""
    result = invoke("new", "qwen3-30b-a3b", "--machine", "rtx-5090", "-o", "q.yaml")
    assert result.code == 0, result.stdout + result.stderr
    args = ("compare", "q.yaml", "--machines", "rtx-4090,rtx-5090")
    result = invoke(*args, "--json")
    assert result.code == 0, result.stdout + result.stderr
    rows = json.loads(result.stdout)["machines"]
    assert not rows[0]["fits"] and rows[1]["fits"]
    refusals = rows[0]["refusals"]
    assert {r["placement"] for r in refusals} == {"all in HBM", "usage-aware", "positional"}
    table = invoke(*args)
    assert table.code == 0
    for r in refusals:
        assert f"{r['placement']}: {r['reason']}" in table.stdout


def test_new_names_what_bounds_the_context(here: Path) -> None:
    """`new` on the RTX 4090 fits a shorter context than the model's 40,960; the reason it gives is
    the chosen placement's refusal one step longer — what `fit --max-model-len` at that length says —
    not the all-in-HBM refusal, which has nothing to do with context."""
    result = invoke("new", "qwen3-30b-a3b", "--machine", "rtx-4090", "--json")
    assert result.code == 0, result.stdout + result.stderr
    made = json.loads(result.stdout)
    length, placement = made["max_model_len"], made["chosen"]["placement"]
    assert length < 40960 and placement != "all in HBM"
    longer = fit_json(str(here / made["recipe_path"]), "--max-model-len", str(length + 1024), "--dry-run")
    assert not longer["fitted"]
    reason = next(r["reason"] for r in longer["refusals"] if r["placement"] == placement)
    assert f"{placement}: {reason}" in made["context"]
    hbm = next(r["reason"] for r in longer["refusals"] if r["placement"] == "all in HBM")
    assert hbm not in made["context"]


# ------------------------------------------------------------------ where the histogram came from

def test_the_row_map_line_names_the_class_histogram_file(tmp_path: Path) -> None:
    """dsv41-flash-gb300's classes read their own files (generated by `rowmap synth`, so marked
    synthetic); none of them is the synthetic default a fit makes."""
    recipe = project(tmp_path, "dsv41-flash-gb300")
    classes = yaml.safe_load(recipe.read_text())["lanes"][0]["classes"]
    result = invoke("fit", str(recipe), "--dry-run")
    assert result.code == 0, result.stdout + result.stderr
    rows = {m.group(1): m.group(2) for m in re.finditer(r"row map: class (\w+): .*? of (.*)", result.stdout)}
    assert set(rows) == set(classes)
    for name, cls in classes.items():
        assert rows[name].startswith(f"histogram {cls['histogram']} (the class's own file"), rows[name]
        assert "default" not in rows[name] and "SYNTHETIC" in rows[name]


def test_the_row_map_line_names_the_synthetic_default_it_writes(tmp_path: Path) -> None:
    recipe = project(tmp_path, "gpt-oss-120b-l40s")
    result = invoke("fit", str(recipe))
    assert result.code == 0, result.stdout + result.stderr
    histogram = yaml.safe_load(recipe.read_text())["lanes"][0]["classes"]["chat"]["histogram"]
    line = next(x for x in result.stdout.splitlines() if "row map: class chat" in x)
    assert line.endswith("of SYNTHETIC default histogram (no profile yet; `recipegen profile` replaces it)"), line
    assert f"wrote: {histogram} (class chat: synthetic default histogram)" in result.stdout
    result = invoke("fit", str(recipe), "--dry-run")      # now the class's own (synthetic) file
    line = next(x for x in result.stdout.splitlines() if "row map: class chat" in x)
    assert f"histogram {histogram} (the class's own file; SYNTHETIC" in line and "default" not in line


# ------------------------------------------------------------------ what new and compare say they do

def test_new_that_fits_nothing_claims_no_dry_run(here: Path) -> None:
    result = invoke("new", "kimi-k2-instruct", "--machine", "rtx-4090")
    assert result.code == 1, result.stdout + result.stderr
    assert "nothing written: nothing fits" in result.stdout and "dry run" not in result.stdout
    result = invoke("new", "kimi-k2-instruct", "--machine", "rtx-4090", "--json")
    assert result.code == 1
    assert json.loads(result.stdout)["dry_run"] is False and json.loads(result.stdout)["written"] is False


def test_compare_help_says_concurrency_is_not_written() -> None:
    result = invoke("compare", "--help")
    assert result.code == 0
    flat = " ".join(result.stdout.split())
    assert "written as the lane's concurrency.max" not in flat and "nothing is written" in flat
    result = invoke("fit", "--help")
    assert "written as the lane's concurrency.max" in " ".join(result.stdout.split())


VL = "qwen3-vl-30b-a3b-instruct"


def _committed_model_file(here: Path) -> Path:
    """The shipped Qwen3-VL model file (it records the checkpoint id a local import cannot know)."""
    models = here / "recipes" / "models"
    models.mkdir(parents=True)
    target = models / f"{VL}.yaml"
    target.write_bytes((REPO / "recipes" / "models" / f"{VL}.yaml").read_bytes())
    return target


def test_new_keeps_a_model_file_that_states_the_same_figures(here: Path) -> None:
    model_file = _committed_model_file(here)
    before = model_file.read_bytes()
    assert yaml.safe_load(before)["checkpoint"]
    result = invoke("new", str(REPO / "tests" / "fixtures" / "hf_configs" / VL), "--machine", "rtx-5090",
                    "-o", "recipes/vl.yaml")
    assert result.code == 0, result.stdout + result.stderr
    assert model_file.read_bytes() == before     # checkpoint id and description kept, nothing rewritten
    assert yaml.safe_load((here / "recipes" / "vl.yaml").read_text())["model"] == {"file": f"models/{VL}.yaml"}


def test_new_names_what_differs_in_a_model_file_it_will_not_replace(here: Path) -> None:
    model_file = _committed_model_file(here)
    doc = yaml.safe_load(model_file.read_text())
    doc["routed_experts"]["value"] = 64
    model_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    before = model_file.read_bytes()
    result = invoke("new", str(REPO / "tests" / "fixtures" / "hf_configs" / VL), "--machine", "rtx-5090",
                    "-o", "recipes/vl.yaml")
    assert result.code == 2 and model_file.read_bytes() == before and not (here / "recipes" / "vl.yaml").exists()
    assert "routed_experts" in result.stderr and "--force would drop the file's checkpoint" in result.stderr
