"""config.json values that the transformers config class vLLM 0.33.0 builds the file through refuses.

Expectations are transformers' own verdicts, written out here case by case: each config below was built with
`Class.from_dict` (as vLLM's AutoConfig does) from transformers 5.20.2, the newest release vLLM 0.33.0 allows
(`transformers>=5.16.1,<5.21.0`), with huggingface_hub 2.4.0; the type verdicts are the same with 5.16.1 and
huggingface_hub 1.33.0 except where noted. The rules they follow (huggingface_hub dataclasses.py
`type_validator`): `int` refuses true / false, `float` refuses a JSON integer, `bool` refuses 0 / 1, a null passes
only where the annotation has None; transformers 5.20.2 modeling_rope_utils.py `validate_rope` refuses an odd,
fully rotated `head_dim` above 4 ("RoPE requires an even rotary dimension"; from 5.18.0 on, not in 5.16.1).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_import_qa_defaults import DROP, _import, _variant

from recipegen.common.errors import InputError
from recipegen.modelimport import hftypes, import_model
from recipegen.modelimport.hfdefaults import CLASSES as HF_CLASSES

TEXT = object()      # the fixture's text_config


def _edit(tmp_path: Path, fixture: str, where: object, edits: dict) -> Path:
    if where is TEXT:
        return _variant(tmp_path, fixture, text=edits)
    return _variant(tmp_path, fixture, root=edits)


def _refused(folder: Path) -> InputError:
    with pytest.raises(InputError) as err:
        import_model(folder, name="m")
    return err.value


def _line(folder: Path, key: str, value: str) -> int:
    needle = f'"{key}": {value}'
    return next(i for i, line in enumerate((folder / "config.json").read_text().splitlines(), 1) if needle in line)


# (fixture, section, field, value, transformers' class and its words) — every one refused by transformers 5.20.2
REFUSED = [
    # a null in a field typed without None
    ("qwen3-30b-a3b", None, "hidden_act", None, "Qwen3MoeConfig types `hidden_act` `str` without None"),
    ("qwen3-30b-a3b", None, "attention_bias", None, "Qwen3MoeConfig types `attention_bias` `bool` without None"),
    ("qwen3-30b-a3b", None, "intermediate_size", None, "`intermediate_size` `int` without None"),
    ("qwen3-30b-a3b", None, "num_key_value_heads", None, "`num_key_value_heads` `int` without None"),
    ("qwen3-30b-a3b", None, "hidden_size", None, "`hidden_size` `int` without None"),
    ("mixtral-8x7b-v0.1", None, "hidden_act", None, "MixtralConfig types `hidden_act` `str` without None"),
    ("gpt-oss-20b", None, "num_experts_per_tok", None, "GptOssConfig types `num_experts_per_tok` `int` without"),
    ("qwen3.5-35b-a3b", TEXT, "tie_word_embeddings", None, "Qwen3_5MoeTextConfig types `tie_word_embeddings`"),
    ("qwen3.5-35b-a3b", None, "tie_word_embeddings", None, "Qwen3_5MoeConfig types `tie_word_embeddings` `bool`"),
    ("kimi-k2.5", TEXT, "tie_word_embeddings", None, "DeepseekV3Config types `tie_word_embeddings` `bool`"),
    ("llama-4-scout-17b-16e-instruct", TEXT, "use_qk_norm", None, "Llama4TextConfig types `use_qk_norm` `bool`"),
    ("nemotron-3-nano-30b-a3b", None, "mamba_proj_bias", None, "NemotronHConfig types `mamba_proj_bias` `bool`"),
    ("glm-5", None, "head_dim", None, "GlmMoeDsaConfig types `head_dim` `int` without None"),
    # a wrong type in a field the importer reads
    ("gpt-oss-20b", None, "swiglu_limit", 7, "types `swiglu_limit` `float`"),   # 5.16.1 declares no swiglu_limit
    # fields the importer does not read for a size, typed all the same
    ("qwen3-30b-a3b", None, "rms_norm_eps", "8", "types `rms_norm_eps` `float`"),
    ("qwen3-30b-a3b", None, "initializer_range", None, "types `initializer_range` `float` without None"),
    ("qwen3-30b-a3b", None, "use_cache", 1, "types `use_cache` `bool`"),
    ("qwen3-30b-a3b", None, "eos_token_id", 1.5, "types `eos_token_id` `int | list[int] | None`"),
    ("qwen3-30b-a3b", None, "bos_token_id", True, "types `bos_token_id` `int | None`"),
    ("deepseek-v3", None, "routed_scaling_factor", 3, "types `routed_scaling_factor` `float`"),
    ("deepseek-v3", None, "n_group", 8.0, "types `n_group` `int | None`"),
    ("mixtral-8x7b-v0.1", None, "router_jitter_noise", 0, "types `router_jitter_noise` `float`"),
    ("glm-4.5-air", None, "norm_topk_prob", 1, "types `norm_topk_prob` `bool`"),
    ("nemotron-3-nano-30b-a3b", None, "time_step_limit", None, "`list[float] | tuple[float, ...]`"),
    ("nemotron-3-nano-30b-a3b", None, "layer_norm_epsilon", "1e-5", "types `layer_norm_epsilon` `float`"),
    ("qwen3-vl-30b-a3b-instruct", TEXT, "rms_norm_eps", 0, "types `rms_norm_eps` `float`"),
]


@pytest.mark.parametrize("fixture, where, key, value, words", REFUSED,
                         ids=[f"{c[0]}-{c[2]}={json.dumps(c[3])}" for c in REFUSED])
def test_a_value_the_class_refuses_is_refused_with_its_line(tmp_path: Path, fixture: str, where: object, key: str,
                                                            value: object, words: str) -> None:
    folder = _edit(tmp_path, fixture, where, {key: value})
    err = _refused(folder)
    assert err.line == _line(folder, key, json.dumps(value))
    assert err.field == (f"text_config.{key}" if where is TEXT else key)
    assert "transformers 5.20.2" in err.message and words in err.message
    assert "vLLM 0.33.0 cannot load this config.json" in err.message


def test_an_integer_where_a_float_is_typed_says_how_to_write_it(tmp_path: Path) -> None:
    err = _refused(_edit(tmp_path, "gpt-oss-20b", None, {"swiglu_limit": 7}))
    assert "an integer is not a float there: write 7.0" in err.message
    assert "transformers/models/gpt_oss/configuration_gpt_oss.py" in err.message


# every one accepted by transformers 5.20.2 (and by 5.16.1): the import goes on
ACCEPTED = [
    ("qwen3-30b-a3b", None, {"bos_token_id": None}),                     # int | None
    ("qwen3-30b-a3b", None, {"eos_token_id": [1, 2]}),                   # int | list[int] | None
    ("qwen3-30b-a3b", None, {"attention_dropout": 0}),                   # float | int
    ("qwen3-30b-a3b", None, {"rope_theta": 1000000}),                    # not a field of Qwen3MoeConfig
    ("qwen3-30b-a3b", None, {"sliding_window": None}),                   # int | None
    ("gpt-oss-20b", None, {"swiglu_limit": 7.0}),
    ("deepseek-v3", None, {"num_key_value_heads": None}),                # int | None in DeepseekV3Config
    ("deepseek-v3", None, {"n_group": None, "topk_group": None}),        # int | None
    ("deepseek-v3", None, {"attention_dropout": None}),                  # float | int | None
    ("mixtral-8x7b-v0.1", None, {"head_dim": None}),                     # int | None
    ("nemotron-3-nano-30b-a3b", None, {"hidden_act": None}),             # not a field of NemotronHConfig
    ("nemotron-3-nano-30b-a3b", None, {"routed_scaling_factor": 3}),     # float | int
    ("kimi-k2.5", TEXT, {"model_type": "deepseek_v3"}),
    ("kimi-k2.5", TEXT, {"model_type": DROP}),                           # AutoConfig's default: deepseek_v3
    ("qwen3-vl-30b-a3b-instruct", None, {"tie_word_embeddings": False}),
    ("qwen3.5-35b-a3b", TEXT, {"eos_token_id": [248046, 248044]}),
    # an attribute_map alias is set after the fields, by a name the strict validator has no check for
    ("qwen3-30b-a3b", None, {"num_local_experts": None}),                # Qwen3MoeConfig: num_experts
    # odd widths transformers takes: a partial rotary width, a width of 4 or less, a class without RoPE
    ("qwen3-next-80b-a3b-thinking", None, {"head_dim": 129}),            # partial_rotary_factor 0.25
    ("glm-4.5-air", None, {"head_dim": 129}),                            # partial_rotary_factor 0.5
    ("qwen3-30b-a3b", None, {"head_dim": 129, "partial_rotary_factor": 0.5}),
    ("nemotron-3-nano-30b-a3b", None, {"head_dim": 129}),                # NemotronHConfig has no RoPE
    ("glm-5", None, {"head_dim": 65}),                                   # GlmMoeDsaConfig uses qk_rope_head_dim
]


@pytest.mark.parametrize("fixture, where, edits", ACCEPTED,
                         ids=[f"{c[0]}-{','.join(c[2])}" for c in ACCEPTED])
def test_a_value_the_class_takes_imports(tmp_path: Path, fixture: str, where: object, edits: dict) -> None:
    _import(_edit(tmp_path, fixture, where, edits))


# --- the rotary width: transformers 5.20.2 validate_rope

ODD_ROTARY = [
    ("qwen3-30b-a3b", None, "head_dim", 129),
    ("llama-4-scout-17b-16e-instruct", TEXT, "head_dim", 129),
    ("gpt-oss-20b", None, "head_dim", 65),
    ("mixtral-8x7b-v0.1", None, "head_dim", 129),
    ("qwen3-next-80b-a3b-thinking", None, "head_dim", 5),   # with partial_rotary_factor 1.0 below
    ("deepseek-v3", None, "qk_rope_head_dim", 65),
    ("kimi-k2-instruct", None, "qk_rope_head_dim", 65),
    ("kimi-k2.5", TEXT, "qk_rope_head_dim", 65),
    ("glm-5", None, "qk_rope_head_dim", 65),
    ("qwen3-vl-30b-a3b-instruct", TEXT, "head_dim", 129),
]


@pytest.mark.parametrize("fixture, where, key, width", ODD_ROTARY, ids=[f"{c[0]}-{c[2]}" for c in ODD_ROTARY])
def test_an_odd_fully_rotated_width_is_refused(tmp_path: Path, fixture: str, where: object, key: str,
                                               width: int) -> None:
    edits: dict = {key: width}
    if fixture.startswith("qwen3-next"):
        edits["partial_rotary_factor"] = 1.0
    folder = _edit(tmp_path, fixture, where, edits)
    err = _refused(folder)
    assert err.line == _line(folder, key, str(width)) and err.field.endswith(key)
    assert "RoPE requires an even rotary dimension" in err.message and "validate_rope" in err.message


def test_a_width_of_four_or_less_is_not_checked_by_transformers(tmp_path: Path) -> None:
    # `head_dim > 4` in validate_rope: 3 passes transformers; the importer refuses it for its own reason or not
    # at all, but never as an odd rotary width
    folder = _edit(tmp_path, "qwen3-30b-a3b", None, {"head_dim": 3})
    try:
        import_model(folder, name="m")
    except InputError as err:
        assert "RoPE" not in err.message


def test_a_derived_odd_head_width_is_refused_where_the_class_derives_it(tmp_path: Path) -> None:
    # Qwen3VLMoeTextConfig.__post_init__: head_dim or hidden_size // num_attention_heads (32 heads: 4128 // 32 = 129)
    folder = _edit(tmp_path, "qwen3-vl-30b-a3b-instruct", TEXT, {"head_dim": DROP, "hidden_size": 4128})
    err = _refused(folder)
    assert "hidden_size // num_attention_heads = 129" in err.message and "RoPE requires" in err.message


def test_deepseek_reads_a_given_head_dim_over_qk_rope_head_dim(tmp_path: Path) -> None:
    # DeepseekV3Config.__post_init__ sets head_dim = qk_rope_head_dim, then a given head_dim over it
    err = _refused(_edit(tmp_path, "deepseek-v3", None, {"head_dim": 65}))
    assert err.field == "head_dim" and "RoPE requires" in err.message


# --- Kimi-K2.5's text_config.model_type: AutoConfig resolves the class by it

@pytest.mark.parametrize("value", [None, "", "kimi_k2x", "deepseek_v3x", 1])
def test_kimi_k25_text_model_type_transformers_cannot_resolve_is_refused(tmp_path: Path, value: object) -> None:
    folder = _edit(tmp_path, "kimi-k2.5", TEXT, {"model_type": value})
    err = _refused(folder)
    assert err.field == "text_config.model_type" and err.line == _line(folder, "model_type", json.dumps(value))
    assert "AutoConfig" in err.message


def test_kimi_k25_text_model_type_kimi_k2_is_read_as_deepseek_v3(tmp_path: Path) -> None:
    base, _ = _import(_edit(tmp_path, "kimi-k2.5", TEXT, {"model_type": DROP}))
    m, _ = _import(_variant(tmp_path, "kimi-k2.5", text={"model_type": "kimi_k2"}, name="w"))
    assert m == base


# --- a null in a field the importer needs, where the class takes None: refused with its line

def test_a_null_required_field_names_its_line(tmp_path: Path) -> None:
    # DeepseekV3Config types v_head_dim `int | None`: transformers takes the null, the importer needs the width
    folder = _edit(tmp_path, "deepseek-v3", None, {"v_head_dim": None})
    err = _refused(folder)
    assert err.line == _line(folder, "v_head_dim", "null") and err.field == "v_head_dim"
    assert "is null" in err.message and "missing" not in err.message


def test_a_dropped_required_field_is_still_missing(tmp_path: Path) -> None:
    err = _refused(_edit(tmp_path, "deepseek-v3", None, {"v_head_dim": DROP}))
    assert "missing" in err.message


# --- the rules themselves (huggingface_hub dataclasses.py type_validator)

@pytest.mark.parametrize("annotation, value, ok", [
    ("int", 3, True), ("int", True, False), ("int", 3.0, False), ("int", None, False), ("int", "3", False),
    ("float", 3.0, True), ("float", 3, False), ("float", True, False), ("float | int", 3, True),
    ("float | int", False, False),   # `int` refuses a bool inside a union too
    ("bool", True, True), ("bool", 1, False), ("bool | None", None, True),
    ("str", "x", True), ("str", 1, False), ("int | None", None, True),
    ("int | list[int] | None", [1, 2], True), ("int | list[int] | None", [1, 2.0], False),
    ("int | list[int] | None", 1.5, False),
    ("list[str] | None", ["a"], True), ("list[str] | None", "a", False),
    ("dict | None", {}, True), ("dict | None", [], False),
    ("dict[int, str] | dict[str, str] | None", {"0": "a"}, True),
    ("dict[str, int] | dict[str, str] | None", {"a": 1.5}, False),
    ("RopeParameters | dict | None", {"rope_type": "default"}, True),
    ("dict | PreTrainedConfig | None", "x", False),
    ("str | torch.dtype | None", "bfloat16", True), ("str | torch.dtype | None", 16, True),   # a forward reference
    ("int | list[int] | tuple[int, int]", [14, 14], True), ("tuple[int, int] | list[int]", 2, False),
    ("list[float] | tuple[float, ...]", [0.0, 1.0], True), ("list[float] | tuple[float, ...]", [0, 1], False),
    ("Literal['regression', 'single_label_classification', 'multi_label_classification'] | None", "regression",
     True),
    ("Literal['regression', 'single_label_classification', 'multi_label_classification'] | None", "x", False),
])
def test_the_strict_validator_rules(annotation: str, value: object, ok: bool) -> None:
    assert hftypes.accepts(annotation, value) is ok


def test_the_table_covers_every_class_the_importer_resolves() -> None:
    assert set(hftypes.CLASSES) == set(HF_CLASSES)
    assert set(hftypes.ROTARY) <= set(hftypes.CLASSES)
    for table in hftypes.CLASSES.values():
        for ann in table.fields.values():
            hftypes.accepts(ann, None)          # every annotation parses
