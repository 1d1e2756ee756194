"""What a fuzz of `recipegen model import` (config.json variants rebuilt through transformers' classes) found.

Expected values are read from the sources, not from the importer:

- Finding 1, `max_position_embeddings` default of each config class vLLM 0.33.0 builds config.json through
  (transformers 5.20.2, transformers/models/<m>/configuration_<m>.py; every one typed `int` without None, so a
  JSON null is refused by the class):
  GptOssConfig 131072 (gpt_oss:62), Qwen3MoeConfig 32768 (qwen3_moe:92), DeepseekV3Config 4096 (deepseek_v3:104;
  vLLM registers deepseek_v32 and kimi_k2 to it, and Kimi-K2.5's text_config is built by it),
  GlmMoeDsaConfig 202752 (glm_moe_dsa:113), Glm4MoeConfig 131072 (glm4_moe:98), MixtralConfig 4096 * 32 = 131072
  (mixtral:75), Qwen3NextConfig 32768 (qwen3_next:99), Qwen3_5MoeTextConfig 32768 (qwen3_5_moe:95),
  NemotronHConfig 4096 (nemotron_h:99), Llama4TextConfig 4096 * 32 = 131072 (llama4:149),
  Qwen3VLMoeTextConfig 128000 (qwen3_vl_moe:86). None of the classes changes it in __post_init__.
  vLLM derives max_model_len from it × the RoPE factor unless the type is YaRN-style (vllm/config/model.py:
  2598-2630): every fixture's own RoPE is yarn / llama3 / default, so the default is the limit as is.
- Finding 2: vLLM 0.33.0 reads `mamba_ssm_dtype` only in Qwen3_5ForConditionalGenerationConfig
  (vllm/model_executor/models/config.py:953-978), registered for Qwen3_5* architectures only (:1259-1262); for
  Qwen3-Next `--mamba-ssm-cache-dtype auto` is the conv dtype (mamba_utils.py:98-111), bf16.
- Finding 4: transformers 5.20.2 `convert_rope_params_to_dict` (modeling_rope_utils.py:752-755) sets
  `rope_parameters = rope_scaling or rope_parameters`: both spellings are one setting, rope_scaling first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_support import invoke
from test_import_qa_defaults import DROP, _import
from test_import_qa_defaults import _variant as edited_copy

from recipegen.common.errors import InputError
from recipegen.modelimport import import_model

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "hf_configs"

# fixture -> (class, default) per the module docstring (transformers 5.20.2 class source)
DEFAULTS = {
    "deepseek-v3": ("DeepseekV3Config", 4096), "deepseek-v3.2": ("DeepseekV3Config", 4096),
    "kimi-k2-instruct": ("DeepseekV3Config", 4096), "kimi-k2.5": ("DeepseekV3Config", 4096),
    "kimi-k2.7-code-nvfp4": ("DeepseekV3Config", 4096),
    "glm-4.5-air": ("Glm4MoeConfig", 131072), "glm-5": ("GlmMoeDsaConfig", 202752),
    "gpt-oss-120b": ("GptOssConfig", 131072), "gpt-oss-20b": ("GptOssConfig", 131072),
    "llama-4-maverick-17b-128e-instruct": ("Llama4TextConfig", 131072),
    "llama-4-scout-17b-16e-instruct": ("Llama4TextConfig", 131072),
    "mixtral-8x7b-v0.1": ("MixtralConfig", 131072),
    "nemotron-3-nano-30b-a3b": ("NemotronHConfig", 4096), "nemotron-3-nano-30b-a3b-nvfp4": ("NemotronHConfig", 4096),
    "qwen3-235b-a22b": ("Qwen3MoeConfig", 32768), "qwen3-235b-a22b-fp8": ("Qwen3MoeConfig", 32768),
    "qwen3-235b-a22b-nvfp4": ("Qwen3MoeConfig", 32768), "qwen3-30b-a3b": ("Qwen3MoeConfig", 32768),
    "qwen3-coder-480b-a35b-instruct": ("Qwen3MoeConfig", 32768),
    "qwen3-next-80b-a3b-thinking": ("Qwen3NextConfig", 32768),
    "qwen3-vl-30b-a3b-instruct": ("Qwen3VLMoeTextConfig", 128000),
    "qwen3.5-122b-a10b": ("Qwen3_5MoeTextConfig", 32768), "qwen3.5-122b-a10b-nvfp4": ("Qwen3_5MoeTextConfig", 32768),
    "qwen3.5-35b-a3b": ("Qwen3_5MoeTextConfig", 32768),
}


def _variant(tmp_path: Path, fixture: str, edits: dict, section: str | None = None, name: str = "v") -> Path:
    """The fixture with `edits` in the root, or in `section`: "text" (text_config when the fixture has one, else
    the root) or "vision_config" — the shared helper's sections."""
    has_text = "text_config" in json.loads((FIX / fixture / "config.json").read_text())
    where = {"text": "text" if has_text else "root", "vision_config": "vision", None: "root"}[section]
    return edited_copy(tmp_path, fixture, name=name, **{where: edits})


def _refusal(folder: Path) -> InputError:
    with pytest.raises(InputError) as err:
        import_model(folder, name="m")
    return err.value


def _line_of(folder: Path, needle: str) -> int:
    return next(i for i, line in enumerate((folder / "config.json").read_text().splitlines(), 1) if needle in line)


# --- finding 1: max_position_embeddings absent takes the class default; null is refused

# the importer refuses it as it is (latent MoE `moe_latent_size`), so it has no figure to default
REFUSED = {"nemotron-3-super-120b-a12b-nvfp4"}


def test_every_fixture_is_covered() -> None:
    assert set(DEFAULTS) | REFUSED == {p.name for p in FIX.iterdir() if (p / "config.json").exists()}


@pytest.mark.parametrize("fixture", sorted(DEFAULTS))
def test_absent_max_position_embeddings_takes_the_class_default(tmp_path: Path, fixture: str) -> None:
    cls, default = DEFAULTS[fixture]
    m, doc = _import(_variant(tmp_path, fixture, {"max_position_embeddings": DROP}, "text"))
    assert m.max_position_embeddings == default
    src = doc["max_position_embeddings"]["source"]
    assert src.startswith("no `") and f"transformers 5.20.2 {cls} default {default}" in src


@pytest.mark.parametrize("fixture", ["qwen3-30b-a3b", "kimi-k2.5", "qwen3.5-35b-a3b"])
def test_null_max_position_embeddings_is_refused_with_file_line_and_field(tmp_path: Path, fixture: str) -> None:
    folder = _variant(tmp_path, fixture, {"max_position_embeddings": None}, "text")
    msg = str(_refusal(folder))
    line = _line_of(folder, '"max_position_embeddings": null')
    assert f"config.json:{line}: field '" in msg and "max_position_embeddings'" in msg
    assert "null" in msg and "without None" in msg and DEFAULTS[fixture][0] in msg


def test_the_default_is_scaled_by_a_linear_rope_factor_as_vllm_does(tmp_path: Path) -> None:
    # vllm/config/model.py:2598-2630: linear is not YaRN-style, so × factor: 32768 × 4
    m, doc = _import(_variant(tmp_path, "qwen3-30b-a3b", {"max_position_embeddings": DROP,
                                                          "rope_scaling": {"rope_type": "linear", "factor": 4.0}}))
    assert m.max_position_embeddings == 131072
    assert "Qwen3MoeConfig default 32768" in doc["max_position_embeddings"]["source"]


def test_recipe_check_refuses_a_max_model_len_above_the_default(tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", recipes)
    folder = _variant(tmp_path, "qwen3-30b-a3b", {"max_position_embeddings": DROP})
    (recipes / "models" / "q30-nomax.yaml").write_text(import_model(folder, name="q30-nomax")[1])
    text = (recipes / "qwen3-30b-a3b-rtx4090.yaml").read_text()
    assert "\nmodel: qwen3-30b-a3b\n" in text and "max_model_len: " in text
    lines = ["model: {file: models/q30-nomax.yaml}" if ln.startswith("model:") else
             ln.split("max_model_len:")[0] + "max_model_len: 65536" if ln.strip().startswith("max_model_len:") else ln
             for ln in text.splitlines()]
    (recipes / "q30-nomax-test.yaml").write_text("\n".join(lines) + "\n")
    result = invoke("check", "recipe", str(recipes / "q30-nomax-test.yaml"))
    assert result.code == 2, result.output
    assert "65,536" in result.output and "32,768" in result.output and "max_position_embeddings" in result.output


# --- finding 2: Qwen3-Next does not read mamba_ssm_dtype

def test_qwen3_next_ignores_mamba_ssm_dtype_as_vllm_does(tmp_path: Path) -> None:
    m, doc = _import(_variant(tmp_path, "qwen3-next-80b-a3b-thinking", {"mamba_ssm_dtype": "float32"}))
    state = doc["state"][0]
    assert state["ssm_dtype"]["value"] == "bf16"
    assert "not read for Qwen3NextForCausalLM" in state["ssm_dtype"]["source"]
    # 36 GDN layers × (conv 3 × (2·16·128 + 32·128) × 2 B + recurrent 32 × 128 × 128 × 2 B) — bf16, not fp32
    assert m.state_bytes_per_sequence == 36 * (3 * (2 * 16 * 128 + 32 * 128) * 2 + 32 * 128 * 128 * 2) == 39_518_208


def test_qwen3_5_still_reads_mamba_ssm_dtype() -> None:
    _, doc = _import(FIX / "qwen3.5-35b-a3b")
    src = doc["state"][0]["ssm_dtype"]
    assert src["value"] == "fp32" and "mamba_ssm_dtype" in src["source"] and "953-978" in src["source"]


# --- finding 3: Kimi-K2.5 merge_kernel_size needs exactly 2 entries

@pytest.mark.parametrize("value", [[], [2]])
@pytest.mark.parametrize("fixture", ["kimi-k2.5", "kimi-k2.7-code-nvfp4"])
def test_short_merge_kernel_size_is_refused_not_a_traceback(tmp_path: Path, fixture: str, value: list) -> None:
    folder = _variant(tmp_path, fixture, {"merge_kernel_size": value}, "vision_config")
    err = _refusal(folder)
    line = _line_of(folder, '"merge_kernel_size"')
    assert f"config.json:{line}: field 'vision_config.merge_kernel_size'" in str(err) and "exactly 2" in str(err)


# --- finding 4: rope_parameters is the transformers-5 spelling of rope_scaling

def test_rope_parameters_factor_scales_the_context_like_rope_scaling(tmp_path: Path) -> None:
    rope = {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000}
    m, doc = _import(_variant(tmp_path, "qwen3-30b-a3b", {"rope_scaling": DROP, "rope_parameters": rope}))
    assert m.max_position_embeddings == 40960 * 4 == 163840
    assert "`rope_parameters.factor` 4.0" in doc["max_position_embeddings"]["source"]
    both = {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_parameters": rope}
    m2, _ = _import(_variant(tmp_path, "qwen3-30b-a3b", both, name="both"))
    assert m2.max_position_embeddings == 40960 * 2                         # rope_scaling first, as transformers
