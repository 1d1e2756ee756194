"""QA18 (/work/notes/qa18-import.md): `recipegen model import` against real public config.json files.

Each test builds its config from a fixture in tests/fixtures/hf_configs (copied into tmp_path and edited), and
states the expected figures from the config itself:

- finding 3: a layer rule that leaves no MoE layer is refused naming the field that made every layer dense, with
  its line (`first_k_dense_replace` 61 of DeepSeek-V3's 61 layers; Qwen3-MoE's `mlp_only_layers` listing all 48
  layers, or `decoder_sparse_step` 49; `moe_layer_freq` with no multiple past the dense layers; GLM-4.5's
  `first_k_dense_replace`; Llama-4's `interleave_moe_layer_step`);
- finding 2: a geometry field config.json leaves out is refused saying why the transformers class default is not
  taken, and docs/models.md names every field refused so;
- finding 4: a config.json without `model_type` is refused at that field (vLLM 0.33.0 loads config.json through
  transformers' AutoConfig, which cannot pick the config class without it; where `auto_map` names an AutoConfig,
  the refusal says the file relies on remote code, which the importer does not read), naming the model type to add;
- finding 5: Llama-4's root `image_processor_config` (image preprocessing) is accepted and changes no figure;
  anywhere else it is still an unread field;
- finding 6: Kimi-K2.5's MLA layers cite `text_config.kv_lora_rank`, where the key is; the import summary names the
  shared experts and says once that its KV and state figures are per GPU at tensor parallel 1;
- finding 1: the vLLM 0.33.0 lines the importer cites for YaRN (and the new citations) say what it claims.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from cli_support import invoke
from vllm033_source import vllm033_source

from recipegen.modelimport import import_model, import_summary

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "hf_configs"
DOCS = REPO / "docs" / "models.md"
DROP = object()


def _config(fixture: str) -> dict:
    return json.loads((FIX / fixture / "config.json").read_text())


def _write(tmp_path: Path, cfg: dict, name: str = "ckpt") -> Path:
    folder = tmp_path / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def _edit(section: dict, edits: dict) -> None:
    for key, value in edits.items():
        if value is DROP:
            section.pop(key, None)
        else:
            section[key] = value


def _variant(tmp_path: Path, fixture: str, root: dict | None = None, text: dict | None = None,
             name: str = "ckpt") -> Path:
    cfg = _config(fixture)
    _edit(cfg, root or {})
    if text:
        _edit(cfg["text_config"], text)
    return _write(tmp_path, cfg, name)


def _line(folder: Path, key: str) -> int:
    """The 1-based line of `"key":` in the written config.json (one occurrence)."""
    hits = [i for i, line in enumerate((folder / "config.json").read_text().splitlines(), 1) if f'"{key}":' in line]
    assert len(hits) == 1, hits
    return hits[0]


def _refused(folder: Path) -> str:
    result = invoke("model", "import", str(folder), "-o", "-", "--name", "x")
    assert result.code == 2, result.output
    assert result.stdout == ""
    return result.stderr


def _doc(folder: Path) -> dict:
    result = invoke("model", "import", str(folder), "-o", "-", "--name", "x")
    assert result.code == 0, result.output
    return yaml.safe_load(result.stdout)


# --- finding 3: no MoE layer, named by the field that made every layer dense

def test_deepseek_first_k_dense_replace_covering_every_layer_names_the_field_and_line(tmp_path: Path) -> None:
    layers = _config("deepseek-v3")["num_hidden_layers"]                       # 61
    folder = _variant(tmp_path, "deepseek-v3", {"first_k_dense_replace": layers})
    err = _refused(folder)
    assert f"config.json:{_line(folder, 'first_k_dense_replace')}: field 'first_k_dense_replace':" in err
    assert f"`first_k_dense_replace` {layers} makes all {layers} layers dense: no MoE layer to offload" in err
    assert "deepseek_v2.py:1293-1297" in err


def test_deepseek_moe_layer_freq_with_no_multiple_past_the_dense_layers(tmp_path: Path) -> None:
    cfg = _config("deepseek-v3")
    layers, k = cfg["num_hidden_layers"], cfg["first_k_dense_replace"]       # 61, 3
    # MoE layers are i in [k, layers) with i % freq == 0: a freq of `layers` has no multiple there
    folder = _variant(tmp_path, "deepseek-v3", {"moe_layer_freq": layers})
    err = _refused(folder)
    assert f"config.json:{_line(folder, 'moe_layer_freq')}: field 'moe_layer_freq':" in err
    assert f"`moe_layer_freq` {layers}" in err and f"`first_k_dense_replace` {k}" in err
    assert f"(no layer {k}-{layers - 1} is a multiple of {layers}) makes all {layers} layers dense" in err
    # one step below, the last layer (layers - 1, past the dense ones) is a multiple: one MoE layer, imported
    fewer = _doc(_variant(tmp_path, "deepseek-v3", {"moe_layer_freq": layers - 1}, name="fewer"))
    assert str(fewer["moe_layers"]["value"]) == f"{layers - 1}-{layers - 1}"


def test_qwen3_moe_mlp_only_layers_listing_every_layer(tmp_path: Path) -> None:
    layers = _config("qwen3-30b-a3b")["num_hidden_layers"]                     # 48
    folder = _variant(tmp_path, "qwen3-30b-a3b", {"mlp_only_layers": list(range(layers))})
    err = _refused(folder)
    assert f"config.json:{_line(folder, 'mlp_only_layers')}: field 'mlp_only_layers':" in err
    assert f"`mlp_only_layers` 0-{layers - 1} makes all {layers} layers dense: no MoE layer to offload" in err


def test_qwen3_moe_decoder_sparse_step_past_every_layer(tmp_path: Path) -> None:
    layers = _config("qwen3-30b-a3b")["num_hidden_layers"]
    # layer i is MoE when (i + 1) % step == 0: a step of layers + 1 hits no layer
    folder = _variant(tmp_path, "qwen3-30b-a3b", {"decoder_sparse_step": layers + 1})
    err = _refused(folder)
    assert f"config.json:{_line(folder, 'decoder_sparse_step')}: field 'decoder_sparse_step':" in err
    assert f"`decoder_sparse_step` {layers + 1}" in err and f"makes all {layers} layers dense" in err


def test_qwen3_moe_mlp_only_layers_taking_out_the_layers_the_step_leaves(tmp_path: Path) -> None:
    layers = _config("qwen3-30b-a3b")["num_hidden_layers"]
    odd = [i for i in range(layers) if (i + 1) % 2 == 0]                       # the layers step 2 makes MoE
    folder = _variant(tmp_path, "qwen3-30b-a3b", {"decoder_sparse_step": 2, "mlp_only_layers": odd})
    err = _refused(folder)
    assert f"config.json:{_line(folder, 'mlp_only_layers')}: field 'mlp_only_layers':" in err
    assert "`decoder_sparse_step` 2" in err and f"makes all {layers} layers dense" in err


def test_qwen3_next_mlp_only_layers_listing_every_layer(tmp_path: Path) -> None:
    layers = _config("qwen3-next-80b-a3b-thinking")["num_hidden_layers"]
    folder = _variant(tmp_path, "qwen3-next-80b-a3b-thinking", {"mlp_only_layers": list(range(layers))})
    err = _refused(folder)
    assert f"config.json:{_line(folder, 'mlp_only_layers')}: field 'mlp_only_layers':" in err
    assert f"makes all {layers} layers dense" in err and "qwen3_next.py:489-495" in err


def test_glm45_first_k_dense_replace_covering_every_layer(tmp_path: Path) -> None:
    layers = _config("glm-4.5-air")["num_hidden_layers"]
    folder = _variant(tmp_path, "glm-4.5-air", {"first_k_dense_replace": layers})
    err = _refused(folder)
    assert f"config.json:{_line(folder, 'first_k_dense_replace')}: field 'first_k_dense_replace':" in err
    assert f"`first_k_dense_replace` {layers} makes all {layers} layers dense" in err


def test_llama4_interleave_step_past_every_layer(tmp_path: Path) -> None:
    layers = _config("llama-4-scout-17b-16e-instruct")["text_config"]["num_hidden_layers"]
    folder = _variant(tmp_path, "llama-4-scout-17b-16e-instruct", text={"interleave_moe_layer_step": layers + 1,
                                                                        "moe_layers": DROP})
    err = _refused(folder)
    assert (f"config.json:{_line(folder, 'interleave_moe_layer_step')}: field "
            "'text_config.interleave_moe_layer_step':") in err
    # worded as the other families' all-dense refusals: "config.json `<field>` <value> (...) makes all ..."
    assert (f"field 'text_config.interleave_moe_layer_step': config.json `text_config.interleave_moe_layer_step` "
            f"{layers + 1} ((i + 1) % {layers + 1} == 0 for no layer i below {layers}) makes all {layers} layers "
            "dense") in err


def test_a_family_without_a_layer_rule_refuses_at_its_own_field(tmp_path: Path) -> None:
    # Nemotron-H has no dense-layer rule of the others' kind: its pattern without an E leaves no MoE layer, and the
    # refusal names the pattern (with its line), not a backstop without a field
    cfg = _config("nemotron-3-nano-30b-a3b")
    pattern = cfg["hybrid_override_pattern"]
    assert "E" in pattern
    folder = _variant(tmp_path, "nemotron-3-nano-30b-a3b", {"hybrid_override_pattern": pattern.replace("E", "M")})
    err = _refused(folder)
    assert (f"config.json:{_line(folder, 'hybrid_override_pattern')}: field 'hybrid_override_pattern': no E (MoE) "
            "layer: the importer describes MoE models") in err


# --- finding 2: a geometry field left out: refused, saying why the class default is not taken

@pytest.mark.parametrize("fixture, root, text, field, cls", [
    ("qwen3-30b-a3b", {"moe_intermediate_size": DROP}, None, "moe_intermediate_size", "Qwen3MoeConfig"),
    ("qwen3-30b-a3b", {"num_experts": DROP}, None, "num_local_experts", "Qwen3MoeConfig"),
    ("qwen3-30b-a3b", {"hidden_size": DROP}, None, "hidden_size", "Qwen3MoeConfig"),
    ("deepseek-v3", {"kv_lora_rank": DROP}, None, "kv_lora_rank", "DeepseekV3Config"),
    ("llama-4-scout-17b-16e-instruct", None, {"num_local_experts": DROP}, "text_config.num_local_experts",
     "Llama4TextConfig"),
])
def test_a_missing_geometry_field_says_why_no_class_default(tmp_path: Path, fixture: str, root: dict | None,
                                                            text: dict | None, field: str, cls: str) -> None:
    err = _refused(_variant(tmp_path, fixture, root, text))
    assert f"field '{field}': missing `{field}`" in err
    assert f"the importer does not take transformers' {cls} default for the model's geometry" in err
    assert "write the checkpoint's value" in err


def test_a_default_the_importer_does_take_is_still_taken(tmp_path: Path) -> None:
    # Qwen3MoeConfig's num_key_value_heads (a class-default field, not geometry the importer refuses)
    doc = _doc(_variant(tmp_path, "qwen3-30b-a3b", {"num_key_value_heads": DROP}))
    assert "Qwen3MoeConfig default 4" in doc["attention"][0]["kv_heads"]["source"]


def _needed_fields() -> set[str]:
    """Every field a family reads through `Config.need` (refused when absent), read from the source."""
    src = (REPO / "recipegen" / "modelimport" / "families.py").read_text()
    names = set(re.findall(r'\.need\("([a-z_0-9]+)"', src))
    names |= set(re.findall(r'need\("[a-z_0-9]+", "([a-z_0-9]+)"\)', src))
    for group in ("EXPERTS", "TOP_K"):
        body = re.search(rf"^{group} = \(([^)]*)\)", src, re.M)
        assert body is not None
        names |= set(re.findall(r'"([a-z_]+)"', body.group(1)))
    return names


# vision towers' fields: docs/models.md names them together ("the vision towers' sizes under vision_config")
_VISION = {"depth", "in_channels", "temporal_patch_size", "patch_size", "num_position_embeddings", "out_hidden_size",
           "spatial_merge_size", "image_size", "num_channels", "projector_input_dim", "projector_output_dim",
           "vision_output_dim", "vt_hidden_size", "vt_intermediate_size", "vt_num_hidden_layers",
           "init_pos_emb_height", "init_pos_emb_width", "merge_kernel_size"}


def test_docs_name_every_field_refused_when_absent() -> None:
    text = DOCS.read_text()
    start = text.index("### Fields config.json leaves out")
    section = text[start:text.index("\n### ", start + 10)]
    needed = _needed_fields()
    assert {"moe_intermediate_size", "hidden_size", "num_experts", "kv_lora_rank", "swiglu_limit"} <= needed
    missing = sorted(n for n in needed - _VISION if f"`{n}`" not in section)
    assert not missing, f"docs/models.md does not name these fields refused when absent: {missing}"
    assert "the vision towers' sizes under `vision_config`" in section
    assert "never takes a class default" in section


# --- finding 4: no model_type

def test_no_model_type_is_refused_at_the_field(tmp_path: Path) -> None:
    cfg = _config("qwen3-30b-a3b")
    arch, mtype = cfg["architectures"][0], cfg.pop("model_type")
    err = _refused(_write(tmp_path, cfg))
    assert "field 'model_type': config.json has no `model_type`" in err
    assert "AutoConfig" in err and "cannot pick the config class" in err
    assert err.rstrip().endswith(f"add the model type {arch} uses: {mtype}")


def test_no_model_type_with_an_auto_map_config_says_it_relies_on_remote_code(tmp_path: Path) -> None:
    cfg = _config("deepseek-v3")
    arch, remote = cfg["architectures"][0], cfg["auto_map"]["AutoConfig"]
    del cfg["model_type"]
    err = _refused(_write(tmp_path, cfg))
    assert (f"field 'model_type': config.json has no `model_type`, and `auto_map` names the AutoConfig class "
            f"{remote!r}: the file relies on remote code") in err
    assert "--trust-remote-code" in err and "the importer reads no remote code" in err
    assert "cannot pick the config class" not in err
    assert err.rstrip().endswith(f"add the model type {arch} uses: deepseek_v3 or kimi_k2")
    # an auto_map without an AutoConfig entry: transformers does not take the remote path, the plain refusal
    cfg["auto_map"] = {k: v for k, v in cfg["auto_map"].items() if k != "AutoConfig"}
    err = _refused(_write(tmp_path, cfg, "no-autoconfig"))
    assert "cannot pick the config class" in err and "remote code" not in err


def test_no_model_type_on_a_wrapper_names_the_wrappers_type(tmp_path: Path) -> None:
    cfg = _config("llama-4-scout-17b-16e-instruct")
    mtype = cfg.pop("model_type")                                              # llama4, not llama4_text
    err = _refused(_write(tmp_path, cfg))
    assert err.rstrip().endswith(f"uses: {mtype}")


def test_a_null_model_type_is_refused_with_its_line(tmp_path: Path) -> None:
    folder = _variant(tmp_path, "deepseek-v3", {"model_type": None})
    err = _refused(folder)
    assert f"config.json:{_line(folder, 'model_type')}: field 'model_type': `model_type` is null" in err


def test_no_model_type_writes_no_model_file(tmp_path: Path) -> None:
    cfg = _config("mixtral-8x7b-v0.1")
    del cfg["model_type"]
    out = tmp_path / "m.yaml"
    result = invoke("model", "import", str(_write(tmp_path, cfg)), "-o", str(out))
    assert result.code == 2 and not out.exists()
    assert "field 'model_type': config.json has no `model_type`" in result.stderr


# --- finding 5: Llama-4's image_processor_config

IMAGE_PROCESSOR = {"add_global_tile": True, "max_patches": 16, "resize_to_max_canvas": False}


def _with_image_processor(cfg: dict) -> dict:
    """The fixture with the key where the public copy (AIC @54cb8c65) carries it: after eoi_token_index."""
    out: dict = {}
    for key, value in cfg.items():
        out[key] = value
        if key == "eoi_token_index":
            out["image_processor_config"] = dict(IMAGE_PROCESSOR)
    assert "image_processor_config" in out
    return out


@pytest.mark.parametrize("fixture", ["llama-4-scout-17b-16e-instruct", "llama-4-maverick-17b-128e-instruct"])
def test_llama4_image_processor_config_is_accepted_and_changes_nothing(tmp_path: Path, fixture: str) -> None:
    cfg = _config(fixture)
    plain = _doc(_write(tmp_path, cfg, "plain"))
    with_key = _doc(_write(tmp_path, _with_image_processor(cfg), "with"))
    assert {k: v for k, v in with_key.items() if k != "description"} == \
        {k: v for k, v in plain.items() if k != "description"}
    text = cfg["text_config"]
    assert with_key["routed_experts"]["value"] == text["num_local_experts"]
    assert with_key["decoder_layers"]["value"] == text["num_hidden_layers"]


def test_image_processor_config_elsewhere_is_still_an_unread_field(tmp_path: Path) -> None:
    cfg = _config("llama-4-scout-17b-16e-instruct")
    cfg["text_config"]["image_processor_config"] = dict(IMAGE_PROCESSOR)
    folder = _write(tmp_path, cfg, "in-text")
    err = _refused(folder)
    assert (f"config.json:{_line(folder, 'image_processor_config')}: field 'text_config.image_processor_config': "
            "not a field the importer reads") in err
    # another multimodal architecture: not accepted there either
    vl = _config("qwen3-vl-30b-a3b-instruct")
    vl["image_processor_config"] = dict(IMAGE_PROCESSOR)
    err = _refused(_write(tmp_path, vl, "vl"))
    assert "field 'image_processor_config': not a field the importer reads" in err


def test_llama4_text_architecture_does_not_take_it_at_its_root(tmp_path: Path) -> None:
    cfg = _config("llama-4-scout-17b-16e-instruct")
    text = dict(cfg["text_config"], architectures=["Llama4ForCausalLM"], image_processor_config=dict(IMAGE_PROCESSOR))
    err = _refused(_write(tmp_path, text))
    assert "field 'image_processor_config': not a field the importer reads" in err


# --- finding 6: Kimi-K2.5's MLA source; the import summary

def test_kimi_k25_mla_layers_cite_the_text_config_key(tmp_path: Path) -> None:
    cfg = _config("kimi-k2.5")
    assert "kv_lora_rank" not in cfg and "kv_lora_rank" in cfg["text_config"]
    doc = _doc(FIX / "kimi-k2.5")
    mla = doc["attention"][0]
    assert mla["layers"]["source"] == "config.json `text_config.kv_lora_rank` (every layer MLA)"
    assert mla["layers"]["value"] == f"0-{cfg['text_config']['num_hidden_layers'] - 1}"
    # a root-level DeepSeek config keeps its root key (and the catalog its text)
    assert _doc(FIX / "deepseek-v3")["attention"][0]["layers"]["source"] == \
        "config.json `kv_lora_rank` (every layer MLA)"


def test_summary_names_the_shared_expert() -> None:
    cfg = _config("deepseek-v3")
    layers, k = cfg["num_hidden_layers"], cfg["first_k_dense_replace"]
    m, _ = import_model(FIX / "deepseek-v3")
    text = import_summary(m)
    assert text.startswith(f"{layers} layers ({layers - k} MoE) × {cfg['n_routed_experts']} experts "
                           f"(+{cfg['n_shared_experts']} shared), top-{cfg['num_experts_per_tok']}, ")
    # no shared expert: nothing said
    q = _config("qwen3-30b-a3b")
    m, _ = import_model(FIX / "qwen3-30b-a3b")
    assert import_summary(m).startswith(f"{q['num_hidden_layers']} layers ({q['num_hidden_layers']} MoE) × "
                                        f"{q['num_experts']} experts, top-{q['num_experts_per_tok']}, ")


def test_summary_says_once_that_kv_and_state_are_per_gpu() -> None:
    cfg = _config("qwen3-next-80b-a3b-thinking")
    layers, interval = cfg["num_hidden_layers"], cfg["full_attention_interval"]
    state_layers = layers - layers // interval                                 # Gated DeltaNet layers: 36
    m, _ = import_model(FIX / "qwen3-next-80b-a3b-thinking")
    text = import_summary(m)
    # one qualifier, before the KV figure, covering KV and state alike
    assert text.count("per GPU at tensor parallel 1") == 1 and "one GPU" not in text
    assert text.index("per GPU at tensor parallel 1: KV ") < text.index(", state ")
    assert text.endswith(f"B per sequence ({state_layers} state layers)")
    # a model without state: the same qualifier on its KV figure
    plain = import_summary(import_model(FIX / "deepseek-v3")[0])
    assert "per GPU at tensor parallel 1: KV " in plain and "state" not in plain
    assert f"× {cfg['num_experts']} experts (+1 shared), top-{cfg['num_experts_per_tok']}," in text
    # docs/models.md quotes this line for this model
    quoted = f"wrote recipes/models/qwen3-next-80b-a3b-thinking.yaml: {text}"
    assert quoted in DOCS.read_text()


# --- finding 1 (not changed): the vLLM 0.33.0 lines cited, and the new citations

SRC = vllm033_source("config/model.py")


@pytest.mark.skipif(SRC is None, reason="vLLM 0.33.0 source not unpacked (scripts/fetch-vllm033-source.sh)")
@pytest.mark.parametrize("path, first, last, needles", [
    # YaRN: max_position_embeddings is already the scaled length (build._context_length cites 2610-2612)
    ("config/model.py", 2610, 2612, ["YaRN variants leave max_position_embeddings already scaled"]),
    ("config/model.py", 2613, 2620, ['"yarn",', '"deepseek_yarn",']),
    # model_type: from the file; an architecture mapped only for LongcatFlash; then AutoConfig
    ("transformers_utils/config.py", 361, 369, ['model_type = config_dict.get("model_type")',
                                                "_ARCHITECTURE_TO_MODEL_TYPE.get(architectures[0])"]),
    ("transformers_utils/config.py", 445, 445, ["config = AutoConfig.from_pretrained("]),
    ("transformers_utils/config.py", 1244, 1255, ["def get_hf_image_processor_config(", "get_image_processor_config("]),
    # the layer rules the all-dense refusals cite
    ("model_executor/models/qwen3_moe.py", 385, 392, ["mlp_only_layers", "% config.decoder_sparse_step == 0"]),
    ("model_executor/models/qwen3_next.py", 489, 495, ["mlp_only_layers", "% config.decoder_sparse_step == 0"]),
    ("model_executor/models/deepseek_v2.py", 1293, 1297, ["layer_idx >= config.first_k_dense_replace",
                                                          "layer_idx % moe_layer_freq == 0"]),
    ("model_executor/models/glm4_moe.py", 353, 356, ["layer_idx >= config.first_k_dense_replace"]),
    ("model_executor/models/llama4.py", 340, 343, ["% config.interleave_moe_layer_step == 0"]),
])
def test_cited_lines(path: str, first: int, last: int, needles: list[str]) -> None:
    assert SRC is not None
    text = "\n".join((SRC / path).read_text(encoding="utf-8").splitlines()[first - 1:last])
    for needle in needles:
        assert needle in text, (path, first, last, needle)
