"""The committed recipes for public models: each checks green, and the runtime's refusal of a lane
it cannot split is named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from recipegen.common.units import GiB
from recipegen.ledger import compute_ledger
from recipegen.load.recipe import load_recipe

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["gpt-oss-120b-l40s", "qwen3-30b-a3b-rtx4090", "qwen3-235b-a22b-fp8-h200"])
def test_recipe_is_green(name: str) -> None:
    ledger = compute_ledger(load_recipe(REPO / "recipes" / f"{name}.yaml"))
    assert ledger.ok, [v.message for v in ledger.violations]
    assert ledger.lanes[0].fig("kv.full_sequences").value >= 1


def test_gpt_oss_window_layers_make_room_on_48_gb() -> None:
    lane = compute_ledger(load_recipe(REPO / "recipes" / "gpt-oss-120b-l40s.yaml")).lanes[0]
    # 18 full layers x 2048 B x 131,072 + 18 sliding layers x 2048 B x 128 per sequence.
    assert lane.fig("kv.bytes_per_sequence").value == 18 * 2048 * 131072 + 18 * 2048 * 128
    # Every layer at full length would be 9 GiB a sequence: the pool would hold one, not two.
    assert lane.fig("hbm.kv_pool").value // (36 * 2048 * 131072) == 1
    assert lane.fig("kv.full_sequences").value == 2


def test_gpt_oss_usage_aware_passes_the_runtime_check_with_a_caveat_off_hopper() -> None:
    # gpt-oss's MXFP4 experts (biases, SwiGLU-OAI) are in the runtime's capability table; on an
    # L40S (compute capability 8.9) the split was not verified, which the lane says as a note.
    from recipegen.ledger import compute_lane
    from recipegen.schema.lane import Offload
    loaded = load_recipe(REPO / "recipes" / "gpt-oss-120b-l40s.yaml")
    recipe = loaded.recipe
    lane = recipe.lanes[0].model_copy(update={"offload": Offload(
        placement="usage-aware", hot_experts_per_layer=50, load_cpu_offload="38 GiB")})
    got = compute_lane(recipe.model, recipe.machines["box"], lane)
    assert not [v for v in got.violations if v.kind == "runtime"]
    assert any("mxfp4 split is not verified on compute capability 8.9" in str(n) for n in got.notes)


def test_qwen3_235b_tp8_replicates_kv_heads() -> None:
    # Qwen3-235B-A22B at TP=8 on a DGX H200: 4 KV heads -> 1 per GPU (replicated), 94 layers:
    # 2 * 1 * 128 * 2 B * 94 = 48,128 B per token per GPU.
    from recipegen.catalog import catalog_entry
    from recipegen.ledger import compute_lane
    from recipegen.schema import Lane, Machine, Model
    model = Model.model_validate(catalog_entry("models", "qwen3-235b-a22b"))
    machine = Machine.model_validate(catalog_entry("machines", "h200-sxm-x8"))
    lane = Lane.model_validate({
        "name": "l", "machine": "m", "gpus": list(range(8)), "port": 8000, "image": "vllm/vllm-openai:v0.33.0",
        "kv_cache_bytes": "100 GiB", "max_model_len": 32768, "concurrency": {"max": 8},
        "offload": {"placement": "positional", "load_cpu_offload": "0 GiB"},
        "reserves": {"hbm": {"value": "10 GiB", "source": "test"}}})
    got = compute_lane(model, machine, lane)
    assert got.fig("kv.tokens").value == pytest.approx(100 * GiB / 48_128)   # 2.23M, not 4.46M


def _variant(tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = (REPO / "recipes" / f"{name}.yaml").read_text()
    assert old in text
    for folder in ("maps", "profiles"):  # the recipe's row maps, at the same relative paths
        shutil.copytree(REPO / "recipes" / folder, tmp_path / folder)
    path = tmp_path / "variant.yaml"
    path.write_text(text.replace(old, new).replace(f"name: {name}", "name: variant"))
    return path


def test_qwen3_235b_fp8_on_the_125_gib_h200_box_is_red_at_load(tmp_path: Path) -> None:
    # On h200-pcie (125.87 GiB host) the 107 GiB --cpu-offload-gb the HBM needs pins every offloaded
    # parameter at the next power of two: per layer w13 = 128 x 3072 x 4096 B = 1.5 GiB -> 2 GiB,
    # w2 0.75 GiB -> 1 GiB (+ small scales), so the load needs far more host than the box has.
    path = _variant(tmp_path, "qwen3-235b-a22b-fp8-h200", "catalog: h200-sxm-x8", "catalog: h200-pcie")
    path.write_text(path.read_text().replace("load_cpu_offload: 116 GiB", "load_cpu_offload: 107 GiB")
                    .replace("value: 64 GiB", "value: 12 GiB"))
    ledger = compute_ledger(load_recipe(path))
    kinds = {v.kind for v in ledger.violations}
    assert "load-host" in kinds
    assert ledger.lanes[0].fig("load.host_peak").value > 47 * 3 * GiB   # >= 47 whole layers at 3 GiB pinned


def test_qwen3_30b_on_a_64_gib_desktop_is_red_at_load(tmp_path: Path) -> None:
    path = _variant(tmp_path, "qwen3-30b-a3b-rtx4090", "value: 96 GiB", "value: 64 GiB")
    ledger = compute_ledger(load_recipe(path))
    assert [v.kind for v in ledger.violations] == ["load-host"]
