#!/usr/bin/env python3
"""The residency runtime's MXFP4 expert layer against the MoE kernel vLLM 0.33 selects on Hopper, side
by side on one GPU: same logical weights, same routing, same CUDA-graph method, DeepSeek-V4.1-Flash
geometry (hidden 5,120, intermediate 2,304, 384 experts, top-6; 18,800,640 B per expert).

Peers (``--peers``):

* ``humming`` — **what vLLM 0.33 runs for DeepSeek-V4-style MXFP4 experts on an H100/H200**:
  ``select_deepseek_v4_mxfp4_moe_backend`` walks FLASHINFER_TRTLLM_MXFP4_MXFP8, DEEPGEMM_MXFP4,
  MARLIN, BATCHED_MARLIN, HUMMING with Humming moved ahead of Marlin on compute capability 9.0
  (``prioritize_humming``); the first two are SM100-family kernels. Humming's kernels from the
  published ``humming-kernels`` 0.1.19 wheel (installed on the bench machine, never copied here),
  driven as vLLM's ``HummingIndexedExperts`` drives them, with the checkpoint's MXFP8 activations
  run as block FP8 (E4M3, one fp32 scale per 128 values; ``bench/humming_peer.py`` says how and
  cites the source lines).
* ``matmul_ogs`` — ``triton_kernels``' ``matmul_ogs`` (vendored in the vLLM 0.33.0 wheel,
  ``vllm/third_party/triton_kernels``), vLLM's TRITON backend: the kernel vLLM selects for **gpt-oss**
  on SM90 (``_get_priority_backends_for_gpt_oss`` puts TRITON first there), not for DeepSeek-V4;
  kept for the record, since earlier rounds compared against it. Driven by vLLM's own glue read
  at run time from the unpacked wheel (``--vllm-src``): ``_swizzle_mxfp4``
  (``quantization/utils/mxfp4_utils.py``: Hopper value/scale layouts, ``split_k=1``),
  ``make_routing_data`` with the non-power-of-two top-k routing patch, and
  ``triton_kernel_fused_experts`` (two ``matmul_ogs`` calls, fused SwiGLU-OAI, scatter + top-k
  reduction) from ``fused_moe/experts/gpt_oss_triton_kernels_moe.py``. vLLM itself is not imported
  (the bench machine has no vLLM): the few vLLM helpers those functions call are stubbed with the
  values they take on a CUDA Hopper device (``_vllm_glue``).

One canonical checkpoint-layout tensor per layer (``w13 [E, 2I, H/2]`` gate rows first, ``w2 [E, H,
I/2]`` uint8, ue8m0 scales ``[E, rows, K/32]``) is converted into each kernel's layout: ours with
``TritonMxfp4Experts.to_kernel_layout`` (MMA order), Humming's with vLLM's
``convert_to_humming_moe_kernel_format`` steps, ``matmul_ogs``'s with vLLM's TRITON-backend prep
(gate/up rows interleaved for its fused SwiGLU, then ``_swizzle_mxfp4``). Activation: ours and
Humming run DeepSeek-V4's SiLU with its clamp (``--swiglu-limit``, 10.0 in the model's config);
``matmul_ogs``'s glue only has SwiGLU-OAI (alpha 1.702, limit 7.0). Each output is checked against
an fp32 dequantized reference of its own activation (relative L2); Humming also against the same
reference with its activations rounded to block FP8 as it rounds them (its quantization error
shown beside ours, which keeps bf16 activations).

Timed per T (graph of ``--layers`` different layers so the 60 MB L2 cannot hold weights; routing
redrawn every step, order of the cases flipped every step), per peer:
* ``<peer>_layer``   — routing preparation + the rest: the peer's layer as a vLLM decode step runs it;
* ``<peer>_gemms``   — the layer without its routing preparation (on routing prepared in a
  separate graph): the peer's floor. For Humming the routing preparation is vLLM's CUDA
  ``moe_align_block_size``, which is not Python: a torch stand-in takes its place, timed only in
  ``humming_layer``; ``humming_gemms`` holds the block-FP8 input quantization, both Humming
  GEMMs, the fused activation + w2-input quantization and ``moe_fused_mul_sum``;
* ``ours``           — ``TritonMxfp4Experts.forward``.
Bytes = unique experts per layer × 18,800,640; GB/s and % of the HBM read limit measured in the
same run (``gpu_residency.read_bandwidth``).

Headline (``--offload``, against ``matmul_ogs`` only): the 13-layer step with the first 3 layers
entirely in pinned host memory read in place (what ``--cpu-offload-gb`` does to vLLM's MoE weights)
for the peer, against our usage-aware layers (per layer the 295 most popular experts hot, 89 cold in
pinned host memory: the same host bytes within 0.5%), T ∈ {1, 16}.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "bench"))

import gpu_residency as gr  # noqa: E402  (limits, routing, pinned copies: one method for both benches)
from expert_residency.contract.expert_formats import GPTOSS_SWIGLU_ALPHA, GPTOSS_SWIGLU_LIMIT  # noqa: E402
from expert_residency.core.banks import build_unsplit_layer  # noqa: E402
from expert_residency.gpu.experts import KernelConfig, TritonMxfp4Experts  # noqa: E402
from expert_residency.gpu.experts_w4a8 import TritonW4a8Experts  # noqa: E402
from expert_residency.mxfp4 import dequantize_mxfp4  # noqa: E402

DEV = gr.DEV
DSV41 = gr.DSV41
GB = gr.GB
W4A8_LABEL = "w4a8"   # --w4a8: ours with FP8 activations
ALPHA, LIMIT = GPTOSS_SWIGLU_ALPHA, GPTOSS_SWIGLU_LIMIT  # vLLM's triton_kernel_fused_experts defaults


# -- vLLM's glue, loaded from the unpacked wheel ------------------------------------------------------

_GLUE_FUNCS = {
    "model_executor/layers/fused_moe/experts/gpt_oss_triton_kernels_moe.py":
        ("pack_bitmatrix", "_patch_legacy_routing_for_nonpow2_topk", "make_routing_data",
         "triton_kernel_fused_experts"),
    "model_executor/layers/quantization/utils/mxfp4_utils.py": ("_swizzle_mxfp4",),
}

_GLUE_HEADER = '''from __future__ import annotations
from typing import Any
import logging
import torch
import triton
import triton.language as tl
import triton_kernels
import triton_kernels.swiglu
from triton_kernels.matmul_ogs import FnSpecs, FusedActivation, GatherIndx, RoutingData, ScatterIndx, matmul_ogs
from triton_kernels.tensor import Bitmatrix
BIT = None
SparseMatrix = None
triton_kernels_version = "3.5.1"   # what vLLM infers for this vendored copy (no SparseMatrix)
logger = logging.getLogger("vllm-glue")


class MoEActivation:
    SWIGLUOAI = "swigluoai"


FusedMoEQuantConfig = object


class _Platform:  # vLLM's current_platform on a CUDA compute-capability-9.0 device
    def is_cuda(self): return True
    def is_rocm(self): return False
    def is_device_capability(self, cap): return cap == 90
    def is_device_capability_family(self, cap): return False


current_platform = _Platform()
def has_triton_kernels(): return True
def get_triton_kernels_version(): return triton_kernels_version
def is_torch_equal_or_newer(v): return True
def should_use_gfx1250_mx_scale_swizzle(): return False
def should_use_cdna4_mx_scale_swizzle(): return False
def _constrain_sm12x_block_m(num_rows, num_experts): return None


def _resize_cache(x, v):
    n = 1
    for d in v:
        n *= d
    return x.flatten()[:n].view(*v)
'''


def load_vllm_glue(vllm_src: Path, triton_kernels_parent: Path):
    """The vLLM functions named in ``_GLUE_FUNCS``, cut out of the wheel's source files by the AST
    and imported as one module (Triton needs a real file for ``@triton.jit`` sources)."""
    sys.path.insert(0, str(triton_kernels_parent))
    parts = [_GLUE_HEADER]
    cited = {}
    for rel, names in _GLUE_FUNCS.items():
        path = vllm_src / rel
        text = path.read_text()
        tree = ast.parse(text)
        found = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names}
        missing = set(names) - set(found)
        if missing:
            raise SystemExit(f"{path}: vLLM functions {sorted(missing)} not found (another vLLM version?)")
        lines = text.splitlines()
        for name in names:
            node = found[name]
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])  # keep @triton.jit
            parts.append("\n".join(lines[first - 1:node.end_lineno]))
            cited[name] = f"{rel}:{first}"
    src = "\n\n\n".join(parts) + "\n\n_patch_legacy_routing_for_nonpow2_topk()\n"
    fd, tmp = tempfile.mkstemp(prefix="vllm_glue_", suffix=".py")
    with os.fdopen(fd, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("vllm_glue", tmp)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.CITED = cited
    return mod


class Peer:
    """vLLM's TRITON MXFP4 backend on one layer (weights converted from the checkpoint layout)."""

    name = "matmul_ogs"

    def __init__(self, glue, ckpt: dict[str, torch.Tensor]) -> None:
        from triton_kernels.matmul_ogs import FlexCtx, PrecisionConfig
        self.glue = glue
        e, two_i, _ = ckpt["w13_weight"].shape
        i = two_i // 2
        # Gate/up rows interleaved (g0, u0, g1, u1, ...): the fused SwiGLU splits the GEMM's
        # output columns into (even, odd) pairs.
        order = torch.stack((torch.arange(i), torch.arange(i) + i), dim=1).reshape(-1).to(DEV)
        w13 = ckpt["w13_weight"].index_select(1, order)
        s13 = ckpt["w13_weight_scale"].index_select(1, order)
        w13, f13, sc13 = glue._swizzle_mxfp4(w13, s13)
        w2, f2, sc2 = glue._swizzle_mxfp4(ckpt["w2_weight"], ckpt["w2_weight_scale"])
        self.w13, self.w2 = w13, w2
        self.quant = SimpleNamespace(
            w1_bias=None, w2_bias=None,
            w1_precision=PrecisionConfig(weight_scale=sc13, flex_ctx=FlexCtx(rhs_data=f13)),
            w2_precision=PrecisionConfig(weight_scale=sc2, flex_ctx=FlexCtx(rhs_data=f2)))
        self.experts = e

    def routing(self, ids: torch.Tensor, weights: torch.Tensor):
        return self.glue.make_routing_data(ids, weights, self.experts)

    def gemms(self, x: torch.Tensor, routing, out: torch.Tensor, top_k: int) -> torch.Tensor:
        rd, gather, scatter = routing
        return self.glue.triton_kernel_fused_experts(out, x, self.w13, self.w2, rd, gather, scatter, topk=top_k,
                                                     quant_config=self.quant, swiglu_alpha=ALPHA,
                                                     swiglu_limit=LIMIT)

    def route(self, ids: torch.Tensor, weights: torch.Tensor):
        return self.routing(ids, weights)

    def run(self, x, routing, weights, ids, out):
        return self.gemms(x, routing, out, ids.shape[1])

    def nbytes(self) -> int:
        tensors = [self.w13.storage.data, self.w2.storage.data, self.quant.w1_precision.weight_scale.storage.data,
                   self.quant.w2_precision.weight_scale.storage.data]
        return sum(t.numel() * t.element_size() for t in tensors)

    def to_pinned(self) -> list:
        """Move every weight tensor into exact-size pinned host memory, read in place (keep the
        returned regions alive)."""
        from expert_residency.gpu.pinned import PinnedRegion
        owners = []
        for holder in (self.w13, self.w2, self.quant.w1_precision.weight_scale, self.quant.w2_precision.weight_scale):
            data = holder.storage.data
            # The swizzled tensors are contiguous or a transposed view of a contiguous buffer
            # (HopperMX layouts end with .mT): copy the buffer, rebuild the same view.
            transposed = not data.is_contiguous()
            base = data.mT if transposed else data
            if not base.is_contiguous():
                raise ValueError(f"peer tensor {tuple(data.shape)} strides {data.stride()}: not a plain view")
            region = PinnedRegion(tuple(base.shape), base.dtype, DEV)
            region.host.copy_(base)
            holder.storage.data = region.view.mT if transposed else region.view
            owners.append(region)
        torch.cuda.synchronize()
        return owners


# -- references ---------------------------------------------------------------------------------------

def fp8_block_round(v: torch.Tensor, ue8m0: bool) -> torch.Tensor:
    """``v`` rounded as block-FP8 quantization rounds it (E4M3, one scale per 128 values along the
    last dim: amax / 448, rounded up to a power of two with ``ue8m0``), back in fp32."""
    g = v.float().reshape(*v.shape[:-1], -1, 128)
    s = torch.clamp(g.abs().amax(-1, keepdim=True), min=1e-10) / 448.0
    if ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    q = torch.clamp(g / s, -448.0, 448.0).to(torch.float8_e4m3fn).float() * s
    return q.reshape(v.shape)


def reference(ckpt, x, ids, weights, activation: str, swiglu_limit: float | None = None,
              fp8_acts: bool = False) -> torch.Tensor:
    """fp32 dequantized layer: sum_k w_k * W2_e act(W13_e x) (gate rows first, up rows second).
    ``activation`` "silu" (with ``swiglu_limit``'s clamp) or "oai" (SwiGLU-OAI as triton_kernels
    computes it). ``fp8_acts``: both GEMM inputs rounded to block FP8 first, as the Humming path
    rounds them (layer input with power-of-two scales, w2 input with fp32 scales)."""
    t, k = ids.shape
    i = ckpt["w13_weight"].shape[1] // 2
    out = torch.zeros(t, x.shape[1], dtype=torch.float32, device=x.device)
    xf = fp8_block_round(x, ue8m0=True) if fp8_acts else x.float()
    for e in torch.unique(ids).tolist():
        rows, slots = (ids == e).nonzero(as_tuple=True)
        w13 = dequantize_mxfp4(ckpt["w13_weight"][e], ckpt["w13_weight_scale"][e], torch.float32)
        w2 = dequantize_mxfp4(ckpt["w2_weight"][e], ckpt["w2_weight_scale"][e], torch.float32)
        h = xf[rows] @ w13.T
        g, u = h[:, :i], h[:, i:]
        if activation == "silu":
            if swiglu_limit is not None:
                g = g.clamp(max=swiglu_limit)
                u = u.clamp(-swiglu_limit, swiglu_limit)
            a = torch.nn.functional.silu(g) * u
        else:  # SwiGLU-OAI as triton_kernels computes it
            g = g.clamp(max=LIMIT)
            u = u.clamp(-LIMIT, LIMIT)
            s = g * torch.sigmoid(ALPHA * g)
            a = s * (u + 1)
        if fp8_acts:
            a = fp8_block_round(a, ue8m0=False)
        out.index_add_(0, rows, (a @ w2.T) * weights[rows, slots].float()[:, None])
    return out


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# -- timing -------------------------------------------------------------------------------------------

CAPTURE_FAILURES: list[str] = []


class Graph:
    """One CUDA graph of ``fn()`` (warmed up on a side stream first). If capture is refused the
    step runs eagerly instead, and ``CAPTURE_FAILURES`` says so (reported with the results)."""

    def __init__(self, fn, warmup: int = 2, name: str = "") -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                self.out = fn()
        torch.cuda.current_stream().wait_stream(side)
        self.fn, self.graph = fn, torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph):
                self.out = fn()
        except Exception as exc:  # noqa: BLE001 - reported
            torch.cuda.synchronize()
            self.graph = None
            CAPTURE_FAILURES.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
            print("capture failed, eager:", CAPTURE_FAILURES[-1], flush=True)
            self.out = fn()

    def replay(self) -> None:
        if self.graph is None:
            self.out = self.fn()
        else:
            self.graph.replay()


def unique_bytes(ids: torch.Tensor) -> int:
    """Bytes of the experts one step touches: unique experts per layer × bytes per expert."""
    return sum(len(torch.unique(ids[layer])) for layer in range(ids.shape[0])) * DSV41.bytes_per_expert


def run_tokens(tokens, steps, ours, ex, peers, p, k, seed, hbm_bw, variants=None):
    """``peers``: name -> one peer object per layer (``route(ids, w)``, ``run(x, routing, w, ids, out)``);
    ``variants``: label -> (another ``TritonMxfp4Experts``, its layers: ``ours`` or its own layout's)
    (case ``ours@label``)."""
    layers = len(ours)
    ids_all, w_all = gr.sample_routing(p[:layers], steps, tokens, k, seed + tokens)
    gen = torch.Generator(device=DEV).manual_seed(seed + 3 * tokens)
    x = torch.randn(layers, tokens, DSV41.hidden, generator=gen, device=DEV).to(torch.bfloat16)
    ids_buf, w_buf = ids_all[0].clone(), w_all[0].clone()
    out_ours = torch.empty(layers, tokens, DSV41.hidden, dtype=torch.bfloat16, device=DEV)
    cases, routes = {}, []
    for name, per_layer in peers.items():
        out_peer = torch.empty_like(out_ours)

        def route_all(per_layer=per_layer):
            return [per_layer[l].route(ids_buf[l], w_buf[l]) for l in range(layers)]

        g_route = Graph(route_all, name=f"{name} routing")
        g_route.replay()  # a captured graph's outputs hold nothing until its first replay
        torch.cuda.synchronize()

        def gemms_all(per_layer=per_layer, g_route=g_route, out_peer=out_peer):
            for l in range(layers):  # g_route.out: the graph's static routing (or the last eager one)
                per_layer[l].run(x[l], g_route.out[l], w_buf[l], ids_buf[l], out_peer[l])
            return out_peer

        g_gemms = Graph(gemms_all, name=f"{name} gemms")
        cases[f"{name}_layer"] = (lambda g_route=g_route, g_gemms=g_gemms: (g_route.replay(), g_gemms.replay()))
        cases[f"{name}_gemms"] = g_gemms.replay
        cases[f"{name}_routing"] = g_route.replay
        routes.append(g_route)

    def ours_all():
        for l in range(layers):
            ex.forward(ours[l], x[l], w_buf[l], ids_buf[l], out=out_ours[l])
        return out_ours

    cases["ours"] = Graph(ours_all, name="ours").replay
    for label, (vex, vlayers) in (variants or {}).items():
        out_v = torch.empty_like(out_ours)

        def variant_all(vex=vex, vlayers=vlayers, out_v=out_v):
            for l in range(layers):
                vex.forward(vlayers[l], x[l], w_buf[l], ids_buf[l], out=out_v[l])
            return out_v

        cases[f"ours@{label}"] = Graph(variant_all, name=f"ours@{label}").replay
    times = {c: [] for c in cases}
    nbytes = []
    order = list(cases.items())
    for s in range(steps):
        ids_buf.copy_(ids_all[s])
        w_buf.copy_(w_all[s])
        for g_route in routes:
            g_route.replay()  # the GEMM graphs read this step's routing
        for case, fn in (order if s % 2 == 0 else order[::-1]):
            times[case].append(gr.event_seconds(fn))
        nbytes.append(unique_bytes(ids_all[s]))
    torch.cuda.synchronize()
    res = {"steps": steps, "bytes_per_layer": statistics.fmean(nbytes) / layers}
    for case, ts in times.items():
        med = statistics.median(ts)
        res[case] = {"us_per_layer": med / layers * 1e6, "GBps": statistics.fmean(nbytes) / med / GB,
                     "pct_hbm": 100 * statistics.fmean(nbytes) / med / hbm_bw}
    return res


def check_outputs(ours, ex, peers, ckpt0, k, seed, swiglu_limit, errors, variants=None):
    """Layer 0, T=6: every kernel against the fp32 dequantized reference of its activation."""
    t = 6
    gen = torch.Generator(device=DEV).manual_seed(seed + 11)
    x = torch.randn(t, DSV41.hidden, generator=gen, device=DEV).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(ckpt0["w13_weight"].shape[0], generator=gen, device=DEV)[:k]
                       for _ in range(t)])
    weights = torch.softmax(torch.randn(t, k, generator=gen, device=DEV), -1)
    ref_silu = reference(ckpt0, x, ids, weights, "silu", swiglu_limit)
    out_ours = ex.forward(ours[0], x, weights, ids)
    res = {"ours_vs_fp32_ref_rel_l2": rel_l2(out_ours, ref_silu)}
    out_ours = out_ours.clone()
    for label, (vex, vlayers) in (variants or {}).items():
        out_v = vex.forward(vlayers[0], x, weights, ids)
        res[f"ours@{label}_vs_fp32_ref_rel_l2"] = rel_l2(out_v, ref_silu)
        if isinstance(vex, TritonW4a8Experts):   # FP8 activations, as Humming's: also that reference
            res[f"ours@{label}_vs_fp32_ref_with_fp8_activations_rel_l2"] = rel_l2(
                out_v, reference(ckpt0, x, ids, weights, "silu", swiglu_limit, fp8_acts=True))
    for name, per_layer in list(peers.items()):
        out = torch.zeros(t, DSV41.hidden, dtype=torch.bfloat16, device=DEV)
        try:
            per_layer[0].run(x, per_layer[0].route(ids, weights), weights, ids, out)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - reported; the peer is dropped from the run
            traceback.print_exc()
            errors.append(f"{name} forward: {type(exc).__name__}: {str(exc)[:300]}")
            del peers[name]
            continue
        if name == "humming":
            res["humming_vs_fp32_ref_rel_l2"] = rel_l2(out, ref_silu)
            res["humming_vs_fp32_ref_with_its_fp8_activations_rel_l2"] = rel_l2(
                out, reference(ckpt0, x, ids, weights, "silu", swiglu_limit, fp8_acts=True))
            res["ours_vs_humming_rel_l2"] = rel_l2(out_ours, out)
        else:
            res[f"{name}_vs_fp32_oai_ref_rel_l2"] = rel_l2(out, reference(ckpt0, x, ids, weights, "oai"))
            res[f"{name}_vs_silu_ref_rel_l2 (different activation, sanity)"] = rel_l2(out, ref_silu)
    return res


def offload_headline(glue, args, k) -> dict:
    """13 layers: peer with the first 3 entirely pinned vs our usage-aware banks, T in {1, 16}.

    Both 13-layer models do not fit in HBM together (2 × 72 GB), so the run times the peer's step
    first, frees it, builds ours from the same seeded checkpoint tensors and times it on the very
    same routing (``sample_routing`` with the same seeds): two phases of one run, not interleaved.
    """
    from expert_residency.core.banks import device_allocator, rehome_layer
    from expert_residency.gpu.pinned import pinned_view_allocator
    layers, experts = args.offload_layers, args.experts
    pp = gr.popularity(experts, layers, args.seed + 77)
    plan = ((1, 12), (16, 6))
    routing = {t: gr.sample_routing(pp, steps, t, k, args.seed + 900 + t) for t, steps in plan}
    xs = {t: torch.randn(layers, t, DSV41.hidden, generator=torch.Generator(device=DEV).manual_seed(t),
                         device=DEV).to(torch.bfloat16) for t, _ in plan}
    res = {"per_T": {t: {"steps": steps} for t, steps in plan}}

    def time_step(step_fn, tokens, steps, key):
        ids_all, w_all = routing[tokens]
        ids_buf, w_buf = ids_all[0].clone(), w_all[0].clone()
        out = torch.empty(layers, tokens, DSV41.hidden, dtype=torch.bfloat16, device=DEV)
        g = Graph(lambda: step_fn(xs[tokens], w_buf, ids_buf, out), warmup=1, name=f"offload {key} T={tokens}")
        ts = []
        for s in range(steps):
            ids_buf.copy_(ids_all[s])
            w_buf.copy_(w_all[s])
            ts.append(gr.event_seconds(g.replay))
        res["per_T"][tokens][key] = statistics.median(ts) * 1e3
        del g

    # Phase 1: the peer, first layers pinned.
    gen = torch.Generator(device=DEV).manual_seed(args.seed + 77)
    t0 = time.perf_counter()
    peers, owners, host_peer = [], [], 0
    for layer in range(layers):
        ckpt = gr.random_layer(experts, gen)
        peer = Peer(glue, ckpt)
        del ckpt
        if layer < args.offload_cold_layers:
            owners += peer.to_pinned()
            host_peer += peer.nbytes()
        peers.append(peer)
        torch.cuda.empty_cache()
    torch.cuda.synchronize()
    res["build_peer_s"], res["host_bytes_peer"] = time.perf_counter() - t0, host_peer
    print(f"offload: peer built in {res['build_peer_s']:.1f}s, {host_peer / GB:.2f} GB pinned", flush=True)

    def peer_step(x, w, ids, out):
        for l in range(layers):
            peers[l].gemms(x[l], peers[l].routing(ids[l], w[l]), out[l], k)
        return out

    for tokens, steps in plan:
        time_step(peer_step, tokens, steps, "peer_offload_ms")
    del peers, owners, peer
    torch.cuda.synchronize()
    torch.cuda.empty_cache()

    # Phase 2: ours, usage-aware, from the same checkpoint tensors (same generator seed).
    gen = torch.Generator(device=DEV).manual_seed(args.seed + 77)
    ex = TritonMxfp4Experts(DSV41, experts, k, max_tokens=16, device=DEV, config=KernelConfig())
    t0 = time.perf_counter()
    ours, host_ours = [], 0
    for layer in range(layers):
        ckpt = gr.random_layer(experts, gen)
        ex.to_kernel_layout(ckpt)
        order = np.argsort(-pp[layer], kind="stable")
        hot, cold = sorted(order[:args.hot].tolist()), sorted(order[args.hot:].tolist())
        rl = rehome_layer(ckpt, hot, cold, layer_index=layer, hot_alloc=device_allocator(DEV),
                          cold_alloc=pinned_view_allocator(DEV), codes_device=DEV)
        host_ours += rl.cold.nbytes()
        ours.append(rl)
        del ckpt
        torch.cuda.empty_cache()
    torch.cuda.synchronize()
    res["build_ours_s"], res["host_bytes_ours"] = time.perf_counter() - t0, host_ours

    def ours_step(x, w, ids, out):
        for l in range(layers):
            ex.forward(ours[l], x[l], w[l], ids[l], out=out[l])
        return out

    for tokens, steps in plan:
        time_step(ours_step, tokens, steps, "ours_usage_aware_ms")
        r = res["per_T"][tokens]
        r["ratio"] = r["peer_offload_ms"] / r["ours_usage_aware_ms"]
        print(json.dumps({"offload_T": tokens, **r}), flush=True)
    del ours
    torch.cuda.empty_cache()
    return res


def build_humming(vllm_src: Path, args):
    """Humming's glue module, or None with the reason printed (the run goes on without it)."""
    try:
        import humming_peer
        glue = humming_peer.load_vllm_glue(vllm_src)
        import humming
        return humming_peer, glue, humming.__version__
    except Exception as exc:  # noqa: BLE001 - reported
        print(f"humming unavailable: {type(exc).__name__}: {exc}", flush=True)
        return None, None, f"unavailable: {type(exc).__name__}: {str(exc)[:200]}"


# KernelConfig fields that decide the banks' byte layout (gpu.layout): a variant changing one needs its own layers.
LAYOUT_FIELDS = ("block_n1", "block_k1", "block_n2", "block_k2", "dequant", "tile_major")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm-src", default=str(ROOT / ".cache/vllm-0.33.0/vllm"))
    ap.add_argument("--peers", default="humming,matmul_ogs",
                    help="humming (what vLLM 0.33 selects for DeepSeek-V4 MXFP4 on SM90), matmul_ogs (gpt-oss's)")
    ap.add_argument("--layers", type=int, default=4, help="different layers in each timed graph")
    ap.add_argument("--experts", type=int, default=384)
    ap.add_argument("--top-k", type=int, default=6)
    ap.add_argument("--tokens", default="1,6,16,96")
    ap.add_argument("--steps", default="1:40,6:30,16:20,96:10")
    ap.add_argument("--swiglu-limit", type=float, default=10.0,
                    help="DeepSeek-V4's SiLU clamp (config swiglu_limit), ours and Humming; 0 = none")
    ap.add_argument("--config", default="", help="KernelConfig fields for ours, e.g. block_n2=128")
    ap.add_argument("--compare", default="", help="';'-separated 'label:k=v,k=v' configs of ours timed beside "
                    "the default (case ours@label; same layers, same routing)")
    ap.add_argument("--w4a8", nargs="?", const=W4A8_LABEL + ":", default="",
                    help="also time ours with FP8 activations (gpu.experts_w4a8, which no user setting selects; its "
                         "own layout): "
                         "';'-separated 'label:k=v,...' KernelConfig fields (tokens per tile, warps, stages)")
    ap.add_argument("--offload", action="store_true", help="also the 13-layer offload headline (matmul_ogs)")
    ap.add_argument("--offload-layers", type=int, default=13)
    ap.add_argument("--offload-cold-layers", type=int, default=3)
    ap.add_argument("--hot", type=int, default=295)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    args = ap.parse_args()
    config = gr.parse_config(args.config)
    variant_configs = {}
    for item in filter(None, (c.strip() for c in args.compare.split(";"))):
        label, fields = item.split(":", 1)
        vcfg = gr.parse_config(",".join(filter(None, [args.config, fields])))
        changed = [f for f in LAYOUT_FIELDS if getattr(vcfg, f) != getattr(config, f)]
        if changed:  # the variants share the default's layers: another layout would read them wrongly
            ap.error(f"--compare {label}: {', '.join(changed)} change how the banks are laid out; the variants "
                     f"time the default's layers, so only fields that keep the layout can be compared here "
                     f"(time another layout with --config)")
        variant_configs[label] = vcfg
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    vllm_src = Path(args.vllm_src)
    names = [n for n in args.peers.split(",") if n]
    limit = args.swiglu_limit or None
    glue = load_vllm_glue(vllm_src, vllm_src / "third_party")
    hp, hglue, humming_version = build_humming(vllm_src, args) if "humming" in names else (None, None, "not run")
    if hp is None and "humming" in names:
        names.remove("humming")
    props = torch.cuda.get_device_properties(0)
    env = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
           "triton": __import__("triton").__version__, "humming": humming_version, "vllm_glue": glue.CITED,
           "vllm_humming_glue": getattr(hglue, "CITED", None)}
    print("env", json.dumps(env), flush=True)
    k, experts = args.top_k, args.experts
    gen = torch.Generator(device=DEV).manual_seed(args.seed)
    p = gr.popularity(experts, args.layers, args.seed)
    token_counts = [int(t) for t in args.tokens.split(",")]
    max_tokens = max([6] + token_counts)  # 6: the correctness check
    ex = TritonMxfp4Experts(DSV41, experts, k, max_tokens=max_tokens, device=DEV, config=config,
                            swiglu_limit=limit)
    variants = {}
    peers, ours, ckpt0, humming_info = {n: [] for n in names}, [], None, None
    for label, vcfg in variant_configs.items():
        variants[label] = (TritonMxfp4Experts(DSV41, experts, k, max_tokens=max_tokens, device=DEV, config=vcfg,
                                              swiglu_limit=limit), ours)
    w4a8_layers: list = []   # one FP8-activation layout, shared by its variants (same tiles)
    for item in filter(None, (c.strip() for c in args.w4a8.split(";"))):
        label, fields = item.split(":", 1)
        variants[label] = (TritonW4a8Experts(DSV41, experts, k, max_tokens=max_tokens, device=DEV,
                                             config=gr.parse_config(fields), swiglu_limit=limit), w4a8_layers)
    results_errors: list[str] = []
    t0 = time.perf_counter()
    for layer in range(args.layers):
        ckpt = gr.random_layer(experts, gen)
        if layer == 0:
            ckpt0 = {n: t.clone() for n, t in ckpt.items()}
        if "humming" in peers:
            try:
                hpeer = hp.HummingPeer(hglue, ckpt, k, limit, max_tokens,
                                       shapes_m=[t * k for t in token_counts + [6]])
                peers["humming"].append(hpeer)
                humming_info = humming_info or hpeer.describe()
            except Exception as exc:  # noqa: BLE001 - reported; the run goes on without it
                traceback.print_exc()
                results_errors.append(f"humming build: {type(exc).__name__}: {str(exc)[:300]}")
                del peers["humming"]
        if "matmul_ogs" in peers:
            peers["matmul_ogs"].append(Peer(glue, ckpt))
        w4a8 = [v for v, vlayers in variants.values() if vlayers is w4a8_layers]
        if w4a8:
            copy = {n: t.clone() for n, t in ckpt.items()}
            w4a8[0].to_kernel_layout(copy)
            w4a8_layers.append(build_unsplit_layer(copy, layer_index=layer))
        ex.to_kernel_layout(ckpt)  # in place: the checkpoint tensor becomes ours
        ours.append(build_unsplit_layer(ckpt, layer_index=layer))
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    print(f"built {args.layers} layers x {1 + len(peers)} layouts in {time.perf_counter() - t0:.1f}s", flush=True)
    if humming_info:
        print("humming", json.dumps(humming_info, default=str), flush=True)
    limits = {"hbm_read": gr.read_bandwidth(ours[0].hot.tensors["w13_weight"], 10)}
    hbm_bw = limits["hbm_read"]["GBps"] * GB
    results = {"env": env, "args": vars(args), "config": config.describe(), "limits": limits,
               "ws_programs_per_sm": ex.ws_programs_per_sm,   # the config's 0 resolved on this GPU
               "humming": humming_info, "errors": results_errors, "per_T": {}}
    results["variants"] = {label: (("FP8 activations (gpu.experts_w4a8) " if isinstance(v, TritonW4a8Experts) else "")
                                   + v.config.describe()) for label, (v, _) in variants.items()}
    results["check"] = check_outputs(ours, ex, peers, ckpt0, k, args.seed, limit, results_errors, variants)
    print("check", json.dumps(results["check"]), flush=True)
    del ckpt0
    steps_for = {int(a): int(b) for a, b in (kv.split(":") for kv in args.steps.split(","))}
    for tokens in token_counts:
        r = run_tokens(tokens, steps_for.get(tokens, 10), ours, ex, peers, p, k, args.seed, hbm_bw, variants)
        results["per_T"][tokens] = r
        print(json.dumps({"T": tokens, **{c: round(v["us_per_layer"], 1) for c, v in r.items() if isinstance(v, dict)}}),
              flush=True)
        (out_dir / "peer_moe.json").write_text(json.dumps(results, indent=1, default=str))
    del peers, ours
    torch.cuda.empty_cache()
    results["capture_failures"] = CAPTURE_FAILURES
    (out_dir / "peer_moe.md").write_text(markdown(results))  # kept if the offload part is cut off
    print(markdown(results), flush=True)
    if args.offload:
        try:
            results["offload"] = offload_headline(glue, args, k)
        except Exception as exc:  # reported, not fatal: the all-HBM tables above stand
            results["offload_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
            print("offload failed:", results["offload_error"], flush=True)
    results["capture_failures"] = CAPTURE_FAILURES
    results["wall_s"] = time.perf_counter() - t_start
    (out_dir / "peer_moe.json").write_text(json.dumps(results, indent=1, default=str))
    table = markdown(results)
    (out_dir / "peer_moe.md").write_text(table)
    print(table)
    return 0


PEER_TITLES = {"humming": "Humming (vLLM 0.33's pick for DeepSeek-V4 MXFP4 on SM90)",
               "matmul_ogs": "matmul_ogs (vLLM 0.33's pick for gpt-oss on SM90; not DeepSeek-V4's)"}


def _per_sm_note(r: dict) -> str:
    """The warp-specialized launches' programs per SM where the config leaves them to the GPU
    (``x2|4/SM``): the count this run resolved."""
    n = r.get("ws_programs_per_sm")
    return f" ({n} programs per SM on this GPU)" if n and "x2|4/SM" in r["config"] else ""


def markdown(r: dict) -> str:
    lim = r["limits"]["hbm_read"]["GBps"]
    lines = [f"GPU: {r['env']['gpu']} ({r['env']['sms']} SMs), torch {r['env']['torch']}, triton {r['env']['triton']}, "
             f"humming {r['env'].get('humming')}; ours: {r['config']}{_per_sm_note(r)}; SiLU clamp {r['args'].get('swiglu_limit')}; "
             f"HBM read limit {lim:.0f} GB/s (same run)", "",
             "Correctness (layer 0, T=6, relative L2 vs fp32 dequantized references of each kernel's activation): "
             + ", ".join(f"{k} {v:.2e}" for k, v in r.get("check", {}).items()), "",
             "CUDA graphs: " + ("every case captured" if not r.get("capture_failures") else
                                "NOT captured (ran eagerly): " + "; ".join(r["capture_failures"]))]
    if r.get("errors"):
        lines += ["", "Errors: " + "; ".join(r["errors"])]
    names = sorted({c[:-len("_layer")] for x in r["per_T"].values() for c, v in x.items()
                    if c.endswith("_layer") and isinstance(v, dict) and f"{c[:-len('_layer')]}_gemms" in x},
                   key=lambda n: list(PEER_TITLES).index(n) if n in PEER_TITLES else 9)
    for name in names:
        lines += ["", f"Against {PEER_TITLES.get(name, name)}:", "",
                  "| T | bytes/layer (MB) | peer layer µs | peer GEMMs µs | peer routing µs | ours µs | ours ÷ peer layer "
                  "| ours ÷ peer GEMMs | ours GB/s (% HBM) | peer GEMMs GB/s (% HBM) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for tokens, x in r["per_T"].items():
            if f"{name}_layer" not in x:
                continue
            o, pl, pg, pr = x["ours"], x[f"{name}_layer"], x[f"{name}_gemms"], x[f"{name}_routing"]
            lines.append(f"| {tokens} | {x['bytes_per_layer'] / 1e6:.0f} | {pl['us_per_layer']:.1f} | "
                         f"{pg['us_per_layer']:.1f} | {pr['us_per_layer']:.1f} | **{o['us_per_layer']:.1f}** | "
                         f"{o['us_per_layer'] / pl['us_per_layer']:.2f} | {o['us_per_layer'] / pg['us_per_layer']:.2f} | "
                         f"{o['GBps']:.0f} ({o['pct_hbm']:.0f}%) | {pg['GBps']:.0f} ({pg['pct_hbm']:.0f}%) |")
    labels = sorted({c for x in r["per_T"].values() for c in x if c.startswith("ours@")})
    if labels:
        lines += ["", "Ours, other configs in the same loop (" + "; ".join(
            f"{c}: {r.get('variants', {}).get(c[5:], '')}" for c in labels) + "):", "",
            "| T | ours µs (% HBM) | " + " | ".join(f"{c} µs (% HBM, ÷ ours{', ÷ ' + names[0] + ' layer' if names else ''})"
                                                     for c in labels) + " |",
            "|---|---|" + "---|" * len(labels)]
        for tokens, x in r["per_T"].items():
            o = x["ours"]
            peer = x.get(f"{names[0]}_layer") if names else None
            cells = [f"{x[c]['us_per_layer']:.1f} ({x[c]['pct_hbm']:.0f}%, {x[c]['us_per_layer'] / o['us_per_layer']:.3f}"
                     + (f", {x[c]['us_per_layer'] / peer['us_per_layer']:.2f}" if peer else "") + ")"
                     for c in labels if c in x]
            lines.append(f"| {tokens} | {o['us_per_layer']:.1f} ({o['pct_hbm']:.0f}%) | " + " | ".join(cells) + " |")
    if "offload" in r:
        off = r["offload"]
        lines += ["", f"Offload headline against matmul_ogs ({r['args']['offload_layers']} layers; host bytes: peer "
                  f"{off['host_bytes_peer'] / GB:.2f} GB = first {r['args']['offload_cold_layers']} layers, ours "
                  f"{off['host_bytes_ours'] / GB:.2f} GB = least-used experts of every layer):", "",
                  "| T | peer, 3 layers pinned (ms/step) | ours usage-aware (ms/step) | peer ÷ ours |", "|---|---|---|---|"]
        for tokens, x in off["per_T"].items():
            lines.append(f"| {tokens} | {x['peer_offload_ms']:.2f} | {x['ours_usage_aware_ms']:.2f} | **{x['ratio']:.2f}×** |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
