#!/usr/bin/env python3
"""The residency runtime's expert layers per format against vLLM 0.33's own kernel for that format,
side by side in one run, at real geometry:

* ``gptoss-mxfp4`` — gpt-oss-120b (hidden 2,880, intermediate 2,880, 128 experts, top-4; MXFP4 with
  bf16 biases, interleaved gate/up, SwiGLU-OAI 1.702 / 7.0): ours ``TritonMxfp4Experts(activation=
  "swigluoai")`` against ``matmul_ogs`` from the ``triton_kernels`` vendored in the wheel, driven by
  vLLM's glue (``bench/peer_moe.py``: ``_swizzle_mxfp4``, ``make_routing_data``,
  ``triton_kernel_fused_experts`` with fp32 biases, as ``gpt_oss_triton_kernels_moe.py`` runs it);
* ``qwen3-bf16`` — Qwen3-30B-A3B (2,048 / 768, 128 experts, top-8, BF16, SiLU): ours
  ``TritonDenseExperts`` against vLLM's Triton ``fused_moe_kernel``;
* ``dsv3-fp8`` — DeepSeek-V3 (7,168 / 2,048, 256 experts, top-8, FP8 E4M3 with 128x128 fp32 block
  scales, W8A8 with per-token-group activation scales): ours ``TritonDenseExperts(expert_format=
  "fp8-block")`` against ``fused_moe_kernel`` with ``use_fp8_w8a8`` and vLLM's Triton
  ``_per_token_group_quant_fp8``.

vLLM's Triton kernels are cut out of the unpacked 0.33.0 wheel at run time by the AST (``--vllm-src``;
nothing is copied into this repository): ``fused_moe.py`` ``fused_moe_kernel``,
``write_zeros_to_output``, ``invoke_fused_moe_triton_kernel``, ``get_default_config``;
``fused_moe/utils.py`` ``enable_swap_ab``; ``quantization/utils/fp8_utils.py``
``_per_token_group_quant_fp8``. The tile config is vLLM's: the tuned
``configs/E=..,N=..,device_name=NVIDIA_H200.json`` when found in ``--peer-configs`` (the unpacked
wheel here has none; the Qwen3 one is vLLM's public file), else vLLM's own ``get_default_config``
(what vLLM runs without a file). vLLM's CUDA ops around the two GEMMs (``moe_align_block_size``,
``silu_and_mul``, ``moe_sum``) are not in the wheel's Python; torch stand-ins take their place and
are timed only in ``peer layer``, so ``peer GEMMs`` (vLLM's Triton launches alone, on expert
assignment prepared in a separate graph) is the peer's floor.

Cases per T ∈ ``--tokens`` (a CUDA graph over ``--layers`` layers, routing redrawn every step from a
skewed per-layer popularity, order of the cases flipped every step):
``all_hbm`` (ours, every expert in HBM), ``positional`` (ours, the last ``--cold-layers`` layers
entirely in pinned host memory read in place, what ``--cpu-offload-gb`` does), ``usage_aware`` (ours,
the same host bytes as the least-used experts of every layer), ``peer`` (all in HBM),
``peer_positional`` (the peer with the same layers in pinned host memory, read in place).
Bytes = unique experts touched per layer × bytes per expert; % of the HBM read limit and the
usage-aware floor (hot bytes / HBM read + cold bytes / pinned read, both measured in the same run).

Checks (reported, and the run exits 1 if one fails): at every T the positional and usage-aware
outputs equal all-HBM bit for bit (``torch.equal``); at T=6 ours and the peer against the torch
reference of ``core.formats_ref`` (relative L2).

CPU (``--device cpu``, tiny geometry, ``TRITON_INTERPRET=1`` set here): our side and the bf16/fp8
peer run interpreted, timings meaningless; it checks the harness and our outputs (the interpreter
gets ``tl.dot`` on bf16 tiles wrong and has no FP8 type, so the peer's interpreted outputs are
reported, not checked; in fp16 the same peer glue matched a torch layer within 5e-4).
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
from dataclasses import dataclass
from pathlib import Path

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"   # before Triton is imported

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "bench"))

from expert_residency.core.banks import ExpertBank, ResidentLayer, build_unsplit_layer  # noqa: E402
from expert_residency.core.formats_ref import (  # noqa: E402
    deinterleave_gate_up,
    float_per_pick,
    fp8_block_per_pick,
    gptoss_mxfp4_per_pick,
)
from expert_residency.core.split import residency_forward  # noqa: E402
from expert_residency.gpu.dense_experts import (  # noqa: E402
    DenseKernelConfig,
    TritonDenseExperts,
    default_config,
    dense_bytes_per_expert,
)
from expert_residency.gpu.experts import ExpertShape, KernelConfig, TritonMxfp4Experts, config_for_shape  # noqa: E402

GB = 1e9


@dataclass(frozen=True)
class Format:
    key: str
    title: str
    hidden: int
    inter: int
    experts: int
    top_k: int
    kind: str          # mxfp4 | bf16 | fp8-block
    layers: int        # per timed graph (enough that one step's experts overflow the 60 MB L2)
    source: str


# Geometry: recipegen/catalog/models/{gpt-oss-120b,qwen3-30b-a3b,deepseek-v3}.yaml (the models'
# public config.json: hidden_size, intermediate/moe_intermediate_size, experts, experts per token).
FORMATS = {f.key: f for f in (
    Format("gptoss-mxfp4", "gpt-oss-120b MXFP4 + biases, SwiGLU-OAI", 2880, 2880, 128, 4, "mxfp4", 4,
           "triton_kernels matmul_ogs (vLLM 0.33 TRITON MXFP4 backend glue)"),
    Format("qwen3-bf16", "Qwen3-30B-A3B BF16, SiLU", 2048, 768, 128, 8, "bf16", 4,
           "vLLM 0.33 Triton fused_moe_kernel"),
    Format("dsv3-fp8", "DeepSeek-V3 FP8 E4M3 128x128 blocks, SiLU", 7168, 2048, 256, 8, "fp8-block", 2,
           "vLLM 0.33 Triton fused_moe_kernel, use_fp8_w8a8, block [128, 128]"),
)}
TINY = {"gptoss-mxfp4": (256, 128, 8, 2), "qwen3-bf16": (256, 128, 8, 2), "dsv3-fp8": (256, 256, 8, 2)}


def bytes_per_expert(f: Format) -> int:
    h, i = f.hidden, f.inter
    if f.kind == "mxfp4":   # packed values + ue8m0 scales of w13 and w2, bf16 biases (2I + H)
        return 2 * i * (h // 2 + h // 32) + h * (i // 2 + i // 32) + 2 * (2 * i + h)
    return dense_bytes_per_expert(ExpertShape(h, i), f.kind)


# -- vLLM's fused_moe Triton kernels, cut out of the wheel ----------------------------------------

_FUSED_FUNCS = {
    "model_executor/layers/fused_moe/fused_moe.py":
        ("write_zeros_to_output", "fused_moe_kernel", "invoke_fused_moe_triton_kernel", "get_default_config"),
    "model_executor/layers/fused_moe/utils.py": ("enable_swap_ab",),
    "model_executor/layers/quantization/utils/fp8_utils.py": ("_per_token_group_quant_fp8",),
}

_FUSED_HEADER = '''from __future__ import annotations
from typing import Any
import functools
import logging
import torch
import triton
import triton.language as tl
logger = logging.getLogger("vllm-fused-moe-glue")


class _Envs:  # vllm.envs defaults
    VLLM_BATCH_INVARIANT = False
    VLLM_TRITON_USE_TD = None


envs = _Envs()


class _Platform:  # vLLM's current_platform on a CUDA compute-capability-9.0 device
    def is_cuda(self): return True
    def is_rocm(self): return False
    def is_xpu(self): return False
    def is_cuda_alike(self): return True
    def is_device_capability(self, cap): return cap == 90
    def has_device_capability(self, cap): return cap <= 90


current_platform = _Platform()
def resolve_moe_use_td(): return False      # VLLM_TRITON_USE_TD unset on CUDA
def warn_if_moe_use_td_ineffective(*a, **k): return None
def set_triton_allocator(device): return None
def should_moe_wna16_use_cuda(*a, **k): return False
next_power_of_2 = triton.next_power_of_2
'''


def load_fused_moe(vllm_src: Path):
    parts, cited = [_FUSED_HEADER], {}
    for rel, names in _FUSED_FUNCS.items():
        path = vllm_src / rel
        text = path.read_text()
        found = {n.name: n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name in names}
        missing = set(names) - set(found)
        if missing:
            raise SystemExit(f"{path}: vLLM functions {sorted(missing)} not found (another vLLM version?)")
        lines = text.splitlines()
        for name in names:
            node = found[name]
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            parts.append("\n".join(lines[first - 1:node.end_lineno]))
            cited[name] = f"{rel}:{first}"
    fd, tmp = tempfile.mkstemp(prefix="vllm_fused_moe_", suffix=".py")
    with os.fdopen(fd, "w") as fh:
        fh.write("\n\n\n".join(parts) + "\n")
    spec = importlib.util.spec_from_file_location("vllm_fused_moe_glue", tmp)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.CITED = cited
    return mod


def peer_config(glue, f: Format, m: int, config_dir: Path | None) -> tuple[dict, str]:
    """vLLM's ``try_get_optimal_moe_config``: the tuned file's nearest batch size, else its default."""
    dtype = "fp8_w8a8" if f.kind == "fp8-block" else None
    block = [128, 128] if f.kind == "fp8-block" else None
    name = (f"E={f.experts},N={f.inter},device_name=NVIDIA_H200"
            + (f",dtype={dtype}" if dtype else "") + (",block_shape=[128,128]" if block else "") + ".json")
    if config_dir is not None and (config_dir / name).is_file():
        table = {int(k): v for k, v in json.loads((config_dir / name).read_text()).items() if k != "triton_version"}
        return dict(table[min(table, key=lambda x: abs(x - m))]), name
    return glue.get_default_config(m, f.experts, f.inter, f.hidden, f.top_k, dtype, block), "get_default_config"


def align_stand_in(ids: torch.Tensor, block_m: int, experts: int, naive: bool):
    """Torch stand-in for vLLM's CUDA ``moe_align_block_size`` (or the naive assignment of
    ``_prepare_expert_assignment``): each expert's picks padded to a multiple of ``block_m`` (pad id
    = number of picks), one expert id per block; fixed shapes, no host sync."""
    flat = ids.reshape(-1).to(torch.int64)
    p = flat.numel()
    if naive:
        return None, flat.to(torch.int32), torch.full((1,), p * block_m, dtype=torch.int32, device=ids.device)
    max_len = p + experts * (block_m - 1)
    counts = torch.zeros(experts, dtype=torch.int64, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat * p + torch.arange(p, device=ids.device))
    sorted_e = flat[order]
    first = torch.cumsum(counts, 0) - counts
    dest = starts[sorted_e] + torch.arange(p, device=ids.device) - first[sorted_e]
    sorted_ids = torch.full((max_len,), p, dtype=torch.int32, device=ids.device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    blocks = torch.arange(0, max_len, block_m, device=ids.device)
    expert_ids = torch.searchsorted(ends, blocks, right=True).clamp(max=experts - 1).to(torch.int32)
    return sorted_ids, expert_ids, ends[-1:].to(torch.int32)


class FusedMoePeer:
    """vLLM's Triton fused_moe on one layer (``fused_experts_impl``'s sequence of calls)."""

    def __init__(self, glue, f: Format, tensors: dict, max_tokens: int, config_dir: Path | None) -> None:
        self.glue, self.f = glue, f
        self.fp8 = f.kind == "fp8-block"
        self.w1, self.w2 = tensors["w13_weight"], tensors["w2_weight"]
        self.s1 = tensors.get("w13_weight_scale_inv")
        self.s2 = tensors.get("w2_weight_scale_inv")
        self.config_dir = config_dir
        dev = self.w1.device
        p = max_tokens * f.top_k
        act = torch.float16 if self.w1.dtype == torch.float16 else torch.bfloat16
        self.cache1 = torch.empty(p, 2 * f.inter, dtype=act, device=dev)
        self.cache2 = torch.zeros(p, f.inter, dtype=act, device=dev)
        self.cache3 = torch.empty(p, f.hidden, dtype=act, device=dev)
        self.q2 = torch.zeros(p, f.inter, dtype=torch.float8_e4m3fn, device=dev) if self.fp8 else None
        self.q2s = torch.ones(p, f.inter // 128, dtype=torch.float32, device=dev) if self.fp8 else None
        self.host_resident = False

    def config(self, t: int) -> tuple[dict, str]:
        return peer_config(self.glue, self.f, t, self.config_dir)

    def quant(self, a: torch.Tensor, out_q=None, out_s=None):
        """vLLM's Triton fallback of ``per_token_group_quant_fp8`` (group 128, row-major scales)."""
        m, n = a.shape
        q = out_q if out_q is not None else torch.empty(m, n, dtype=torch.float8_e4m3fn, device=a.device)
        s = out_s if out_s is not None else torch.empty(m, n // 128, dtype=torch.float32, device=a.device)
        finfo = torch.finfo(torch.float8_e4m3fn)
        self.glue._per_token_group_quant_fp8[(m * n // 128,)](
            a, q, s, 128, n, a.stride(0), 1e-10, fp8_min=finfo.min, fp8_max=finfo.max, use_ue8m0=False,
            BLOCK=128, num_warps=1, num_stages=1)
        return q, s

    def assignment(self, ids: torch.Tensor, t: int):
        cfg, _ = self.config(t)
        naive = (not self.host_resident) and t * self.f.top_k * 4 <= self.f.experts
        return align_stand_in(ids, cfg["BLOCK_SIZE_M"], self.f.experts, naive)

    def gemm(self, which: int, a, a_s, out, weights, assign, t: int) -> None:
        import triton.language as tl
        sorted_ids, expert_ids, ntpp = assign
        cfg, _ = self.config(t)
        k = self.f.top_k
        # C is [T, K, N] for both GEMMs (fused_experts_impl's intermediate_cache1 / _cache3).
        self.glue.invoke_fused_moe_triton_kernel(
            a, self.w1 if which == 1 else self.w2, out.view(t, k, -1),
            a_s, (self.s1 if which == 1 else self.s2), weights, sorted_ids, expert_ids, ntpp,
            which == 2, k if which == 1 else 1, cfg,
            tl.float16 if self.cache1.dtype == torch.float16 else tl.bfloat16,   # vLLM: hidden_states.dtype
            self.fp8, False, False, False, False,
            block_shape=[128, 128] if self.fp8 else None)

    def gemms(self, x, x_q, x_s, weights, assign, t: int) -> None:
        """The two vLLM Triton launches alone (gemm2 reads the previous step's activation)."""
        k = self.f.top_k
        self.gemm(1, x_q if self.fp8 else x, x_s, self.cache1[:t * k], weights, assign, t)
        a2 = self.q2[:t * k] if self.fp8 else self.cache2[:t * k]
        self.gemm(2, a2, self.q2s[:t * k] if self.fp8 else None, self.cache3[:t * k], weights, assign, t)

    def layer(self, x, weights, ids, out) -> torch.Tensor:
        t, k = ids.shape
        assign = self.assignment(ids, t)
        x_q, x_s = self.quant(x) if self.fp8 else (x, None)
        self.gemm(1, x_q, x_s, self.cache1[:t * k], weights, assign, t)
        g = self.cache1[:t * k]
        self.cache2[:t * k] = torch.nn.functional.silu(g[:, :self.f.inter]) * g[:, self.f.inter:]  # stand-in
        if self.fp8:
            self.quant(self.cache2[:t * k], self.q2[:t * k], self.q2s[:t * k])
            a2, a2s = self.q2[:t * k], self.q2s[:t * k]
        else:
            a2, a2s = self.cache2[:t * k], None
        self.gemm(2, a2, a2s, self.cache3[:t * k], weights, assign, t)
        torch.sum(self.cache3[:t * k].view(t, k, -1), dim=1, out=out)   # stand-in for ops.moe_sum
        return out

    def to_pinned(self, owners: list) -> None:
        for name in ("w1", "w2", "s1", "s2"):
            t = getattr(self, name)
            if t is not None:
                view, owner = pinned_tensor(t)
                owners.append(owner)
                setattr(self, name, view)
        self.host_resident = True   # vLLM then groups each expert's tokens (no naive assignment)


class GptossPeer:
    """vLLM's TRITON MXFP4 backend on one gpt-oss layer (biases fp32, rows as the checkpoint)."""

    def __init__(self, peer_moe, glue, ckpt: dict) -> None:
        gate_first = {n: ckpt[n].clone() for n in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")}
        deinterleave_gate_up(gate_first)   # peer_moe.Peer interleaves gate-first rows back
        self.peer = peer_moe.Peer(glue, gate_first)
        self.peer.quant.w1_bias = ckpt["w13_bias"].float().contiguous()
        self.peer.quant.w2_bias = ckpt["w2_bias"].float().contiguous()

    def layer(self, x, weights, ids, out):
        return self.peer.gemms(x, self.peer.routing(ids, weights), out, ids.shape[1])


# -- layers, banks, routing --------------------------------------------------------------------------

def pinned_tensor(t: torch.Tensor):
    if t.device.type != "cuda":
        c = t.clone()
        return c, c
    from expert_residency.gpu.pinned import PinnedRegion
    region = PinnedRegion(tuple(t.shape), t.dtype, t.device)
    region.host.copy_(t)
    return region.view, region


def random_layer(f: Format, gen: torch.Generator, dev: torch.device) -> dict[str, torch.Tensor]:
    e, h, i = f.experts, f.hidden, f.inter
    out: dict[str, torch.Tensor] = {}
    if f.kind == "mxfp4":
        for name, shape in (("w13_weight", (e, 2 * i, h // 2)), ("w13_weight_scale", (e, 2 * i, h // 32)),
                            ("w2_weight", (e, h, i // 2)), ("w2_weight_scale", (e, h, i // 32))):
            t = torch.empty(shape, dtype=torch.uint8, device=dev)
            # scales 2^-9..2^-4: gate/up products of a few units, so the 7.0 clamp bites sometimes
            (t.random_(118, 124, generator=gen) if name.endswith("scale") else t.random_(0, 256, generator=gen))
            out[name] = t
        out["w13_bias"] = (torch.randn(e, 2 * i, generator=gen, device=dev) * 0.5).to(torch.bfloat16)
        out["w2_bias"] = (torch.randn(e, h, generator=gen, device=dev) * 0.2).to(torch.bfloat16)
        return out
    fp8 = f.kind == "fp8-block"
    for name, (rows, cols) in (("w13_weight", (2 * i, h)), ("w2_weight", (h, i))):
        w = torch.empty(e, rows, cols, dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16, device=dev)
        for a in range(0, e, 16):   # chunks: a DeepSeek-V3 layer is 11 GB
            chunk = torch.randn(min(16, e - a), rows, cols, generator=gen, device=dev)
            w[a:a + 16] = chunk if fp8 else (chunk / cols ** 0.5)
        out[name] = w
        if fp8:
            s = torch.rand(e, rows // 128, cols // 128, generator=gen, device=dev) + 0.5
            out[name + "_scale_inv"] = (s / cols ** 0.5).float()
    return out


def popularity(experts: int, layers: int, seed: int) -> np.ndarray:
    """p[layer, expert]: exp(-4.94·(r/E)^1.01) over a seeded per-layer permutation (the skew of
    bench/gpu_residency.py)."""
    rng = np.random.default_rng(seed)
    base = np.exp(-4.94 * (np.arange(experts) / experts) ** 1.01)
    base /= base.sum()
    p = np.empty((layers, experts))
    for layer in range(layers):
        p[layer, rng.permutation(experts)] = base
    return p


def sample_routing(p: np.ndarray, steps: int, tokens: int, k: int, seed: int, dev):
    gen = torch.Generator(device=dev).manual_seed(seed)
    probs = torch.tensor(p, dtype=torch.float32, device=dev)
    layers, experts = p.shape
    ids = torch.empty(steps, layers, tokens, k, dtype=torch.int64, device=dev)
    for layer in range(layers):
        draws = torch.multinomial(probs[layer].expand(steps * tokens, experts).contiguous(), k,
                                  replacement=False, generator=gen)
        ids[:, layer] = draws.view(steps, tokens, k)
    weights = torch.softmax(torch.randn(steps, layers, tokens, k, generator=gen, device=dev), dim=-1)
    return ids, weights


def bank_of(tensors: dict, rows: list[int] | None, owners: list) -> ExpertBank:
    out = {}
    for name, t in tensors.items():
        src = t if rows is None else t[torch.tensor(rows, device=t.device)]
        out[name], owner = pinned_tensor(src)
        owners.append(owner)
    n = next(iter(tensors.values())).shape[0] if rows is None else len(rows)
    return ExpertBank(out, n)


def build_cases(kernel_tensors: list[dict], p: np.ndarray, cold_layers: int, dev) -> tuple[dict, dict, list]:
    layers, experts = p.shape
    cold_per_layer = experts * cold_layers // layers
    cases = {"all_hbm": [], "positional": [], "usage_aware": []}
    cold_sets = {c: [] for c in cases}
    owners: list = []
    for layer, tensors in enumerate(kernel_tensors):
        unsplit = build_unsplit_layer(tensors, layer_index=layer)
        cases["all_hbm"].append(unsplit)
        cold_sets["all_hbm"].append(set())
        empty = ExpertBank({n: t[:0] for n, t in tensors.items()}, 0)
        if layer >= layers - cold_layers:
            ids = list(range(experts))
            codes = torch.tensor([-r - 1 for r in ids], dtype=torch.int32, device=dev)
            cases["positional"].append(ResidentLayer(layer, experts, empty, bank_of(tensors, None, owners),
                                                     [], ids, codes))
            cold_sets["positional"].append(set(ids))
        else:
            cases["positional"].append(unsplit)
            cold_sets["positional"].append(set())
        order = np.argsort(-p[layer], kind="stable")
        hot = sorted(order[:experts - cold_per_layer].tolist())
        cold = sorted(order[experts - cold_per_layer:].tolist())
        codes = torch.arange(experts, dtype=torch.int32)
        for r, e in enumerate(cold):
            codes[e] = -r - 1
        # Hot expert e is read from row e of the all-HBM tensors; cold expert cold[r] from row r.
        cases["usage_aware"].append(ResidentLayer(layer, experts, ExpertBank(dict(tensors), experts),
                                                  bank_of(tensors, cold, owners), hot, cold, codes.to(dev)))
        cold_sets["usage_aware"].append(set(cold))
    return cases, cold_sets, owners


# -- timing ------------------------------------------------------------------------------------------

class Step:
    """``fn()`` captured in a CUDA graph on CUDA (warmed up on a side stream), eager on CPU."""

    def __init__(self, fn, cuda: bool) -> None:
        self.fn, self.graph = fn, None
        if cuda:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
                fn()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                fn()
        else:
            fn()

    def __call__(self) -> None:
        self.graph.replay() if self.graph is not None else self.fn()


def seconds(fn, cuda: bool) -> float:
    if not cuda:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3


def hbm_read_gbps(cuda: bool) -> float:
    """The HBM read limit over gpu_residency's 4 GB buffer (one small model's expert tensor read low)."""
    if not cuda:
        return float("nan")
    import gpu_residency as gr
    return gr.hbm_read_limit()["GBps"]


def read_gbps(buf: torch.Tensor, cuda: bool) -> float:
    if not cuda:
        return float("nan")
    import gpu_residency as gr
    return gr.read_bandwidth(buf, 10)["GBps"]


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def reference_fn(f: Format):
    if f.kind == "mxfp4":
        return gptoss_mxfp4_per_pick()
    return fp8_block_per_pick() if f.kind == "fp8-block" else float_per_pick()


def run_format(f: Format, args, dev, fused_glue, mx_glue) -> dict:
    cuda = dev.type == "cuda"
    shape = ExpertShape(f.hidden, f.inter)
    max_tokens = max(6, max(args.tokens))
    if f.kind == "mxfp4":
        if cuda:
            import gpu_residency as gr  # as hbm_read_gbps: its config parser checks the compiled tiles
            base = gr.parse_config(args.mxfp4_config)
        else:
            base = KernelConfig(block_m=4)
        ex = TritonMxfp4Experts(shape, f.experts, f.top_k, max_tokens, dev, config_for_shape(shape, base),
                                activation="swigluoai")
    else:
        cfg = default_config(f.kind) if cuda else DenseKernelConfig(block_m=4, block_n1=32, block_n2=64)
        ex = TritonDenseExperts(shape, f.experts, f.top_k, max_tokens, dev, cfg, expert_format=f.kind)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    t0 = time.perf_counter()
    ckpts, kernel, peers = [], [], []
    for layer in range(f.layers):
        ckpt = random_layer(f, gen, dev)
        if f.kind == "mxfp4":
            peers.append(GptossPeer(mx_glue[0], mx_glue[1], ckpt) if mx_glue else None)
            kt = {n: t.clone() for n, t in ckpt.items()}
            ex.to_kernel_layout(kt)   # de-interleave + MMA order: ours is a second copy
            kernel.append(kt)
            ckpts.append(ckpt if layer == 0 else None)
        else:
            peers.append(FusedMoePeer(fused_glue, f, ckpt, max_tokens, args.peer_configs) if fused_glue else None)
            kernel.append(ckpt)      # the dense kernels read vLLM's layout: shared with the peer
            ckpts.append(ckpt if layer == 0 else None)
    p = popularity(f.experts, f.layers, args.seed)
    cases, cold_sets, owners = build_cases(kernel, p, args.cold_layers, dev)
    build_s = time.perf_counter() - t0
    per_expert = bytes_per_expert(f)
    res = {"format": f.title, "geometry": dict(hidden=f.hidden, intermediate=f.inter, experts=f.experts,
                                                 top_k=f.top_k, layers=f.layers),
           "bytes_per_expert": per_expert, "ours": getattr(ex.config, "describe", lambda: "")(),
           "peer": f.source, "build_s": build_s, "per_T": {}, "equal": {}, "check": {}}
    res["hbm_GBps"] = hbm_read_gbps(cuda)
    cold_view = cases["usage_aware"][0].cold.tensors["w13_weight"]
    res["pinned_GBps"] = read_gbps(cold_view, cuda)

    # Outputs vs the torch reference (layer 0, T=6, checkpoint layout).
    cg = torch.Generator(device=dev).manual_seed(args.seed + 11)
    t6 = 6
    x = torch.randn(t6, f.hidden, generator=cg, device=dev).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(f.experts, generator=cg, device=dev)[:f.top_k] for _ in range(t6)])
    w = torch.softmax(torch.randn(t6, f.top_k, generator=cg, device=dev), -1)
    ref = residency_forward(build_unsplit_layer(ckpts[0], layer_index=0), x, w, ids, reference_fn(f),
                            pick_dtype=torch.bfloat16)
    res["check"]["ours_vs_ref_rel_l2"] = rel_l2(ex.forward(cases["all_hbm"][0], x, w, ids), ref)
    res["check"]["ours_usage_aware_vs_ref_rel_l2"] = rel_l2(ex.forward(cases["usage_aware"][0], x, w, ids), ref)
    if peers[0] is not None:
        out = torch.empty(t6, f.hidden, dtype=torch.bfloat16, device=dev)
        res["check"]["peer_vs_ref_rel_l2"] = rel_l2(peers[0].layer(x, w, ids, out), ref)
    del ckpts, ref
    print(f.key, "check", json.dumps(res["check"]), flush=True)
    steps_for = dict(args.steps)
    for tokens in args.tokens:
        steps = steps_for.get(tokens, 8) if cuda else 1
        ids_all, w_all = sample_routing(p, steps, tokens, f.top_k, args.seed + tokens, dev)
        xg = torch.Generator(device=dev).manual_seed(args.seed + 3 * tokens)
        xs = torch.randn(f.layers, tokens, f.hidden, generator=xg, device=dev).to(torch.bfloat16)
        ids_buf, w_buf = ids_all[0].clone(), w_all[0].clone()
        outs = {c: torch.empty(f.layers, tokens, f.hidden, dtype=torch.bfloat16, device=dev) for c in cases}

        def ours(case):
            def step():
                for l in range(f.layers):
                    ex.forward(cases[case][l], xs[l], w_buf[l], ids_buf[l], out=outs[case][l])
            return step

        runs = {c: Step(ours(c), cuda) for c in cases}
        if peers[0] is not None:
            out_peer = torch.empty(f.layers, tokens, f.hidden, dtype=torch.bfloat16, device=dev)

            def peer_layer():
                for l in range(f.layers):
                    peers[l].layer(xs[l], w_buf[l], ids_buf[l], out_peer[l])
            runs["peer"] = Step(peer_layer, cuda)
            if isinstance(peers[0], FusedMoePeer):
                assign = {}
                quant = {}

                def prep():
                    for l in range(f.layers):
                        assign[l] = peers[l].assignment(ids_buf[l], tokens)
                        quant[l] = peers[l].quant(xs[l]) if peers[l].fp8 else (xs[l], None)
                prep_step = Step(prep, cuda)
                prep_step()

                def peer_gemms():
                    for l in range(f.layers):
                        peers[l].gemms(xs[l], quant[l][0], quant[l][1], w_buf[l], assign[l], tokens)
                runs["peer_gemms"] = Step(peer_gemms, cuda)
        times = {c: [] for c in runs}
        nbytes = {c: [] for c in cases}
        equal = True
        order = list(runs.items())
        for s in range(steps):
            ids_buf.copy_(ids_all[s])
            w_buf.copy_(w_all[s])
            if "peer_gemms" in runs:
                prep_step()
            for case, fn in (order if s % 2 == 0 else order[::-1]):
                times[case].append(seconds(fn, cuda))
            equal &= all(torch.equal(outs[c], outs["all_hbm"]) for c in ("positional", "usage_aware"))
            for c in cases:
                hot = cold = 0
                for l in range(f.layers):
                    u = set(torch.unique(ids_all[s, l]).tolist())
                    nc = len(u & cold_sets[c][l])
                    cold += nc * per_expert
                    hot += (len(u) - nc) * per_expert
                nbytes[c].append((hot, cold))
        if cuda:
            torch.cuda.synchronize()
        row = {"steps": steps, "split_equals_all_hbm": bool(equal)}
        for case, ts in times.items():
            med = statistics.median(ts)
            hc = nbytes.get(case, nbytes["all_hbm"])
            hot = statistics.fmean(h for h, _ in hc)
            cold = statistics.fmean(c for _, c in hc)
            entry = {"us_per_layer": med / f.layers * 1e6, "bytes_per_layer": (hot + cold) / f.layers,
                     "GBps": (hot + cold) / med / GB}
            if cuda:
                entry["pct_hbm"] = 100 * (hot + cold) / med / (res["hbm_GBps"] * GB)
                floor = hot / (res["hbm_GBps"] * GB) + cold / (res["pinned_GBps"] * GB)
                entry["x_floor"] = med / floor
            row[case] = entry
        res["per_T"][tokens] = row
        res["equal"][tokens] = bool(equal)
        print(f.key, json.dumps({"T": tokens, "equal": equal,
                                 **{c: round(v["us_per_layer"], 1) for c, v in row.items() if isinstance(v, dict)}}),
              flush=True)
        del runs
    # The peer with the positional case's layers in pinned host memory, read in place.
    if cuda and peers[0] is not None and args.cold_layers:
        pin_owners: list = []
        for l in range(f.layers - args.cold_layers, f.layers):
            if isinstance(peers[l], FusedMoePeer):
                peers[l].to_pinned(pin_owners)
            else:
                pin_owners += peers[l].peer.to_pinned()
        for tokens in args.tokens:
            steps = min(steps_for.get(tokens, 8), 6)
            ids_all, w_all = sample_routing(p, steps, tokens, f.top_k, args.seed + tokens, dev)
            xs = torch.randn(f.layers, tokens, f.hidden, generator=torch.Generator(device=dev).manual_seed(1),
                             device=dev).to(torch.bfloat16)
            ids_buf, w_buf = ids_all[0].clone(), w_all[0].clone()
            out_peer = torch.empty(f.layers, tokens, f.hidden, dtype=torch.bfloat16, device=dev)

            def peer_pos():
                for l in range(f.layers):
                    peers[l].layer(xs[l], w_buf[l], ids_buf[l], out_peer[l])
            g = Step(peer_pos, cuda)
            ts = []
            for s in range(steps):
                ids_buf.copy_(ids_all[s])
                w_buf.copy_(w_all[s])
                ts.append(seconds(g, cuda))
            res["per_T"][tokens]["peer_positional"] = {"us_per_layer": statistics.median(ts) / f.layers * 1e6}
            del g
        del pin_owners
    del cases, kernel, peers, owners, ex
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return res


def markdown(results: dict) -> str:
    env = results["env"]
    lines = [f"GPU: {env.get('gpu')}, torch {env['torch']}, triton {env['triton']}; vLLM glue: "
             + ", ".join(f"`{k}` {v}" for k, v in env.get("glue", {}).items()), ""]
    for key, err in results.get("errors", {}).items():
        lines += [f"**{key} failed**: {err}", ""]
    for r in results["formats"].values():
        g = r["geometry"]
        lines += [f"### {r['format']} — H {g['hidden']}, I {g['intermediate']}, {g['experts']} experts, "
                  f"top-{g['top_k']}, {g['layers']} layers per graph, {r['bytes_per_expert']:,} B per expert", "",
                  f"ours: {r['ours']}; peer: {r['peer']}; HBM read {r['hbm_GBps']:.0f} GB/s, pinned read "
                  f"{r['pinned_GBps']:.1f} GB/s (same run); outputs: "
                  + ", ".join(f"{k} {v:.2e}" for k, v in r["check"].items()), ""]
        has_gemms = any("peer_gemms" in x for x in r["per_T"].values())
        head = ["T", "MB/layer", "ours all-HBM µs (% HBM)", "peer µs (% HBM)"]
        head += ["peer GEMMs µs"] if has_gemms else []
        head += ["ours ÷ peer", "ours positional µs", "peer positional µs", "ours usage-aware µs (× floor)",
                 "split == all-HBM"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for t, x in r["per_T"].items():
            a, pe = x["all_hbm"], x.get("peer")
            cells = [str(t), f"{a['bytes_per_layer'] / 1e6:.0f}", f"**{a['us_per_layer']:.1f}** ({a.get('pct_hbm', 0):.0f}%)"]
            cells.append(f"{pe['us_per_layer']:.1f} ({pe.get('pct_hbm', 0):.0f}%)" if pe else "—")
            if has_gemms:
                cells.append(f"{x['peer_gemms']['us_per_layer']:.1f}" if "peer_gemms" in x else "—")
            cells.append(f"{a['us_per_layer'] / pe['us_per_layer']:.2f}" if pe else "—")
            cells.append(f"{x['positional']['us_per_layer']:.1f}")
            pp = x.get("peer_positional")
            cells.append(f"{pp['us_per_layer']:.1f}" if pp else "—")
            u = x["usage_aware"]
            cells.append(f"{u['us_per_layer']:.1f} ({u.get('x_floor', float('nan')):.2f}×)")
            cells.append("yes" if x["split_equals_all_hbm"] else "**NO**")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--tokens", default="1,6,16,96")
    ap.add_argument("--steps", default="1:20,6:16,16:12,96:8")
    ap.add_argument("--cold-layers", type=int, default=1)
    ap.add_argument("--vllm-src", default=str(ROOT / ".cache/vllm-0.33.0/vllm"))
    ap.add_argument("--peer-configs", default=str(ROOT / ".cache/fused_moe_configs"),
                    help="folder with vLLM's tuned fused_moe JSON files (optional)")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--mxfp4-config", default="",
                    help="KernelConfig fields for our MXFP4 layers, e.g. gw_max_tokens=48 (CUDA; the geometry's tiles still apply)")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    args = ap.parse_args()
    args.tokens = [int(t) for t in args.tokens.split(",")]
    args.steps = [tuple(int(v) for v in kv.split(":")) for kv in args.steps.split(",")]
    args.peer_configs = Path(args.peer_configs) if Path(args.peer_configs).is_dir() else None
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    import triton
    env = {"torch": torch.__version__, "triton": triton.__version__,
           "gpu": torch.cuda.get_device_name(0) if cuda else "CPU (TRITON_INTERPRET=1)"}
    vllm_src = Path(args.vllm_src)
    fused_glue = mx_glue = None
    keys = args.formats.split(",")
    if not args.no_peer and any(FORMATS[k].kind != "mxfp4" for k in keys):
        fused_glue = load_fused_moe(vllm_src)
        env["glue"] = dict(fused_glue.CITED)
    if not args.no_peer and cuda and "gptoss-mxfp4" in keys:
        import peer_moe
        g = peer_moe.load_vllm_glue(vllm_src, vllm_src / "third_party")
        mx_glue = (peer_moe, g)
        env.setdefault("glue", {}).update(g.CITED)
    results = {"env": env, "args": {k: str(v) for k, v in vars(args).items()}, "formats": {}}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    ok = True
    for key in keys:
        f = FORMATS[key]
        if not cuda:
            h, i, e, k = TINY[key]
            f = Format(f.key, f.title + " (tiny)", h, i, e, k, f.kind, 2, f.source)
        try:
            r = run_format(f, args, dev, fused_glue, mx_glue)
        except Exception as exc:  # noqa: BLE001 - reported; the other formats still run
            import traceback
            traceback.print_exc()
            results.setdefault("errors", {})[key] = f"{type(exc).__name__}: {str(exc)[:500]}"
            ok = False
            if cuda:
                torch.cuda.empty_cache()
            continue
        results["formats"][key] = r
        tol = 2e-2 if not cuda else (1e-2 if f.kind != "fp8-block" else 3e-2)
        # Interpreted, the peer's numbers are not its own: Triton's CPU interpreter multiplies
        # bf16 tiles wrongly (a 16x16 tl.dot probe: error 2.8e11) and has no FP8 type, so only our
        # side gates a CPU run; compiled, both sides do.
        gating = {k: v for k, v in r["check"].items() if cuda or not k.startswith("peer")}
        ok &= all(r["equal"].values()) and all(v < tol for v in gating.values())
        (out_dir / "format_peer.json").write_text(json.dumps(results, indent=1, default=str))
        (out_dir / "format_peer.md").write_text(markdown(results))
    print(markdown(results), flush=True)
    print("checks", "passed" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
