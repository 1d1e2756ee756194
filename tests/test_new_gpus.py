"""`recipegen new MODEL --machine M --gpus N`: the lane on GPUs 0..N-1 (tensor parallel N) instead
of every GPU of the machine. `new` took all eight GPUs of an 8-GPU machine even for a model one GPU
holds, with no way to ask for fewer; a count vLLM cannot boot the model at is refused up front with
the counts it can."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml
from cli_support import invoke

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hf_configs"
CATALOG = Path(__file__).resolve().parent.parent / "recipegen" / "catalog" / "models"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_gpus_sets_the_lane_and_the_header_reproduces_it(here: Path) -> None:
    result = invoke("new", "gpt-oss-20b", "--machine", "h200-sxm-x8", "--gpus", "2", "--json")
    assert result.code == 0, result.output
    text = (here / "recipes" / "gpt-oss-20b-h200-sxm-x8.yaml").read_text()
    assert yaml.safe_load(text)["lanes"][0]["gpus"] == [0, 1]
    assert text.startswith("# Written by `recipegen new gpt-oss-20b --machine h200-sxm-x8 --gpus 2`")
    assert invoke("check", "budgets", "gpt-oss-20b-h200-sxm-x8").code == 0
    # without --gpus: every GPU of the machine, as before
    assert invoke("new", "gpt-oss-20b", "--machine", "h200-sxm-x8", "--name", "all8").code == 0
    assert yaml.safe_load((here / "recipes" / "all8.yaml").read_text())["lanes"][0]["gpus"] == list(range(8))


@pytest.mark.parametrize("count, says", [
    ("3", "error: field '--gpus': 3 GPUs and 8 KV heads: "),
    ("9", "error: field '--gpus': 9: a lane runs on 1 to 8 GPUs of catalog machine h200-sxm-x8\n"),
    ("0", "error: field '--gpus': 0: a lane runs on 1 to 8 GPUs of catalog machine h200-sxm-x8\n"),
])
def test_a_count_the_machine_or_vllm_cannot_run_is_refused_up_front(here: Path, count: str, says: str) -> None:
    result = invoke("new", "gpt-oss-20b", "--machine", "h200-sxm-x8", "--gpus", count)
    assert result.code == 2 and result.stderr.startswith(says), result.output
    assert not (here / "recipes").exists()


def test_the_counts_offered_are_those_the_heads_divide(here: Path) -> None:
    # gpt-oss-20b's KV heads from its catalog entry; vLLM boots the tensor-parallel sizes whose KV
    # split is even either way (its 64 query heads divide by every one of them)
    text = (Path(__file__).resolve().parent.parent / "recipegen" / "catalog" / "models" / "gpt-oss-20b.yaml").read_text()
    kv = int(re.search(r"^    kv_heads: (\d+)$", text, re.M)[1])
    expect = [n for n in range(1, 9) if (n % kv == 0 if n >= kv else kv % n == 0)]
    assert expect == [1, 2, 4, 8]
    result = invoke("new", "gpt-oss-20b", "--machine", "h200-sxm-x8", "--gpus", "6")
    assert result.stderr.rstrip().endswith(f"on this machine vLLM boots gpt-oss-20b on {', '.join(map(str, expect))} GPUs")


def test_a_refused_draft_says_so_on_its_first_line(here: Path) -> None:
    result = invoke("new", "kimi-k2-instruct", "--machine", "rtx-4090")
    assert result.code == 1
    first = result.stdout.splitlines()[0]
    assert first.startswith("new recipe recipes/kimi-k2-instruct-rtx-4090.yaml (not written: nothing fits): "), first
    assert not (here / "recipes" / "kimi-k2-instruct-rtx-4090.yaml").exists()


# Review 18, findings 1 and 3: a config whose heads and expert shards split differently. One rule
# (`parallel_problems`) refuses --gpus up front, lists the counts that boot, and is the ledger's
# [parallel] check; without --gpus, a machine whose GPU count vLLM cannot boot is answered with those
# counts, not with "more GPU memory".

def _odd_heads(here: Path) -> tuple[Path, dict]:
    config = json.loads((FIXTURES / "qwen3-30b-a3b" / "config.json").read_text())
    config.update(num_attention_heads=40, num_key_value_heads=5, moe_intermediate_size=768)
    folder = here / "hf" / "q"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder, config


def _boots(config: dict, n: int) -> bool:
    heads, kv, inter = config["num_attention_heads"], config["num_key_value_heads"], config["moe_intermediate_size"]
    return heads % n == 0 and (n % kv == 0 if n >= kv else kv % n == 0) and inter % n == 0


def test_gpus_refused_on_heads_offers_only_counts_the_shards_divide_too(here: Path) -> None:
    folder, config = _odd_heads(here)
    expect = [n for n in range(1, 9) if _boots(config, n)]
    heads_only = [n for n in range(1, 9) if _boots({**config, "moe_intermediate_size": math.lcm(*range(1, 9))}, n)]
    assert expect == [1] and heads_only == [1, 5]      # 5 splits the heads but not the 768 shards
    result = invoke("new", str(folder), "--machine", "h200-sxm-x8", "--gpus", "4")
    assert result.code == 2, result.output
    assert result.stderr.startswith("error: field '--gpus': 4 GPUs and 5 KV heads: ")
    assert result.stderr.rstrip().endswith(f"on this machine vLLM boots q on {', '.join(map(str, expect))} GPUs")
    five = invoke("new", str(folder), "--machine", "h200-sxm-x8", "--gpus", "5")
    assert five.code == 2, five.output       # up front, not a fit that then fails on [parallel]
    assert five.stderr.startswith(f"error: field '--gpus': moe_intermediate_size {config['moe_intermediate_size']} "
                                  "is not divisible by 5 GPUs: vLLM asserts intermediate_size % tp_size == 0")
    assert not (here / "recipes").exists()
    one = invoke("new", str(folder), "--machine", "h200-sxm-x8", "--gpus", str(expect[0]), "--name", "q1")
    assert one.code == 0, one.output


def test_a_shard_count_is_refused_up_front_for_a_model_without_heads(here: Path) -> None:
    # deepseek-v3 (MLA) declares no head counts: only its expert shards decide the count
    model = yaml.safe_load((CATALOG / "deepseek-v3.yaml").read_text())
    inter = model["moe_intermediate_size"]["value"]
    assert inter % 6
    result = invoke("new", "deepseek-v3", "--machine", "h200-sxm-x8", "--gpus", "6")
    assert result.code == 2, result.output
    assert result.stderr.startswith(f"error: field '--gpus': moe_intermediate_size {inter} is not divisible by 6 "
                                    "GPUs: vLLM asserts intermediate_size % tp_size == 0")
    expect = [n for n in range(1, 9) if inter % n == 0]
    assert result.stderr.rstrip().endswith(f"vLLM boots deepseek-v3 on {', '.join(map(str, expect))} GPUs")
    assert not (here / "recipes").exists()


def test_the_ledger_refuses_what_new_refuses(here: Path) -> None:
    folder, config = _odd_heads(here)
    from recipegen.fit.source import resolve_model
    from recipegen.ledger.parallel import booting_counts, parallel_problems

    model = resolve_model(str(folder)).model
    assert booting_counts(model, 8) == [n for n in range(1, 9) if _boots(config, n)]
    assert [m[:len("moe_intermediate_size")] for m, _ in parallel_problems(model, 5)] == ["moe_intermediate_size"]
    assert parallel_problems(model, 5, expert_parallel=True) == []   # whole experts per rank: no shard
    # a recipe on 5 GPUs (drafted at 1, its lane widened by hand): the ledger's [parallel] says the same
    assert invoke("new", str(folder), "--machine", "h200-sxm-x8", "--gpus", "1", "--name", "q5").code == 0
    path = here / "recipes" / "q5.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["lanes"][0]["gpus"] = [0, 1, 2, 3, 4]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    check = invoke("check", "budgets", "recipes/q5.yaml")
    assert check.code != 0
    assert f"OVER BUDGET [parallel]: {parallel_problems(model, 5)[0][0]}\n" in check.stdout


def test_without_gpus_a_count_vllm_cannot_boot_names_the_counts_that_boot(here: Path) -> None:
    folder, config = _odd_heads(here)
    expect = [n for n in range(1, 9) if _boots(config, n)]
    assert not _boots(config, 8)
    result = invoke("new", str(folder), "--machine", "h200-sxm-x8")
    assert result.code == 1, result.output
    assert "[parallel] 8 GPUs and 5 KV heads" in result.stdout
    line = next(x for x in result.stdout.splitlines() if x.startswith("  smallest change that would: "))
    assert line == ("  smallest change that would: a GPU count vLLM boots q at: "
                    + " or ".join(f"--gpus {n}" for n in expect)
                    + "; on this lane's 8 GPUs every placement fails on [parallel], which no memory changes")
    assert "more GPU memory" not in result.stdout


def test_a_recipe_drafted_for_another_lane_size_says_so_before_force_would_change_it(here: Path) -> None:
    assert invoke("new", "gpt-oss-20b", "--machine", "h200-sxm-x8", "--gpus", "2").code == 0
    recipe = here / "recipes" / "gpt-oss-20b-h200-sxm-x8.yaml"
    before = recipe.read_bytes()
    plain = invoke("new", "gpt-oss-20b", "--machine", "h200-sxm-x8")
    assert plain.code == 2
    assert plain.stderr == ("error: recipes/gpt-oss-20b-h200-sxm-x8.yaml: exists, drafted for another lane size: 2 GPUs "
                            "per lane (this one: 8, every GPU of the machine, without --gpus); draft this one under "
                            "another name (--name, or -o another file), or pass --force to overwrite it\n")
    one = invoke("new", "gpt-oss-20b", "--machine", "h200-sxm-x8", "--gpus", "1")
    assert "drafted for another lane size: 2 GPUs per lane (this one: 1, --gpus);" in one.stderr
    assert recipe.read_bytes() == before
    # the same count again is the plain refusal
    again = invoke("new", "gpt-oss-20b", "--machine", "h200-sxm-x8", "--gpus", "2")
    assert again.stderr == ("error: recipes/gpt-oss-20b-h200-sxm-x8.yaml: exists; pass --force to overwrite "
                            "(or -o another file)\n")
