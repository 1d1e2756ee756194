#!/usr/bin/env python3
"""Where the step-time estimate's time goes: a ``bench/decode_sim.py`` result beside the estimate, by component.

For every model, placement and T of a ``decode_sim.json``, the measured figures next to the estimate's
terms for the same geometry (``recipegen.costmodel.estimate.step_terms``, nothing fitted), in µs per
decoder layer (per-step figures — LM head, final norm, argmax — spread over the layers on both sides):

* the step (CUDA events around the graph replay) and, from the profiled replay, the kernels' summed
  device time (busy) and the time between the first kernel's start and the last one's end (span):
  span − busy is the device idle between kernels, which no term of the estimate names;
* by component — routed experts (inside the step, and alone in their own graph), dense GEMMs,
  attention, small kernels (norms, rotary, elementwise, the router's top-k and softmax, other) —
  measured (the profiler's kernel groups) beside the estimate's experts, dense, attention and
  small-kernel terms, and the gap (measured − estimate: positive where the estimate is short);
* the routed experts' bytes per step (unique experts touched × bytes per expert) and their share
  of the HBM read limit measured in the same run, bytes ÷ (experts alone × limit), beside the
  efficiency table's row at that T;
* each of the model's own weight GEMMs timed alone at each T (shape, bytes, µs) beside the estimate's
  GEMM line at those bytes (``efficiency.GEMM_BF16``: fixed + bytes ÷ (limit × efficiency)), and the
  dense bytes per layer the estimate reads (the catalog's) beside those GEMMs' own.

The estimate's inputs: for the two simulated models, the catalog model of the recipe the H200
validation uses (``SIM_RECIPES``; tests/test_estimate_validation.py reads them through ``sim_model``);
for any other geometry (the CPU harness's tiny ones), the run's own geometry: its GEMMs' bytes, its KV
heads and window, the efficiency table's row nearest in bytes per expert. Routing: the run's seeded
popularity; the read limits: the run's own (``components``), or ``--hbm-read-GBps`` /
``--pinned-read-GBps`` where the run measured none (a CPU run).

    .venv/bin/python bench/estimate_gap.py bench/results/decode_sim_h200.json [--json gap.json]

A figure the run did not record (an older run: no profile, no GEMMs alone) prints as "—".
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recipegen.costmodel.efficiency import expert_efficiency  # noqa: E402
from recipegen.costmodel.estimate import (  # noqa: E402
    AttentionGroup,
    MoeLayer,
    OperatingPoint,
    StepModel,
    default_skew,
    step_terms,
    successive_inclusion,
)
from recipegen.costmodel.lane_estimate import _attention_groups, _dense  # noqa: E402
from recipegen.load.recipe import load_recipe  # noqa: E402

# The catalog recipe whose model each simulated geometry is (the H200 validation's).
SIM_RECIPES = {"gpt-oss-120b": "gpt-oss-120b-l40s", "qwen3-30b-a3b": "qwen3-30b-a3b-rtx4090"}
CASES = ("all_hbm", "usage_aware", "positional")
# decode_sim's kernel groups that make up the estimate's small-kernel term
SMALL = ("norm_rope_elementwise", "router_topk_softmax", "other")


class GapError(ValueError):
    """A decode_sim.json this comparison cannot read (the message names the field)."""


def _inputs(name: str, run: dict) -> dict:
    """The estimate's per-model inputs: the catalog model's where the geometry has a sim recipe, else
    the run's own geometry and GEMMs."""
    g = run["geometry"]
    if name in SIM_RECIPES:
        model = load_recipe(SIM_RECIPES[name]).recipe.model
        if (model.decoder_layers, model.routed_experts, model.top_k) != (g["layers"], g["experts"], g["top_k"]):
            raise GapError(f"models.{name}.geometry: layers/experts/top_k {g['layers']}/{g['experts']}/{g['top_k']} "
                           f"are not the catalog model's {model.decoder_layers}/{model.routed_experts}/{model.top_k}")
        per_layer, head, _ = _dense(model, 1)
        return {"source": f"catalog model {model.name} (recipe {SIM_RECIPES[name]})", "per_layer": per_layer,
                "head": head, "attention": _attention_groups(model, 1),
                "efficiency": expert_efficiency(model.expert_format, model.name, model.expert_bytes)}
    gemms = next(iter(run.get("gemms", {}).get("by_T", {}).values()), None)
    if gemms is None:
        raise GapError(f"models.{name}: no catalog model for this geometry and no 'gemms' recorded to take "
                       "its dense bytes from")
    layers = g["layers"]
    kv = 2 * g["kv_heads"] * g["head_dim"] * 2             # bf16 K and V per token per layer
    sliding = (layers + 1) // 2 if g["window"] else 0      # decode_sim: the even layers slide
    attention = tuple(a for a in (AttentionGroup(sliding, kv, g["window"]), AttentionGroup(layers - sliding, kv))
                      if a.layers)
    return {"source": f"the run's own geometry {g['name']} (no catalog model)",
            "per_layer": sum(m["bytes"] * m["launches_per_step"] for m in gemms if m["name"] != "lm_head") / layers,
            "head": sum(m["bytes"] for m in gemms if m["name"] == "lm_head"), "attention": attention,
            "efficiency": expert_efficiency(g["fmt"], g["name"], run["bytes_per_expert"])}


def sim_model(name: str, run: dict, case: str, hbm_read_GBps: float, pinned_read_GBps: float,
              inputs: dict | None = None) -> StepModel:
    """The estimate's model of one simulated placement: the run's seeded routing
    (bench/format_peer.popularity: exp(-4.94 (r/E)^1.01) over a seeded permutation per layer, the
    weights of top_k draws without replacement: the pick shares those draws leave), its cold
    experts or cold layers, and the catalog's (or the geometry's) dense and attention inputs."""
    g = run["geometry"]
    inputs = inputs or _inputs(name, run)
    rng = np.random.default_rng(run["popularity_seed"])
    # the same arithmetic as bench/format_peer.popularity's base, drawn as bench/format_peer.sample_routing does
    base = successive_inclusion(default_skew(g["experts"]), g["top_k"]) / g["top_k"]
    layers = []
    for i in range(g["layers"]):
        shares = np.empty(g["experts"])
        shares[rng.permutation(g["experts"])] = base
        if case == "usage_aware":
            cold = set(run["cold_ids"]["usage_aware"][i])
            layers.append(MoeLayer(tuple(shares), tuple(e in cold for e in range(g["experts"]))))
        elif case == "positional":
            layers.append(MoeLayer(tuple(shares), None, 1.0 if i < run["cold_layers"] else 0.0))
        else:
            layers.append(MoeLayer(tuple(shares)))
    return StepModel(decoder_layers=g["layers"], moe=tuple(layers), top_k=g["top_k"],
                     bytes_per_expert=run["bytes_per_expert"], expert_efficiency=inputs["efficiency"],
                     dense_bytes_per_layer=inputs["per_layer"], head_bytes=inputs["head"],
                     attention=inputs["attention"], hbm_read=hbm_read_GBps * 1e9, pinned_read=pinned_read_GBps * 1e9)


def _component(measured: float | None, estimate: float) -> dict:
    return {"measured": measured, "estimate": estimate, "gap": None if measured is None else measured - estimate}


def case_row(name: str, case: str, t: int, run: dict, row: dict, model: StepModel, hbm_read_GBps: float) -> dict:
    """One model / placement / T: measured and estimated µs per decoder layer by component."""
    terms = step_terms(model, OperatingPoint(t, 0, run["context"]))
    layers = run["geometry"]["layers"]
    per_layer = 1e6 / layers                             # seconds per step -> µs per layer
    measured = row[case]
    prof = measured.get("kernels") or {}
    groups = prof.get("by_component")      # CPU op times on a CPU run: the row says so (device_times)

    def group_us(*names: str) -> float | None:
        return None if groups is None else sum(groups[n]["us"] for n in names) / layers

    step, alone = measured["step_ms"] * 1e-3, measured["experts_ms"] * 1e-3
    out = {"model": name, "case": case, "T": t, "layers": layers,
           "profile_source": prof.get("source") or prof.get("error"),
           "device_times": prof.get("device_times"),
           "step_ms": {"measured": measured["step_ms"], "estimate": terms.total * 1e3},
           "per_layer_us": {
               "step": _component(step * per_layer, terms.total * per_layer),
               "experts_alone": _component(alone * per_layer, terms.experts * per_layer),
               "experts_in_step": _component(group_us("routed_experts"), terms.experts * per_layer),
               "dense_gemm": _component(group_us("dense_gemm"), terms.dense * per_layer),
               "attention": _component(group_us("attention"), terms.attention * per_layer),
               "small_kernels": _component(group_us(*SMALL), terms.small_kernels * per_layer),
               "rest": _component((step - alone) * per_layer, (terms.total - terms.experts) * per_layer),
               "busy": _component(None if groups is None else prof["busy_us"] / layers, terms.total * per_layer),
               "idle_between_kernels": _component(
                   None if groups is None or "span_us" not in prof else (prof["span_us"] - prof["busy_us"]) / layers,
                   0.0)},
           "unique_per_layer": {"measured": row["unique_per_layer_mean"], "estimate": terms.unique_per_layer}}
    if groups is not None:
        out["by_component_us_per_layer"] = {c: v["us"] / layers for c, v in groups.items()}
    # bytes the experts read per step; a run from before decode_sim recorded them: unique × layers × bytes
    nbytes = measured.get("expert_bytes_per_step_mean",
                          row["unique_per_layer_mean"] * layers * run["bytes_per_expert"])
    if case == "all_hbm":
        eff = model.expert_efficiency.at(t) if model.expert_efficiency else None
        in_step = group_us("routed_experts")
        out["experts"] = {
            "bytes_per_step": nbytes, "hbm_read_GBps": hbm_read_GBps,
            "efficiency_alone": nbytes / (alone * hbm_read_GBps * 1e9),
            "efficiency_in_step": (None if not in_step or "expert_bytes" not in prof else
                                   prof["expert_bytes"] / (in_step * layers * 1e-6 * hbm_read_GBps * 1e9)),
            "efficiency_table": eff}
    return out


def gemm_rows(run: dict, t: int, inputs: dict, model: StepModel) -> dict | None:
    """The model's weight GEMMs alone at T beside the estimate's GEMM line at their bytes."""
    gemms = run.get("gemms", {}).get("by_T", {}).get(str(t))
    if gemms is None:
        return None
    rows = []
    for m in gemms:
        est = model.gemm.seconds(m["bytes"], t, model.hbm_read) * 1e6
        rows.append({"name": m["name"], "rows": m["rows"], "cols": m["cols"], "bias": m["bias"], "bytes": m["bytes"],
                     "launches_per_step": m["launches_per_step"], "measured_us": m["us"], "estimate_us": est,
                     "gap_us": m["us"] - est})
    layers = run["geometry"]["layers"]
    measured = sum(r["measured_us"] * r["launches_per_step"] for r in rows) / layers
    estimate = sum(r["estimate_us"] * r["launches_per_step"] for r in rows) / layers
    return {"gemms": rows, "per_layer_us": _component(measured, estimate),
            "dense_bytes_per_layer": {"estimate": inputs["per_layer"] + inputs["head"] / layers,
                                      "these_gemms": sum(r["bytes"] * r["launches_per_step"] for r in rows) / layers}}


def read_limits(data: dict, hbm: float | None, pinned: float | None) -> tuple[float, float]:
    comps = data.get("components", {})
    hbm = hbm if hbm is not None else comps.get("hbm_read_GBps")
    pinned = pinned if pinned is not None else comps.get("pinned_read_GBps")
    for value, field, flag in ((hbm, "hbm_read_GBps", "--hbm-read-GBps"),
                               (pinned, "pinned_read_GBps", "--pinned-read-GBps")):
        if value is None or not math.isfinite(value) or value <= 0:
            raise GapError(f"components.{field} is not recorded (a CPU run measures none): pass {flag}")
    return hbm, pinned


def compare(data: dict, hbm: float, pinned: float) -> dict:
    out: dict = {"hbm_read_GBps": hbm, "pinned_read_GBps": pinned, "gpu": data.get("env", {}).get("gpu"), "models": {}}
    for name, run in data["models"].items():
        inputs = _inputs(name, run)
        cases = [c for c in CASES if c in next(iter(run["per_T"].values()))]
        models = {c: sim_model(name, run, c, hbm, pinned, inputs) for c in cases}
        res = {"inputs": inputs["source"], "rows": [], "gemms": {}}
        for t_key, row in run["per_T"].items():
            t = int(t_key)
            res["rows"] += [case_row(name, c, t, run, row, models[c], hbm) for c in cases]
            res["gemms"][t_key] = gemm_rows(run, t, inputs, models["all_hbm"])
        out["models"][name] = res
    return out


def _f(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def report(result: dict) -> str:
    lines = [f"GPU: {result['gpu']}; HBM read limit {result['hbm_read_GBps']:.0f} GB/s, pinned "
             f"{result['pinned_read_GBps']:.1f} GB/s. µs per decoder layer, measured / estimate (gap = "
             "measured − estimate: positive where the estimate is short)."]
    for name, res in result["models"].items():
        lines.append(f"\n{name} — estimate's inputs: {res['inputs']}")
        lines.append("case | T | step | experts alone | experts in step | dense GEMMs | attention | small kernels "
                     "| rest (step − experts alone) | idle between kernels | kernels profiled from")
        for r in res["rows"]:
            cells = [f"{_f(c['measured'])} / {_f(c['estimate'])} ({_f(c['gap'], '+.1f')})"
                     for k, c in r["per_layer_us"].items() if k not in ("busy", "idle_between_kernels")]
            idle = r["per_layer_us"]["idle_between_kernels"]["measured"]
            lines.append(f"{r['case']} | {r['T']} | " + " | ".join(cells) + f" | {_f(idle)} | {r['profile_source'] or '—'}")
        lines.append("experts, all HBM: T | bytes per step | share of the read limit alone / in step / table")
        for r in res["rows"]:
            e = r.get("experts")
            if e:
                lines.append(f"  {r['T']} | {e['bytes_per_step']:,.0f} | {_f(e['efficiency_alone'], '.3f')} / "
                             f"{_f(e['efficiency_in_step'], '.3f')} / {_f(e['efficiency_table'], '.3f')}")
        for t, gm in res["gemms"].items():
            if gm is None:
                lines.append(f"GEMMs alone at T = {t}: not recorded")
                continue
            db = gm["dense_bytes_per_layer"]
            lines.append(f"GEMMs alone at T = {t}: per layer {_f(gm['per_layer_us']['measured'])} / "
                         f"{_f(gm['per_layer_us']['estimate'])} µs; dense bytes per layer: estimate's "
                         f"{db['estimate']:,.0f}, these GEMMs' {db['these_gemms']:,.0f}")
            for m in gm["gemms"]:
                lines.append(f"  {m['name']} [{t}, {m['cols']}] x [{m['rows']}, {m['cols']}]^T"
                             f"{' + bias' if m['bias'] else ''} ({m['bytes']:,} B, {m['launches_per_step']} per step): "
                             f"{m['measured_us']:.2f} / {m['estimate_us']:.2f} µs ({m['gap_us']:+.2f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result", help="a decode_sim.json (bench/decode_sim.py --out DIR)")
    ap.add_argument("--hbm-read-GBps", type=float, help="the HBM read limit, where the run measured none")
    ap.add_argument("--pinned-read-GBps", type=float, help="the pinned host read limit, where the run measured none")
    ap.add_argument("--json", help="also write the comparison here")
    args = ap.parse_args(argv)
    try:
        try:
            data = json.loads(Path(args.result).read_text())
        except OSError as exc:
            raise GapError(f"cannot read it ({exc.strerror})") from None
        except json.JSONDecodeError as exc:
            raise GapError(f"line {exc.lineno}, column {exc.colno}: not JSON ({exc.msg})") from None
        try:
            result = compare(data, *read_limits(data, args.hbm_read_GBps, args.pinned_read_GBps))
        except (KeyError, TypeError, AttributeError) as exc:
            raise GapError(f"not a decode_sim.json: {type(exc).__name__} {exc}") from None
    except GapError as exc:
        print(f"estimate_gap: error: {args.result}: {exc}", file=sys.stderr)
        return 2
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
