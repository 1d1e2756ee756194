#!/usr/bin/env python3
"""The vLLM plugin's entry vs the kernel path on one GPU, same banks, same run, CUDA graphs.

What vLLM calls for a MoE layer is ``routed_experts.forward_modular(x, topk_weights, topk_ids)``;
with the plugin active that is ``vllm_plugin.forward.ResidencyForward.forward_modular`` → the
worker runtime's ``split_forward`` → (CUDA, MXFP4) ``TritonMxfp4Experts.forward``. This bench
builds stand-in layers with exactly vLLM 0.33's ``RoutedExperts`` + ``Mxfp4MoEMethod`` parameters
(tests/plugin_entry_support.py; no vLLM on the H200), lets the plugin's ``WorkerRuntime`` re-home
them (usage-aware map: per layer the ``--hot`` most popular experts in HBM, the rest in exact-size
pinned host memory read in place), and times, per T, four CUDA graphs of the whole
``--layers``-layer step on the same routing, order flipped every step:

1. ``kernel``          — ``TritonMxfp4Experts.forward`` on the runtime's banks (BENCHMARKS.md's
                         kernel table drives the same call);
2. ``plugin``          — the entry, counter off (a lane without a dump folder);
3. ``kernel+counter``  — (1) with the in-kernel counter;
4. ``plugin+counter``  — the entry with the counter on (a live lane with a dump folder, or a
                         count-and-serve boot): step masks from a vLLM-shaped forward context,
                         refreshed eagerly before each replay as vLLM's ``create_forward_context``
                         hook does (its own time is reported separately).

Geometry and routing as bench/gpu_residency.py (DSv4.1-Flash experts, 384 per layer, top-6,
p ∝ exp(−4.94·(r/384)^1.01) per layer). Every token is a decode request (no padding). After the
timing: the plugin's outputs == the kernel's (``torch.equal``) on the last step, and the plugin's
counter == the kernel path's counter (both saw the same routing the same number of times).

    PYTHONPATH=runtime python3 bench/plugin_gpu.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from expert_residency.core.counter import ExpertCounter  # noqa: E402
from expert_residency.gpu.graphs import CapturedStep  # noqa: E402
from expert_residency.vllm_plugin.worker_runtime import set_runtime  # noqa: E402
from gpu_residency import DEV, DSV41, event_seconds, popularity, random_layer, sample_routing  # noqa: E402
from plugin_entry_support import plugin_runtime, step_context  # noqa: E402

EXPERTS, TOP_K = 384, 6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=13)
    ap.add_argument("--hot", type=int, default=295)
    ap.add_argument("--tokens", default="1,6,16,96")
    ap.add_argument("--steps", default="200,100,60,24")
    ap.add_argument("--max-tokens", type=int, default=256,
                    help="workspace size (vLLM: max_num_batched_tokens)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    tokens_list = [int(t) for t in args.tokens.split(",")]
    steps_list = [int(s) for s in args.steps.split(",")]
    t0 = time.perf_counter()
    p = popularity(EXPERTS, args.layers, args.seed)
    gen = torch.Generator(device=DEV).manual_seed(args.seed)
    tensors = {i: random_layer(EXPERTS, gen) for i in range(args.layers)}
    hot = {i: sorted(torch.tensor(p[i]).argsort(descending=True)[:args.hot].tolist())
           for i in range(args.layers)}
    torch.cuda.synchronize()
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    runtime, layers = plugin_runtime(tensors, "residency", top_k=TOP_K,
                                     max_num_tokens=args.max_tokens, hot=hot, count=True)
    del tensors
    torch.cuda.synchronize()
    t_install = time.perf_counter() - t0
    runtime._emit_report()
    set_runtime(runtime)
    order = sorted(layers)
    fused = runtime.fused[order[0]]
    assert all(runtime.fused[i] is fused for i in order), "one geometry: one shared workspace"
    resident = [layers[i]._er_resident for i in order]
    kernel_counter = ExpertCounter(order, EXPERTS, device=DEV, top_k=TOP_K)
    results = {"machine": torch.cuda.get_device_name(), "torch": torch.__version__,
               "layers": args.layers, "hot": args.hot, "build_s": t_build,
               "install_s": t_install, "report_extra": runtime.report.extra,
               "hot_bytes": runtime.report.hot_bytes, "cold_bytes": runtime.report.cold_bytes,
               "per_t": {}}
    print(f"built {args.layers} layers in {t_build:.1f} s, plugin install {t_install:.1f} s; "
          f"hot {runtime.report.hot_bytes / 2**30:.2f} GiB, cold (pinned) "
          f"{runtime.report.cold_bytes / 2**30:.2f} GiB; {runtime.report.extra}", flush=True)

    for tokens, steps in zip(tokens_list, steps_list):
        ids, weights = sample_routing(p, steps, tokens, TOP_K, args.seed + tokens)
        ids = ids.to(torch.int32)
        g2 = torch.Generator(device=DEV).manual_seed(args.seed + 7 * tokens)
        x = torch.randn(args.layers, tokens, DSV41.hidden, generator=g2, device=DEV
                        ).to(torch.bfloat16)
        ctx = step_context(tokens, [1] * tokens, DEV)
        runtime.on_forward_context(ctx)
        outs = torch.empty(args.layers, tokens, DSV41.hidden, dtype=torch.bfloat16, device=DEV)

        def kernel_step(xx, w, ii, counter=None):
            for n, layer in enumerate(resident):
                fused.forward(layer, xx[n], w[n], ii[n], counter=counter, out=outs[n])
            return outs

        def plugin_step(xx, w, ii):
            return [layers[i].forward_modular(xx[n], w[n], ii[n]) for n, i in enumerate(order)]

        def counted(flag: bool):
            for m in layers.values():
                m._er_counted = flag

        graphs = {}
        graphs["kernel"] = CapturedStep(kernel_step, x, weights[0], ids[0])
        counted(False)
        graphs["plugin"] = CapturedStep(plugin_step, x, weights[0], ids[0])
        graphs["kernel+counter"] = CapturedStep(
            lambda xx, w, ii: kernel_step(xx, w, ii, kernel_counter), x, weights[0], ids[0])
        counted(True)
        graphs["plugin+counter"] = CapturedStep(plugin_step, x, weights[0], ids[0])
        times = {c: [] for c in graphs}
        items = list(graphs.items())
        for s in range(steps):
            for case, g in (items if s % 2 == 0 else items[::-1]):
                g.load(topk_weights=weights[s], topk_ids=ids[s])
                if case == "plugin+counter":
                    runtime.on_forward_context(ctx)  # eager, outside the graph, as in vLLM
                times[case].append(event_seconds(g.graph.replay))
        hook = [event_seconds(lambda: runtime.on_forward_context(ctx)) for _ in range(20)]
        # Bit-identity of the last step (every graph replayed on weights[-1]/ids[-1] last).
        kernel_out = graphs["kernel"].out
        for case in ("plugin", "plugin+counter"):
            got = graphs[case].out
            for n in range(args.layers):
                assert torch.equal(got[n], kernel_out[n]), f"T={tokens} {case} layer {n} != kernel"
        row = {"steps": steps}
        for case, ts in times.items():
            row[case] = {"per_layer_us_mean": statistics.fmean(ts) / args.layers * 1e6,
                         "per_layer_us_median": statistics.median(ts) / args.layers * 1e6}
        row["plugin_over_kernel"] = (row["plugin"]["per_layer_us_mean"]
                                     / row["kernel"]["per_layer_us_mean"])
        row["plugin_counter_over_kernel_counter"] = (
            row["plugin+counter"]["per_layer_us_mean"]
            / row["kernel+counter"]["per_layer_us_mean"])
        row["hook_us_per_step_median"] = statistics.median(hook) * 1e6
        row["hook_pct_of_step"] = 100 * row["hook_us_per_step_median"] / (
            row["plugin+counter"]["per_layer_us_mean"] * args.layers)
        results["per_t"][tokens] = row
        print(f"T={tokens:3d}: kernel {row['kernel']['per_layer_us_mean']:8.1f} µs/layer, plugin "
              f"{row['plugin']['per_layer_us_mean']:8.1f} ({row['plugin_over_kernel']:.3f}x); "
              f"+counter {row['kernel+counter']['per_layer_us_mean']:8.1f} vs "
              f"{row['plugin+counter']['per_layer_us_mean']:8.1f} "
              f"({row['plugin_counter_over_kernel_counter']:.3f}x); mask refresh "
              f"{row['hook_us_per_step_median']:.1f} µs/step", flush=True)
        del graphs
    torch.cuda.synchronize()
    kc, kt, _ = kernel_counter.snapshot()
    pc, pt, pd = runtime.counter.snapshot()
    assert (kc == pc).all() and kt == pt, "plugin counter != kernel counter"
    results["counts_total"] = int(pc.sum())
    results["tokens_total"] = pt
    results["decode_tokens_total"] = pd
    print(f"counters equal: {int(pc.sum())} picks, {pt} tokens, {pd} decode tokens", flush=True)
    print(markdown(results))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "plugin_gpu.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


def markdown(r: dict) -> str:
    lines = ["| T | kernel µs/layer | plugin µs/layer | plugin ÷ kernel | kernel + counter | "
             "plugin + counter | ÷ | mask refresh µs/step, eager (% of the step) |",
             "|---|---|---|---|---|---|---|---|"]
    for t, row in r["per_t"].items():
        lines.append(
            f"| {t} | {row['kernel']['per_layer_us_mean']:.1f} | "
            f"{row['plugin']['per_layer_us_mean']:.1f} | {row['plugin_over_kernel']:.3f} | "
            f"{row['kernel+counter']['per_layer_us_mean']:.1f} | "
            f"{row['plugin+counter']['per_layer_us_mean']:.1f} | "
            f"{row['plugin_counter_over_kernel_counter']:.3f} | "
            f"{row['hook_us_per_step_median']:.1f} ({row['hook_pct_of_step']:.1f}%) |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
