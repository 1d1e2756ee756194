"""`recipegen compare RECIPE --machines A,B,C`: the recipe's lane fitted onto each machine (every
GPU of it, the same model, context and traffic), one row per machine — what fits, the hot count,
KV tokens and full-length sequences, pinned host memory, and the speed figure the fit ranks by
(`recipegen.fit.objective`). Nothing is written."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipegen.common.units import GiB
from recipegen.fit.choice import choose, not_chosen_text, same_speed, shown
from recipegen.fit.judged import Candidate
from recipegen.fit.objective import ESTIMATE
from recipegen.fit.run import FitOutcome, candidate_json, fit_recipe
from recipegen.fit.search import PINNED_BLOCKS, USAGE_AWARE, FitOptions
from recipegen.schema import Machine


@dataclass
class Row:
    key: str                  # what the user named (catalog name or file)
    machine: Machine
    outcome: FitOutcome
    name: str = ""            # the name `new` would key it by (a file's own name or stem); "": machine.name

    def cells(self) -> list[str]:
        m, c = self.machine, self.outcome.result.chosen
        gpus = f"{m.gpus.count} × {m.gpus.kind} {m.gpus.usable / GiB:,.1f} GiB"
        host = f"{m.host_memory / GiB:,.0f} GiB" + (" (assumed)" if _host_assumed(m) else "")
        if c is None:
            return [self.key, gpus, host, "no", "—", "—", "—", "—", "—", "—"]
        fig = c.evaluation.ledger.figures
        if c.placement == USAGE_AWARE:
            placement = f"usage-aware (load {c.load_offload_gib} GiB)"
            hot = f"{c.hot_per_layer} / {self.outcome.result_cold()}"
        elif c.load_offload_gib:
            placement = f"positional {c.load_offload_gib} GiB"
            cold = c.evaluation.ledger.active.cold_per_layer
            hot = f"{sum(1 for x in cold if x == 0)} layers whole"
        else:
            placement, hot = "all in HBM", "all"
        return [self.key, gpus, host, "yes", placement, hot, fig["kv.tokens"].display().replace(" tokens", ""),
                str(int(fig["kv.full_sequences"].value)), _pinned_cell(fig),
                c.projection.text]


def _host_assumed(machine: Machine) -> bool:
    """The catalog's host memory is an assumption (no public figure for the box), as `machine list` marks it."""
    return machine.sources.get("host_memory", "").startswith("assumed")


def _pinned_cell(fig: dict[str, Any]) -> str:
    text = f"{fig['host.cold_experts'].value / GiB:,.1f} GiB"
    if _in_blocks(fig):
        text += f" (blocks {fig['host.cold_pinned'].value / GiB:,.1f} GiB)"
    return text


def _in_blocks(fig: dict[str, Any]) -> bool:
    return "host.cold_pinned" in fig and fig["host.cold_pinned"].value > fig["host.cold_experts"].value


HEADERS = ["machine", "GPUs", "host", "fits", "placement", "hot/cold per layer", "KV tokens", "sequences",
           "host pinned", "speed"]


def compare(recipe: str | Path, lane: str | None, machines: list[tuple[str, Machine]], options: FitOptions,
            names: Sequence[str] | None = None) -> list[Row]:
    """`names`: per machine, the name `new` would key it by (`recipegen.fit.new.machine_key`: a
    machine file's own `name:` or its file name, not the catalog machine it starts from)."""
    return [Row(key, machine, fit_recipe(recipe, lane, options, dry_run=True, machine=machine),
                names[i] if names is not None else "")
            for i, (key, machine) in enumerate(machines)]


def table_lines(rows: list[Row], recipe: str, lane: str, max_model_len: int) -> list[str]:
    cells = [HEADERS] + [r.cells() for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(HEADERS))]
    out = [f"compare {recipe} · lane {lane} · max_model_len {max_model_len:,}"]
    for row in cells:
        out.append("  " + "  ".join(text.ljust(w) for text, w in zip(row, widths)).rstrip())
    if any(r.outcome.result.chosen is not None and _in_blocks(r.outcome.result.chosen.evaluation.ledger.figures)
           for r in rows):
        out.append(f"  host pinned: the experts' bytes; (blocks N GiB): the host memory they take: the size {PINNED_BLOCKS}")
    out.append("  GPUs: count × kind and the memory per GPU CUDA can allocate (the driver's total less its reserve "
               "where the catalog knows the reserve, else the total: `recipegen machine list` gives both); host: the "
               "machine's host memory ((assumed): no public figure for the box)")
    for r in rows:
        res = r.outcome.result
        if res.chosen is None:  # each placement's own reason: the one that binds differs between them
            out.append(f"  {r.key}: nothing fits:")
            out += [f"    {x.placement}: {x.reason}" for x in res.refusals]
            if res.suggestion:
                out.append(f"    smallest change that would: {res.suggestion}")
        else:
            out.append(f"  {r.key}: {res.chosen.boundary}")
    fitted = [(r.key, c) for r in rows if (c := r.outcome.result.chosen) is not None]
    if fitted:
        out.append(f"  fastest: {fastest_text(fitted)}")
    out.append("  every figure from the ledger `check budgets` prints; nothing written — `recipegen new MODEL "
               "--machine NAME` writes the recipe for the machine you choose")
    return out


def fastest_text(fitted: Sequence[tuple[str, Candidate]]) -> str:
    """The `fastest:` line (after the label) for the machines where the lane fits, (name, chosen
    placement) in the order named: `recipegen fit`'s rule between placements (`choice.choose`) and
    its words (`choice.not_chosen_text`). Speed figures that differ only by floating-point rounding
    are the same figure (`choice.same_speed`): the larger KV pool decides, and where that is equal
    too the line names a tie instead of calling the machine named first the fastest."""
    kinds = {c.projection.kind for _, c in fitted}
    if len(kinds) > 1:
        # a decode estimate (tok/s) and the link-read stand-in (ms) are not one scale: no ranking
        return ("not ranked: the machines' speed figures are of different kinds ("
                + "; ".join(f"{k}: {c.projection.text}" for k, c in fitted)
                + "); the decode estimate is not available for every machine (see each row)")
    best = choose([c for _, c in fitted])
    top = best.projection
    what = ("the decode estimate at the lane's fewest expected streams, with the band its validation "
            "justifies (docs/costmodel.md 'Decode speed')" if top.kind == ESTIMATE
            else "projected link reads per decode step (docs/costmodel.md)")
    basis = f"(speed: {what}; `recipegen fit` ranks placements by the same figure)"
    tied = [(k, c) for k, c in fitted if c is best or (same_speed(c.projection.score, top.score)
                                                       and round(c.kv_tokens) == round(best.kv_tokens))]
    if len(tied) > 1:
        names = [k for k, _ in tied]
        head = f"a tie between {', '.join(names[:-1])} and {names[-1]}: the same speed ({top.text}) and KV pool"
    else:
        head = tied[0][0]
    # a machine whose figure prints the same, or differs by rounding only: why it is not the one named
    close = [f"over {k}: {not_chosen_text(best, c)}" for k, c in fitted
             if all(c is not t for _, t in tied)
             and (shown(c.projection) == shown(top) or same_speed(c.projection.score, top.score))]
    return "; ".join([f"{head} {basis}", *close])


def rows_json(rows: list[Row]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        c = r.outcome.result.chosen
        out.append({"machine": r.key, "name": r.name or r.machine.name, "gpus": r.machine.gpus.count,
                    "gpu": r.machine.gpus.kind, "gpu_memory_bytes": r.machine.gpus.hbm,
                    "gpu_memory_allocatable_bytes": r.machine.gpus.usable,
                    "driver_reserve_known": bool(r.machine.gpus.driver_reserved),
                    "host_memory_bytes": r.machine.host_memory, "host_memory_assumed": _host_assumed(r.machine),
                    "fits": c is not None,
                    "max_model_len": r.outcome.result.max_model_len,
                    "chosen": candidate_json(c) if c is not None else None,
                    "refusals": [{"placement": x.placement, "reason": x.reason} for x in r.outcome.result.refusals],
                    "suggestion": r.outcome.result.suggestion or None})
    return out
