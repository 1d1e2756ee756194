"""Figures the docs and the recipes' comments quote from recipegen's own output, recomputed here.

Each test runs the command a page names (in-process, through the CLI or the ledger's functions),
takes the figure as the command prints it and asserts the page quotes exactly that text, so a
change to the ledger, the catalog or a recipe that moves a quoted figure fails here instead of
leaving the page stale:

* docs/ledger.md: gpt-oss-120b on the L40S, the runtime workspace of the usage-aware column and
  its worked arithmetic (Marlin-padded geometry);
* docs/parallel.md and recipes/deepseek-v3-fp8-h200x8.yaml: the DeepSeek-V3 reference's KV
  tokens, cold bank and fetch tax;
* docs/models.md and recipes/qwen3-235b-a22b-fp8-h200.yaml: the Qwen3-235B lane's speed warning,
  what `recipegen fit` would choose, its pinned bytes and the H200 PCIe box it does not fit;
* docs/models.md: gpt-oss-120b's KV pool on one H100 with the datasheet's 80 GB read as decimal;
* docs/operations.md: the ledger's prediction for the v15 boot; docs/costmodel.md: the k-schedule
  warnings; BENCHMARKS.md: the one-stream band; docs/render.md: /dev/shm; docs/multinode.md:
  `recipegen k8s`; and every page's code fences closed on lines of their own.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_support import CliResult, invoke
from expert_residency.contract.sizing import small_step_limit

from recipegen.costmodel.lane_estimate import BAND_ONE_STREAM
from recipegen.ledger.workspace import (
    counter_and_mask_bytes,
    expert_geometry,
    kernel_bytes,
    max_num_batched_tokens,
)
from recipegen.load.recipe import load_recipe
from recipegen.render.services import SHM_SIZE

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
RECIPES = REPO / "recipes"


def prose(path: Path) -> str:
    """The page's text with every run of whitespace one space (quotes wrap across lines); for a
    recipe, its comments only (what follows each `#`)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".yaml":
        text = "\n".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)
    return re.sub(r"\s+", " ", text)


def assert_quotes(path: Path, *figures: str) -> None:
    text = prose(path)
    for figure in figures:
        assert figure in text, f"{path.relative_to(REPO)} no longer quotes {figure!r} (the command prints it)"


def cli(*args: str, exit_code: int = 0) -> CliResult:
    result = invoke(*args)
    assert result.code == exit_code, result.output
    return result


def printed(pattern: str, output: str) -> re.Match[str]:
    """The first match of `pattern` in a command's output (the figure as it is printed)."""
    match = re.search(pattern, output)
    assert match, f"the output no longer matches {pattern!r}:\n{output}"
    return match


def test_ledger_quotes_the_l40s_same_budget_workspace_and_its_arithmetic() -> None:
    doc = json.loads(cli("check", "budgets", str(RECIPES / "gpt-oss-120b-l40s.yaml"), "--json").stdout)
    lane_json = doc["recipes"][0]["lanes"][0]
    total = int(lane_json["usage_aware"]["figures"]["hbm.kv_pool"]["operands"]["runtime_workspace_bytes"])
    # The parts from the ledger's own functions: the padded geometry the runtime would size from.
    loaded = load_recipe(str(RECIPES / "gpt-oss-120b-l40s.yaml"))
    model, lane = loaded.recipe.model, loaded.recipe.lane("chat")
    machine = loaded.recipe.machines[lane.machine]
    geometry = expert_geometry(model, machine, lane)
    assert geometry is not None
    hidden, inter = geometry
    tokens = max_num_batched_tokens(machine, lane).value
    parts = kernel_bytes(model, machine, lane, tokens)
    counter = counter_and_mask_bytes(model.num_moe_layers, model.routed_experts, tokens)
    assert parts.fp8_scratch == 0 and parts.workspace + parts.tickets + counter == total
    picks, small = tokens * model.top_k, small_step_limit()
    assert_quotes(
        DOCS / "ledger.md",
        f"gpt-oss-120b on the L40S, {total:,} B",
        f"H {hidden:,} / I {inter:,}",
        f"T = {tokens:,}",
        f"top-{model.top_k}, P = PB = {picks:,}",  # P is a power of two here: PB = P
        f"4·(2·{picks:,} + {picks + 1:,} + {picks:,} + 2) + 8 + 2·{picks:,}·({inter:,} + {hidden:,}) "
        f"= {parts.workspace:,} B",
        f"4·({small} × {model.top_k})·({inter:,} / 64 + {hidden:,} / 128) = {parts.tickets:,} B",
        f"8·{model.num_moe_layers}·{model.routed_experts} + 16·{model.num_moe_layers} + 5·{tokens:,} + 9 "
        f"= {counter:,} B",
    )


def test_the_deepseek_v3_reference_figures_are_quoted_as_printed() -> None:
    out = cli("check", "budgets", "deepseek-v3-fp8-h200x8").output
    kv = printed(r"KV tokens\s+(\S+) tokens", out)[1]
    cold = printed(r"routed experts pinned in host\s+(\S+ GiB)", out)[1]
    one, eight = printed(r"C1 k=0: (\S+ ms)", out)[1], printed(r"C8 k=0: (\S+ ms)", out)[1]
    assert_quotes(DOCS / "parallel.md", f"{cold} of cold experts in host memory, {kv} KV tokens",
                  f"{one} per decode step at one stream, {eight} at eight")
    assert_quotes(RECIPES / "deepseek-v3-fp8-h200x8.yaml", f"all eight ranks ({cold})",
                  f"64 cold per layer = {cold} pinned",
                  f"{one} per decode step at one stream and {eight} at eight")


def test_the_qwen3_235b_recipe_says_what_check_and_fit_print(project: Path) -> None:
    out = cli("check", "budgets", "qwen3-235b-a22b-fp8-h200").output
    warning = printed(r"warning: (estimated .*?\(\S+ tok/s\))", out)[1]
    pins = printed(r"vLLM pins (\S+ GiB)", out)[1]
    fit = printed(r"chose: usage-aware, (\d+ hot / \d+ cold) per layer, --cpu-offload-gb (\d+) at load",
                  cli("fit", "qwen3-235b-a22b-fp8-h200", "--dry-run").output)
    # The H200 PCIe box the recipe's comment is about: the same lane on a copy of the recipe.
    path = project / "recipes" / "qwen3-235b-a22b-fp8-h200.yaml"
    path.write_text(path.read_text().replace("catalog: h200-sxm-x8", "catalog: h200-pcie"))
    pcie = cli("check", "budgets", "qwen3-235b-a22b-fp8-h200", exit_code=1).output
    over, host = printed(r"host memory over by (\S+ GiB)", pcie)[1], printed(r"of (\S+ GiB) \(headroom", pcie)[1]
    peak = printed(r"peak host (\S+ GiB) of", pcie)[1]
    none = cli("fit", "qwen3-235b-a22b-fp8-h200", "--dry-run", exit_code=1).output
    most, least = printed(r"HBM holds at most (\d+) hot per layer.*?needs at least (\d+) hot", none).groups()
    need = printed(r"a host with at least (\d+ GiB) of memory \(usage-aware: (\S+ GiB)", none)
    assert_quotes(DOCS / "models.md", f'warns "{warning}"',
                  f"usage-aware, {fit[1]} per layer, `--cpu-offload-gb {fit[2]}` at load",
                  f"pinned as {pins} at load", f"{host}-host H200 PCIe box", f"host memory over by {over}",
                  f"usage-aware needs {least}+ hot per layer for the host, HBM holds at most {most}",
                  f"at least {need[1]} for usage-aware residency (its load peak, {need[2]}), {peak} for "
                  "this positional lane's load peak")
    assert_quotes(RECIPES / "qwen3-235b-a22b-fp8-h200.yaml", f'warns "{warning}"',
                  f"{fit[1]} per layer with --cpu-offload-gb {fit[2]} at load", f"pin {pins} at load",
                  f"the {host}-host H200 PCIe box", f"the host is over by {over}",
                  f"needs {least}+ hot per layer for the host where HBM holds at most {most}",
                  f"at least {need[1]} for usage-aware residency (its load peak, {need[2]}), {peak} for "
                  "this positional lane's load peak")


# The H100 catalog entry with its datasheet's 80 GB read as decimal (docs/models.md, "Machines").
# The catalog's H100 PCIe with only its memory read off the datasheet as decimal: the driver's
# reserve and every other figure as the catalog has them, so the KV pools differ by the reading alone.
H100_DECIMAL = """\
catalog: h100-pcie
gpus: {hbm: 80 GB}
"""


def test_models_quotes_the_h100_kv_pool_read_in_decimal(project: Path) -> None:
    (project / "h100-80gb.yaml").write_text(H100_DECIMAL)

    def kv_pool(machine: str, out: str) -> dict:
        result = cli("new", "gpt-oss-120b", "--machine", machine, "--name", out, "-o", f"{out}.yaml", "--json")
        return json.loads(result.stdout)["ledger"]["figures"]["hbm.kv_pool"]

    driver, decimal = kv_pool("h100-pcie", "driver"), kv_pool("h100-80gb.yaml", "decimal")
    ratio = driver["value"] / decimal["value"]
    assert_quotes(DOCS / "models.md", f"{80e9 / 2**30:.2f} GiB",
                  f"comes out {ratio:.1f}× too small with it: {decimal['gib']:.2f} GiB instead of "
                  f"{driver['gib']:.2f} GiB")
    assert_quotes(REPO / "README.md", f"left a KV pool of {decimal['gib']:.2f} GiB, one sequence")


def test_operations_quotes_the_ledgers_v15_prediction() -> None:
    doc = json.loads(cli("check", "budgets", str(RECIPES / "dsv41-flash-gb300.yaml"), "--json").stdout)
    figures = doc["recipes"][0]["lanes"][0]["figures"]
    hot, cold = figures["hbm.hot_experts"]["gib"], figures["host.cold_experts"]["gib"]
    assert_quotes(DOCS / "operations.md", f"predicted {hot:.2f} / {cold:.2f} by `recipegen check budgets")


def test_costmodel_quotes_the_warnings_a_k_schedule_draws(project: Path) -> None:
    assert "speculative warning" not in cli("plan", "dsv41-flash-gb300", "agent").output  # a constant k
    path = project / "recipes" / "dsv41-flash-gb300.yaml"
    text = path.read_text()
    assert text.count("      k: 5\n      acceptance:") == 1
    path.write_text(text.replace("      k: 5\n      acceptance:",
                                 "      schedule: [[1, 1, 5], [2, 4, 3], [5, 16, 1]]\n      acceptance:"))
    out = cli("plan", "dsv41-flash-gb300", "agent").output
    boundary = printed(r"speculative warning: (schedule boundaries at batch size [\d, ]+ fall inside the "
                       r"lane's expected concurrency [\d-]+)", out)[1]
    constant = printed(r"(use a constant k=\d+ for this lane)", out)[1]
    assert "piecewise CUDA graphs" in out
    assert_quotes(DOCS / "costmodel.md", "`[[1,1,5],[2,4,3],[5,16,1]]`", boundary, constant)


def test_benchmarks_quotes_the_one_stream_band_the_product_prints() -> None:
    lo, hi = BAND_ONE_STREAM
    assert_quotes(REPO / "BENCHMARKS.md", f"[{lo:.2f}, {hi:.2f}] since run ER")
    assert_quotes(DOCS / "costmodel.md", f"[{lo:.2f}, {hi:.2f}]")


def test_render_doc_sizes_dev_shm_only_for_kubernetes() -> None:
    # ipc: host shares the host's /dev/shm (tests/test_render.py: no shm_size in compose).
    text = prose(DOCS / "render.md")
    assert f"`shm_size: {SHM_SIZE}`" not in text
    assert_quotes(DOCS / "render.md", f"as a {SHM_SIZE.removesuffix('gb')} Gi memory `emptyDir`")


def test_multinode_doc_runs_recipegen_k8s() -> None:
    assert "Kubernetes manifests" in cli("k8s", "--help").output  # the root CLI maps it (lazily)
    assert "k8s_cmd" not in prose(DOCS / "multinode.md")


@pytest.mark.parametrize("page", [*sorted(DOCS.glob("*.md")), REPO / "README.md", REPO / "DEVELOPMENT.md",
                                  REPO / "BENCHMARKS.md"], ids=lambda p: p.name)
def test_code_fences_stand_on_lines_of_their_own(page: Path) -> None:
    # Text after a closing fence keeps the block open to the end of the page.
    lines = [(n, line) for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1) if "```" in line]
    for n, line in lines:
        assert re.fullmatch(r"\s*```[\w+-]*", line), f"{page.name}:{n}: text beside a code fence: {line!r}"
    assert len(lines) % 2 == 0, f"{page.name}: an unclosed code fence"


def test_models_quotes_the_qwen3_vl_load_peak_and_its_context_allowance() -> None:
    doc = json.loads(cli("check", "budgets", str(RECIPES / "qwen3-vl-30b-a3b-rtx5090.yaml"), "--json").stdout)
    figures = doc["recipes"][0]["lanes"][0]["figures"]
    peak, capacity = figures["load.hbm_peak"], figures["hbm.capacity"]
    context_gib = peak["operands"]["cuda_context_bytes"] / 2**30
    assert_quotes(DOCS / "models.md", f"the load peaks at {peak['gib']:.2f} of the {capacity['gib']:.2f} GiB CUDA "
                  f"can allocate ({context_gib:.2f} GiB of it the CUDA context")
