"""The `--kv-cache-dtype` values beyond plain fp16 / bf16 / fp8 that vLLM 0.33 accepts
(vllm/config/cache.py:44-67): the bytes each caches per token per layer on one tensor-parallel rank,
and the lanes vLLM refuses to boot with them.

Every expected figure is hand arithmetic from vLLM 0.33's own formula, written out here:

- TurboQuant (v1/attention/backends/turboquant_attn.py:140-153; model_executor/layers/quantization/
  turboquant/config.py:20-41, :128-175): one slot per KV head per token, key + value rounded up to
  an even size. Key: head_dim bytes (fp8) for 8 key bits, else ceil(head_dim × bits / 8) + 2 (fp16
  norm); value: ceil(head_dim × bits / 8) + 4 (fp16 scale and zero). The first and last
  min(2, layers // 2) decoder layers stay at the model's dtype (config.py:178-213), none in a model
  with state layers.
- Per-token-head (TRITON_ATTN, triton_attn.py:307-319): per KV head (head_size + head_size_v) × 1 B
  (int4: each halved) + 2 fp32 scales.
- NVFP4 (FlashInfer, flashinfer.py:557-570): 2 × KV heads slots of head_dim // 2 + head_dim // 16 B.
- fp8_ds_mla 656 B and nvfp4_ds_mla 352 B per token per layer (model_executor/layers/attention/
  mla_attention.py:1386), plus the sparse indexer's key (128 + 4 B).
"""

from __future__ import annotations

import math

import pytest
from test_estimate_layers import _write
from test_ledger_state import FIX, lane, machine

from recipegen.costmodel.lane_estimate import estimate_lane
from recipegen.ledger import compute_lane
from recipegen.ledger.kv import kv_dtype, lane_attention
from recipegen.load.recipe import load_recipe
from recipegen.modelimport import import_model

SEQ = 32768
INDEXER = 128 + 4          # DeepSeek sparse attention's indexer key per token per layer: 128 fp8 + 1 fp32 scale


def _model(name: str):
    return import_model(FIX / name)[0]


def _run(name: str, cc: str, flag: str, tp: int = 2, **kw):
    extra = ["--kv-cache-dtype", flag, *kw.pop("extra", [])]
    return compute_lane(_model(name), machine(cc), lane(tp=tp, extra=extra, **kw))


def _refusals(got) -> list:
    return [v for v in got.violations if v.kind == "attention"]


# --- TurboQuant -------------------------------------------------------------------------------

# Qwen3-30B-A3B: 48 full-attention layers, 4 KV heads of head_dim 128; TP 2 → 2 KV heads per GPU.
TURBOQUANT_SLOTS_128 = {
    "turboquant_k8v4": 128 + (128 * 4 // 8 + 4),                     # 128 + 68 = 196
    "turboquant_4bit_nc": (128 * 4 // 8 + 2) + (128 * 4 // 8 + 4),   # 66 + 68 = 134
    "turboquant_k3v4_nc": (128 * 3 // 8 + 2) + (128 * 4 // 8 + 4),   # 50 + 68 = 118
    "turboquant_3bit_nc": (128 * 3 // 8 + 2) + (128 * 3 // 8 + 4),   # 50 + 52 = 102
}


@pytest.mark.parametrize("flag", sorted(TURBOQUANT_SLOTS_128))
def test_turboquant_packs_one_slot_per_kv_head_and_keeps_the_boundary_layers(flag: str) -> None:
    slot = TURBOQUANT_SLOTS_128[flag]
    assert slot == {"turboquant_k8v4": 196, "turboquant_4bit_nc": 134, "turboquant_k3v4_nc": 118,
                    "turboquant_3bit_nc": 102}[flag]               # all even: no rounding
    got = _run("qwen3-30b-a3b", "9.0", flag)
    # Layers 0, 1, 46 and 47 (the first and last min(2, 48 // 2) = 2) cache at bf16:
    # 2 (K, V) × 2 heads × 128 × 2 B = 1,024 B; the other 44 at 2 heads × slot.
    packed, kept = 2 * slot, 2 * 2 * 128 * 2
    assert got.fig("kv.layers[0].bytes_per_token").value == packed
    assert got.fig("kv.layers[0].bytes_per_token").operands["layers"] == 44
    assert got.fig("kv.layers[1].bytes_per_token").value == kept
    assert got.fig("kv.layers[1].bytes_per_token").operands["layers"] == 4
    assert got.fig("kv.bytes_per_sequence").value == (44 * packed + 4 * kept) * SEQ
    assert got.fig("kv.lane_bytes_per_token").value == (44 * packed + 4 * kept) * 2
    assert not _refusals(got)
    assert any(n.startswith(f"--kv-cache-dtype {flag}: vLLM 0.33's TURBOQUANT") and "0, 1, 46, 47" in n
               for n in got.notes)


def test_turboquant_rounds_an_odd_slot_up_to_even() -> None:
    # head_dim 72, turboquant_k3v4_nc: key ceil(72 × 3 / 8) + 2 = 27 + 2 = 29, value 72 × 4 / 8 + 4 = 40:
    # 69 B, rounded up to 70 (config.py:168-175). TP 2: 2 KV heads per GPU.
    base = _model("qwen3-30b-a3b")
    model = base.model_copy(update={"attention": [g.model_copy(update={"head_dim": 72}) for g in base.attention]})
    got = compute_lane(model, machine("9.0"), lane(tp=2, extra=["--kv-cache-dtype", "turboquant_k3v4_nc"]))
    assert math.ceil(72 * 3 / 8) + 2 + 72 * 4 // 8 + 4 == 69
    assert got.fig("kv.layers[0].bytes_per_token").value == 2 * 70
    assert got.fig("kv.layers[1].bytes_per_token").value == 2 * 2 * 72 * 2


def test_turboquant_on_a_hybrid_model_quantizes_every_attention_layer_and_sets_the_page() -> None:
    # Qwen3-Next: 12 full-attention layers, 2 KV heads of 256 (TP 2: 1 per GPU), 36 Gated DeltaNet
    # layers. A model with state layers keeps no layer at the model's dtype (config.py:194-203).
    # turboquant_4bit_nc at head_dim 256: (128 + 2) + (128 + 4) = 262 B per KV head.
    got = _run("qwen3-next-80b-a3b-thinking", "9.0", "turboquant_4bit_nc")
    assert got.fig("kv.layers[0].bytes_per_token").value == 262
    assert got.fig("kv.layers[0].bytes_per_token").operands["layers"] == 12
    # The page is built on the packed page (platforms/interface.py:1004-1030): state at TP 2
    # 3 × 4096 × 2 + 16 × 128 × 128 × 2 = 548,864 B; GDN checkpoints on SM90 → align 64;
    # block 64 × ceil(548,864 / (64 × 262)) = 64 × 33 = 2,112 tokens, page 2,112 × 262 B.
    assert got.fig("kv.block_tokens").value == 64 * math.ceil(548_864 / (64 * 262)) == 2112
    assert got.fig("kv.page_bytes").value == 2112 * 262
    # 1 attention group + 3 GDN groups of 12 layers; 32,768 tokens = 16 blocks, 3 blocks per GDN group.
    assert got.fig("kv.bytes_per_sequence").value == (math.ceil(SEQ / 2112) + 3 * 3) * 12 * 2112 * 262
    assert not _refusals(got)


def test_the_estimate_reads_turboquant_kv_at_the_ledgers_bytes(tmp_path) -> None:
    path = _write(tmp_path, "qwen3-next-80b-a3b-rtx5090", "    extra_args: [--cpu-offload-params, experts]\n",
                  "    extra_args: [--cpu-offload-params, experts, --kv-cache-dtype, turboquant_4bit_nc]\n")
    loaded = load_recipe(str(path))
    est = estimate_lane(loaded, "chat", streams=[1, 2])
    for streams in (1, 2):
        # 12 full-attention layers × 2 KV heads × 262 B at 4,096 tokens per sequence (TP 1)
        assert est.point(streams).terms.kv_bytes == streams * 12 * 4096 * 2 * 262
    ledger = compute_lane(loaded.recipe.model, loaded.recipe.machines["desk"], loaded.recipe.lanes[0])
    assert ledger.fig("kv.page_bytes").value == ledger.fig("kv.block_tokens").value * 2 * 262


def test_turboquant_refusals() -> None:
    # gpt-oss: sliding layers 2, 4, …, 32 are not boundary layers, and TURBOQUANT has no sliding window.
    (r,) = _refusals(_run("gpt-oss-120b", "9.0", "turboquant_k8v4"))
    assert "sliding-window" in r.message and "TURBOQUANT" in r.message
    # Llama-4: chunked layers 0, 1 and 46 stay unquantized, and their TURBOQUANT impl fails on "auto".
    (r,) = _refusals(_run("llama-4-maverick-17b-128e-instruct", "9.0", "turboquant_3bit_nc", tp=8))
    assert "chunked" in r.message and "0, 1, 46" in r.message
    # MLA: TURBOQUANT is no MLA backend, and no MLA backend lists it; KV at the model's dtype.
    got = _run("glm-5", "9.0", "turboquant_k8v4", tp=8)
    (r,) = _refusals(got)
    assert "no MLA attention backend" in r.message
    assert got.fig("kv.bytes_per_sequence").value == 78 * ((512 + 64) * 2 + INDEXER) * SEQ


# --- Per-token-head scaling -------------------------------------------------------------------

@pytest.mark.parametrize(("flag", "per_head"), [
    ("int8_per_token_head", 2 * 128 * 1 + 2 * 4),          # K and V 128 × 1 B + 2 fp32 scales = 264
    ("fp8_per_token_head", 2 * 128 * 1 + 2 * 4),
    ("int4_per_token_head", 2 * (128 // 2) * 1 + 2 * 4),   # 4-bit values two a byte: 136
])
def test_per_token_head_caches_one_scale_per_head_and_side(flag: str, per_head: int) -> None:
    got = _run("qwen3-30b-a3b", "9.0", flag)
    assert got.fig("kv.layers[0].bytes_per_token").value == 2 * per_head        # 2 KV heads per GPU
    assert got.fig("kv.bytes_per_sequence").value == 48 * 2 * per_head * SEQ
    assert not _refusals(got)


def test_per_token_head_on_sliding_and_chunked_layers() -> None:
    # gpt-oss-120b, TP 2: 4 of 8 KV heads of 64 per GPU, int8: 4 × (2 × 64 + 8) = 544 B per layer;
    # 18 sliding layers hold 128 tokens, 18 full layers all 32,768.
    got = _run("gpt-oss-120b", "9.0", "int8_per_token_head")
    per_layer = 4 * (2 * 64 + 2 * 4)
    assert got.fig("kv.bytes_per_sequence").value == 18 * per_layer * SEQ + 18 * per_layer * 128
    # Llama-4 Maverick, TP 8: 1 KV head of 128 per GPU, fp8: 2 × 128 + 8 = 264 B; chunked layers hold
    # min(8192 + 8192, 131,072) tokens.
    got = _run("llama-4-maverick-17b-128e-instruct", "9.0", "fp8_per_token_head", tp=8, max_model_len=131072,
               extra=["--max-num-batched-tokens", "8192"])
    assert got.fig("kv.bytes_per_sequence").value == 12 * 264 * 131072 + 36 * 264 * 16384
    assert not _refusals(got)


def test_per_token_head_on_mla_is_refused() -> None:
    (r,) = _refusals(_run("deepseek-v3", "9.0", "int8_per_token_head", tp=8))
    assert "no MLA attention backend" in r.message


# --- NVFP4 ------------------------------------------------------------------------------------

def test_nvfp4_packs_fp4_values_and_a_scale_per_16() -> None:
    # head_dim 128: 128 // 2 + 128 // 16 = 64 + 8 = 72 B a side; 2 sides × 2 KV heads = 288 B per layer.
    got = _run("qwen3-30b-a3b", "9.0", "nvfp4")
    assert got.fig("kv.layers[0].bytes_per_token").value == 2 * 2 * (64 + 8)
    assert got.fig("kv.bytes_per_sequence").value == 48 * 288 * SEQ
    # gpt-oss on the SM100 family: head_dim 64 → 32 + 4 = 36 B a side, 4 heads: 288 B; sliding holds 128.
    for flag in ("nvfp4", "nvfp4_4over6"):
        got = _run("gpt-oss-120b", "10.0", flag)
        assert got.fig("kv.bytes_per_sequence").value == 18 * 2 * 4 * 36 * (SEQ + 128), flag
        assert not _refusals(got)
    # Llama-4 chunked layers, TP 8 on SM100: 1 KV head × 2 × 72 = 144 B.
    got = _run("llama-4-maverick-17b-128e-instruct", "10.0", "nvfp4", tp=8, max_model_len=131072,
               extra=["--max-num-batched-tokens", "8192"])
    assert got.fig("kv.bytes_per_sequence").value == 12 * 144 * 131072 + 36 * 144 * 16384


def test_nvfp4_refusals() -> None:
    (r,) = _refusals(_run("qwen3-30b-a3b", "9.0", "nvfp4_4over6"))
    assert "plain nvfp4 only" in r.message and r.suggestion == "--kv-cache-dtype nvfp4"
    (r,) = _refusals(_run("gpt-oss-120b", "9.0", "nvfp4"))               # head_dim 64 off SM100
    assert "head size 64" in r.message
    for cc in ("7.5", "11.0"):
        (r,) = _refusals(_run("qwen3-30b-a3b", cc, "nvfp4"))
        assert f"compute capability {cc}" in r.message
    got = _run("deepseek-v3", "10.0", "nvfp4", tp=8)
    (r,) = _refusals(got)
    assert "config/vllm.py:3422-3438" in r.message
    assert got.fig("kv.bytes_per_sequence").value == 61 * (512 + 64) * 2 * SEQ      # the model's bf16


# --- The DeepSeek layouts ---------------------------------------------------------------------

@pytest.mark.parametrize("cc", ["9.0", "10.0", "12.0"])
def test_fp8_ds_mla_named_outright_is_656_bytes_on_each_sparse_backend(cc: str) -> None:
    # 512 fp8 + 4 fp32 scales + 64 bf16 RoPE values = 512 + 16 + 128 = 656 B; FLASHMLA_SPARSE on 9.x
    # and 10.x, FLASHINFER_MLA_SPARSE_SM120 on 12.x.
    got = _run("glm-5", cc, "fp8_ds_mla", tp=8)
    assert got.fig("kv.bytes_per_sequence").value == 78 * (512 + 4 * 4 + 64 * 2 + INDEXER) * SEQ
    assert not _refusals(got)


def test_nvfp4_ds_mla_on_the_sm100_family() -> None:
    # 512 fp4 values two a byte (256 B) + 64 fp8 RoPE values + 32 fp8 scales (one per 16) = 352 B.
    got = _run("glm-5", "10.0", "nvfp4_ds_mla", tp=8)
    assert got.fig("kv.layers[0].bytes_per_token").value == 512 // 2 + 64 + 512 // 16 + INDEXER == 484
    assert got.fig("kv.bytes_per_sequence").value == 78 * 484 * SEQ
    assert not _refusals(got)


def test_deepseek_layout_refusals() -> None:
    (r,) = _refusals(_run("glm-5", "9.0", "nvfp4_ds_mla", tp=8))
    assert "10.x only" in r.message
    (r,) = _refusals(_run("glm-5", "12.0", "nvfp4_ds_mla", tp=8))
    assert "FLASHINFER_MLA_SPARSE_SM120" in r.message
    (r,) = _refusals(_run("deepseek-v3.2", "8.9", "fp8_ds_mla", tp=8))
    assert "no sparse-MLA attention backend for compute capability 8.9" in r.message
    for flag in ("fp8_ds_mla", "nvfp4_ds_mla"):
        (r,) = _refusals(_run("deepseek-v3", "10.0", flag, tp=8))           # dense MLA
        assert "this model's MLA is dense" in r.message
    (r,) = _refusals(_run("qwen3-30b-a3b", "10.0", "fp8_ds_mla"))           # non-MLA
    assert "DeepSeek sparse-MLA layout" in r.message
    (r,) = _refusals(_run("qwen3-30b-a3b", "9.0", "nvfp4_ds_mla"))
    assert "only on compute capability 10.x" in r.message


def test_nvfp4_ds_mla_on_non_mla_sm100_stays_an_upper_bound() -> None:
    # FlashInfer takes the name by its nvfp4 prefix on SM100 but does not pack it: not sized, counted at
    # the model's bf16 (2 × 2 heads × 128 × 2 B per layer), no refusal.
    got = _run("qwen3-30b-a3b", "10.0", "nvfp4_ds_mla")
    assert got.fig("kv.bytes_per_sequence").value == 48 * 2 * 2 * 128 * 2 * SEQ
    assert not _refusals(got)
    assert any("nvfp4_ds_mla on non-MLA attention is not modelled" in n for n in got.notes)


# --- No CUDA backend, and fp8_e5m2 on MLA ------------------------------------------------------

@pytest.mark.parametrize("flag", ["fp8_inc", "octave_k3v4", "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit"])
def test_values_no_cuda_backend_stores_are_refused(flag: str) -> None:
    got = _run("qwen3-30b-a3b", "9.0", flag)
    (r,) = _refusals(got)
    assert r.message.startswith(f"--kv-cache-dtype {flag}:") and "NVIDIA" in r.message
    assert got.fig("kv.bytes_per_sequence").value == 48 * 2 * 2 * 128 * 2 * SEQ       # the model's bf16


def test_fp8_e5m2_on_mla_is_refused_and_its_bytes_are_unchanged() -> None:
    # No MLA backend lists fp8_e5m2; the figure stays what it was: (512 + 64) × 1 B per layer.
    got = _run("deepseek-v3", "9.0", "fp8_e5m2", tp=8)
    (r,) = _refusals(got)
    assert "no MLA attention backend" in r.message
    assert got.fig("kv.bytes_per_sequence").value == 61 * (512 + 64) * SEQ


# --- One owner ---------------------------------------------------------------------------------

def test_the_pool_and_the_reads_take_the_same_bytes() -> None:
    model, m = _model("qwen3-30b-a3b"), machine("9.0")
    ln = lane(tp=2, extra=["--kv-cache-dtype", "turboquant_k8v4"])
    notes: list[str] = []
    groups = lane_attention(model, m, ln, kv_dtype(model, m, ln, notes), notes)
    assert [(len(g.layers), rate, layout) for g, rate, layout in groups] == [
        (44, 2 * 196, "turboquant_k8v4"), (4, 2 * 2 * 128 * 2, None)]
    got = compute_lane(model, m, ln)
    assert [got.fig(f"kv.layers[{i}].bytes_per_token").value for i in range(2)] == [r for _, r, _ in groups]
