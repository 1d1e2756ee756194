#!/usr/bin/env python3
"""The expert GEMMs warp-specialized (Gluon), launch by launch beside the launches they replaced.

Written as a probe (BENCHMARKS.md, run WS). Our tl.dot grouped launches (``gpu.kernels.w2_kernel``)
have every warp of a program copy its weight tiles (cp.async), wait at two CTA barriers per K step, decode and
multiply: on the H200 they read 74–79% of the HBM limit at T >= 16 where Humming's persistent,
warp-specialized kernels read 90–94% (BENCHMARKS.md, runs MX3 and RC). This probe keeps our
layout (``gpu.layout``, MMA order), our decode (``kernels._MMA_WORD_TO_BF16_PTX``) and our
grouping, and changes only how the bytes reach the tensor cores:

- a persistent grid (programs walk the step's (slot, row tile) items ``G`` apart);
- a loader partition (``LOADER_WARPS`` warps, few registers) that copies each K step's weight
  tile, its scales (4 bytes per lane group, one copy per lane) and the slot's activation rows
  into a ring of ``STAGES`` shared-memory buffers, each signalled by an mbarrier when its copies
  land;
- the default partition (one warpgroup) that waits on a buffer, reads it into registers, frees
  it, decodes and multiplies (``mma.sync`` m16n8k16, the decode's register order) and stores each
  slot's rows as ``w2_kernel`` does (``y[pick, n]``, bf16, unreduced).

So the warps that copy never wait on arithmetic and the warps that compute never wait at a CTA
barrier. It runs both GEMMs (``gpu.kernels_ws``, the runtime's default on Hopper since) beside a
runtime layer built with them off (``ws_grouped=False``: its tl.dot or grouped warp-MMA launches),
on that layer's workspace (its grouping; w2 fed its w2 input), and reports each launch's read rate
against the HBM read limit measured in the same process, and the differences of their outputs.

    python3 bench/ws_probe.py --tokens 16,96 --out $OUT           # a CUDA GPU (sm_90)
    PYTHONPATH=/tmp/t36 python3 bench/ws_probe.py --sass          # compile for sm_90 here, no GPU
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
from pathlib import Path

import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "bench"))

from expert_residency.gpu.kernels_ws import KERNELS, WS_ARGS, gemm_constants  # noqa: E402
from expert_residency.gpu.tile_rules import ws_max_registers  # noqa: E402


def parse_variant(text: str) -> dict:
    """'stages=4,loader_warps=4,loader_regs=56,ctas=2,bm=16' -> the launch settings; maxnreg
    (0: the runtime's cap for ``ctas`` programs per SM, ``tile_rules.ws_max_registers``)."""
    cfg = dict(stages=4, loader_warps=4, loader_regs=56, ctas=2, bm=16, maxnreg=0, prefetch=0, trel=0)
    for item in filter(None, text.split(",")):
        key, value = item.split("=")
        if key not in cfg:
            raise SystemExit(f"unknown setting {key!r} (have {sorted(cfg)})")
        cfg[key] = int(value)
    cfg["maxnreg"] = cfg["maxnreg"] or ws_max_registers(cfg["ctas"])
    return cfg


GEMMS = ("w13", "w2")


def gemm_constexprs(which: str, cfg: dict, hidden: int, inter: int, top_k: int, swiglu_limit: float) -> dict:
    """The launch constants of one GEMM under a variant's settings (the runtime's own builder)."""
    return gemm_constants(which, hidden, inter, top_k, swiglu_limit=swiglu_limit, block_m=cfg["bm"],
                          stages=cfg["stages"], loader_warps=cfg["loader_warps"], loader_regs=cfg["loader_regs"],
                          prefetch=bool(cfg["prefetch"]), thread_release=bool(cfg["trel"]))


def sass_report(cfg: dict, which: str, hidden: int, inter: int) -> dict:
    """Compile for sm_90 without a GPU and count the consumer loop's SASS (kernel_sass's tools)."""
    import kernel_sass as ks
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    ks.use_target(90)
    constexprs = gemm_constexprs(which, cfg, hidden, inter, 6, 10.0)
    sig = dict(WS_ARGS)
    sig.update({k: "constexpr" for k in constexprs})
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(WS_ARGS))}
    src = GluonASTSource(fn=KERNELS[which], signature=sig, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=4, maxnreg=cfg["maxnreg"]))
    sass = ks.cuobjdump(kernel, "-sass")
    regs = ks.cuobjdump(kernel, "-res-usage")
    loop = _mma_loop(sass)
    return {"regs": int(re.search(r"REG:(\d+)", regs).group(1)), "shared_bytes": kernel.metadata.shared,
            "consumer_loop_instructions": len(loop),
            # a thread decodes BN * BK / 128 weights of each tile per K step
            "per_weight": len(loop) / ((2 if which == "w13" else 1) * constexprs["BN"] * 128 // 128),
            "spill_instructions": sum(1 for line in sass.splitlines() if re.search(r"\b(LDL|STL)\b", line)),
            "loop_ops": dict(collections.Counter(ks_op(t) for t in loop)),
            # cp.async copies per loader thread and K step (the loader loop: the one that copies)
            "loader_copies": sum(1 for t in _loop_with(sass, "LDGSTS") if ks_op(t) == "LDGSTS")}


def ks_op(text: str) -> str:
    return re.match(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", text).group(1)


def _mma_loop(sass: str) -> list[str]:
    """The shortest backward branch's body that holds an MMA: the consumer's K loop (the shorter
    loops are the mbarrier waits)."""
    return _loop_with(sass, "HMMA")


def _loop_with(sass: str, op: str) -> list[str]:
    """The shortest backward branch's body that holds ``op``."""
    addr = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
    lines = [(int(m.group(1), 16), m.group(2)) for m in map(addr.search, sass.splitlines()) if m]
    best: list[str] = []
    for at, text in lines:
        target = re.search(r"BRA\s+0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < at:
            body = [t for a, t in lines if int(target.group(1), 16) <= a <= at]
            if any(op in t for t in body) and (not best or len(body) < len(best)):
                best = body
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="16,96")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--variants", default="ws:", help="';'-separated 'label:key=value,...' (stages, loader_warps, "
                                                       "loader_regs, ctas, bm, maxnreg, prefetch, trel)")
    ap.add_argument("--sass", action="store_true", help="compile for sm_90 here and count SASS; no GPU")
    ap.add_argument("--l2", action="store_true",
                    help="every expert of a layer read from its bank's first row (the row map's codes all 0): "
                         "a layer's weights then stay in L2, so each launch runs at what its own instructions "
                         "allow rather than at the HBM read rate (give --layers 1: one layer's 18.8 MB fits "
                         "the L2); read rates are still given as a share of the HBM read limit")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    args = ap.parse_args()
    variants = {}
    for item in filter(None, (c.strip() for c in args.variants.split(";"))):
        label, fields = item.split(":", 1)
        variants[label] = parse_variant(fields)
    if args.sass:
        for label, cfg in variants.items():
            for which in GEMMS:
                print(label, which, json.dumps(sass_report(cfg, which, 5120, 2304)))
        return 0
    return run_gpu(args, variants)


def run_gpu(args, variants: dict) -> int:
    import gpu_residency as gr
    import torch
    from expert_residency.core.banks import build_unsplit_layer
    from expert_residency.gpu.experts import KernelConfig, TritonMxfp4Experts
    from layer_parts import kernel_times

    dev, shape, experts, k = gr.DEV, gr.DSV41, 384, 6
    tokens = [int(t) for t in args.tokens.split(",")]
    if min(tokens) < 2:
        raise SystemExit("T = 1 runs ungrouped (no slots to walk): give tokens of 2 or more")
    gen = torch.Generator(device=dev).manual_seed(7)
    kx = TritonMxfp4Experts(shape, experts, k, max_tokens=max(tokens), device=dev,
                            config=KernelConfig(pdl=False, ws_grouped=False), swiglu_limit=10.0)
    cfg = kx.config
    if (cfg.block_n2, cfg.block_k2) != (128, 128):
        raise SystemExit("the probe reads 128 x 128 w2 tiles")
    layers = []
    for i in range(args.layers):
        ckpt = gr.random_layer(experts, gen)
        kx.to_kernel_layout(ckpt)
        layers.append(build_unsplit_layer(ckpt, layer_index=i))
        del ckpt
        if args.l2:
            layers[-1].row_codes.zero_()
    limit = gr.hbm_read_limit()["GBps"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"HBM read limit {limit:.0f} GB/s; {torch.cuda.get_device_name(0)}, {sms} SMs", flush=True)
    ws = kx.workspace
    result = {"hbm_read_GBps": limit, "device": torch.cuda.get_device_name(0), "l2": args.l2, "rows": []}
    for t in tokens:
        ids = torch.stack([torch.stack([torch.randperm(experts, generator=gen, device=dev)[:k] for _ in range(t)])
                           for _ in range(args.layers)])
        x = torch.randn(args.layers, t, shape.hidden, generator=gen, device=dev).to(torch.bfloat16)
        uniq = sum(len(torch.unique(ids[i])) for i in range(args.layers)) / args.layers
        w2_bytes = uniq * shape.hidden * (shape.intermediate // 2 + shape.intermediate // 32)
        w13_bytes = uniq * 2 * shape.intermediate * (shape.hidden // 2 + shape.hidden // 32)
        gemm_bytes = {"w13": w13_bytes, "w2": w2_bytes}
        outs = {label: {"w13": torch.empty(t * k, shape.intermediate, dtype=torch.bfloat16, device=dev),
                        "w2": torch.empty(t * k, shape.hidden, dtype=torch.bfloat16, device=dev)}
                for label in variants}

        def launch_ws(layer, label, which):
            v = variants[label]
            hot = layer.hot
            cold = layer.cold if layer.cold.num_rows else layer.hot   # as pick_outputs passes them
            name = "w13_weight" if which == "w13" else "w2_weight"
            w, sw = hot[name], hot[name + "_scale"]
            const = gemm_constexprs(which, v, shape.hidden, shape.intermediate, k, 10.0)
            items = t * k * (const["ROWS_OUT"] // const["BN"])   # slots <= picks
            src = x_now[0] if which == "w13" else ws.act   # w2 reads the runtime's w2 input
            KERNELS[which][(min(sms * v["ctas"], items),)](
                src, layer.row_codes, w, sw, cold[name], cold[name + "_scale"],
                ws.sorted_pick, ws.slot_start, ws.slot_expert, ws.num_slots, outs[label][which],
                ws.dummy_i64, ws.dummy_i64, ws.n_tokens,
                w.stride(0), sw.stride(0), **const, num_warps=4, maxnreg=v["maxnreg"])

        # correctness: layer 0's step; each GEMM beside the runtime's output of the same workspace
        x_now = [x[0]]
        kx.pick_outputs(layers[0], x[0], ids[0])
        torch.cuda.synchronize()
        refs = {"w13": ws.act[: t * k].float(), "w2": ws.pick_out[: t * k].float()}
        diffs = {}
        for label in variants:
            for which in GEMMS:
                launch_ws(layers[0], label, which)
                torch.cuda.synchronize()
                got, ref = outs[label][which].float(), refs[which]
                diffs[f"{label}/{which}"] = {"max_abs": (got - ref).abs().max().item(),
                                             "rel_l2": ((got - ref).norm() / ref.norm()).item(),
                                             "bitwise_equal_rows": int((got == ref).all(dim=1).sum().item())}

        # each variant in its own profiled loop, beside the runtime's step of the same layers
        times, runtime = {}, collections.defaultdict(list)
        for label in variants:
            def step(label=label):
                for i in range(args.layers):
                    x_now[0] = x[i]
                    kx.pick_outputs(layers[i], x[i], ids[i])
                    for which in GEMMS:
                        launch_ws(layers[i], label, which)
            per = {n: us / args.layers for n, us in kernel_times(step, args.steps).items()}
            for which in GEMMS:
                times[f"{label}/{which}"] = sum(us for n, us in per.items() if n.startswith(f"{which}_ws"))
                # the runtime's launch of this T (the tl.dot kernels, or the grouped warp-MMA ones)
                runtime[which].append(sum(us for n, us in per.items()
                                          if n.startswith(f"{which}_") and not n.startswith(f"{which}_ws")))
            runtime["rest"].append(sum(us for n, us in per.items()
                                       if not n.startswith(("w13_", "w2_"))))
        med = {key: sorted(v)[len(v) // 2] for key, v in runtime.items()}
        for which in GEMMS:
            times[f"runtime/{which}"] = med[which]
        row = {"T": t, "unique_experts": uniq, "MB": {w: b / 1e6 for w, b in gemm_bytes.items()},
               "us": times, "runtime_us_each_loop": dict(runtime), "diff": diffs,
               "pct_hbm": {n: 100 * gemm_bytes[n.split("/")[1]] / (us * 1e-6) / 1e9 / limit
                           for n, us in times.items() if us},
               "ratio_to_runtime": {n: us / med[n.split("/")[1]] for n, us in times.items()},
               # kernel sums, eager (no programmatic dependent launch): the runtime's layer, and the
               # same with its two expert launches replaced by the probe's
               "layer_us": {"runtime": med["w13"] + med["w2"] + med["rest"],
                            **{label: times[f"{label}/w13"] + times[f"{label}/w2"] + med["rest"]
                               for label in variants}}}
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "ws_probe.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
