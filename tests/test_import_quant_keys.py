"""`quantization_config` keys read as vLLM 0.33 reads them, and every other key refused by name.

ModelOpt's flat config.json form (nvidia/Kimi-K2.7-Code-NVFP4, tests/fixtures/hf_configs/kimi-k2.7-code-nvfp4/,
provenance in its SOURCE.md) names the modules left unquantized `ignore` and the KV cache format `kv_cache_scheme`
(vLLM 0.33.0 model_executor/layers/quantization/modelopt.py ModelOptQuantConfigBase.from_config;
utils/torch_utils.py get_kv_cache_quant_algo_string). The expected figures are derived here by hand from the
model's geometry, not from the importer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from recipegen.common.errors import InputError
from recipegen.modelimport import import_model

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "hf_configs"
KIMI = "kimi-k2.7-code-nvfp4"


def copy_fixture(tmp_path: Path, fixture: str, edit: Callable[[dict], Any] | None = None, *,
                 file: str = "config.json") -> Path:
    """A copy of the fixture folder (without its SOURCE.md) in tmp_path, `edit` applied to `file`'s JSON."""
    folder = tmp_path / fixture
    folder.mkdir(parents=True)
    for f in (FIX / fixture).iterdir():
        if f.name != "SOURCE.md":
            (folder / f.name).write_bytes(f.read_bytes())
    if edit is not None:
        doc = json.loads((folder / file).read_text())
        edit(doc)
        (folder / file).write_text(json.dumps(doc, indent=2))
    return folder


def test_modelopt_flat_ignore_and_kv_cache_scheme() -> None:
    m, text = import_model(FIX / KIMI)
    # kv_cache_scheme {dynamic false, num_bits 8, type float}: an FP8 cache, 61 MLA layers × (512 + 64) × 1 B.
    assert m.kv_bytes_per_token == 61 * (512 + 64) * 1 == 35_136
    # `ignore` leaves lm_head, the embeddings, all of layer 0, every layer's self_attn and shared expert, the vision
    # tower and projector unquantized: every non-routed tensor is bf16 (routers are never quantized; their noaux_tc
    # correction biases are fp32). Kimi-K2 geometry: h 7168, vocab 163,840, 61 layers, 64 heads, MLA ranks 1536 / 512.
    h, vocab, layers = 7168, 163_840, 61
    attn = (1536 * h + 1536 + 64 * 192 * 1536          # q_a_proj, q_a_layernorm, q_b_proj
            + 576 * h + 512 + 64 * 256 * 512            # kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj
            + h * 64 * 128)                             # o_proj
    params = (2 * vocab * h + h                         # embeddings, lm_head, final norm
              + layers * (2 * h + attn)                 # two norms and attention per layer
              + 3 * 18432 * h                           # layer 0's dense MLP
              + 60 * (384 * h + 3 * 2048 * h)           # routers and shared experts of the 60 MoE layers
              + 471_143_920)                            # MoonViT + projector (Kimi-K2.5's published count, same tower)
    assert m.dense_bytes == 2 * params + 60 * 384 * 4 == 24_386_751_456
    # The old reading (exclude_modules only: every linear NVFP4) gave 10,482,462,096 B, 2.3× too little.
    doc = yaml.safe_load(text)
    assert "`quantization_config.ignore` (125 patterns)" in doc["expert_tensors"]["source"]
    assert "quantization_config.kv_cache_scheme" in doc["kv_bytes_per_token"]["source"]
    assert "`quantization_config.producer` changes no size" in doc["dense_bytes"]["source"]


def test_modelopt_unread_key_is_refused(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path, KIMI, lambda c: c["quantization_config"].update(sparsity_config={"format": "2:4"}))
    with pytest.raises(InputError) as e:
        import_model(folder)
    assert e.value.field == "quantization_config.sparsity_config" and "config.json" in str(e.value)


def test_modelopt_weight_only_groups_are_refused(tmp_path: Path) -> None:
    # vLLM routes every-group-input_activations-null checkpoints to W4A16_NVFP4 (modelopt.py:801-811).
    folder = copy_fixture(tmp_path, KIMI, lambda c: c["quantization_config"]["config_groups"]["group_0"].update(
        input_activations=None))
    with pytest.raises(InputError) as e:
        import_model(folder)
    assert e.value.field == "quantization_config.config_groups.group_0.input_activations"


def test_modelopt_unknown_kv_scheme_is_refused(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path, KIMI, lambda c: c["quantization_config"].update(
        kv_cache_scheme={"dynamic": False, "num_bits": 4, "type": "float"}))
    with pytest.raises(InputError) as e:
        import_model(folder)
    assert e.value.field == "quantization_config.kv_cache_scheme"


@pytest.mark.parametrize(("key", "value"), [("quant_level", 3), ("store_dtype", "mxfp4"),
                                            ("kv_cache_scheme", {"num_bits": 8})])
def test_fp8_unread_key_is_refused(tmp_path: Path, key: str, value: object) -> None:
    folder = copy_fixture(tmp_path, "qwen3-235b-a22b-fp8", lambda c: c["quantization_config"].update({key: value}))
    with pytest.raises(InputError) as e:
        import_model(folder)
    assert e.value.field == f"quantization_config.{key}"


def test_fp8_static_activations_and_per_tensor_are_refused(tmp_path: Path) -> None:
    # vLLM 0.33 fp8.py:127-132 raises for block-wise FP8 with a static activation scheme.
    folder = copy_fixture(tmp_path, "qwen3-235b-a22b-fp8", lambda c: c["quantization_config"].update(
        activation_scheme="static"))
    with pytest.raises(InputError) as e:
        import_model(folder)
    assert e.value.field == "quantization_config.activation_scheme"
    # Per-tensor FP8 (no weight_block_size) quantizes the dense layers too: refused, not sized as bf16 dense.
    folder = copy_fixture(tmp_path / "pt", "qwen3-235b-a22b-fp8", lambda c: c["quantization_config"].pop("weight_block_size"))
    with pytest.raises(InputError) as e:
        import_model(folder)
    assert e.value.field == "quantization_config.quant_method" and "per-tensor" in e.value.message


def test_fp8_scale_fmt_and_fmt_are_listed_as_sourced(tmp_path: Path) -> None:
    m, text = import_model(FIX / "deepseek-v3.2")          # scale_fmt ue8m0, fmt e4m3
    src = yaml.safe_load(text)["dense_bytes"]["source"]
    assert "`quantization_config.scale_fmt` changes no size" in src and "`quantization_config.fmt`" in src


def test_fp8_modules_to_not_convert_keep_linear_layers_bf16(tmp_path: Path) -> None:
    base, _ = import_model(FIX / "qwen3-235b-a22b-fp8")
    # Norms and routers listed (as the real checkpoint lists 283 of them): already bf16, nothing changes.
    names = ["lm_head"] + [f"model.layers.{i}.{n}" for i in range(94)
                           for n in ("input_layernorm", "mlp.gate", "post_attention_layernorm")]
    folder = copy_fixture(tmp_path, "qwen3-235b-a22b-fp8",
                   lambda c: c["quantization_config"].update(modules_to_not_convert=names))
    same, _ = import_model(folder)
    assert same.dense_bytes == base.dense_bytes
    # One linear layer listed: layer 0's o_proj [4096, 64 × 128] goes from FP8 + fp32 block scales to bf16.
    o = 4096 * 8192
    folder = copy_fixture(tmp_path / "o", "qwen3-235b-a22b-fp8", lambda c: c["quantization_config"].update(
        modules_to_not_convert=["model.layers.0.self_attn.o_proj"]))
    one, _ = import_model(folder)
    assert one.dense_bytes - base.dense_bytes == 2 * o - (o + 32 * 64 * 4)
    # Routed experts listed: some MoE layers unquantized, refused.
    folder = copy_fixture(tmp_path / "e", "qwen3-235b-a22b-fp8", lambda c: c["quantization_config"].update(
        modules_to_not_convert=["model.layers.0.mlp.experts"]))
    with pytest.raises(InputError) as e:
        import_model(folder)
    assert e.value.field == "quantization_config.modules_to_not_convert"


def test_compressed_tensors_unread_key_is_refused(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path, "kimi-k2.5", lambda c: c["text_config"]["quantization_config"].update(
        kv_cache_scheme={"num_bits": 8, "type": "float"}))
    with pytest.raises(InputError) as e:
        import_model(folder)
    assert e.value.field == "text_config.quantization_config.kv_cache_scheme"
    folder = copy_fixture(tmp_path / "z", "kimi-k2.5", lambda c: c["text_config"]["quantization_config"]["config_groups"]
                   ["group_0"]["weights"].update(symmetric=False))
    with pytest.raises(InputError) as e:
        import_model(folder)
    assert e.value.field == "text_config.quantization_config.config_groups.group_0.weights.symmetric"


def test_mxfp4_unread_key_is_refused(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path, "gpt-oss-20b", lambda c: c["quantization_config"].update(group_size=16))
    with pytest.raises(InputError) as e:
        import_model(folder)
    assert e.value.field == "quantization_config.group_size"
