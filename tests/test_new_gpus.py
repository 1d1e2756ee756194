"""`recipegen new MODEL --machine M --gpus N`: the lane on GPUs 0..N-1 (tensor parallel N) instead
of every GPU of the machine. `new` took all eight GPUs of an 8-GPU machine even for a model one GPU
holds, with no way to ask for fewer; a count vLLM cannot boot the model at is refused up front with
the counts it can."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from cli_support import invoke


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
