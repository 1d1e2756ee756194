#!/usr/bin/env python3
"""The step-mask refresh on one GPU: the torch path (seven small ops) vs the one-launch Triton
kernel (vllm_plugin/step_masks_kernel.py), side by side in one run.

Both refresh ``StepMasks`` for ``--max-tokens`` rows (vLLM's max_num_batched_tokens) from the same
vLLM-shaped forward context (every token a decode request, as bench/plugin_gpu.py), eagerly, as
vLLM's ``create_forward_context`` hook does once per step, order alternated per repetition. Two
times per call: CUDA events around it (the GPU otherwise idle, so that is the host's launch time,
as in BENCHMARKS.md's plugin table) and the host's wall time over a burst of calls without a sync
(what the step's Python spends). After timing, both buffers are compared (``torch.equal``).
``--step-us``: the step the refresh precedes (e.g. bench/plugin_gpu.py's 13-layer T=1 step with the
counter) to print the refresh's share of it; ``--step-json`` reads it from plugin_gpu.json.

    PYTHONPATH=runtime python3 bench/step_masks_gpu.py --out $OUT
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

from expert_residency.vllm_plugin.step_masks import StepMasks  # noqa: E402
from plugin_entry_support import step_context  # noqa: E402

DEV = torch.device("cuda")


def event_us(fn) -> float:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3


def host_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / calls * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--tokens", default="1,6,16,96")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--step-us", type=float, default=None)
    ap.add_argument("--step-json", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    step_us, step_from = args.step_us, "--step-us"
    if args.step_json is not None and args.step_json.exists():
        doc = json.loads(args.step_json.read_text())
        row = doc["per_t"].get("1") or doc["per_t"].get(1)
        step_us = row["plugin+counter"]["per_layer_us_mean"] * doc["layers"]
        step_from = f"{args.step_json.name}: {doc['layers']}-layer T=1 step, plugin + counter"
    old = StepMasks(args.max_tokens, DEV, kernel=False)
    new = StepMasks(args.max_tokens, DEV)
    assert old._refresh is None and new._refresh is not None
    new._update_torch = None  # the kernel instance must never fall back to the torch path
    out = {"machine": torch.cuda.get_device_name(), "torch": torch.__version__,
           "max_tokens": args.max_tokens, "reps": args.reps, "step_us": step_us, "step_from": step_from,
           "per_t": {}}
    for tokens in (int(t) for t in args.tokens.split(",")):
        ctx = step_context(tokens, [1] * tokens, DEV)
        for m in (old, new):  # warm-up (the kernel compiles once per lane)
            for _ in range(3):
                m.update_from_context(ctx)
        ev = {"torch": [], "kernel": []}
        for r in range(args.reps):
            pair = (("torch", old), ("kernel", new))
            for name, m in (pair if r % 2 == 0 else pair[::-1]):
                ev[name].append(event_us(lambda: m.update_from_context(ctx)))
        host = {name: host_us(lambda: m.update_from_context(ctx), args.reps)
                for name, m in (("torch", old), ("kernel", new))}
        assert torch.equal(old._valid, new._valid) and torch.equal(old.decode_count, new.decode_count)
        assert int(new.decode_count) == tokens
        row = {f"{k}_event_us_median": statistics.median(v) for k, v in ev.items()}
        row.update({f"{k}_host_us": v for k, v in host.items()})
        row["event_ratio"] = row["kernel_event_us_median"] / row["torch_event_us_median"]
        if step_us:
            row["torch_pct_of_step"] = 100 * row["torch_event_us_median"] / step_us
            row["kernel_pct_of_step"] = 100 * row["kernel_event_us_median"] / step_us
        out["per_t"][tokens] = row
        share = (f"; of the {step_us:.0f} µs step {row['torch_pct_of_step']:.1f}% -> "
                 f"{row['kernel_pct_of_step']:.1f}%" if step_us else "")
        print(f"T={tokens:3d}: refresh torch {row['torch_event_us_median']:6.1f} µs vs kernel "
              f"{row['kernel_event_us_median']:6.1f} µs (events, x{row['event_ratio']:.2f}); host "
              f"{row['torch_host_us']:6.1f} vs {row['kernel_host_us']:6.1f} µs/call{share}", flush=True)
    print(markdown(out))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "step_masks_gpu.json").write_text(json.dumps(out, indent=1))
    return 0


def markdown(r: dict) -> str:
    lines = ["| T | torch path µs/step (events) | kernel µs/step (events) | kernel ÷ torch | "
             "host µs/call torch → kernel | % of the step torch → kernel |", "|---|---|---|---|---|---|"]
    for t, row in r["per_t"].items():
        pct = (f"{row['torch_pct_of_step']:.1f}% → {row['kernel_pct_of_step']:.1f}%"
               if "torch_pct_of_step" in row else "—")
        lines.append(f"| {t} | {row['torch_event_us_median']:.1f} | {row['kernel_event_us_median']:.1f} | "
                     f"{row['event_ratio']:.2f} | {row['torch_host_us']:.1f} → {row['kernel_host_us']:.1f} | {pct} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
