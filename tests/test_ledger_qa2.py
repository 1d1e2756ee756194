"""What a sweep of every command over the catalog found, the ledger's and the speed line's side:

* finding 4: a comparison column whose KV pool is below zero prints no negative size: "none — X short",
  with the offload it is priced at named, and --json says fits / shortfall beside the signed figure;
* finding 6: the lane object of `check budgets --json` carries the name the text prints;
* finding 12: bytes-per-token figures say so in --json;
* finding 3: a tensor-parallel lane's speed line says the all-reduces are not counted and the band
  comes from one-GPU lanes, and --json says the same.

Expected values are read from the ledger's operands and the recipe, not from the printing code."""

from __future__ import annotations

import json
import re
from pathlib import Path

from cli_support import invoke
from test_fit import project  # a copy of a shipped recipe with its maps and profiles

from recipegen.common.units import GiB
from recipegen.ledger import compute_ledger
from recipegen.load.recipe import load_recipe


def _cli(*args: str) -> tuple[int, str]:
    result = invoke(*args)
    return result.code, result.output


# ------------------------------------------------------------------ finding 4

LOAD_GIB = 48  # the lane fits (usage-aware); vLLM's flag alone at 48 GiB keeps more experts in HBM than leave KV


def _short_offload(tmp_path: Path) -> Path:
    """The reference GB300 lane loading with --cpu-offload-gb 48 instead of 60."""
    return project(tmp_path, "dsv41-flash-gb300", edit=lambda t: re.sub(
        r"load_cpu_offload: 60 GiB", f"load_cpu_offload: {LOAD_GIB} GiB", t, count=1))


def _positional_shortfall_gib(path: Path) -> float:
    """cap − reserve − the positional placement's hot experts (− workspace), from the operands, negated."""
    lane = compute_ledger(load_recipe(path)).lanes[0]
    ops = lane.positional.figures["hbm.kv_pool"].operands
    left = ops["hbm_cap_bytes"] - ops["reserve_bytes"] - ops["hot_experts_bytes"] - ops.get("runtime_workspace_bytes", 0)
    assert left < 0   # the case under test
    return -left / GiB


def test_a_positional_column_without_kv_prints_its_shortfall_not_a_negative_size(tmp_path: Path) -> None:
    path = _short_offload(tmp_path)
    short = _positional_shortfall_gib(path)
    code, out = _cli("check", "budgets", str(path))
    assert code == 0, out
    header = next(l for l in out.splitlines() if "(this lane)" in l)
    assert f"positional at --cpu-offload-gb {LOAD_GIB} (the lane's load offload)" in header
    pool_row = next(l for l in out.splitlines() if l.strip().startswith("KV pool / GPU"))
    assert f"none — {short:.2f} GiB short" in pool_row and "-" not in pool_row.replace("—", ""), pool_row
    tokens_row = next(l for l in out.splitlines() if l.strip().startswith("KV tokens"))
    assert tokens_row.rstrip().endswith("none (0 × max_model_len)"), tokens_row
    line = next(l for l in out.splitlines() if "does not fit" in l)
    assert f"its KV pool (none — {short:.2f} GiB short) holds no max_model_len sequence" in line
    assert "price positional at the least --cpu-offload-gb that fits" in line   # why `new` may say it fits


def test_explain_prints_the_shortfall_not_a_negative_pool(tmp_path: Path) -> None:
    path = _short_offload(tmp_path)
    short = _positional_shortfall_gib(path)
    code, out = _cli("check", "budgets", str(path), "--explain")
    assert code == 0, out
    assert f"[positional] KV pool (per GPU) = none — {short:.2f} GiB short" in out
    assert not re.search(r"KV pool \(per GPU\) = -", out)


def test_json_keeps_the_signed_pool_and_says_fits_and_shortfall(tmp_path: Path) -> None:
    path = _short_offload(tmp_path)
    short = _positional_shortfall_gib(path)
    code, out = _cli("check", "budgets", str(path), "--json")
    assert code == 0, out
    lane = json.loads(out)["recipes"][0]["lanes"][0]
    pos, ua = lane["positional"], lane["usage_aware"]
    assert abs(pos["figures"]["hbm.kv_pool"]["gib"] + short) < 1e-9          # the number is kept
    assert pos["fits"] is False and abs(pos["kv_pool_shortfall_gib"] - short) < 1e-9
    assert abs(pos["kv_pool_shortfall_bytes"] - short * GiB) < 1
    assert ua["fits"] is True and ua["kv_pool_shortfall_bytes"] == 0


def test_a_column_that_fits_keeps_its_pool_figure() -> None:
    code, out = _cli("check", "budgets", "dsv41-flash-gb300")
    assert code == 0, out
    lane = compute_ledger(load_recipe("dsv41-flash-gb300")).lanes[0]
    pool = lane.positional.figures["hbm.kv_pool"].value
    assert pool > 0
    assert "positional at --cpu-offload-gb 60 (the lane's load offload)" in out
    assert f"{pool / GiB:,.2f} GiB" in next(l for l in out.splitlines() if l.strip().startswith("KV pool / GPU"))
    assert "GiB short" not in out and "does not fit" not in out


# ------------------------------------------------------------------ finding 6

def test_the_lane_object_names_the_placement_as_the_text_does() -> None:
    for recipe in ("deepseek-v3.2-h200x8", "gpt-oss-120b-l40s", "dsv41-flash-gb300"):
        lane = compute_ledger(load_recipe(recipe)).lanes[0]
        expected = "all in HBM" if not any(lane.active.cold_per_layer) else lane.placement
        code, out = _cli("check", "budgets", recipe, "--json")
        assert code == 0, out
        got = json.loads(out)["recipes"][0]["lanes"][0]
        assert got["placement"] == lane.placement and got["placement_label"] == expected, recipe
        code, text = _cli("check", "budgets", recipe)
        assert next(l for l in text.splitlines() if l.startswith("lane ")).endswith(f" · {expected}")
        code, plan = _cli("plan", recipe, lane.lane, "--json")
        assert code == 0 and json.loads(plan)["estimate"]["placement_label"] == expected, recipe
    # the DeepSeek-V3.2 lane is declared positional at 0 GiB: the case the finding is about
    assert compute_ledger(load_recipe("deepseek-v3.2-h200x8")).lanes[0].placement == "positional"


# ------------------------------------------------------------------ finding 12

def test_bytes_per_token_figures_are_not_counts() -> None:
    code, out = _cli("check", "budgets", "gpt-oss-120b-l40s", "--json")
    assert code == 0, out
    figs = json.loads(out)["recipes"][0]["lanes"][0]["figures"]
    per_token = [k for k in figs if k.endswith("bytes_per_token")]
    assert "kv.lane_bytes_per_token" in per_token and any(k.startswith("kv.layers[") for k in per_token)
    for key in per_token:
        assert figs[key]["unit"] == "bytes/token", key
    lane = figs["kv.lane_bytes_per_token"]
    ops = lane["operands"]
    assert lane["value"] == ops["bytes_per_sequence"] / ops["max_model_len"] * ops["tp"]


# ------------------------------------------------------------------ finding 3

def test_a_tensor_parallel_speed_line_says_what_it_leaves_out() -> None:
    recipe = "deepseek-v3.2-h200x8"
    gpus = len(load_recipe(recipe).recipe.lanes[0].gpus)
    assert gpus > 1
    caveat = f"the all-reduces between the {gpus} GPUs are not counted and the band was measured on one-GPU lanes"
    code, out = _cli("check", "budgets", recipe)
    assert code == 0, out
    speed = next(l for l in out.splitlines() if l.startswith("decode speed estimate · "))
    short = f"validated on one-GPU lanes; all-reduces between the {gpus} GPUs not counted"
    assert re.search(r"\(band [0-9,–]+ " + re.escape(short) + r"\)", speed), speed
    code, out = _cli("check", "budgets", recipe, "--json")
    assert json.loads(out)["recipes"][0]["lanes"][0]["estimate"]["tensor_parallel_caveat"] == caveat
    code, out = _cli("plan", recipe, "chat", "--json")
    assert json.loads(out)["estimate"]["tensor_parallel_caveat"] == caveat


def test_a_one_gpu_speed_line_has_no_caveat() -> None:
    assert len(load_recipe("gpt-oss-120b-l40s").recipe.lanes[0].gpus) == 1
    code, out = _cli("check", "budgets", "gpt-oss-120b-l40s")
    assert code == 0 and "all-reduce" not in out and "one-GPU lanes" not in out
    code, out = _cli("check", "budgets", "gpt-oss-120b-l40s", "--json")
    assert json.loads(out)["recipes"][0]["lanes"][0]["estimate"]["tensor_parallel_caveat"] is None


def test_new_and_compare_speed_lines_carry_the_tensor_parallel_caveat(tmp_path: Path) -> None:
    caveat = "the all-reduces between the 8 GPUs are not counted and the band was measured on one-GPU lanes"
    out_file = tmp_path / "q8.yaml"
    code, out = _cli("new", "qwen3-30b-a3b", "--machine", "h100-sxm-x8", "-o", str(out_file), "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["chosen"]["speed"]["tensor_parallel_caveat"] == caveat, doc["chosen"]["speed"]
    assert "validated on one-GPU lanes; all-reduces between the 8 GPUs not counted" in doc["chosen"]["speed"]["text"]
    code, out = _cli("new", "qwen3-30b-a3b", "--machine", "h100-pcie", "-o", str(tmp_path / "q1.yaml"), "--json")
    assert code == 0, out
    one = json.loads(out)["chosen"]["speed"]
    assert one["tensor_parallel_caveat"] is None and "all-reduce" not in one["text"]


def test_the_tensor_parallel_note_names_mla_only_for_an_mla_model(tmp_path: Path) -> None:
    code, out = _cli("check", "budgets", "deepseek-v3.2-h200x8")   # MLA (DeepSeek sparse attention), TP 8
    assert code == 0 and "an MLA latent on every GPU" in out and "KV heads max(1" not in out
    grouped = tmp_path / "q8.yaml"                                # grouped-query attention, TP 8
    code, out = _cli("new", "qwen3-30b-a3b", "--machine", "h100-sxm-x8", "-o", str(grouped))
    assert code == 0, out
    code, out = _cli("check", "budgets", str(grouped))
    assert code == 0 and "KV heads max(1, heads // TP)" in out, out
    assert "MLA" not in out   # neither the note nor the footer's explanation of it


def test_a_load_peak_that_leaves_no_room_for_the_cuda_context_is_over_budget() -> None:
    # Qwen3-VL on an RTX 5090 at --cpu-offload-gb 27 peaked at 31.26 of the 31.35 GiB CUDA can allocate
    # (32,607 − 500 MiB) without the context: less than the 768 MiB the worker holds before the weights load.
    loaded = load_recipe("qwen3-vl-30b-a3b-rtx5090")
    lane = loaded.recipe.lanes[0]
    loaded.recipe.lanes[0] = lane.model_copy(update={"offload": lane.offload.model_copy(
        update={"load_cpu_offload": 27 * GiB})})
    ledger = compute_ledger(loaded).lane("chat")
    peak = ledger.fig("load.hbm_peak")
    cap = (32607 - 500) * 2**20
    assert peak.operands["cuda_context_bytes"] == 768 * 2**20
    assert peak.value - 768 * 2**20 < cap < peak.value          # fits without the context, not with it
    assert [v.kind for v in ledger.violations] == ["load-hbm"]
    committed = compute_ledger(load_recipe("qwen3-vl-30b-a3b-rtx5090")).lane("chat")
    assert committed.ok and committed.fig("load.hbm_peak").value <= cap
