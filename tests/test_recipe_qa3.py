"""What a fuzz of recipes found: extra_args that render refuses are refused by
`check recipe` too (one rule, `recipegen.ledger.flags.rendered_flag_problems`), a
--max-num-batched-tokens below --max-num-seqs is refused at load (vLLM 0.33 config/scheduler.py:331-336),
and a recipe value's newline is escaped in the error message."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import invoke

RECIPE = "qwen3-30b-a3b-rtx4090"
BASE_ARGS = "extra_args: [--cpu-offload-params, experts]"


def with_extra_args(project: Path, items: str) -> Path:
    path = project / "recipes" / f"{RECIPE}.yaml"
    text = path.read_text()
    assert text.count(BASE_ARGS) == 1
    path.write_text(text.replace(BASE_ARGS, f"extra_args: [--cpu-offload-params, experts, {items}]"))
    return path


@pytest.mark.parametrize("items, flag", [
    ('-tp, "2"', "-tp"),
    ('--max-model-len, "99999"', "--max-model-len"),
    ('"--port=9"', "--port"),
    ('--gpu-memory-utilization, "0.99"', "--gpu-memory-utilization"),
    ('--cpu-offload-gb, "0"', "--cpu-offload-gb"),
    ('--max_model_len, "4096"', "--max_model_len"),
])
@pytest.mark.parametrize("command", [("check", "recipe"), ("check", "budgets"), ("render",)])
def test_render_owned_flags_in_extra_args_are_refused_by_every_command(
        project: Path, items: str, flag: str, command: tuple[str, ...]) -> None:
    path = with_extra_args(project, items)
    result = invoke(*command, str(path.relative_to(project)))
    assert result.code == 2, result.output
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "extra_args:" in text)
    assert f"{RECIPE}.yaml:{line}: field 'lanes[0].extra_args[2]': {flag} is rendered from the recipe's " \
           "own fields" in result.output
    assert not (project / "compose").exists()


def test_underscore_spelling_of_max_num_seqs_is_read_as_vllm_reads_it(project: Path) -> None:
    """vLLM 0.33's FlexibleArgumentParser turns `_` into `-` in flag names
    (utils/argparse_utils.py:373-391): `--max_num_seqs 99` is --max-num-seqs, which extra_args may set."""
    path = with_extra_args(project, '--max_num_seqs, "99"')
    rel = str(path.relative_to(project))
    for command in (("check", "recipe"), ("check", "budgets")):
        result = invoke(*command, rel)
        assert result.code == 0, result.output
    result = invoke("render", rel)
    assert result.code == 0, result.output
    assert "not a `vllm serve` flag" not in result.output
    compose = (project / "compose" / RECIPE / "compose.yaml").read_text()
    assert '"--max_num_seqs"' in compose and '"--max-num-seqs"' not in compose


@pytest.mark.parametrize("items, seqs, source", [
    ('--max-num-batched-tokens, "1"', 2, "concurrency.max"),
    ('--max-num-batched-tokens, "64", --max-num-seqs, "65"', 65, "--max-num-seqs in extra_args"),
    ('"--max_num_batched_tokens=1", --no-enable-chunked-prefill', 2, "concurrency.max"),
])
@pytest.mark.parametrize("command", [("check", "recipe"), ("check", "budgets"), ("render",)])
def test_batched_tokens_below_max_num_seqs_is_refused(project: Path, items: str, seqs: int, source: str,
                                                     command: tuple[str, ...]) -> None:
    path = with_extra_args(project, items)
    result = invoke(*command, str(path.relative_to(project)))
    assert result.code == 2, result.output
    assert "field 'lanes[0].extra_args[2]': --max-num-batched-tokens" in result.output
    assert f"is below --max-num-seqs {seqs} ({source})" in result.output
    assert "config/scheduler.py:331-336" in result.output


def test_batched_tokens_equal_to_max_num_seqs_passes(project: Path) -> None:
    path = with_extra_args(project, '--max-num-batched-tokens, "2048", --max-num-seqs, "2048"')
    result = invoke("check", "recipe", str(path.relative_to(project)))
    assert result.code == 0, result.output


def test_newline_in_a_path_value_is_escaped_in_the_message(project: Path) -> None:
    path = project / "recipes" / f"{RECIPE}.yaml"
    text = path.read_text()
    old = "rowmap: maps/qwen3-30b-a3b/chat.rowmap"
    assert text.count(old) == 1
    path.write_text(text.replace(old, 'rowmap: "maps/qwen3-30b-a3b/chat.rowmap\\n        x: 1"'))
    result = invoke("check", "recipe", str(path.relative_to(project)))
    assert result.code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "file not found: maps/qwen3-30b-a3b/chat.rowmap\\u000a        x: 1 (resolved to" in result.output
