"""gpt-oss MXFP4 experts laid out as vLLM 0.33 pads them for its non-Triton backends, through the
plugin's MXFP4 adapter and the worker runtime (CPU, no vLLM import).

vLLM rounds the layer's sizes up before ``create_weights`` (``fused_moe/routed_experts.py:171-184``
calling ``GptOssMxfp4MoEMethod.maybe_roundup_sizes``, ``quantization/mxfp4.py:183-198``, which
calls ``fused_moe/oracle/mxfp4.py:837-917``): Marlin (``:865-870``) and TRT-LLM (``:871-873``)
round the intermediate size to 128 and the hidden size to 256 — gpt-oss's 2,880 / 2,880 become
hidden 3,072 / intermediate 2,944 — while the Triton backend (``:915-916``, multiples of 64) keeps
2,880. The parameters are ``torch.zeros`` of the rounded shape (``mxfp4.py:200-290``) and
gpt-oss's loader copies each checkpoint tensor into ``param.data[:, :dim1(, :dim2)]``
(``routed_experts.py:698-707``); the runner pads the activations with zeros to the rounded hidden
size (``runner/moe_runner.py:546-557``) and cuts the output back (``moe_runner.py:517``).

Here the same rounding (256 / 128) at a small geometry: hidden 224 -> 256, intermediate 96 -> 128.
Claims, each able to fail:
* padded layer, two residency maps == padded unsplit bit for bit (``torch.equal``);
* the pad columns of the output are exactly zero, and the output cut back to 224 equals the
  unpadded layer's unsplit output bit for bit, and is within 1e-3 of a reference written out here;
* the two TRT-LLM backends that skip the activation padding or return an unpadded output are
  refused at hold-back when the hidden size was padded, naming the layer, the backend, the flag
  and both sizes (an unpadded geometry is served); the source lines are pinned.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import test_vllm_plugin_mxfp4 as base  # noqa: E402
from expert_residency.mxfp4 import dequantize_mxfp4, quantize_mxfp4  # noqa: E402
from expert_residency.vllm_plugin.mxfp4_experts import mxfp4_unsupported_reason  # noqa: E402
from expert_residency.vllm_plugin.settings import PluginSettings  # noqa: E402
from expert_residency.vllm_plugin.worker_runtime import WorkerRuntime  # noqa: E402
from test_vllm033_contracts import _function, _source, _v033_root  # noqa: E402

E, K, T = base.EXPERTS, base.TOP_K, base.TOKENS
H, I = 224, 96            # unpadded (7 and 3 MX blocks)
HP, IP = 256, 128         # round_up(224, 256), round_up(96, 128): the Marlin / TRT-LLM rule


def round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def test_the_rounding_rule_gives_vllms_gptoss_sizes() -> None:
    # By hand: 2,880 = 11.25 x 256 -> 12 x 256 = 3,072; 2,880 = 22.5 x 128 -> 23 x 128 = 2,944.
    assert (round_up(2880, 256), round_up(2880, 128)) == (3072, 2944)
    assert (round_up(H, 256), round_up(I, 128)) == (HP, IP)
    assert round_up(2880, 64) == 2880   # the Triton backend's rule: unpadded


def case(seed: int = 11):
    gen = torch.Generator().manual_seed(seed)
    weights, biases = {}, {}
    for index in base.LAYERS:
        w13 = torch.randn(E, 2 * I, H, generator=gen) * 0.08
        w13 *= 2.0 ** torch.randint(-2, 3, (E, 2 * I, H // 32, 1), generator=gen
                                    ).float().expand(-1, -1, -1, 32).reshape(w13.shape)
        w2 = torch.randn(E, H, I, generator=gen) * 0.08
        weights[index] = (w13, w2)
        biases[index] = (torch.randn(E, 2 * I, generator=gen).to(torch.bfloat16),
                         (torch.randn(E, H, generator=gen) * 0.3).to(torch.bfloat16))
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16)
    top = torch.topk(torch.randn(T, E, generator=gen), K, dim=-1)
    return weights, biases, x, torch.softmax(top.values, dim=-1), top.indices.to(torch.int32)


def checkpoint(weights, biases, index):
    """The four MXFP4 tensors and two biases of one layer as the checkpoint holds them."""
    (w13, w2), (b13, b2) = weights[index], biases[index]
    q13, s13 = quantize_mxfp4(w13)
    q2, s2 = quantize_mxfp4(w2)
    return {"w13_weight": q13, "w13_weight_scale": s13, "w2_weight": q2, "w2_weight_scale": s2,
            "w13_bias": b13, "w2_bias": b2}


def padded(tensors):
    """As vLLM 0.33 loads them into rounded parameters: zeros, checkpoint copied into the front
    (``routed_experts.py:698-707``: ``param.data[:, :dim1, :dim2].copy_(loaded_weight)``)."""
    shapes = {"w13_weight": (E, 2 * IP, HP // 2), "w13_weight_scale": (E, 2 * IP, HP // 32),
              "w2_weight": (E, HP, IP // 2), "w2_weight_scale": (E, HP, IP // 32),
              "w13_bias": (E, 2 * IP), "w2_bias": (E, HP)}
    out = {}
    for name, t in tensors.items():
        param = torch.zeros(shapes[name], dtype=t.dtype)
        if t.dim() == 2:
            param[:, :t.shape[1]].copy_(t)
        else:
            param[:, :t.shape[1], :t.shape[2]].copy_(t)
        out[name] = param
    return out


def layer(index, tensors):
    lay = base.FakeMxfp4Experts(index, torch.zeros(E, 2 * base.INTER, base.HIDDEN),
                                torch.zeros(E, base.HIDDEN, base.INTER))
    for name, value in tensors.items():
        lay.register_parameter(name, torch.nn.Parameter(value.clone(), requires_grad=False))
    lay.activation = base.MoEActivation.SWIGLUOAI
    return lay


def run(layers_tensors, x, w, ids, mode, hot=None):
    rowmap = base._rowmap(hot) if hot is not None else None
    settings = PluginSettings(mode=mode, rowmap_path="test.rowmap" if rowmap else None,
                              content_hash=rowmap.content_hash() if rowmap else None)
    runtime = WorkerRuntime(settings, rowmap)
    layers = {i: layer(i, t) for i, t in layers_tensors.items()}
    runtime.target_layers = dict(layers)
    runtime._install_banks()
    return {i: runtime.split_forward(m, x, w, ids) for i, m in layers.items()}


def reference(weights, biases, x, w, ids, index):
    w13, w2 = weights[index]
    q13, s13 = quantize_mxfp4(w13)
    q2, s2 = quantize_mxfp4(w2)
    d13, d2 = dequantize_mxfp4(q13, s13), dequantize_mxfp4(q2, s2)
    b13, b2 = (b.float() for b in biases[index])
    out = torch.zeros(T, H)
    for t in range(T):
        for k in range(K):
            e = int(ids[t, k])
            g = d13[e] @ x[t].float() + b13[e]
            gate, up = g[0::2].clamp(max=7.0), g[1::2].clamp(min=-7.0, max=7.0)
            a = (up + 1.0) * gate * torch.sigmoid(1.702 * gate)
            y = d2[e] @ a.to(torch.bfloat16).float() + b2[e]
            out[t] += float(w[t, k]) * y.to(torch.bfloat16).float()
    return out.to(torch.bfloat16)


def test_padded_layer_residency_equals_unsplit_and_the_unpadded_layer() -> None:
    weights, biases, x, w, ids = case()
    plain = {i: checkpoint(weights, biases, i) for i in base.LAYERS}
    pad = {i: padded(t) for i, t in plain.items()}
    xp = torch.nn.functional.pad(x, (0, HP - H))          # moe_runner.py:552-557, zeros
    unsplit_p = run(pad, xp, w, ids, "unsplit")
    split_a = run(pad, xp, w, ids, "residency", [0, 3, 5])
    split_b = run(pad, xp, w, ids, "residency", [7, 6, 2, 1, 4])
    unsplit = run(plain, x, w, ids, "unsplit")
    for i in base.LAYERS:
        assert unsplit_p[i].shape == (T, HP)
        assert torch.equal(split_a[i], unsplit_p[i])
        assert torch.equal(split_b[i], unsplit_p[i])
        assert torch.equal(unsplit_p[i][:, H:], torch.zeros(T, HP - H, dtype=torch.bfloat16))
        cut = unsplit_p[i][..., :H]                        # moe_runner.py:517
        assert torch.equal(cut, unsplit[i])
        ref = reference(weights, biases, x, w, ids, i)
        rel = float((cut.float() - ref.float()).norm() / ref.float().norm())
        assert rel < 1e-3, rel
    assert not torch.equal(unsplit[0], unsplit[1])


@pytest.mark.parametrize("flag", ["skip_forward_padding", "has_unpadded_output"])
def test_backends_that_pad_or_cut_themselves_are_refused(flag: str) -> None:
    weights, biases, *_ = case()
    lay = layer(0, padded(checkpoint(weights, biases, 0)))
    assert mxfp4_unsupported_reason(lay) is None
    method = SimpleNamespace(skip_forward_padding=False, has_unpadded_output=False,
                             mxfp4_backend=SimpleNamespace(name="FLASHINFER_TRTLLM_MXFP4_MXFP8"))
    setattr(method, flag, True)
    lay.quant_method = method
    # Unpadded hidden size (DeepSeek-V4.1's 5,120 on TRT-LLM): nothing to pad or cut, served.
    lay.moe_config.hidden_dim = lay.moe_config.hidden_dim_unpadded = H
    assert mxfp4_unsupported_reason(lay) is None
    lay.moe_config.hidden_dim = HP     # routed_experts.py:181 after the round-up
    msg = mxfp4_unsupported_reason(lay)
    assert msg is not None and lay.layer_name in msg and flag in msg and "from 224 to 256" in msg
    assert "FLASHINFER_TRTLLM_MXFP4_MXFP8" in msg and "EXPERT_RESIDENCY_MODE=off/count" in msg


V033 = _v033_root()


@pytest.mark.skipif(V033 is None, reason="vllm 0.33.0 source absent: run scripts/fetch-vllm033-source.sh")
def test_vllm_033_padding_lines() -> None:
    oracle = " ".join(_source(V033, "model_executor/layers/fused_moe/oracle/mxfp4.py").split())
    marlin = ("elif backend in (Mxfp4MoeBackend.MARLIN, Mxfp4MoeBackend.BATCHED_MARLIN): "
              "intermediate_size = round_up(intermediate_size, 128) if current_platform.is_xpu(): "
              "hidden_size = round_up(hidden_size, 128) else: hidden_size = round_up(hidden_size, 256)")
    assert marlin in oracle
    assert ("elif backend in TRTLLM_BACKENDS: intermediate_size = round_up(intermediate_size, 128) "
            "hidden_size = round_up(hidden_size, 256)") in oracle
    assert ("else: intermediate_size = round_up(intermediate_size, 64) "
            "return hidden_size, intermediate_size") in oracle
    rounded = " ".join(_source(V033, "model_executor/layers/fused_moe/routed_experts.py").split())
    assert "self.quant_method.maybe_roundup_sizes(" in rounded
    assert ('if quant_config_name == "gpt_oss_mxfp4": # (FIXME) for gpt-oss all experts are combined '
            'if "bias" in weight_name: dim1 = loaded_weight.shape[1] param.data[:, :dim1].copy_(loaded_weight) '
            'else: dim1 = loaded_weight.shape[1] dim2 = loaded_weight.shape[2] '
            'param.data[:, :dim1, :dim2].copy_(loaded_weight)') in rounded
    runner = " ".join(_source(V033, "model_executor/layers/fused_moe/runner/moe_runner.py").split())
    assert ("not self._quant_method.skip_forward_padding and self.moe_config.hidden_dim != "
            "transformed_hidden_dim") in runner
    assert "hidden_states = F.pad( hidden_states, (0, self.moe_config.hidden_dim - transformed_hidden_dim)" in runner
    assert "return states[..., :trunc_size] if trunc_size is not None else states" in runner
    mx = "model_executor/layers/quantization/mxfp4.py"
    def flat(fn):
        return " ".join(__import__("ast").unparse(fn).split())

    assert "mxfp4_round_up_hidden_size_and_intermediate_size(self.mxfp4_backend" in flat(
        _function(V033, mx, "maybe_roundup_sizes", "GptOssMxfp4MoEMethod"))
    assert "torch.zeros(" in flat(_function(V033, mx, "create_weights", "GptOssMxfp4MoEMethod"))
    assert "return self.mxfp4_backend == Mxfp4MoeBackend.FLASHINFER_TRTLLM_MXFP4_MXFP8" in flat(
        _function(V033, mx, "skip_forward_padding", "GptOssMxfp4MoEMethod"))
    assert "FLASHINFER_TRTLLM_MXFP4_BF16" in flat(
        _function(V033, mx, "has_unpadded_output", "GptOssMxfp4MoEMethod"))
    assert "self.moe_config.hidden_dim = self.hidden_size" in rounded
    config = " ".join(_source(V033, "model_executor/layers/fused_moe/config.py").split())
    assert ("if self.hidden_dim_unpadded is None: self.hidden_dim_unpadded = self.hidden_dim") in config
