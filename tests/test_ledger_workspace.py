"""The runtime's start-up HBM besides the banks (recipegen.ledger.workspace): the formulas against
hand arithmetic and against the runtime's own tensors on CPU, vLLM 0.33's max_num_batched_tokens
default, the KV back-solve that subtracts it, `check budgets`' line and `verify`'s comparison."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from cli_support import invoke
from expert_residency.contract.sizing import (
    dense_ticket_bytes,
    fitted_tile,
    fp8_scratch_bytes,
    next_pow2,
    workspace_bytes,
)

from recipegen.common.units import GiB
from recipegen.ledger import compute_lane
from recipegen.ledger.vllm_layout import as_lane_lays_out
from recipegen.ledger.workspace import counter_and_mask_bytes, max_num_batched_tokens, split_ticket_bytes
from recipegen.load.recipe import load_recipe

REPO = Path(__file__).resolve().parents[1]


def test_dsv41_workspace_by_hand() -> None:
    """DSv4.1 (H 5120, I 2304, top-6) at 8,192 batched tokens: P = 49,152 picks, PB = 65,536;
    int32 2·65,536 + 49,153 + 49,152 + 2 = 229,379 → 917,516 B; one int64 8 B; bf16 rows
    2 × 49,152 × (2304 + 5120) = 729,808,896 B. Total 730,726,420 B ≈ 0.68 GiB."""
    assert next_pow2(49_152) == 65_536 and next_pow2(2) == 2 and next_pow2(3) == 4
    assert workspace_bytes(8192, 6, 5120, 2304) == 917_516 + 8 + 729_808_896 == 730_726_420
    assert round(730_726_420 / GiB, 2) == 0.68
    # One token of top-1: P = 1, PB = next_pow2(2) = 2: int32 4 + 2 + 1 + 2 = 9 → 36 B + 8 + 2·(I + H).
    assert workspace_bytes(1, 1, 64, 32) == 36 + 8 + 2 * 96
    # Counter of 40 layers × 384 experts: int64 15,360 + 2 × 40 → 123,520 B; masks at 16,384
    # tokens: bool 16,385 + int32 65,536 + int64 8 = 81,929 B.
    assert counter_and_mask_bytes(40, 384, 16_384) == 123_520 + 81_929 == 205_449


@pytest.mark.parametrize("tokens,top_k,hidden,inter", [(1, 1, 256, 128), (7, 6, 256, 128), (100, 8, 512, 256)])
def test_formula_equals_the_runtime_allocation_on_cpu(tokens: int, top_k: int, hidden: int, inter: int) -> None:
    """What the plugin reports as `workspace_bytes` is the kernels' `workspace.nbytes`
    (vllm_plugin/mxfp4_experts.py, dense_layers.py): the real objects, built on CPU."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from expert_residency.core import ExpertCounter
    from expert_residency.gpu.dense_experts import TritonDenseExperts
    from expert_residency.gpu.experts import ExpertShape, TritonMxfp4Experts, Workspace
    from expert_residency.vllm_plugin.step_masks import StepMasks

    picks = tokens * top_k
    pb = 1 << (max(picks, 2) - 1).bit_length()
    by_hand = 4 * (2 * pb + picks + 1 + max(picks, 1) + 2) + 8 + 2 * picks * (inter + hidden)
    shape = ExpertShape(hidden=hidden, intermediate=inter)
    mxfp4 = TritonMxfp4Experts(shape, 8, top_k, tokens, "cpu")
    dense = TritonDenseExperts(shape, 8, top_k, tokens, "cpu")
    assert workspace_bytes(tokens, top_k, hidden, inter) == by_hand
    assert mxfp4.workspace.nbytes == dense.workspace.nbytes == by_hand
    assert Workspace.bytes_for(tokens, top_k, shape) == by_hand
    layers = [1, 3, 4]
    counter = ExpertCounter(layers, 8, device="cpu", top_k=top_k)
    masks = StepMasks(tokens, "cpu")
    held = sum(t.numel() * t.element_size() for t in (counter.counts, counter.tokens, counter.decode_tokens))
    assert held + masks.nbytes == counter_and_mask_bytes(len(layers), 8, tokens) == 8 * 3 * 8 + 16 * 3 + 5 * tokens + 9
    assert masks.nbytes == StepMasks.bytes_for(tokens)
    assert torch.device("cpu") == masks.device


def _rtx4090():
    loaded = load_recipe(str(REPO / "recipes" / "qwen3-30b-a3b-rtx4090.yaml"))
    lane = loaded.recipe.lane("chat")
    return loaded, lane, loaded.recipe.machines[lane.machine]


def _gpu(machine, **update):
    return machine.model_copy(update={"gpus": machine.gpus.model_copy(update=update)})


def test_max_num_batched_tokens_follows_vllm_033() -> None:
    """engine/arg_utils.py:2973-3006 (`vllm serve`): ≥ 160 GiB 16,384; ≥ 70 GiB and not an A100
    8,192; else 2,048. The flag wins; throughput mode doubles the default; without chunked
    prefill the default is at least max_model_len."""
    _, lane, machine = _rtx4090()
    assert max_num_batched_tokens(machine, lane).value == 2048               # 24 GB RTX 4090
    assert max_num_batched_tokens(_gpu(machine, hbm=131 * GiB), lane).value == 8192   # H200
    assert max_num_batched_tokens(_gpu(machine, hbm=79 * GiB, kind="NVIDIA A100-SXM4-80GB"),
                                  lane).value == 2048
    assert max_num_batched_tokens(_gpu(machine, hbm=250 * GiB), lane).value == 16384  # GB300
    flagged = lane.model_copy(update={"extra_args": [*lane.extra_args, "--max-num-batched-tokens", "4096"]})
    assert max_num_batched_tokens(machine, flagged).value == 4096
    fast = lane.model_copy(update={"extra_args": ["--performance-mode", "throughput"]})
    assert max_num_batched_tokens(machine, fast).value == 4096
    whole = lane.model_copy(update={"extra_args": ["--no-enable-chunked-prefill"]})
    assert max_num_batched_tokens(machine, whole).value == lane.max_model_len == 32_768


def test_check_budgets_takes_the_workspace_before_the_kv_pool() -> None:
    """Qwen3-30B-A3B (bf16, H 2048, I 768, top-8, 48 MoE layers of 128 experts) on the RTX 4090
    (2,048 batched tokens): P = 16,384 = PB; int32 2·16,384 + 16,385 + 16,384 + 2 = 65,539 →
    262,156 B; + 8; bf16 2 × 16,384 × (768 + 2048) = 92,274,688 B; the T = 1 fused-finalize
    tickets, one int32 per 16 of H's 2,048 rows: 512 B; kernels 92,537,364 B. Counter
    8·48·128 + 16·48 = 49,920; masks 5·2048 + 9 = 10,249. Total 92,597,533 B."""
    loaded, lane_spec, machine = _rtx4090()
    lane = compute_lane(loaded.recipe.model, machine, lane_spec, rowmap_hot=[20] * 48, rowmap_label="test")
    fig = lane.figures
    assert fig["hbm.runtime_workspace.kernels"].value == 262_156 + 8 + 92_274_688 + 512 == 92_537_364
    assert fig["hbm.runtime_workspace.kernels"].operands["dense_ticket_bytes"] == 512
    assert fig["hbm.runtime_workspace.counter"].value == 49_920 + 10_249
    assert fig["hbm.runtime_workspace"].value == 92_597_533
    kv = fig["hbm.cap"].value - fig["hbm.reserve"].value - fig["hbm.hot_experts"].value - 92_597_533
    assert fig["hbm.kv_pool"].value == pytest.approx(kv, abs=1)
    # The positional column is plain vLLM: no runtime, nothing taken.
    pos = lane.positional.figures["hbm.kv_pool"]
    assert "runtime_workspace_bytes" not in pos.operands
    # Tensor parallel shards the intermediate dim: per GPU I/2 = 384.
    tp2 = compute_lane(loaded.recipe.model, machine, lane_spec.model_copy(update={"gpus": [0, 1]}),
                       rowmap_hot=[20] * 48, rowmap_label="test")
    assert tp2.figures["hbm.runtime_workspace.kernels"].value == 262_156 + 8 + 2 * 16_384 * (384 + 2048) + 512
    # Expert parallel keeps whole experts on each rank: I = 768 again, the one-GPU figure.
    ep2 = compute_lane(loaded.recipe.model, machine, lane_spec.model_copy(update={
        "gpus": [0, 1], "extra_args": [*lane_spec.extra_args, "--enable-expert-parallel"]}),
        rowmap_hot=[20] * 48, rowmap_label="test")
    assert ep2.figures["hbm.runtime_workspace.kernels"].value == 92_537_364


def test_no_workspace_where_the_runtime_is_not_mounted() -> None:
    loaded, lane_spec, machine = _rtx4090()
    all_hot = lane_spec.model_copy(update={"offload": lane_spec.offload.model_copy(
        update={"hot_experts_per_layer": 128})})
    lane = compute_lane(loaded.recipe.model, machine, all_hot)
    assert "hbm.runtime_workspace" not in lane.figures
    assert "runtime_workspace_bytes" not in lane.figures["hbm.kv_pool"].operands


def test_cli_prints_the_workspace_line() -> None:
    result = invoke("check", "budgets", str(REPO / "recipes" / "qwen3-30b-a3b-rtx4090.yaml"))
    assert result.code == 0, result.output
    [line] = [l for l in result.output.splitlines() if l.strip().startswith("runtime workspace =")]
    assert "kernels 88.25 MiB" in line and "max_num_batched_tokens 2,048 × top-k 8" in line  # 92,537,364 B
    assert "before vLLM sizes the KV cache" in line
    hbm = [l for l in result.output.splitlines() if l.strip().startswith("HBM / GPU:")][0]
    assert "+ runtime workspace 88.31 MiB +" in hbm  # 92,597,533 B / 2^20


def test_verify_compares_the_reported_bytes_exactly() -> None:
    from expert_residency.formats import StartupReport

    from recipegen.ops.verify import Expected, compare

    expected = Expected(hot_bytes=100, cold_bytes=50, kv_tokens=None, hot_counts=[1], cold_counts=[1],
                        content_hash="c" * 64, shape_hash="s" * 64, traffic_class="t",
                        workspace_bytes=92_536_852, counter_bytes=60_169)

    def report(**extra):
        return StartupReport(rank=0, mode="residency", vllm_version="0.33.0", runtime_version="x",
                             hot_bytes=100, cold_bytes=50, hot_counts="1x1", cold_counts="1x1",
                             content_hash="c" * 64, shape_hash="s" * 64, world_size=1, extra=extra)

    def rows(r):
        return {row.figure: row for row in compare(expected, [r], None) if row.figure.startswith(("runtime kernel", "runtime counter"))}

    good = rows(report(workspace_bytes=92_536_852, counter_bytes=60_169))
    assert len(good) == 2 and all(row.ok for row in good.values())
    bad = rows(report(workspace_bytes=92_536_851, counter_bytes=60_169))
    assert not bad["runtime kernel workspace / GPU"].ok and bad["runtime counter + step masks / GPU"].ok
    old = rows(report())
    assert all(row.ok and row.observed == "not reported" for row in old.values())
    assert dataclasses.fields(Expected)[-1].name == "counter_bytes"


# --- split-K tickets, FP8 inputs, the load peak and the same-budget column ------------------

def test_dsv41_split_tickets_and_fp8_inputs_by_hand() -> None:
    """DSv4.1 (H 5120, I 2304, top-6): the small step is min(T, 6) tokens, p = 6 × 6 = 36 picks;
    w13 tiles 2304 / 64 = 36, w2 tiles 5120 / 128 = 40: 36 × 76 int32 = 10,944 B. gpt-oss
    (2880 = 45 × 64): w2's 128 is halved to 64, so 45 + 45 tiles; one token of top-4: p = 4."""
    assert split_ticket_bytes(8192, 6, 5120, 2304) == 36 * (36 + 40) * 4 == 10_944
    assert split_ticket_bytes(3, 6, 5120, 2304) == 18 * 76 * 4
    assert fitted_tile(128, 2880) == 64 and fitted_tile(64, 2880) == 64 and fitted_tile(128, 5120) == 128
    assert split_ticket_bytes(1, 4, 2880, 2880) == 4 * 90 * 4 == 1_440
    # FP8 inputs of Qwen3-235B (H 4096, I 1536, top-8) at 8,192 tokens: E4M3 8,192·4,096 +
    # 65,536·1,536 = 134,217,728 B; fp32 scales 4·(8,192·32 + 65,536·12) = 4,194,304 B.
    assert fp8_scratch_bytes(8192, 8, 4096, 1536) == 134_217_728 + 4_194_304 == 138_412_032
    # The dense kernels' fused T = 1 finalize tickets: DeepSeek-V3's H 7,168 / 16 = 448 int32.
    assert dense_ticket_bytes(7168) == 448 * 4 == 1_792 and dense_ticket_bytes(2880) == 180 * 4


@pytest.mark.parametrize("tokens,top_k,hidden,inter", [(1, 4, 256, 128), (5, 6, 512, 256), (40, 8, 2880, 2880)])
def test_tickets_and_fp8_inputs_equal_the_runtime_tensors_on_cpu(tokens: int, top_k: int, hidden: int,
                                                                 inter: int, monkeypatch) -> None:
    """The Triton MXFP4 object as blackwell/plugin.py builds it (default config fitted to the
    geometry): its SplitScratch's nbytes are the ledger's tickets, and the plugin's reported
    `workspace_bytes` is workspace + tickets; the FP8-block object's quantized inputs likewise."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from expert_residency.gpu.dense_experts import TritonDenseExperts
    from expert_residency.gpu.experts import ExpertShape, KernelConfig, TritonMxfp4Experts, config_for_shape
    from expert_residency.vllm_plugin.mxfp4_experts import Mxfp4Geometry, Mxfp4Residency

    shape = ExpertShape(hidden=hidden, intermediate=inter)
    mxfp4 = TritonMxfp4Experts(shape, 8, top_k, tokens, "cpu", config_for_shape(shape, KernelConfig()))
    p = min(tokens, 6) * top_k
    by_hand = 4 * p * (inter // 64 + hidden // (64 if hidden % 128 else 128))
    assert split_ticket_bytes(tokens, top_k, hidden, inter) == by_hand == mxfp4.split_scratch.nbytes
    residency = Mxfp4Residency(Mxfp4Geometry(hidden, inter, 8, top_k), "cpu", tokens)
    assert residency.workspace_bytes == 0  # the CPU reference allocates nothing
    residency._experts = mxfp4  # what CUDA holds (blackwell.plugin.cuda_bank_experts)
    assert residency.workspace_bytes == workspace_bytes(tokens, top_k, hidden, inter) + by_hand
    if hidden % 128 == 0 and inter % 128 == 0:
        import triton.language as tl
        from expert_residency.gpu import kernels_dense
        from expert_residency.gpu.dense_experts import DenseKernelConfig

        # The compiled kernels' scratch (E4M3); an earlier interpreter test in the same process
        # would otherwise leave the module in its TRITON_INTERPRET=1 mode (bf16 stand-ins).
        monkeypatch.setattr(kernels_dense, "_INTERPRETED", tl.constexpr(False))
        cfg = DenseKernelConfig()
        fp8 = TritonDenseExperts(shape, 8, top_k, tokens, "cpu", cfg, expert_format="fp8-block")
        scales = 4 * (tokens * (hidden // 128) + tokens * top_k * (inter // 128))
        assert fp8.fp8_scratch_bytes == fp8_scratch_bytes(tokens, top_k, hidden, inter)
        assert fp8.fp8_scratch_bytes == tokens * hidden + tokens * top_k * inter + scales
        assert fp8._xq.dtype == torch.float8_e4m3fn  # one byte per value on the device
        # The T = 1 fused-finalize tickets: one int32 per 16 output rows, by hand and by the ledger.
        assert fp8.ticket_bytes == 4 * -(-hidden // 16) == dense_ticket_bytes(hidden)


def _gptoss_l40s():
    loaded = load_recipe(str(REPO / "recipes" / "gpt-oss-120b-l40s.yaml"))
    lane = loaded.recipe.lane("chat")
    return loaded, lane, loaded.recipe.machines[lane.machine]


# gpt-oss-120b (H = I = 2880, top-4, 36 MoE layers of 128) on the 48 GB L40S: vLLM 0.33's Marlin
# backend (the default on SM89, and the `--moe-backend marlin` render adds for the runtime) pads the
# layer to H 3,072 / I 2,944 before its weights exist, and the runtime sizes its kernels from those
# tensors (vllm_layout.lane_geometry). 2,048 batched tokens (< 70 GiB), P = 8,192 = PB: int32
# 2·8,192 + 8,193 + 8,192 + 2 = 32,771 → 131,084 B; + 8; bf16 2 × 8,192 × (2,944 + 3,072) =
# 98,566,144 B; tickets p = 6 × 4 = 24, 2,944/64 + 3,072/128 = 46 + 24 tiles: 6,720 B (unpadded it
# was 94,371,840 B and 45 + 45 tiles, 8,640 B). Counter 8·36·128 + 16·36 = 37,440; masks 5·2,048 + 9 = 10,249.
GPTOSS_L40S_KERNELS = 131_084 + 8 + 98_566_144 + 6_720
GPTOSS_L40S_WORKSPACE = GPTOSS_L40S_KERNELS + 37_440 + 10_249


def test_positional_lanes_same_budget_column_takes_the_workspace() -> None:
    """The positional gpt-oss lane's usage-aware column (78 cold per layer at the same budget)
    would run the runtime: its KV pool is what the cap leaves after the reserve, its hot experts
    and the runtime's workspace; the positional column itself runs plain vLLM and takes none."""
    loaded, lane_spec, machine = _gptoss_l40s()
    assert lane_spec.offload.placement == "positional"
    lane = compute_lane(loaded.recipe.model, machine, lane_spec)
    ua = lane.usage_aware.figures
    assert GPTOSS_L40S_WORKSPACE == 98_751_645  # 94,559,261 at the unpadded 2,880 / 2,880
    assert ua["hbm.kv_pool"].operands["runtime_workspace_bytes"] == GPTOSS_L40S_WORKSPACE
    # 0.95 multiplies CUDA's total: the L40S's 46,068 MiB less the 608 MiB the driver keeps (catalog)
    want = (machine.gpus.hbm - machine.gpus.driver_reserved) * 0.95 - lane.figures["hbm.reserve"].value \
        - ua["hbm.hot_experts"].value
    assert ua["hbm.kv_pool"].value == pytest.approx(want - GPTOSS_L40S_WORKSPACE, abs=1)
    assert "runtime_workspace_bytes" not in lane.positional.figures["hbm.kv_pool"].operands
    assert "hbm.runtime_workspace" not in lane.figures
    assert "runtime_workspace_bytes" not in lane.figures["load.hbm_peak"].operands
    # No cold expert at that budget: the column keeps every expert in HBM and needs no runtime.
    none_off = lane_spec.model_copy(update={"offload": lane_spec.offload.model_copy(update={"load_cpu_offload": 0})})
    lane0 = compute_lane(loaded.recipe.model, machine, none_off)
    assert "runtime_workspace_bytes" not in lane0.usage_aware.figures["hbm.kv_pool"].operands


def test_usage_aware_mxfp4_lane_counts_the_tickets_and_the_load_peak_holds_the_workspace() -> None:
    """The same lane run usage-aware (50 hot per layer): the kernels figure is the runtime's
    reported `workspace_bytes` (workspace + tickets), and the load-time HBM peak adds the whole
    runtime workspace, live from before the first layer is re-homed to the end."""
    loaded, lane_spec, machine = _gptoss_l40s()
    ua_spec = lane_spec.model_copy(update={"offload": lane_spec.offload.model_copy(
        update={"placement": "usage-aware", "hot_experts_per_layer": 50})})
    lane = compute_lane(loaded.recipe.model, machine, ua_spec, rowmap_hot=[50] * 36, rowmap_label="test")
    fig = lane.figures
    assert fig["hbm.runtime_workspace.kernels"].value == GPTOSS_L40S_KERNELS
    assert fig["hbm.runtime_workspace.kernels"].operands["split_ticket_bytes"] == 6_720
    assert fig["hbm.runtime_workspace"].value == GPTOSS_L40S_WORKSPACE
    peak = fig["load.hbm_peak"]
    assert peak.operands["runtime_workspace_bytes"] == GPTOSS_L40S_WORKSPACE
    assert peak.value == pytest.approx(peak.operands["weights_at_load_bytes"] + peak.operands["peak_experts_bytes"]
                                       + GPTOSS_L40S_WORKSPACE + 768 * 2**20, abs=1)   # + the CUDA context (one GPU)
    # The same lane without the workspace would peak exactly that much lower.
    from recipegen.ledger.load import load_figures
    from recipegen.ledger.result import Violation

    got: dict = {}
    violations: list[Violation] = []
    held, _ = as_lane_lays_out(loaded.recipe.model, machine, ua_spec)  # the padded experts the banks hold
    load_figures(held, machine, ua_spec, lane.usage_aware,
                 lambda f: got.setdefault(f.key, f), peak.operands["weights_at_load_bytes"],
                 peak.operands["weights_at_load_bytes"], 0.0, 0.0, violations, 1)
    assert got["load.hbm_peak"].value == pytest.approx(peak.value - GPTOSS_L40S_WORKSPACE, abs=1)


def test_load_peak_over_the_gpu_because_of_the_workspace_is_reported() -> None:
    """Qwen3-30B-A3B on the RTX 4090 (workspace 92,597,533 B): a GPU just big enough for the
    load without the workspace now reports a load-time HBM violation of the workspace's size."""
    loaded, lane_spec, machine = _rtx4090()
    lane = compute_lane(loaded.recipe.model, machine, lane_spec, rowmap_hot=[20] * 48, rowmap_label="test")
    peak = lane.figures["load.hbm_peak"]
    assert peak.operands["runtime_workspace_bytes"] == 92_597_533
    without = peak.value - 92_597_533
    # a GPU whose CUDA total (hbm less the catalog's 485 MiB driver reservation) is one byte over
    tight = _gpu(machine, hbm=int(without) + 1 + machine.gpus.driver_reserved)
    from recipegen.ledger.load import load_figures
    from recipegen.ledger.result import Violation

    violations: list[Violation] = []
    got: dict = {}
    load_figures(loaded.recipe.model, tight, lane_spec, lane.usage_aware, lambda f: got.setdefault(f.key, f),
                 peak.operands["weights_at_load_bytes"], peak.operands["weights_at_load_bytes"], 0.0, 0.0,
                 violations, 1, workspace=92_597_533.0)
    [v] = [v for v in violations if v.kind == "load-hbm"]
    assert v.over_bytes == pytest.approx(92_597_533 - 1, abs=2)
