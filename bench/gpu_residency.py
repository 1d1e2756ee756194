#!/usr/bin/env python3
"""Residency runtime on one GPU: all-HBM vs positional vs usage-aware (± counter), per-layer step
times against the bytes-over-bandwidth floor, plus the limits they are judged by.

Runs on one NVIDIA H200 (see BENCHMARKS.md for the exact command); needs torch
with CUDA and triton, and ``runtime/`` on PYTHONPATH. Nothing else: routing is generated here.

Model: DSv4.1-Flash routed experts (MXFP4 w13 4608x5120 + w2 5120x2304, 18,800,640 bytes each),
384 experts per layer, top-6, ``--layers`` MoE layers (13 by default, so that 3 whole layers are
23.1% of the expert bytes). Weights are random MXFP4 bytes with checkpoint-like scales; the
kernels do the same work on any bytes, so the random bytes stand for weights already in the
kernel layout the config names (tile-major or row-major, ``gpu.layout``).

Routing: per layer, expert popularity p(r) ∝ exp(-4.94·(r/384)^1.01) over a seeded per-layer
permutation (the row-map engineer's synthetic profile); each token draws 6 distinct experts from p.

Cases, side by side on the same routing (each a CUDA graph of the whole ``--layers`` step):
1. ``all_hbm``     — every expert in HBM (one bank);
2. ``positional``  — the last 3 layers entirely in pinned host memory, read in place;
3. ``usage_aware`` — per layer the 295 most popular experts hot, 89 cold in pinned host memory
   (the same host bytes as positional within 0.5%);
4. ``usage_counter`` — (3) with the in-kernel usage counter on.

Memory plan (HBM 139 GiB, host 128 GiB): one all-HBM copy of every layer (13 × 6.72 GiB) serves
as the hot bank of every case — an expert's hot row is its row in that tensor, addressed through
the row map — so only the cold banks are extra: 3 full layers + 13 × 89 experts pinned (≈40.5 GiB).
The kernels read exactly the bytes they would from a compacted hot bank.

Also measured in the same run: HBM streaming-read limit and pinned in-place read limit (a Triton
read kernel), the cold path alone at T=96 (a positional cold layer: every pick cold), the
finalize alone, and the counter's added time (paired per step).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from expert_residency.core.banks import ExpertBank, ResidentLayer, build_unsplit_layer  # noqa: E402
from expert_residency.core.counter import ExpertCounter  # noqa: E402
from expert_residency.core.devmap import encode_row_codes  # noqa: E402
from expert_residency.gpu.experts import (  # noqa: E402
    ExpertShape,
    KernelConfig,
    TritonMxfp4Experts,
    runs_warp_specialized,
)
from expert_residency.gpu.graphs import CapturedStep  # noqa: E402
from expert_residency.gpu.pinned import PinnedRegion  # noqa: E402
from expert_residency.gpu.tile_rules import check_compiled_block_m  # noqa: E402

DSV41 = ExpertShape(hidden=5120, intermediate=2304)
NAMES = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")
DEV = torch.device("cuda")
GB = 1e9
GIB = 2 ** 30


# -- limits ----------------------------------------------------------------------------------------

@triton.jit
def _read_kernel(src_ptr, out_ptr, n_words, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """Stream ``n_words`` int32 words; one xor-sum per program keeps the loads live."""
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    base = pid.to(tl.int64) * BLOCK * ITERS
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(src_ptr + offs, mask=offs < n_words, other=0)
    tl.store(out_ptr + pid, tl.xor_sum(acc, axis=0))


def read_bandwidth(buf: torch.Tensor, reps: int, warmup: int = 2) -> dict:
    words = buf.view(torch.int32).reshape(-1)
    block, iters = 4096, 16
    grid = triton.cdiv(words.numel(), block * iters)
    out = torch.empty(grid, dtype=torch.int32, device=DEV)
    def run():
        return _read_kernel[(grid,)](words, out, words.numel(), BLOCK=block, ITERS=iters, num_warps=8)

    times = time_fn(run, reps, warmup=warmup)
    nbytes = words.numel() * 4
    return {"bytes": nbytes, "median_s": statistics.median(times), "GBps": nbytes / statistics.median(times) / GB,
            "best_GBps": nbytes / min(times) / GB}


HBM_LIMIT_BYTES = int(4e9)


def hbm_read_limit(reps: int = 10, warmup: int = 400) -> dict:
    """The HBM read limit bench/format_peer.py and bench/decode_sim.py divide by (this script and
    bench/peer_moe.py read their own 4.5 GB weight tensors, 4,366-4,382 GB/s on the H200 on
    2026-12-03): the fastest of ``reps`` streaming reads
    (``read_bandwidth``) of a fresh 4 GB buffer, after ``warmup`` reads (~0.4 s) that bring the
    clocks up from idle; ``GBps`` is that best read.

    Why so (one H200, 2026-12-03): after two warm-up reads, the median of ten 4 GB reads swung from
    3,781 to 4,338 GB/s between calls in one process, and the best from 4,141 to 4,349 between runs
    (the SM clock idles at 345 MHz); with the warm-up, three calls in one process read 4,332 / 4,334 /
    4,348 GB/s (once 4,145, in format_peer's process right after it built gpt-oss's layers). Smaller
    buffers read lower (best 3,406-3,986 GB/s over 0.8-1.1 GB): one small model's expert tensor, which
    format_peer used to read, put a BF16 layer at "107%" of its limit."""
    buf = torch.empty(HBM_LIMIT_BYTES // 4, dtype=torch.int32, device=DEV)
    try:
        r = read_bandwidth(buf, reps, warmup=warmup)
        return dict(r, median_GBps=r["GBps"], GBps=r["best_GBps"])
    finally:
        del buf
        torch.cuda.empty_cache()


def event_seconds(fn) -> float:
    """Seconds `fn`'s GPU work takes on the current stream (CUDA events around it)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3


def time_fn(fn, reps: int, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return [event_seconds(fn) for _ in range(reps)]


# -- model, routing, placement ----------------------------------------------------------------------

def popularity(experts: int, layers: int, seed: int) -> np.ndarray:
    """p[layer, expert]: exp(-4.94·(r/E)^1.01) over a seeded per-layer permutation of ranks."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(experts) / experts
    base = np.exp(-4.94 * ranks ** 1.01)
    base /= base.sum()
    p = np.empty((layers, experts))
    for layer in range(layers):
        p[layer, rng.permutation(experts)] = base
    return p


def sample_routing(p: np.ndarray, steps: int, tokens: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [steps, layers, T, k] (distinct per token), weights [steps, layers, T, k] fp32."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    probs = torch.tensor(p, dtype=torch.float32, device=DEV)
    layers, experts = p.shape
    ids = torch.empty(steps, layers, tokens, k, dtype=torch.int64, device=DEV)
    for layer in range(layers):
        draws = torch.multinomial(probs[layer].expand(steps * tokens, experts).contiguous(), k, replacement=False,
                                  generator=gen)
        ids[:, layer] = draws.view(steps, tokens, k)
    weights = torch.softmax(torch.randn(steps, layers, tokens, k, generator=gen, device=DEV), dim=-1)
    return ids, weights


def random_layer(experts: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    h, i = DSV41.hidden, DSV41.intermediate
    shapes = {"w13_weight": (experts, 2 * i, h // 2), "w13_weight_scale": (experts, 2 * i, h // 32),
              "w2_weight": (experts, h, i // 2), "w2_weight_scale": (experts, h, i // 32)}
    out = {}
    for name, shape in shapes.items():
        t = torch.empty(shape, dtype=torch.uint8, device=DEV)
        if name.endswith("scale"):
            t.random_(117, 126, generator=gen)
        else:
            t.random_(0, 256, generator=gen)
        out[name] = t
    return out


def pinned_copy(tensors: dict[str, torch.Tensor], rows: list[int] | None) -> tuple[ExpertBank, float]:
    """A cold bank: ``rows`` of each tensor (all rows if None) copied into pinned host memory."""
    bank_tensors, owners = {}, []
    t0 = time.perf_counter()
    for name in NAMES:
        src = tensors[name] if rows is None else tensors[name][torch.tensor(rows, device=DEV)]
        region = PinnedRegion(tuple(src.shape), src.dtype, DEV)
        region.host.copy_(src)
        bank_tensors[name] = region.view
        owners.append(region)
    n = tensors[NAMES[0]].shape[0] if rows is None else len(rows)
    return ExpertBank(bank_tensors, n, owners), time.perf_counter() - t0


def empty_bank(tensors: dict[str, torch.Tensor]) -> ExpertBank:
    return ExpertBank({name: t[:0] for name, t in tensors.items()}, 0)


def build_cases(full: list[dict[str, torch.Tensor]], p: np.ndarray, hot_count: int, cold_layers: int):
    layers, experts = p.shape
    cases: dict[str, list[ResidentLayer]] = {"all_hbm": [], "positional": [], "usage_aware": []}
    cold_sets: dict[str, list[set[int]]] = {c: [] for c in cases}
    host_bytes = {c: 0 for c in cases}
    pin_s = 0.0
    for layer in range(layers):
        tensors = full[layer]
        unsplit = build_unsplit_layer(tensors, layer_index=layer)
        cases["all_hbm"].append(unsplit)
        cold_sets["all_hbm"].append(set())
        if layer >= layers - cold_layers:
            bank, s = pinned_copy(tensors, None)
            pin_s += s
            ids = list(range(experts))
            codes = encode_row_codes([], ids, experts, device=DEV)
            cases["positional"].append(ResidentLayer(layer, experts, empty_bank(tensors), bank, [], ids, codes))
            cold_sets["positional"].append(set(ids))
            host_bytes["positional"] += bank.nbytes()
        else:
            cases["positional"].append(unsplit)
            cold_sets["positional"].append(set())
        order = np.argsort(-p[layer], kind="stable")
        hot, cold = sorted(order[:hot_count].tolist()), sorted(order[hot_count:].tolist())
        bank, s = pinned_copy(tensors, cold)
        pin_s += s
        # Hot expert e is read from row e of the all-HBM tensor; cold expert cold[r] from row r.
        codes = torch.arange(experts, dtype=torch.int32)
        for r, e in enumerate(cold):
            codes[e] = -r - 1
        hot_bank = ExpertBank(dict(tensors), experts)
        cases["usage_aware"].append(ResidentLayer(layer, experts, hot_bank, bank, hot, cold, codes.to(DEV)))
        cold_sets["usage_aware"].append(set(cold))
        host_bytes["usage_aware"] += bank.nbytes()
    cases["usage_counter"] = cases["usage_aware"]
    cold_sets["usage_counter"] = cold_sets["usage_aware"]
    host_bytes["usage_counter"] = host_bytes["usage_aware"]
    return cases, cold_sets, host_bytes, pin_s


def bytes_per_step(ids: np.ndarray, cold_sets: list[set[int]], per_expert: int, hbm_bw: float,
                   pin_bw: float) -> dict:
    """Means over steps: hot/cold bytes (unique experts touched per layer), cold pick share, and two
    floors — ``serial`` (hot bytes at the HBM limit, then cold bytes at the pinned limit) and
    ``overlap`` (per layer the larger of the two: both banks streamed at once). ``overlap`` is the
    lower, stricter one; the × floor ratios use it."""
    steps, layers = ids.shape[:2]
    hot_b = cold_b = serial = overlap = 0.0
    cold_picks = picks = 0
    for s in range(steps):
        for layer in range(layers):
            flat = ids[s, layer].reshape(-1)
            uniq = np.unique(flat)
            n_cold = sum(1 for e in uniq.tolist() if e in cold_sets[layer])
            h, c = (len(uniq) - n_cold) * per_expert, n_cold * per_expert
            hot_b, cold_b = hot_b + h, cold_b + c
            serial += h / hbm_bw + c / pin_bw
            overlap += max(h / hbm_bw, c / pin_bw)
            cold_picks += sum(1 for e in flat.tolist() if e in cold_sets[layer])
            picks += flat.size
    return {"hot_bytes_per_step": hot_b / steps, "cold_bytes_per_step": cold_b / steps,
            "cold_pick_share": cold_picks / max(picks, 1), "floor_serial_ms": serial / steps * 1e3,
            "floor_ms": overlap / steps * 1e3}


# -- the run -----------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=13)
    ap.add_argument("--cold-layers", type=int, default=3)
    ap.add_argument("--experts", type=int, default=384)
    ap.add_argument("--hot", type=int, default=295)
    ap.add_argument("--top-k", type=int, default=6)
    ap.add_argument("--tokens", default="1,6,16,96")
    ap.add_argument("--steps", default="1:200,6:100,16:60,96:24", help="steps per token count")
    ap.add_argument("--config", default="", help="KernelConfig fields, e.g. dequant=1,block_n1=64")
    ap.add_argument("--sweep", default="", help="';'-separated configs to time on one layer first")
    ap.add_argument("--sweep-tokens", default="1,16,96", help="token counts of the sweep")
    ap.add_argument("--sweep-cold", type=int, default=1, help="0: skip the sweep's cold-only probe")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--limit-reps", type=int, default=10)
    ap.add_argument("--compare", default="", help="';'-separated label=config pairs ('label:k=v,k=v') whose "
                    "all-HBM and usage-aware steps are timed beside the default's")
    args = ap.parse_args()

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    env = {"gpu": props.name, "sms": props.multi_processor_count, "hbm_GiB": props.total_memory / GIB,
           "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda}
    print("env", json.dumps(env), flush=True)
    config = parse_config(args.config)
    token_counts = [int(t) for t in args.tokens.split(",")]
    steps_for = {int(a): int(b) for a, b in (kv.split(":") for kv in args.steps.split(","))}
    k, experts, layers = args.top_k, args.experts, args.layers
    per_expert = DSV41.bytes_per_expert
    assert per_expert == 18_800_640, per_expert

    gen = torch.Generator(device=DEV).manual_seed(args.seed)
    t0 = time.perf_counter()
    full = [random_layer(experts, gen) for _ in range(layers)]
    torch.cuda.synchronize()
    print(f"weights: {layers} layers x {experts} experts = {layers * experts * per_expert / GIB:.2f} GiB in HBM "
          f"({time.perf_counter() - t0:.1f}s)", flush=True)
    p = popularity(experts, layers, args.seed)
    cases, cold_sets, host_bytes, pin_s = build_cases(full, p, args.hot, args.cold_layers)
    print("pinned cold banks: " + ", ".join(f"{c} {b / GIB:.2f} GiB" for c, b in host_bytes.items())
          + f" ({pin_s:.1f}s)", flush=True)
    registered = all(o.registered for L in cases["usage_aware"] for o in L.cold.owners)
    results: dict = {"env": env, "args": vars(args), "bytes_per_expert": per_expert,
                     "host_bytes": host_bytes, "pinned_exact_register": registered}

    # Limits: HBM streaming read and pinned in-place read.
    hbm_buf = full[0]["w13_weight"]
    pinned_buf = cases["positional"][-1].cold.tensors["w13_weight"]
    results["limits"] = {"hbm_read": read_bandwidth(hbm_buf, args.limit_reps),
                         "pinned_read": read_bandwidth(pinned_buf, max(3, args.limit_reps // 3))}
    hbm_bw = results["limits"]["hbm_read"]["GBps"] * GB
    pin_bw = results["limits"]["pinned_read"]["GBps"] * GB
    print(f"limits: HBM read {hbm_bw / GB:.0f} GB/s, pinned in-place read {pin_bw / GB:.1f} GB/s", flush=True)

    if args.sweep:
        results["sweep"] = run_sweep(args.sweep, cases, p, k, experts,
                                     [int(t) for t in args.sweep_tokens.split(",")], bool(args.sweep_cold))

    ex_max_tokens = max(token_counts)
    # the cold-only probe runs T=96 on the default experts whatever --tokens says
    ex = TritonMxfp4Experts(DSV41, experts, k, max_tokens=max(ex_max_tokens, 96), device=DEV, config=config)
    results["config"] = asdict(config)
    # whether the warp-specialized launches ran (sm_90 and Gluon only): bench/expert_rows.py reads it
    results["warp_specialized"] = runs_warp_specialized(DEV, ex.config)
    # their programs per SM on this GPU (the config's 0 resolves by its memory bandwidth per SM)
    results["ws_programs_per_sm"] = ex.ws_programs_per_sm
    counter = ExpertCounter(list(range(layers)), experts, device=DEV, top_k=k)
    compare = {}
    for item in filter(None, (c.strip() for c in args.compare.split(";"))):
        label, text = item.split(":", 1)
        compare[label] = TritonMxfp4Experts(DSV41, experts, k, max_tokens=ex_max_tokens, device=DEV,
                                            config=parse_config(text))
    results["compare"] = {label: c.config.describe() for label, c in compare.items()}
    results["per_T"] = {}
    for tokens in token_counts:
        results["per_T"][tokens] = run_tokens(tokens, steps_for.get(tokens, 20), ex, cases, cold_sets, p, k,
                                              per_expert, hbm_bw, pin_bw, counter, args.seed, compare)
        print(json.dumps({"T": tokens, **{c: round(v["per_layer_us_mean"], 1) for c, v in
                                          results["per_T"][tokens]["cases"].items()}}), flush=True)

    # The cold path alone at T=96: one positional cold layer, every pick cold.
    results["cold_only"] = cold_only(ex, cases, p, k, per_expert, pin_bw, args.seed)
    results["wall_s"] = time.perf_counter() - t_start
    (out_dir / "gpu_residency.json").write_text(json.dumps(results, indent=1, default=str))
    table = markdown(results)
    (out_dir / "gpu_residency.md").write_text(table)
    print(table)
    return 0


def parse_config(text: str) -> KernelConfig:
    fields = {}
    for kv in filter(None, (s.strip() for s in text.split(","))):
        key, value = kv.split("=")
        fields[key.strip()] = int(value)
    config = KernelConfig(**fields)
    check_compiled_block_m(config, DEV)   # block_m < 16 is wrong compiled (gpu/tile_rules.py)
    return config


def make_step(ex: TritonMxfp4Experts, layers: list[ResidentLayer], tokens: int, counter=None):
    outs = torch.empty(len(layers), tokens, DSV41.hidden, dtype=torch.bfloat16, device=DEV)

    def step(x, w, ids):
        for i, layer in enumerate(layers):
            ex.forward(layer, x[i], w[i], ids[i], counter=counter, out=outs[i])
        return outs

    return step


COMPARED_CASES = ("all_hbm", "usage_aware")


def timing_order(names: list[str]) -> list[str]:
    """The order the cases of a step are timed in (reversed every other step): each compared case
    (``case@label``) right after its own case, so a config and the one it is compared with always
    neighbour each other and swap places from one step to the next; ``usage_counter`` right before
    ``usage_aware`` (the counter's cost is their paired difference). With every compared case after
    all the default ones, an H100 gave the T = 1 register cap 0.97-0.98x of the uncapped step where
    the cap was the compared config and 1.00x where it was the default (BENCHMARKS.md, run TP)."""
    compared = [n for n in names if "@" in n]
    order: list[str] = []
    for name in names:
        if "@" in name or name == "usage_counter":
            continue
        if name == "usage_aware" and "usage_counter" in names:
            order.append("usage_counter")
        order.append(name)
        order += [c for c in compared if c.split("@")[0] == name]
    return order + [n for n in names if n not in order]


def run_tokens(tokens, steps, ex, cases, cold_sets, p, k, per_expert, hbm_bw, pin_bw, counter, seed,
               compare=None):
    """``compare``: {label: experts of another config}; their all-HBM and usage-aware steps are
    timed in the same interleaved loop (cases ``all_hbm@label``, ``usage_aware@label``)."""
    layers = len(cases["all_hbm"])
    ids, weights = sample_routing(p, steps, tokens, k, seed + tokens)
    gen = torch.Generator(device=DEV).manual_seed(seed + 7 * tokens)
    x = torch.randn(layers, tokens, DSV41.hidden, generator=gen, device=DEV).to(torch.bfloat16)
    graphs = {}
    for case, resident in cases.items():
        step = make_step(ex, resident, tokens, counter if case == "usage_counter" else None)
        graphs[case] = CapturedStep(step, x, weights[0], ids[0])
    for label, ex_c in (compare or {}).items():
        for case in COMPARED_CASES:
            graphs[f"{case}@{label}"] = CapturedStep(make_step(ex_c, cases[case], tokens), x, weights[0], ids[0])
    # Finalize alone: the same K-row fp32 fma for every layer of the step.
    picks = torch.randn(layers, tokens, k, DSV41.hidden, device=DEV).to(torch.bfloat16)
    fin_out = torch.empty(layers, tokens, DSV41.hidden, dtype=torch.bfloat16, device=DEV)

    def fin_step(xx, w, _ids):
        for i in range(layers):
            ex.finalize(picks[i], w[i], out=fin_out[i])
        return fin_out

    graphs["finalize_only"] = CapturedStep(fin_step, x, weights[0], ids[0])
    times = {case: [] for case in graphs}
    order = [(case, graphs[case]) for case in timing_order(list(graphs))]
    for s in range(steps):
        # Same routing for every case, timed one after another; the order flips every step so that
        # no case always follows the same neighbour (paired differences such as the counter's
        # cost would otherwise carry an order effect).
        for case, g in (order if s % 2 == 0 else order[::-1]):
            g.load(topk_weights=weights[s], topk_ids=ids[s])
            times[case].append(event_seconds(g.graph.replay))
    ids_np = ids.cpu().numpy()
    out = {"steps": steps, "cases": {}}
    for case in [c for c in graphs if c != "finalize_only"]:
        b = bytes_per_step(ids_np, cold_sets[case.split("@")[0]], per_expert, hbm_bw, pin_bw)
        mean, med = statistics.fmean(times[case]), statistics.median(times[case])
        out["cases"][case] = {
            "step_ms_mean": mean * 1e3, "step_ms_median": med * 1e3,
            "per_layer_us_mean": mean / layers * 1e6, "per_layer_us_median": med / layers * 1e6,
            **b, "x_floor": mean * 1e3 / b["floor_ms"], "x_floor_serial": mean * 1e3 / b["floor_serial_ms"],
            "achieved_GBps": (b["hot_bytes_per_step"] + b["cold_bytes_per_step"]) / mean / GB,
        }
    ua, pos = out["cases"]["usage_aware"], out["cases"]["positional"]
    paired = [c - u for c, u in zip(times["usage_counter"], times["usage_aware"])]
    out["positional_over_usage_aware"] = pos["step_ms_mean"] / ua["step_ms_mean"]
    out["usage_aware_over_all_hbm"] = ua["step_ms_mean"] / out["cases"]["all_hbm"]["step_ms_mean"]
    out["counter_added_us_per_step_median"] = statistics.median(paired) * 1e6
    out["counter_added_us_per_step_mean"] = statistics.fmean(paired) * 1e6
    out["counter_added_us_per_step_sem"] = (statistics.stdev(paired) / math.sqrt(len(paired)) * 1e6
                                            if len(paired) > 1 else float("nan"))
    out["counter_pct_of_step"] = 100 * statistics.median(paired) / statistics.median(times["usage_aware"])
    out["finalize_fused"] = ex._fuses_finalize(tokens)   # then the separate kernel is not on the path
    out["finalize_us_per_layer"] = statistics.median(times["finalize_only"]) / layers * 1e6
    out["finalize_pct_of_layer"] = 100 * statistics.median(times["finalize_only"]) / statistics.median(
        times["usage_aware"])
    out["counts_total"] = int(counter.counts.sum().item())
    return out


def cold_only(ex, cases, p, k, per_expert, pin_bw, seed, tokens=96, steps=6):
    layer = cases["positional"][-1]
    ids, weights = sample_routing(p[layer.layer_index:layer.layer_index + 1], steps, tokens, k, seed + 999)
    x = torch.randn(1, tokens, DSV41.hidden, device=DEV).to(torch.bfloat16)
    step = make_step(ex, [layer], tokens)
    g = CapturedStep(step, x, weights[0], ids[0])
    times, nbytes = [], []
    for s in range(steps):
        g.load(topk_weights=weights[s], topk_ids=ids[s])
        times.append(event_seconds(g.graph.replay))
        nbytes.append(len(np.unique(ids[s].cpu().numpy())) * per_expert)
    bw = sum(nbytes) / sum(times)
    return {"tokens": tokens, "steps": steps, "unique_experts_mean": statistics.fmean(nbytes) / per_expert,
            "ms_mean": statistics.fmean(times) * 1e3, "GBps": bw / GB, "pct_of_pinned_limit": 100 * bw / pin_bw}


def run_sweep(spec: str, cases, p, k, experts, token_counts=(1, 16, 96), cold=True) -> list[dict]:
    """Time candidate configs on one all-HBM layer at ``token_counts`` (graph replays), plus the
    T=1 L2 probe and (``cold``) the cold-only read rate."""
    rows = []
    layer = cases["all_hbm"][0]
    for text in spec.split(";"):
        cfg = parse_config(text)
        row = {"config": text, "describe": cfg.describe(), "tokens": list(token_counts)}
        try:
            ex = TritonMxfp4Experts(DSV41, experts, k, max_tokens=max(token_counts), device=DEV, config=cfg)
            for tokens in token_counts:
                ids, weights = sample_routing(p[:1], 8, tokens, k, 5 + tokens)
                x = torch.randn(1, tokens, DSV41.hidden, device=DEV).to(torch.bfloat16)
                g = CapturedStep(make_step(ex, [layer], tokens), x, weights[0], ids[0])
                ts, nb = [], []
                for s in range(8):
                    g.load(topk_weights=weights[s], topk_ids=ids[s])
                    ts += time_fn(g.graph.replay, 1, warmup=0)
                    nb.append(len(np.unique(ids[s].cpu().numpy())) * DSV41.bytes_per_expert)
                row[f"T{tokens}_us"] = statistics.median(ts) * 1e6
                row[f"T{tokens}_GBps"] = statistics.fmean(nb) / statistics.median(ts) / GB
                if tokens == 1:
                    row.update(l2_probe(g, ids[0], experts))
            if cold:
                row.update(cold_probe(ex, cases, p, k))
        except Exception as exc:  # a config that does not compile is reported, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        print("sweep", json.dumps(row), flush=True)
        rows.append(row)
    return rows


def l2_probe(g: CapturedStep, ids_like: torch.Tensor, experts: int, reps: int = 16) -> dict:
    """Is the T=1 launch bound by HBM or by its own instructions? Same launch shape (one token, six
    picks on two experts, so two slots) with the two experts changing every replay (read from
    HBM) versus the same two experts every replay (2 x 18.8 MB stay in the 60 MB L2)."""
    def ids_for(a: int, b: int) -> torch.Tensor:
        t = ids_like.clone()
        t[..., :3], t[..., 3:] = a, b
        return t

    rotating = [ids_for((2 * r) % experts, (2 * r + 1) % experts) for r in range(reps)]
    fixed = ids_for(0, 1)
    hbm, l2 = [], []
    for r in range(reps):
        g.load(topk_ids=rotating[r])
        hbm += time_fn(g.graph.replay, 1, warmup=0)
    g.load(topk_ids=fixed)
    l2 = time_fn(g.graph.replay, reps, warmup=2)
    return {"T1_two_experts_hbm_us": statistics.median(hbm) * 1e6,
            "T1_two_experts_l2_us": statistics.median(l2) * 1e6}


def cold_probe(ex: TritonMxfp4Experts, cases, p, k, tokens: int = 96, reps: int = 3) -> dict:
    """Cold-bank read rate of this config: T=96 on the positional cold layer (every pick cold)."""
    layer = cases["positional"][-1]
    if layer.cold.num_rows == 0:
        return {}
    ids, weights = sample_routing(p[layer.layer_index:layer.layer_index + 1], reps, tokens, k, 4242)
    x = torch.randn(1, tokens, DSV41.hidden, device=DEV).to(torch.bfloat16)
    g = CapturedStep(make_step(ex, [layer], tokens), x, weights[0], ids[0])
    ts, nb = [], []
    for s in range(reps):
        g.load(topk_weights=weights[s], topk_ids=ids[s])
        ts += time_fn(g.graph.replay, 1, warmup=0)
        nb.append(len(np.unique(ids[s].cpu().numpy())) * DSV41.bytes_per_expert)
    return {"T96_cold_GBps": sum(nb) / sum(ts) / GB}


def markdown(r: dict) -> str:
    lim = r["limits"]
    lines = [f"GPU: {r['env']['gpu']} ({r['env']['sms']} SMs), torch {r['env']['torch']}, triton {r['env']['triton']}; "
             f"kernel config: {KernelConfig(**r['config']).describe()}",
             "",
             f"Limits: HBM streaming read **{lim['hbm_read']['GBps']:.0f} GB/s**; pinned host in-place read "
             f"**{lim['pinned_read']['GBps']:.1f} GB/s** (Triton read kernel, {lim['hbm_read']['bytes'] / GB:.2f} GB "
             f"/ {lim['pinned_read']['bytes'] / GB:.2f} GB buffers, median). Pinned cold banks: "
             + ", ".join(f"{c} {b / GIB:.2f} GiB" for c, b in r["host_bytes"].items() if c != "usage_counter"),
             "",
             "| T | case | per-layer step (µs, mean) | median | cold picks | bytes/step (hot + cold) | floor µs/layer (overlap / serial) | × floor (overlap / serial) | achieved GB/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    layers = r["args"]["layers"]
    for label, text in r.get("compare", {}).items():
        lines.insert(1, f"Cases `…@{label}`: the same banks and routing with {text}")
    for tokens, res in r["per_T"].items():
        for case, c in res["cases"].items():
            lines.append(f"| {tokens} | {case} | {c['per_layer_us_mean']:.1f} | {c['per_layer_us_median']:.1f} | "
                         f"{100 * c['cold_pick_share']:.2f}% | {c['hot_bytes_per_step'] / GB:.2f} + "
                         f"{c['cold_bytes_per_step'] / GB:.3f} GB | {c['floor_ms'] * 1e3 / layers:.1f} / "
                         f"{c['floor_serial_ms'] * 1e3 / layers:.1f} | {c['x_floor']:.2f} / {c['x_floor_serial']:.2f} | "
                         f"{c['achieved_GBps']:.0f} |")
    lines += ["", "| T | positional ÷ usage-aware | usage-aware ÷ all-HBM | counter (% of step) | finalize (µs/layer, % of layer) |",
              "|---|---|---|---|---|"]
    for tokens, res in r["per_T"].items():
        lines.append(f"| {tokens} | {res['positional_over_usage_aware']:.2f}× | {res['usage_aware_over_all_hbm']:.2f}× | "
                     f"{res['counter_pct_of_step']:.2f}% (median {res['counter_added_us_per_step_median']:.1f} µs/step; mean "
                     f"{res['counter_added_us_per_step_mean']:.1f} ± {res['counter_added_us_per_step_sem']:.1f}) | "
                     f"{res['finalize_us_per_layer']:.1f} µs, {res['finalize_pct_of_layer']:.2f}% |")
    co = r["cold_only"]
    lines += ["", f"Cold path alone (T={co['tokens']}, one layer entirely in pinned host, "
                  f"{co['unique_experts_mean']:.0f} unique experts/step): {co['ms_mean']:.1f} ms, "
                  f"**{co['GBps']:.1f} GB/s = {co['pct_of_pinned_limit']:.0f}% of the in-place read limit**."]
    lines += ["", "Targets (✔ met / ✘ missed):", ""] + [f"- {t}" for t in targets(r)]
    if r.get("sweep"):
        sweep_t = r["sweep"][0].get("tokens", [1, 16, 96])
        lines += ["", "Config sweep (one all-HBM layer, median of 8 graph replays):", "",
                  "| config | " + " | ".join(f"T={t} µs (GB/s)" for t in sweep_t)
                  + " | T=1, 2 experts: from HBM / from L2 (µs) | cold-only T=96 GB/s |",
                  "|---|" + "---|" * (len(sweep_t) + 2)]
        for row in r["sweep"]:
            if "error" in row:
                lines.append(f"| {row['describe']} | error: {row['error'][:80]} |" + " |" * (len(sweep_t) + 1))
            else:
                lines.append(f"| {row['describe']} | " + " | ".join(
                    f"{row[f'T{t}_us']:.0f} ({row[f'T{t}_GBps']:.0f})" for t in sweep_t)
                    + f" | {row['T1_two_experts_hbm_us']:.1f} / {row['T1_two_experts_l2_us']:.1f}"
                    + f" | {row.get('T96_cold_GBps', float('nan')):.1f} |")
    return "\n".join(lines) + "\n"


def targets(r: dict) -> list[str]:
    out = []
    per_t = r["per_T"]

    def mark(ok: bool) -> str:
        return "✔" if ok else "✘"

    for tokens, need in ((1, 4.0), (16, 2.0)):
        if tokens in per_t:
            got = per_t[tokens]["positional_over_usage_aware"]
            out.append(f"{mark(got >= need)} usage-aware ≥ {need:g}× faster than positional at T={tokens}: {got:.2f}×")
    hbm = r["limits"]["hbm_read"]["GBps"]
    for tokens, res in per_t.items():
        got = 100 * res["cases"]["all_hbm"]["achieved_GBps"] / hbm
        need = 60 if tokens >= 6 else 40
        out.append(f"{mark(got >= need)} all-HBM layer ≥ {need}% of the HBM read limit at T={tokens}: {got:.0f}%")
    for tokens, res in per_t.items():
        if tokens <= 16:
            c = res["cases"]["usage_aware"]
            out.append(f"{mark(c['x_floor'] <= 1.3)} usage-aware within 1.3× of its bytes floor at T={tokens}: "
                       f"{c['x_floor']:.2f}× (overlap floor), {c['x_floor_serial']:.2f}× (serial floor)")
    co = r["cold_only"]
    out.append(f"{mark(co['pct_of_pinned_limit'] >= 90)} cold-only path ≥ 90% of the in-place read limit: "
               f"{co['pct_of_pinned_limit']:.0f}%")
    for tokens, res in per_t.items():
        out.append(f"{mark(res['counter_pct_of_step'] <= 0.5)} counter ≤ 0.5% of the step at T={tokens}: "
                   f"{res['counter_pct_of_step']:.2f}%")
        if res.get("finalize_fused"):
            out.append(f"– finalize at T={tokens}: inside the w2 launch (the separate kernel, not launched "
                       f"here, would be {res['finalize_pct_of_layer']:.2f}% of the layer)")
        else:
            out.append(f"{mark(res['finalize_pct_of_layer'] <= 3)} finalize ≤ 3% of the layer at T={tokens}: "
                       f"{res['finalize_pct_of_layer']:.2f}%")
    return out


if __name__ == "__main__":
    sys.exit(main())
