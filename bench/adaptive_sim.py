#!/usr/bin/env python3
"""Adaptive residency, the policy alone, on the CPU: replay shifting synthetic routing through
``expert_residency.core.adaptive.AdaptivePolicy`` and measure the cold share it leaves.

This is a simulation of the **policy**, not of the engine path: no expert computes, no GPU, no vLLM.
The banks are real ``ResidentLayer`` objects holding one dummy byte per expert, so every accepted
swap runs through ``core.swap``'s ordered steps and the live map is the device row map a kernel
would read; the counter is a real ``ExpertCounter`` (each window's picks are added in one batch,
which gives the same integer counts as counting every forward).

Traffic: the repository's synthetic class histograms (``recipes/profiles/dsv41-flash/{agent,prose,
math}.hist``, marked synthetic inside; 40 MoE layers × 384 experts, top-6). Each token of each layer
draws 6 distinct experts from its class's per-layer distribution (Gumbel top-k, i.e. sampling without
replacement in proportion to the counts). Phases, in order: ``agent`` (the lane's boot class),
``prose``, ``math``, ``mix`` (every token's class drawn uniformly from the three). Decode steps carry
``T`` tokens (T = 1: one stream; T = 16: sixteen streams).

Maps compared on the same routing (common random numbers):

* ``static``: the boot class's map (``recipes/maps/dsv41-flash/agent.rowmap``, 295 hot / 89 cold)
  all the time;
* ``oracle``: the phase's own class map (``<class>.rowmap``; for ``mix`` the top 295 of the merged
  histogram per layer) — the in-domain figure;
* ``adaptive``: starts as ``static``; the policy runs a barrier every ``interval`` decode steps;
* ``frozen``: the adaptive live map as it stood at the phase's start, never updated (the gap the
  policy has to close after a shift).

The policy is given the three class profiles as priors (``--priors``), each an independent
resample of its histogram (same token count) so the profile is as noisy as a real profiling run;
``--priors agent,prose`` leaves math without a profile, ``--priors none`` ranks on counts alone.
``count_bound_200`` is the held-out cold share of the map a clairvoyant counts-only policy would
hold after 200 steps (every pick counted, unlimited swaps): no counts-only policy does better.

Figures per phase and T: mean cold share (share of routed picks served from the cold bank) over
the phase's second half for each map, decode steps until the trailing ``--window``-step cold share
is within 1.5× the oracle's phase mean, decode steps to close 80% of the frozen-to-oracle gap,
swaps (total after the shift, and per barrier over the last third), reversals (expert moves that
undo an earlier move of the same expert in the same phase: the thrash), and expert bytes those
swaps move over the host link (2 × 18,800,640 B per swap: one row in, one row out).

Usage::

    .venv/bin/python bench/adaptive_sim.py                     # defaults, T = 1 and 16
    .venv/bin/python bench/adaptive_sim.py --sweep "interval=8,16,32;swaps=4,8;decay=0.8,0.9;margin=0.25,0.5"
    .venv/bin/python bench/adaptive_sim.py --priors none       # counts only
    .venv/bin/python bench/adaptive_sim.py --json out.json     # per-step series too
    .venv/bin/python bench/adaptive_sim.py --no-lookahead      # each plan applied where it is computed
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))

from expert_residency.core import ExpertCounter, device_allocator, host_allocator, rehome_layer  # noqa: E402
from expert_residency.core.adaptive import AdaptiveConfig, AdaptivePolicy, spare_rows_needed  # noqa: E402
from expert_residency.core.slots import CHUNKS_PER_ROW  # noqa: E402
from expert_residency.formats import load_histogram, load_rowmap  # noqa: E402

PROFILES = ROOT / "recipes" / "profiles" / "dsv41-flash"
MAPS = ROOT / "recipes" / "maps" / "dsv41-flash"
CLASSES = ("agent", "prose", "math")
PHASES = ("agent", "prose", "math", "mix")
TOP_K = 6
BYTES_PER_EXPERT = 18_800_640  # DSv4.1-Flash MXFP4 expert (bench/core_rehome.py)
TARGET_RATIO = 1.5
BOUND_STEPS = 200  # the target's horizon: cold share within 1.5x of the oracle's within 200 steps
CLOSE = 0.8


@dataclass
class Traffic:
    """Routing for every phase: ``ids[phase]`` is ``uint16 [steps, T, L, 6]``."""

    tokens: int
    steps: int
    ids: dict[str, np.ndarray]


def load_profiles(layers: int, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray],
                                                      dict[str, np.ndarray]]:
    """(log-probabilities ``[L, E]`` per class, oracle cold masks ``bool [L, E]`` per phase,
    class priors for the policy). The priors are an independent profile of each class: every
    layer's counts resampled (multinomial, same total) from the histogram that drives the traffic,
    so the policy's profile is as noisy as a real profiling run of that size, not the truth."""
    logp, cold, priors = {}, {}, {}
    merged = None
    rng = np.random.default_rng(seed + 1000)
    for name in CLASSES:
        counts = load_histogram(PROFILES / f"{name}.hist").counts[:layers].astype(np.float64)
        probs = counts / counts.sum(axis=1, keepdims=True)
        priors[name] = np.stack([rng.multinomial(int(c.sum()), p) for c, p in zip(counts, probs)]).astype(np.float64)
        merged = probs if merged is None else merged + probs
        with np.errstate(divide="ignore"):
            logp[name] = np.log(probs).astype(np.float32)
        cold[name] = load_rowmap(MAPS / f"{name}.rowmap").cold_mask()[:layers]
    hot = int((~cold["agent"][0]).sum())
    order = np.argsort(-merged, axis=1, kind="stable")
    mix_cold = np.ones_like(cold["agent"])
    np.put_along_axis(mix_cold, order[:, :hot], False, axis=1)
    cold["mix"] = mix_cold
    return logp, cold, priors


def make_traffic(logp: dict[str, np.ndarray], tokens: int, steps: int, seed: int) -> Traffic:
    rng = np.random.default_rng(seed)
    layers, experts = logp["agent"].shape
    ids = {}
    for phase in PHASES:
        out = np.empty((steps, tokens, layers, TOP_K), dtype=np.uint16)
        block = max(1, 1024 // tokens)
        for start in range(0, steps, block):
            n = min(block, steps - start)
            if phase == "mix":
                which = rng.integers(0, len(CLASSES), size=(n, tokens))
                base = np.stack([logp[c] for c in CLASSES])[which]          # [n, T, L, E]
            else:
                base = np.broadcast_to(logp[phase], (n, tokens, layers, experts))
            u = rng.random(size=(n, tokens, layers, experts), dtype=np.float32)
            keys = base - np.log(-np.log(np.maximum(u, np.float32(1e-30))))
            out[start:start + n] = np.argpartition(-keys, TOP_K, axis=-1)[..., :TOP_K]
        ids[phase] = out
    return Traffic(tokens, steps, ids)


def count_bound_mask(ids: np.ndarray, frozen: np.ndarray, steps: int) -> np.ndarray:
    """The map a clairvoyant count-only policy would hold after ``steps`` decode steps: every pick
    of those steps counted, unlimited swaps, hot = the most counted (ties keep the frozen map)."""
    layers, experts = frozen.shape
    block = ids[:steps].astype(np.int64)
    flat = (np.arange(layers)[None, None, :, None] * experts + block).ravel()
    counts = np.bincount(flat, minlength=layers * experts).reshape(layers, experts).astype(np.float64)
    key = counts + 0.5 * (~frozen)
    hot = int((~frozen[0]).sum())
    mask = np.ones_like(frozen)
    np.put_along_axis(mask, np.argsort(-key, axis=1, kind="stable")[:, :hot], False, axis=1)
    return mask


def cold_rows(mask: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Cold expert rows read per step of ``ids [n, T, L, K]`` under ``mask``: each (layer, cold expert)
    picked in a step once, however many of the step's tokens picked it (the kernels group a step's
    picks by expert and read each expert's rows once)."""
    n, tokens, layers, k = ids.shape
    flat = ids.astype(np.int64).transpose(0, 2, 1, 3).reshape(n, layers, tokens * k)
    out = np.zeros(n, dtype=np.int64)
    layer = np.arange(layers)[:, None]
    for i in range(n):
        seen = np.zeros(mask.shape, dtype=bool)
        seen[layer, flat[i]] = True
        out[i] = int((seen & mask).sum())
    return out


def cold_picks(mask: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Cold picks per step of ``ids [n, T, L, K]`` under ``mask [L, E]``."""
    layer = np.arange(mask.shape[0])[None, None, :, None]
    return mask[layer, ids.astype(np.int64)].sum(axis=(1, 2, 3))


def build_policy(cold_mask: np.ndarray, config: AdaptiveConfig,
                 priors: dict[str, np.ndarray] | None = None, lookahead: bool = True) -> AdaptivePolicy:
    layers, experts = cold_mask.shape
    resident = {}
    hot_spare, host_spare = spare_rows_needed(config, int((~cold_mask[0]).sum()))
    for index in range(layers):
        hot_ids = [int(e) for e in np.flatnonzero(~cold_mask[index])]
        cold_ids = [int(e) for e in np.flatnonzero(cold_mask[index])]
        tensors = {"w": torch.zeros(experts, CHUNKS_PER_ROW, dtype=torch.uint8)}
        keep = config.host_copies == "all"
        resident[index] = rehome_layer(tensors, hot_ids, cold_ids, layer_index=index,
                                       hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator(),
                                       hot_spare=hot_spare, cold_spare=0 if keep else host_spare,
                                       host_copies=keep)
    return AdaptivePolicy(ExpertCounter(tuple(range(layers)), experts, top_k=TOP_K), resident, config,
                          priors={k: torch.from_numpy(v) for k, v in (priors or {}).items()} or None,
                          lookahead=lookahead)


def live_cold_mask(policy: AdaptivePolicy, layers: int, experts: int) -> np.ndarray:
    mask = np.zeros((layers, experts), dtype=bool)
    for index in range(layers):
        mask[index, policy.layers[index].cold_experts] = True
    return mask


def first_step(trailing: np.ndarray, threshold: float, window: int) -> int | None:
    """Decode steps after the shift until the trailing window's cold share is <= threshold."""
    hits = np.flatnonzero(trailing <= threshold)
    return int(hits[0]) + window if hits.size else None


def trailing_share(picks: np.ndarray, per_step: int, window: int) -> np.ndarray:
    csum = np.concatenate([[0], np.cumsum(picks)])
    return (csum[window:] - csum[:-window]) / (per_step * window)


ROW_US = BYTES_PER_EXPERT / 51e9 * 1e6
"""One expert row over the H200's host link (≈ 51 GB/s pinned reads, BENCHMARKS.md): 369 µs."""
HOT_US_PER_LAYER = {1: 82.0, 16: 1050.0}
"""A layer's step time without its cold reads, from the H200 run of bench/adaptive_h200.py
(107.5 µs/layer at T = 1 and 1,609 µs at T = 16 in-domain, less their cold rows at ``ROW_US``)."""


def simulate(traffic: Traffic, cold: dict[str, np.ndarray], config: AdaptiveConfig,
             window: int, series: bool = False, priors: dict[str, np.ndarray] | None = None,
             lookahead: bool = True, latency_steps: int = 256, model: dict | None = None) -> dict:
    """``model``: ``{"row_us": ..., "hot_us": {T: ...}}`` for the modeled step times (a step: the
    layers' hot work plus every row it moves over the host link, cold reads and copies alike, at
    ``row_us`` each — the link shared, nothing overlapped: a pessimistic model)."""
    model = model or {"row_us": ROW_US, "hot_us": HOT_US_PER_LAYER}
    layers, experts = cold["agent"].shape
    policy = build_policy(cold["agent"], config, priors, lookahead)
    per_step = traffic.tokens * layers * TOP_K
    due = False
    window_start = 0   # first step of the barrier window (relative to the phase; < 0: the last phase's tail)
    result: dict = {"config": vars(config) | {}, "tokens": traffic.tokens, "phases": {}, "lookahead": lookahead}
    barrier_seconds = []
    for phase in PHASES:
        ids = traffic.ids[phase]
        frozen = live_cold_mask(policy, layers, experts)
        adaptive = np.empty(traffic.steps, dtype=np.int64)
        adaptive_rows = np.empty(traffic.steps, dtype=np.int64)
        swaps_before = policy.swaps_done
        copied_before = dict(policy.copied_bytes)
        half_barriers, half_swaps = 0, 0
        swaps_at: list[tuple[int, int]] = []
        chosen: list[str | None] = []
        moved: dict[tuple[int, int], str] = {}  # (layer, expert) -> its last move this phase
        reversals = 0
        mask = frozen
        copy_rows = np.zeros(traffic.steps)
        for start in range(0, traffic.steps):
            # an engine step: the due barrier, tick, this step's copies (pump), then the forward
            if due:
                lo = window_start
                block = ids[max(lo, 0):start].astype(np.int64)
                flat = (np.arange(layers)[None, None, :, None] * experts + block).ravel()
                if lo < 0:  # the window straddles the shift: add the previous phase's tail too
                    prev = traffic.ids[PHASES[PHASES.index(phase) - 1]][lo:].astype(np.int64)
                    flat = np.concatenate([flat, (np.arange(layers)[None, None, :, None] * experts + prev).ravel()])
                counts = np.bincount(flat, minlength=layers * experts).reshape(layers, experts)
                policy.counter.counts += torch.from_numpy(counts)
                done = policy.swaps_done
                t0 = time.perf_counter()
                report = policy.barrier()
                barrier_seconds.append(time.perf_counter() - t0)
                window_start = start
                if start >= traffic.steps - traffic.steps // 3:
                    chosen.append(report.prior)
                for swap in report.swaps:  # a reversal undoes an earlier move of the same expert
                    reversals += moved.get((swap.layer, swap.promote)) == "out"
                    reversals += moved.get((swap.layer, swap.demote)) == "in"
                    moved[(swap.layer, swap.promote)] = "in"
                    moved[(swap.layer, swap.demote)] = "out"
                mask = live_cold_mask(policy, layers, experts)
                swaps_at.append((start, policy.swaps_done - done))
                if start >= traffic.steps - traffic.steps // 3:
                    half_barriers += 1
                    half_swaps += policy.swaps_done - done
            due = policy.tick()
            flipped = policy.swaps_done
            copy_rows[start] = policy.pump() / CHUNKS_PER_ROW
            if policy.swaps_done != flipped:   # a flip-only step made copied swaps live
                mask = live_cold_mask(policy, layers, experts)
                if start >= traffic.steps - traffic.steps // 3:
                    half_swaps += policy.swaps_done - flipped
            adaptive[start] = cold_picks(mask, ids[start:start + 1])[0]
            adaptive_rows[start] = cold_rows(mask, ids[start:start + 1])[0]
        window_start -= traffic.steps   # relative to the next phase (a window may straddle the shift)
        static = cold_picks(cold["agent"], ids)
        oracle = cold_picks(cold[phase], ids)
        frozen_picks = cold_picks(frozen, ids)
        half = slice(traffic.steps // 2, None)
        share = {name: float(v[half].sum() / (per_step * v[half].size))
                 for name, v in (("static", static), ("oracle", oracle), ("adaptive", adaptive),
                                 ("frozen", frozen_picks))}
        # held out: the bound's map is built from the first 200 steps and judged on the rest
        held = ids[BOUND_STEPS:]
        share["count_bound_200"] = (float(cold_picks(count_bound_mask(ids, frozen, BOUND_STEPS), held).sum()
                                          / (per_step * len(held))) if len(held) else None)
        trail = trailing_share(adaptive, per_step, window)
        frozen_all = float(frozen_picks.sum() / (per_step * frozen_picks.size))
        gap_target = share["oracle"] + (1 - CLOSE) * (frozen_all - share["oracle"])
        steps_15 = first_step(trail, TARGET_RATIO * share["oracle"], window)
        steps_80 = first_step(trail, gap_target, window) if frozen_all > TARGET_RATIO * share["oracle"] else 0
        swaps_to_target = None
        if steps_15 is not None:
            swaps_to_target = sum(n for at, n in swaps_at if at <= steps_15)
        # the link model: a step reads each picked cold expert's row once and carries its copies
        static_rows = cold_rows(cold["agent"], ids)
        span = slice(0, min(latency_steps, traffic.steps))
        hot_us = model["hot_us"].get(traffic.tokens, model["hot_us"][1]) * layers
        step_us = {"static": hot_us + model["row_us"] * static_rows[span],
                   "adaptive": hot_us + model["row_us"] * (adaptive_rows[span] + copy_rows[span])}
        latency = {k: {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)),
                       "max": float(v.max())} for k, v in step_us.items()}
        latency["p99_ratio"] = latency["adaptive"]["p99"] / latency["static"]["p99"]
        latency["max_ratio"] = latency["adaptive"]["max"] / latency["static"]["max"]
        copied = {k: policy.copied_bytes[k] - copied_before[k] for k in copied_before}
        entry = {
            "cold_share": share,
            "frozen_cold_share_whole_phase": frozen_all,
            "steps_to_1.5x_oracle": steps_15,
            "steps_to_close_80pct": steps_80,
            "swaps": policy.swaps_done - swaps_before,
            "reversals": reversals,
            "swaps_until_1.5x": swaps_to_target,
            "swaps_per_barrier_last_third": half_swaps / half_barriers if half_barriers else 0.0,
            "host_link_bytes": copied["in"] + copied["out"],
            "copy_rows_per_layer_mean_first_200": float(copy_rows[:BOUND_STEPS].mean()),
            "modeled_step_us_first_steps": latency,
            "prior_last_third": max(set(chosen), key=chosen.count) if chosen else None,
        }
        if series:
            entry["series"] = {"static": (static / per_step).tolist(), "oracle": (oracle / per_step).tolist(),
                               "adaptive": (adaptive / per_step).tolist()}
        result["phases"][phase] = entry
    result["barrier_seconds_median"] = float(np.median(barrier_seconds)) if barrier_seconds else None
    result["barrier_seconds_max"] = float(np.max(barrier_seconds)) if barrier_seconds else None
    result["layers"] = layers
    result["priors"] = sorted(priors or {})
    return result


def parse_sweep(text: str) -> list[dict]:
    keys = {"interval": int, "swaps": int, "decay": float, "margin": float, "evidence": float,
            "counts_evidence": float, "prior": float, "copy": float, "spare": int, "flip": int}
    axes = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, _, values = part.partition("=")
        if name not in keys:
            raise SystemExit(f"--sweep: unknown parameter {name!r} (interval, swaps, decay, margin)")
        axes.append([(name, keys[name](v)) for v in values.split(",")])
    return [dict(combo) for combo in itertools.product(*axes)]


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2%}"


def summary_line(r: dict) -> str:
    c = r["config"]
    head = f"T={r['tokens']:<2} interval={c['interval']:<3} swaps={c['swaps_per_layer']:<2} copy/layer={c['copy_rows_per_layer']} spare={c['spare_rows']} flip={c['flip_interval']} " \
           f"decay={c['decay']:<4} margin={c['margin']:<4} ev={c['evidence']} cev={c['counts_evidence']} " \
           f"prior={c['prior_weight']} " \
           f"profiles={','.join(r['priors']) or 'none'} lookahead={'on' if r['lookahead'] else 'off'}"
    cells = []
    for phase, e in r["phases"].items():
        s = e["cold_share"]
        lat = e["modeled_step_us_first_steps"]
        cells.append(f"{phase}: st {s['static']:.2%} or {s['oracle']:.2%} ad {s['adaptive']:.2%} "
                     f"bd {_pct(s['count_bound_200'])} p99x {lat['p99_ratio']:.3f} maxx {lat['max_ratio']:.3f} "
                     f"1.5x@{e['steps_to_1.5x_oracle']} 80%@{e['steps_to_close_80pct']} "
                     f"sw {e['swaps']} rev {e['reversals']} thr {e['swaps_per_barrier_last_third']:.2f} "
                     f"pr {e['prior_last_third']}")
    tail = f" | barrier median {r['barrier_seconds_median'] * 1e3:.1f} ms, max {r['barrier_seconds_max'] * 1e3:.1f} ms"
    return head + " | " + " | ".join(cells) + tail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1,16", help="decode tokens per step, comma-separated (default 1,16)")
    ap.add_argument("--steps", type=int, default=600, help="decode steps per phase (default 600)")
    ap.add_argument("--layers", type=int, default=40, help="MoE layers simulated, from layer 0 (default 40)")
    ap.add_argument("--window", type=int, default=25, help="trailing window for the time-to-target figures")
    ap.add_argument("--seed", type=int, default=0)
    defaults = AdaptiveConfig()
    ap.add_argument("--interval", type=int, default=defaults.interval)
    ap.add_argument("--swaps", type=int, default=defaults.swaps_per_layer)
    ap.add_argument("--decay", type=float, default=defaults.decay)
    ap.add_argument("--margin", type=float, default=defaults.margin)
    ap.add_argument("--evidence", type=float, default=defaults.evidence)
    ap.add_argument("--counts-evidence", type=float, default=defaults.counts_evidence,
                    help="the noise guard when ranking on counts alone")
    ap.add_argument("--prior", type=float, default=defaults.prior_weight,
                    help="prior_weight: weight of the best-fitting class profile (0 = counts only)")
    ap.add_argument("--priors", default=",".join(CLASSES),
                    help="class profiles the policy is given (comma-separated, or 'none'); a phase whose "
                         "class is left out is traffic the policy has no profile for")
    ap.add_argument("--no-lookahead", action="store_true",
                    help="apply each plan at the barrier that computes it (the CPU default); by default each "
                         "plan applies one barrier later, as on a CUDA device (AdaptivePolicy.lookahead)")
    ap.add_argument("--copy-rows", type=float, default=defaults.copy_rows_per_layer,
                    help="copy_rows_per_layer: expert rows copied host -> HBM per step and MoE layer while adapting")
    ap.add_argument("--host-copies", choices=("spare", "all"), default=defaults.host_copies)
    ap.add_argument("--spare-rows", type=int, default=defaults.spare_rows)
    ap.add_argument("--flip-interval", type=int, default=defaults.flip_interval)
    ap.add_argument("--sweep", default="", help='e.g. "interval=8,16;swaps=4,8;decay=0.8,0.9;margin=0.25,0.5"')
    ap.add_argument("--json", type=Path, help="write every result (with per-step series) here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    logp, cold, priors = load_profiles(args.layers, args.seed)
    wanted = [] if args.priors == "none" else [c.strip() for c in args.priors.split(",") if c.strip()]
    if set(wanted) - set(CLASSES):
        raise SystemExit(f"--priors: unknown class(es) {sorted(set(wanted) - set(CLASSES))}")
    priors = {c: priors[c] for c in wanted}
    base = {"interval": args.interval, "swaps": args.swaps, "decay": args.decay, "margin": args.margin,
            "evidence": args.evidence, "counts_evidence": args.counts_evidence, "prior": args.prior,
            "copy": args.copy_rows, "spare": args.spare_rows, "flip": args.flip_interval}
    grid = [base | combo for combo in parse_sweep(args.sweep)] if args.sweep else [base]
    results = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        t0 = time.perf_counter()
        traffic = make_traffic(logp, tokens, args.steps, args.seed + tokens)
        print(f"# T={tokens}: routing for {len(PHASES)} phases x {args.steps} steps x {args.layers} layers "
              f"generated in {time.perf_counter() - t0:.1f} s", flush=True)
        for combo in grid:
            config = AdaptiveConfig(interval=combo["interval"], swaps_per_layer=combo["swaps"],
                                    decay=combo["decay"], margin=combo["margin"],
                                    evidence=combo["evidence"], counts_evidence=combo["counts_evidence"],
                                    prior_weight=combo["prior"], copy_rows_per_layer=combo["copy"],
                                    spare_rows=combo["spare"], flip_interval=combo["flip"],
                                    host_copies=args.host_copies)
            r = simulate(traffic, cold, config, args.window, series=args.json is not None, priors=priors,
                         lookahead=not args.no_lookahead)
            results.append(r)
            print(summary_line(r), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
