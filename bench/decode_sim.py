#!/usr/bin/env python3
"""A full-depth decode step of a real MoE geometry on one GPU, timed, for the step-time estimate.

Every decoder layer of the model, with random weights, the way a vLLM decode step runs it:
fused residual-add + RMSNorm, the fused QKV projection (a real GEMM), rotary embedding that also
writes the step's K/V into a KV cache, attention of every sequence over its cache (torch SDPA, the
flash backend on CUDA, grouped-query heads folded into the query length), the output projection,
residual-add + RMSNorm, the router GEMM, softmax + top-k + renormalization in one launch (as vLLM's
``topk_softmax`` op; torch's topk and softmax took three launches, ~10 µs per layer on the H200),
and the routed experts through the residency runtime's own split layer (``expert_residency.gpu``: ``TritonMxfp4Experts`` for MXFP4,
``TritonDenseExperts`` for BF16); then the final norm, the LM head GEMM and argmax. The whole step
is one CUDA graph per batch size T (T sequences, one new token each, every sequence holding
``--context`` tokens of KV cache; sliding-window layers hold their window).

The routed ids come from a skewed per-layer popularity (``exp(-4.94 (r/E)^1.01)``, the profile of
the synthetic histograms and of bench/gpu_residency.py), redrawn for every timed step and copied
into the graph's id buffer before the replay; the router GEMM and top-k still run (their weights
feed the experts). Cases:

* ``all_hbm``: every expert in HBM (the unsplit layer);
* ``usage_aware`` (``--cold-per-layer`` N): each layer's N least popular experts in pinned host
  memory read in place (hot experts addressed in place in the all-HBM tensors, as
  bench/gpu_residency.py does), split == unsplit bit for bit;
* ``positional`` (``--cold-layers`` N): the first N layers' experts entirely in pinned host memory
  (what vLLM's ``--cpu-offload-gb`` walk does).

Also measured in the same run, as the estimate's generic inputs (none of them the simulated step):
the HBM and pinned-host read limits (a streaming Triton read), the time of one small kernel in a
CUDA graph, bf16 GEMM time at three square sizes per T, and SDPA decode attention at two cache
lengths per T. Diagnostics per case and T: the routed experts alone (same graph without the rest),
the unique and cold experts actually touched, and the bytes the experts read per step.

What settles where the estimate's time goes (docs/costmodel.md, "Where the time goes missing"), all
from this one run:

* per model (``models.<m>.gemms``): each of the model's own weight GEMMs (``weight_gemms``: fused
  QKV, output projection, router, LM head, with the step's shapes, dtype and biases) timed alone at
  every T, with enough distinct weight copies per graph that together they are four times the L2 —
  rows, cols, bytes, copies, launches per step, µs per launch;
* per case and T (``per_T.<T>.<case>``): ``expert_bytes_per_step_mean`` (unique experts touched per
  layer, summed over the layers, × bytes per expert; mean over the timed steps) and
  ``cold_expert_bytes_per_step_mean``, beside ``experts_ms`` and ``components.hbm_read_GBps``;
* per case and T (``.kernels``, ``--profile`` N replays): the step's CUDA graph replayed under the
  torch profiler: per kernel name its launches and summed device µs per step, the same grouped into
  the estimate's components (``kernel_component``), the kernels' summed time (``busy_us``) and the
  first start to last end (``span_us``). CUPTI reports a graph's kernel nodes one by one (vLLM 0.33's
  ``vllm bench forward --profile-dir`` reads graph replays the same way); all-HBM also profiles the
  eager step and records ``graph_replay_shows_every_kernel``; had the replay shown no kernels, the
  eager step's are recorded and ``source`` says so. On the CPU: the CPU profiler's self time per
  op, not device time (``device_times`` false).

Writes ``decode_sim.json`` (and the log, with ``tee``) under ``--out``. The estimate is compared
offline against these results by ``tests/test_estimate_validation.py`` (recipegen.costmodel.estimate)
and, component by component, by ``bench/estimate_gap.py``.

CPU (``--device cpu``: tiny geometry, ``TRITON_INTERPRET=1``, timings meaningless) checks the
harness end to end.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"   # before Triton is imported
else:
    # One profiler session per case and T: CUPTI torn down and set up again between sessions can crash
    # a process that holds CUDA graphs; torch's profiler keeps it up itself only for torch.compile's graphs.
    os.environ.setdefault("TEARDOWN_CUPTI", "0")

import numpy as np
import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "bench"))

import format_peer as fp  # noqa: E402  (random layers, routing, pinned banks, graph timing)
from expert_residency.core.banks import ExpertBank, ResidentLayer, build_unsplit_layer  # noqa: E402
from expert_residency.gpu.dense_experts import DenseKernelConfig, TritonDenseExperts  # noqa: E402
from expert_residency.gpu.experts import ExpertShape, KernelConfig, TritonMxfp4Experts, config_for_shape  # noqa: E402

GB = 1e9


@dataclass(frozen=True)
class Geometry:
    """A model's decode geometry (its public config.json; recipegen/catalog/models/<name>.yaml)."""

    name: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    experts: int
    top_k: int
    inter: int
    fmt: str                 # mxfp4 | bf16
    window: int = 0          # sliding window of the even layers (0: every layer full attention)
    qk_norm: bool = False
    bias: bool = False       # attention / router biases (gpt-oss)
    rope_theta: float = 1e6


GEOMETRIES = {g.name: g for g in (
    # config.json: num_hidden_layers 36, hidden_size 2880, num_attention_heads 64,
    # num_key_value_heads 8, head_dim 64, vocab_size 201088, num_local_experts 128,
    # num_experts_per_tok 4, intermediate_size 2880, sliding_window 128 on even layers.
    Geometry("gpt-oss-120b", 36, 2880, 64, 8, 64, 201088, 128, 4, 2880, "mxfp4", window=128, bias=True,
             rope_theta=150000.0),
    # config.json: num_hidden_layers 48, hidden_size 2048, num_attention_heads 32,
    # num_key_value_heads 4, head_dim 128, vocab_size 151936, num_experts 128,
    # num_experts_per_tok 8, moe_intermediate_size 768, q/k RMSNorm.
    Geometry("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 151936, 128, 8, 768, "bf16", qk_norm=True),
)}


def tiny(g: Geometry) -> Geometry:
    """The CPU harness check: the same structure at a few hundred hidden units."""
    return Geometry(g.name + "-tiny", 3, 256, 4, 2, 64, 512, 8, 2, 128, g.fmt, window=16 if g.window else 0,
                    qk_norm=g.qk_norm, bias=g.bias, rope_theta=g.rope_theta)


def expert_bytes(g: Geometry) -> int:
    f = fp.Format(g.name, g.name, g.hidden, g.inter, g.experts, g.top_k, g.fmt, 1, "")
    return fp.bytes_per_expert(f)


@dataclass(frozen=True)
class WeightGemm:
    """One bf16 weight GEMM of the step: ``[T, cols] x [rows, cols]^T`` (+ bias), ``launches`` per step."""

    name: str
    rows: int
    cols: int
    bias: bool
    launches: int

    @property
    def nbytes(self) -> int:
        return self.rows * self.cols * 2


def weight_gemms(g: Geometry) -> tuple[WeightGemm, ...]:
    """The step's weight GEMMs as ``Model`` builds them: per decoder layer the fused QKV, the output
    projection and the router; once per step the LM head. (Neither geometry has a dense MLP or
    shared experts; one that had them would add their GEMMs here and in ``Model.step_fn``.)"""
    return (WeightGemm("qkv", (g.q_heads + 2 * g.kv_heads) * g.head_dim, g.hidden, g.bias, g.layers),
            WeightGemm("o_proj", g.hidden, g.q_heads * g.head_dim, g.bias, g.layers),
            WeightGemm("router", g.experts, g.hidden, g.bias, g.layers),
            WeightGemm("lm_head", g.vocab, g.hidden, False, 1))


# -- the non-expert kernels (one launch each, as vLLM's fused ops) ------------------------------------

@triton.jit
def _add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n, eps, BLOCK: tl.constexpr):
    """residual += x; out = rmsnorm(residual) * w   (one row per program; vLLM's fused_add_rms_norm)."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * n + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + row * n + offs, mask=mask, other=0.0).to(tl.float32) + x
    tl.store(res_ptr + row * n + offs, r.to(tl.bfloat16), mask=mask)
    var = tl.sum(r * r, axis=0) / n
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n + offs, (r * tl.math.rsqrt(var + eps) * w).to(tl.bfloat16), mask=mask)


def add_rmsnorm(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> None:
    t, n = x.shape
    _add_rmsnorm_kernel[(t,)](x, res, w, out, n, 1e-6, BLOCK=triton.next_power_of_2(n), num_warps=4)


@triton.jit
def _router_topk_softmax_kernel(logits_ptr, w_ptr, ids_ptr, E, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    """One token's routing in one launch, as vLLM 0.33 runs it (``fused_topk`` -> ``ops.topk_softmax``,
    a single CUDA kernel; ``model_executor/layers/fused_moe/router/fused_topk_router.py``): softmax
    over all experts in fp32, the top ``TOP_K``, renormalized to sum to one."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    logit = tl.load(logits_ptr + row * E + offs, mask=offs < E, other=float("-inf")).to(tl.float32)
    p = tl.exp(logit - tl.max(logit, axis=0))
    p = p / tl.sum(p, axis=0)
    picked = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.argmax(tl.where(picked > 0, -1.0, p), axis=0)
        tl.store(ids_ptr + row * TOP_K + j, best.to(tl.int32))
        picked = tl.where(offs == best, 1.0, picked)
    total = tl.sum(tl.where(picked > 0, p, 0.0), axis=0)
    for j in tl.static_range(TOP_K):
        e = tl.load(ids_ptr + row * TOP_K + j)
        tl.store(w_ptr + row * TOP_K + j, tl.sum(tl.where(offs == e, p, 0.0), axis=0) / total)


def router_topk_softmax(logits: torch.Tensor, top_k: int, w: torch.Tensor, ids: torch.Tensor) -> None:
    t, e = logits.shape
    _router_topk_softmax_kernel[(t,)](logits, w, ids, e, TOP_K=top_k, BLOCK=triton.next_power_of_2(e),
                                      num_warps=1)


@triton.jit
def _rope_cache_kernel(qkv_ptr, q_ptr, k_cache_ptr, v_cache_ptr, qn_ptr, kn_ptr, pos, slot, cache_len,
                       log_theta, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                       QK_NORM: tl.constexpr):
    """Rotary embedding (NeoX halves) of one head of one token, optional per-head RMSNorm first
    (Qwen3's q/k norm); q heads to the query buffer, k and v heads into the KV cache at ``slot``
    (vLLM's rotary_embedding + reshape_and_cache, one launch)."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    half = tl.arange(0, D // 2)
    row = qkv_ptr + t * (HQ + 2 * HKV) * D + h * D
    x1 = tl.load(row + half).to(tl.float32)
    x2 = tl.load(row + D // 2 + half).to(tl.float32)
    if QK_NORM:
        var = (tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / D
        inv = tl.math.rsqrt(var + 1e-6)
        is_q = h < HQ
        w1 = tl.where(is_q, tl.load(qn_ptr + half), tl.load(kn_ptr + half)).to(tl.float32)
        w2 = tl.where(is_q, tl.load(qn_ptr + D // 2 + half), tl.load(kn_ptr + D // 2 + half)).to(tl.float32)
        x1 = x1 * inv * w1
        x2 = x2 * inv * w2
    freq = tl.exp(-(2.0 * half.to(tl.float32) / D) * log_theta)
    ang = pos * freq
    c = tl.cos(ang)
    s = tl.sin(ang)
    o1 = (x1 * c - x2 * s).to(tl.bfloat16)
    o2 = (x2 * c + x1 * s).to(tl.bfloat16)
    if h < HQ:
        dst = q_ptr + (t * HQ + h) * D
        tl.store(dst + half, o1)
        tl.store(dst + D // 2 + half, o2)
    else:
        kvh = h - HQ
        base = ((t * HKV + kvh) * cache_len + slot) * D
        tl.store(k_cache_ptr + base + half, o1)
        tl.store(k_cache_ptr + base + D // 2 + half, o2)
        vrow = qkv_ptr + t * (HQ + 2 * HKV) * D + (HQ + HKV + kvh) * D
        vv = tl.load(vrow + tl.arange(0, D))
        tl.store(v_cache_ptr + base + tl.arange(0, D), vv)


# -- one model on one device ----------------------------------------------------------------------

class Model:
    """Random weights, KV caches and expert layers of one geometry; ``step(case, T)`` closures."""

    def __init__(self, g: Geometry, dev: torch.device, context: int, max_tokens: int, seed: int) -> None:
        self.g, self.dev, self.context, self.max_tokens = g, dev, context, max_tokens
        gen = torch.Generator(device=dev).manual_seed(seed)
        bf = dict(dtype=torch.bfloat16, device=dev)

        def w(rows, cols, scale=None):
            return (torch.randn(rows, cols, generator=gen, device=dev) * (scale or cols ** -0.5)).to(torch.bfloat16)

        shapes = {m.name: (m.rows, m.cols) for m in weight_gemms(g)}
        qkv_rows = shapes["qkv"][0]
        self.embed = w(g.vocab, g.hidden, 1.0)
        self.lm_head = w(*shapes["lm_head"])
        self.final_norm = torch.ones(g.hidden, **bf)
        self.layers = []
        for layer in range(g.layers):
            sliding = bool(g.window) and layer % 2 == 0
            cache_len = g.window if sliding else context
            self.layers.append(dict(
                ln1=torch.ones(g.hidden, **bf), ln2=torch.ones(g.hidden, **bf),
                qkv=w(*shapes["qkv"]), qkv_b=torch.zeros(qkv_rows, **bf) if g.bias else None,
                o=w(*shapes["o_proj"]), o_b=torch.zeros(g.hidden, **bf) if g.bias else None,
                router=w(*shapes["router"]), router_b=torch.zeros(g.experts, **bf) if g.bias else None,
                qn=torch.ones(g.head_dim, **bf), kn=torch.ones(g.head_dim, **bf),
                cache_len=cache_len,
                k_cache=torch.randn(max_tokens, g.kv_heads, cache_len, g.head_dim, generator=gen,
                                    device=dev).to(torch.bfloat16),
                v_cache=torch.randn(max_tokens, g.kv_heads, cache_len, g.head_dim, generator=gen,
                                    device=dev).to(torch.bfloat16)))
        # Routed experts: random checkpoint-layout tensors per layer, in the kernels' layout.
        shape = ExpertShape(g.hidden, g.inter)
        cuda = dev.type == "cuda"
        f = fp.Format(g.name, g.name, g.hidden, g.inter, g.experts, g.top_k, g.fmt, 1, "")
        if g.fmt == "mxfp4":
            base = KernelConfig() if cuda else KernelConfig(block_m=4)
            self.ex = TritonMxfp4Experts(shape, g.experts, g.top_k, max_tokens, dev,
                                         config_for_shape(shape, base), activation="swigluoai")
        else:
            cfg = DenseKernelConfig() if cuda else DenseKernelConfig(block_m=4, block_n1=32, block_n2=64)
            self.ex = TritonDenseExperts(shape, g.experts, g.top_k, max_tokens, dev, cfg, expert_format=g.fmt)
        self.expert_tensors = []
        for _ in range(g.layers):
            t = fp.random_layer(f, gen, dev)
            self.ex.to_kernel_layout(t)
            self.expert_tensors.append(t)
        self.popularity = fp.popularity(g.experts, g.layers, seed)
        self.cases: dict[str, list[ResidentLayer]] = {
            "all_hbm": [build_unsplit_layer(t, layer_index=i) for i, t in enumerate(self.expert_tensors)]}
        self.cold_sets: dict[str, list[set[int]]] = {"all_hbm": [set() for _ in range(g.layers)]}
        self.owners: list = []
        self.pinned_bytes: dict[str, int] = {"all_hbm": 0}
        self.bytes_per_expert = expert_bytes(g)
        if cuda:
            torch.cuda.synchronize()

    def add_usage_aware(self, cold_per_layer: int) -> None:
        """Each layer's ``cold_per_layer`` least popular experts in pinned host memory."""
        g, layers, cold_sets, pinned = self.g, [], [], 0
        for i, tensors in enumerate(self.expert_tensors):
            order = np.argsort(-self.popularity[i], kind="stable")
            cold = sorted(order[g.experts - cold_per_layer:].tolist())
            hot = sorted(order[:g.experts - cold_per_layer].tolist())
            codes = torch.arange(g.experts, dtype=torch.int32)
            for r, e in enumerate(cold):
                codes[e] = -r - 1
            cold_bank = fp.bank_of(tensors, cold, self.owners)
            pinned += cold_bank.nbytes()
            layers.append(ResidentLayer(i, g.experts, ExpertBank(dict(tensors), g.experts), cold_bank, hot, cold,
                                        codes.to(self.dev)))
            cold_sets.append(set(cold))
        self.cases["usage_aware"], self.cold_sets["usage_aware"] = layers, cold_sets
        self.pinned_bytes["usage_aware"] = pinned

    def add_positional(self, cold_layers: int) -> None:
        """The first ``cold_layers`` layers' experts entirely in pinned host memory."""
        g, layers, cold_sets, pinned = self.g, [], [], 0
        for i, tensors in enumerate(self.expert_tensors):
            if i < cold_layers:
                ids = list(range(g.experts))
                codes = torch.tensor([-r - 1 for r in ids], dtype=torch.int32, device=self.dev)
                empty = ExpertBank({n: t[:0] for n, t in tensors.items()}, 0)
                cold_bank = fp.bank_of(tensors, None, self.owners)
                pinned += cold_bank.nbytes()
                layers.append(ResidentLayer(i, g.experts, empty, cold_bank, [], ids, codes))
                cold_sets.append(set(ids))
            else:
                layers.append(self.cases["all_hbm"][i])
                cold_sets.append(set())
        self.cases["positional"], self.cold_sets["positional"] = layers, cold_sets
        self.pinned_bytes["positional"] = pinned

    def buffers(self, t: int) -> dict:
        g, dev = self.g, self.dev
        bf = dict(dtype=torch.bfloat16, device=dev)
        qkv_cols = (g.q_heads + 2 * g.kv_heads) * g.head_dim
        return dict(tokens=torch.zeros(t, dtype=torch.int64, device=dev), x=torch.empty(t, g.hidden, **bf),
                    res=torch.empty(t, g.hidden, **bf), h=torch.empty(t, g.hidden, **bf),
                    qkv=torch.empty(t, qkv_cols, **bf), q=torch.empty(t, g.q_heads, g.head_dim, **bf),
                    logits=torch.empty(t, g.vocab, **bf),
                    ids=torch.zeros(g.layers, t, g.top_k, dtype=torch.int64, device=dev),
                    router_w=torch.empty(t, g.top_k, dtype=torch.float32, device=dev),
                    router_ids=torch.empty(t, g.top_k, dtype=torch.int32, device=dev),
                    out=torch.empty(t, g.hidden, **bf), next_token=torch.empty(t, dtype=torch.int64, device=dev))

    def _attention(self, b: dict, lay: dict, t: int) -> None:
        g = self.g
        group = g.q_heads // g.kv_heads
        q = b["q"].view(t, g.kv_heads, group, g.head_dim)       # GQA folded into the query length
        k, v = lay["k_cache"][:t], lay["v_cache"][:t]
        if self.dev.type == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        else:
            o = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float()).to(torch.bfloat16)
        return o.reshape(t, -1)

    def step_fn(self, case: str, t: int, b: dict, experts_only: bool = False):
        g, layers, ex = self.g, self.cases[case], self.ex
        pos = self.context - 1

        def step() -> None:
            if experts_only:
                for i, layer in enumerate(layers):
                    ex.forward(layer, b["h"], b["w"][i], b["ids"][i], out=b["x"])
                return
            torch.index_select(self.embed, 0, b["tokens"], out=b["x"])
            b["res"].zero_()
            for i, lay in enumerate(self.layers):
                add_rmsnorm(b["x"], b["res"], lay["ln1"], b["h"])
                if lay["qkv_b"] is not None:
                    torch.addmm(lay["qkv_b"], b["h"], lay["qkv"].t(), out=b["qkv"])
                else:
                    torch.mm(b["h"], lay["qkv"].t(), out=b["qkv"])
                slot = pos % lay["cache_len"]
                _rope_cache_kernel[(t, g.q_heads + g.kv_heads)](
                    b["qkv"], b["q"], lay["k_cache"], lay["v_cache"], lay["qn"], lay["kn"], float(pos), slot,
                    lay["cache_len"], math.log(g.rope_theta), HQ=g.q_heads, HKV=g.kv_heads, D=g.head_dim,
                    QK_NORM=g.qk_norm, num_warps=1)
                attn = self._attention(b, lay, t)
                if lay["o_b"] is not None:
                    torch.addmm(lay["o_b"], attn, lay["o"].t(), out=b["x"])
                else:
                    torch.mm(attn, lay["o"].t(), out=b["x"])
                add_rmsnorm(b["x"], b["res"], lay["ln2"], b["h"])
                logits = (torch.addmm(lay["router_b"], b["h"], lay["router"].t()) if lay["router_b"] is not None
                          else torch.mm(b["h"], lay["router"].t()))
                router_topk_softmax(logits, g.top_k, b["router_w"], b["router_ids"])
                # ids: the pre-drawn skewed routing (the router's own ids would be near-uniform on random weights)
                ex.forward(layers[i], b["h"], b["router_w"], b["ids"][i], out=b["x"])
            add_rmsnorm(b["x"], b["res"], self.final_norm, b["h"])
            torch.mm(b["h"], self.lm_head.t(), out=b["logits"])
            torch.argmax(b["logits"], dim=-1, out=b["next_token"])
            b["out"].copy_(b["h"])

        return step


# -- generic component measurements (the estimate's machine inputs) -------------------------------------

def components(dev: torch.device, args) -> dict:
    """HBM / pinned read limits, one small kernel in a graph, bf16 GEMM and SDPA decode by T."""
    cuda = dev.type == "cuda"
    out: dict = {}
    if cuda:
        import gpu_residency as gr
        out["hbm_read_GBps"] = gr.hbm_read_limit()["GBps"]
        pin = fp.pinned_tensor(torch.zeros(int(2e9) // 4, dtype=torch.int32, device=dev))
        out["pinned_read_GBps"] = gr.read_bandwidth(pin[0], 6)["GBps"]
        del pin
        torch.cuda.empty_cache()
    # one small kernel: 400 launches of the add-RMSNorm kernel on one 2,048-wide row, one graph
    n_launch = 400 if cuda else 4
    x = torch.randn(1, 2048, device=dev).to(torch.bfloat16)
    res, outb, wn = torch.zeros_like(x), torch.empty_like(x), torch.ones(2048, device=dev, dtype=torch.bfloat16)

    def small():
        for _ in range(n_launch):
            add_rmsnorm(x, res, wn, outb)
    g = fp.Step(small, cuda)
    ts = [fp.seconds(g, cuda) for _ in range(10 if cuda else 1)]
    out["small_kernel_us"] = statistics.median(ts) / n_launch * 1e6
    # bf16 GEMM [T, n] x [n, n]^T: 16 distinct weights per graph (more than L2 holds for n >= 2048)
    sizes = (2048, 4096, 8192) if cuda else (64, 128)
    gemm: dict = {}
    for n in sizes:
        count = 16 if cuda else 2
        ws = [torch.randn(n, n, device=dev).to(torch.bfloat16) for _ in range(count)]
        for t in args.tokens:
            a = torch.randn(t, n, device=dev).to(torch.bfloat16)
            o = torch.empty(t, n, device=dev, dtype=torch.bfloat16)

            def mms(ws=ws, a=a, o=o):
                for w_ in ws:
                    torch.mm(a, w_.t(), out=o)
            gs = fp.Step(mms, cuda)
            ts = [fp.seconds(gs, cuda) for _ in range(8 if cuda else 1)]
            gemm.setdefault(str(t), []).append({"n": n, "bytes": n * n * 2, "us": statistics.median(ts) / count * 1e6})
        del ws
    out["gemm_bf16"] = gemm
    # SDPA decode: T sequences, 8 KV heads x 8 query heads each, head dim 128, cache lengths L
    lengths = (1024, 8192) if cuda else (32, 64)
    attn: dict = {}
    for t in args.tokens:
        for length in lengths:
            count = 4 if cuda else 1
            ks = [torch.randn(t, 8, length, 128, device=dev).to(torch.bfloat16) for _ in range(2 * count)]
            q = torch.randn(t, 8, 8, 128, device=dev).to(torch.bfloat16)

            def att(ks=ks, q=q, count=count):
                for j in range(count):
                    if cuda:
                        from torch.nn.attention import SDPBackend, sdpa_kernel
                        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                            torch.nn.functional.scaled_dot_product_attention(q, ks[2 * j], ks[2 * j + 1])
                    else:
                        torch.nn.functional.scaled_dot_product_attention(q.float(), ks[2 * j].float(),
                                                                         ks[2 * j + 1].float())
            ga = fp.Step(att, cuda)
            ts = [fp.seconds(ga, cuda) for _ in range(8 if cuda else 1)]
            attn.setdefault(str(t), []).append({"context": length, "kv_bytes": t * 8 * length * 128 * 2 * 2,
                                                "us": statistics.median(ts) / count * 1e6})
            del ks
    out["attention_sdpa"] = attn
    if cuda:
        torch.cuda.empty_cache()
    return out


# -- the model's own weight GEMMs, alone -------------------------------------------------------------

def model_gemms(g: Geometry, dev: torch.device, tokens: list[int]) -> dict:
    """Each of the step's weight GEMMs (``weight_gemms``) timed alone at each T: bf16 weights of the
    step's own shape and bias, enough distinct copies per CUDA graph that together they are four times
    the L2 (as the step streams them: other layers' weights pass between two uses of one)."""
    cuda = dev.type == "cuda"
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size if cuda else 0
    out: dict = {"l2_bytes": l2, "by_T": {}}
    for m in weight_gemms(g):
        copies = min(512, max(2, math.ceil(4 * l2 / m.nbytes))) if cuda else 2
        ws = [(torch.randn(m.rows, m.cols, device=dev) * m.cols ** -0.5).to(torch.bfloat16) for _ in range(copies)]
        bias = torch.zeros(m.rows, device=dev, dtype=torch.bfloat16) if m.bias else None
        for t in tokens:
            a = torch.randn(t, m.cols, device=dev).to(torch.bfloat16)
            o = torch.empty(t, m.rows, device=dev, dtype=torch.bfloat16)

            def mms(ws=ws, a=a, o=o, bias=bias):
                for w_ in ws:
                    torch.addmm(bias, a, w_.t(), out=o) if bias is not None else torch.mm(a, w_.t(), out=o)
            gs = fp.Step(mms, cuda)
            ts = [fp.seconds(gs, cuda) for _ in range(8 if cuda else 1)]
            out["by_T"].setdefault(str(t), []).append(
                {"name": m.name, "rows": m.rows, "cols": m.cols, "bias": m.bias, "bytes": m.nbytes,
                 "launches_per_step": m.launches, "copies": copies, "us": statistics.median(ts) / copies * 1e6})
            del gs
        del ws
    if cuda:
        torch.cuda.empty_cache()
    return out


# -- kernels of one step, by the estimate's components ------------------------------------------------

COMPONENTS = ("routed_experts", "dense_gemm", "attention", "norm_rope_elementwise", "router_topk_softmax", "other")
# The residency runtime's split-layer kernels: every public Triton kernel of its GPU kernel modules.
RUNTIME_KERNELS = frozenset(
    name for mod in ("kernels", "kernels_dense", "kernels_t1")
    for name, v in vars(importlib.import_module(f"expert_residency.gpu.{mod}")).items()
    if name.endswith("_kernel") and type(v).__name__ in ("JITFunction", "InterpretedFunction"))
_CPU_GEMM_OPS = ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear", "aten::bmm")
_CPU_ELEMENTWISE_OPS = ("aten::copy_", "aten::fill_", "aten::zero_", "aten::_to_copy", "aten::add_", "aten::mul")


def kernel_component(name: str) -> str:
    """The estimate's component a kernel (a CUDA kernel name, or a CPU op on the CPU harness) belongs to:
    routed experts (the runtime's split layer), dense GEMMs (cuBLAS / CUTLASS, split-K reductions
    included), attention (flash / SDPA), norms + rotary + elementwise (casts, copies, fills), the
    router's top-k and softmax, or other (embedding gather, argmax, copies the profiler names)."""
    low = name.lower()
    words = name.split("(")[0].split("<")[0].split()
    base = words[-1].split("::")[-1] if words else name
    if base in RUNTIME_KERNELS:
        return "routed_experts"
    if any(k in low for k in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    if low.startswith("nvjet") or any(k in low for k in ("gemm", "cutlass", "cublas", "xmma")) or name in _CPU_GEMM_OPS:
        return "dense_gemm"
    if any(k in low for k in ("topk", "softmax", "sort")):
        return "router_topk_softmax"
    if any(k in low for k in ("rmsnorm", "layer_norm", "_rope", "rotary", "elementwise")) or name in _CPU_ELEMENTWISE_OPS:
        return "norm_rope_elementwise"
    return "other"


def _profiled(fn, replays: int, cuda: bool) -> list[tuple[str, float, float]]:
    """(name, start µs, µs) of what ``replays`` calls of ``fn`` run under the torch profiler: each
    device kernel (CUPTI) on CUDA; each CPU op's self time on the CPU."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(replays):
            fn()
        if cuda:
            torch.cuda.synchronize()
    want = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    return [(e.name, e.time_range.start, e.time_range.elapsed_us() if cuda else e.self_cpu_time_total)
            for e in prof.events() if e.device_type == want]


def kernel_table(events: list[tuple[str, float, float]], replays: int, cuda: bool) -> dict:
    """Per step: kernels by name (count, summed µs, component), by component, busy time (the sum) and,
    on CUDA, the span from the first kernel's start to the last one's end (median over replays)."""
    by_name: dict[str, dict] = {}
    by_comp = {c: {"count": 0, "us": 0.0} for c in COMPONENTS}
    for name, _, us in events:
        comp = kernel_component(name)
        row = by_name.setdefault(name[:120], {"component": comp, "count": 0, "us": 0.0})
        for r in (row, by_comp[comp]):
            r["count"] += 1
            r["us"] += us
    for r in (*by_name.values(), *by_comp.values()):
        r["count"] /= replays
        r["us"] /= replays
    out = {"kernels_per_step": len(events) / replays, "busy_us": sum(e[2] for e in events) / replays,
           "by_component": by_comp,
           "by_name": dict(sorted(by_name.items(), key=lambda kv: -kv[1]["us"]))}
    if cuda and events and len(events) % replays == 0:
        ordered = sorted(events, key=lambda e: e[1])
        n = len(events) // replays
        chunks = [ordered[r * n:(r + 1) * n] for r in range(replays)]
        out["span_us"] = statistics.median(max(s + d for _, s, d in c) - c[0][1] for c in chunks)
    return out


def profile_step(run: fp.Step, cuda: bool, replays: int, eager_check: bool) -> dict:
    """Kernels of one step by name and component. On CUDA the step's CUDA graph is replayed under the
    profiler (CUPTI reports a graph's kernel nodes one by one, as vLLM 0.33's ``vllm bench forward
    --profile-dir`` reads them); ``eager_check`` also profiles the same step launched eagerly and
    records its kernel count, so the JSON says whether the replay showed every kernel. If the replay
    showed none, the eager step's kernels are recorded instead and ``source`` says so. On the CPU:
    the CPU profiler's self time per op, not device time (``device_times`` false)."""
    if not cuda:
        return {"source": "CPU ops of the eager step (CPU profiler self time, not device time)",
                "device_times": False, "replays": replays,
                **kernel_table(_profiled(run, replays, cuda), replays, cuda)}
    out = {"source": "CUDA graph replay (CUPTI kernel records)", "device_times": True, "replays": replays}
    events = _profiled(run, replays, cuda)
    out["graph_replay_kernels_per_step"] = len(events) / replays
    if eager_check or not events:
        eager = _profiled(run.fn, replays, cuda)
        out["eager_kernels_per_step"] = len(eager) / replays
        out["graph_replay_shows_every_kernel"] = len(events) == len(eager)
        if not events:
            out["source"] = "eager step: the CUDA graph replay showed no kernels under the profiler"
            events = eager
    return {**out, **kernel_table(events, replays, cuda)}


# -- the run ---------------------------------------------------------------------------------------

def run_model(g: Geometry, args, dev: torch.device, results: dict, out_dir: Path) -> None:
    cuda = dev.type == "cuda"
    try:
        gemms = model_gemms(g, dev, args.tokens)
    except Exception as exc:  # noqa: BLE001 - a diagnostic: the step is still timed
        gemms = {"error": f"{type(exc).__name__}: {exc}"}
        if cuda:
            torch.cuda.empty_cache()
    t0 = time.perf_counter()
    m = Model(g, dev, args.context, max(args.tokens), args.seed)
    if args.cold_per_layer and g.name.startswith(tuple(args.cold_models)):
        m.add_usage_aware(args.cold_per_layer)
    if args.cold_layers and g.name.startswith(tuple(args.cold_models)):
        m.add_positional(args.cold_layers)
    build_s = time.perf_counter() - t0
    res = {"geometry": asdict(g), "context": args.context, "bytes_per_expert": m.bytes_per_expert,
           "popularity": "exp(-4.94*(r/E)^1.01) over a seeded per-layer permutation (bench/format_peer.popularity)",
           "popularity_seed": args.seed, "pinned_bytes": m.pinned_bytes, "build_s": build_s,
           "cold_per_layer": args.cold_per_layer if "usage_aware" in m.cases else 0,
           "cold_layers": args.cold_layers if "positional" in m.cases else 0,
           "cold_ids": {c: [sorted(s) for s in sets] for c, sets in m.cold_sets.items() if c == "usage_aware"},
           "gemms": gemms, "per_T": {}}
    results["models"][g.name] = res
    print(g.name, "built in", round(build_s, 1), "s; cases", list(m.cases), flush=True)
    steps_for = dict(args.steps)
    for t in args.tokens:
        steps = steps_for.get(t, 10) if cuda else 1
        ids_all, w_all = fp.sample_routing(m.popularity, steps, t, g.top_k, args.seed + t, dev)
        runs, bufs = {}, {}
        tokens = torch.randint(0, g.vocab, (t,), generator=torch.Generator(device=dev).manual_seed(args.seed),
                               device=dev)
        for case in m.cases:
            b = m.buffers(t)
            b["tokens"].copy_(tokens)
            b["w"] = w_all[0].float().contiguous()
            b["ids"].copy_(ids_all[0])
            bufs[case] = b
            runs[case] = fp.Step(m.step_fn(case, t, b), cuda)
            be = m.buffers(t)
            be["w"], be["h"] = w_all[0].float().contiguous(), torch.randn(t, g.hidden, device=dev).to(torch.bfloat16)
            be["ids"].copy_(ids_all[0])
            bufs[case + "/experts"] = be
            runs[case + "/experts"] = fp.Step(m.step_fn(case, t, be, experts_only=True), cuda)
        times: dict[str, list[float]] = {c: [] for c in runs}
        equal = True
        order = list(runs.items())
        for s in range(steps):
            for b in bufs.values():
                b["ids"].copy_(ids_all[s])
            for name, fn in (order if s % 2 == 0 else order[::-1]):
                times[name].append(fp.seconds(fn, cuda))
            equal &= all(torch.equal(bufs[c]["out"], bufs["all_hbm"]["out"]) for c in m.cases)
        ids_np = ids_all.cpu().numpy()
        touched = [[len(np.unique(ids_np[s, layer])) for layer in range(g.layers)] for s in range(steps)]
        row = {"steps": steps, "split_equals_all_hbm": bool(equal),
               "unique_per_layer_mean": float(np.mean(touched))}
        bpe = m.bytes_per_expert
        for case in m.cases:
            cold = [[len(set(np.unique(ids_np[s, layer]).tolist()) & m.cold_sets[case][layer])
                     for layer in range(g.layers)] for s in range(steps)]
            row[case] = {"step_ms": statistics.median(times[case]) * 1e3,
                         "step_ms_all": [round(x * 1e3, 4) for x in times[case]],
                         "experts_ms": statistics.median(times[case + "/experts"]) * 1e3,
                         "cold_experts_per_step_mean": float(np.mean([sum(c) for c in cold])),
                         # bytes the routed experts read per step: unique experts x bytes per expert
                         "expert_bytes_per_step_mean": float(np.mean([sum(u) for u in touched])) * bpe,
                         "cold_expert_bytes_per_step_mean": float(np.mean([sum(c) for c in cold])) * bpe}
            if args.profile:
                # the buffers hold the last timed step's routing
                try:
                    row[case]["kernels"] = {**profile_step(runs[case], cuda, args.profile, case == "all_hbm"),
                                            "routing": "the last timed step's",
                                            "expert_bytes": sum(touched[-1]) * bpe}
                except Exception as exc:  # noqa: BLE001 - a diagnostic only
                    row[case]["kernels"] = {"error": f"{type(exc).__name__}: {exc}"}
        if cuda:
            row["max_memory_allocated_GiB"] = torch.cuda.max_memory_allocated() / 2**30
        res["per_T"][str(t)] = row
        print(g.name, json.dumps({"T": t, "equal": equal, "unique": round(row["unique_per_layer_mean"], 2),
                                  **{c: round(row[c]["step_ms"], 3) for c in m.cases},
                                  **{c + "/experts": round(row[c]["experts_ms"], 3) for c in m.cases}}), flush=True)
        (out_dir / "decode_sim.json").write_text(json.dumps(results, indent=1))
        del runs
    del m
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--models", default="qwen3-30b-a3b,gpt-oss-120b")
    ap.add_argument("--tokens", default="1,8,32")
    ap.add_argument("--steps", default="1:30,8:20,32:14")
    ap.add_argument("--context", type=int, default=4096, help="KV cache tokens per sequence")
    ap.add_argument("--cold-models", default="qwen3-30b-a3b", help="models that also run the cold cases")
    ap.add_argument("--cold-per-layer", type=int, default=16)
    ap.add_argument("--cold-layers", type=int, default=2)
    ap.add_argument("--no-components", action="store_true")
    ap.add_argument("--profile", type=int, default=3,
                    help="profile this many replays of each case's step at every T, per-kernel times (0: off)")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    args = ap.parse_args()
    args.tokens = [int(t) for t in args.tokens.split(",")]
    args.steps = [tuple(int(v) for v in kv.split(":")) for kv in args.steps.split(",")]
    args.cold_models = args.cold_models.split(",")
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if not cuda:
        args.context = 64
        args.profile = min(args.profile, 1)   # the interpreted step under the CPU profiler is slow
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {"env": {"torch": torch.__version__, "triton": triton.__version__,
                       "gpu": torch.cuda.get_device_name(0) if cuda else "CPU (TRITON_INTERPRET=1)"},
               "args": {k: str(v) for k, v in vars(args).items()}, "models": {}}
    t_start = time.perf_counter()
    if not args.no_components:
        results["components"] = components(dev, args)
        print("components", json.dumps({k: v for k, v in results["components"].items()
                                        if not isinstance(v, dict)}), flush=True)
        (out_dir / "decode_sim.json").write_text(json.dumps(results, indent=1))
    ok = True
    for name in args.models.split(","):
        g = GEOMETRIES[name] if cuda else tiny(GEOMETRIES[name])
        try:
            run_model(g, args, dev, results, out_dir)
        except Exception as exc:  # noqa: BLE001 - reported; the other models still run
            import traceback
            traceback.print_exc()
            results.setdefault("errors", {})[name] = f"{type(exc).__name__}: {str(exc)[:500]}"
            ok = False
            if cuda:
                torch.cuda.empty_cache()
        ok &= all(r.get("split_equals_all_hbm", True) for r in results["models"].get(g.name, {}).get("per_T", {}).values())
    results["wall_s"] = time.perf_counter() - t_start
    (out_dir / "decode_sim.json").write_text(json.dumps(results, indent=1))
    print("checks", "passed" if ok else "FAILED", "in", round(results["wall_s"], 1), "s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
