"""`recipegen plan RECIPE LANE --sweep hot=250..384 [--plot out.png]`: choose the offload budget."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click

from recipegen.cli.types import FiniteFloat
from recipegen.common.errors import InputError
from recipegen.common.units import GiB, format_count
from recipegen.schema.lane import MAX_STREAMS


def _streams(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise InputError(f"cannot read {text!r} as concurrencies (e.g. 1,16)", field="--concurrency") from None
    if not values or values[0] < 1 or values[-1] > MAX_STREAMS:
        raise InputError(f"concurrencies must be integers from 1 to {MAX_STREAMS:,} (got {text!r})",
                         field="--concurrency")
    return values


@click.command()
@click.argument("recipe")
@click.argument("lane", required=False)
@click.option("--sweep", "sweep_text", default=None, metavar="hot=LOW..HIGH[:STEP]",
              help="Tabulate hot experts per layer against HBM, KV tokens, host and projected fetch tax.")
@click.option("--class", "traffic_class", default=None, help="Class whose traffic to estimate, on its own "
              "histogram and row map as after `recipegen swap` (default: the lane's active class); the fetch "
              "tax lists every class either way.")
@click.option("--concurrency", "concurrency_text", default=None,
              help="Concurrencies to project (default: the lane's expected min and max).")
@click.option("--prefetch-slots", type=click.IntRange(0), default=None,
              help="Also price a prefetch bank of N spare expert slots per layer in KV tokens.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Draw the sweep to a PNG (needs matplotlib: pip install 'recipegen[plot]').")
@click.option("--context", type=click.IntRange(1), default=None,
              help="KV tokens each sequence holds in the decode estimate (default 4,096, at most max_model_len).")
@click.option("--acceptance", type=FiniteFloat(0.0, 1.0, max_open=True), default=None,
              help="Probability that a draft token is accepted, for the decode estimate (default: the lane's "
                   "speculative.acceptance, else the reference lane's DSpark figure, 0.5425).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--explain", is_flag=True, help="Show the formula and operands of the lane's current fetch figures.")
def plan(recipe: str, lane: str | None, sweep_text: str | None, traffic_class: str | None, concurrency_text: str | None,
         prefetch_slots: int | None, plot_path: Path | None, context: int | None, acceptance: float | None,
         as_json: bool, explain: bool) -> None:
    """Decode speed estimate, projected fetch tax, KV trade-off and k checks for one LANE of RECIPE
    (LANE may be left out when the recipe has one lane)."""
    from recipegen.costmodel.lane import fetch_summary
    from recipegen.costmodel.lane_estimate import alternatives, estimate_lane, require_class, speculation_findings
    from recipegen.costmodel.prefetch import lane_prefetch_price
    from recipegen.costmodel.sweep import parse_sweep, sweep_hot
    from recipegen.ledger import compute_ledger
    from recipegen.load.recipe import load_recipe

    if plot_path is not None:  # before any arithmetic: a missing matplotlib fails in a second
        if sweep_text is None:
            raise InputError("--plot draws a sweep: add --sweep hot=LOW..HIGH", field="--plot")
        from recipegen.common.plotting import plot_target, pyplot

        plot_target(plot_path)
        pyplot()
    loaded = load_recipe(recipe)
    _, lane_spec = loaded.lane_at(lane, "to plan")
    lane = lane_spec.name
    require_class(loaded, lane_spec, traffic_class)   # before any arithmetic
    if context is not None and context > lane_spec.max_model_len:
        raise InputError(f"{context:,} tokens exceed the lane's max_model_len ({lane_spec.max_model_len:,}): "
                         "no sequence holds more", field="--context")
    routed = loaded.recipe.model.routed_experts
    if prefetch_slots is not None and prefetch_slots > routed:
        raise InputError(f"{prefetch_slots:,} spare slots per layer: the model has {routed:,} routed experts per "
                         "layer, so at most that many can be prefetched", field="--prefetch-slots")
    streams = _streams(concurrency_text)
    ledger = compute_ledger(loaded)
    summary = fetch_summary(loaded, lane, streams=streams, ledger=ledger)
    sweep = None
    step = None
    if sweep_text is not None:
        hot_values, step = parse_sweep(sweep_text, loaded.recipe.model.routed_experts)
        sweep = sweep_hot(loaded, lane, hot_values, traffic_class=traffic_class, streams=streams)
    price = lane_prefetch_price(loaded, lane, prefetch_slots) if prefetch_slots is not None else None
    same = {"streams": streams, "traffic_class": traffic_class, "context": context, "acceptance": acceptance}
    estimate = estimate_lane(loaded, lane, ledger=ledger, **same)
    others = alternatives(loaded, lane, ledger=ledger, **same)
    # the estimate itself unchanged: what k=0 would give beside it, where the bands tell them apart
    estimate.warnings.extend(speculation_findings(loaded, lane, estimate, ledger=ledger, traffic_class=traffic_class,
                                                  context=context, acceptance=acceptance))
    violations = _lane_violations(ledger, lane)
    budget_warning = _budget_warning(recipe, lane, violations)
    limit, limit_source = _max_num_seqs(lane_spec)
    beyond = [p.streams for p in estimate.points if p.streams > limit]
    beyond_note = (f"above {limit_source}: vLLM runs at most {limit} sequence{'' if limit == 1 else 's'} at once "
                   f"and queues the rest, so the figures at {', '.join(map(str, beyond))} streams are what raising "
                   "concurrency.max would give" if beyond else None)

    from recipegen.cli.output import ExplainedEcho

    # the report for people, its shorthand explained at the end (in recipegen's words: the
    # recipe's own names and files are the user's)
    say = ExplainedEcho(user_text=_recipe_names(loaded, lane_spec))
    if as_json:
        data = {"budgets": {"ok": not violations, "violations": [v.to_json() for v in violations],
                            "warning": budget_warning},
                "max_num_seqs": {"value": limit, "source": limit_source, "streams_above": beyond,
                                 "note": beyond_note},
                "estimate": {**estimate.to_json(), "alternatives": [a.to_json() for a in others]},
                "fetch": summary.to_json(), "sweep": sweep.to_json() if sweep else None,
                "prefetch": None if price is None else {
                    "slots_per_layer": prefetch_slots, "experts": price.experts, "bank_bytes": price.bank_bytes.value,
                    "kv_tokens_lost": price.kv_tokens_lost.value, "share_of_kv_pool": price.share_of_pool.value}}
        click.echo(json.dumps(data, indent=2))
    else:
        if budget_warning:   # first: every figure below is for a lane vLLM would not start
            say(f"warning: {budget_warning}:")
            for v in violations:
                say(f"  OVER BUDGET [{v.kind}]: {v.message}")   # as `check budgets` words it
            say("")
        say(_mark_beyond("\n".join(_estimate_lines(estimate, others, traffic_class, beyond_note)), limit))
        say("")
        say(_mark_beyond("\n".join(summary.lines()), limit))
        if explain:
            for c in summary.classes:
                if c.active and c.points:
                    for p in c.points:
                        say(f"\n[{c.traffic_class}, C{p.streams}]")
                        for fig in (p.tax.cold_bytes, p.tax.fetch_time, p.tax.share_of_step, p.tax.hot_read_time):
                            if fig is not None:
                                say(fig.explain())
        if price is not None:
            say(f"\nprefetch bank of {format_count(prefetch_slots, 'slot')} per layer: {price.experts} experts = "
                f"{price.bank_gib:.2f} GiB ≈ {price.kv_tokens_lost.value / 1e6:.2f}M KV tokens = "
                f"{price.share_of_pool.value:.0%} of the {price.kv_pool_bytes / GiB:.2f} GiB pool "
                f"({price.kv_tokens_before / 1e6:.2f}M → {price.kv_tokens_after / 1e6:.2f}M tokens)")
        if sweep is not None:
            say("")
            say(_sweep_table(sweep, step, limit))
    if plot_path is not None and sweep is not None:
        from recipegen.costmodel.plot import plot_sweep
        plot_sweep(sweep, plot_path)
        if not as_json:
            say(f"plot written to {plot_path}")
    if not as_json:
        say.finish()


def _recipe_names(loaded: Any, lane_spec: Any) -> list[str]:
    """What the report prints that the recipe's author named: the recipe, its file, the lane, its
    machine, its classes and their row map and histogram files (not recipegen's shorthand)."""
    names = [loaded.recipe.name, str(loaded.path), lane_spec.name, lane_spec.machine]
    for name, cls in lane_spec.classes.items():
        names += [name, *(f for f in (cls.rowmap, cls.histogram) if f)]
    return names


def _lane_violations(ledger: Any, lane: str) -> list[Any]:
    """The violations `check budgets` reports against LANE: its own (every stage's, over several
    machines) and those of the machines it runs on."""
    own = next(entry for entry in ledger.lanes if entry.lane == lane)
    machines = {stage.machine for stage in getattr(own, "stages", None) or [own]}
    return [*own.violations, *(v for v in ledger.machine_violations if v.machine in machines)]


def _budget_warning(recipe: str, lane: str, violations: list[Any]) -> str | None:
    """The warning over a lane whose budgets fail (plan still estimates it: a what-if, but never
    silently); None when they hold."""
    if not violations:
        return None
    return (f"lane {lane}'s budgets do not hold, so vLLM would not start it as written; the figures below assume "
            f"it runs (run `recipegen check budgets {recipe}` for the ledger and what to change)")


def _max_num_seqs(lane_spec: Any) -> tuple[int, str]:
    """The most sequences vLLM runs at once on the lane, and where that comes from, in words."""
    from recipegen.ledger.flags import max_num_seqs

    seqs, in_extra_args = max_num_seqs(lane_spec.extra_args, lane_spec.concurrency.max)
    if in_extra_args:
        return seqs, f"--max-num-seqs {seqs} (the lane's extra_args)"
    return seqs, f"the lane's concurrency.max {seqs} (rendered as --max-num-seqs {seqs})"


def _mark_beyond(text: str, limit: int) -> str:
    """Each C<n> of `text` above `limit` streams, marked † (the note under the estimate says why)."""
    return re.sub(r"\bC(\d+)\b(?!†)", lambda m: m.group(0) + ("†" if int(m.group(1)) > limit else ""), text)


def _estimate_lines(estimate, others, traffic_class: str | None = None,  # type: ignore[no-untyped-def]
                    beyond_note: str | None = None) -> list[str]:
    """The decode estimate for people: the lane, then each alternative in one line."""
    which = (f", class {traffic_class} on its own histogram and row map (as after `recipegen swap`)"
             if traffic_class else "")
    # what the band is, said once here (the glossary's "validation band" is explained by this line)
    speculating = estimate.acceptance is not None
    held = ("; it holds at the draft acceptance stated below: traffic whose drafts are accepted more or less "
            "often runs outside it" if speculating else "")
    lines = [f"decode speed estimate · lane {estimate.lane}{which} (output tokens/s, in parentheses the band "
             f"the validation justifies, rounded outward{held}: docs/costmodel.md, 'Decode speed'):"]
    lines += ["  " + line for line in estimate.lines()]
    for alt in others:
        lines.append(f"  instead, {alt.description}: {alt.per_concurrency_text()} tok/s")
    if speculating:
        lines.append(f"  acceptance {estimate.acceptance:.4f} per draft token ({estimate.acceptance_source})")
    lines += [f"  warning: {w}" for w in estimate.warnings]
    if beyond_note:
        lines.append(f"  note: † {beyond_note}")
    lines += [f"  note: {n}" for n in estimate.notes]
    return lines


def _sweep_table(sweep, step: int | None, limit: int | None = None) -> str:  # type: ignore[no-untyped-def]
    from recipegen.costmodel.sweep import table_rows

    head = f"{'hot':>4} {'cold':>4} {'HBM experts':>12} {'KV pool':>9} {'KV tokens':>10} {'host pinned':>12} " \
           f"{'host free':>10} {'cold share':>10}"
    for s in sweep.streams:   # † above --max-num-seqs, as in the estimate (inside the column's width)
        head += f" {f'fetch C{s}' + ('†' if limit is not None and s > limit else ''):>10}"
    lines = [f"lane {sweep.lane}, class {sweep.traffic_class or '-'}"
             + (f", histogram {sweep.histogram}{' (synthetic)' if sweep.histogram_synthetic else ''}"
                if sweep.histogram else ""), head]
    here = " ◀ lane's offload budget, usage-aware" if sweep.positional else " ◀ lane now"
    marked, broken = False, set[str]()
    for r in table_rows(sweep, step):
        mark = here if r.hot == round(sweep.current_hot) else ""
        marked = marked or bool(mark)
        broken.update(r.violations)
        bad = f"  ✗ {', '.join(r.violations)}" if r.violations else ""
        line = (f"{r.hot:>4} {r.cold:>4} {r.hot_bytes / GiB:>8.2f} GiB {r.kv_pool_bytes / GiB:>5.2f} GiB "
                f"{r.kv_tokens / 1e6:>9.2f}M {r.cold_bytes / GiB:>8.2f} GiB {r.host_headroom / GiB:>6.1f} GiB "
                f"{'' if r.cold_share is None else f'{r.cold_share:.2%}':>10}")
        for p in r.points:
            line += f" {p.tax.fetch_ms:>7.2f} ms"
        lines.append(line + mark + bad)
    beyond = limit is not None and any(s > limit for s in sweep.streams)
    lines += _sweep_legend(here.strip() if marked else None, sorted(broken), beyond)
    lines += [f"note: {n}" for n in sweep.notes]
    return "\n".join(lines)


def _sweep_legend(mark: str | None, broken: list[str], beyond: bool) -> list[str]:
    """What each column and marker of the sweep table means, printed under it (as knee's report and
    `compare` explain their columns): the markers only where a row carries them."""
    from recipegen.common.glossary import BUDGET_KINDS

    lines = ["hot / cold: experts per MoE layer kept in HBM / in pinned host memory; HBM experts: the hot "
             "experts' bytes per GPU; KV pool: the HBM per GPU left for the KV cache (below zero: the hot experts "
             "and the reserve do not fit); KV tokens: the tokens that pool holds (M: millions)",
             "host pinned: the cold experts' bytes in pinned host memory, the lane's GPUs together; host free: the "
             "machine's host memory less the host memory in use (`check budgets`' host headroom); cold share: the share of the class's routed picks that fall on cold experts (note "
             "below); fetch C<n>: the projected fetch tax per decode step at n concurrent streams (as in the fetch tax "
             "above, at the row's cold share)"
             + ("; †: above --max-num-seqs (the note under the decode speed estimate)" if beyond else "")]
    marks = []
    if mark is not None:
        marks.append(f"{mark}: the lane's hot experts per layer as its recipe stands" if mark == "◀ lane now" else
                     f"{mark}: the hot count the positional lane's --cpu-offload-gb bytes would buy as a "
                     "usage-aware lane")
    if broken:
        marks.append("✗ <kind>: a budget the row breaks, as `check budgets` names it (vLLM would not start "
                     "the lane with that many hot): " + "; ".join(f"{k}: {BUDGET_KINDS.get(k, k)}" for k in broken))
    if marks:
        lines.append("; ".join(marks))
    return lines
