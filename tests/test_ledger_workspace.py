"""The runtime's start-up HBM besides the banks (recipegen.ledger.workspace): the formulas against
hand arithmetic and against the runtime's own tensors on CPU, vLLM 0.33's max_num_batched_tokens
default, the KV back-solve that subtracts it, `check budgets`' line and `verify`'s comparison."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from recipegen.ledger import compute_lane
from recipegen.ledger.workspace import (counter_bytes, kernel_workspace_bytes, max_num_batched_tokens,
                                        next_pow2)
from recipegen.recipe_io import load_recipe
from recipegen.units import GiB

REPO = Path(__file__).resolve().parents[1]


def test_dsv41_workspace_by_hand() -> None:
    """DSv4.1 (H 5120, I 2304, top-6) at 8,192 batched tokens: P = 49,152 picks, PB = 65,536;
    int32 2·65,536 + 49,153 + 49,152 + 2 = 229,379 → 917,516 B; one int64 8 B; bf16 rows
    2 × 49,152 × (2304 + 5120) = 729,808,896 B. Total 730,726,420 B ≈ 0.68 GiB."""
    assert next_pow2(49_152) == 65_536 and next_pow2(2) == 2 and next_pow2(3) == 4
    assert kernel_workspace_bytes(8192, 6, 5120, 2304) == 917_516 + 8 + 729_808_896 == 730_726_420
    assert round(730_726_420 / GiB, 2) == 0.68
    # One token of top-1: P = 1, PB = next_pow2(2) = 2: int32 4 + 2 + 1 + 2 = 9 → 36 B + 8 + 2·(I + H).
    assert kernel_workspace_bytes(1, 1, 64, 32) == 36 + 8 + 2 * 96
    # Counter of 40 layers × 384 experts: int64 15,360 + 2 × 40 → 123,520 B; masks at 16,384
    # tokens: bool 16,385 + int32 65,536 + int64 8 = 81,929 B.
    assert counter_bytes(40, 384, 16_384) == 123_520 + 81_929 == 205_449


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
    assert kernel_workspace_bytes(tokens, top_k, hidden, inter) == by_hand
    assert mxfp4.workspace.nbytes == dense.workspace.nbytes == by_hand
    assert Workspace.bytes_for(tokens, top_k, shape) == by_hand
    layers = [1, 3, 4]
    counter = ExpertCounter(layers, 8, device="cpu", top_k=top_k)
    masks = StepMasks(tokens, "cpu")
    held = sum(t.numel() * t.element_size() for t in (counter.counts, counter.tokens, counter.decode_tokens))
    assert held + masks.nbytes == counter_bytes(len(layers), 8, tokens) == 8 * 3 * 8 + 16 * 3 + 5 * tokens + 9
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
    262,156 B; + 8; bf16 2 × 16,384 × (768 + 2048) = 92,274,688 B; kernels 92,536,852 B. Counter
    8·48·128 + 16·48 = 49,920; masks 5·2048 + 9 = 10,249. Total 92,597,021 B."""
    loaded, lane_spec, machine = _rtx4090()
    lane = compute_lane(loaded.recipe.model, machine, lane_spec, rowmap_hot=[20] * 48, rowmap_label="test")
    fig = lane.figures
    assert fig["hbm.runtime_workspace.kernels"].value == 262_156 + 8 + 92_274_688 == 92_536_852
    assert fig["hbm.runtime_workspace.counter"].value == 49_920 + 10_249
    assert fig["hbm.runtime_workspace"].value == 92_597_021
    kv = fig["hbm.cap"].value - fig["hbm.reserve"].value - fig["hbm.hot_experts"].value - 92_597_021
    assert fig["hbm.kv_pool"].value == pytest.approx(kv, abs=1)
    # The positional column is plain vLLM: no runtime, nothing taken.
    pos = lane.positional.figures["hbm.kv_pool"]
    assert "runtime_workspace_bytes" not in pos.operands
    # Tensor parallel shards the intermediate dim: per GPU I/2 = 384.
    tp2 = compute_lane(loaded.recipe.model, machine, lane_spec.model_copy(update={"gpus": [0, 1]}),
                       rowmap_hot=[20] * 48, rowmap_label="test")
    assert tp2.figures["hbm.runtime_workspace.kernels"].value == 262_156 + 8 + 2 * 16_384 * (384 + 2048)


def test_no_workspace_where_the_runtime_is_not_mounted() -> None:
    loaded, lane_spec, machine = _rtx4090()
    all_hot = lane_spec.model_copy(update={"offload": lane_spec.offload.model_copy(
        update={"hot_experts_per_layer": 128})})
    lane = compute_lane(loaded.recipe.model, machine, all_hot)
    assert "hbm.runtime_workspace" not in lane.figures
    assert "runtime_workspace_bytes" not in lane.figures["hbm.kv_pool"].operands


def test_cli_prints_the_workspace_line() -> None:
    from click.testing import CliRunner

    from recipegen.cli import main

    result = CliRunner().invoke(main, ["check", "budgets", str(REPO / "recipes" / "qwen3-30b-a3b-rtx4090.yaml")])
    assert result.exit_code == 0, result.output
    [line] = [l for l in result.output.splitlines() if l.strip().startswith("runtime workspace =")]
    assert "kernels 88.25 MiB" in line and "max_num_batched_tokens 2,048 × top-k 8" in line  # 92,536,852 B
    assert "before vLLM sizes the KV cache" in line
    hbm = [l for l in result.output.splitlines() if l.strip().startswith("HBM / GPU:")][0]
    assert "+ runtime workspace 88.31 MiB +" in hbm  # 92,597,021 B / 2^20


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
