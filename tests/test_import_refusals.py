"""Configs the importer cannot size are refused with exit 2, naming config.json and the field — never a traceback.

The Llama-4 configs vendored on AIConfigurator's main branch (ai-dynamo/aiconfigurator commit 095f58a,
`meta-llama--Llama-4-{Scout-17B-16E,Maverick-17B-128E}-Instruct_config.json`) are this repository's Llama-4
fixtures without `vision_config` (and its three image token ids); vLLM 0.33 builds the vision tower from
`config.vision_config` (model_executor/models/mllama4.py:765-777, qwen3_vl_moe.py:256-262, qwen3_5.py:736-743,
kimi_k25.py:349-370), so without it the encoder bytes cannot be read from the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.common.errors import InputError
from recipegen.modelimport import import_model
from recipegen.modelimport.safetensors import read_index

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "hf_configs"


def _without(tmp_path: Path, fixture: str, *keys: str) -> Path:
    folder = tmp_path / fixture
    folder.mkdir(parents=True)
    cfg = json.loads((FIX / fixture / "config.json").read_text())
    for key in keys:
        cfg.pop(key)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


@pytest.mark.parametrize("fixture", ["llama-4-scout-17b-16e-instruct", "llama-4-maverick-17b-128e-instruct"])
def test_llama4_without_vision_config_exits_2(tmp_path: Path, fixture: str) -> None:
    # The AIC 095f58a main-branch copy: no vision_config, boi/eoi/image token indexes.
    folder = _without(tmp_path, fixture, "vision_config", "boi_token_index", "eoi_token_index", "image_token_index")
    result = invoke("model", "import", str(folder), "-o", "-")
    assert result.code == 2, result.output
    assert "config.json" in result.output and "field 'vision_config'" in result.output
    assert "Traceback" not in result.output and "KeyError" not in result.output


@pytest.mark.parametrize("fixture", ["qwen3-vl-30b-a3b-instruct", "qwen3.5-35b-a3b", "kimi-k2.5"])
def test_multimodal_without_vision_config_is_refused(tmp_path: Path, fixture: str) -> None:
    folder = _without(tmp_path, fixture, "vision_config")
    with pytest.raises(InputError) as e:
        import_model(folder)
    assert e.value.field == "vision_config" and e.value.file.endswith("config.json")
    assert "vision tower" in e.value.message


# --- Qwen3-Next / Qwen3.5 MTP weights under a separate `mtp.` module

def _shard(path: Path, tensors: dict[str, list[int]]) -> None:
    header, at = {}, 0
    for name, shape in tensors.items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(at))


def test_mtp_module_tensors_are_mtp_not_dense(tmp_path: Path) -> None:
    folder = tmp_path / "qwen3.5-35b-a3b"
    folder.mkdir()
    (folder / "config.json").write_bytes((FIX / "qwen3.5-35b-a3b" / "config.json").read_bytes())
    tensors = {"model.language_model.embed_tokens.weight": [4, 4],                        # 32 B, dense
               "model.language_model.layers.0.mlp.experts.0.down_proj.weight": [2, 4],     # 16 B, routed expert
               "mtp.fc.weight": [4, 8],                                                    # 64 B, MTP
               "mtp.layers.0.mlp.experts.3.up_proj.weight": [2, 2],                        # 8 B, MTP expert
               "mtp.layers.0.self_attn.q_proj.weight": [2, 8]}                             # 32 B, MTP
    _shard(folder / "model-00001-of-00001.safetensors", tensors)
    index = {"metadata": {"total_size": 32 + 16 + 64 + 8 + 32},
             "weight_map": {n: "model-00001-of-00001.safetensors" for n in tensors}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    facts = read_index(folder / "model.safetensors.index.json", 40)
    assert (facts.exact_dense_bytes, facts.exact_expert_bytes, facts.exact_mtp_bytes) == (32, 16, 104)
    assert facts.mtp_layers == [40]                       # `mtp.layers.0` and `mtp.fc`: the one MTP layer
    # Without the shards, total_size − routed experts of the 40 MoE layers and the MTP layer's MoE.
    (folder / "model-00001-of-00001.safetensors").unlink()
    index["metadata"]["total_size"] = 10**12
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    m, text = import_model(folder)
    assert m.dense_bytes == 10**12 - 41 * 256 * (3 * 2048 * 512 * 2)
    assert "MTP layers [40]" in text
