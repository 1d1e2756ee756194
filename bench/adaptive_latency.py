#!/usr/bin/env python3
"""Step times of a static and an adaptive lane through a class shift, with the adaptive swaps'
copies running beside the steps: p50 / p99 / max per phase, the cold share over time, the policy's
share of a step, every step checked against the unsplit layer.

Layers: ``--layers`` rows of the 40-layer DSv4.1-Flash profiles (default 13 of them, evenly spaced)
at its MXFP4 expert geometry (384 experts, hidden 5120, intermediate 2304; random bytes, each layer
from its own seed so it can be generated again for the check), as vLLM 0.33's ``RoutedExperts`` +
``Mxfp4MoEMethod`` stand-ins re-homed by the plugin's ``WorkerRuntime`` with adaptive residency at
its defaults (``EXPERT_RESIDENCY_ADAPTIVE``, three resampled class profiles as priors): 295 hot
experts + the spare HBM rows in HBM, 89 cold + the spare host rows in pinned host memory read in
place, boot map the repository's agent map. One step = the captured CUDA graph of all layers' split
forwards (the plugin's fused Triton layer), as ``bench/adaptive_h200.py``.

Per T (tokens per decode step), the same routing (bench/adaptive_sim.py's generator: the boot
class, then the shift phases) goes through two lanes on the same banks, one after the other:

* **static**: the boot map, counter and policy off (the graph a lane without adaptive residency
  replays);
* **adaptive**: the plugin's per-step path — mask refresh, the step barrier (a due barrier's map
  flips and plan, ``tick``, ``pump``: this step's copies on the side streams) — then the replay.

Step time = the interval between the starts of consecutive steps on the GPU's step stream (a CUDA
event recorded before each step's work): the barrier's work, the replay, and any gap where the
device waited for the host all land in it, as they would in the time between two tokens. The host
issues step ``s`` only once the device has begun step ``s - 1`` (vLLM reads each step's tokens
back: its host runs about one step ahead, not arbitrarily far). Every
step's output is kept; afterwards the static lane's equal the adaptive lane's bit for bit, and
every layer's are recomputed by an unsplit layer over the same bytes (generated again from the
layer's seed) and compared with ``torch.equal`` — every step, every layer, both T.

Also measured: one expert row copied on the side stream alone (the copies' stream time per row);
the counter's cost per layer (static vs adaptive replays, alternating, in-domain routing); a
40-layer policy's barrier (``adaptive_h200.rank_40``); the async guards on the GPU — a flip that
does not wait for a copy still in flight (the copy stream held back by a sleep kernel) is caught by
the bit-exact check, the ordered flip waits on the device while the host returns at once, a flip
before a transfer's copies were issued is refused, a forward inside a barrier is refused.

    PYTHONPATH=runtime python3 bench/adaptive_latency.py --out $OUT
    .venv/bin/python bench/adaptive_latency.py --smoke      # CPU, tiny geometry: the logic only
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
for sub in ("runtime", "tests", "bench"):
    sys.path.insert(0, str(ROOT / sub))

from adaptive_h200 import (  # noqa: E402
    FIELD_STEP_US,
    MODEL_LAYERS,
    capture,
    fresh_policy,
    in_barrier_refused,
    live_cold,
    phase_figures,
    profiles,
    rank_40,
    sync,
    write_priors,
)
from adaptive_sim import TOP_K, make_traffic  # noqa: E402
from expert_residency.core.adaptive import AdaptiveConfig, Swap  # noqa: E402
from expert_residency.core.adaptive_setup import ENV_ADAPTIVE, ENV_PRIORS, format_adaptive_spec  # noqa: E402
from expert_residency.core.copies import CudaCopies, ThreadedCopies  # noqa: E402
from expert_residency.core.slots import CHUNKS_PER_ROW  # noqa: E402
from expert_residency.vllm_plugin.worker_runtime import set_runtime  # noqa: E402
from plugin_entry_support import plugin_runtime, step_context  # noqa: E402

DEFAULT_ROWS = "0,3,6,9,12,16,19,22,25,28,32,35,39"


def layer_weights(seed: int, experts: int, hidden: int, inter: int, dev: torch.device) -> dict[str, torch.Tensor]:
    """One layer's checkpoint-layout MXFP4 tensors from its own seed (generated again for the check)."""
    gen = torch.Generator(device=dev).manual_seed(seed)
    if dev.type == "cuda":
        from gpu_residency import random_layer

        return random_layer(experts, gen)
    from expert_residency.mxfp4 import quantize_mxfp4

    out = {}
    for name, shape in (("w13", (experts, 2 * inter, hidden)), ("w2", (experts, hidden, inter))):
        q, scale = quantize_mxfp4(torch.randn(*shape, generator=gen) * 0.05)
        out[f"{name}_weight"], out[f"{name}_weight_scale"] = q, scale
    return out


class StepClock:
    """Marks on the step stream (CUDA events; host clock on the CPU): step time = mark to mark."""

    def __init__(self, dev: torch.device, n: int) -> None:
        self.cuda = dev.type == "cuda"
        self.marks = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)] if self.cuda else [0.0] * (n + 1)

    def wait(self, k: int) -> None:
        """The host waits until the device has begun step ``k`` (nothing on the CPU)."""
        if self.cuda and k >= 0:
            self.marks[k].synchronize()

    def mark(self, k: int) -> None:
        if self.cuda:
            self.marks[k].record()
        else:
            self.marks[k] = time.perf_counter()

    def periods_ms(self) -> np.ndarray:
        if self.cuda:
            torch.cuda.synchronize()
            return np.array([a.elapsed_time(b) for a, b in zip(self.marks[:-1], self.marks[1:])])
        return np.diff(np.array(self.marks)) * 1e3


def stats(ms: np.ndarray) -> dict:
    return {"n": int(ms.size), "p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)),
            "max": float(ms.max()), "mean": float(ms.mean())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", default=DEFAULT_ROWS, help="rows of the 40-layer profiles to serve")
    ap.add_argument("--tokens", default="1,16")
    ap.add_argument("--boot-steps", type=int, default=96,
                    help="decode steps of the boot class first (3 barriers at interval 32: the second "
                         "captures the ranking's CUDA graph, once per process)")
    ap.add_argument("--shifts", default="1:prose,math;16:prose", help="phases after the boot class, per T")
    ap.add_argument("--steps", default="1:224;16:200", help="decode steps per shift phase, per T")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true",
                    help="CPU, 3 layers of 32 experts, hidden 128, T = 1 and 4, few steps: checks the logic")
    ap.add_argument("--lean", action="store_true",
                    help="skip decode-only ranking's cost and the 40-layer barrier (a short run)")
    ap.add_argument("--copy-path", choices=("runtime", "copy_"), default="runtime",
                    help="how the side streams copy: cudaMemcpyAsync of the loaded CUDA runtime (the "
                         "default, as a lane runs) or Tensor.copy_ (the earlier path, for comparison)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    dev = torch.device("cpu" if args.smoke else "cuda")
    experts, hidden, inter, hot_n = (32, 128, 64, 24) if args.smoke else (384, 5120, 2304, 295)
    rows = [int(r) for r in args.layers.split(",")]
    shifts = {int(t): p.split(",") for t, p in (x.split(":") for x in args.shifts.split(";"))}
    steps_of = {int(t): int(n) for t, n in (x.split(":") for x in args.steps.split(";"))}
    if args.smoke:   # a CPU's torch reference experts are slow: few layers, steps and tokens
        rows = rows[:3]
        args.boot_steps = min(args.boot_steps, 8)
        shifts = {min(t, 4): p for t, p in shifts.items()}
        steps_of = {min(t, 4): min(n, 12) for t, n in steps_of.items()}
    order = list(range(len(rows)))
    logp, cold, priors = profiles(rows, experts, hot_n, args.seed)
    config = AdaptiveConfig(interval=4 if args.smoke else AdaptiveConfig().interval)
    seeds = {i: 1000 * (args.seed + 1) + i for i in order}
    t0 = time.perf_counter()
    weights = {i: layer_weights(seeds[i], experts, hidden, inter, dev) for i in order}
    boot_hot = {i: [int(e) for e in np.flatnonzero(~cold["agent"][row])] for row, i in enumerate(order)}
    tmp = Path(tempfile.mkdtemp(prefix="adaptive-latency-"))
    os.environ[ENV_ADAPTIVE] = format_adaptive_spec(config)
    os.environ[ENV_PRIORS] = ",".join(write_priors(priors, order, tmp))
    max_tokens = max(512, experts)
    runtime, layers = plugin_runtime(weights, "residency", top_k=TOP_K, max_num_tokens=max_tokens,
                                     hot=boot_hot, count=True)
    runtime._start_adaptive()
    del weights
    sync(dev)
    policy0 = runtime.policy
    runtime.step_barrier.on_report = None
    boot_cold = live_cold(policy0, order, experts)
    spare = policy0.spare_bytes()
    results: dict = {"machine": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (smoke)",
                     "torch": torch.__version__, "layers": rows, "experts": experts, "hot": hot_n,
                     "config": vars(config), "setup_s": time.perf_counter() - t0, "spare_bytes": spare,
                     "forward": "fused" if runtime.fused else "per-pick", "per_t": {}}
    print(f"setup {results['setup_s']:.1f} s: {len(order)} layers, forward {results['forward']}, "
          f"spare HBM {spare['hbm'] / 2**30:.2f} GiB, spare host {spare['host'] / 2**30:.2f} GiB, "
          f"adaptive {format_adaptive_spec(config)}", flush=True)
    results["row_copy_us"] = row_copy_us(policy0, order, dev)
    # as vLLM's engine core does once its start-up is done (vllm/v1/engine/core.py, freeze_gc_heap):
    # the start-up heap leaves the collector's scans, so a full collection no longer pauses a step
    gc.collect()
    gc.freeze()
    results["gc_frozen"] = gc.get_freeze_count()

    def forward_all(rt, mods, x, w, ids):
        set_runtime(rt)
        return [mods[i].forward_modular(x[n], w[n], ids[n]) for n, i in enumerate(order)]

    for tokens in sorted(shifts):
        copies = ThreadedCopies() if args.smoke else CudaCopies(dev, runtime_memcpy=args.copy_path == "runtime")
        results["copy_path"] = getattr(getattr(copies, "memcpy", None), "path", None) or type(copies).__name__ + " / copy_"
        policy = fresh_policy(runtime, policy0, boot_cold, order, experts, config,
                              lookahead=True if args.smoke else None, copies=copies)
        ctx = step_context(tokens, [1] * tokens, dev)
        runtime.on_forward_context(ctx)
        phases = ["agent"] + shifts[tokens]
        lengths = {"agent": args.boot_steps} | {p: steps_of[tokens] for p in shifts[tokens]}
        traffic = make_traffic(logp, tokens, max(lengths.values()), args.seed + tokens)
        ids = torch.cat([torch.from_numpy(traffic.ids[p][:lengths[p]].astype(np.int32)) for p in phases]
                        ).to(dev).permute(0, 2, 1, 3).contiguous()                   # [steps, L, T, K]
        n = ids.shape[0]
        g = torch.Generator(device=dev).manual_seed(args.seed + 7 * tokens)
        xs = [torch.randn(len(order), tokens, hidden, generator=g, device=dev).to(torch.bfloat16) for _ in range(4)]
        w_all = torch.softmax(torch.randn(n, len(order), tokens, TOP_K, generator=g, device=dev), -1)

        def counted(flag: bool) -> None:
            for m in layers.values():
                m._er_counted = flag

        step_fn = lambda x, w, i: torch.stack(forward_all(runtime, layers, x, w, i))  # noqa: E731
        counted(False)
        static_g = capture(step_fn, xs[0], w_all[0], ids[0], dev)
        counted(True)
        adaptive_g = capture(step_fn, xs[0], w_all[0], ids[0], dev)
        policy.counter.reset()
        policy._seen.zero_()

        lanes = {}
        for lane in ("static", "adaptive"):
            graph = adaptive_g if lane == "adaptive" else static_g
            outs = torch.empty((n, *graph.out.shape), dtype=graph.out.dtype, device=dev)
            clock = StepClock(dev, n)
            masks_at, rows_issued, flips, host_us = [(0, boot_cold)], np.zeros(n), [], np.zeros(n)
            pump = policy.pump
            issued = {"rows": 0.0}

            def counting_pump():
                k = pump()
                issued["rows"] += k / CHUNKS_PER_ROW
                return k

            policy.pump = counting_pump   # what the step barrier calls
            parts = HostParts(policy, runtime, n) if lane == "adaptive" else None
            # each lane starts from a frozen heap (as a vLLM engine after its start-up): a full
            # collection during the lane scans only what the lane itself left alive
            gc.collect()
            gc.freeze()
            gc_before = [g["collections"] for g in gc.get_stats()]
            sync(dev)
            for s in range(n):
                # vLLM reads each step's sampled tokens back before it schedules much further: the
                # host stays about one step ahead of the device (async scheduling), not hundreds
                clock.wait(s - 1)
                clock.mark(s)
                if lane == "adaptive":
                    t = time.perf_counter()
                    swaps = policy.swaps_done
                    issued["rows"] = 0.0
                    runtime.on_forward_context(ctx)
                    parts.step = s
                    runtime.before_forward(ctx)   # a due barrier, tick, pump (a flip-only step too)
                    host_us[s] = (time.perf_counter() - t) * 1e6
                    rows_issued[s] = issued["rows"]
                    if policy.swaps_done != swaps:   # the map this step's forward reads changed
                        # one device op (read after the run): the host mirrors' masks cost ~0.5 ms here
                        masks_at.append((s, policy.hot_mask()))
                        flips.append({"step": s, "swaps": policy.swaps_done - swaps,
                                      "in_flight": len(policy.in_flight), "waiting": len(policy.waiting)})
                graph.load(x=xs[s % 4], topk_weights=w_all[s], topk_ids=ids[s])
                graph.replay()
                outs[s].copy_(graph.out)
            clock.mark(n)
            periods = clock.periods_ms()
            gc_runs = [g["collections"] - b for g, b in zip(gc.get_stats(), gc_before)]
            masks_at = [(at, m if isinstance(m, np.ndarray) else ~m.cpu().numpy()) for at, m in masks_at]
            del policy.pump
            if parts is not None:
                parts.remove()
            lanes[lane] = {"outs": outs, "periods": periods, "masks_at": masks_at, "rows": rows_issued,
                           "flips": flips, "host_us": host_us, "parts": parts.series() if parts else None,
                           "gc_collections": gc_runs}
            print(f"T={tokens} {lane}: {n} steps, step ms {stats(periods)}", flush=True)
        policy.copies.drain()
        same = all(torch.equal(lanes["static"]["outs"][s], lanes["adaptive"]["outs"][s]) for s in range(n))
        unsplit_ok = verify_unsplit(lanes["adaptive"]["outs"], xs, w_all, ids, order, seeds, experts, hidden,
                                    inter, max_tokens, dev)
        set_runtime(runtime)
        assert same, f"T={tokens}: the adaptive lane's outputs differ from the static lane's"
        assert unsplit_ok, f"T={tokens}: a step's output differs from the unsplit layer's"
        row = {"checked_steps": n, "static_equals_adaptive": same, "adaptive_equals_unsplit": unsplit_ok,
               "swaps": policy.swaps_done, "barriers": policy.barriers, "graph_state": policy.graph_state,
               "flips": lanes["adaptive"]["flips"], "copied_bytes": dict(policy.copied_bytes),
               "phases": {}}
        start = 0
        for phase in phases:
            span = slice(start, start + lengths[phase])
            st, ad = lanes["static"]["periods"][span], lanes["adaptive"]["periods"][span]
            rows_p = lanes["adaptive"]["rows"][span]
            fig = {"static_ms": stats(st), "adaptive_ms": stats(ad),
                   "p99_ratio": float(np.percentile(ad, 99) / np.percentile(st, 99)),
                   "max_ratio": float(ad.max() / st.max()), "p50_ratio": float(np.median(ad) / np.median(st)),
                   "copy_rows_per_step": float(rows_p.mean()),
                   "copy_stream_ms_per_step": float(rows_p.mean() * results["row_copy_us"]["median"] / 1e3),
                   "host_us_per_step": stats(lanes["adaptive"]["host_us"][span] / 1e3)}
            frozen = live_cold_at(lanes["adaptive"]["masks_at"], start)
            swaps = sum(f["swaps"] for f in row["flips"] if start <= f["step"] < start + lengths[phase])
            fig |= phase_figures(ids[span], start, lanes["adaptive"]["masks_at"], boot_cold, cold[phase], frozen,
                                 tokens, swaps=swaps)
            row["phases"][phase] = fig
            start += lengths[phase]
        row["series_ms"] = {k: v["periods"].round(4).tolist() for k, v in lanes.items()}
        row["host_us_series"] = lanes["adaptive"]["host_us"].round(1).tolist()
        row["host_parts_us"] = lanes["adaptive"]["parts"]
        row["gc_collections"] = {k: v["gc_collections"] for k, v in lanes.items()}
        row["copy_rows_series"] = lanes["adaptive"]["rows"].tolist()
        if tokens == 1:
            row["counter"] = counter_cost(static_g, adaptive_g, xs, w_all, ids[:args.boot_steps], len(order), dev)
        results["per_t"][tokens] = row
        print(table_t(tokens, row), flush=True)
        save(results, args.out)   # after each T: a run cut short keeps what it measured
        del static_g, adaptive_g, lanes

    results["guards"] = guards(runtime, layers, order, seeds, experts, hidden, inter, max_tokens, dev, forward_all)
    save(results, args.out)
    if not args.lean:
        results["decode_ranking_t1"] = decode_ranking_cost(runtime, layers, order, hidden, logp, args.seed, dev,
                                                           forward_all)
        save(results, args.out)
        results["rank40"] = rank_40(logp, cold, priors, experts, config, dev, args.seed, tokens=(1,))
    results["share_t1"] = share(results, config)
    print(json.dumps({k: results[k] for k in ("row_copy_us", "guards", "share_t1")}, indent=1, default=str))
    save(results, args.out)
    if copies_close := getattr(runtime.policy.copies, "close", None):
        copies_close()
    return 0


class HostParts:
    """Host time per step of each part of the adaptive step path (µs), by wrapping the policy's
    methods on the instance: where a slow step's host time went."""

    NAMES = ("barrier", "_flip_copied", "_read_plan", "_start_plan", "_start_transfer", "_refresh_hash")

    def __init__(self, policy, runtime, steps: int) -> None:
        self.policy, self.step = policy, 0
        self.us = {name: np.zeros(steps) for name in self.NAMES + ("copies.issue", "masks")}
        for name in self.NAMES:
            setattr(policy, name, self._timed(name, getattr(policy, name)))
        self._issue = policy.copies.issue
        policy.copies.issue = self._timed("copies.issue", self._issue)
        self._masks_owner = runtime
        runtime.on_forward_context = self._timed("masks", runtime.on_forward_context)
        self.us["gc"] = np.zeros(steps)   # the collector's pauses (any generation) during the step path
        self._gc_start = 0.0
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.us["gc"][self.step] += (time.perf_counter() - self._gc_start) * 1e6

    def _timed(self, name, fn):
        def run(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.us[name][self.step] += (time.perf_counter() - t) * 1e6
        return run

    def remove(self) -> None:
        for name in self.NAMES:
            delattr(self.policy, name)
        del self.policy.copies.issue
        del self._masks_owner.on_forward_context
        gc.callbacks.remove(self._gc)

    def series(self) -> dict:
        return {k: v.round(1).tolist() for k, v in self.us.items()}


def save(results: dict, out: Path | None) -> None:
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "adaptive_latency.json").write_text(json.dumps(results, indent=1, default=str))


def live_cold_at(masks_at, step: int) -> np.ndarray:
    return [m for at, m in masks_at if at <= step][-1]


def verify_unsplit(outs, xs, w_all, ids, order, seeds, experts, hidden, inter, max_tokens, dev) -> bool:
    """Every step's output of every layer against an unsplit layer over the same bytes (generated
    again from the layer's seed, one layer at a time), ``torch.equal``."""
    bad = torch.zeros((), dtype=torch.int64, device=dev)
    for n, i in enumerate(order):
        ref, ref_layers = plugin_runtime({i: layer_weights(seeds[i], experts, hidden, inter, dev)}, "unsplit",
                                         top_k=TOP_K, max_num_tokens=max_tokens)
        set_runtime(ref)
        for s in range(ids.shape[0]):
            y = ref_layers[i].forward_modular(xs[s % 4][n], w_all[s][n], ids[s][n])
            bad += (y != outs[s][n]).any().to(torch.int64)
        del ref, ref_layers
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return int(bad) == 0


def row_copy_us(policy, order, dev) -> dict:
    """One expert row (all four tensors) copied host → HBM on the side stream, nothing else running:
    the copies' stream time per row (CUDA events on that stream), 16 rows one at a time."""
    layer = policy.layers[order[0]]
    slots = policy._slots[order[0]]
    src_row, dst_row = layer.cold_ids.index(layer.cold_experts[0]), slots.free_hot[0]
    copies = [(layer.hot.tensors[k][dst_row], layer.cold.tensors[k][src_row], "in") for k in layer.hot.tensors]
    if dev.type != "cuda":
        t = time.perf_counter()
        for dst, src, _ in copies:
            dst.copy_(src)
        return {"median": (time.perf_counter() - t) * 1e6, "n": 1}
    stream = policy.copies.streams["in"]
    times = []
    for _ in range(16):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            a.record()
            for dst, src, _ in copies:
                dst.copy_(src, non_blocking=True)
            b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    row_bytes = sum(d.numel() * d.element_size() for d, _, _ in copies)
    return {"median": statistics.median(times), "max": max(times), "n": len(times), "row_bytes": row_bytes,
            "gb_per_s": row_bytes / statistics.median(times) / 1e3}


def counter_cost(static_g, adaptive_g, xs, w_all, ids, layers, dev, reps: int | None = None) -> dict:
    """Per-layer step time of the static and the adaptive graph (counter on), replays alternating
    on in-domain routing, CUDA events; the counter's cost is the difference of the medians."""
    reps = reps or (60 if dev.type == "cuda" else 4)
    times = {"static": [], "adaptive": []}
    cases = [("static", static_g), ("adaptive", adaptive_g)]
    for s in range(reps):
        for name, graph in (cases if s % 2 == 0 else cases[::-1]):
            graph.load(x=xs[s % 4], topk_weights=w_all[s % w_all.shape[0]], topk_ids=ids[s % ids.shape[0]])
            if dev.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                graph.replay()
                b.record()
                b.synchronize()
                times[name].append(a.elapsed_time(b) * 1e3)
            else:
                t = time.perf_counter()
                graph.replay()
                times[name].append((time.perf_counter() - t) * 1e6)
    out = {f"{k}_us_per_layer": statistics.median(v) / layers for k, v in times.items()}
    out["counter_us_per_layer"] = out["adaptive_us_per_layer"] - out["static_us_per_layer"]
    return out


def decode_ranking_cost(runtime, layers, order, hidden, logp, seed, dev, forward_all) -> dict:
    """What decode-only ranking (``rank_picks: decode``) adds to a T = 1 step of the fused layer: the
    adaptive graph (counter on) against the same graph captured after the decode count and the
    decode rows are enabled (the counts before the first layer, the decode-only step's picks added
    after the last), replays alternating on in-domain routing."""
    ctx = step_context(1, [1], dev)
    runtime.on_forward_context(ctx)
    traffic = make_traffic(logp, 1, 64, seed + 99)
    ids = torch.from_numpy(traffic.ids["agent"][:64].astype(np.int32)).to(dev).permute(0, 2, 1, 3).contiguous()
    g = torch.Generator(device=dev).manual_seed(seed + 3)
    xs = [torch.randn(len(order), 1, hidden, generator=g, device=dev).to(torch.bfloat16) for _ in range(4)]
    w_all = torch.softmax(torch.randn(64, len(order), 1, TOP_K, generator=g, device=dev), -1)
    for m in layers.values():
        m._er_counted = True
    step_fn = lambda x, w, i: torch.stack(forward_all(runtime, layers, x, w, i))  # noqa: E731
    counted = capture(step_fn, xs[0], w_all[0], ids[0], dev)
    runtime.masks.enable_decode_rows()
    runtime.counter.enable_decode_counts()
    runtime.on_forward_context(ctx)
    decode = capture(step_fn, xs[0], w_all[0], ids[0], dev)
    before = int(runtime.counter.decode_counts.sum())
    reps = 60 if dev.type == "cuda" else 4
    out = counter_cost(counted, decode, xs, w_all, ids, len(order), dev, reps)
    added = int(runtime.counter.decode_counts.sum()) - before
    sync(dev)
    return {"counted_us_per_layer": out["static_us_per_layer"], "decode_us_per_layer": out["adaptive_us_per_layer"],
            "decode_ranking_us_per_layer": out["counter_us_per_layer"],
            # a captured graph keeps what it captured; the CPU's eager stand-in re-runs the Python, so
            # there the counted step counts decode picks too
            "decode_picks_counted": added,
            "decode_picks_expected": reps * len(order) * TOP_K * (1 if dev.type == "cuda" else 2)}


def guards(runtime, layers, order, seeds, experts, hidden, inter, max_tokens, dev, forward_all) -> dict:
    """On the device: a flip that does not wait for a copy still in flight is caught by the bit-exact
    check (the copy stream is held back by a sleep kernel first); the ordered flip makes the step
    stream wait for the copy while the host returns at once; a flip before a transfer's copies were
    issued is refused; a forward inside a barrier is refused."""
    policy = runtime.policy
    policy.cancel_transfers()
    index = order[0]
    ref, ref_layers = plugin_runtime({index: layer_weights(seeds[index], experts, hidden, inter, dev)}, "unsplit",
                                     top_k=TOP_K, max_num_tokens=max_tokens)
    e = torch.arange(experts, device=dev)
    ids = torch.stack([(e + (experts // TOP_K) * k) % experts for k in range(TOP_K)], dim=1).to(torch.int32)
    gen = torch.Generator(device=dev).manual_seed(5)
    x = torch.randn(experts, hidden, generator=gen, device=dev).to(torch.bfloat16)
    w = torch.softmax(torch.randn(experts, TOP_K, generator=gen, device=dev), -1)

    def check() -> bool:
        set_runtime(ref)
        want = ref_layers[index].forward_modular(x, w, ids)
        flag = layers[index]._er_counted
        layers[index]._er_counted = False
        set_runtime(runtime)
        got = layers[index].forward_modular(x, w, ids)
        layers[index]._er_counted = flag
        return bool(torch.equal(got, want))

    out = {"whole_before": check()}
    layer = policy.layers[index]
    slots = policy._slots[index]

    def transfer(hold_back: bool):
        t = slots.reserve(Swap(index, layer.cold_experts[0], layer.hot_experts[0]))
        slots.check_destination(t)
        for tensor in layer.hot.tensors.values():   # a spare row may still hold an expert's old bytes
            tensor[t.hot_row].zero_()
        policy.copies.copies_wait_compute()         # the copies start after the zeroing
        if hold_back and dev.type == "cuda":
            with torch.cuda.stream(policy.copies.streams["in"]):
                torch.cuda._sleep(100_000_000)        # ~50 ms: the copy is still to come when the flip runs
        for chunk in t.chunks:
            policy.copies.issue(chunk)
        t.issued, t.marker = len(t.chunks), policy.copies.marker()
        return t

    # refused: a flip before the copies were issued
    t = slots.reserve(Swap(index, layer.cold_experts[0], layer.hot_experts[0]))
    try:
        policy._flip([t])
        out["flip_before_issue_refused"] = False
    except RuntimeError as exc:
        out["flip_before_issue_refused"] = "before its copies were issued" in str(exc)
    slots.release(t)
    # caught: the flip without the wait, a forward right after it (on the CPU the copy has landed:
    # nothing to catch there, the smoke run checks the logic only)
    t = transfer(hold_back=True)
    policy._flip([t])
    out["unwaited_flip_caught"] = (not check()) if dev.type == "cuda" else True
    policy.copies.drain()
    out["whole_once_copied"] = check()
    # ordered: the step stream waits on the device; the host does not
    t = transfer(hold_back=True)
    start = time.perf_counter()
    policy.copies.compute_waits([t.marker])
    policy._flip([t])
    out["ordered_flip_host_ms"] = (time.perf_counter() - start) * 1e3
    out["ordered_flip_exact"] = check()
    policy.copies.copies_wait_compute()
    out["in_barrier_forward_refused"] = in_barrier_refused(policy, layers, order, experts, hidden, dev)
    set_runtime(runtime)
    ok = all(v for k, v in out.items() if k != "ordered_flip_host_ms")
    assert ok, out
    return out


def share(r: dict, config: AdaptiveConfig) -> dict | None:
    """Counter + policy + copies as a share of a 40-layer-equivalent one-stream step, in-domain
    (the boot class, after the ranking's capture): the counter's per-layer cost × 40, the 40-layer
    barrier's stream time every ``interval`` steps, and the copies' stream time per step of this
    lane's in-domain steps scaled to 40 layers; over the field report's 11.1 ms step and over 40 ×
    the static lane's per-layer step."""
    t1 = r["per_t"].get(1)
    rank = (r.get("rank40") or {}).get(1)
    if t1 is None or not rank or "lookahead_stream_ms" not in rank:
        return None
    counter = MODEL_LAYERS * max(t1["counter"]["counter_us_per_layer"], 0.0)
    barrier = rank["lookahead_stream_ms"]["median"] * 1e3 / config.interval
    boot = t1["phases"]["agent"]
    copies = boot["copy_rows_per_step"] * r["row_copy_us"]["median"] * MODEL_LAYERS / len(r["layers"])
    total = counter + barrier + copies
    step = MODEL_LAYERS * t1["counter"]["static_us_per_layer"]
    return {"counter_us": counter, "barrier_us_per_step": barrier, "copies_us_per_step": copies,
            "total_us": total, "share_of_11_1ms_step": total / FIELD_STEP_US, "share_of_moe_step": total / step,
            "barrier_host_us_per_step": rank["lookahead_host_ms"]["median"] * 1e3 / config.interval}


def table_t(tokens: int, row: dict) -> str:
    lines = [f"T={tokens}: {row['checked_steps']} steps checked (static == adaptive == unsplit), {row['swaps']} swaps, "
             f"{row['barriers']} barriers, copied {row['copied_bytes']}"]
    for phase, f in row["phases"].items():
        s, a = f["static_ms"], f["adaptive_ms"]
        cs = f["cold_share"]
        lines.append(f"  {phase:5s} static p50/p99/max {s['p50']:.3f}/{s['p99']:.3f}/{s['max']:.3f} ms | adaptive "
                     f"{a['p50']:.3f}/{a['p99']:.3f}/{a['max']:.3f} ms | p99 x{f['p99_ratio']:.3f} max x{f['max_ratio']:.3f} "
                     f"| copy rows/step {f['copy_rows_per_step']:.2f} | cold static {cs['static']:.2%} adaptive "
                     f"{cs['adaptive']:.2%} oracle {cs['oracle']:.2%} | 1.5x in {f['steps_to_1.5x_oracle']} steps")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
