"""gpt-oss's MXFP4 experts (bf16 biases, interleaved gate/up, SwiGLU-OAI) through the plugin's MXFP4
adapter and the worker runtime, without vLLM: the stand-in layer of tests/test_vllm_plugin_mxfp4.py
with ``activation = swigluoai`` and ``w13_bias [E, 2I]`` / ``w2_bias [E, H]`` parameters as
``GptOssMxfp4MoEMethod.create_weights`` registers them (pinned in
tests/test_vllm_plugin_gptoss_mxfp4_contracts.py).

Claims, each able to fail:
* two residency maps == unsplit bit for bit (``torch.equal``), biases re-homed with their experts;
* within 1e-3 of a reference written out here (dequantize, row 2n = gate, 2n+1 = up, bias, gate
  clamped above at 7, up to [-7, 7], (up + 1) * gate * sigmoid(1.702 gate), bf16 activation and
  pick rows, bias after the down projection, fp32 weighted sum);
* the biases and the activation change the output (the comparison is not vacuous);
* the bank-kernel choice refuses gpt-oss on the FlashInfer TRT-LLM path by name, and a bias
  without its partner, or of the wrong shape, is refused naming the tensor.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import test_vllm_plugin_mxfp4 as base  # noqa: E402
from expert_residency.mxfp4 import dequantize_mxfp4, quantize_mxfp4  # noqa: E402
from expert_residency.vllm_plugin.mxfp4_experts import checkpoint_geometry, residency_for  # noqa: E402
from expert_residency.vllm_plugin.settings import PluginSettings  # noqa: E402
from expert_residency.vllm_plugin.worker_runtime import WorkerRuntime  # noqa: E402

E, H, I, K, T = base.EXPERTS, base.HIDDEN, base.INTER, base.TOP_K, base.TOKENS


def gptoss_case(seed: int = 5):
    case = base.build_case("cpu", seed)
    gen = torch.Generator().manual_seed(seed + 1)
    biases = {i: (torch.randn(E, 2 * I, generator=gen).to(torch.bfloat16),
                  (torch.randn(E, H, generator=gen) * 0.3).to(torch.bfloat16)) for i in base.LAYERS}
    return case, biases


def gptoss_layer(case, biases, index: int, with_bias: bool = True):
    layer = base.FakeMxfp4Experts(index, *case.weights[index])
    layer.activation = base.MoEActivation.SWIGLUOAI
    if with_bias:
        for name, value in zip(("w13_bias", "w2_bias"), biases[index]):
            layer.register_parameter(name, torch.nn.Parameter(value.clone(), requires_grad=False))
    return layer


def run(case, biases, mode: str, hot: list[int] | None, with_bias: bool = True):
    rowmap = base._rowmap(hot) if hot is not None else None
    settings = PluginSettings(mode=mode, rowmap_path="test.rowmap" if rowmap else None,
                              content_hash=rowmap.content_hash() if rowmap else None)
    runtime = WorkerRuntime(settings, rowmap)
    layers = {i: gptoss_layer(case, biases, i, with_bias) for i in base.LAYERS}
    runtime.target_layers = dict(layers)
    runtime._install_banks()
    return runtime, base.forward_all(runtime, layers, case), layers


def reference(case, biases, index: int, with_bias: bool = True, oai: bool = True) -> torch.Tensor:
    w13, w2 = case.weights[index]
    q13, s13 = quantize_mxfp4(w13)
    q2, s2 = quantize_mxfp4(w2)
    d13, d2 = dequantize_mxfp4(q13, s13), dequantize_mxfp4(q2, s2)
    b13, b2 = (b.float() for b in biases[index])
    x = case.x.float()
    out = torch.zeros(T, H)
    for t in range(T):
        for k in range(K):
            e = int(case.topk_ids[t, k])
            g = d13[e] @ x[t] + (b13[e] if with_bias else 0.0)
            if oai:
                gate = g[0::2].clamp(max=7.0)
                up = g[1::2].clamp(min=-7.0, max=7.0)
                a = (up + 1.0) * gate * torch.sigmoid(1.702 * gate)
            else:
                a = torch.nn.functional.silu(g[:I]) * g[I:]
            y = d2[e] @ a.to(torch.bfloat16).float() + (b2[e] if with_bias else 0.0)
            out[t] += float(case.topk_weights[t, k]) * y.to(torch.bfloat16).float()
    return out.to(torch.bfloat16)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_gptoss_residency_equals_unsplit_and_the_written_out_reference() -> None:
    case, biases = gptoss_case()
    _, unsplit, _ = run(case, biases, "unsplit", None)
    runtime, split_a, layers = run(case, biases, "residency", [0, 3, 5])
    _, split_b, _ = run(case, biases, "residency", [7, 6, 2, 1, 4])
    resident = layers[0]._er_resident
    assert sorted(resident.hot.tensors) == ["w13_bias", "w13_weight", "w13_weight_scale", "w2_bias",
                                             "w2_weight", "w2_weight_scale"]
    assert torch.equal(resident.cold["w2_bias"][0], biases[0][1][resident.cold_ids[0]])
    assert "swigluoai" in runtime.per_pick_name and "formats_ref" in runtime.per_pick_name
    for index in base.LAYERS:
        assert torch.equal(split_a[index], unsplit[index])
        assert torch.equal(split_b[index], unsplit[index])
        ref = reference(case, biases, index)
        assert rel(unsplit[index], ref) < 1e-3, rel(unsplit[index], ref)
        # Not vacuous: without biases, or with plain SiLU on gate-first rows, it is another layer.
        assert rel(reference(case, biases, index, with_bias=False), ref) > 0.05
        assert rel(reference(case, biases, index, oai=False), ref) > 0.1
    assert not torch.equal(unsplit[0], unsplit[1])


def test_gptoss_without_biases_is_swigluoai_alone() -> None:
    case, biases = gptoss_case()
    _, out, _ = run(case, biases, "residency", [1, 2], with_bias=False)
    ref = reference(case, biases, 0, with_bias=False)
    assert rel(out[0], ref) < 1e-3


def test_bias_layout_errors_and_trtllm_refusal_name_what() -> None:
    case, biases = gptoss_case()
    tensors = dict(gptoss_layer(case, biases, 0).named_parameters(recurse=False))
    assert checkpoint_geometry(tensors) == (E, H, I)
    with pytest.raises(ValueError, match="w13_bias and w2_bias come together"):
        checkpoint_geometry({n: t for n, t in tensors.items() if n != "w2_bias"}, "L")
    with pytest.raises(ValueError, match=r"w2_bias is torch.bfloat16 \(8, 128\), expected"):
        checkpoint_geometry(dict(tensors, w2_bias=tensors["w2_bias"][:, :128]), "L")
    cache: dict = {}
    a = residency_for(tensors, K, 8, cache, activation="swigluoai")
    b = residency_for(tensors, K, 8, cache)
    assert a is not b and a.activation == "swigluoai" and b.activation == "silu"
    from expert_residency.blackwell.plugin import cuda_bank_experts

    with pytest.raises(ValueError, match="EXPERT_RESIDENCY_BANK_KERNEL=triton"):
        cuda_bank_experts(H, I, E, K, 8, "cpu", activation="swigluoai", capability=(10, 0), environ={})
