#!/usr/bin/env python3
"""BF16 and FP8-block (128x128) expert layers against the kernel a stock vLLM 0.33 lane runs for
them on one Hopper GPU, side by side in one run, with the HBM read floor of every step size.

Which peer (vLLM 0.33.0's oracles, BENCHMARKS.md "Which MoE kernel vLLM 0.33 runs"): on compute
capability 9.0 with one GPU or tensor parallelism, ``oracle/fp8.py`` moves TRITON to the front for
128x128 block FP8 (``_get_priority_backends``, "prefer Triton for TP and FI CUTLASS for EP"), and
``oracle/unquantized.py`` moves both FlashInfer entries behind TRITON on the SM90 family. Both
formats therefore run vLLM's Triton ``fused_moe_kernel`` (``TritonExperts``), which is the peer here,
driven by ``format_peer.FusedMoePeer`` exactly as ``bench/format_peer.py`` drives it (vLLM's Triton
kernels cut out of the unpacked 0.33.0 wheel at run time, the tuned H200 JSON where vLLM has one,
vLLM's ``get_default_config`` otherwise). ``peer GEMMs`` is vLLM's two Triton launches alone (the
floor of vLLM's whole layer: its CUDA ops ``moe_align_block_size``, ``silu_and_mul[_per_block_quant]``
and ``moe_sum`` are compiled against torch 2.14 and cannot load beside the H200's torch 2.11);
``peer layer`` adds torch stand-ins for them (an upper bound).

Ours: ``TritonDenseExperts`` under each ``--variants`` config (``VARIANTS``; ``main`` is the
four-launch schedule of the previous release, for the before/after), every expert in HBM
(``all_hbm``) and the same layer with the least-used experts in pinned host memory read in place
(``usage_aware``: a quarter of every layer), which must equal
``all_hbm`` bit for bit at every step. One CUDA graph per case over ``layers`` layers; routing
redrawn every step from a skewed per-layer popularity; case order flipped every step; medians.

Floor: unique experts' bytes of the step / the HBM read rate measured in the same run (a
streaming read of one expert tensor). Checks: relative L2 of ours (each variant) and of the peer
against ``core.formats_ref`` at T = 1 and 6; split == all-HBM bit for bit. Exit 1 if one fails.

CPU (``--device cpu``: tiny geometry, ``TRITON_INTERPRET=1``, timings meaningless) checks the
harness and our outputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"   # before Triton is imported

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "bench"))

import format_peer as fp  # noqa: E402
from expert_residency.core.banks import ExpertBank, ResidentLayer, build_unsplit_layer  # noqa: E402
from expert_residency.core.split import residency_forward  # noqa: E402
from expert_residency.gpu.dense_experts import DenseKernelConfig, TritonDenseExperts, default_config  # noqa: E402
from expert_residency.gpu.experts import ExpertShape  # noqa: E402

GB = 1e9
MAIN = DenseKernelConfig(one_token=False, fuse_finalize=False, pdl=False, fuse_act_quant=False)
# Named configs measured side by side (``main``: the schedule before this change).
VARIANTS = {
    "main": MAIN,
    "t1": DenseKernelConfig(),
    "t1-n128": DenseKernelConfig(block_n1=128),
    "t1-n128-s4": DenseKernelConfig(block_n1=128, num_stages=4),
    "t1-n32": DenseKernelConfig(block_n1_t1=32, block_n2_t1=32),
    "t1-bm32": DenseKernelConfig(block_m_large=32, large_tokens=16),
    "t1-n128-bm32": DenseKernelConfig(block_n1=128, block_m_large=32, large_tokens=16),
    "t1-bm64": DenseKernelConfig(block_m_large=64, large_tokens=16),
    "t1-n128t1": DenseKernelConfig(block_n1_t1=128),
    # Two changes at different T in one config: where only one of them applies the other variant
    # runs the same kernels, so that T reads as a repeat (the run's noise).
    "t1-n32-bm32": DenseKernelConfig(block_n1_t1=32, block_n2_t1=32, block_m_large=32, large_tokens=16),
    "t1-n128t1-bm32": DenseKernelConfig(block_n1_t1=128, block_m_large=32, large_tokens=16),
    # T = 1 pipeline depth, tile height and warps (the T = 1 schedule on 64-row tiles had not been
    # measured on FP8; more weight tiles in flight per program is what a read-bound T = 1 needs)
    "t1-s4": DenseKernelConfig(num_stages_t1=4),
    "t1-s5": DenseKernelConfig(num_stages_t1=5),
    "t1-n32-s4": DenseKernelConfig(block_n1_t1=32, block_n2_t1=32, num_stages_t1=4),
    "t1-w8": DenseKernelConfig(num_warps=8),
    # 32-row tiles at every T: FP8 then multiplies on the warp-level MMA (Triton takes wgmma only
    # for tiles of 64+ rows), whose FP8 products add in fp32 (test_dense_gpu.py)
    "n32": DenseKernelConfig(block_n1=32, block_n2=32),
    "n32-s4": DenseKernelConfig(block_n1=32, block_n2=32, num_stages=4),
    # BF16's default since 2026-12-04: four stages at T = 1, 32-token tiles from T = 64
    "t1-s4-bm32@64": default_config("bf16"),
}
DEFAULT_VARIANTS = {"qwen3-bf16": "main,t1,t1-s4-bm32@64", "dsv3-fp8": "main,t1,n32"}
CPU_VARIANTS = {  # tiny geometry: tiles that divide it (the interpreter wants small tiles)
    "main": dataclasses.replace(MAIN, block_m=4, block_n1=32, block_n2=64),
    "t1": DenseKernelConfig(block_m=4, block_n1=32, block_n2=64),
    "t1-n128": DenseKernelConfig(block_m=4, block_n1=128, block_n2=64),
}


def usage_aware_cases(kernel_tensors: list[dict], p: np.ndarray, cold_fraction: float, dev):
    """(all-HBM layers, usage-aware layers with each layer's least-used ``cold_fraction`` of
    experts in pinned host memory, their cold sets, pinned owners)."""
    experts = p.shape[1]
    cold_n = int(experts * cold_fraction)
    all_hbm, usage, cold_sets, owners = [], [], [], []
    for layer, tensors in enumerate(kernel_tensors):
        all_hbm.append(build_unsplit_layer(tensors, layer_index=layer))
        order = np.argsort(-p[layer], kind="stable")
        hot = sorted(order[:experts - cold_n].tolist())
        cold = sorted(order[experts - cold_n:].tolist())
        codes = torch.arange(experts, dtype=torch.int32)
        for r, e in enumerate(cold):
            codes[e] = -r - 1
        usage.append(ResidentLayer(layer, experts, ExpertBank(dict(tensors), experts),
                                   fp.bank_of(tensors, cold, owners), hot, cold, codes.to(dev)))
        cold_sets.append(set(cold))
    return all_hbm, usage, cold_sets, owners


def check_outputs(f, exs, peer, layer_all, layer_usage, ckpt, dev, seed) -> dict:
    out = {}
    for t in (1, 6):
        g = torch.Generator(device=dev).manual_seed(seed + 11 + t)
        x = torch.randn(t, f.hidden, generator=g, device=dev).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(f.experts, generator=g, device=dev)[:f.top_k] for _ in range(t)])
        w = torch.softmax(torch.randn(t, f.top_k, generator=g, device=dev), -1)
        ref = residency_forward(build_unsplit_layer(ckpt, layer_index=0), x, w, ids, fp.reference_fn(f),
                                pick_dtype=torch.bfloat16)
        for name, ex in exs.items():
            got = ex.forward(layer_all, x, w, ids).clone()
            out[f"T{t} ours {name}"] = fp.rel_l2(got, ref)
            out[f"T{t} ours {name} usage-aware == all-HBM"] = bool(torch.equal(
                ex.forward(layer_usage, x, w, ids), got))
        if peer is not None:
            buf = torch.empty(t, f.hidden, dtype=torch.bfloat16, device=dev)
            out[f"T{t} peer"] = fp.rel_l2(peer.layer(x, w, ids, buf), ref)
    return out


def measure_tokens(f, tokens, steps, p, seed, dev, exs, peers, layers_of, cold_sets, per_expert,
                   hbm_gbps, pinned_gbps) -> dict:
    """One step size: every case captured in a CUDA graph (eager on CPU), ``steps`` steps of fresh
    routing, medians per layer; the row of ``res["per_T"]``."""
    cuda = dev.type == "cuda"
    names = list(exs)
    ids_all, w_all = fp.sample_routing(p, steps, tokens, f.top_k, seed + tokens, dev)
    xg = torch.Generator(device=dev).manual_seed(seed + 3 * tokens)
    xs = torch.randn(f.layers, tokens, f.hidden, generator=xg, device=dev).to(torch.bfloat16)
    ids_buf, w_buf = ids_all[0].clone(), w_all[0].clone()
    outs = {(v, c): torch.empty(f.layers, tokens, f.hidden, dtype=torch.bfloat16, device=dev)
            for v in names for c in layers_of}

    def ours(v, c):
        def step():
            for l in range(f.layers):
                exs[v].forward(layers_of[c][l], xs[l], w_buf[l], ids_buf[l], out=outs[(v, c)][l])
        return step

    runs = {f"{c}@{v}": fp.Step(ours(v, c), cuda) for v in names for c in layers_of}
    prep_step = None
    if peers[0] is not None:
        out_peer = torch.empty(f.layers, tokens, f.hidden, dtype=torch.bfloat16, device=dev)

        def peer_layer():
            for l in range(f.layers):
                peers[l].layer(xs[l], w_buf[l], ids_buf[l], out_peer[l])
        runs["peer"] = fp.Step(peer_layer, cuda)
        assign, quant = {}, {}

        def prep():
            for l in range(f.layers):
                assign[l] = peers[l].assignment(ids_buf[l], tokens)
                quant[l] = peers[l].quant(xs[l]) if peers[l].fp8 else (xs[l], None)
        prep_step = fp.Step(prep, cuda)
        prep_step()

        def peer_gemms():
            for l in range(f.layers):
                peers[l].gemms(xs[l], quant[l][0], quant[l][1], w_buf[l], assign[l], tokens)
        runs["peer_gemms"] = fp.Step(peer_gemms, cuda)
    times = {c: [] for c in runs}
    hot_cold = {"all_hbm": [], "usage_aware": []}
    equal = True
    order = list(runs.items())
    for s in range(steps):
        ids_buf.copy_(ids_all[s])
        w_buf.copy_(w_all[s])
        if prep_step is not None:
            prep_step()
        for case, fn in (order if s % 2 == 0 else order[::-1]):
            times[case].append(fp.seconds(fn, cuda))
        equal &= all(torch.equal(outs[(v, "usage_aware")], outs[(v, "all_hbm")]) for v in names)
        hot = cold = 0
        for l in range(f.layers):
            u = set(torch.unique(ids_all[s, l]).tolist())
            nc = len(u & cold_sets[l])
            cold += nc * per_expert
            hot += (len(u) - nc) * per_expert
        hot_cold["all_hbm"].append((hot + cold, 0))
        hot_cold["usage_aware"].append((hot, cold))
    if cuda:
        torch.cuda.synchronize()
    row = {"steps": steps, "split_equals_all_hbm": bool(equal)}
    for case, ts in times.items():
        med = statistics.median(ts)
        kind = "usage_aware" if case.startswith("usage_aware") else "all_hbm"
        hot = statistics.fmean(h for h, _ in hot_cold[kind])
        cold = statistics.fmean(c for _, c in hot_cold[kind])
        entry = {"us_per_layer": med / f.layers * 1e6, "bytes_per_layer": (hot + cold) / f.layers,
                 "spread_us": (max(ts) - min(ts)) / f.layers * 1e6}
        if cuda:
            floor = hot / (hbm_gbps * GB) + cold / (pinned_gbps * GB)
            entry["floor_us"] = floor / f.layers * 1e6
            entry["x_floor"] = med / floor
        row[case] = entry
    return row


def run_format(f, args, dev, glue, dump=lambda res: None) -> dict:
    cuda = dev.type == "cuda"
    shape = ExpertShape(f.hidden, f.inter)
    max_tokens = max(6, max(args.tokens))
    table = VARIANTS if cuda else CPU_VARIANTS
    names = [v for v in args.variants[f.key].split(",") if v in table]
    exs = {v: TritonDenseExperts(shape, f.experts, f.top_k, max_tokens, dev, table[v], expert_format=f.kind)
           for v in names}
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    t0 = time.perf_counter()
    ckpts, peers = [], []
    for _ in range(f.layers):
        ckpt = fp.random_layer(f, gen, dev)
        peers.append(fp.FusedMoePeer(glue, f, ckpt, max_tokens, args.peer_configs) if glue else None)
        ckpts.append(ckpt)   # the dense kernels read vLLM's layout: shared with the peer
    p = fp.popularity(f.experts, f.layers, args.seed)
    cold_fraction = 0.25
    # _pinned holds the pinned host memory the cold banks are views of, until this returns
    all_hbm, usage, cold_sets, _pinned = usage_aware_cases(ckpts, p, cold_fraction, dev)
    per_expert = fp.bytes_per_expert(f)
    res = {"format": f.title, "geometry": {"hidden": f.hidden, "intermediate": f.inter, "experts": f.experts,
                                           "top_k": f.top_k, "layers": f.layers},
           "bytes_per_expert": per_expert, "variants": {v: table[v].describe() for v in names},
           "peer": f.source, "cold_fraction": cold_fraction, "build_s": time.perf_counter() - t0,
           "per_T": {}, "equal": {}}
    res["hbm_GBps"] = fp.read_gbps(ckpts[0]["w13_weight"], cuda)
    res["pinned_GBps"] = fp.read_gbps(usage[0].cold.tensors["w13_weight"], cuda)
    res["check"] = check_outputs(f, exs, peers[0], all_hbm[0], usage[0], ckpts[0], dev, args.seed)
    print(f.key, "check", json.dumps(res["check"]), flush=True)
    steps_for = dict(args.steps)
    layers_of = {"all_hbm": all_hbm, "usage_aware": usage}
    for tokens in args.tokens:
        steps = steps_for.get(tokens, 8) if cuda else 1
        row = measure_tokens(f, tokens, steps, p, args.seed, dev, exs, peers, layers_of, cold_sets,
                             per_expert, res["hbm_GBps"], res["pinned_GBps"])
        res["per_T"][tokens] = row
        res["equal"][tokens] = row["split_equals_all_hbm"]
        dump(res)
        print(f.key, json.dumps({"T": tokens, "equal": row["split_equals_all_hbm"],
                                 **{c: round(v["us_per_layer"], 1) for c, v in row.items() if isinstance(v, dict)}}),
              flush=True)
    if cuda:
        torch.cuda.synchronize()
    return res


def markdown(results: dict) -> str:
    env = results["env"]
    lines = [f"GPU: {env.get('gpu')}, torch {env['torch']}, triton {env['triton']}", ""]
    for key, err in results.get("errors", {}).items():
        lines += [f"**{key} failed**: {err}", ""]
    for r in results["formats"].values():
        g = r["geometry"]
        names = list(r["variants"])
        lines += [(f"### {r['format']} — H {g['hidden']}, I {g['intermediate']}, {g['experts']} experts, "
                   f"top-{g['top_k']}, {g['layers']} layers per graph, {r['bytes_per_expert']:,} B per expert"), "",
                  (f"HBM read {r['hbm_GBps']:.0f} GB/s, pinned read {r['pinned_GBps']:.1f} GB/s (same run); "
                   "variants: ") + "; ".join(f"`{v}` {d}" for v, d in r["variants"].items()), "",
                  "outputs: " + ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in r["check"].items()), ""]
        head = ["T", "MB/layer", "HBM floor µs", "peer layer µs", "peer GEMMs µs"]
        head += [f"`{v}` µs (÷ GEMMs)" for v in names]
        head += [f"usage-aware `{names[-1]}` µs (× floor)", "split == all-HBM"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for t, x in r["per_T"].items():
            a0 = x[f"all_hbm@{names[0]}"]
            gem = x.get("peer_gemms", {}).get("us_per_layer")
            cells = [str(t), f"{a0['bytes_per_layer'] / 1e6:.0f}", f"{a0.get('floor_us', float('nan')):.1f}"]
            cells.append(f"{x['peer']['us_per_layer']:.1f}" if "peer" in x else "—")
            cells.append(f"{gem:.1f}" if gem else "—")
            for v in names:
                us = x[f"all_hbm@{v}"]["us_per_layer"]
                cells.append(f"{us:.1f} ({us / gem:.2f})" if gem else f"{us:.1f}")
            u = x[f"usage_aware@{names[-1]}"]
            cells.append(f"{u['us_per_layer']:.1f} ({u.get('x_floor', float('nan')):.2f}×)")
            cells.append("yes" if x["split_equals_all_hbm"] else "**NO**")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--formats", default="qwen3-bf16,dsv3-fp8")
    ap.add_argument("--variants", default=None,
                    help="FORMAT=v1,v2;FORMAT=... (names from VARIANTS); default DEFAULT_VARIANTS")
    ap.add_argument("--tokens", default="1,6,16,96")
    ap.add_argument("--steps", default="1:12,6:10,16:8,96:6")
    ap.add_argument("--vllm-src", default=str(ROOT / ".cache/vllm-0.33.0/vllm"))
    ap.add_argument("--peer-configs", default=str(ROOT / ".cache/fused_moe_configs"))
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    args = ap.parse_args()
    args.tokens = [int(t) for t in args.tokens.split(",")]
    args.steps = [tuple(int(v) for v in kv.split(":")) for kv in args.steps.split(",")]
    args.peer_configs = Path(args.peer_configs) if Path(args.peer_configs).is_dir() else None
    variants = dict(DEFAULT_VARIANTS)
    for part in (args.variants or "").split(";"):
        if "=" in part:
            k, v = part.split("=", 1)
            variants[k] = v
    args.variants = variants
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    import triton
    env = {"torch": torch.__version__, "triton": triton.__version__,
           "gpu": torch.cuda.get_device_name(0) if cuda else "CPU (TRITON_INTERPRET=1)"}
    glue = None if args.no_peer else fp.load_fused_moe(Path(args.vllm_src))
    if glue is not None:
        env["glue"] = dict(glue.CITED)
    results = {"env": env, "args": {k: str(v) for k, v in vars(args).items()}, "formats": {}}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    ok = True
    for key in args.formats.split(","):
        f = fp.FORMATS[key]
        if not cuda:
            h, i, e, k = fp.TINY[key]
            f = fp.Format(f.key, f.title + " (tiny)", h, i, e, k, f.kind, 2, f.source)
        t0 = time.perf_counter()

        def dump(partial, key=key):   # every T: a run cut off by its time limit keeps what it measured
            results["formats"][key] = partial
            (out_dir / "dense_peer.json").write_text(json.dumps(results, indent=1, default=str))

        try:
            r = run_format(f, args, dev, glue, dump)
        except Exception as exc:  # noqa: BLE001 - reported; the other format still runs
            import traceback
            traceback.print_exc()
            results.setdefault("errors", {})[key] = f"{type(exc).__name__}: {str(exc)[:500]}"
            ok = False
            if cuda:
                torch.cuda.empty_cache()
            continue
        r["wall_s"] = time.perf_counter() - t0
        results["formats"][key] = r
        # The interpreter truncates fp32 -> bf16 and has no fma (tests/gpu/test_dense_interpreter.py)
        tol = 1e-2 if cuda and f.kind != "fp8-block" else (2e-2 if f.kind != "fp8-block" else 3e-2)
        for name, v in r["check"].items():
            if isinstance(v, bool):
                ok &= v
            elif cuda or " peer" not in f" {name}":
                ok &= v < tol
        ok &= all(r["equal"].values())
        (out_dir / "dense_peer.json").write_text(json.dumps(results, indent=1, default=str))
        (out_dir / "dense_peer.md").write_text(markdown(results))
        print(f"{key} done in {r['wall_s']:.0f} s", flush=True)
    print(markdown(results), flush=True)
    print("checks", "passed" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
