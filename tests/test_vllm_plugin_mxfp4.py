"""MXFP4 residency adapter of the vLLM plugin (``vllm_plugin.mxfp4_experts`` + the worker runtime's
MXFP4 path), without vLLM: a stand-in layer with exactly vLLM 0.33's ``Mxfp4MoEMethod``
parameter names, shapes and dtypes (``create_weights``; pinned in tests/test_vllm_plugin_mxfp4_contracts.py)
in the checkpoint layout the plugin keeps by skipping vLLM's conversion.

Claims, each able to fail:
* residency (two different hot/cold maps) == unsplit, bit for bit (``torch.equal``), through
  ``WorkerRuntime._install_banks`` + ``split_forward`` — the same code the engine runs;
* both agree with a plain dequantize-then-matmul MXFP4 SwiGLU reference within a tolerance;
* re-homing removes the original parameters from the layer and places every byte in one bank;
* the same two claims with a SwiGLU clamp (``swiglu_limit``, as DeepSeek-V4/V4.1 pass it), against
  a reference that clamps the dequantized products itself, and the clamp changes the output;
* layers the kernels cannot compute exactly (biases, another activation, alpha/beta, a backend's
  converted layout) are refused with a reason naming the layer; a clamp is not refused.

``build_case``/``run_modes`` take a device: tests/gpu/test_plugin_mxfp4_gpu.py runs the same
checks on CUDA with the Triton kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from expert_residency.formats import RowMap  # noqa: E402
from expert_residency.mxfp4 import dequantize_mxfp4, quantize_mxfp4  # noqa: E402
from expert_residency.vllm_plugin.mxfp4_experts import (  # noqa: E402
    checkpoint_geometry,
    mxfp4_unsupported_reason,
)
from expert_residency.vllm_plugin.refusal import ResidencyRefused  # noqa: E402
from expert_residency.vllm_plugin.settings import PluginSettings  # noqa: E402
from expert_residency.vllm_plugin.worker_runtime import WorkerRuntime  # noqa: E402

HASH = "b" * 64
# Smallest geometry the Triton kernels' default tiles take (H % 128, I % 128).
HIDDEN, INTER, EXPERTS, TOP_K, TOKENS = 256, 128, 8, 3, 7
LAYERS = (0, 1)


class MoEActivation(Enum):  # the values of vLLM 0.33's enum the check reads
    SILU = "silu"
    SWIGLUOAI = "swigluoai"
    GELU = "gelu"


class FakeMxfp4Experts(torch.nn.Module):
    """What the runtime reads from a vLLM 0.33 ``RoutedExperts`` with an ``Mxfp4MoEMethod`` after
    the plugin kept the checkpoint layout."""

    def __init__(self, index: int, w13: torch.Tensor, w2: torch.Tensor,
                 swiglu_limit: float | None = None) -> None:
        super().__init__()
        w13_q, w13_s = quantize_mxfp4(w13)
        w2_q, w2_s = quantize_mxfp4(w2)
        for name, value in (("w13_weight", w13_q), ("w13_weight_scale", w13_s),
                            ("w2_weight", w2_q), ("w2_weight_scale", w2_s)):
            self.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))
        self.layer_name = f"model.layers.{index}.ffn.experts"
        self.local_num_experts = self.global_num_experts = w13.shape[0]
        self.top_k = TOP_K
        self.activation = MoEActivation.SILU
        self.swiglu_limit = swiglu_limit
        self.apply_router_weight_on_input = False
        self.moe_config = SimpleNamespace(max_num_tokens=64, swiglu_alpha=None, swiglu_beta=None,
                                          use_deferred_moe_finalize=False)
        self._er_layer_index = index
        self._er_mxfp4 = True
        self._er_counted = False
        self._er_excluded = False
        self._er_resident = None


@dataclass
class Case:
    weights: dict[int, tuple[torch.Tensor, torch.Tensor]]   # float w13, w2 per layer (pre-quant)
    x: torch.Tensor
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor
    device: torch.device


def build_case(device: str = "cpu", seed: int = 0) -> Case:
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for index in LAYERS:
        w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen) * 0.08
        w2 = torch.randn(EXPERTS, HIDDEN, INTER, generator=gen) * 0.08
        # Spread the block scales (ue8m0) over several binades.
        w13 *= 2.0 ** torch.randint(-2, 3, (EXPERTS, 2 * INTER, HIDDEN // 32, 1), generator=gen
                                    ).float().expand(-1, -1, -1, 32).reshape(w13.shape)
        weights[index] = (w13, w2)
    x = (torch.randn(TOKENS, HIDDEN, generator=gen)).to(torch.bfloat16).to(device)
    logits = torch.randn(TOKENS, EXPERTS, generator=gen)
    top = torch.topk(logits, TOP_K, dim=-1)
    return Case(weights, x, torch.softmax(top.values, dim=-1).to(device),
                top.indices.to(torch.int32).to(device), torch.device(device))


def _rowmap(hot: list[int]) -> RowMap:
    cold = [e for e in range(EXPERTS) if e not in hot]
    return RowMap(LAYERS, EXPERTS, [list(hot) for _ in LAYERS], [list(cold) for _ in LAYERS],
                  provenance={"source": "test"})


def runtime_for(case: Case, mode: str, hot: list[int] | None = None,
                swiglu_limit: float | None = None) -> tuple[WorkerRuntime, dict]:
    rowmap = _rowmap(hot) if hot is not None else None
    settings = PluginSettings(mode=mode, rowmap_path="test.rowmap" if rowmap else None,
                              content_hash=rowmap.content_hash() if rowmap else None)
    runtime = WorkerRuntime(settings, rowmap)
    layers = {}
    for index, (w13, w2) in case.weights.items():
        layers[index] = FakeMxfp4Experts(index, w13, w2, swiglu_limit).to(case.device)
    runtime.target_layers = dict(layers)
    runtime._install_banks()
    return runtime, layers


def forward_all(runtime: WorkerRuntime, layers: dict, case: Case) -> dict[int, torch.Tensor]:
    return {i: runtime.split_forward(m, case.x, case.topk_weights, case.topk_ids)
            for i, m in layers.items()}


def reference_output(case: Case, index: int, swiglu_limit: float | None = None) -> torch.Tensor:
    """Dequantize the whole layer, then per token: fp32 matmuls, bf16 activation and pick rows
    (what the kernels store), fp32 weighted sum, one cast. ``swiglu_limit``: vLLM 0.33's SILU
    clamp (``fused_moe/utils.py`` ``_swiglu_limit_torch``): gate ≤ L, -L ≤ up ≤ L, before SiLU."""
    w13, w2 = case.weights[index]
    q13, s13 = quantize_mxfp4(w13)
    q2, s2 = quantize_mxfp4(w2)
    d13, d2 = dequantize_mxfp4(q13, s13), dequantize_mxfp4(q2, s2)
    x = case.x.float().cpu()
    out = torch.zeros(TOKENS, HIDDEN)
    for t in range(TOKENS):
        for k in range(TOP_K):
            e = int(case.topk_ids[t, k])
            g = d13[e] @ x[t]
            gate, up = g[:INTER], g[INTER:]
            if swiglu_limit is not None:
                gate = gate.clamp(max=swiglu_limit)
                up = up.clamp(min=-swiglu_limit, max=swiglu_limit)
            a = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16).float()
            y = (d2[e] @ a).to(torch.bfloat16).float()
            out[t] += float(case.topk_weights[t, k]) * y
    return out.to(torch.bfloat16)


def run_modes(device: str, swiglu_limit: float | None = None) -> dict[str, Any]:
    """Unsplit and two residency maps over the same case (layers with ``swiglu_limit``); returns
    outputs and runtimes."""
    case = build_case(device)
    outputs, runtimes = {}, {}
    for label, mode, hot in (("unsplit", "unsplit", None),
                             ("residency-a", "residency", [0, 3, 5]),
                             ("residency-b", "residency", [7, 6, 2, 1, 4])):
        runtime, layers = runtime_for(case, mode, hot, swiglu_limit)
        outputs[label] = forward_all(runtime, layers, case)
        runtimes[label] = (runtime, layers)
    return {"case": case, "outputs": outputs, "runtimes": runtimes, "swiglu_limit": swiglu_limit}


def check_modes(result: dict[str, Any], rel_tol: float) -> None:
    case, outputs = result["case"], result["outputs"]
    for index in LAYERS:
        base = outputs["unsplit"][index]
        assert base.dtype == torch.bfloat16 and base.shape == (TOKENS, HIDDEN)
        for label in ("residency-a", "residency-b"):
            assert torch.equal(outputs[label][index], base), f"{label} layer {index} != unsplit"
        ref = reference_output(case, index, result.get("swiglu_limit")).float()
        got = base.float().cpu()
        rel = float((got - ref).norm() / ref.norm())
        assert rel <= rel_tol, f"layer {index}: relative L2 {rel:.2e} vs the dequantized reference"
    # The comparison is not vacuous: the layers differ from each other and from zero.
    assert not torch.equal(outputs["unsplit"][0], outputs["unsplit"][1])


def test_residency_equals_unsplit_and_matches_dequantized_reference() -> None:
    check_modes(run_modes("cpu"), rel_tol=1e-3)


# Small enough that many gate/up products of the test layers (|g| up to ~10) are clamped.
CLAMP = 1.5


def clamp_bites(case: Case, rel_min: float = 0.05) -> None:
    """The clamp changes the reference output by far more than the tolerances used here."""
    for index in LAYERS:
        plain = reference_output(case, index).float()
        clamped = reference_output(case, index, CLAMP).float()
        assert float((plain - clamped).norm() / plain.norm()) > rel_min


def test_residency_with_swiglu_clamp_equals_unsplit_and_clamped_reference() -> None:
    result = run_modes("cpu", swiglu_limit=CLAMP)
    check_modes(result, rel_tol=1e-3)
    clamp_bites(result["case"])
    runtime, _ = result["runtimes"]["residency-a"]
    assert runtime.per_pick_name.endswith("swiglu_limit=1.5)")
    # A limit <= 0 is vLLM's "off": the layers compute the unclamped expert.
    off = run_modes("cpu", swiglu_limit=0.0)
    plain = run_modes("cpu")
    for index in LAYERS:
        assert torch.equal(off["outputs"]["residency-a"][index],
                           plain["outputs"]["residency-a"][index])


def test_rehome_frees_parameters_and_places_every_byte() -> None:
    case = build_case("cpu")
    checkpoint_bytes = sum(p.numel() for p in FakeMxfp4Experts(0, *case.weights[0]).parameters())
    runtime, layers = runtime_for(case, "residency", [0, 3, 5])
    for _index, module in layers.items():
        assert dict(module.named_parameters(recurse=False)) == {}, "originals must be freed"
        resident = module._er_resident
        assert (resident.hot.num_rows, resident.cold.num_rows) == (3, EXPERTS - 3)
        assert resident.hot_ids == [0, 3, 5]
        bank_bytes = resident.bank_bytes()
        assert bank_bytes.total == checkpoint_bytes
        assert bank_bytes.hot == checkpoint_bytes * 3 // EXPERTS
        assert sorted(resident.hot.tensors) == ["w13_weight", "w13_weight_scale", "w2_weight",
                                                 "w2_weight_scale"]
    assert runtime.per_pick_name.startswith("expert_residency torch MXFP4 reference")


def test_unsplit_keeps_the_parameters_in_place() -> None:
    case = build_case("cpu")
    _, layers = runtime_for(case, "unsplit")
    module = layers[0]
    assert module._er_resident.hot.tensors["w13_weight"].data_ptr() == module.w13_weight.data_ptr()
    assert module._er_resident.cold.num_rows == 0


def _layer(**changes: Any) -> FakeMxfp4Experts:
    case = build_case("cpu")
    layer = FakeMxfp4Experts(3, *case.weights[0])
    for name, value in changes.items():
        if name.startswith("moe_config."):
            setattr(layer.moe_config, name.split(".", 1)[1], value)
        else:
            setattr(layer, name, value)
    return layer


def test_supported_layer_has_no_reason() -> None:
    assert mxfp4_unsupported_reason(_layer()) is None
    assert mxfp4_unsupported_reason(_layer(swiglu_limit=0.0)) is None  # vLLM: limit <= 0 is off
    assert mxfp4_unsupported_reason(_layer(swiglu_limit=10.0)) is None  # computed (clamped)
    # gpt-oss: biases + SwiGLU-OAI with the method's own constants (no limit or alpha on the layer)
    gptoss = dict(activation=MoEActivation.SWIGLUOAI, w13_bias=torch.zeros(EXPERTS, 2 * INTER),
                  w2_bias=torch.zeros(EXPERTS, HIDDEN))
    assert mxfp4_unsupported_reason(_layer(**gptoss)) is None
    assert mxfp4_unsupported_reason(_layer(**gptoss, swiglu_limit=7.0,
                                           **{"moe_config.swiglu_alpha": 1.702})) is None
    assert mxfp4_unsupported_reason(_layer(w13_bias=torch.zeros(EXPERTS, 2 * INTER),
                                           w2_bias=torch.zeros(EXPERTS, HIDDEN))) is None  # SILU + biases


def test_layer_swiglu_limit_is_the_clamp_vllm_applies() -> None:
    from expert_residency.vllm_plugin.mxfp4_experts import layer_swiglu_limit

    assert layer_swiglu_limit(_layer(swiglu_limit=10.0)) == 10.0
    for off in (None, 0.0, -1.0, float("inf")):
        assert layer_swiglu_limit(_layer(swiglu_limit=off)) is None
    assert mxfp4_unsupported_reason(_layer(**{"moe_config.swiglu_alpha": 1.0,
                                              "moe_config.swiglu_beta": 0.0})) is None


@pytest.mark.parametrize("changes, words", [
    ({"activation": MoEActivation.GELU}, ["'gelu'", "silu / swigluoai only"]),
    ({"activation": MoEActivation.SWIGLUOAI, "swiglu_limit": 10.0}, ["limit 10.0", "gpt-oss's constants"]),
    ({"activation": MoEActivation.SWIGLUOAI, "moe_config.swiglu_alpha": 1.5}, ["alpha 1.5", "1.702"]),
    ({"moe_config.swiglu_alpha": 1.702}, ["SILU with alpha 1.702", "silu(gate) * up only"]),
])
def test_unsupported_layers_are_refused_by_name(changes: dict, words: list[str]) -> None:
    reason = mxfp4_unsupported_reason(_layer(**changes))
    assert reason is not None and reason.startswith("model.layers.3.ffn.experts: ")
    for word in words:
        assert word in reason


def test_checkpoint_geometry_reads_and_checks_vllm_layout() -> None:
    layer = _layer()
    tensors = dict(layer.named_parameters(recurse=False))
    assert checkpoint_geometry(tensors) == (EXPERTS, HIDDEN, INTER)
    swizzled = dict(tensors, w13_weight_scale=tensors["w13_weight_scale"].reshape(EXPERTS, -1))
    with pytest.raises(ValueError, match=r"w13_weight_scale is torch.uint8 \(8, 2048\), expected"):
        checkpoint_geometry(swizzled, "L")
    fp4 = dict(tensors, w2_weight=tensors["w2_weight"].view(torch.int8))
    with pytest.raises(ValueError, match="w2_weight is torch.int8"):
        checkpoint_geometry(fp4)
    with pytest.raises(ValueError, match=r"no \['w2_weight_scale'\]"):
        checkpoint_geometry({k: v for k, v in tensors.items() if k != "w2_weight_scale"})


def test_layer_the_kernels_cannot_take_refuses_at_install() -> None:
    case = build_case("cpu")
    runtime = WorkerRuntime(PluginSettings(mode="unsplit"), None)
    layer = FakeMxfp4Experts(0, *case.weights[0])
    layer.w2_weight_scale = torch.nn.Parameter(layer.w2_weight_scale.data[:, :, :2].contiguous(),
                                               requires_grad=False)
    runtime.target_layers = {0: layer}
    with pytest.raises(ResidencyRefused, match="MXFP4 experts cannot take this layer"):
        runtime._install_banks()


def test_deferred_finalize_is_refused_for_split_modes() -> None:
    from expert_residency.vllm_plugin import checks

    assert checks.deferred_finalize_reason(False, "L") is None
    reason = checks.deferred_finalize_reason(True, "model.layers.0.ffn.experts")
    assert "use_deferred_moe_finalize" in reason and "TP=1" in reason


class FakeMxfp4Method:
    """Stands in for vLLM's ``Mxfp4MoEMethod``: records whether its conversion ran."""

    def __init__(self) -> None:
        self.converted: list[str] = []

    def process_weights_after_loading(self, layer: Any) -> None:
        self.converted.append(layer.layer_name)


def _hold(runtime: Any, pre_processed: bool = False) -> FakeMxfp4Method:
    from expert_residency.vllm_plugin.mxfp4_experts import hold_back_conversion

    method = FakeMxfp4Method()
    hold_back_conversion(method, lambda: runtime, lambda: pre_processed)
    hold_back_conversion(method, lambda: runtime, lambda: pre_processed)  # idempotent
    return method


def test_target_layers_keep_the_checkpoint_layout() -> None:
    runtime = WorkerRuntime(PluginSettings(mode="unsplit"), None)
    method = _hold(runtime)
    layer = _layer()
    layer._er_mxfp4 = False
    method.process_weights_after_loading(layer)
    assert method.converted == [] and layer._er_mxfp4 is True


def test_layers_of_a_second_model_get_vllms_conversion() -> None:
    runtime = WorkerRuntime(PluginSettings(mode="unsplit"), None)
    runtime.target_layers = {0: object()}  # the target model is loaded: this is a drafter
    method = _hold(runtime)
    layer = _layer(swiglu_limit=7.0)  # not refused: vLLM's kernel runs it
    layer._er_mxfp4 = False
    method.process_weights_after_loading(layer)
    assert method.converted == [layer.layer_name] and layer._er_mxfp4 is False


def test_unsupported_or_preprocessed_layers_refuse_before_any_conversion() -> None:
    runtime = WorkerRuntime(PluginSettings(mode="unsplit"), None)
    method = _hold(runtime)
    with pytest.raises(ResidencyRefused, match="'gelu'"):
        method.process_weights_after_loading(_layer(activation=MoEActivation.GELU,
                                                    w13_bias=torch.zeros(EXPERTS, 2 * INTER)))
    clamped = _layer(swiglu_limit=10.0)  # a clamp alone is computed, not refused
    clamped._er_mxfp4 = False
    method.process_weights_after_loading(clamped)
    assert clamped._er_mxfp4 is True
    method = _hold(runtime, pre_processed=True)
    with pytest.raises(ResidencyRefused, match="pre-processed"):
        method.process_weights_after_loading(_layer())
    assert method.converted == []


def test_held_back_drafter_layers_are_converted_when_excluded() -> None:
    runtime = WorkerRuntime(PluginSettings(mode="unsplit"), None)
    runtime.target_layers = {0: object()}
    method = FakeMxfp4Method()
    drafter = _layer()
    drafter._er_vllm_process_weights = method.process_weights_after_loading
    runtime.pending = [drafter]
    runtime.after_model_loaded(torch.nn.ModuleList([drafter]))
    assert method.converted == [drafter.layer_name]
    assert drafter._er_excluded and not drafter._er_mxfp4
    assert runtime.excluded_layers == [drafter.layer_name]


def test_layers_on_a_gpu_the_capability_table_rejects_are_refused_at_install(monkeypatch) -> None:
    """The plugin asks the runtime's capability table (as `check budgets` does) about the layer's
    format on the worker's GPU: MXFP4 on a 7.0 device (the table needs 8.0) is refused by name."""
    from types import SimpleNamespace

    from expert_residency.vllm_plugin import worker_runtime

    fake = {"w13_weight": SimpleNamespace(dtype=torch.uint8, device=torch.device("cuda", 0))}
    monkeypatch.setattr(worker_runtime, "_expert_tensors", lambda module: fake)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    layer = SimpleNamespace(layer_name="model.layers.3.ffn.experts")
    reason = worker_runtime._capability_reason(layer, True)
    assert reason is not None and reason.startswith("model.layers.3.ffn.experts: ")
    assert "compute capability 7.0" in reason and "8.0" in reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert worker_runtime._capability_reason(layer, True) is None
