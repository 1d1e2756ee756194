"""Lanes over several machines: vLLM's layer split, schema refusals, per-machine ledger of the
two-Station recipe (figures recomputed here from the seeds' numbers), the all-HBM verdicts, the
per-stage cost model, row-map slices and the per-node launch flags."""

from __future__ import annotations

import ast
import json
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cli_support import invoke
from vllm033_source import vllm033_source

from recipegen.common.errors import InputError
from recipegen.common.units import GiB
from recipegen.ledger import compute_ledger
from recipegen.load.recipe import load_recipe
from recipegen.multinode.launch import lane_launches, node_args, node_env
from recipegen.multinode.partition import PartitionError, stage_layers, vllm_partition

REPO = Path(__file__).resolve().parents[1]
RECIPE = "dsv41-flash-gb300x2-pp2"
E = 18_800_640                      # bytes per DSv4.1-Flash expert (team interface 2)


# ------------------------------------------------------------------ vLLM's layer split

def _vllm_get_pp_indices(partition_env: str | None = None) -> Any:
    """vLLM 0.33.0's own get_pp_indices, compiled from its source (no vLLM import needed)."""
    source = vllm033_source("distributed/utils.py")
    if source is None:
        pytest.skip("vLLM 0.33.0 source not unpacked (scripts/fetch-vllm033-source.sh)")
    utils = source / "distributed" / "utils.py"
    tree = ast.parse(utils.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_pp_indices")
    namespace: dict[str, Any] = {
        "envs": SimpleNamespace(VLLM_PP_LAYER_PARTITION=partition_env),
        "logger": SimpleNamespace(info=lambda *a, **k: None)}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(utils), "exec"), namespace)
    return namespace["get_pp_indices"]


@pytest.mark.parametrize("layers", [2, 3, 7, 40, 41, 61, 62, 95])
@pytest.mark.parametrize("pp", [1, 2, 3, 4, 8])
def test_partition_is_vllms_own_rule(layers: int, pp: int) -> None:
    if pp > layers:
        with pytest.raises(PartitionError):
            vllm_partition(layers, pp)
        return
    get_pp_indices = _vllm_get_pp_indices()
    ours = stage_layers(layers, list(range(layers)), pp)
    assert [(s.start, s.end) for s in ours] == [get_pp_indices(layers, r, pp) for r in range(pp)]


def test_uneven_split_goes_to_the_stages_before_the_last() -> None:
    assert vllm_partition(41, 4) == [10, 10, 11, 10]
    assert vllm_partition(62, 4) == [15, 16, 16, 15]   # counted back from the one before last
    assert vllm_partition(40, 2) == [20, 20]


def test_declared_partition_like_vllm_env() -> None:
    get_pp_indices = _vllm_get_pp_indices("10,30")
    ours = stage_layers(40, list(range(1, 40)), 2, [10, 30])
    assert [(s.start, s.end) for s in ours] == [get_pp_indices(40, r, 2) for r in range(2)]
    assert ours[0].moe_layers == tuple(range(1, 10))     # layer 0 not MoE here
    with pytest.raises(PartitionError, match="sum to 41"):
        stage_layers(40, list(range(40)), 2, [11, 30])


# ------------------------------------------------------------------ schema refusals

def _named(text: str, name: str) -> str:
    """A recipe copy declares the name of the file it is written to (`name` must be the file's stem)."""
    renamed, count = re.subn(r"^name: .*$", f"name: {name}", text, count=1, flags=re.M)
    assert count == 1
    return renamed


def _write_variant(tmp_path: Path, old: str, new: str) -> Path:
    text = (REPO / "recipes" / f"{RECIPE}.yaml").read_text()
    assert old in text, old
    path = tmp_path / "recipes" / "variant.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_named(text.replace(old, new), "variant"))
    return path


STAGES = """        - {machine: station-a, gpus: [0], all_experts_in_hbm: true}
        - {machine: station-b, gpus: [0], all_experts_in_hbm: true}"""


@pytest.mark.parametrize("old,new,field,message", [
    (STAGES, "\n".join(reversed(STAGES.splitlines())),
     "lanes[0].parallel.pipeline[0]", "stage 0 runs on the lane's own machine"),
    (STAGES, STAGES.replace("station-b, gpus: [0]", "station-a, gpus: [0]").replace(
        "- {machine: station-a, gpus: [0], all", "- {machine: station-a, gpus: [0], all", 1),
     "lanes[0].parallel.pipeline[1].machine", "already runs stage 0"),
    (STAGES, STAGES.replace("station-b, gpus: [0]", "station-b, gpus: [0, 1]"),
     "lanes[0].parallel.pipeline", "same number of GPUs"),
    (STAGES, STAGES.replace("station-b, gpus: [0]", "station-c, gpus: [0]"),
     "lanes[0].parallel.pipeline[1].machine", "unknown machine 'station-c'"),
    (STAGES, STAGES.replace("station-b, gpus: [0]", "station-b, gpus: [1]"),
     "lanes[0].parallel.pipeline[1].gpus[0]", "GPU id 1 does not exist"),
    ("      master_port: 29501", "      master_port: 29501\n      layer_partition: [20, 21]",
     "lanes[0].parallel.layer_partition", "sum to 41"),
    ("      master_port: 29501", "      master_port: 30006", "lanes[0].parallel.master_port",
     "is the lane's API port"),
    ("    address: 10.0.0.2", "    address: 10.0.0.1", "lanes[0].parallel.pipeline[1].machine",
     "same address"),
    ("      master_port: 29501", "      master_port: 29501\n      layer_partition: [40]",
     "lanes[0].parallel.layer_partition", "1 entries for 2 pipeline stages"),
])
def test_bad_multinode_recipes_name_file_line_field(tmp_path: Path, old: str, new: str, field: str,
                                                    message: str) -> None:
    path = _write_variant(tmp_path, old, new)
    with pytest.raises(InputError) as info:
        load_recipe(path)
    err = info.value
    assert err.field == field, str(err)
    assert message in str(err)
    assert err.line is not None and err.file is not None
    # The CLI prints it without a traceback and exits 2.
    result = invoke("check", "recipe", str(path))
    assert result.code == 2 and "Traceback" not in result.output


def test_host_tables_in_hbm_needs_host_tables(tmp_path: Path) -> None:
    text = (REPO / "recipes" / f"{RECIPE}.yaml").read_text()
    start, end = text.index("  host_tables:\n"), text.index("machines:\n")
    text = text[:start] + "  host_tables: []\n" + text[end:]
    text = text.replace("      master_port: 29501", "      master_port: 29501\n      host_tables_in_hbm: true")
    path = tmp_path / "recipes" / "variant.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(_named(text, "variant"))
    with pytest.raises(InputError) as info:
        load_recipe(path)
    assert info.value.field == "lanes[0].parallel.host_tables_in_hbm"
    assert "declares no host tables" in str(info.value)


def test_usage_aware_lane_with_every_expert_hot_needs_no_class() -> None:
    lane = load_recipe(RECIPE).recipe.lanes[0]
    assert lane.offload.hot_experts_per_layer == 384 and not lane.classes


# ------------------------------------------------------------------ the two-Station ledger

@pytest.fixture(scope="module")
def ledger() -> Any:
    return compute_ledger(load_recipe(RECIPE)).lane("agent")


def test_one_ledger_per_machine_with_the_stage_layers(ledger: Any) -> None:
    assert [s.machine for s in ledger.stages] == ["station-a", "station-b"]
    assert [(s.layers.start, s.layers.end) for s in ledger.stages] == [(0, 20), (20, 40)]
    assert [s.role for s in ledger.stages] == ["head", "worker"]
    for stage in ledger.stages:
        assert stage.ledger.fig("hbm.hot_experts").value == 20 * 384 * E    # 134.47 GiB
        assert stage.ledger.active.cold_per_layer == [0] * 20


def test_stage_reserve_and_kv_recomputed_from_the_seeds(ledger: Any) -> None:
    cap = 250.7 * GiB * 0.97                                   # 243.18 GiB
    whole_reserve = cap - 295 * 40 * E - 4.9 * GiB             # 31.67 GiB (docs/design.md)
    rest = whole_reserve - 16.9 * GiB                          # activations, graphs, drafter
    stage_reserve = rest + 16.9 * GiB / 2
    for stage in ledger.stages:
        assert stage.figures["stage.hbm_reserve"].value == pytest.approx(stage_reserve, abs=1)
        pool = cap - stage_reserve - 20 * 384 * E
        assert stage.ledger.fig("hbm.kv_pool").value == pytest.approx(pool, abs=2)
        # KV per token for 20 of 40 layers: twice the tokens per GiB of the whole model.
        assert stage.ledger.fig("kv.tokens").value == pytest.approx(pool / GiB * 0.518e6 * 2, rel=1e-6)
    assert round(stage_reserve / GiB, 2) == 23.22
    assert ledger.fig("kv.tokens").value == min(s.ledger.fig("kv.tokens").value for s in ledger.stages)
    assert ledger.ok


def test_host_ledger_per_machine(ledger: Any) -> None:
    a, b = ledger.stages
    # Both Engram tables belong to early layers (1, 15): stage 0's machine holds them.
    assert a.tables == ["engram-0", "engram-1"] and b.tables == []
    # v14 pinned 9 MXFP4 layers as 8 + 0.5 + 4 + 0.25 GiB each (docs/ledger.md 'Load time')
    reserve = 432 * GiB - 9 * 12.75 * GiB - 189.2 * GiB       # 128.05 GiB per machine
    assert a.ledger.fig("host.total").value == pytest.approx(189.2 * GiB + reserve, abs=2)
    assert b.ledger.fig("host.total").value == pytest.approx(reserve, abs=2)


def test_all_hbm_verdicts_and_recommendation(ledger: Any) -> None:
    tables_too, experts_only = ledger.layouts
    assert not tables_too.fits and experts_only.fits
    cap = 250.7 * GiB * 0.97
    # Every weight incl. Engram + each GPU's reserve exceeds both caps: no layer split can fit it.
    need = 268.95 * GiB + 189.2 * GiB + 2 * (cap - 295 * 40 * E - 4.9 * GiB - 16.9 * GiB) + 16.9 * GiB
    assert tables_too.weights_and_reserves == pytest.approx(need, rel=1e-3)
    assert tables_too.hbm_cap == pytest.approx(2 * cap, abs=2)
    assert not tables_too.any_split_fits
    assert round((need - 2 * cap) / GiB, 1) == 18.2
    assert ledger.recommendation.startswith("recommended: every expert in HBM, host tables in host")
    assert "no layer split fits it" in ledger.recommendation


def test_check_budgets_prints_per_machine_and_lane_summary() -> None:
    result = invoke("check", "budgets", RECIPE)
    assert result.code == 0, result.output
    out = result.output
    assert "machine station-a · stage 0 (head)" in out and "machine station-b · stage 1 (worker)" in out
    assert "lane summary: pipeline 2 × tensor parallel 1" in out
    assert "cost model: stage 1 (station-b) at 1 stream, k=5: 0.0 MB from host per step" in out
    data = json.loads(invoke("check", "budgets", RECIPE, "--json").output)
    lane = data["recipes"][0]["lanes"][0]
    assert lane["multinode"] and [s["machine"] for s in lane["stages"]] == ["station-a", "station-b"]
    assert lane["layouts"][0]["fits"] is False and lane["layouts"][1]["fits"] is True


def _mixed_recipe(tmp_path: Path) -> Path:
    """The two-Station recipe with stage 1 offloading 89 experts per layer (the v15 row maps)."""
    import shutil

    path = _write_variant(tmp_path, "hot_experts_per_layer: 384      # every routed expert in HBM: no "
                          "row map, no residency runtime",
                          "hot_experts_per_layer: 295\n      load_cpu_offload: 60 GiB")
    text = path.read_text().replace(
        "        - {machine: station-b, gpus: [0], all_experts_in_hbm: true}",
        "        - {machine: station-b, gpus: [0]}").replace("    parallel:\n", textwrap.indent(
            "classes:\n  agent: {rowmap: maps/dsv41-flash/agent.rowmap, histogram: "
            "profiles/dsv41-flash/agent.hist}\nactive_class: agent\nparallel:\n", "    "))
    path.write_text(text)
    for folder in ("maps", "profiles"):
        shutil.copytree(REPO / "recipes" / folder, path.parent / folder)
    return path


def test_offloading_stage_uses_its_map_slice_and_is_told_all_hbm_fits(tmp_path: Path) -> None:
    from expert_residency.formats import load_rowmap

    loaded = load_recipe(_mixed_recipe(tmp_path))
    lane = compute_ledger(loaded).lane("agent")
    rowmap = load_rowmap(REPO / "recipes/maps/dsv41-flash/agent.rowmap")
    a, b = lane.stages
    assert a.ledger.active.cold_per_layer == [0] * 20
    assert b.ledger.active.cold_per_layer == rowmap.cold_counts()[20:] == [89] * 20
    assert b.ledger.fig("host.cold_experts").value == 20 * 89 * E
    assert lane.fig("lane.host.cold_experts").value == 20 * 89 * E
    assert "set all_experts_in_hbm: true on stage(s) 1 (station-b)" in lane.recommendation

    from recipegen.costmodel.lane import lane_cold_shares
    from recipegen.costmodel.stages import stage_fetch
    fetch = {(f.rank, f.streams): f for f in stage_fetch(loaded, lane)}
    assert fetch[(0, 1)].cold_bytes_per_step == 0.0
    # Stage 1 reads its own layers' cold picks: unique experts × per-layer cold share × bytes.
    share = lane_cold_shares(loaded, loaded.recipe.lanes[0], lane)["agent"]
    from recipegen.costmodel.lane import unique_model_for
    unique = unique_model_for(loaded.recipe.model).unique(5, 1)
    expected = sum(unique * s * E for s in share.per_layer[20:])
    assert fetch[(1, 1)].cold_bytes_per_step == pytest.approx(expected, rel=1e-12)
    assert fetch[(1, 1)].fetch_ms == pytest.approx(expected / 340e9 * 1e3, rel=1e-12)


# ------------------------------------------------------------------ slices and launch flags

def test_rowmap_slice_keeps_rows_and_records_its_source() -> None:
    from expert_residency.formats import load_rowmap, parse_rowmap

    from recipegen.multinode.slices import slice_rowmap, slice_text

    full = load_rowmap(REPO / "recipes/maps/dsv41-flash/agent.rowmap")
    sliced, data = slice_text(full, list(range(20, 40)), stage=1, source="agent.rowmap")
    assert sliced.moe_layer_indices == tuple(range(20, 40))
    assert sliced.hot == full.hot[20:] and sliced.cold == full.cold[20:]
    assert sliced.provenance["sliced_from_content_hash"] == full.content_hash()
    assert parse_rowmap(data.decode()).content_hash() == sliced.content_hash() != full.content_hash()
    with pytest.raises(ValueError, match="no MoE layer 40"):
        slice_rowmap(full, [39, 40], stage=1)


def test_node_launch_flags_and_environment() -> None:
    loaded = load_recipe(RECIPE)
    head, worker = lane_launches(loaded.recipe, loaded.recipe.lanes[0])
    assert head.args == ("--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", "0",
                         "--master-addr", "10.0.0.1", "--master-port", "29501",
                         "--distributed-executor-backend", "mp")
    assert worker.args[-1] == "--headless" and worker.args[5] == "1"
    assert dict(worker.env) == {"VLLM_HOST_IP": "10.0.0.2", "VLLM_PP_LAYER_PARTITION": "20,20"}
    assert node_args(pp=3, rank=2, master_addr="h", master_port=1)[5] == "2"
    assert node_env(host_ip="x", stages=stage_layers(3, [1, 2], 2, [1, 2]))[1] == (
        "VLLM_PP_LAYER_PARTITION", "1,2")


def test_launch_flags_parse_in_vllm_033() -> None:
    """Every flag the nodes add exists in vLLM 0.33's `vllm serve` (the committed flag table)."""
    from recipegen.vllm_flags import TARGET_VLLM_VERSION, argv_problems, load_flag_table

    table = load_flag_table(TARGET_VLLM_VERSION)
    for rank in (0, 1):
        argv = ["--model", "m"] + node_args(pp=2, rank=rank, master_addr="10.0.0.1", master_port=29501)
        assert argv_problems(argv, table) == []


def test_machine_checks_count_each_stage_on_its_own_machine(tmp_path: Path) -> None:
    """A single-machine lane beside the worker stage on station-b: host memory and the GPU are
    shared with stage 1, not with the head machine."""
    import shutil

    path = _write_variant(tmp_path, "    parallel:\n", "    parallel:\n")
    one_station = (REPO / "recipes" / "dsv41-flash-gb300.yaml").read_text()
    lane = one_station[one_station.index("  - name: agent"):].replace("name: agent", "name: batch", 1) \
        .replace("machine: station", "machine: station-b", 1).replace("port: 30006", "port: 30007", 1)
    path.write_text(path.read_text() + lane)
    for folder in ("maps", "profiles"):
        shutil.copytree(REPO / "recipes" / folder, path.parent / folder)
    ledger = compute_ledger(load_recipe(path))
    kinds = {(v.kind, v.machine) for v in ledger.machine_violations}
    # 128.05 GiB (stage 1) + 189.2 + 62.3 + 128.05 GiB (the batch lane) > 494 GiB on station-b.
    assert ("machine-host", "station-b") in kinds
    assert ("gpu-shared", "station-b") in kinds          # 0.97 + 0.97 on GPU 0
    assert not any(m == "station-a" for _, m in kinds)
