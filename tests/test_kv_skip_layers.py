"""`--kv-cache-dtype-skip-layers`: the attention layers vLLM 0.33 keeps at the model's dtype beside a
quantized KV cache, counted in the ledger's pool.

vLLM's rules, which every expected figure below follows by hand arithmetic from the model geometry:

- The flag is a list of strings, its values space-separated after it (argparse `nargs="+"`:
  vllm/engine/arg_utils.py:255-259, 813-816, 1415-1417; no comma splitting).
- An attention layer is skipped when `str(its decoder-layer index)` is in the list, or, for a
  non-MLA layer with a sliding window, when `sliding_window` is (model_executor/layers/attention/
  attention.py:299-315; MLA by index only, mla_attention.py:494-500). It then caches at "auto", the
  model's dtype. A value that names no attention layer skips nothing, and vLLM checks no further.
- Layers of one attention kind stay one KV cache group whose block costs the sum of the layers'
  pages (v1/core/kv_cache_planning.py:1140-1145, v1/kv_cache_interface.py:1318-1320), so the pool in
  tokens is pool ÷ Σ layers × bytes per token per layer.
- A kept sliding-window layer pads its page to the one a block of the cache dtype fills
  (platforms/interface.py:823-937; attention.py:626-673): block = 16 × ⌈16 × S / (16 × P)⌉ tokens at
  P bytes a token, the sliding layer takes the largest multiple of 16 tokens of S bytes that fits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_ledger_state import FIX, lane, machine

from recipegen.ledger import compute_lane, compute_ledger
from recipegen.ledger.flags import flag_values, parsed_args
from recipegen.ledger.kv import skip_layers
from recipegen.ledger.report_lane import render_lane
from recipegen.load.recipe import load_recipe
from recipegen.modelimport import import_model

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
QWEN = RECIPES / "qwen3-30b-a3b-rtx4090.yaml"
GPT_OSS = RECIPES / "gpt-oss-120b-l40s.yaml"
DEEPSEEK = RECIPES / "deepseek-v3-fp8-h200x8.yaml"
FLAG = "--kv-cache-dtype-skip-layers"


def _lane(path: Path, *extra: str):
    """The recipe's first lane with `extra` appended to its extra_args, loaded from YAML as written."""
    text = path.read_text()
    args = ", ".join(f'"{a}"' for a in extra)
    before = "extra_args: [--cpu-offload-params, experts]"
    if before in text:
        assert text.count(before) == 1
        text = text.replace(before, f"extra_args: [--cpu-offload-params, experts, {args}]")
    else:                       # no extra_args: give the lane some, under its gpus
        assert "extra_args" not in text and text.count("\n    gpus: ") == 1
        head, tail = text.split("\n    gpus: ")
        gpus, rest = tail.split("\n", 1)
        text = f"{head}\n    gpus: {gpus}\n    extra_args: [{args}]\n{rest}"
    return compute_ledger(load_recipe(path, text=text)).lanes[0]


# --- the flag's value ----------------------------------------------------------------------------

def test_the_flag_takes_space_separated_values_as_vllm_reads_them() -> None:
    assert flag_values([FLAG, "0", "47"], FLAG) == ("0", "47")
    assert flag_values(["--kv_cache_dtype_skip_layers", "sliding_window", "3"], FLAG) == ("sliding_window", "3")
    # `=` gives one value, and a comma splits nothing: "0,47" is one string
    assert flag_values([f"{FLAG}=0,47"], FLAG) == ("0,47",)
    assert flag_values([FLAG, "0,47"], FLAG) == ("0,47",)
    # the values end at the next flag
    assert flag_values([FLAG, "0", "--kv-cache-dtype", "fp8"], FLAG) == ("0",)
    # a repeat would be kept silently by argparse (the last one): the recipe loader refuses it
    assert parsed_args([FLAG, "0", FLAG, "5"]).problems


def test_values_that_name_no_attention_layer_are_ignored() -> None:
    model = import_model(FIX / "qwen3-30b-a3b")[0]            # 48 full-attention layers, 0-47
    got = skip_layers(model, lane(extra=[FLAG, "0", "47", "48", "07", "-1", "0,1", "full", "sliding_window"]))
    assert got.layers == {0, 47}
    # 48: past the last layer; "07", "-1", "0,1", "full": not str(index) of any layer; no sliding layers
    assert got.ignored == ("48", "07", "-1", "0,1", "full", "sliding_window")
    gpt = import_model(FIX / "gpt-oss-120b")[0]                 # 36 layers, the even ones sliding
    assert skip_layers(gpt, lane(extra=[FLAG, "sliding_window", "1"])).layers == set(range(0, 36, 2)) | {1}


# --- full attention: Qwen3-30B-A3B on one RTX 4090 ------------------------------------------------

# 48 full-attention layers, 4 KV heads of head_dim 128, TP 1: per token and layer
# 2 (K, V) × 4 × 128 × 2 B = 2,048 B at bf16 and 1,024 B at fp8.
BF16, FP8 = 2 * 4 * 128 * 2, 2 * 4 * 128 * 1


def test_no_skip_is_unchanged() -> None:
    plain = _lane(QWEN)
    assert plain.fig("kv.lane_bytes_per_token").value == 48 * BF16 == 98_304
    fp8 = _lane(QWEN, "--kv-cache-dtype", "fp8")
    assert fp8.fig("kv.lane_bytes_per_token").value == 48 * FP8 == 49_152
    assert fp8.fig("kv.layers[0].bytes_per_token").operands["layers"] == 48
    assert "kv.layers[1].bytes_per_token" not in fp8.figures
    assert not [n for n in fp8.notes if FLAG in n]


def test_fp8_with_the_first_and_last_layer_kept_at_bf16() -> None:
    got = _lane(QWEN, "--kv-cache-dtype", "fp8", FLAG, "0", "47")
    rate = 2 * BF16 + 46 * FP8
    assert rate == 51_200
    assert got.fig("kv.layers[0].bytes_per_token").value == FP8
    assert got.fig("kv.layers[0].bytes_per_token").operands["layers"] == 46
    assert got.fig("kv.layers[1].bytes_per_token").value == BF16
    assert got.fig("kv.layers[1].bytes_per_token").operands["layers"] == 2
    assert got.fig("kv.bytes_per_sequence").value == rate * 32768
    assert got.fig("kv.lane_bytes_per_token").value == rate
    pool = got.fig("hbm.kv_pool").value
    assert got.fig("kv.tokens").value == pytest.approx(pool / rate)
    assert got.fig("kv.full_sequences").value == int(pool // (rate * 32768))
    # the old "not modelled" note is gone; the split is said instead
    assert not [n for n in got.notes if "not modelled" in n and FLAG in n]
    [note] = [n for n in got.notes if n.startswith(f"{FLAG} 0 47:")]
    assert "46 full layers at 1,024 B per token (fp8)" in note
    assert "full layers 0, 47 at 2,048 B per token (bf16, the model's dtype)" in note
    assert "attention.py:299-315" in note
    # --explain shows the split: how many layers at which bytes per token
    text = render_lane(got, explain=True)
    assert "KV per token per layer, full attention (46 layers, per GPU, fp8) = 1,024" in text
    assert "KV per token per layer, full attention (2 layers, per GPU, model's dtype, bf16) = 2,048" in text
    assert "layers 0, 47: named by --kv-cache-dtype-skip-layers" in text


def test_skip_without_a_quantized_cache_changes_nothing() -> None:
    got = _lane(QWEN, FLAG, "0", "47")
    assert got.fig("kv.lane_bytes_per_token").value == 48 * BF16
    assert [n for n in got.notes if n.startswith(f"{FLAG} 0 47: the layers it names cache at the model's dtype")]


def test_a_comma_separated_value_is_ignored_as_vllm_ignores_it() -> None:
    got = _lane(QWEN, "--kv-cache-dtype", "fp8", FLAG, "0,47")
    assert got.fig("kv.lane_bytes_per_token").value == 48 * FP8      # nothing skipped
    [note] = [n for n in got.notes if n.startswith(f"{FLAG} '0,47':")]
    assert "ignored" in note and "space-separated" in note


# --- sliding-window layers: gpt-oss-120b on one L40S -----------------------------------------------

# 36 layers, 8 KV heads of head_dim 64: the 18 even layers slide over 128 tokens, the 18 odd are full.
# Per token and layer: 2 × 8 × 64 × 2 B = 2,048 B at bf16, 1,024 B at fp8.
OSS_BF16, OSS_FP8 = 2 * 8 * 64 * 2, 2 * 8 * 64 * 1
OSS_SEQ = 131072


def test_sliding_window_keeps_every_sliding_layer_at_bf16() -> None:
    got = _lane(GPT_OSS, "--kv-cache-dtype", "fp8", FLAG, "sliding_window")
    # S = 2 × P: block = 16 × ⌈16 × 2,048 / (16 × 1,024)⌉ = 32 tokens, page 32 × 1,024 = 32,768 B; the
    # sliding layer's largest 16-multiple block within it is 32,768 // 2,048 = 16 tokens: no padding
    sliding = got.fig("kv.layers[0].bytes_per_token")
    assert sliding.value == OSS_BF16 and sliding.operands["layers"] == 18
    assert sliding.operands["page_bytes"] == 32 * OSS_FP8 and sliding.operands["block_tokens"] == 16
    full = got.fig("kv.layers[1].bytes_per_token")
    assert full.value == OSS_FP8 and full.operands["layers"] == 18
    per_seq = 18 * OSS_BF16 * 128 + 18 * OSS_FP8 * OSS_SEQ
    assert got.fig("kv.bytes_per_sequence").value == per_seq
    rate = per_seq / OSS_SEQ
    assert got.fig("kv.lane_bytes_per_token").value == rate
    assert got.fig("kv.tokens").value == pytest.approx(got.fig("hbm.kv_pool").value / rate)
    text = render_lane(got, explain=True)
    assert "sliding attention (18 layers, per GPU, model's dtype, bf16) = 2,048" in text
    assert "full attention (18 layers, per GPU, fp8) = 1,024" in text


def test_a_kept_sliding_layer_pads_to_the_quantized_page() -> None:
    got = _lane(GPT_OSS, "--kv-cache-dtype", "int8_per_token_head", FLAG, "sliding_window")
    # int8 per token head: 8 heads × (2 × 64 × 1 B + 2 × 4 B scales) = 1,088 B a token.
    primary = 8 * (2 * 64 + 2 * 4)
    assert primary == 1088
    # block = 16 × ⌈16 × 2,048 / (16 × 1,088)⌉ = 16 × 2 = 32 tokens: page 32 × 1,088 = 34,816 B; the
    # sliding layer fits 34,816 // 2,048 = 17 → 16 tokens: 34,816 / 16 = 2,176 B a token
    page = 32 * primary
    assert page == 34_816 and page // 16 == 2176
    sliding = got.fig("kv.layers[0].bytes_per_token")
    assert sliding.value == 2176 and sliding.operands["bytes_per_token_unpadded"] == OSS_BF16
    assert got.fig("kv.layers[1].bytes_per_token").value == primary
    assert got.fig("kv.bytes_per_sequence").value == 18 * 2176 * 128 + 18 * primary * OSS_SEQ
    assert [n for n in got.notes if n.startswith("sliding-window layers kept at the model's dtype (2,048 B")]


# --- MLA: DeepSeek-V3 on 8 H200 --------------------------------------------------------------------

def test_mla_layer_kept_by_index() -> None:
    got = _lane(DEEPSEEK, "--kv-cache-dtype", "fp8", FLAG, "3", "sliding_window")
    # 61 MLA layers caching (512 + 64) latent values on every rank: 576 B at fp8, 1,152 B at bf16.
    # `sliding_window` names no layer (MLA has none, and MLA reads indices only).
    assert got.fig("kv.layers[0].bytes_per_token").value == 576
    assert got.fig("kv.layers[0].bytes_per_token").operands["layers"] == 60
    assert got.fig("kv.layers[1].bytes_per_token").value == 1152
    assert got.fig("kv.layers[1].bytes_per_token").operands["layers"] == 1
    per_gpu = 60 * 576 + 1152
    assert got.fig("kv.lane_bytes_per_token").value == per_gpu * 8
    assert got.fig("kv.tokens").value == pytest.approx(got.fig("hbm.kv_pool").value * 8 / (per_gpu * 8))
    assert [n for n in got.notes if n.startswith(f"{FLAG} 'sliding_window': names no attention layer")]


def test_sparse_mla_layer_kept_by_index_on_hopper_and_sm120() -> None:
    model = import_model(FIX / "deepseek-v3.2")[0]            # 61 sparse MLA layers, indexer key 128 + 4 B
    indexer = 128 + 128 // 128 * 4
    got = compute_lane(model, machine("9.0"), lane(tp=8, extra=["--kv-cache-dtype", "fp8", FLAG, "0"]))
    # Hopper, fp8: FLASHMLA_SPARSE's fp8_ds_mla, 512 + 4 × 4 + 64 × 2 = 656 B; layer 0 at bf16 (576 × 2)
    assert got.fig("kv.layers[0].bytes_per_token").value == 656 + indexer
    assert got.fig("kv.layers[1].bytes_per_token").value == 1152 + indexer
    assert got.fig("kv.lane_bytes_per_token").value == (60 * (656 + indexer) + 1152 + indexer) * 8
    # SM120's only sparse backend stores fp8_ds_mla for "auto" too: nothing changes
    sm120 = compute_lane(model, machine("12.0"), lane(tp=8, extra=["--kv-cache-dtype", "fp8", FLAG, "0"]))
    assert sm120.fig("kv.lane_bytes_per_token").value == 61 * (656 + indexer) * 8


# --- TurboQuant: its first and last layers join the list ---------------------------------------------

def test_turboquant_merges_its_boundary_with_the_skip_list() -> None:
    model = import_model(FIX / "qwen3-30b-a3b")[0]
    got = compute_lane(model, machine("9.0"), lane(tp=2, extra=["--kv-cache-dtype", "turboquant_4bit_nc",
                                                                  FLAG, "10"]))
    # TP 2 → 2 KV heads a GPU; slot (128 × 4 / 8 + 2) + (128 × 4 / 8 + 4) = 134 B; kept: 2 × 2 × 128 × 2 B
    packed, kept = 2 * 134, 2 * 2 * 128 * 2
    assert got.fig("kv.layers[0].bytes_per_token").value == packed
    assert got.fig("kv.layers[0].bytes_per_token").operands["layers"] == 43
    kept_fig = got.fig("kv.layers[1].bytes_per_token")
    assert kept_fig.value == kept and kept_fig.operands["layers"] == 5        # 0, 1, 10, 46, 47
    assert "layers 0, 1, 46, 47: the first and last decoder layers" in kept_fig.formula
    assert "layer 10: named by --kv-cache-dtype-skip-layers" in kept_fig.formula
    assert got.fig("kv.lane_bytes_per_token").value == (43 * packed + 5 * kept) * 2


# --- beside state layers ---------------------------------------------------------------------------
#
# vLLM 0.33 sizes the attention block for the state at the cache dtype (platforms/interface.py:783-787,
# :940-1135: block = align × ⌈state / (align × P)⌉), then, with the skip list, bumps it in steps of
# itself until block × P covers max(16 × S, the padded state page) (:909-925) and pads the state to
# block × P (:931-937). A kept full-attention layer's page is block × S (attention.py:674-682), the
# largest; the ledger prices every page at it, every attention layer at one block of tokens a page,
# and groups of min(counts) layers over (layers at the cache dtype, kept layers, state layers)
# (v1/core/kv_cache_planning.py:416-556: the group size is the smallest count unless the largest is
# under 1.5 × it).

NEXT = RECIPES / "qwen3-next-80b-a3b-rtx5090.yaml"


def test_a_kept_layer_beside_state_layers_never_adds_room() -> None:
    fp8 = _lane(NEXT, "--kv-cache-dtype", "fp8")
    got = _lane(NEXT, "--kv-cache-dtype", "fp8", FLAG, "3")
    # Qwen3-Next-80B-A3B: 12 full-attention layers (2 KV heads × 256), 36 Gated DeltaNet layers
    # (conv kernel 4; 16 key heads × 128, 32 value heads × 128; bf16 state), one RTX 5090 (12.0,
    # key head 128: GDN checkpoints, align 64, 3 state blocks a sequence), max_model_len 65,536
    fp8_rate, bf16_rate = 2 * 2 * 256 * 1, 2 * 2 * 256 * 2                    # 1,024 and 2,048 B
    state = 3 * (2 * 16 * 128 + 32 * 128) * 2 + 32 * 128 * 128 * 2          # 49,152 + 1,048,576
    assert got.fig("kv.state_bytes_per_sequence_per_layer").value == state == 1_097_728
    block = 64 * -(-state // (64 * fp8_rate))                                 # 1,088
    required = max(16 * bf16_rate, block * fp8_rate)                          # the padded state page
    assert block * -(-required // (block * fp8_rate)) == block                # no bump here
    page = block * bf16_rate
    assert got.fig("kv.block_tokens").value == block == 1088
    assert got.fig("kv.page_bytes").value == page == 2_228_224
    # counts 11 (fp8), 1 (kept), 36 (state): groups of 1
    blocks = (11 + 1) * -(-65_536 // block) + 36 * 3                           # 12 × 61 + 108
    assert got.fig("kv.bytes_per_block").value == page
    assert got.fig("kv.bytes_per_sequence").value == blocks * page == 840 * 2_228_224
    pool = got.fig("hbm.kv_pool").value
    assert pool == fp8.fig("hbm.kv_pool").value
    assert got.fig("kv.tokens").value == pytest.approx(pool * 65_536 / (blocks * page))
    # without the flag: page block × 1,024, 1 + 3 groups of 12
    plain = (1 * 61 + 3 * 3) * 12 * block * fp8_rate
    assert fp8.fig("kv.bytes_per_sequence").value == plain
    assert got.fig("kv.tokens").value <= fp8.fig("kv.tokens").value
    assert got.fig("kv.full_sequences").value <= fp8.fig("kv.full_sequences").value
    assert any("beside state layers" in n and "upper bound" in n for n in got.notes)
    assert not any("the state is left out" in n for n in got.notes)


def test_the_state_page_has_one_owner() -> None:
    for name in ("qwen3-next-80b-a3b-rtx5090", "qwen3.5-35b-a3b-rtx5090", "nemotron-3-nano-30b-a3b-rtx4090"):
        got = compute_ledger(load_recipe(RECIPES / f"{name}.yaml")).lanes[0]
        fig = got.fig("kv.state_bytes_per_sequence_per_layer")
        assert fig.operands["conv_state_bytes"] + fig.operands["ssm_state_bytes"] == fig.value
        assert fig.operands["conv_state_bytes"] == ((fig.operands["conv_kernel"] - 1) * fig.operands["conv_channels"]
                                                    * fig.operands["conv_dtype_bytes"])
