"""Quantization configs that would size routed experts in a format vLLM 0.33 does not load them in, or that read
a wrong-typed value as "nothing": each is refused naming the file, the line and the field.

Routed experts: vLLM 0.33 matches a ModelOpt `ignore` / `exclude_modules` entry against the FusedMoE module of each
MoE layer (`language_model.model.layers.N.mlp.experts` for Kimi-K2.5 / K2.7, vllm/model_executor/models/
kimi_k25.py:376-381, deepseek_v2.py:374-386) after splitting `path*` into `path` and `path.*` and renaming with the
model's hf_to_vllm_mapper (quantization/modelopt.py:266-285), by exact / substring / fnmatch
(modelopt.py:191-226); a matched FusedMoE module is built unquantized. FP8 skips it when an entry holding `experts`
contains its name (utils/quant_utils.py:684-688); compressed-tensors when expert 0's gate, up and down projections are
all in `ignore` (compressed_tensors_moe.py:36-58). Kimi-K2.5 / K2.7: 61 decoder layers, first_k_dense_replace 1, so
MoE layers 1-60 (60 layers); Qwen3-235B: 94 layers, all MoE; Nemotron-3-Nano: 23 `E` layers in its pattern.
Expected counts and lines below are derived by hand from those configs and the written files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_support import invoke
from test_import_quant_keys import copy_fixture

from recipegen.common.errors import InputError
from recipegen.modelimport import import_model
from recipegen.modelimport.families import BY_ARCH
from recipegen.modelimport.quantmatch import NAMING

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "hf_configs"
KIMI = "kimi-k2.7-code-nvfp4"          # ModelOpt flat form in config.json, `ignore`
KIMI_CT = "kimi-k2.5"                  # compressed-tensors int4, text_config.quantization_config.ignore
QWEN_FP8 = "qwen3-235b-a22b-fp8"       # FP8, modules_to_not_convert
QWEN_NVFP4 = "qwen3-235b-a22b-nvfp4"   # ModelOpt nested hf_quant_config.json, exclude_modules
NEMO_NVFP4 = "nemotron-3-nano-30b-a3b-nvfp4"
KIMI_DENSE = 24_386_751_456            # tests/test_import_quant_keys.py derives it by hand
UNQUANTIZED = "routed experts left unquantized in some layers"


def _line_of(path: Path, needle: str) -> int:
    """The 1-based line of the only line of `path` holding `needle`."""
    hits = [i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


def _refused(folder: Path) -> InputError:
    with pytest.raises(InputError) as e:
        import_model(folder)
    return e.value


def _kimi_ignore(tmp_path: Path, ignore: Any) -> Path:
    return copy_fixture(tmp_path, KIMI, lambda c: c["quantization_config"].update(ignore=ignore))


# --- 1. entries vLLM matches against routed experts, through wildcards, substrings and its name mapping

@pytest.mark.parametrize(("entry", "layer", "layers", "held"), [
    # `path*` is split into `path` and `path.*` (modelopt.py:279-281): `...layers.5.mlp` is inside
    # `...layers.5.mlp.experts`, layer 5 only.
    ("language_model.model.layers.5.mlp*", 5, 1, "language_model.model.layers.5.mlp"),
    # `*experts*` -> `*experts` fnmatches every layer's `.mlp.experts`.
    ("*experts*", 1, 60, "*experts"),
    ("*", 1, 60, None),
    # A plain substring: `...layers.1` is inside the names of layers 1 and 10-19: 11 of the 60.
    ("language_model.model.layers.1", 1, 11, None),
    # The legacy spelling the KimiK25 mapper renames (kimi_k25.py:311-320): `language_model.layers.` ->
    # `language_model.model.layers.`, after the split.
    ("language_model.layers.7.mlp*", 7, 1, "language_model.model.layers.7.mlp"),
    ("language_model.model.layers.1.mlp.experts*", 1, 1, "language_model.model.layers.1.mlp.experts"),
])
def test_modelopt_entry_matching_routed_experts_is_refused(tmp_path: Path, entry: str, layer: int, layers: int,
                                                          held: str | None) -> None:
    real = json.loads((FIX / KIMI / "config.json").read_text())["quantization_config"]["ignore"]
    folder = _kimi_ignore(tmp_path, [*real, entry])          # the checkpoint's 125 entries, then this one
    err = _refused(folder)
    assert err.field == "quantization_config.ignore" and err.file == str(folder / "config.json")
    assert err.line == _line_of(folder / "config.json", json.dumps(entry))
    assert UNQUANTIZED in err.message and f"entry 125 `{entry}`" in err.message
    assert f"`language_model.model.layers.{layer}.mlp.experts`, the routed experts of decoder layer {layer}," \
        in err.message
    assert f"entries match {layers} of the 60 MoE layers" in err.message
    assert (f"held by vLLM as `{held}`" in err.message) == (held is not None and held != entry)


@pytest.mark.parametrize("entry", [
    "language_model.model.layers.5.mlp.shared_experts*",     # the shared expert only
    "language_model.model.layers.5.mlp.gate",                # the router (bf16 already)
    "*.mlp.experts.*",                                       # needs a `.` after `experts`: vLLM's name has none
])
def test_modelopt_entry_missing_routed_experts_is_read(tmp_path: Path, entry: str) -> None:
    real = json.loads((FIX / KIMI / "config.json").read_text())["quantization_config"]["ignore"]
    m, _ = import_model(_kimi_ignore(tmp_path, [*real, entry]))
    # Every non-routed tensor is already bf16 under the real list: nothing changes.
    assert m.dense_bytes == KIMI_DENSE


def test_modelopt_nested_exclude_modules_wildcard_is_refused(tmp_path: Path) -> None:
    # hf_quant_config.json (nested form): Qwen3MoeForCausalLM has a mapper (qwen3_moe.py:552), so `model.layers.3.mlp*`
    # is split to `model.layers.3.mlp`, inside `model.layers.3.mlp.experts`.
    folder = copy_fixture(tmp_path, QWEN_NVFP4, lambda d: d["quantization"]["exclude_modules"].append("model.layers.3.mlp*"),
                   file="hf_quant_config.json")
    err = _refused(folder)
    assert err.file == str(folder / "hf_quant_config.json") and err.field == "quantization.exclude_modules"
    assert err.line == _line_of(folder / "hf_quant_config.json", '"model.layers.3.mlp*"')
    assert UNQUANTIZED in err.message and "entries match 1 of the 94 MoE layers" in err.message


def test_modelopt_nemotron_backbone_renamed_before_matching(tmp_path: Path) -> None:
    # NemotronH's mapper renames the prefix `backbone` -> `model` (nemotron_h.py:734-736); its experts are
    # `model.layers.N.mixer.experts`. Layer 1 is an `E` layer of MEMEM*...; `...layers.1.mixer` is not inside
    # `...layers.10.mixer...` (10 is `E` too), so 1 of the 23.
    folder = copy_fixture(tmp_path, NEMO_NVFP4, lambda d: d["quantization"]["exclude_modules"].append(
        "backbone.layers.1.mixer*"), file="hf_quant_config.json")
    err = _refused(folder)
    assert "held by vLLM as `model.layers.1.mixer`" in err.message
    assert "`model.layers.1.mixer.experts`, the routed experts of decoder layer 1," in err.message
    assert "entries match 1 of the 23 MoE layers" in err.message


def test_fp8_entries_matched_as_vllm_matches_them(tmp_path: Path) -> None:
    base, _ = import_model(FIX / QWEN_FP8)
    # `ignored_layers` wins over `modules_to_not_convert` when non-empty (fp8.py:162-168): named in the refusal.
    folder = copy_fixture(tmp_path, QWEN_FP8, lambda c: c["quantization_config"].update(
        ignored_layers=["model.layers.3.mlp.experts.0.gate_proj"]))
    err = _refused(folder)
    assert err.field == "quantization_config.ignored_layers" and UNQUANTIZED in err.message
    assert "entries match 1 of the 94 MoE layers" in err.message
    # An entry holding the experts' name skips the layer even when it also says `shared_expert`, which the old
    # check let through.
    folder = copy_fixture(tmp_path / "s", QWEN_FP8, lambda c: c["quantization_config"].update(
        modules_to_not_convert=["model.layers.2.mlp.experts.shared_expert"]))
    assert "decoder layer 2," in _refused(folder).message
    # A name past the 94 decoder layers matches no module vLLM builds: read, nothing changes.
    folder = copy_fixture(tmp_path / "p", QWEN_FP8, lambda c: c["quantization_config"].update(
        modules_to_not_convert=["model.layers.94.mlp.experts"]))
    assert import_model(folder)[0].dense_bytes == base.dense_bytes


def _kimi_ct_ignore(tmp_path: Path, ignore: Any) -> Path:
    return copy_fixture(tmp_path, KIMI_CT, lambda c: c["text_config"]["quantization_config"].update(ignore=ignore))


def test_compressed_tensors_ignore_matching_routed_experts_is_refused(tmp_path: Path) -> None:
    real = json.loads((FIX / KIMI_CT / "config.json").read_text())["text_config"]["quantization_config"]["ignore"]
    folder = _kimi_ct_ignore(tmp_path, [*real, "re:.*experts.*"])
    err = _refused(folder)
    assert err.field == "text_config.quantization_config.ignore" and UNQUANTIZED in err.message
    assert err.line == _line_of(folder / "config.json", '"re:.*experts.*"')
    assert "entries match 60 of the 60 MoE layers" in err.message
    # Expert 0's three projections of layer 4 named exactly: layer 4's experts unquantized.
    names = [f"language_model.model.layers.4.mlp.experts.0.{p}" for p in ("gate_proj", "up_proj", "down_proj")]
    err = _refused(_kimi_ct_ignore(tmp_path / "x", [*real, *names]))
    assert "decoder layer 4," in err.message and "entries match 1 of the 60" in err.message
    # Only down_proj: vLLM refuses the layer (mixed schemes), and so does the importer.
    err = _refused(_kimi_ct_ignore(tmp_path / "d", [*real, r"re:.*mlp\.experts\.\d+\.down_proj"]))
    assert "some but not all of a layer's expert projections ignored" in err.message


def test_compressed_tensors_regex_matches_from_the_start_not_whole(tmp_path: Path) -> None:
    # vLLM's `re:` is re.match (config_utils.py:443-446): `re:.*self_attn` covers `...self_attn.q_a_proj`, as the
    # checkpoint's own `re:.*self_attn.*` does, so the attention stays bf16 and the figure is the checkpoint's.
    base, _ = import_model(FIX / KIMI_CT)
    real = json.loads((FIX / KIMI_CT / "config.json").read_text())["text_config"]["quantization_config"]["ignore"]
    short = ["re:.*self_attn" if p == "re:.*self_attn.*" else p for p in real]
    assert short != real
    m, _ = import_model(_kimi_ct_ignore(tmp_path, short))
    assert m.dense_bytes == base.dense_bytes


def test_compressed_tensors_bad_regex_is_refused_with_its_line(tmp_path: Path) -> None:
    folder = _kimi_ct_ignore(tmp_path, ["lm_head", "re:(unclosed"])
    err = _refused(folder)
    assert err.line == _line_of(folder / "config.json", '"re:(unclosed"')
    assert err.field == "text_config.quantization_config.ignore[1]" and "not a regular expression" in err.message


# --- 2. a present module list is a list of strings: `{}`, `false`, `0`, `""` are not "nothing excluded"

@pytest.mark.parametrize("value", [{}, False, 0, "", None, ["lm_head", 3]])
def test_modelopt_ignore_must_be_a_list(tmp_path: Path, value: Any) -> None:
    # vLLM takes `ignore` as given, null included, and refuses a non-list (modelopt.py:359, :379-382).
    folder = _kimi_ignore(tmp_path, value)
    err = _refused(folder)
    assert err.field.startswith("quantization_config.ignore") and "must be a list of" in err.message
    assert err.line == _line_of(folder / "config.json", '"ignore"') + (2 if isinstance(value, list) else 0)


def test_modelopt_empty_ignore_does_not_win_over_exclude_modules(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path, KIMI, lambda c: c["quantization_config"].update(ignore={}, exclude_modules=["lm_head"]))
    assert _refused(folder).field == "quantization_config.ignore"


def test_modelopt_nested_exclude_modules_null_is_refused(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path, QWEN_NVFP4, lambda d: d["quantization"].update(exclude_modules=None),
                   file="hf_quant_config.json")
    err = _refused(folder)
    assert err.field == "quantization.exclude_modules" and "got null" in err.message


@pytest.mark.parametrize("key", ["modules_to_not_convert", "ignored_layers"])
@pytest.mark.parametrize("value", [{}, False, 0, ""])
def test_fp8_module_lists_must_be_lists(tmp_path: Path, key: str, value: Any) -> None:
    folder = copy_fixture(tmp_path, QWEN_FP8, lambda c: c["quantization_config"].update({key: value}))
    err = _refused(folder)
    assert err.field == f"quantization_config.{key}" and "must be a list of module names" in err.message
    assert err.line == _line_of(folder / "config.json", f'"{key}"')


def test_fp8_null_lists_are_absent_as_in_vllm(tmp_path: Path) -> None:
    # fp8.py:162-168 + :117: a null `ignored_layers` falls back to `modules_to_not_convert`; a null
    # `modules_to_not_convert` is an empty list. Both leave the checkpoint's figure.
    base, _ = import_model(FIX / QWEN_FP8)
    m, _ = import_model(copy_fixture(tmp_path, QWEN_FP8, lambda c: c["quantization_config"].update(ignored_layers=None)))
    assert m.dense_bytes == base.dense_bytes
    m, _ = import_model(copy_fixture(tmp_path / "n", QWEN_FP8, lambda c: c["quantization_config"].update(
        modules_to_not_convert=None)))
    assert m.dense_bytes == base.dense_bytes   # the checkpoint lists norms and routers only: bf16 either way


@pytest.mark.parametrize("value", [{}, False, None])
def test_compressed_tensors_ignore_must_be_a_list(tmp_path: Path, value: Any) -> None:
    # compressed_tensors.py:254 reads a list; null fails in vLLM.
    err = _refused(_kimi_ct_ignore(tmp_path, value))
    assert err.field == "text_config.quantization_config.ignore" and "must be a list of" in err.message


def test_kv_cache_scheme_of_the_wrong_type_is_refused(tmp_path: Path) -> None:
    err = _refused(copy_fixture(tmp_path, KIMI, lambda c: c["quantization_config"].update(kv_cache_scheme=False)))
    assert err.field == "quantization_config.kv_cache_scheme" and "expected an object or null" in err.message


# --- 3. integers where integers belong: 8.0 / 16.0 / 128.0 refused as config.json's integer fields are

@pytest.mark.parametrize(("fixture", "file", "edit", "field"), [
    (KIMI, "config.json", lambda c: c["quantization_config"]["kv_cache_scheme"].update(num_bits=8.0),
     "quantization_config.kv_cache_scheme.num_bits"),
    (KIMI, "config.json", lambda c: c["quantization_config"].update(group_size=16.0),
     "quantization_config.group_size"),
    (KIMI, "config.json", lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(
        group_size=16.0), "quantization_config.config_groups.group_0.weights.group_size"),
    (KIMI, "config.json", lambda c: c["quantization_config"]["config_groups"]["group_0"]["input_activations"].update(
        num_bits=4.0), "quantization_config.config_groups.group_0.input_activations.num_bits"),
    (QWEN_NVFP4, "hf_quant_config.json", lambda d: d["quantization"].update(group_size=16.0),
     "quantization.group_size"),
    (QWEN_FP8, "config.json", lambda c: c["quantization_config"].update(weight_block_size=[128.0, 128.0]),
     "quantization_config.weight_block_size[0]"),
    (KIMI_CT, "config.json", lambda c: c["text_config"]["quantization_config"]["config_groups"]["group_0"]
     ["weights"].update(num_bits=4.0), "text_config.quantization_config.config_groups.group_0.weights.num_bits"),
])
def test_float_where_an_integer_belongs_is_refused(tmp_path: Path, fixture: str, file: str, edit: Callable,
                                                   field: str) -> None:
    folder = copy_fixture(tmp_path, fixture, edit, file=file)
    err = _refused(folder)
    assert err.field == field and "expected an integer" in err.message and err.file == str(folder / file)
    assert err.line is not None


# --- 4. messages that say what is wrong

def test_architectures_string_is_not_a_list(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path, QWEN_FP8, lambda c: c.update(architectures="Qwen3MoeForCausalLM"))
    err = _refused(folder)
    assert err.field == "architectures" and "must be a list of strings" in err.message
    assert "'Q'" not in err.message and err.line == _line_of(folder / "config.json", '"architectures"')


def test_weight_map_list_must_be_an_object(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path, QWEN_FP8)
    (folder / "model.safetensors.index.json").write_text('{\n  "metadata": {"total_size": 10},\n  "weight_map": []\n}')
    err = _refused(folder)
    assert err.field == "weight_map" and err.line == 3
    assert "must be an object" in err.message and "missing" not in err.message


def test_hf_quant_config_not_an_object_has_line_1(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path, QWEN_NVFP4)
    (folder / "hf_quant_config.json").write_text("[]\n")
    err = _refused(folder)
    assert err.file == str(folder / "hf_quant_config.json") and err.line == 1 and "must be a JSON object" in err.message


@pytest.mark.parametrize("name", ["config.json", "hf_quant_config.json", "model.safetensors.index.json"])
def test_dangling_link_is_a_link_to_nothing(tmp_path: Path, name: str) -> None:
    # A dangling hf_quant_config.json was read as "no hf_quant_config.json": the NVFP4 checkpoint imported as bf16.
    folder = copy_fixture(tmp_path, QWEN_NVFP4)
    (folder / name).unlink(missing_ok=True)
    os.symlink(tmp_path / "gone.json", folder / name)
    result = invoke("model", "import", str(folder), "-o", "-")
    assert result.code == 2, result.output
    assert "link to nothing" in result.output and name in result.output and "Traceback" not in result.output


def test_every_architecture_has_vllm_expert_names() -> None:
    assert set(BY_ARCH) <= set(NAMING)
