"""Usage-aware MXFP4 lanes count the experts as the runtime's banks hold them: vLLM 0.33's padded
tensors (recipegen.ledger.vllm_layout).

vLLM rounds an MXFP4 layer's sizes up for its backend before ``create_weights``
(fused_moe/routed_experts.py:171-184; quantization/mxfp4.py:183-198; fused_moe/oracle/mxfp4.py:
837-916: Marlin and TRT-LLM hidden to 256, intermediate to 128) and allocates zero-filled tensors of
the rounded shape (quantization/mxfp4.py:200-292). The runtime holds back only the conversion, reads
its geometry off those tensors and re-homes them into its banks, serving the padded layer as it is
(runtime/expert_residency/vllm_plugin/mxfp4_experts.py ``padding_contract_reason``). The backend is
the lane's ``--moe-backend``, else the one render adds for the runtime (``recipegen.vllm_flags.moe_backend``:
``marlin`` off the SM100 family, H200 included; ``flashinfer_trtllm`` on it).

Figures are derived here from the dims, not read back from the code under test.
"""

from __future__ import annotations

from pathlib import Path

from recipegen.ledger import compute_lane
from recipegen.load.recipe import load_recipe

REPO = Path(__file__).resolve().parents[1]
LAYERS, EXPERTS, HOT = 36, 128, 50


def mxfp4_expert_bytes(hidden: int, inter: int, biases: bool = True) -> int:
    """One expert as vLLM's create_weights allocates it (quantization/mxfp4.py:200-292): uint8
    w13 [2I, H/2] + w2 [H, I/2], uint8 ue8m0 scales [2I, H/32] + [H, I/32], bf16 biases [2I] + [H]."""
    weights = 2 * inter * hidden // 2 + hidden * inter // 2
    scales = 2 * inter * hidden // 32 + hidden * inter // 32
    return weights + scales + ((2 * inter + hidden) * 2 if biases else 0)


PADDED = mxfp4_expert_bytes(3072, 2944)       # Marlin / TRT-LLM: 2,880 -> 3,072 hidden, 2,944 intermediate
CHECKPOINT = mxfp4_expert_bytes(2880, 2880)   # Triton (multiples of 64): unpadded


def test_hand_figures_match_the_recipe_comment_and_the_catalog() -> None:
    # 3 × 2,944 × 3,072 = 27,131,904 values: /2 = 13,565,952 B + /32 = 847,872 B; biases
    # (5,888 + 3,072) × 2 = 17,920 B. The recipe's header states 14,431,744 B.
    assert PADDED == 13_565_952 + 847_872 + 17_920 == 14_431_744
    assert CHECKPOINT == 13_236_480
    loaded = load_recipe(str(REPO / "recipes" / "gpt-oss-120b-l40s.yaml"))
    assert loaded.recipe.model.expert_bytes == CHECKPOINT   # the catalog's checkpoint figure
    assert "14,431,744 B" in (REPO / "recipes" / "gpt-oss-120b-l40s.yaml").read_text()


def _lane(tmp_path: Path, catalog: str, extra_args: tuple[str, ...] = (), hot: int = HOT,
          env: dict[str, str] | None = None):
    """gpt-oss-120b on one GPU of `catalog`, usage-aware with `hot` hot experts per layer (and the
    lane's `env` added)."""
    text = (REPO / "recipes" / "gpt-oss-120b-l40s.yaml").read_text()
    text = text.replace("catalog: l40s", f"catalog: {catalog}")
    text = text.replace("\nname: gpt-oss-120b-l40s\n", f"\nname: gpt-oss-{catalog}\n")  # the file's name
    recipe = tmp_path / f"gpt-oss-{catalog}.yaml"
    recipe.write_text(text)
    loaded = load_recipe(str(recipe))
    spec = loaded.recipe.lane("chat")
    spec = spec.model_copy(update={
        "extra_args": [*spec.extra_args, *extra_args], "env": {**spec.env, **(env or {})},
        "offload": spec.offload.model_copy(update={"placement": "usage-aware", "hot_experts_per_layer": hot})})
    machine = loaded.recipe.machines[spec.machine]
    return compute_lane(loaded.recipe.model, machine, spec, rowmap_hot=[hot] * LAYERS, rowmap_label="test"), machine


def _assert_banks(lane, per_expert: int) -> None:
    fig = lane.figures
    assert fig["experts.bytes_per_expert"].value == per_expert
    assert fig["hbm.hot_experts"].value == LAYERS * HOT * per_expert
    assert fig["host.cold_experts"].value == LAYERS * (EXPERTS - HOT) * per_expert
    assert fig["placement.cold_experts"].value == LAYERS * (EXPERTS - HOT) * per_expert


def test_usage_aware_gptoss_on_sm89_counts_marlins_padded_experts(tmp_path: Path) -> None:
    lane, machine = _lane(tmp_path, "l40s")
    assert machine.gpus.compute_capability == "8.9"
    _assert_banks(lane, PADDED)
    # 36 × 50 × 14,431,744 = 25,977,139,200 B hot (was 23,825,664,000 at the checkpoint size);
    # 36 × 78 × 14,431,744 = 40,524,337,152 B pinned cold (was 37,168,035,840).
    assert lane.figures["hbm.hot_experts"].value == 25_977_139_200
    assert lane.figures["host.cold_experts"].value == 40_524_337_152
    assert lane.figures["experts.checkpoint_bytes_per_expert"].value == CHECKPOINT
    note = [n for n in lane.notes if n.startswith("vLLM 0.33 lays these experts out padded for MARLIN")]
    assert note and "14,431,744 B per expert" in note[0] and "runtime's hot and cold banks" in note[0]
    # The runtime's workspace at the padded geometry: bf16 rows 2 × P × (I + H), P = 2,048 × 4.
    ops = lane.figures["hbm.runtime_workspace.kernels"].operands
    assert (ops["hidden"], ops["intermediate"]) == (3072, 2944)
    assert ops["workspace_bytes"] == 131_084 + 8 + 2 * 8_192 * (2944 + 3072)


def test_usage_aware_gptoss_on_h200_is_padded_at_the_rendered_marlin_backend(tmp_path: Path) -> None:
    """Render adds --moe-backend marlin for a residency lane on SM90 (recipegen.vllm_flags.moe_backend), so
    vLLM pads there too; vLLM's own default (OAI Triton) would not."""
    lane, machine = _lane(tmp_path, "h200-nvl")
    assert machine.gpus.compute_capability == "9.0"
    _assert_banks(lane, PADDED)


def test_usage_aware_gptoss_on_h200_with_triton_keeps_the_checkpoint_size(tmp_path: Path) -> None:
    lane, _ = _lane(tmp_path, "h200-nvl", ("--moe-backend", "triton"))
    _assert_banks(lane, CHECKPOINT)
    assert "experts.checkpoint_bytes_per_expert" not in lane.figures
    assert not [n for n in lane.notes if "padded for" in n]
    ops = lane.figures["hbm.runtime_workspace.kernels"].operands
    assert (ops["hidden"], ops["intermediate"]) == (2880, 2880)
    assert not [v for v in lane.violations if v.kind == "runtime"]


def test_all_hot_usage_aware_lane_is_plain_vllm_and_keeps_its_default_pick(tmp_path: Path) -> None:
    """Every expert hot: no runtime, no rendered --moe-backend; on SM90 vLLM's default OAI Triton."""
    lane, _ = _lane(tmp_path, "h200-nvl", hot=EXPERTS)
    assert lane.figures["experts.bytes_per_expert"].value == CHECKPOINT


def test_usage_aware_gptoss_on_sm100_is_refused_like_the_runtime_refuses_it(tmp_path: Path) -> None:
    """flashinfer_trtllm (rendered on the SM100 family) pads the hidden size and leaves the
    activations / output unpadded (quantization/mxfp4.py:169-181): refused at load by
    padding_contract_reason, so check fails naming it."""
    lane, machine = _lane(tmp_path, "gb200")
    assert machine.gpus.compute_capability == "10.0"
    assert lane.figures["experts.bytes_per_expert"].value == PADDED
    msgs = [v.message for v in lane.violations if v.kind == "runtime"]
    assert any("FLASHINFER_TRTLLM_MXFP4_BF16" in m and "2880 -> 3072" in m for m in msgs), msgs


def test_usage_aware_gptoss_on_sm100_needs_the_triton_bank_kernel(tmp_path: Path) -> None:
    """Unpadded (--moe-backend triton), the SM100 family still picks FlashInfer's TRT-LLM bank
    kernel for the split (blackwell.select), which the plugin refuses for gpt-oss's SwiGLU-OAI at
    load (blackwell.plugin.cuda_bank_experts): check fails with the same words and the fix; with
    the lane's EXPERT_RESIDENCY_BANK_KERNEL=triton the runtime's Triton kernels run it."""
    triton = ("--moe-backend", "triton")   # no padding: only the bank kernel is in the way
    refused = [v for v in _lane(tmp_path, "gb200", triton)[0].violations if v.kind == "runtime"]
    assert len(refused) == 1, refused
    assert "not wired" in refused[0].message and "flashinfer-trtllm" in refused[0].message
    assert "EXPERT_RESIDENCY_BANK_KERNEL: triton" in refused[0].suggestion
    fixed, _ = _lane(tmp_path, "gb200", triton, env={"EXPERT_RESIDENCY_BANK_KERNEL": "triton"})
    assert not [v for v in fixed.violations if v.kind == "runtime"]
