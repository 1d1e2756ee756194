"""The plugin's BF16 / FP8-block adapters without vLLM (``vllm_plugin.dense_layers``,
``unquantized_experts``, ``fp8_experts``): layout checks naming the tensor, the refusals (read
from the runtime's capability table), the held-back conversion, and the CPU residency object
(split == unsplit bit for bit through its per-pick function). The names, shapes and attributes
these read are pinned in vLLM 0.33's source by tests/test_vllm_plugin_dense_contracts.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from expert_residency.core import build_unsplit_layer, rehome_layer, residency_forward  # noqa: E402
from expert_residency.fp8 import quantize_fp8_block  # noqa: E402
from expert_residency.vllm_plugin import dense_hold_back  # noqa: E402
from expert_residency.vllm_plugin import dense_layers as dl  # noqa: E402
from expert_residency.vllm_plugin.fp8_experts import fp8_method_reason, fp8_unsupported_reason  # noqa: E402
from expert_residency.vllm_plugin.refusal import ResidencyRefused  # noqa: E402
from expert_residency.vllm_plugin.unquantized_experts import unquantized_unsupported_reason, wants_runtime_kernel  # noqa: E402

E, H, I = 6, 256, 128


def tensors(fmt: str, bias: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    w13 = torch.randn(E, 2 * I, H, generator=g) * (4.0 / H ** 0.5)
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    if fmt == "bf16":
        out = {"w13_weight": w13.bfloat16(), "w2_weight": w2.bfloat16()}
    else:
        q13, s13 = quantize_fp8_block(w13)
        q2, s2 = quantize_fp8_block(w2)
        out = {"w13_weight": q13, "w13_weight_scale_inv": s13, "w2_weight": q2, "w2_weight_scale_inv": s2}
    if bias:
        out["w13_bias"] = (torch.randn(E, 2 * I, generator=g) * 0.5).bfloat16()
        out["w2_bias"] = (torch.randn(E, H, generator=g) * 0.2).bfloat16()
    return out


def layer(activation: str = "silu", *, bias: bool = False, limit=None, alpha=None, beta=None,
          method=None, fmt: str = "bf16"):
    t = tensors(fmt, bias)
    return SimpleNamespace(layer_name="model.layers.3.mlp.experts",
                           activation=SimpleNamespace(value=activation), swiglu_limit=limit,
                           moe_config=SimpleNamespace(swiglu_alpha=alpha, swiglu_beta=beta, has_bias=bias),
                           quant_method=method, top_k=2, **t)


def test_geometry_names_the_tensor() -> None:
    g = dl.dense_geometry(tensors("fp8", True))
    assert (g.expert_format, g.num_experts, g.hidden, g.intermediate, g.biases) == ("fp8-block", E, H, I, True)
    assert dl.dense_geometry(tensors("bf16", False)).expert_format == "bf16"
    bad = tensors("fp8", False)
    bad["w2_weight_scale_inv"] = bad["w2_weight_scale_inv"][:, :1]
    with pytest.raises(ValueError, match=r"w2_weight_scale_inv is torch.float32 \(6, 1, 1\), expected "
                                         r"torch.float32 \(6, 2, 1\)"):
        dl.dense_geometry(bad)
    lone = tensors("bf16", True)
    del lone["w2_bias"]
    with pytest.raises(ValueError, match="come together"):
        dl.dense_geometry(lone)
    mixed = tensors("bf16", False)
    mixed["w2_weight"] = mixed["w2_weight"].half()
    with pytest.raises(ValueError, match="w2_weight is torch.float16"):
        dl.dense_geometry(mixed)


def test_activation_facts_and_refusals() -> None:
    facts = dl.activation_facts(layer("swigluoai", bias=True))
    assert (facts.activation, facts.swiglu_limit, facts.swiglu_alpha, facts.biases) == ("swigluoai", 7.0, 1.702, True)
    assert unquantized_unsupported_reason(layer("swigluoai", bias=True)) is None      # gpt-oss in BF16
    assert unquantized_unsupported_reason(layer("silu", bias=True, limit=7.0)) is None
    wrong = unquantized_unsupported_reason(layer("swigluoai", alpha=1.5))
    assert wrong and "model.layers.3.mlp.experts" in wrong and "alpha 1.702" in wrong
    assert "silu(gate) * up only" in (unquantized_unsupported_reason(layer("silu", alpha=1.702)) or "")
    gelu = unquantized_unsupported_reason(layer("gelu"))
    assert gelu and "'gelu'" in gelu and "EXPERT_RESIDENCY_MODE=off/count" in gelu


def test_cpu_keeps_vllms_kernel_for_plain_silu_only() -> None:
    assert not wants_runtime_kernel(layer("silu"), cuda=False)
    assert wants_runtime_kernel(layer("silu", bias=True), cuda=False)
    assert wants_runtime_kernel(layer("swigluoai"), cuda=False)
    assert wants_runtime_kernel(layer("silu", limit=7.0), cuda=False)
    assert wants_runtime_kernel(layer("silu"), cuda=True)


def _fp8_method(**kw):
    base = dict(block_quant=True, weight_block_size=[128, 128], moe_block_shape=[128, 128],
                weight_scale_refine=None, quant_config=SimpleNamespace(is_checkpoint_fp8_serialized=True))
    base.update(kw)
    return SimpleNamespace(**base)


def test_fp8_method_refusals() -> None:
    assert fp8_method_reason(_fp8_method()) is None
    assert "per-tensor" in (fp8_method_reason(_fp8_method(block_quant=False)) or "")
    assert "[64, 64]" in (fp8_method_reason(_fp8_method(weight_block_size=[64, 64],
                                                        moe_block_shape=[64, 64])) or "")
    assert "refine" in (fp8_method_reason(_fp8_method(weight_scale_refine=(64, 128))) or "")
    online = _fp8_method(quant_config=SimpleNamespace(is_checkpoint_fp8_serialized=False))
    assert "online" in (fp8_method_reason(online) or "")
    assert fp8_unsupported_reason(layer("silu", method=_fp8_method(), fmt="fp8")) is None
    assert fp8_unsupported_reason(layer("swigluoai", bias=True, method=_fp8_method(), fmt="fp8")) is None


def test_held_back_conversion_marks_refuses_and_serves_a_drafter() -> None:
    calls = []
    method = SimpleNamespace(process_weights_after_loading=lambda m: calls.append(m.layer_name),
                             moe_quant_config=None,
                             get_fused_moe_quant_config=lambda m: ("config of", m.layer_name))
    runtime = SimpleNamespace(target_layers={})
    dense_hold_back.hold_back(method, lambda: runtime, lambda: False, unquantized_unsupported_reason, "bf16")
    target = layer("swigluoai", bias=True)
    method.process_weights_after_loading(target)
    assert target._er_dense == "bf16" and calls == []            # vLLM's conversion held back
    # The quant config vLLM's runner would otherwise build on the first forward, from parameters
    # re-homing has removed by then, exists already.
    assert method.moe_quant_config == ("config of", "model.layers.3.mlp.experts")
    with pytest.raises(ResidencyRefused, match="'gelu'"):
        method.process_weights_after_loading(layer("gelu"))
    runtime.target_layers = {3: target}                          # a second model: the drafter
    drafter = layer("silu")
    method.process_weights_after_loading(drafter)
    assert calls == ["model.layers.3.mlp.experts"] and not hasattr(drafter, "_er_dense")
    dense_hold_back.hold_back(method, lambda: runtime, lambda: False, unquantized_unsupported_reason, "bf16")
    assert method._er_wrapped                                    # idempotent: not wrapped twice


@pytest.mark.parametrize("fmt,act,bias", [("bf16", "swigluoai", True), ("fp8", "silu", False),
                                          ("fp8", "swigluoai", True)])
def test_cpu_residency_split_equals_unsplit(fmt, act, bias) -> None:
    lay = layer(act, bias=bias, fmt=fmt)
    full = {n: getattr(lay, n) for n in tensors(fmt, bias)}
    cache: dict = {}
    res = dl.dense_residency_for(full, lay, 2, 16, cache)
    assert dl.dense_residency_for(full, lay, 2, 16, cache) is res     # one per geometry
    assert res.fused is None and res.workspace_bytes == 0 and "reference" in res.name
    hot_alloc, cold_alloc = res.allocators()
    fn = res.per_pick_fn()
    unsplit = build_unsplit_layer(full, layer_index=3)
    split = rehome_layer({n: v.clone() for n, v in full.items()}, [4, 0, 2], [1, 3, 5], layer_index=3,
                         hot_alloc=hot_alloc, cold_alloc=cold_alloc)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, H, generator=g).bfloat16()
    ids = torch.tensor([[4, 1], [0, 2], [3, 5], [5, 4], [1, 0], [2, 3]], dtype=torch.int32)
    w = torch.softmax(torch.randn(6, 2, generator=g), -1)
    got = residency_forward(split, x, w, ids, fn, pick_dtype=x.dtype)
    assert torch.equal(got, residency_forward(unsplit, x, w, ids, fn, pick_dtype=x.dtype))
    assert got.abs().sum() > 0
