"""Host memory per placement, as vLLM 0.33 pins it: a positional lane's host figures count vLLM's
pinned blocks (each parameter rounded up to a power of two by PyTorch's caching host allocator,
ATen/core/CachingHostAllocator.h:300-309), a host reserve back-solved from a `--cpu-offload-gb` boot
subtracts what that boot pinned by the same rule, the pinned total is redone from its printed
operands, and an estimated HBM reserve is estimated per placement column.

Every expected figure is worked out here from the model's geometry and the rule cited, never by
calling the function that computes it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from recipegen.common.units import GiB
from recipegen.ledger import compute_lane, compute_ledger
from recipegen.load.recipe import load_recipe

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "recipes"


def _pow2(n: int) -> int:
    """Next power of two (PyTorch's `c10::llvm::PowerOf2Ceil`), by hand."""
    p = 1
    while p < n:
        p *= 2
    return p


def _lane(recipe: str, name: str | None = None):
    loaded = load_recipe(RECIPES / f"{recipe}.yaml")
    ledger = compute_ledger(loaded)
    return loaded, (ledger.lane(name) if name else ledger.lanes[0])


# --- positional lanes: host in use counts vLLM's pinned blocks -------------------------------


def test_positional_host_in_use_counts_the_rounded_blocks_nemotron() -> None:
    """Nemotron-3-Nano (bf16, 128 experts, w1 1856×2688 and w2 2688×1856) at --cpu-offload-gb 44:
    each parameter is 128 × 1856 × 2688 × 2 B = 1.1895 GiB, pinned as 2 GiB. The walk offloads
    while the total is below 44 GiB: 36 parameters make 42.82 GiB, the 37th (a w1) 44.01 GiB; so
    18 whole layers and one w1 = 37 blocks of 2 GiB = 74 GiB, held for the whole run."""
    loaded, lane = _lane("nemotron-3-nano-30b-a3b-rtx4090")
    model = loaded.recipe.model
    param = model.routed_experts * 1856 * 2688 * 2
    assert model.routed_experts == 128 and param == 1_277_165_568
    count = math.ceil(44 * GiB / param)            # offload while the running total < budget
    assert count == 37
    pinned = count * _pow2(param)
    assert pinned == 74 * GiB
    assert lane.fig("host.cold_experts").value == count * param      # the experts, exact
    assert lane.fig("host.cold_pinned").value == pinned
    reserve = 10 * GiB                                               # the recipe's declared reserve
    assert lane.fig("host.total").value == pinned + reserve          # 84 GiB, not 54.01
    assert lane.fig("host.headroom").value == 96 * GiB - pinned - reserve   # 12 GiB, not 41.99
    # The steady state is the load state on a positional lane: the peak is the same figure.
    assert lane.fig("load.host_peak").value == lane.fig("host.total").value


def test_positional_headline_names_the_pinned_blocks() -> None:
    from recipegen.ledger.report_lane import render_lane

    _, lane = _lane("nemotron-3-nano-30b-a3b-rtx4090")
    text = render_lane(lane)
    assert "pinned experts 44.01 GiB in 74.00 GiB of vLLM's pinned blocks" in text
    assert "= 84.00 GiB of 96.00 GiB (headroom 12.00 GiB)" in text


def test_usage_aware_host_in_use_stays_exact() -> None:
    """A usage-aware lane re-homes into the runtime's exact-size banks and releases vLLM's blocks:
    its host in use is tables + 89 × 40 experts of 18,800,640 B + reserve, with no rounding."""
    _, lane = _lane("dsv41-flash-gb300", "agent")
    assert "host.cold_pinned" not in lane.figures
    cold = 89 * 40 * 18_800_640
    assert lane.fig("host.cold_experts").value == cold
    assert lane.fig("host.total").value == pytest.approx(
        lane.fig("host.tables").value + cold + lane.fig("host.reserve").value, abs=1)


def test_positional_host_fix_is_the_largest_budget_whose_blocks_fit(tmp_path: Path) -> None:
    """The host verdict's "lower offload.load_cpu_offload to at most N GiB" holds at N and fails at
    N + 1 once the blocks are counted at their rounded size (Qwen3-235B FP8 on the 125.87 GiB H200
    PCIe box, where the committed 116 GiB is over)."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((RECIPES / "qwen3-235b-a22b-fp8-h200.yaml").read_text()
                      .replace("catalog: h200-sxm-x8", "catalog: h200-pcie")
                      .replace("\nname: qwen3-235b-a22b-fp8-h200\n", "\nname: recipe\n"))  # the file's name
    loaded = load_recipe(recipe, read_maps=False)
    spec, model = loaded.recipe.lane("chat"), loaded.recipe.model
    pcie = loaded.recipe.machines["dgx"]
    host = [v for v in compute_lane(model, pcie, spec).violations if v.kind == "host"]
    assert host
    # where HBM cannot take the rest, the value is said as the lever that would break it
    n = int(re.search(r"load_cpu_offload to (?:at most )?(\d+) GiB", host[0].suggestion).group(1))

    def with_budget(gib: int):
        offload = spec.offload.model_copy(update={"load_cpu_offload": gib * GiB})
        return compute_lane(model, pcie, spec.model_copy(update={"offload": offload}))

    fits, fails = with_budget(n), with_budget(n + 1)
    assert "host" not in {v.kind for v in fits.violations}
    assert "host" in {v.kind for v in fails.violations}
    # By hand at the boundary: the assumed 64 GiB reserve + the blocks must fit the box.
    assert fits.fig("host.cold_pinned").value + 64 * GiB <= pcie.host_memory
    assert fails.fig("host.cold_pinned").value + 64 * GiB > pcie.host_memory


# --- the pinned total, redone from its printed operands --------------------------------------


def _mxfp4_layer_params() -> list[tuple[str, int]]:
    """DeepSeek-V4.1-Flash's MXFP4 expert parameters of one layer, 384 experts: values 4 bits,
    scales one byte per 32 values, each a separate vLLM parameter."""
    out = []
    for name, rows, cols in (("w13", 4608, 5120), ("w2", 5120, 2304)):
        out.append((name, 384 * rows * cols // 2))
        out.append((f"{name} scales", 384 * rows * cols // 32))
    return out


def test_pinned_total_is_redone_from_the_printed_parameters() -> None:
    _, lane = _lane("dsv41-flash-gb300", "agent")
    fig = lane.fig("load.host_pinned_initial")
    params = _mxfp4_layer_params()
    # w13 4.2188 → 8, scales 0.2637 → 0.5, w2 2.1094 → 4, scales 0.1318 → 0.25 GiB
    assert [_pow2(b) / GiB for _, b in params] == [8, 0.5, 4, 0.25]
    printed = fig.operands["pinned_params_per_layer"]
    assert printed == [f"{name} {b / GiB:.4f} GiB → {_pow2(b) / GiB:g} GiB" for name, b in params]
    # Redo the figure from the operands alone: parse each "→ N GiB", sum, times the whole layers.
    per_layer = sum(float(re.search(r"→ ([\d.]+) GiB", p).group(1)) for p in printed) * GiB
    assert per_layer == fig.operands["pinned_per_whole_layer_bytes"] == 12.75 * GiB
    assert fig.operands["layers_whole"] == 9 and "layers_partial" not in fig.operands
    assert fig.value == fig.operands["layers_whole"] * per_layer == 114.75 * GiB


def test_partial_layer_is_in_the_operands() -> None:
    """At --cpu-offload-gb 64 the walk takes 9 layers (60.51 GiB < 64) and the 10th layer's w13 and
    its scales (64.98 GiB), then stops: 9 × 12.75 + 8 + 0.5 = 123.25 GiB."""
    loaded = load_recipe(RECIPES / "dsv41-flash-gb300.yaml")
    spec = loaded.recipe.lane("agent")
    offload = spec.offload.model_copy(update={"load_cpu_offload": 64 * GiB})
    lane = compute_lane(loaded.recipe.model, loaded.recipe.machines["station"],
                        spec.model_copy(update={"offload": offload}))
    fig = lane.fig("load.host_pinned_initial")
    assert fig.operands["layers_whole"] == 9 and fig.operands["layers_partial"] == 1
    assert fig.operands["partial_layers_pinned_bytes"] == 8.5 * GiB
    assert fig.value == 9 * 12.75 * GiB + 8.5 * GiB


# --- the host reserve of a measured boot -----------------------------------------------------


def test_back_solved_host_reserve_subtracts_what_the_boot_pinned() -> None:
    """v14 (--cpu-offload-gb 60): 432 GiB in use, 61.17 GiB offloaded as vLLM counts it. The
    routed-expert parameters within 61.17 GiB are 9 whole layers (9 × 6.72 = 60.51 GiB; a 10th
    layer's w13 alone would make 64.98), pinned as 9 × 12.75 = 114.75 GiB; tables 2 × 94.6 GiB."""
    _, lane = _lane("dsv41-flash-gb300-off60")
    reserve = lane.fig("host.reserve")
    layer = sum(b for _, b in _mxfp4_layer_params())
    assert 9 * layer <= 61.17 * GiB < 9 * layer + 384 * 4608 * 5120 * (1 / 2 + 1 / 32)
    expected = 432 * GiB - 9 * 12.75 * GiB - 2 * 94.6 * GiB
    assert reserve.value == pytest.approx(expected, abs=1)          # 128.05 GiB
    assert round(reserve.value / GiB, 2) == 128.05
    assert reserve.operands["measured_pinned_blocks_bytes"] == 114.75 * GiB
    assert reserve.operands["measured_expert_params_bytes"] == 9 * layer
    assert reserve.note.startswith("back-solved")


def test_replaying_the_measured_boot_gives_back_its_measurement() -> None:
    """The positional twin is the measured boot itself: tables + reserve + what it pins = 432 GiB."""
    _, lane = _lane("dsv41-flash-gb300-off60")
    assert lane.fig("load.host_peak").value == pytest.approx(432 * GiB, abs=1)
    assert lane.fig("host.total").value == pytest.approx(432 * GiB, abs=1)


def test_reference_host_figures_with_the_consistent_reserve() -> None:
    """dsv41-flash-gb300: 189.2 + 128.05 + 62.33 (89 × 40 × 18,800,640 B) = 379.58 GiB in use."""
    _, lane = _lane("dsv41-flash-gb300", "agent")
    expected = 2 * 94.6 * GiB + (432 * GiB - 114.75 * GiB - 2 * 94.6 * GiB) + 89 * 40 * 18_800_640
    assert lane.fig("host.total").value == pytest.approx(expected, abs=1)
    assert round(lane.fig("host.total").value / GiB, 2) == 379.58


# --- an estimated HBM reserve, per placement column ------------------------------------------


def test_positional_column_of_an_estimated_lane_holds_the_fused_moe_workspace() -> None:
    """Llama-4-Scout on an H100 (usage-aware, estimated reserve): the lane's reserve has no fused-MoE
    workspace (the runtime computes the experts); plain vLLM's positional column needs it:
    T 8,192 × top_k 1 × (max(I 8,192, H 5,120) + max(2·I, H)) × 2 B = 0.375 GiB."""
    loaded, lane = _lane("llama-4-scout-17b-16e-h100")
    model = loaded.recipe.model
    assert (model.moe_intermediate_size, model.hidden_size, model.top_k) == (8192, 5120, 1)
    workspace = 8192 * 1 * (max(8192, 5120) + max(2 * 8192, 5120)) * 2
    assert workspace == 0.375 * GiB
    own = lane.fig("hbm.reserve")
    assert own.operands["fused_moe_workspace_bytes"] == 0
    pos = lane.positional
    assert pos.figures["hbm.reserve"].value == own.value + workspace
    pool = pos.figures["hbm.kv_pool"]
    assert pool.value == pytest.approx(lane.fig("hbm.cap").value - own.value - workspace
                                       - pos.figures["hbm.hot_experts"].value, abs=1)
    assert round(-pool.value / GiB, 2) == 5.62
    # The lane's own column keeps the lane's reserve.
    assert "hbm.reserve" not in lane.usage_aware.figures


def test_usage_aware_column_of_a_positional_estimated_lane_drops_it() -> None:
    """The same lane made positional: its own reserve holds the 0.375 GiB; the usage-aware column at
    the same budget (cold experts, so the runtime computes them) does not."""
    loaded = load_recipe(RECIPES / "llama-4-scout-17b-16e-h100.yaml")
    spec = loaded.recipe.lane("chat")
    offload = spec.offload.model_copy(update={"placement": "positional", "hot_experts_per_layer": None})
    lane = compute_lane(loaded.recipe.model, loaded.recipe.machines["box"],
                        spec.model_copy(update={"offload": offload}))
    own = lane.fig("hbm.reserve")
    assert own.operands["fused_moe_workspace_bytes"] == 0.375 * GiB
    ua = lane.usage_aware.figures["hbm.reserve"]
    assert ua.value == own.value - 0.375 * GiB
    assert ua.operands["fused_moe_workspace_bytes"] == 0


def test_load_host_fix_is_the_largest_load_offload_whose_peak_fits() -> None:
    """The load-time host verdict's "lower offload.load_cpu_offload to at most N GiB" holds at N and
    fails at N + 1 with the blocks counted at their rounded size: Qwen3-30B-A3B usage-aware on its
    RTX 4090 desktop cut to 64 GiB of host, where the committed load offload peaks over."""
    committed = RECIPES / "qwen3-30b-a3b-rtx4090.yaml"
    text = committed.read_text()
    assert text.count("host_memory:\n      value: 96 GiB") == 1
    loaded = load_recipe(committed, read_maps=False,  # beside its maps, with 64 GiB of host
                         text=text.replace("host_memory:\n      value: 96 GiB", "host_memory:\n      value: 64 GiB"))
    spec, model = loaded.recipe.lanes[0], loaded.recipe.model
    machine = loaded.recipe.machines[spec.machine]
    load_host = [v for v in compute_lane(model, machine, spec).violations if v.kind == "load-host"]
    assert load_host
    # where HBM cannot take the rest, the value is said as the lever that would break it
    n = int(re.search(r"load_cpu_offload to (?:at most )?(\d+) GiB", load_host[0].suggestion).group(1))

    def load_host_peak(gib: int) -> tuple[float, set[str]]:
        offload = spec.offload.model_copy(update={"load_cpu_offload": gib * GiB})
        lane = compute_lane(model, machine, spec.model_copy(update={"offload": offload}))
        return lane.fig("load.host_peak").value, {v.kind for v in lane.violations}

    (peak_n, kinds_n), (peak_up, kinds_up) = load_host_peak(n), load_host_peak(n + 1)
    assert "load-host" not in kinds_n and peak_n <= machine.host_memory
    assert "load-host" in kinds_up and peak_up > machine.host_memory
