"""`recipegen new`, `recipegen compare`, and the estimated / declared reserves they print."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from cli_support import invoke

from recipegen.common import glossary

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "hf_configs"
GiB, MiB = 2**30, 2**20


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_new_from_the_catalog_writes_a_fitted_recipe_check_passes(here: Path) -> None:
    result = invoke("new", "qwen3-30b-a3b", "--machine", "rtx-5090")
    assert result.code == 0, result.stdout + result.stderr
    path = here / "recipes" / "qwen3-30b-a3b-rtx-5090.yaml"
    doc = yaml.safe_load(path.read_text())
    lane = doc["lanes"][0]
    assert doc["model"] == "qwen3-30b-a3b" and doc["machines"] == {"rtx-5090": "rtx-5090"}
    assert lane["max_model_len"] == 40960                     # the model's full context fits
    assert lane["gpu_memory_utilization"] == 0.92             # vLLM 0.33's default
    assert lane["reserves"] == {"hbm": {"estimated": True}, "host": {"estimated": True}}
    assert lane["offload"]["placement"] == "usage-aware" and lane["active_class"] == "chat"
    assert "hot_experts_per_layer" in lane["offload"]
    assert (here / "recipes" / lane["classes"]["chat"]["rowmap"]).is_file()
    result = invoke("check", "budgets", str(path))
    assert result.code == 0 and "(estimated from the model and machine" in result.stdout
    result = invoke("fit", str(path))                      # new called the same function
    assert result.code == 0 and "unchanged: the recipe already holds this fit" in result.stdout
    result = invoke("new", "qwen3-30b-a3b", "--machine", "rtx-5090")
    assert result.code == 2 and "--force" in result.stderr


def test_new_from_a_local_checkpoint_writes_its_model_file(here: Path) -> None:
    result = invoke("new", str(FIX / "qwen3-30b-a3b"), "--machine", "h200-pcie", "--max-model-len", "32K")
    assert result.code == 0, result.stdout + result.stderr
    doc = yaml.safe_load((here / "recipes" / "qwen3-30b-a3b-h200-pcie.yaml").read_text())
    assert doc["model"] == {"file": "models/qwen3-30b-a3b.yaml"}
    assert doc["lanes"][0]["max_model_len"] == 32768
    assert "offload" not in doc["lanes"][0]          # all in HBM: the section that would say nothing is left out
    result = invoke("check", "budgets", str(here / "recipes" / "qwen3-30b-a3b-h200-pcie.yaml"))
    assert result.code == 0
    assert "GPU 0 · all in HBM\n" in result.stdout and "all in HBM (this lane)" in result.stdout   # as `new` said
    model = yaml.safe_load((here / "recipes" / "models" / "qwen3-30b-a3b.yaml").read_text())
    assert model["routed_experts"]["value"] == 128


def test_new_writes_nothing_when_nothing_fits(here: Path) -> None:
    result = invoke("new", "kimi-k2-instruct", "--machine", "rtx-4090")
    assert result.code == 1, result.stdout + result.stderr
    assert "nothing fits" in result.stdout and not (here / "recipes").exists()


def test_new_from_a_local_checkpoint_leaves_no_folder_when_nothing_fits(here: Path) -> None:
    result = invoke("new", str(FIX / "kimi-k2-instruct"), "--machine", "rtx-4090")
    assert result.code == 1, result.stdout + result.stderr
    assert "nothing fits" in result.stdout and not (here / "recipes").exists()


def test_a_context_the_model_refuses_names_the_option_not_an_unwritten_file(here: Path) -> None:
    # Qwen3-30B-A3B's max_position_embeddings is 40,960; 128K = 131,072 tokens
    result = invoke("new", "qwen3-30b-a3b", "--machine", "rtx-5090", "--max-model-len", "128K",
                    "-o", str(here / "fresh.yaml"))
    assert result.code == 2, result.stderr
    assert result.stderr.startswith("error: field '--max-model-len': max_model_len 131,072 exceeds"), result.stderr
    assert "fresh.yaml" not in result.stderr and not (here / "fresh.yaml").exists()


def test_new_refuses_what_it_cannot_read(here: Path) -> None:
    result = invoke("new", "not a model", "--machine", "rtx-4090")
    assert result.code == 2 and "field 'MODEL'" in result.stderr
    assert "catalog models (`recipegen model list` describes them):" in result.stderr
    result = invoke("new", "qwen3-30b-a3b", "--machine", "no-such-box")
    assert result.code == 2 and "field '--machine'" in result.stderr


def test_a_hub_id_of_a_catalog_checkpoint_is_the_catalog_entry(here: Path) -> None:
    result = invoke("new", "Qwen/Qwen3-30B-A3B", "--machine", "rtx-5090", "--name", "q")
    assert result.code == 0, result.stdout + result.stderr
    assert "is the catalog's qwen3-30b-a3b" in result.stdout
    assert yaml.safe_load((here / "recipes" / "q.yaml").read_text())["model"] == "qwen3-30b-a3b"


def test_compare_tabulates_each_machine(here: Path) -> None:
    result = invoke("new", "deepseek-v3", "--machine", "h200-sxm-x8", "--name", "dsv3")
    assert result.code == 0, result.stderr
    before = {p: p.read_bytes() for p in (here / "recipes").rglob("*") if p.is_file()}
    result = invoke("compare", "dsv3", "--machines", "h200-sxm-x8,h100-sxm-x8,rtx-4090", "--json")
    assert result.code == 0, result.stderr
    rows = {r["machine"]: r for r in json.loads(result.stdout)["machines"]}
    assert rows["h200-sxm-x8"]["chosen"]["placement"] == "all in HBM"
    assert rows["h100-sxm-x8"]["chosen"]["placement"] == "usage-aware"
    assert rows["rtx-4090"]["fits"] is False and rows["rtx-4090"]["suggestion"]
    result = invoke("compare", "dsv3", "--machines", "h200-sxm-x8,h100-sxm-x8,rtx-4090")
    lines = result.stdout.splitlines()
    assert lines[1].split()[:4] == ["machine", "GPUs", "host", "fits"]
    assert any(line.strip().startswith("rtx-4090") and " no " in line for line in lines)
    # the usage-aware row's "(load N GiB)" is explained in the same output, under the table
    assert re.search(r"usage-aware \(load \d+ GiB\)", result.stdout)
    notes = result.stdout.split(glossary.HEADING, 1)[1].splitlines()
    load = [line for line in notes if line.strip().startswith("load N GiB:")]
    assert load and "--cpu-offload-gb" in load[0] and "load_cpu_offload" in load[0] and "per GPU" in load[0]
    assert {p: p.read_bytes() for p in (here / "recipes").rglob("*") if p.is_file()} == before  # writes nothing


# ------------------------------------------------------------------ reserves as printed

# load_cpu_offload 31 GiB (30 until the RTX 5090's 500 MiB driver reservation left the 2,048-token KV 0.15 GiB short)
RESERVE_RECIPE = """version: 1
name: r
model: qwen3-30b-a3b
machines:
  box: rtx-5090
lanes:
  - name: chat
    machine: box
    gpus: [0]
    port: 8000
    image: vllm/vllm-openai:v0.33.0
    gpu_memory_utilization: 0.92
    max_model_len: 2048
    concurrency: {{max: 1}}
    offload: {{placement: positional, load_cpu_offload: 31 GiB}}
    extra_args: [--cpu-offload-params, experts]
    reserves:
      hbm: {hbm}
      host: {host}
"""


@pytest.mark.parametrize("hbm, label", [
    ("{value: 5 GiB, source: guess}", "(declared, not marked measured)"),
    ("{value: 5 GiB, basis: assumed, source: guess}", "(assumed)"),
    ("{value: 5 GiB, basis: measured, source: 'measured on the box, recipegen verify'}", "(measured)"),
])
def test_measured_only_where_the_reserve_says_so(tmp_path: Path, hbm: str, label: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(RESERVE_RECIPE.format(hbm=hbm, host="{value: 8 GiB, source: guess}"))
    result = invoke("check", "budgets", str(path))
    assert result.code == 0, result.stdout
    line = next(x for x in result.stdout.splitlines() if "HBM / GPU:" in x)
    assert f"reserve 5.00 GiB {label}" in line
    assert "reserve 8.00 GiB (declared, not marked measured)" in result.stdout
    if "guess" in hbm and "measured" not in label:
        assert "(measured)" not in result.stdout


def test_estimated_reserves_by_hand(tmp_path: Path) -> None:
    """Qwen3-30B-A3B on the RTX 5090, plain vLLM: dense 3,082,186,752 B (catalog) + vLLM's fused-MoE
    workspace at 2,048 batched tokens (the default below 70 GiB): 2,048 × top-8 × (max(768, 2,048) +
    max(1,536, 2,048)) × 2 B + a 2 GiB allowance; host: 8 GiB + 4 GiB for the one GPU."""
    path = tmp_path / "r.yaml"
    path.write_text(RESERVE_RECIPE.format(hbm="{estimated: true}", host="{estimated: true}"))
    result = invoke("check", "budgets", str(path), "--json")
    assert result.code == 0, result.stdout + result.stderr
    fig = json.loads(result.stdout)["recipes"][0]["lanes"][0]["figures"]
    moe = 2048 * 8 * (2048 + 2048) * 2
    assert fig["hbm.reserve"]["value"] == 3_082_186_752 + moe + 2 * GiB
    assert fig["hbm.reserve"]["note"].startswith("estimated")
    assert fig["host.reserve"]["value"] == 8 * GiB + 4 * GiB
    result = invoke("check", "budgets", str(path))
    assert "(estimated from the model and machine" in result.stdout
    assert "+ reserve 12.00 GiB (estimated)" in result.stdout
    # usage-aware: the runtime computes the experts, so vLLM's fused-MoE workspace is not there
    ua = RESERVE_RECIPE.format(hbm="{estimated: true}", host="{estimated: true}").replace(
        "{placement: positional, load_cpu_offload: 31 GiB}",
        "{placement: usage-aware, hot_experts_per_layer: 128, load_cpu_offload: 0 GiB}")
    path.write_text(ua)
    result = invoke("check", "budgets", str(path), "--json")
    fig = json.loads(result.stdout)["recipes"][0]["lanes"][0]["figures"]
    assert fig["hbm.reserve"]["value"] == 3_082_186_752 + moe + 2 * GiB   # every expert hot: plain vLLM
    path.write_text(ua.replace("hot_experts_per_layer: 128, load_cpu_offload: 0 GiB",
                               "hot_experts_per_layer: 100, load_cpu_offload: 30 GiB"))
    (tmp_path / "r.yaml").write_text(path.read_text())
    from recipegen.ledger import compute_lane
    from recipegen.load.recipe import load_recipe_model

    recipe = load_recipe_model(path).recipe
    lane = compute_lane(recipe.model, recipe.machines["box"], recipe.lanes[0])
    assert lane.fig("hbm.reserve").value == 3_082_186_752 + 2 * GiB


def test_a_reserve_needs_a_source_unless_estimated(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(RESERVE_RECIPE.format(hbm="{value: 5 GiB}", host="{estimated: true}"))
    result = invoke("check", "recipe", str(path))
    assert result.code == 2 and "reserves.hbm.source" in result.stderr
    path.write_text(RESERVE_RECIPE.format(hbm="{estimated: true, value: 5 GiB}", host="{estimated: true}"))
    result = invoke("check", "recipe", str(path))
    assert result.code == 2 and "exactly one of value, back_solved_from and estimated" in result.stderr


def test_a_machine_file_name_cannot_add_to_the_recipe(here: Path) -> None:
    """A machine file whose name holds a newline and YAML: the recipe's header comment stays one
    comment, and the recipe holds exactly the keys `new` writes."""
    from recipegen.catalog import catalog_entry

    name = "box\nversion: 2\nevil: true.yaml"
    entry = catalog_entry("machines", "h200-pcie")
    entry["name"] = "box"
    (here / name).write_text(yaml.safe_dump(entry))
    result = invoke("new", "qwen3-30b-a3b", "--machine", name, "--name", "n")
    assert result.code == 0, result.stdout + result.stderr
    text = (here / "recipes" / "n.yaml").read_text()
    doc = yaml.safe_load(text)
    assert set(doc) == {"version", "name", "description", "model", "machines", "lanes"} and doc["version"] == 1
    assert all(line.startswith("#") for line in text.split("version: 1")[0].splitlines() if line.strip())


def test_when_only_a_shorter_context_and_a_bigger_host_together_fit_both_are_named(here: Path) -> None:
    """Llama-4-Scout (10,485,760 tokens of context, ~200 GiB of bf16 experts) on one H200 with
    126 GiB of host memory: no context fits this host, and no host makes the full context fit (its
    KV alone exceeds HBM). The suggestion names both changes; each alone still fails, both together fit."""
    from recipegen.catalog import catalog_entry

    model = str(FIX / "llama-4-scout-17b-16e-instruct")
    result = invoke("new", model, "--machine", "h200-pcie", "--json")
    assert result.code == 1, result.stdout + result.stderr
    suggestion = json.loads(result.stdout)["suggestion"]
    assert suggestion.startswith("both a shorter context and a bigger host"), suggestion
    length = int(suggestion.split("--max-model-len ")[1].split(")")[0])
    need = int(suggestion.split("at least ")[1].split(" GiB")[0])
    assert length % 1024 == 0 and length < 10_485_760 and need > 126

    entry = catalog_entry("machines", "h200-pcie")
    entry["name"] = "roomy"
    entry["host_memory"] = {"value": f"{need} GiB", "source": "the suggestion's figure"}
    (here / "roomy.yaml").write_text(yaml.safe_dump(entry))
    small = dict(entry, name="small", host_memory={"value": f"{need - 1} GiB", "source": "one GiB less"})
    (here / "small.yaml").write_text(yaml.safe_dump(small))
    tried = {
        "shorter context alone": ("h200-pcie", str(length)),
        "bigger host alone": ("roomy.yaml", "10485760"),
        "both, one GiB of host short": ("small.yaml", str(length)),
        "both": ("roomy.yaml", str(length)),
    }
    codes = {what: invoke("new", model, "--machine", machine, "--max-model-len", context, "--force", "--json").code
             for what, (machine, context) in tried.items()}
    assert codes == {"shorter context alone": 1, "bigger host alone": 1, "both, one GiB of host short": 1,
                     "both": 0}
