"""The plugin's vllm-free parts: the environment contract, version gate, refusal checks.

The refusals the CPU engine cannot trigger (EPLB, monolithic backends, expert parallelism) are
covered here on the checks the plugin calls with values read from vLLM's layer objects (whose
attributes tests/test_vllm033_contracts.py pins in 0.33's source).
"""

from __future__ import annotations

import pytest
from expert_residency.vllm_plugin import checks
from expert_residency.vllm_plugin.refusal import REFUSAL_EXIT_CODE, REFUSAL_TAG, ResidencyRefused, refuse
from expert_residency.vllm_plugin.settings import SettingsError, load_settings
from expert_residency.vllm_plugin.version import base_version, unsupported_version_reason

HASH = "a" * 64


def test_inert_without_mode() -> None:
    for env in ({}, {"EXPERT_RESIDENCY_MODE": ""}, {"EXPERT_RESIDENCY_MODE": "off"}):
        s = load_settings(env)
        assert s.mode == "off" and not s.active and not s.splits_experts


def test_modes_and_defaults() -> None:
    s = load_settings({"EXPERT_RESIDENCY_MODE": "count", "EXPERT_RESIDENCY_DUMP_DIR": "/d"})
    assert (s.mode, s.dump_mode_name, s.dump_dir, s.dump_interval_s) == ("count", "count-only", "/d", 60.0)
    assert (s.lane, s.traffic_class) == ("lane", "none")
    assert load_settings({"EXPERT_RESIDENCY_MODE": "count-only"}).mode == "count"
    s = load_settings({"EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_ROWMAP": "/m",
                       "EXPERT_RESIDENCY_CONTENT_HASH": HASH.upper(),
                       "EXPERT_RESIDENCY_DUMP_INTERVAL_S": "2.5", "EXPERT_RESIDENCY_LANE": "agent",
                       "EXPERT_RESIDENCY_CLASS": "prose"})
    assert s.splits_experts and s.content_hash == HASH and s.dump_interval_s == 2.5
    assert (s.lane, s.traffic_class) == ("agent", "prose")
    assert load_settings({"EXPERT_RESIDENCY_MODE": "unsplit"}).splits_experts
    assert load_settings({"EXPERT_RESIDENCY_MODE": "unsplit"}).per_pick == "auto"
    assert load_settings({"EXPERT_RESIDENCY_MODE": "unsplit",
                          "EXPERT_RESIDENCY_PER_PICK": "Modular"}).per_pick == "modular"


@pytest.mark.parametrize("env, variable", [
    ({"EXPERT_RESIDENCY_MODE": "pinned"}, "EXPERT_RESIDENCY_MODE"),
    ({"EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_CONTENT_HASH": HASH},
     "EXPERT_RESIDENCY_ROWMAP"),
    ({"EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_ROWMAP": "/m"},
     "EXPERT_RESIDENCY_CONTENT_HASH"),
    ({"EXPERT_RESIDENCY_MODE": "count", "EXPERT_RESIDENCY_CONTENT_HASH": "abc"},
     "EXPERT_RESIDENCY_CONTENT_HASH"),
    ({"EXPERT_RESIDENCY_MODE": "count", "EXPERT_RESIDENCY_DUMP_INTERVAL_S": "soon"},
     "EXPERT_RESIDENCY_DUMP_INTERVAL_S"),
    ({"EXPERT_RESIDENCY_MODE": "count", "EXPERT_RESIDENCY_DUMP_INTERVAL_S": "-1"},
     "EXPERT_RESIDENCY_DUMP_INTERVAL_S"),
    ({"EXPERT_RESIDENCY_MODE": "count", "EXPERT_RESIDENCY_LANE": "a__b"}, "EXPERT_RESIDENCY_LANE"),
    ({"EXPERT_RESIDENCY_MODE": "count", "EXPERT_RESIDENCY_CLASS": "-x"}, "EXPERT_RESIDENCY_CLASS"),
    ({"EXPERT_RESIDENCY_MODE": "unsplit", "EXPERT_RESIDENCY_PER_PICK": "gpu"},
     "EXPERT_RESIDENCY_PER_PICK"),
])
def test_bad_settings_name_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        load_settings(env)


def test_version_gate() -> None:
    assert base_version("0.32.0+cpu") == "0.32.0"
    assert unsupported_version_reason("0.32.0+cpu") is None
    assert unsupported_version_reason("0.33.0") is None
    for bad in ("0.31.0", "0.33.1", "0.34.0rc1", "unknown"):
        reason = unsupported_version_reason(bad)
        assert reason is not None and bad in reason and "0.32.0, 0.33.0" in reason


def test_refuse_prints_one_line_and_stops(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ResidencyRefused, match="map gone"):
        refuse("map gone")
    assert capsys.readouterr().err == f"{REFUSAL_TAG}: map gone\n"
    with pytest.raises(SystemExit) as exc:
        refuse("bad version", exit_process=True)
    assert exc.value.code == REFUSAL_EXIT_CODE != 0
    assert capsys.readouterr().err.count(REFUSAL_TAG) == 1


def test_eplb_refused_in_every_active_mode() -> None:
    assert checks.eplb_reason(False) is None
    assert "--enable-eplb" in (checks.eplb_reason(True) or "")


def test_lora_refused_only_with_split_modes() -> None:
    assert checks.lora_reason(False, "residency") is None
    assert checks.lora_reason(True, "count") is None
    for mode in ("residency", "unsplit"):
        assert "LoRA" in (checks.lora_reason(True, mode) or "")


def test_monolithic_backend_refused() -> None:
    assert checks.monolithic_reason(False, "TrtLlmMxfp4ExpertsModular", "l") is None
    reason = checks.monolithic_reason(True, "TrtLlmMxfp4ExpertsMonolithic",
                                      "model.layers.3.mlp.experts")
    assert reason is not None and "TrtLlmMxfp4ExpertsMonolithic" in reason
    assert "model.layers.3.mlp.experts" in reason and "--moe-backend" in reason


def test_expert_parallel_refused() -> None:
    assert checks.expert_parallel_reason(384, 384, "l") is None
    assert "192 of 384" in (checks.expert_parallel_reason(192, 384, "l") or "")


def test_geometry() -> None:
    ok = checks.geometry_reason((0, 1), 8, [0, 1], [8, 8], "m.rowmap")
    assert ok is None
    experts = checks.geometry_reason((0, 1), 16, [0, 1], [8, 8], "m.rowmap")
    assert experts is not None and "16 experts per layer" in experts and "m.rowmap" in experts
    layers = checks.geometry_reason(tuple(range(40)), 384, list(range(39)), [384] * 39, "a.rowmap")
    assert layers is not None and "0-39" in layers and "0-38" in layers and "extra [39]" in layers
    mixed = checks.geometry_reason((0,), 8, [0, 1], [8, 16], "m")
    assert mixed is not None and "disagree" in mixed


torch = pytest.importorskip("torch")


def test_layer_index_from_vllm_layer_names() -> None:
    from expert_residency.vllm_plugin.worker_runtime import layer_index_of

    assert layer_index_of("model.layers.0.mlp.experts") == 0
    assert layer_index_of("language_model.model.layers.39.mlp.experts") == 39
    with pytest.raises(ResidencyRefused, match="decoder layer index"):
        layer_index_of("model.mtp.experts")


def test_expert_tensors_and_placement_of_uva_offloaded_parameters() -> None:
    """Every per-expert parameter is re-homed (vLLM's non-expert list excluded); a parameter
    vLLM's UVA offloader marked lives in host memory whatever device its view reports."""
    from expert_residency.vllm_plugin.worker_runtime import _expert_tensors, _on_device

    layer = torch.nn.Module()
    layer.local_num_experts = 4
    layer.w13_weight = torch.nn.Parameter(torch.zeros(4, 8, 2), requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(torch.zeros(4, 2, 4), requires_grad=False)
    layer.w13_weight_scale = torch.nn.Parameter(torch.zeros(4, 8, 1), requires_grad=False)
    layer.w13_input_scale = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
    layer.e_score_correction_bias = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
    layer.global_scale = torch.nn.Parameter(torch.zeros(()), requires_grad=False)
    assert sorted(_expert_tensors(layer)) == ["w13_weight", "w13_weight_scale", "w2_weight"]
    meta = torch.zeros(2, device="meta")
    assert _on_device(meta)
    meta._vllm_is_uva_offloaded = True
    assert not _on_device(meta)
    assert not _on_device(torch.zeros(2))
