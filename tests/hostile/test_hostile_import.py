"""`recipegen model import` against hostile checkpoints: configs whose values are the wrong type,
absurd or contradictory; safetensors headers that do not describe their file; shard paths that
leave the folder; files that are not files. Each is refused with exit 2, the file, the line where
there is one and the field — never a traceback, a hang or a number computed from garbage."""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path

import pytest
from hostile_support import cli, refused

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "hf_configs"


def _config(tmp_path: Path, fixture: str = "mixtral-8x7b-v0.1", **changes: object) -> Path:
    cfg = json.loads((FIX / fixture / "config.json").read_text())
    cfg.update(changes)
    folder = tmp_path / "ckpt"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def _import(folder: Path, expect: str = "") -> str:
    return refused("model", "import", str(folder), "-o", "-", expect=expect)


# --- config values before arithmetic (35.3): type, range, NaN, lists, absurd sizes

@pytest.mark.parametrize("field, value, expect", [
    ("num_hidden_layers", "32", "expected an integer"),
    ("num_hidden_layers", 0, "below 1"),
    ("num_hidden_layers", -4, "below 1"),
    ("num_hidden_layers", 10**9, "not a real model"),
    ("num_hidden_layers", 32.0, "expected an integer"),
    ("num_hidden_layers", True, "expected an integer"),
    ("num_hidden_layers", [32], "expected an integer"),
    ("hidden_size", None, "types `hidden_size` `int` without None"),
    ("rms_norm_eps", "1e-05", "types `rms_norm_eps` `float`"),
    ("use_cache", 0, "types `use_cache` `bool`"),
    ("num_local_experts", 0, "below 1"),
    ("num_experts_per_tok", 9, "exceeds the 8 routed experts"),
    ("vocab_size", -32000, "below 1"),
    ("num_key_value_heads", 5, "do not split into 5 KV groups"),
    ("sliding_window", "4096", "expected an integer"),
    ("tie_word_embeddings", "false", "expected true or false"),
    ("rope_scaling", [2.0], "expected an object"),
    ("intermediate_size", 10**12, "not a real model"),
])
def test_config_values_are_typed_and_bounded(tmp_path: Path, field: str, value: object, expect: str) -> None:
    out = _import(_config(tmp_path, **{field: value}), expect)
    assert "config.json:" in out and field in out


def test_nan_and_infinity_are_not_json(tmp_path: Path) -> None:
    folder = _config(tmp_path)
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text.replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": NaN'))
    out = _import(folder, "NaN is not a JSON number")
    assert "rms_norm_eps" in out and "config.json:" in out


def test_repeated_key_names_both_lines(tmp_path: Path) -> None:
    folder = _config(tmp_path)
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text.replace('"num_local_experts": 8,', '"num_local_experts": 8,\n'
                                                     '  "num_local_experts": 16,'))
    out = _import(folder, "appears twice")
    assert "num_local_experts" in out and "lines" in out


@pytest.mark.parametrize("a, b", [("num_local_experts", "num_experts"), ("num_experts_per_tok", "experts_per_token")])
def test_contradictory_spellings_name_both_fields(tmp_path: Path, a: str, b: str) -> None:
    cfg = json.loads((FIX / "mixtral-8x7b-v0.1" / "config.json").read_text())
    out = _import(_config(tmp_path, **{b: cfg[a] * 2}), "disagree")
    assert a in out and b in out


def test_string_layer_list_and_wrong_length(tmp_path: Path) -> None:
    out = _import(_config(tmp_path, "qwen3-30b-a3b", mlp_only_layers="0,1"), "expected a list")
    assert "mlp_only_layers" in out
    out = _import(_config(tmp_path, "qwen3-30b-a3b", mlp_only_layers=[0, "1"]), "mlp_only_layers[1]")
    out = _import(_config(tmp_path, "qwen3-30b-a3b", mlp_only_layers=[99]), "past the 48 decoder layers")


def test_deep_nesting_has_a_line(tmp_path: Path) -> None:
    folder = _config(tmp_path)
    (folder / "config.json").write_text('{"a":\n' + "[" * 200 + "]" * 200 + "}")
    out = _import(folder, "nested deeper than")
    assert "config.json:2" in out


def test_nul_byte_and_bad_utf8_have_a_line(tmp_path: Path) -> None:
    folder = _config(tmp_path)
    (folder / "config.json").write_text('{\n"architectures": ["Mixtral\x00ForCausalLM"]}')
    assert "config.json:2" in _import(folder, "control character")
    (folder / "config.json").write_bytes(b'{\n\n"a": "\xff"}')
    assert "config.json:3" in _import(folder, "not UTF-8")


def test_huge_integer_is_refused_before_arithmetic(tmp_path: Path) -> None:
    folder = _config(tmp_path)
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text.replace('"hidden_size": 4096', '"hidden_size": ' + "9" * 5000))
    _import(folder, "a number of 5000 characters")


# --- files: regular, size-bounded, before reading (35.8)

def test_config_linked_to_dev_zero_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").symlink_to("/dev/zero")
    _import(folder, "must be a regular file; this is a device")


def test_config_fifo_does_not_hang(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    os.mkfifo(folder / "config.json")
    result: list[str] = []
    worker = threading.Thread(target=lambda: result.append(_import(folder, "pipe (FIFO)")), daemon=True)
    worker.start()
    worker.join(20)
    assert result, "model import blocked on a FIFO"


def test_oversized_config_is_refused_before_reading(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    with open(folder / "config.json", "wb") as f:
        f.truncate(64 * 2**20)          # sparse: 64 MiB of zeros
    _import(folder, "more than the")


# --- safetensors headers against the file (35.3)

def _tiny(tmp_path: Path) -> Path:
    return _config(tmp_path, num_hidden_layers=1, num_local_experts=2, vocab_size=8, hidden_size=64,
                   intermediate_size=32, num_attention_heads=4, num_key_value_heads=2)


def _write_shard(path: Path, header: dict, data_bytes: int) -> None:
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * data_bytes)


def _with_shard(folder: Path, header: dict, data_bytes: int, *, names: list[str] | None = None,
                shard: str = "model-00001-of-00001.safetensors") -> Path:
    _write_shard(folder / "model-00001-of-00001.safetensors", header, data_bytes)
    weight_map = {n: shard for n in (names if names is not None else header)}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


GOOD = {"model.embed_tokens.weight": {"dtype": "BF16", "shape": [8, 64], "data_offsets": [0, 1024]},
        "model.layers.0.block_sparse_moe.experts.0.w1.weight": {"dtype": "BF16", "shape": [32, 64],
                                                                "data_offsets": [1024, 5120]}}


def _header(**changes: dict) -> dict:
    h = json.loads(json.dumps(GOOD))
    for name, info in changes.items():
        h[name.replace("__", ".")] = info
    return h


def test_valid_shard_imports(tmp_path: Path) -> None:
    code, out = cli("model", "import", str(_with_shard(_tiny(tmp_path), GOOD, 5120)), "-o", "-")
    assert code == 0, out


@pytest.mark.parametrize("header, data, expect", [
    (GOOD, 4000, "past the 4,000 bytes of data"),                      # truncated shard
    (GOOD, 6000, "cover 5,120 of the 6,000"),                          # trailing garbage
    ({**GOOD, "model.norm.weight": {"dtype": "BF16", "shape": [64], "data_offsets": [0, 2**50]}}, 5120,
     "past the"),                                                       # a petabyte offset
    ({**GOOD, "model.norm.weight": {"dtype": "BF16", "shape": [64], "data_offsets": [1000, 1128]}}, 5120,
     "overlaps"),
    ({"model.embed_tokens.weight": {"dtype": "BF16", "shape": [8, 64], "data_offsets": [1024, 0]}}, 1024,
     "reversed"),
    ({"model.embed_tokens.weight": {"dtype": "BF16", "shape": [8, 64], "data_offsets": [0, 1000]}}, 1000,
     "its byte range holds 1,000"),
    ({"model.embed_tokens.weight": {"dtype": "Q4_K", "shape": [8, 64], "data_offsets": [0, 1024]}}, 1024,
     "unknown dtype"),
    ({"model.embed_tokens.weight": {"dtype": "BF16", "shape": [8, -64], "data_offsets": [0, 1024]}}, 1024,
     "not a list of non-negative integers"),
    ({"model.embed_tokens.weight": {"dtype": "BF16", "shape": [8, 64], "data_offsets": [100, 1124]}}, 1124,
     "belong to no tensor"),
])
def test_header_must_describe_the_file(tmp_path: Path, header: dict, data: int, expect: str) -> None:
    out = _import(_with_shard(_tiny(tmp_path), header, data), expect)
    assert "safetensors" in out


def test_tensor_missing_from_index_or_header(tmp_path: Path) -> None:
    folder = _with_shard(_tiny(tmp_path), GOOD, 5120, names=["model.embed_tokens.weight"])
    _import(folder, "not in model.safetensors.index.json")
    folder = _with_shard(_tiny(tmp_path), GOOD, 5120, names=[*GOOD, "model.norm.weight"])
    _import(folder, "whose header does not have it")


def test_header_length_past_the_file(tmp_path: Path) -> None:
    folder = _tiny(tmp_path)
    (folder / "model-00001-of-00001.safetensors").write_bytes(struct.pack("<Q", 10**6) + b"{}")
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}}))
    _import(folder, "runs past the end")


@pytest.mark.parametrize("shard", ["../x.safetensors", "/etc/passwd", "sub/model.safetensors", "..", "a\nb"])
def test_shard_paths_stay_beside_the_index(tmp_path: Path, shard: str) -> None:
    folder = _tiny(tmp_path)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 5120}, "weight_map": {"model.embed_tokens.weight": shard}}))
    out = _import(folder, "not a plain file name beside the index")
    assert "model.safetensors.index.json:" in out


def test_shard_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    folder = _with_shard(_tiny(tmp_path), GOOD, 5120)
    shard = folder / "model-00001-of-00001.safetensors"
    shard.unlink()
    os.mkfifo(shard)
    result: list[str] = []
    worker = threading.Thread(target=lambda: result.append(_import(folder, "regular file")), daemon=True)
    worker.start()
    worker.join(20)
    assert result, "model import blocked on a FIFO shard"


# --- the model file a recipe names (35.8): regular files only, size-bounded, before reading

_RECIPE = ("version: 1\nname: r\nmodel: {file: models/m.yaml}\nmachines:\n  box: {catalog: rtx-4090}\n"
           "lanes:\n  - name: a\n    machine: box\n    gpus: [0]\n    port: 8000\n"
           "    image: vllm/vllm-openai:v0.33.0\n    gpu_memory_utilization: 0.9\n    max_model_len: 8192\n"
           "    concurrency: {max: 1}\n    offload: {placement: positional, load_cpu_offload: 40 GiB}\n"
           "    reserves: {hbm: {value: 3 GiB, source: test}}\n")


def _recipe_with_model(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "models").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(_RECIPE)
    return recipe, tmp_path / "models" / "m.yaml"


def test_model_file_linked_to_dev_zero_is_refused(tmp_path: Path) -> None:
    recipe, model = _recipe_with_model(tmp_path)
    model.symlink_to("/dev/zero")
    # refused before it is opened: a link out of the project (recipegen.common.paths)
    refused("check", "budgets", str(recipe), expect="a symlink to /dev/zero")


def test_model_file_fifo_does_not_hang(tmp_path: Path) -> None:
    recipe, model = _recipe_with_model(tmp_path)
    os.mkfifo(model)
    result: list[str] = []
    worker = threading.Thread(target=lambda: result.append(
        refused("check", "budgets", str(recipe), expect="pipe (FIFO)")), daemon=True)
    worker.start()
    worker.join(20)
    assert result, "check budgets blocked on a FIFO model file"


def test_oversized_model_file_is_refused_before_reading(tmp_path: Path) -> None:
    recipe, model = _recipe_with_model(tmp_path)
    with open(model, "wb") as f:
        f.truncate(200 * 2**20)
    refused("check", "budgets", str(recipe), expect="more than the")


def test_widths_that_do_not_split_into_scale_groups_name_the_config_field(tmp_path: Path) -> None:
    folder = tmp_path / "nv"
    folder.mkdir()
    for f in (FIX / "qwen3-235b-a22b-nvfp4").iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((folder / "config.json").read_text())
    cfg["moe_intermediate_size"] = 1544                       # not a multiple of NVFP4's 16-value groups
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    out = _import(folder, "scale groups of 16")
    assert "moe_intermediate_size" in out and "config.json:" in out
