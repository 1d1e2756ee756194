"""The KV pool of models with state layers (Gated DeltaNet, Mamba-2), chunked attention and the sparse
attention indexer, as vLLM 0.33 lays it out per tensor-parallel rank — in tokens and in sequences —
and the runtime's refusals for the new families. Every expected figure is hand arithmetic from the
model's geometry and vLLM's layout rules, written out here."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from recipegen.ledger import compute_lane
from recipegen.modelimport import import_model
from recipegen.schema import Lane, Machine

FIX = Path(__file__).resolve().parent / "fixtures" / "hf_configs"
GiB = 2**30


def machine(cc: str = "9.0", count: int = 8) -> Machine:
    return Machine.model_validate({
        "name": "box", "gpus": {"kind": "H200", "count": count, "compute_capability": cc, "hbm": "141 GB",
                                "hbm_bandwidth": "4.8 TB/s"},
        "host_memory": "2 TiB", "pinned_read_bandwidth": "55 GB/s"})


def lane(tp: int = 1, max_model_len: int = 32768, kv: str = "20 GiB", extra: list[str] | None = None,
         placement: str = "positional", streams: int = 1) -> Lane:
    offload = ({"placement": "positional", "load_cpu_offload": "0 GiB"} if placement == "positional"
               else {"placement": "usage-aware", "hot_experts_per_layer": 8})
    return Lane.model_validate({
        "name": "l", "machine": "box", "gpus": list(range(tp)), "port": 8000, "image": "vllm/vllm-openai:v0.33.0",
        "kv_cache_bytes": kv, "max_model_len": max_model_len, "concurrency": {"max": streams},
        "offload": offload, "extra_args": extra or [], "reserves": {"hbm": {"value": "2 GiB", "source": "test"}}})


def qwen3_next():
    return import_model(FIX / "qwen3-next-80b-a3b-thinking")[0]


def test_qwen3_next_pool_in_sequences_tp1_h200() -> None:
    got = compute_lane(qwen3_next(), machine(), lane())
    # Attention per token per layer: 2 × 2 KV heads × 256 × 2 B = 2,048. GDN state per layer:
    # 3 × 8192 × 2 + 32 × 128 × 128 × 2 = 1,097,728 B. On SM90 GDN prefills export checkpoints:
    # align = lcm(16, 64) = 64, block = 64 × ⌈1,097,728 / (64 × 2,048)⌉ = 64 × 9 = 576 tokens,
    # page = 576 × 2,048 = 1,179,648 B (the state padded by 81,920 B).
    assert got.fig("kv.block_tokens").value == 576 and got.fig("kv.page_bytes").value == 1_179_648
    # 12 full + 36 GDN layers: groups of 12 (36 >= 1.5 × 12): 1 attention group, 3 state groups.
    block = 12 * 1_179_648
    assert got.fig("kv.bytes_per_block").value == block
    # Prefix caching on (the default): 2 state blocks + 1 checkpoint block per GDN group.
    assert got.fig("kv.state_blocks_per_sequence").value == 3
    per_seq = (math.ceil(32768 / 576) + 3 * 3) * block            # (57 + 9) blocks
    assert got.fig("kv.bytes_per_sequence").value == per_seq
    assert got.fig("kv.full_sequences").value == (20 * GiB) // per_seq == 22
    assert got.fig("kv.tokens").value == pytest.approx(20 * GiB / per_seq * 32768)
    # Sequences of any length: each holds 1 attention block + 3 × 3 state blocks.
    assert got.fig("kv.max_sequences").value == ((20 * GiB) // block) // 10


def test_qwen3_next_tp2_and_no_prefix_caching() -> None:
    got = compute_lane(qwen3_next(), machine(), lane(tp=2, extra=["--no-enable-prefix-caching"]))
    # TP 2: 1 KV head per rank (2,048 / 2 = 1,024 B); state 3 × 4096 × 2 + 16 × 128 × 128 × 2 = 548,864 B.
    # No prefix caching: no checkpoints, align 16, 1 state block per group.
    assert got.fig("kv.state_bytes_per_sequence_per_layer").value == 548_864
    block_tokens = 16 * math.ceil(548_864 / (16 * 1024))            # 16 × 34 = 544
    assert got.fig("kv.block_tokens").value == block_tokens == 544
    page = block_tokens * 1024
    per_seq = (math.ceil(32768 / 544) + 3 * 1) * 12 * page
    assert got.fig("kv.bytes_per_sequence").value == per_seq
    assert got.fig("kv.lane_bytes_per_token").value == pytest.approx(per_seq / 32768 * 2)


def test_state_that_does_not_split_over_tp_is_a_violation() -> None:
    got = compute_lane(qwen3_next(), machine(), lane(tp=3))
    assert any(v.kind == "parallel" and "tensor-parallel size 3" in v.message for v in got.violations)


def test_nemotron_h_mamba_pool_on_a_24_gb_card() -> None:
    m = import_model(FIX / "nemotron-3-nano-30b-a3b")[0]
    got = compute_lane(m, machine("8.9", 1), lane(max_model_len=131072, kv="3 GiB"))
    # Attention 2 × 2 × 128 × 2 = 1,024 B per token per layer; Mamba-2 state 2,134,016 B (fp32 SSM).
    # No GDN: align 16, block 16 × ⌈2,134,016 / 16,384⌉ = 2,096 tokens; 6 attention layers, 23 Mamba:
    # groups of 6 → 1 + 4 groups; 2 state blocks (prefix caching).
    assert got.fig("kv.block_tokens").value == 2096
    block = 6 * 2096 * 1024
    per_seq = (math.ceil(131072 / 2096) + 4 * 2) * block
    assert got.fig("kv.bytes_per_sequence").value == per_seq
    assert got.fig("kv.full_sequences").value == (3 * GiB) // per_seq


def test_usage_aware_is_refused_for_relu2_and_nvfp4_positional_stays() -> None:
    for name, why in (("nemotron-3-nano-30b-a3b", "relu2_no_mul"), ("qwen3-235b-a22b-nvfp4", "NVFP4")):
        m = import_model(FIX / name)[0]
        ua = compute_lane(m, machine(), lane(tp=1, kv="1 GiB", placement="usage-aware"))
        refusals = [v for v in ua.violations if v.kind == "runtime"]
        assert refusals and why in refusals[0].message and "positional" in refusals[0].suggestion
        pos = compute_lane(m, machine(), lane(tp=1, kv="1 GiB"))
        assert not [v for v in pos.violations if v.kind == "runtime"]


def test_deepseek_v32_indexer_in_the_kv_rate() -> None:
    m = import_model(FIX / "deepseek-v3.2")[0]
    got = compute_lane(m, machine(), lane(tp=8, max_model_len=131072, kv="37 GiB"))
    per_seq = 61 * (576 * 2 + 132) * 131072                         # every rank holds the latent and the indexer key
    assert got.fig("kv.bytes_per_sequence").value == per_seq
    assert got.fig("kv.full_sequences").value == 3                   # 37 GiB / 9.56 GiB = 3.87
    assert (37 * GiB) // (61 * 576 * 2 * 131072) == 4                # what MLA alone would promise


def test_llama4_chunked_layers_hold_chunk_plus_batch() -> None:
    m = import_model(FIX / "llama-4-maverick-17b-128e-instruct")[0]
    got = compute_lane(m, machine(), lane(tp=8, max_model_len=131072, kv="40 GiB",
                                          extra=["--max-num-batched-tokens", "8192"]))
    # 12 NoPE layers hold every token, 36 chunked layers min(8192 + 8192, 131,072); 8 KV heads / 8 = 1 per rank.
    per_layer = 2 * 1 * 128 * 2
    assert got.fig("kv.bytes_per_sequence").value == 12 * per_layer * 131072 + 36 * per_layer * 16384


def test_language_model_only_drops_the_vision_tower() -> None:
    m = import_model(FIX / "qwen3-vl-30b-a3b-instruct")[0]
    full = compute_lane(m, machine(), lane(kv="10 GiB"))
    text = compute_lane(m, machine(), lane(kv="10 GiB", extra=["--language-model-only"]))
    drop = full.fig("hbm.reserve.dense").value - text.fig("hbm.reserve.dense").value
    assert drop == 538_631_408 * 2


def test_glm5_on_sm100_defaults_to_fp8_kv() -> None:
    m = import_model(FIX / "glm-5")[0]
    hopper = compute_lane(m, machine("9.0"), lane(tp=8, kv="20 GiB"))
    blackwell = compute_lane(m, machine("10.0"), lane(tp=8, kv="20 GiB"))
    assert hopper.fig("kv.bytes_per_sequence").value == 78 * (576 * 2 + 132) * 32768
    assert blackwell.fig("kv.bytes_per_sequence").value == 78 * (576 + 132) * 32768


def test_sparse_mla_with_an_fp8_cache_is_fp8_ds_mla_off_sm100() -> None:
    """`--kv-cache-dtype fp8` on DeepSeek sparse attention: on Hopper vLLM's FLASHMLA_SPARSE stores
    fp8_ds_mla, 512 fp8 values + 4 fp32 scales + 64 bf16 RoPE values = 656 B per token per layer;
    on the SM100 family FLASHINFER_MLA_SPARSE stores plain fp8, (512 + 64) × 1 B. The indexer key
    (index_head_dim 128 + 4 B of scale) comes on top of both."""
    m = import_model(FIX / "glm-5")[0]
    fp8 = lane(tp=8, kv="20 GiB", extra=["--kv-cache-dtype", "fp8"])
    hopper = compute_lane(m, machine("9.0"), fp8)
    blackwell = compute_lane(m, machine("10.0"), fp8)
    assert hopper.fig("kv.bytes_per_sequence").value == 78 * (512 + 16 + 128 + 132) * 32768
    assert blackwell.fig("kv.bytes_per_sequence").value == 78 * (576 + 132) * 32768
    # fp8_e4m3 is not on FLASHMLA_SPARSE's list: Hopper's FLASHINFER_MLA_SPARSE_SM90 stores it plain
    e4m3 = lane(tp=8, kv="20 GiB", extra=["--kv-cache-dtype", "fp8_e4m3"])
    assert compute_lane(m, machine("9.0"), e4m3).fig("kv.bytes_per_sequence").value == 78 * (576 + 132) * 32768



def test_sparse_mla_on_sm120_is_always_fp8_ds_mla() -> None:
    """SM120's only sparse-MLA backend in vLLM 0.33, FLASHINFER_MLA_SPARSE_SM120, turns auto, fp8 and
    fp8_e4m3 into fp8_ds_mla (mla_attention.py `_canonicalize_sparse_mla_kv_cache_dtype`) and refuses
    any other cache: a bf16 GLM-5 caches 656 B per token per layer there, not (512 + 64) x 2."""
    m = import_model(FIX / "glm-5")[0]
    for extra in ([], ["--kv-cache-dtype", "fp8"], ["--kv-cache-dtype", "fp8_e4m3"]):
        got = compute_lane(m, machine("12.0"), lane(tp=8, kv="20 GiB", extra=extra))
        assert got.fig("kv.bytes_per_sequence").value == 78 * (656 + 132) * 32768, extra
        assert not [v for v in got.violations if v.kind == "attention"]
    bf16 = compute_lane(m, machine("12.0"), lane(tp=8, kv="20 GiB", extra=["--kv-cache-dtype", "bfloat16"]))
    (refused,) = [v for v in bf16.violations if v.kind == "attention"]
    assert "FLASHINFER_MLA_SPARSE_SM120" in refused.message and "auto" in refused.suggestion


def test_sparse_mla_before_sm90_has_no_backend() -> None:
    m = import_model(FIX / "deepseek-v3.2")[0]
    ada = compute_lane(m, machine("8.9"), lane(tp=8, max_model_len=32768, kv="20 GiB"))
    (refused,) = [v for v in ada.violations if v.kind == "attention"]
    assert "no sparse-MLA attention backend for compute capability 8.9" in refused.message
    hopper = compute_lane(m, machine("9.0"), lane(tp=8, max_model_len=32768, kv="20 GiB"))
    assert not [v for v in hopper.violations if v.kind == "attention"]
