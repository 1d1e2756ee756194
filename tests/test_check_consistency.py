"""`check recipe`, `check budgets` and `render` say the same thing about one recipe:

* a flag a multi-node launch writes (`recipegen.multinode.launch.launch_flags`) is refused in
  `extra_args` at load, by every command, with the message `render` gives;
* a refused `--kv-cache-dtype` is reported once per lane;
* counts print in the right number ("1 stream", "4 streams");
* the tensor-parallel caveat of `check budgets --json` is the estimate's own, and agrees with the
  text line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from cli_support import invoke

from recipegen.common.units import format_count
from recipegen.costmodel.lane_estimate import tp_caveat
from recipegen.ledger.flags import RENDERED_FROM_FIELDS, canonical
from recipegen.load.recipe import load_recipe
from recipegen.multinode.launch import host_table_args, launch_flags, node_args

PIPELINE = "dsv41-flash-gb300x2-pp2"     # two GB300 Stations, pipeline parallel 2
SINGLE = "qwen3-30b-a3b-rtx4090"         # one machine, one GPU
SINGLE_ARGS = "extra_args: [--cpu-offload-params, experts]"
TENSOR_PARALLEL = "deepseek-v3.2-h200x8"  # one machine, TP 8
COMMANDS = [("check", "recipe"), ("check", "budgets"), ("render",)]


def edit(project: Path, recipe: str, old: str, new: str) -> Path:
    """The project's copy of `recipe` with `old` (once in it) replaced by `new`."""
    path = project / "recipes" / f"{recipe}.yaml"
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))
    return path


def pipeline_with_extra_args(project: Path, items: str, *, host_tables_in_hbm: bool) -> Path:
    """The pipeline recipe with `extra_args: [items]` (it has none) and `host_tables_in_hbm` set."""
    edit(project, PIPELINE, "      master_port: 29501",
         f"      master_port: 29501\n      host_tables_in_hbm: {str(host_tables_in_hbm).lower()}")
    return edit(project, PIPELINE, "    parallel:\n", f"    extra_args: [{items}]\n    parallel:\n")


def error_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("error: "))


# ------------------------------------------------------------------ launch flags at load

@pytest.mark.parametrize("items, flag, field, host_tables_in_hbm", [
    ("--distributed-executor-backend, mp", "--distributed-executor-backend", "parallel.pipeline", False),
    ("--distributed-executor-backend=mp", "--distributed-executor-backend", "parallel.pipeline", True),
    ("--engram-config, '{\"cpu_offload\": false}'", "--engram-config", "parallel.host_tables_in_hbm", True),
])
def test_a_launch_flag_in_a_pipeline_lanes_extra_args_is_refused_alike_by_every_command(
        project: Path, items: str, flag: str, field: str, host_tables_in_hbm: bool) -> None:
    path = pipeline_with_extra_args(project, items, host_tables_in_hbm=host_tables_in_hbm)
    rel = str(path.relative_to(project))
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "extra_args:" in text)
    expected = (f"error: {rel}:{line}: field 'lanes[0].extra_args[0]': {flag} is rendered from the recipe's "
                f"own fields ({field}); change those instead of repeating it in extra_args")
    for command in COMMANDS:
        result = invoke(*command, rel)
        assert result.code == 2, (command, result.output)
        assert error_line(result.output) == expected, (command, result.output)
    assert not (project / "compose").exists()


@pytest.mark.parametrize("flag", ["--nnodes", "--pipeline-parallel-size"])
def test_a_launch_flag_the_ledger_also_leaves_unbudgeted_is_refused_once(project: Path, flag: str) -> None:
    """On a pipeline lane `--nnodes` is both a launch flag and, elsewhere, a flag the ledger does not
    budget; the item gets the launch flag's message only, not a second one."""
    path = pipeline_with_extra_args(project, f"{flag}, '2'", host_tables_in_hbm=False)
    result = invoke("check", "recipe", str(path.relative_to(project)))
    assert result.code == 2, result.output
    at_item = [line for line in result.output.splitlines() if "'lanes[0].extra_args[0]'" in line]
    assert len(at_item) == 1, result.output
    assert f"{flag} is rendered from the recipe's own fields (parallel.pipeline)" in at_item[0]


@pytest.mark.parametrize("recipe, config", [
    ("dsv41-flash-gb300", '{"cpu_offload": false}'),   # one machine: no field places the tables in HBM
    (PIPELINE, "{}"),                                    # a pipeline lane with host_tables_in_hbm unset
])
def test_engram_config_in_extra_args_is_refused_on_every_lane(project: Path, recipe: str, config: str) -> None:
    """--engram-config moves a model's Engram tables (189.2 GiB for DeepSeek-V4.1) between host and
    HBM; the ledger reads their place only from parallel.host_tables_in_hbm, so the flag is refused
    in extra_args on every lane, not only where the launch writes it."""
    path = project / "recipes" / f"{recipe}.yaml"
    text = path.read_text()
    anchor = "    parallel:\n" if recipe == PIPELINE else "    reserves:\n"
    assert text.count(anchor) == 1 and "extra_args:" not in text
    path.write_text(text.replace(anchor, f"    extra_args: [--engram-config, '{config}']\n{anchor}"))
    rel = str(path.relative_to(project))
    for command in COMMANDS:
        result = invoke(*command, rel)
        assert result.code == 2, (command, result.output)
        error = error_line(result.output)
        assert "field 'lanes[0].extra_args[0]'" in error and "--engram-config" in error
    assert not (project / "compose").exists()


def test_a_single_node_lane_may_name_the_executor_backend(project: Path) -> None:
    """No launch writes it on one machine, so `render` passes it through, and `check recipe` agrees."""
    path = edit(project, SINGLE, SINGLE_ARGS,
                "extra_args: [--cpu-offload-params, experts, --distributed-executor-backend, mp]")
    rel = str(path.relative_to(project))
    for command in COMMANDS:
        result = invoke(*command, rel)
        assert result.code == 0, (command, result.output)
    compose = yaml.safe_load((project / "compose" / SINGLE / "compose.yaml").read_text())
    argv = compose["services"]["lane-chat"]["command"]
    assert argv.count("--distributed-executor-backend") == 1


def test_launch_flags_are_every_ranks_flags_in_canonical_spelling() -> None:
    parallel = load_recipe(PIPELINE).recipe.lanes[0].parallel
    assert parallel is not None
    for hbm in (False, True):
        p = parallel.model_copy(update={"host_tables_in_hbm": hbm})
        written = {a for rank in range(p.pipeline_parallel_size)
                   for a in node_args(pp=p.pipeline_parallel_size, rank=rank, master_addr="10.0.0.1",
                                      master_port=p.master_port) + host_table_args(p)
                   if a.startswith("--")}
        assert set(launch_flags(p)) == written
        assert all(canonical(f) == f for f in written)
        assert ("--engram-config" in written) is hbm
    assert launch_flags(None) == {}


def test_every_flag_a_pipeline_render_writes_is_one_the_loader_refuses(project: Path) -> None:
    """The loader's set (`RENDERED_FROM_FIELDS` and `launch_flags`) covers each flag of a rendered
    pipeline lane, but for the two the render leaves to extra_args when given there. (Its tables in
    HBM would not fit: --engram-config is covered by the two tests above.)"""
    path = project / "recipes" / f"{PIPELINE}.yaml"
    result = invoke("render", str(path.relative_to(project)))
    assert result.code == 0, result.output
    parallel = load_recipe(path).recipe.lanes[0].parallel
    refused = set(RENDERED_FROM_FIELDS) | set(launch_flags(parallel)) | {"--max-num-seqs", "--moe-backend"}
    seen = 0
    for compose in (project / "compose" / PIPELINE).glob("*/compose.yaml"):
        for name, service in yaml.safe_load(compose.read_text())["services"].items():
            if name.startswith("lane-") and not name.endswith("-profile"):
                seen += 1
                flags = {canonical(a) for a in service["command"] if a.startswith("--")}
                assert flags <= refused, (name, flags - refused)
    assert seen == 2


# ------------------------------------------------------------------ a refused KV cache dtype, once

def test_a_refused_kv_cache_dtype_is_reported_once_per_lane(project: Path) -> None:
    path = edit(project, SINGLE, SINGLE_ARGS, "extra_args: [--cpu-offload-params, experts, --kv-cache-dtype, fp8_inc]")
    result = invoke("check", "budgets", str(path.relative_to(project)))
    assert result.code == 1, result.output
    assert result.output.count("Intel Gaudi's fp8 cache") == 1, result.output
    assert result.output.count("refuses to boot this lane") == 1, result.output
    line = next(line for line in result.output.splitlines() if "Intel Gaudi's fp8 cache" in line)
    assert line.startswith("  OVER BUDGET [attention]: --kv-cache-dtype fp8_inc: ")
    assert line.endswith("vLLM refuses to boot this lane (KV counted at the model's dtype)")


# ------------------------------------------------------------------ counts

def test_counts_print_in_the_right_number() -> None:
    assert format_count(1, "stream") == "1 stream"
    assert format_count(4, "stream") == "4 streams"
    assert format_count(0, "stream") == "0 streams"
    assert format_count(2, "copy", "copies") == "2 copies"


def test_no_output_says_stream_s(project: Path) -> None:
    result = invoke("check", "budgets", f"recipes/{PIPELINE}.yaml")
    assert result.code == 0, result.output
    assert "stream(s)" not in result.output
    assert re.search(r"cost model: stage 0 \(station-a\) at 1 stream, k=5", result.output), result.output


# ------------------------------------------------------------------ the tensor-parallel caveat

def test_the_json_caveat_is_the_estimates_and_agrees_with_the_text_line() -> None:
    gpus = len(load_recipe(TENSOR_PARALLEL).recipe.lanes[0].gpus)
    assert gpus > 1
    result = invoke("check", "budgets", TENSOR_PARALLEL)
    assert result.code == 0, result.output
    speed = next(l for l in result.output.splitlines() if l.startswith("decode speed estimate · "))
    said = {int(n) for n in re.findall(r"all-reduces between the (\d+) GPUs not counted", speed)}
    assert said == {gpus} and "validated on one-GPU lanes" in speed, speed
    result = invoke("check", "budgets", TENSOR_PARALLEL, "--json")
    assert result.code == 0, result.output
    caveat = json.loads(result.output)["recipes"][0]["lanes"][0]["estimate"]["tensor_parallel_caveat"]
    assert caveat == tp_caveat(gpus)
    assert f"all-reduces between the {gpus} GPUs are not counted" in caveat and "one-GPU lanes" in caveat
