"""`recipegen fit`: the search's boundary against hand arithmetic, the write-back (comments kept, maps
beside it, a second fit writing nothing), the placements, nothing-fits and bad input, through the
real CLI root on copies of the shipped recipes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from cli_support import invoke
from expert_residency.formats import load_histogram, load_rowmap, save_histogram

REPO = Path(__file__).resolve().parent.parent
GiB, MiB = 2**30, 2**20


def project(tmp_path: Path, recipe: str, *, edit=None) -> Path:
    """A copy of a shipped recipe (and every map and profile) in a project of its own."""
    root = tmp_path / "recipes"
    for sub in ("maps", "profiles"):
        for src in (REPO / "recipes" / sub).rglob("*"):
            if src.is_file():
                dst = root / sub / src.relative_to(REPO / "recipes" / sub)
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(src.read_bytes())
    text = (REPO / "recipes" / f"{recipe}.yaml").read_text()
    if edit is not None:
        text = edit(text)
    path = root / f"{recipe}.yaml"
    path.write_text(text)
    return path


# ------------------------------------------------------------------ the boundary, by hand

def test_usage_aware_boundary_is_hand_arithmetic(tmp_path: Path) -> None:
    """Qwen3-30B-A3B on the RTX 4090 recipe (24,564 MiB as the driver reports it, of which the driver
    keeps 485 MiB: CUDA's total, which the utilisation 0.92 multiplies, is 24,079 MiB; assumed reserve
    5.5 GiB): the largest hot count per layer that leaves one 32,768-token sequence of KV, by hand."""
    recipe = project(tmp_path, "qwen3-30b-a3b-rtx4090")
    result = invoke("fit", str(recipe), "--dry-run", "--json")
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    cap = (24564 - 485) * MiB * 0.92              # CUDA's total: nvidia-smi's less driver_reserved
    reserve = 5.5 * GiB
    # the runtime's start-up workspace (docs/ledger.md): P = 2,048 batched tokens × top-8 = 16,384 picks,
    # PB = 16,384; 4·(2·PB + P + 1 + P + 2) + 8 + 2·P·(I 768 + H 2,048), plus the counter and step masks
    # 8·48·128 + 16·48 + 5·2,048 + 9
    picks = 2048 * 8
    workspace = 4 * (2 * picks + picks + 1 + picks + 2) + 8 + 2 * picks * (768 + 2048) + 8 * 48 * 128 + 16 * 48 + 5 * 2048 + 9
    one_sequence = 32768 * 98304                  # 48 layers × 2 × 4 KV heads × 128 × 2 B per token = 3 GiB
    per_hot = 48 * 9_437_184                      # one more hot expert in every MoE layer
    hot = math.floor((cap - reserve - workspace - one_sequence) / per_hot)
    assert hot == 30                              # 31 before the driver's 485 MiB were subtracted
    chosen = doc["chosen"]
    assert chosen["placement"] == "usage-aware" and chosen["hot_experts_per_layer"] == hot
    assert chosen["boundary"].startswith(f"one more hot expert per layer ({hot + 1}) breaks [kv]")
    assert chosen["kv_full_sequences"] == 1
    # the load offload: the smallest whole GiB whose load-time HBM peak fits — one GiB less does not
    offload = chosen["load_cpu_offload_gib"]
    for gib, want_ok in ((offload, True), (offload - 1, False)):
        text = recipe.read_text().replace("hot_experts_per_layer: 20 ", f"hot_experts_per_layer: {hot} ") \
            .replace("load_cpu_offload: 37 GiB", f"load_cpu_offload: {gib} GiB")
        trial = recipe.with_name(f"trial-{gib}.yaml")
        trial.write_text(text.replace("maps/qwen3-30b-a3b/chat.rowmap", "maps/trial.rowmap")
                         .replace("\nname: qwen3-30b-a3b-rtx4090\n", f"\nname: trial-{gib}\n"))  # the file's name
        result = invoke("rowmap", "build", str(tmp_path / "recipes/profiles/qwen3-30b-a3b/chat.hist"),
                        "--hot", str(hot), "-o", str(tmp_path / "recipes/maps/trial.rowmap"))
        assert result.code == 0, result.stderr
        result = invoke("check", "budgets", str(trial))
        assert (result.code == 0) == want_ok, result.stdout
        if not want_ok:
            assert "OVER BUDGET [load-hbm]" in result.stdout


def test_min_sequences_moves_the_boundary(tmp_path: Path) -> None:
    recipe = project(tmp_path, "qwen3-30b-a3b-rtx4090")
    result = invoke("fit", str(recipe), "--min-sequences", "4", "--dry-run", "--json")
    assert result.code == 0, result.stderr
    chosen = json.loads(result.stdout)["chosen"]
    cap, reserve = (24564 - 485) * MiB * 0.92, 5.5 * GiB     # CUDA's total (driver_reserved 485 MiB)
    picks = 2048 * 8
    workspace = 4 * (4 * picks + 3) + 8 + 2 * picks * (768 + 2048) + 8 * 48 * 128 + 16 * 48 + 5 * 2048 + 9
    hot = math.floor((cap - reserve - workspace - 4 * 32768 * 98304) / (48 * 9_437_184))
    assert chosen["hot_experts_per_layer"] == hot == 9   # 10 before driver_reserved
    assert chosen["kv_full_sequences"] >= 4
    assert f"({hot + 1}) breaks [sequences]" in chosen["boundary"]


# ------------------------------------------------------------------ write-back

def test_fit_writes_back_keeps_comments_and_a_second_fit_changes_nothing(tmp_path: Path) -> None:
    recipe = project(tmp_path, "qwen3-30b-a3b-rtx4090")
    before = recipe.read_text()
    result = invoke("fit", str(recipe))
    assert result.code == 0, result.stderr
    after = recipe.read_text()
    comments = [line.strip() for line in before.splitlines() if line.strip().startswith("#")]
    assert comments and all(c in after for c in comments)       # every full-line comment kept
    # 30 hot, by the hand arithmetic of test_usage_aware_boundary_is_hand_arithmetic (CUDA's total)
    assert "hot_experts_per_layer: 30         # fitted: 98 cold per layer" in after
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
    assert [a.split(":")[0].strip() for a, _ in changed] == ["hot_experts_per_layer", "load_cpu_offload"]
    rowmap = load_rowmap(tmp_path / "recipes/maps/qwen3-30b-a3b/chat.rowmap")
    assert rowmap.hot_counts() == [30] * 48 and rowmap.provenance.get("synthetic") is True
    result = invoke("check", "budgets", str(recipe))
    assert result.code == 0, result.stdout
    files = [recipe, tmp_path / "recipes/maps/qwen3-30b-a3b/chat.rowmap"]
    snapshot = [(f.read_bytes(), f.stat().st_mtime_ns) for f in files]
    result = invoke("fit", str(recipe))
    assert result.code == 0, result.stderr
    assert "unchanged: the recipe already holds this fit" in result.stdout
    assert [(f.read_bytes(), f.stat().st_mtime_ns) for f in files] == snapshot


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    recipe = project(tmp_path, "qwen3-30b-a3b-rtx4090")
    before = recipe.read_bytes()
    result = invoke("fit", str(recipe), "--dry-run")
    assert result.code == 0 and "dry run: nothing written" in result.stdout and "would write:" in result.stdout
    assert recipe.read_bytes() == before


def test_a_lane_without_a_profile_gets_the_synthetic_default_and_profile_replaces_it(tmp_path: Path) -> None:
    """gpt-oss-120b on the L40S is positional and has no class: fit finds usage-aware faster, writes the
    synthetic default histogram and the map built from it, both labelled; a measured histogram put in
    its place (what `recipegen profile` writes) is what the next fit builds from."""
    recipe = project(tmp_path, "gpt-oss-120b-l40s")
    result = invoke("fit", str(recipe))
    assert result.code == 0, result.stderr
    doc = yaml.safe_load(recipe.read_text())
    lane = doc["lanes"][0]
    assert lane["offload"]["placement"] == "usage-aware" and lane["active_class"] == "chat"
    cls = lane["classes"]["chat"]
    assert cls["histogram"] == "profiles/gpt-oss-120b-l40s/chat.hist"
    assert "SYNTHETIC default histogram" in cls["description"] and "recipegen profile" in cls["description"]
    hist_path = recipe.parent / cls["histogram"]
    hist = load_histogram(hist_path)
    assert hist.meta.get("synthetic") is True and hist.num_experts == 128 and hist.top_k == 4
    assert "SYNTHETIC default histogram" in result.stdout
    hot = lane["offload"]["hot_experts_per_layer"]
    # a profile: every layer's picks on experts 0..hot-1 (what a count-only boot would have counted)
    hist.counts[:] = 0
    hist.counts[:, :hot] = 1000
    hist.meta = {"class": "chat"}
    hist.source = "count-only profile boot (test)"
    save_histogram(hist, hist_path)
    result = invoke("fit", str(recipe))
    assert result.code == 0, result.stderr
    rowmap = load_rowmap(recipe.parent / cls["rowmap"])
    assert all(ids == list(range(hot)) for ids in rowmap.hot)
    assert not rowmap.provenance.get("synthetic")
    assert "SYNTHETIC" not in result.stdout.split("row map:")[1]


def test_every_expert_in_hbm_is_plain_vllm(tmp_path: Path) -> None:
    """Qwen3-30B-A3B's 54 GiB of experts on the 140.4 GiB H200: all in HBM, written as positional
    with no --cpu-offload-gb; the class keeps its histogram, loses the row-map reference."""
    recipe = project(tmp_path, "qwen3-30b-a3b-rtx4090",
                     edit=lambda t: t.replace("catalog: rtx-4090", "catalog: h200-pcie"))
    result = invoke("fit", str(recipe))
    assert result.code == 0, result.stderr
    assert "chose: all in HBM (no --cpu-offload-gb)" in result.stdout
    doc = yaml.safe_load(recipe.read_text())
    offload = doc["lanes"][0]["offload"]
    assert offload == {"placement": "positional", "load_cpu_offload": "0 GiB"}
    assert "rowmap" not in doc["lanes"][0]["classes"]["chat"]
    assert invoke("check", "budgets", str(recipe)).code == 0


def test_a_gpu_the_runtime_cannot_split_on_gets_positional(tmp_path: Path) -> None:
    """Compute capability 7.5: the runtime's bf16 kernel needs 8.0, so usage-aware is refused (and
    says why) and the smallest whole-GiB positional offload is chosen."""
    recipe = project(tmp_path, "qwen3-30b-a3b-rtx4090", edit=lambda t: t.replace(
        "    catalog: rtx-4090\n", "    catalog: rtx-4090\n    gpus: {compute_capability: '7.5'}\n"))
    result = invoke("fit", str(recipe), "--json")
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["chosen"]["placement"] == "positional"
    refusal = next(r for r in doc["refusals"] if r["placement"] == "usage-aware")
    assert "compute capability 7.5" in refusal["reason"]
    offload = doc["chosen"]["load_cpu_offload_gib"]
    assert doc["chosen"]["boundary"].startswith(f"one GiB less (--cpu-offload-gb {offload - 1}) breaks")
    assert invoke("check", "budgets", str(recipe)).code == 0


# ------------------------------------------------------------------ context

def test_auto_context_takes_the_models_limit_when_it_fits(tmp_path: Path) -> None:
    recipe = project(tmp_path, "qwen3-30b-a3b-rtx4090")
    result = invoke("fit", str(recipe), "--max-model-len", "auto")
    assert result.code == 0, result.stderr
    assert yaml.safe_load(recipe.read_text())["lanes"][0]["max_model_len"] == 40960   # max_position_embeddings
    assert "the model's max_position_embeddings, which fits" in result.stdout


def test_auto_context_below_the_limit_is_the_longest_multiple_of_1024_that_fits(tmp_path: Path) -> None:
    """gpt-oss-120b (131,072 tokens) with the KV of 8 full-length sequences asked for on the L40S:
    the full context does not fit; the chosen one does, 1,024 tokens more does not."""
    recipe = project(tmp_path, "gpt-oss-120b-l40s")
    result = invoke("fit", str(recipe), "--max-model-len", "auto", "--min-sequences", "8", "--dry-run", "--json")
    assert result.code == 0, result.stderr
    length = json.loads(result.stdout)["max_model_len"]
    assert length % 1024 == 0 and length < 131072
    result = invoke("fit", str(recipe), "--max-model-len", str(length), "--min-sequences", "8", "--dry-run")
    assert result.code == 0
    result = invoke("fit", str(recipe), "--max-model-len", str(length + 1024), "--min-sequences", "8", "--dry-run")
    assert result.code == 1 and "smallest change that would: lower max_model_len to" in result.stdout


# ------------------------------------------------------------------ nothing fits, bad input

INLINE = """version: 1
name: {name}
model: {model}
machines:
  box: {machine}
lanes:
  - name: chat
    machine: box
    gpus: [0]
    port: 8000
    image: vllm/vllm-openai:v0.33.0
    gpu_memory_utilization: 0.92
    max_model_len: {length}
    concurrency: {{max: 1}}
    offload: {{placement: positional, load_cpu_offload: 0 GiB}}
    extra_args: [--cpu-offload-params, experts]
    reserves:
      hbm: {hbm}
      host: {{estimated: true}}
"""


def inline(tmp_path: Path, *, model: str, machine: str, length: int, hbm: str = "{estimated: true}") -> Path:
    path = tmp_path / "recipes" / "r.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(INLINE.format(name="r", model=model, machine=machine, length=length, hbm=hbm))
    return path


def test_nothing_fits_exits_1_with_the_smallest_change_and_writes_nothing(tmp_path: Path) -> None:
    """Qwen3-235B-A22B (423 GiB of bf16 experts) on one L40S with 256 GiB of host memory: HBM takes
    a share, the host cannot take the rest — the smallest change is a bigger host, by how much."""
    recipe = inline(tmp_path, model="qwen3-235b-a22b", machine="l40s", length=32768)
    before = recipe.read_bytes()
    result = invoke("fit", str(recipe), "--json")
    assert result.code == 1, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert doc["fitted"] is False and doc["suggestion"].startswith("a host with at least")
    need = int(doc["suggestion"].split("at least ")[1].split(" GiB")[0])
    assert need > 256
    assert recipe.read_bytes() == before
    # the machine with that much host memory: it fits
    bigger = recipe.read_text().replace("box: l40s", f"box: {{catalog: l40s, host_memory: {need} GiB}}")
    recipe.write_text(bigger)
    result = invoke("fit", str(recipe))
    assert result.code == 0, result.stdout + result.stderr


def test_a_reserve_smaller_than_the_dense_weights_is_named(tmp_path: Path) -> None:
    recipe = inline(tmp_path, model="qwen3-235b-a22b", machine="l40s", length=32768,
                    hbm="{value: 7 GiB, basis: assumed, source: a guess}")
    result = invoke("fit", str(recipe))
    assert result.code == 1 and "[reserve]" in result.stdout
    assert "smallest change that would: re-measure the HBM reserve" in result.stdout


@pytest.mark.parametrize("args, field", [
    (["--max-model-len", "lots"], "--max-model-len"),
    (["--max-model-len", "2000000"], "--max-model-len"),
    (["--min-sequences", "0"], "--min-sequences"),
    (["--concurrency", "0"], "--concurrency"),
    (["nolane"], "LANE"),   # the positional argument, as every lane resolver names it
])
def test_bad_input_exits_2_naming_the_field(tmp_path: Path, args: list[str], field: str) -> None:
    recipe = project(tmp_path, "qwen3-30b-a3b-rtx4090")
    before = recipe.read_bytes()
    result = invoke("fit", str(recipe), *args)
    assert result.code == 2 and f"field '{field}'" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert recipe.read_bytes() == before


def test_concurrency_is_written_as_the_lanes_max(tmp_path: Path) -> None:
    recipe = project(tmp_path, "qwen3-30b-a3b-rtx4090")
    result = invoke("fit", str(recipe), "--concurrency", "8", "--min-sequences", "2")
    assert result.code == 0, result.stderr
    lane = yaml.safe_load(recipe.read_text())["lanes"][0]
    assert lane["concurrency"] == {"min": 1, "max": 8}


def test_a_recipe_broken_elsewhere_is_reported_not_fitted(tmp_path: Path) -> None:
    """The lane names a machine the recipe does not have: exit 2 with the line and field."""
    recipe = project(tmp_path, "qwen3-30b-a3b-rtx4090", edit=lambda t: t.replace("machine: desk", "machine: desk2"))
    result = invoke("fit", str(recipe))
    assert result.code == 2 and "lanes[0].machine" in result.stderr and "unknown machine 'desk2'" in result.stderr
    assert "Traceback" not in result.stderr


def test_max_model_len_suffixes_read_as_the_help_says():
    # vLLM's reading of --max-model-len: upper case binary, lower case decimal; the help's examples
    from recipegen.cli.fit_cmd import context_options, parse_context

    examples = {"32768": 32_768, "32K": 32 * 1024, "32k": 32_000, "1M": 1024 ** 2, "1m": 1_000_000}
    assert {text: parse_context(text)[0] for text in examples} == examples

    @context_options
    def probe(**_: object) -> None: ...
    (option,) = [p for p in probe.__click_params__ if p.name == "max_model_len"]
    for text, tokens in examples.items():
        assert text in option.help and (text == "32768" or f"{text} (= {tokens:,})" in option.help)
