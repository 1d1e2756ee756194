#!/usr/bin/env python3
"""Adaptive residency through the plugin's split layer on one GPU: shifting synthetic routing, the
cold share static vs adaptive vs the per-class oracle, barrier times, the policy's share of a step.

Layers: ``--layers`` MoE layers with DSv4.1-Flash's MXFP4 expert geometry (384 experts, hidden
5120, intermediate 2304; random bytes, valid MXFP4) built as vLLM 0.33's ``RoutedExperts`` +
``Mxfp4MoEMethod`` stand-ins (tests/plugin_entry_support.py) and re-homed by the plugin's
``WorkerRuntime`` (hot bank in HBM, cold bank in exact-size pinned host memory read in place; boot
map: the repository's agent map, ``recipes/maps/dsv41-flash/agent.rowmap``, rows of those layers).
Adaptive residency comes from the plugin's own path: ``EXPERT_RESIDENCY_ADAPTIVE`` (the defaults)
and ``EXPERT_RESIDENCY_ADAPTIVE_PRIORS`` (three class histograms, each an independent multinomial
resample of the repository's synthetic agent/prose/math profile, so the prior is as noisy as a real
profiling run), ``WorkerRuntime._start_adaptive``, and per step ``on_forward_context`` +
``before_forward`` — what vLLM's ``create_forward_context`` hook runs — before the CUDA-graph
replay of the whole step (the graph was captured once through the plugin entry).

Traffic (bench/adaptive_sim.py's generator): phases agent (the boot class), prose, math, mix (each
token's class drawn uniformly), decode steps of T tokens (T = 1 and 16), every token picking 6
distinct experts per layer from its class's per-layer distribution.

Checked while it runs (the script fails otherwise): after every barrier that swapped, every expert
of every layer through every top-k slot (``E`` rows) equals the unsplit layer bit for bit
(``torch.equal``; the reference is a second plugin runtime in ``unsplit`` mode over copies of the
same weights); every ``--check-every`` steps the replayed step equals the unsplit layer on that
step's routing; each barrier's window cold picks (the in-kernel counter, under the live map) equal
a recount by hand from the routing and the maps; a swap run with its map flip first is caught by
the bit-exact check (and the state is whole again once its copies run); a forward inside a barrier
is refused by the plugin entry.

Measured: cold share over time (JSON series) and per phase (second-half mean) for static (boot map),
adaptive (live map) and oracle (the phase's own class map; mix: top-295 of the merged profiles);
decode steps until the trailing 32-step cold share is within 1.5x of the oracle's and until 80% of
the gap (map at the shift → oracle) is closed; time per barrier (ranking + swaps, stream drained);
per-layer step time of a static lane (counter off, adaptive off) and of an adaptive lane (counter
on), CUDA events, alternating; the host hooks' time; a 40-layer policy's barrier (without
lookahead: drained; with lookahead, the default on CUDA: the stream time of the work it enqueues
and the host time of the call; its plans checked against a policy without lookahead, one barrier
apart, and against an eager twin); one swap's time at this geometry; and from those the policy's
share of a 40-layer-equivalent step at T = 1 (``share_t1``). With lookahead each barrier's report
carries the previous window (the plan it applied); the window recount follows that.

    PYTHONPATH=runtime python3 bench/adaptive_h200.py --out $OUT
    .venv/bin/python bench/adaptive_h200.py --smoke        # CPU, tiny geometry: the logic only
    .venv/bin/python bench/adaptive_h200.py --smoke --lookahead on   # the same with lookahead
"""

from __future__ import annotations

import argparse
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

from adaptive_sim import CLASSES, PHASES, TOP_K, first_step, load_profiles, make_traffic, trailing_share  # noqa: E402
from expert_residency.contract.env import ADAPTIVE as ENV_ADAPTIVE  # noqa: E402
from expert_residency.contract.env import ADAPTIVE_PRIORS as ENV_PRIORS  # noqa: E402
from expert_residency.core import ExpertCounter, device_allocator, rehome_layer  # noqa: E402
from expert_residency.core.adaptive import AdaptiveConfig, AdaptivePolicy, Swap  # noqa: E402
from expert_residency.core.adaptive_setup import format_adaptive_spec  # noqa: E402
from expert_residency.core.slots import share_row_codes  # noqa: E402
from expert_residency.formats import Histogram, save_histogram  # noqa: E402
from expert_residency.vllm_plugin.worker_runtime import set_runtime  # noqa: E402
from plugin_entry_support import plugin_runtime, step_context  # noqa: E402

WINDOW = 32
TARGET_RATIO, CLOSE = 1.5, 0.8
MODEL_LAYERS = 40  # DSv4.1-Flash MoE layers: the "40-layer-equivalent" step
FIELD_STEP_US = 11_100.0  # one-stream k=0 decode step, the field report "vLLM: Pin Hot Experts" (2026-09-17)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def mxfp4_layer(experts: int, hidden: int, inter: int, gen: torch.Generator, dev) -> dict[str, torch.Tensor]:
    """One MoE layer's experts in vLLM 0.33's MXFP4 checkpoint layout: on the GPU at DSv4.1-Flash's
    geometry, random bytes (bench/gpu_residency.py); for the CPU smoke run, small random weights
    quantised by the runtime's own MXFP4 encoder."""
    if dev.type == "cuda":
        from gpu_residency import random_layer

        return random_layer(experts, gen)
    from expert_residency.mxfp4 import quantize_mxfp4

    out = {}
    for name, shape in (("w13", (experts, 2 * inter, hidden)), ("w2", (experts, hidden, inter))):
        q, scale = quantize_mxfp4(torch.randn(*shape, generator=gen) * 0.05)
        out[f"{name}_weight"], out[f"{name}_weight_scale"] = q, scale
    return out


class EagerStep:
    """CapturedStep's interface without a graph (CPU smoke run)."""

    def __init__(self, step, x, w, ids) -> None:
        self.step, self.x, self.topk_weights, self.topk_ids = step, x.clone(), w.clone(), ids.clone()
        self.out = None

    def load(self, x=None, topk_weights=None, topk_ids=None) -> None:
        for name, v in (("x", x), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
            if v is not None:
                getattr(self, name).copy_(v)

    def replay(self) -> None:
        self.out = self.step(self.x, self.topk_weights, self.topk_ids)


def capture(step, x, w, ids, dev):
    if dev.type != "cuda":
        s = EagerStep(step, x, w, ids)
        s.replay()
        return s
    from expert_residency.gpu.graphs import CapturedStep

    g = CapturedStep(step, x, w, ids)
    g.replay = g.graph.replay  # type: ignore[method-assign]
    return g


def event_seconds(fn, dev) -> float:
    """CUDA events around ``fn`` (bench/gpu_residency.py); a host clock on the CPU smoke run."""
    if dev.type == "cuda":
        from gpu_residency import event_seconds as cuda_seconds

        return cuda_seconds(fn)
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def profiles(layer_rows: list[int], experts: int, hot: int, seed: int):
    """(log-probabilities, cold masks per phase, resampled priors) for the chosen layer rows; a
    smoke run with fewer experts keeps the first ``experts`` columns, renormalised, and builds
    its maps as the per-layer top ``hot``."""
    logp, cold, priors = load_profiles(MODEL_LAYERS, seed)
    pick = np.array(layer_rows)
    logp = {k: v[pick] for k, v in logp.items()}
    cold = {k: v[pick] for k, v in cold.items()}
    priors = {k: v[pick] for k, v in priors.items()}
    if experts < logp["agent"].shape[1]:
        cold, merged = {}, 0
        for k in CLASSES:
            p = np.exp(logp[k][:, :experts].astype(np.float64))
            p /= p.sum(axis=1, keepdims=True)
            merged = merged + p
            logp[k] = np.log(p).astype(np.float32)
            priors[k] = priors[k][:, :experts]
            cold[k] = top_cold(p, hot)
        cold["mix"] = top_cold(merged, hot)
    return logp, cold, priors


def top_cold(p: np.ndarray, hot: int) -> np.ndarray:
    mask = np.ones(p.shape, dtype=bool)
    np.put_along_axis(mask, np.argsort(-p, axis=1, kind="stable")[:, :hot], False, axis=1)
    return mask


def write_priors(priors: dict[str, np.ndarray], layers: list[int], folder: Path) -> list[str]:
    paths = []
    for name, counts in priors.items():
        hist = Histogram(tuple(layers), counts.shape[1], counts.astype(np.int64),
                         int(counts[0].sum()) // TOP_K, top_k=TOP_K, source="resampled synthetic profile",
                         meta={"class": name})
        path = folder / f"{name}.hist"
        save_histogram(hist, path)
        paths.append(str(path))
    return paths


def live_cold(policy: AdaptivePolicy, order: list[int], experts: int) -> np.ndarray:
    mask = np.zeros((len(order), experts), dtype=bool)
    for row, i in enumerate(order):
        mask[row, policy.layers[i].cold_experts] = True
    return mask


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", default="0,8,16,24,32,39", help="rows of the 40-layer profiles to serve")
    ap.add_argument("--tokens", default="1,16")
    ap.add_argument("--boot-steps", type=int, default=64, help="decode steps of the boot class first")
    ap.add_argument("--steps", type=int, default=256, help="decode steps per later phase")
    ap.add_argument("--check-every", type=int, default=8)
    ap.add_argument("--timing-steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="CPU, 32 experts, hidden 256: checks the logic")
    ap.add_argument("--lookahead", choices=("auto", "on", "off"), default="auto",
                    help="the split-layer policy's lookahead (auto: the default, on for CUDA devices)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    dev = torch.device("cpu" if args.smoke else "cuda")
    experts, hidden, inter, hot_n = (32, 256, 128, 24) if args.smoke else (384, 5120, 2304, 295)
    if args.smoke:
        args.steps, args.boot_steps, args.timing_steps = min(args.steps, 48), min(args.boot_steps, 16), 8
    rows = [int(r) for r in args.layers.split(",")]
    order = list(range(len(rows)))           # the plugin's MoE layer indices
    logp, cold, priors = profiles(rows, experts, hot_n, args.seed)
    # flips at the barriers only (flip_interval = interval): each window served by one map, so the
    # counter's window figures can be recounted by hand (bench/adaptive_latency.py runs the defaults)
    config = AdaptiveConfig(flip_interval=AdaptiveConfig().interval)
    t0 = time.perf_counter()
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    weights = {i: mxfp4_layer(experts, hidden, inter, gen, dev) for i in order}
    ref_weights = {i: {n: t.clone() for n, t in w.items()} for i, w in weights.items()}
    boot_hot = {i: [int(e) for e in np.flatnonzero(~cold["agent"][row])] for row, i in enumerate(order)}
    tmp = Path(tempfile.mkdtemp(prefix="adaptive-h200-"))
    os.environ[ENV_ADAPTIVE] = format_adaptive_spec(config)
    os.environ[ENV_PRIORS] = ",".join(write_priors(priors, order, tmp))
    max_tokens = max(512, experts)
    runtime, layers = plugin_runtime(weights, "residency", top_k=TOP_K, max_num_tokens=max_tokens,
                                     hot=boot_hot, count=True)
    runtime._start_adaptive()
    ref, ref_layers = plugin_runtime(ref_weights, "unsplit", top_k=TOP_K, max_num_tokens=max_tokens)
    del weights, ref_weights
    sync(dev)
    setup_s = time.perf_counter() - t0
    policy0 = runtime.policy
    assert policy0 is not None and runtime.step_barrier is not None
    runtime.step_barrier.on_report = None   # the plugin logs a line per swapping barrier: quiet here
    boot_cold = live_cold(policy0, order, experts)
    results: dict = {"machine": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (smoke)",
                     "torch": torch.__version__, "layers": rows, "experts": experts, "hot": hot_n,
                     "config": vars(config), "setup_s": setup_s, "per_t": {},
                     "forward": "fused" if runtime.fused else "per-pick"}
    print(f"setup {setup_s:.1f} s: {len(order)} layers, forward {results['forward']}, "
          f"adaptive {format_adaptive_spec(config)}", flush=True)

    def forward_all(rt, mods, x, w, ids):
        set_runtime(rt)
        return [mods[i].forward_modular(x[n], w[n], ids[n]) for n, i in enumerate(order)]

    def full_check() -> bool:
        """Every expert through every top-k slot: split == unsplit, bit for bit, every layer."""
        e = torch.arange(experts, device=dev)
        ids = torch.stack([(e + (experts // TOP_K) * k) % experts for k in range(TOP_K)], dim=1).to(torch.int32)
        g = torch.Generator(device=dev).manual_seed(7)
        x = torch.randn(len(order), experts, hidden, generator=g, device=dev).to(torch.bfloat16)
        w = torch.softmax(torch.randn(len(order), experts, TOP_K, generator=g, device=dev), -1)
        ids_l = ids.expand(len(order), experts, TOP_K)
        flags = {i: m._er_counted for i, m in layers.items()}
        for m in layers.values():
            m._er_counted = False   # the check's picks are not traffic: keep them out of the counter
        got = forward_all(runtime, layers, x, w, ids_l)
        for i, m in layers.items():
            m._er_counted = flags[i]
        want = forward_all(ref, ref_layers, x, w, ids_l)
        set_runtime(runtime)
        return all(torch.equal(a, b) for a, b in zip(got, want))

    checks = {"full_checks": 0, "step_checks": 0, "window_recounts": 0}
    assert full_check(), "split != unsplit at boot"
    checks["full_checks"] += 1

    for tokens in [int(t) for t in args.tokens.split(",")]:
        policy = fresh_policy(runtime, policy0, boot_cold, order, experts, config,
                              {"auto": None, "on": True, "off": False}[args.lookahead])
        # The counter is shared by the static and adaptive graphs below; the adaptive step counts.
        ctx = step_context(tokens, [1] * tokens, dev)
        runtime.on_forward_context(ctx)
        g = torch.Generator(device=dev).manual_seed(args.seed + tokens)
        xs = [torch.randn(len(order), tokens, hidden, generator=g, device=dev).to(torch.bfloat16) for _ in range(4)]
        traffic = make_traffic(logp, tokens, max(args.steps, args.boot_steps), args.seed + tokens)
        phase_ids = {p: torch.from_numpy(traffic.ids[p][:args.boot_steps if p == "agent" else args.steps]
                                         .astype(np.int32)).to(dev).permute(0, 2, 1, 3).contiguous()
                     for p in PHASES}                                            # [steps, L, T, K]
        w_all = torch.softmax(torch.randn(args.steps, len(order), tokens, TOP_K, generator=g, device=dev), -1)

        def counted(flag: bool) -> None:
            for m in layers.values():
                m._er_counted = flag

        step_fn = lambda x, w, ids: torch.stack(forward_all(runtime, layers, x, w, ids))  # noqa: E731
        counted(False)
        static_g = capture(step_fn, xs[0], w_all[0], phase_ids["agent"][0], dev)
        counted(True)
        adaptive_g = capture(step_fn, xs[0], w_all[0], phase_ids["agent"][0], dev)
        policy.counter.reset()
        policy._seen.zero_()

        barrier_log: list[dict] = []
        original_barrier = policy.barrier

        def timed_barrier(**kw):
            sync(dev)
            t = time.perf_counter()
            report = original_barrier(**kw)
            host = time.perf_counter() - t
            sync(dev)
            barrier_log.append({"s": time.perf_counter() - t, "host_s": host, "swaps": len(report.swaps),
                                "window_picks": report.window_picks, "window_cold": report.window_cold_picks,
                                "prior": report.prior})
            return report

        policy.barrier = timed_barrier  # what StepBarrier calls
        step_no = 0
        masks_at: list[tuple[int, np.ndarray]] = [(0, live_cold(policy, order, experts))]
        barrier_steps = [0]   # step_no of each barrier (0 first): the windows' bounds
        per_phase: dict = {}
        all_ids = []
        for phase in PHASES:
            ids_p = phase_ids[phase]
            start = step_no
            frozen = live_cold(policy, order, experts)
            swaps_before = policy.swaps_done
            for s in range(ids_p.shape[0]):
                adaptive_g.load(x=xs[s % 4], topk_weights=w_all[s], topk_ids=ids_p[s])
                runtime.on_forward_context(ctx)
                barriers = policy.barriers
                runtime.before_forward(ctx)            # the hook: a due barrier runs here
                if policy.barriers != barriers:
                    rec = barrier_log[-1]
                    barrier_steps.append(step_no)
                    # the window of the plan this barrier applied: the one it ranked, or with
                    # lookahead the previous barrier's (none at the first); all real tokens,
                    # served by the map in effect from the window's first step
                    b = len(barrier_steps) - 1
                    if not policy.lookahead_on:
                        lo, hi = barrier_steps[b - 1], barrier_steps[b]
                    else:
                        lo, hi = (barrier_steps[b - 2], barrier_steps[b - 1]) if b >= 2 else (0, 0)
                    win = torch.cat(all_ids + [ids_p[:s]])[lo:hi]
                    hand = hand_cold([m for at, m in masks_at if at <= lo][-1], win)
                    assert (rec["window_picks"], rec["window_cold"]) == (win.numel(), hand), \
                        f"T={tokens} barrier {policy.barriers}: counter {rec['window_picks']}/{rec['window_cold']} " \
                        f"!= recount {win.numel()}/{hand}"
                    checks["window_recounts"] += 1
                    if rec["swaps"]:
                        ok = full_check()
                        assert ok, f"T={tokens} barrier {policy.barriers}: split != unsplit after swaps"
                        checks["full_checks"] += 1
                        masks_at.append((step_no, live_cold(policy, order, experts)))
                adaptive_g.replay()
                if s % args.check_every == 0:
                    want = forward_all(ref, ref_layers, xs[s % 4], w_all[s], ids_p[s])
                    set_runtime(runtime)
                    assert all(torch.equal(adaptive_g.out[n], want[n]) for n in range(len(order))), \
                        f"T={tokens} {phase} step {s}: replay != unsplit"
                    checks["step_checks"] += 1
                step_no += 1
            all_ids.append(ids_p)
            per_phase[phase] = phase_figures(ids_p, start, masks_at, boot_cold, cold[phase], frozen,
                                             tokens, swaps=policy.swaps_done - swaps_before)
        sync(dev)
        policy.barrier = original_barrier
        row = {"phases": per_phase, "barriers": len(barrier_log), "swaps": policy.swaps_done,
               "graph_state": policy.graph_state, "lookahead": policy.lookahead_on,
               "barrier_host_ms_no_swaps": summary([b["host_s"] * 1e3 for b in barrier_log if not b["swaps"]]),
               "barrier_ms": summary([b["s"] * 1e3 for b in barrier_log]),
               "barrier_ms_with_swaps": summary([b["s"] * 1e3 for b in barrier_log if b["swaps"]]),
               "barrier_ms_no_swaps": summary([b["s"] * 1e3 for b in barrier_log if not b["swaps"]]),
               "series": {p: f["series"] for p, f in per_phase.items()}}
        for f in per_phase.values():
            del f["series"]
        row.update(step_timing(static_g, adaptive_g, runtime, ctx, policy, xs, w_all,
                               phase_ids["mix"], args.timing_steps, len(order), dev))
        results["per_t"][tokens] = row
        print(table_t(tokens, row), flush=True)
        del static_g, adaptive_g

    results["rank40"] = rank_40(logp, cold, priors, experts, config, dev, args.seed)
    results["swap_ms"] = swap_time(runtime.policy, order, dev)
    assert full_check(), "split != unsplit after the swap timing"
    results["misordered_caught"] = misordered(runtime.policy, order, full_check)
    results["in_barrier_refused"] = in_barrier_refused(runtime.policy, layers, order, experts, hidden, dev)
    results["checks"] = checks
    results["share_t1"] = share_40(results)
    print(markdown(results), flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "adaptive_h200.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


def fresh_policy(runtime, policy0, boot_cold, order, experts, config, lookahead=None,
                 copies=None) -> AdaptivePolicy:
    """Back to the boot map (swaps through the policy's own ordered path) and a policy with no
    history, installed where the plugin's step barrier calls it."""
    old = runtime.policy
    back = []
    for row, i in enumerate(order):
        layer = old.layers[i]
        promote = [e for e in layer.cold_experts if not boot_cold[row, e]]
        demote = [e for e in layer.hot_experts if boot_cold[row, e]]
        back += [Swap(i, p, d) for p, d in zip(sorted(promote), sorted(demote))]
    old.apply(back)
    old.copies.drain()
    policy = AdaptivePolicy(old.counter, old.layers, config, priors=policy0.priors, lookahead=lookahead,
                            copies=copies)
    runtime.policy = policy
    runtime.step_barrier.policy = policy
    runtime.step_barrier.due = False
    return policy


def hand_cold(cold_mask: np.ndarray, ids: torch.Tensor) -> int:
    """Cold picks of ``ids [steps, L, T, K]`` under ``cold_mask [L, E]``, by table lookup."""
    mask = torch.from_numpy(cold_mask).to(ids.device)
    layer = torch.arange(mask.shape[0], device=ids.device).view(1, -1, 1, 1)
    return int(mask[layer, ids.long()].sum())


def per_step_cold(cold_mask: np.ndarray, ids: torch.Tensor) -> np.ndarray:
    mask = torch.from_numpy(cold_mask).to(ids.device)
    layer = torch.arange(mask.shape[0], device=ids.device).view(1, -1, 1, 1)
    return mask[layer, ids.long()].sum(dim=(1, 2, 3)).cpu().numpy()


def phase_figures(ids: torch.Tensor, start: int, masks_at, boot_cold, oracle_cold, frozen, tokens, swaps) -> dict:
    steps = ids.shape[0]
    per_step = ids[0].numel()
    adaptive = np.zeros(steps, dtype=np.int64)
    bounds = [(at, m) for at, m in masks_at]
    for n, (at, mask) in enumerate(bounds):
        end = bounds[n + 1][0] if n + 1 < len(bounds) else start + steps
        lo, hi = max(at, start) - start, min(end, start + steps) - start
        if hi > lo:
            adaptive[lo:hi] = per_step_cold(mask, ids[lo:hi])
    static = per_step_cold(boot_cold, ids)
    oracle = per_step_cold(oracle_cold, ids)
    frozen_p = per_step_cold(frozen, ids)
    half = slice(steps // 2, None)
    share = {k: float(v[half].sum() / (per_step * v[half].size))
             for k, v in (("static", static), ("adaptive", adaptive), ("oracle", oracle))}
    frozen_all = float(frozen_p.sum() / (per_step * steps))
    trail = trailing_share(adaptive, per_step, WINDOW) if steps >= WINDOW else np.array([])
    target = share["oracle"] + (1 - CLOSE) * (frozen_all - share["oracle"])
    return {"cold_share": share, "cold_share_at_shift_map": frozen_all,
            "steps_to_1.5x_oracle": first_step(trail, TARGET_RATIO * share["oracle"], WINDOW),
            "steps_to_close_80pct": (first_step(trail, target, WINDOW)
                                     if frozen_all > TARGET_RATIO * share["oracle"] else 0),
            "swaps": swaps,
            "series": {"static": (static / per_step).round(5).tolist(),
                       "adaptive": (adaptive / per_step).round(5).tolist(),
                       "oracle": (oracle / per_step).round(5).tolist()}}


def summary(xs: list[float]) -> dict | None:
    if not xs:
        return None
    return {"n": len(xs), "median": statistics.median(xs), "mean": statistics.fmean(xs), "max": max(xs)}


def step_timing(static_g, adaptive_g, runtime, ctx, policy, xs, w_all, ids, n, layers, dev) -> dict:
    """Per-layer step time: static lane (counter off, no policy) vs adaptive lane (counter on),
    replays alternating (CUDA events); the host hooks; then wall-clock per step of whole lanes
    (static: replay; adaptive: mask refresh + policy hook + replay, barriers included), A B A."""
    times = {"static": [], "adaptive": []}
    cases = [("static", static_g), ("adaptive", adaptive_g)]
    for s in range(n):
        for name, g in (cases if s % 2 == 0 else cases[::-1]):
            g.load(x=xs[s % 4], topk_weights=w_all[s % w_all.shape[0]], topk_ids=ids[s % ids.shape[0]])
            times[name].append(event_seconds(g.replay, dev))
    out = {f"{k}_us_per_layer": statistics.median(v) / layers * 1e6 for k, v in times.items()}
    out["counter_us_per_layer"] = out["adaptive_us_per_layer"] - out["static_us_per_layer"]
    sync(dev)
    hook = []
    for _ in range(50):
        t = time.perf_counter()
        runtime.on_forward_context(ctx)
        hook.append(time.perf_counter() - t)
    out["mask_refresh_us"] = statistics.median(hook) * 1e6
    saved = policy.forwards
    ticks = []
    for _ in range(200):
        t = time.perf_counter()
        policy.tick()
        ticks.append(time.perf_counter() - t)
    policy.forwards = saved
    out["tick_us"] = statistics.median(ticks) * 1e6

    def lane(adaptive: bool) -> float:
        g = adaptive_g if adaptive else static_g
        sync(dev)
        t = time.perf_counter()
        for s in range(n):
            g.load(x=xs[s % 4], topk_weights=w_all[s % w_all.shape[0]], topk_ids=ids[s % ids.shape[0]])
            if adaptive:
                runtime.on_forward_context(ctx)
                runtime.before_forward(ctx)
            g.replay()
        sync(dev)
        return (time.perf_counter() - t) / n * 1e6

    swaps0, barriers0 = policy.swaps_done, policy.barriers
    a1, b, a2 = lane(False), lane(True), lane(False)
    out["lane_wall_us_per_step"] = {"static_1": a1, "adaptive": b, "static_2": a2,
                                    "barriers": policy.barriers - barriers0, "swaps": policy.swaps_done - swaps0}
    return out


def rank_40(logp, cold, priors, experts, config, dev, seed, tokens=(1, 16)) -> dict:
    """The barrier of a 40-layer policy (DSv4.1-Flash's MoE layers) on one-byte banks: in-domain
    agent traffic (the boot class) at T = 1 and 16, windows of ``interval`` steps added to the
    counters. Three policies see the same counts: the lane's own (on CUDA: captured ranking and
    lookahead, the defaults), an eager twin with the same lookahead (every report must be equal:
    the graph decides what the eager calls decide) and a policy without lookahead (its plan at
    barrier b must be what the lane applies at barrier b + 1). Timed: the barrier without lookahead,
    stream drained before and after (host clock: what the step waited before lookahead); with
    lookahead the host time of the call and the stream time of the work it enqueued (CUDA events
    behind a sleep kernel, so the host is ahead and the events time the device work alone)."""
    full_logp, full_cold, full_priors = load_profiles(MODEL_LAYERS, seed)
    if experts < full_logp["agent"].shape[1]:
        return {"skipped": "smoke run"}
    def one_byte_layers():
        out = {}
        for i in range(MODEL_LAYERS):
            hot = [int(e) for e in np.flatnonzero(~full_cold["agent"][i])]
            cold_ids = [int(e) for e in np.flatnonzero(full_cold["agent"][i])]
            out[i] = rehome_layer({"w": torch.zeros(experts, 4, dtype=torch.uint8, device=dev)}, hot, cold_ids,
                                  layer_index=i, hot_alloc=device_allocator(dev), cold_alloc=device_allocator(dev),
                                  hot_spare=config.swaps_per_layer, cold_spare=config.swaps_per_layer)
        return out

    banks = {name: one_byte_layers() for name in ("lane", "twin", "plain")}
    for lane in banks.values():   # as the plugin does for an adaptive lane: one map table
        share_row_codes(lane, order=list(range(MODEL_LAYERS)))
    prior_t = {k: torch.from_numpy(v) for k, v in full_priors.items()}
    out = {}
    steps_per_t = tuple(tokens)
    for tokens in steps_per_t:
        counters = {name: ExpertCounter(tuple(range(MODEL_LAYERS)), experts, device=dev, top_k=TOP_K)
                    for name in banks}
        policy = AdaptivePolicy(counters["lane"], banks["lane"], config, priors=prior_t)
        twin = AdaptivePolicy(counters["twin"], banks["twin"], config, priors=prior_t, graph_decide=False,
                              lookahead=policy.lookahead_on)
        plain = AdaptivePolicy(counters["plain"], banks["plain"], config, priors=prior_t, lookahead=False)
        logits = torch.from_numpy(full_logp["agent"]).to(dev)          # [L, E]
        gen = torch.Generator(device=dev).manual_seed(seed + 99 + tokens)
        offset = torch.arange(MODEL_LAYERS, device=dev).view(1, -1, 1) * experts
        drained, host, stream, swaps = [], [], [], []
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for b in range(24):
            # a window of decode steps, each token 6 distinct experts per layer (Gumbel top-k)
            u = torch.rand(config.interval * tokens, MODEL_LAYERS, experts, generator=gen, device=dev)
            picks = (logits - torch.log(-torch.log(u.clamp_min(1e-30)))).topk(TOP_K, dim=-1).indices
            counts = torch.bincount((picks + offset).reshape(-1), minlength=MODEL_LAYERS * experts)
            for c in counters.values():
                c.counts += counts.view(MODEL_LAYERS, experts).to(c.counts.dtype)
            sync(dev)
            torch.cuda._sleep(3_000_000)      # ~1.5 ms of device work: the host runs ahead of it
            start.record()
            t = time.perf_counter()
            report = policy.barrier()
            host.append((time.perf_counter() - t) * 1e3)
            stop.record()
            sync(dev)
            stream.append(start.elapsed_time(stop))
            swaps.append(len(report.swaps))
            other = twin.barrier()
            for pol in (policy, twin):        # the interval's steps: plans read, copies issued
                for _ in range(config.interval):
                    pol.tick()
                    pol.pump()
            sync(dev)
            assert (report.swaps, report.prior, report.window_picks, report.window_cold_picks) == \
                (other.swaps, other.prior, other.window_picks, other.window_cold_picks), f"barrier {b}: graph != eager"
            sync(dev)
            t = time.perf_counter()
            plain.barrier()
            sync(dev)
            drained.append((time.perf_counter() - t) * 1e3)
            if policy.lookahead_on:
                assert sorted(report.swaps) == sorted(plain.reports[-2].swaps if b else []), \
                    f"barrier {b}: lookahead plan differs"
            else:
                assert sorted(report.swaps) == sorted(plain.reports[-1].swaps), f"barrier {b}"
        # undo this run's swaps so the next T starts from the boot map (a pending plan is dropped)
        for pol in (policy, twin, plain):
            pol.apply([Swap(s.layer, s.demote, s.promote) for r in reversed(pol.reports) for s in reversed(r.swaps)])
        out[tokens] = {"barrier_ms": summary(drained[4:]), "lookahead": policy.lookahead_on,
                       "lookahead_host_ms": summary(host[4:]), "lookahead_stream_ms": summary(stream[4:]),
                       "swaps_per_barrier": statistics.fmean(swaps[4:]), "swaps_first_4": swaps[:4],
                       "graph_state": policy.graph_state, "eager_twin_agreed_barriers": len(stream)}
    return out


def swap_time(policy, order, dev) -> dict:
    """One swap at this geometry (hot row <-> cold row through the staging row, map flip), timed
    one at a time with the stream drained: pairs swapped and swapped back on the first layer."""
    layer = policy.layers[order[0]]
    times = []
    for n in range(min(16, len(layer.cold_experts))):
        h, c = layer.hot_experts[n], layer.cold_experts[n]
        for pair in ((h, c), (c, h)):
            sync(dev)
            t = time.perf_counter()
            policy.apply([Swap(order[0], pair[1], pair[0])])
            sync(dev)
            times.append((time.perf_counter() - t) * 1e3)
    return summary(times)


def misordered(policy, order, full_check) -> dict:
    """A swap whose map flip runs before its copies: the bit-exact check between them fails; once
    the copies have run, the layer is whole again (the check passes)."""
    layer = policy.layers[order[0]]
    seen = {}

    def flip_first(steps):
        flip, copies = steps[-1], steps[:-1]
        assert flip.kind == "map" and all(s.kind == "copy" for s in copies)
        flip.run()
        seen["caught"] = not full_check()
        for s in copies:
            s.run()

    policy.apply([Swap(order[0], layer.cold_experts[0], layer.hot_experts[0])], run=flip_first)
    caught = seen["caught"]
    whole = full_check()
    assert caught and whole, (caught, whole)
    return {"caught": caught, "whole_after_copies": whole}


def in_barrier_refused(policy, layers, order, experts, hidden, dev) -> bool:
    x = torch.zeros(1, hidden, dtype=torch.bfloat16, device=dev)
    w = torch.ones(1, TOP_K, device=dev) / TOP_K
    ids = torch.arange(TOP_K, dtype=torch.int32, device=dev).view(1, TOP_K)
    with policy._guard():
        try:
            layers[order[0]].forward_modular(x, w, ids)
        except RuntimeError as exc:
            return "inside a swap barrier" in str(exc)
    return False


def share_40(r: dict) -> dict | None:
    """The policy's share of a 40-layer-equivalent step at T = 1: the counter's per-layer cost x 40
    plus one steady-state barrier per ``interval`` steps, over 40 x the static lane's per-layer step
    and over the field report's 11.1 ms whole-model step. The barrier: without lookahead the
    drained barrier (the step waits for all of it); with lookahead the stream time of its device
    work (the host part overlaps the step in flight), and as the conservative figure that plus the
    host time of the call; both plus its swaps at this geometry's swap time. The host hooks (mask
    refresh + tick) as a further figure."""
    t1 = r["per_t"].get(1)
    rank = r.get("rank40", {}).get(1) if isinstance(r.get("rank40"), dict) else None
    if t1 is None or not rank or "barrier_ms" not in rank:
        return None
    interval = r["config"]["interval"]
    step = MODEL_LAYERS * t1["static_us_per_layer"]
    counter = MODEL_LAYERS * max(t1["counter_us_per_layer"], 0.0)
    swaps_us = rank["swaps_per_barrier"] * r["swap_ms"]["median"] * 1e3
    sync_barrier = rank["barrier_ms"]["median"] * 1e3 + swaps_us
    out = {"step_us": step, "counter_us": counter, "interval": interval, "swaps_us": swaps_us,
           "sync_barrier_us": sync_barrier,
           "sync_share_of_11_1ms_step": (counter + sync_barrier / interval) / FIELD_STEP_US}
    if rank.get("lookahead"):
        stream_us = rank["lookahead_stream_ms"]["median"] * 1e3 + swaps_us
        host_us = rank["lookahead_host_ms"]["median"] * 1e3
        out |= {"barrier_us": stream_us, "barrier_host_us": host_us}
        policy, conservative = counter + stream_us / interval, counter + (stream_us + host_us) / interval
    else:
        out["barrier_us"] = sync_barrier
        policy = conservative = counter + sync_barrier / interval
    hooks = t1["mask_refresh_us"] + t1["tick_us"]
    return out | {"share": policy / step, "share_of_11_1ms_step": policy / FIELD_STEP_US,
                  # the whole-model decode step at one stream, k = 0 (11.1 ms; docs/costmodel.md)
                  "share_of_11_1ms_step_with_host_part": conservative / FIELD_STEP_US,
                  "share_of_11_1ms_step_with_host_hooks": (conservative + hooks) / FIELD_STEP_US}


def table_t(tokens: int, row: dict) -> str:
    lines = [f"T={tokens}: {row['barriers']} barriers, {row['swaps']} swaps; barrier ms "
             f"{fmt(row['barrier_ms'])}, with swaps {fmt(row['barrier_ms_with_swaps'])}, "
             f"without {fmt(row['barrier_ms_no_swaps'])}",
             f"  step us/layer static {row['static_us_per_layer']:.2f}, adaptive {row['adaptive_us_per_layer']:.2f} "
             f"(counter {row['counter_us_per_layer']:+.2f}); mask refresh {row['mask_refresh_us']:.1f} us, "
             f"tick {row['tick_us']:.2f} us; lanes wall us/step {row['lane_wall_us_per_step']}"]
    for phase, f in row["phases"].items():
        s = f["cold_share"]
        lines.append(f"  {phase:5s} static {s['static']:.2%} adaptive {s['adaptive']:.2%} oracle {s['oracle']:.2%} "
                     f"| at shift {f['cold_share_at_shift_map']:.2%}, 1.5x in {f['steps_to_1.5x_oracle']}, "
                     f"80% in {f['steps_to_close_80pct']} steps, {f['swaps']} swaps")
    return "\n".join(lines)


def fmt(s: dict | None) -> str:
    return "n/a" if s is None else f"median {s['median']:.2f} / max {s['max']:.2f} (n={s['n']})"


def markdown(r: dict) -> str:
    lines = [f"machine: {r['machine']}, torch {r['torch']}, layers {r['layers']} of 40, {r['experts']} experts, "
             f"hot {r['hot']}, forward {r['forward']}; checks {r.get('checks')}",
             "", "| T | phase | static | adaptive | oracle | steps to 1.5x | steps to 80% | swaps |",
             "|---|---|---|---|---|---|---|---|"]
    for t, row in r["per_t"].items():
        for phase, f in row["phases"].items():
            s = f["cold_share"]
            lines.append(f"| {t} | {phase} | {s['static']:.2%} | {s['adaptive']:.2%} | {s['oracle']:.2%} | "
                         f"{f['steps_to_1.5x_oracle']} | {f['steps_to_close_80pct']} | {f['swaps']} |")
    lines += ["", "| T | barrier ms median (max), with swaps | without swaps | static µs/layer | adaptive µs/layer | "
                  "lanes wall µs/step static / adaptive / static |", "|---|---|---|---|---|---|"]
    for t, row in r["per_t"].items():
        w = row["lane_wall_us_per_step"]
        lines.append(f"| {t} | {fmt(row['barrier_ms_with_swaps'])} | {fmt(row['barrier_ms_no_swaps'])} | "
                     f"{row['static_us_per_layer']:.2f} | {row['adaptive_us_per_layer']:.2f} | "
                     f"{w['static_1']:.1f} / {w['adaptive']:.1f} / {w['static_2']:.1f} |")
    lines.append(f"\nrank40: {r.get('rank40')}\nswap ms: {r.get('swap_ms')}\nmis-ordered: {r.get('misordered_caught')}; "
                 f"in-barrier forward refused: {r.get('in_barrier_refused')}\nshare at T=1 (40-layer step): {r.get('share_t1')}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
