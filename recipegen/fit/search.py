"""The fit: the placement, hot experts per layer, load-time offload and context of one lane, at
the boundary where every budget holds. Pure arithmetic over the ledger (no file is read here):
every candidate is judged by `recipegen.ledger.compute_lane`, the same figures `check budgets`
prints, so a fitted lane passes `check budgets` by construction.

The search (docs/fit.md):

1. **All in HBM**: vLLM with no `--cpu-offload-gb` (placement positional, 0 GiB). Where every
   budget holds, nothing is read over the host link: it is taken.
2. **Usage-aware** (the residency runtime splits each layer by the class histogram), where the
   runtime can split the model's experts on this GPU: the largest uniform hot count per layer
   whose final HBM leaves `min_sequences` full-length sequences of KV, down to the smallest the
   host can take; for each, the smallest whole-GiB `--cpu-offload-gb` whose load-time HBM peak
   fits (the runtime then re-homes to the map), taking the first count where every budget —
   the load-time peaks and the host included — holds.
3. **Positional** (vLLM's own `--cpu-offload-gb`, whole layers in module order): the smallest
   whole-GiB offload where every budget holds.

Between (2) and (3) the speed projection (`recipegen.fit.objective`) decides. The boundary is
reported: one more hot expert per layer (one GiB less offload) and the budget that breaks.
`--max-model-len auto` puts context first: the model's full context when some placement fits it,
else the longest multiple of 1,024 tokens that fits, then the fastest placement at that context.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recipegen.common.units import GiB, format_bytes, format_count
from recipegen.fit.choice import choose
from recipegen.fit.closest import Tried, closest_text
from recipegen.fit.judged import Candidate, Evaluation, Problem
from recipegen.fit.objective import Context, Projection, link_reads, speed
from recipegen.ledger import compute_lane
from recipegen.ledger.parallel import booting_counts, expert_parallel, parallel_problems
from recipegen.ledger.pinning import PINNED_ROUNDING
from recipegen.ledger.placement import experts_only
from recipegen.ledger.runtime_check import runtime_violations
from recipegen.rowmap.build import hot_preference_order
from recipegen.schema import Lane, Machine, Model

ALL_HBM, USAGE_AWARE, POSITIONAL = "all in HBM", "usage-aware", "positional"
# `--max-model-len auto` below the model's limit: a multiple of this many tokens.
CONTEXT_STEP = 1024
# Budgets a hot count or an offload trades against (the others do not move with them).
HBM_KINDS = frozenset({"hbm", "kv", "sequences"})


@dataclass(frozen=True)
class FitOptions:
    """What `recipegen fit` is asked for."""

    min_sequences: int = 1
    """Full-length (max_model_len) sequences the KV pool must hold."""
    max_model_len: int | None = None
    """A fixed context; None keeps the lane's."""
    auto_context: bool = False
    """Context first: the model's limit if it fits, else the longest that does."""
    concurrency: int | None = None
    """Most concurrent streams expected (the lane's `concurrency.max`)."""
    default_context: str | None = None
    """Where the lane's max_model_len came from when the model declares no limit, in words (`new`
    drafts the lane with its own default: there was no lane to take it from)."""
    gpus_option: str | None = None
    """The command-line option that sets the lane's GPU count (`new --gpus`), named where the count
    is what fails; None: the lane's `gpus:` list."""


@dataclass(frozen=True)
class Refusal:
    """A placement that does not fit, and why."""

    placement: str
    reason: str


@dataclass
class FitResult:
    lane: str
    max_model_len: int
    context_why: str
    chosen: Candidate | None
    candidates: list[Candidate] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    suggestion: str = ""          # nothing fits: the smallest change that would


@dataclass(frozen=True)
class Inputs:
    """What the search reads: the model, the machine (host memory less what the recipe's other
    always-on lanes on it use), the lane, and the histogram its usage-aware map would be built from."""

    model: Model
    machine: Machine
    lane: Lane
    histogram: object | None        # expert_residency.formats.Histogram of the lane's class
    histogram_label: str = ""
    speed_context: Context = field(default_factory=lambda: Context(None, None))


# ------------------------------------------------------------------ evaluation

class _Judge:
    """Evaluates configurations of one lane at one context (memoised: the searches revisit)."""

    def __init__(self, inputs: Inputs, lane: Lane, min_sequences: int) -> None:
        self.inputs, self.lane, self.min_sequences = inputs, lane, min_sequences
        self.model, self.machine = inputs.model, inputs.machine
        self._seen: dict[tuple[str, int | None, int], Evaluation] = {}
        self._order = (_cold_order(inputs.histogram) if inputs.histogram is not None else None)

    def experts(self) -> int:
        return self.model.routed_experts

    def max_offload_gib(self) -> int:
        """An offload that moves everything the walk can move (every routed expert, and the
        non-routed weights too unless the lane offloads experts only)."""
        total = self.model.routed_expert_bytes
        if not experts_only(self.lane):
            total += self.model.dense_bytes or 0
        # vLLM reads --cpu-offload-gb per GPU: each of the TP ranks offloads its 1/TP shards
        return math.ceil(total / self.lane.tensor_parallel_size / GiB) + 1

    def lane_at(self, placement: str, hot: int | None, offload_gib: int) -> Lane:
        updates: dict[str, object] = {"load_cpu_offload": offload_gib * GiB}
        if placement == USAGE_AWARE:
            updates.update(placement="usage-aware", hot_experts_per_layer=hot, cold_experts_budget=None)
        else:
            updates.update(placement="positional", hot_experts_per_layer=None, cold_experts_budget=None,
                           adaptive=None, prefetch_slots_per_layer=0)
        offload = self.lane.offload.model_copy(update=updates)
        return self.lane.model_copy(update={"offload": offload})

    def evaluate(self, placement: str, hot: int | None, offload_gib: int) -> Evaluation:
        key = (placement, hot, offload_gib)
        if key in self._seen:
            return self._seen[key]
        lane = self.lane_at(placement, hot, offload_gib)
        rowmap_hot = rowmap_ids = None
        label = None
        if placement == USAGE_AWARE:
            assert hot is not None
            rowmap_hot = [hot] * self.model.num_moe_layers
            label = f"{hot} hot per layer, top-{hot} of {self.inputs.histogram_label or 'the histogram'}"
            if expert_parallel(lane) and self._order is not None:
                rowmap_ids = [sorted(row[:hot].tolist()) for row in self._order]
        ledger = compute_lane(self.model, self.machine, lane, rowmap_hot=rowmap_hot, rowmap_label=label,
                              rowmap_hot_ids=rowmap_ids)
        problems = [Problem(v.kind, _host_message(ledger.figures) if v.kind == "host" else v.message, v.over_bytes)
                    for v in ledger.violations]
        seqs = int(ledger.fig("kv.full_sequences").value)
        if seqs < self.min_sequences and not {p.kind for p in problems} & {"hbm", "kv"}:
            problems.append(Problem("sequences", f"the KV pool holds {format_count(seqs, 'full-length sequence')} of "
                                    f"{lane.max_model_len:,} tokens, fewer than the {self.min_sequences} asked "
                                    "(--min-sequences)"))
        result = Evaluation(lane, ledger, tuple(problems))
        self._seen[key] = result
        return result

    def speed(self, ev: Evaluation, placement: str, hot: int | None, shares: Sequence[float],
              basis: str) -> Projection:
        return speed(self.inputs.speed_context, self.model, self.machine, ev.lane, ev.ledger, placement, hot,
                     shares, basis)

    def cold_share(self, hot: int) -> tuple[list[float], str]:
        """Per MoE layer, the share of the histogram's picks outside its `hot` most-picked experts."""
        assert self._order is not None and self.inputs.histogram is not None
        counts = np.asarray(self.inputs.histogram.counts, dtype=np.float64)  # type: ignore[attr-defined]
        shares = []
        for row, order in zip(counts, self._order):
            total = row.sum()
            shares.append(float(row[order[hot:]].sum() / total) if total else 0.0)
        return shares, f"top-{hot} map on {self.inputs.histogram_label or 'the class histogram'} (in-sample)"


PINNED_BLOCKS = f"of vLLM's pinned blocks ({PINNED_ROUNDING})"


def pinned_experts_text(fig: Any) -> str:
    """The pinned experts as `check budgets` words them: on a positional lane, the experts' bytes in
    the larger pinned blocks vLLM holds for them (what host memory counts)."""
    text = f"pinned experts {format_bytes(fig['host.cold_experts'].value)}"
    if "host.cold_pinned" in fig and fig["host.cold_pinned"].value > fig["host.cold_experts"].value:
        text += f" in {format_bytes(fig['host.cold_pinned'].value)} {PINNED_BLOCKS}"
    return text


def host_in_use_text(fig: Any) -> str:
    """Host memory in use as its parts (`check budgets`' Host line, shorter)."""
    parts = []
    if fig["host.tables"].value:
        parts.append(f"host tables {format_bytes(fig['host.tables'].value)}")
    parts.append(pinned_experts_text(fig))
    if "host.dense_offloaded" in fig:
        parts.append(f"non-routed weights offloaded {format_bytes(fig['host.dense_offloaded'].value)}")
    parts.append(f"reserve {format_bytes(fig['host.reserve'].value)}")
    counted = (fig["host.tables"].value + fig.get("host.cold_pinned", fig["host.cold_experts"]).value
               + (fig["host.dense_offloaded"].value if "host.dense_offloaded" in fig else 0) + fig["host.reserve"].value)
    if abs(counted - fig["host.total"].value) > 0.5:   # adaptive residency's spare host rows
        parts.append(f"spare host rows {format_bytes(fig['host.total'].value - counted)}")
    return " + ".join(parts) + f" = in use {format_bytes(fig['host.total'].value)}"


def _host_message(fig: dict) -> str:
    """The host budget's excess with its parts as the fit's host line words them (the pinned
    experts, on a positional lane, in vLLM's larger pinned blocks)."""
    total, memory = fig["host.total"].value, fig["host.memory"].value
    return (f"host memory over by {format_bytes(total - memory)}: {host_in_use_text(fig)} > "
            f"{format_bytes(memory)}")


def _cold_order(histogram: object) -> list[np.ndarray]:
    return [hot_preference_order(row) for row in np.asarray(histogram.counts)]  # type: ignore[attr-defined]


def _first_true(lo: int, hi: int, pred: Callable[[int], bool]) -> int | None:
    """Smallest x in [lo, hi] with pred(x), for pred false then true; None when pred(hi) fails."""
    if lo > hi or not pred(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _last_true(lo: int, hi: int, pred: Callable[[int], bool]) -> int | None:
    """Largest x in [lo, hi] with pred(x), for pred true then false; None when pred(lo) fails."""
    if lo > hi or not pred(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if pred(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _problems_text(ev: Evaluation, kinds: set[str] | None = None) -> str:
    shown = [p for p in ev.problems if kinds is None or p.kind in kinds] or list(ev.problems)
    return "; ".join(p.text() for p in shown)


# ------------------------------------------------------------------ the placements

def _all_in_hbm(judge: _Judge) -> Candidate | Refusal:
    ev = judge.evaluate(POSITIONAL, None, 0)
    if not ev.ok:
        return Refusal(ALL_HBM, _problems_text(ev))
    kv = ev.ledger.fig("kv.full_sequences").value
    zero = [0.0] * judge.model.num_moe_layers
    return Candidate(ALL_HBM, ev, None, 0, "every routed expert fits in HBM with the KV asked for: plain vLLM, "
                     "no --cpu-offload-gb, nothing read over the host link",
                     f"the KV pool holds {format_count(int(kv), 'full-length sequence')} ({ev.ledger.fig('kv.tokens').display()})",
                     judge.speed(ev, ALL_HBM, None, zero, "nothing offloaded"))


def _load_offload(judge: _Judge, placement: str, hot: int | None) -> int | None:
    """Smallest whole GiB of --cpu-offload-gb whose load-time HBM peak fits."""
    return _first_true(0, judge.max_offload_gib(),
                       lambda x: "load-hbm" not in judge.evaluate(placement, hot, x).kinds())


def _usage_aware(judge: _Judge) -> Candidate | Refusal:
    model, machine = judge.model, judge.machine
    if judge.inputs.histogram is None:
        return Refusal(USAGE_AWARE, "no histogram to build the row map from")
    experts = judge.experts()
    probe = judge.lane_at(USAGE_AWARE, experts - 1, 0)
    refused = runtime_violations(model, machine, probe)
    if refused:
        return Refusal(USAGE_AWARE, refused[0].message)
    top = experts - 1  # every expert hot is the all-in-HBM placement
    h_hbm = _last_true(0, top, lambda h: not judge.evaluate(USAGE_AWARE, h, 0).kinds() & HBM_KINDS)
    if h_hbm is None:
        return Refusal(USAGE_AWARE, "even 0 hot experts per layer leave too little HBM: "
                       + _problems_text(judge.evaluate(USAGE_AWARE, 0, 0), set(HBM_KINDS)))
    h_host = _first_true(0, top, lambda h: "host" not in judge.evaluate(USAGE_AWARE, h, 0).kinds())
    if h_host is None:
        return Refusal(USAGE_AWARE, "host memory cannot hold the cold experts at any split: "
                       + _problems_text(judge.evaluate(USAGE_AWARE, top, 0), {"host"}))
    if h_host > h_hbm:
        return Refusal(USAGE_AWARE, f"no split fits both: HBM holds at most {h_hbm} hot per layer with the KV "
                       f"asked for, host memory needs at least {h_host} hot (its cold bank and reserve)")
    tried: list[Tried] = []
    for hot in range(h_hbm, h_host - 1, -1):
        offload = _load_offload(judge, USAGE_AWARE, hot)
        if offload is None:
            continue
        ev = judge.evaluate(USAGE_AWARE, hot, offload)
        tried.append(Tried(hot, offload, ev))
        if ev.ok:
            # a load offload that walks non-routed weights too frees HBM for good: the count
            # found with none may grow (the KV the walk frees)
            while hot < top:
                up = _load_offload(judge, USAGE_AWARE, hot + 1)
                if up is None or not judge.evaluate(USAGE_AWARE, hot + 1, up).ok:
                    break
                hot, offload = hot + 1, up
                ev = judge.evaluate(USAGE_AWARE, hot, offload)
            shares, basis = judge.cold_share(hot)
            why = (f"the largest hot count per layer whose HBM leaves "
                   f"{format_count(judge.min_sequences, 'full-length sequence')} of KV{' and whose load and host budgets hold' if hot < h_hbm else ''}; "
                   f"--cpu-offload-gb {offload}: the smallest whole GiB whose load-time HBM peak fits "
                   f"({format_bytes(ev.ledger.fig('load.hbm_peak').value)} of "
                   f"{format_bytes(ev.ledger.fig('hbm.capacity').value)}); the runtime then moves the "
                   "experts to where the row map puts them")
            return Candidate(USAGE_AWARE, ev, hot, offload, why, _ua_boundary(judge, hot),
                             judge.speed(ev, USAGE_AWARE, hot, shares, basis))
        if ev.kinds() - {"load-host", "load-hbm"}:
            break  # a budget a lower hot count does not relieve
    head = f"no hot count between {h_host} and {h_hbm} per layer holds every budget"
    if not tried:
        return Refusal(USAGE_AWARE, f"{head}: no --cpu-offload-gb keeps the load-time HBM peak in HBM")
    return Refusal(USAGE_AWARE, f"{head}; {closest_text(tried)}")


def _ua_boundary(judge: _Judge, hot: int) -> str:
    nxt = hot + 1
    if nxt >= judge.experts():
        ev = judge.evaluate(POSITIONAL, None, 0)
        return f"every expert hot (all in HBM) breaks: {_problems_text(ev)}"
    offload = _load_offload(judge, USAGE_AWARE, nxt)
    if offload is None:
        return (f"one more hot expert per layer ({nxt}) breaks [load-hbm]: no --cpu-offload-gb keeps the "
                "load-time HBM peak in HBM")
    ev = judge.evaluate(USAGE_AWARE, nxt, offload)
    return f"one more hot expert per layer ({nxt}) breaks {_problems_text(ev)}"


def _positional(judge: _Judge) -> Candidate | Refusal:
    top = judge.max_offload_gib()
    offload = _first_true(0, top, lambda x: not judge.evaluate(POSITIONAL, None, x).kinds() & (HBM_KINDS | {"load-hbm"}))
    if offload is None:
        return Refusal(POSITIONAL, "even offloading every routed expert leaves too little HBM: "
                       + _problems_text(judge.evaluate(POSITIONAL, None, top)))
    if offload == 0:
        return Refusal(POSITIONAL, "not needed: every routed expert fits in HBM (all in HBM)")
    ev = judge.evaluate(POSITIONAL, None, offload)
    if not ev.ok:
        return Refusal(POSITIONAL, f"--cpu-offload-gb {offload} (the least that leaves the KV asked for) "
                       f"breaks {_problems_text(ev)}; offloading more only adds host memory")
    prev = judge.evaluate(POSITIONAL, None, offload - 1)
    cold = ev.ledger.active.cold_per_layer
    shares = [c / judge.experts() for c in cold]
    why = (f"--cpu-offload-gb {offload}: the smallest whole GiB that leaves "
           f"{format_count(judge.min_sequences, 'full-length sequence')} of KV (vLLM offloads whole layers in module order: {ev.ledger.active.basis})")
    return Candidate(POSITIONAL, ev, None, offload, why,
                     f"one GiB less (--cpu-offload-gb {offload - 1}) breaks {_problems_text(prev)}",
                     judge.speed(ev, POSITIONAL, None, shares,
                                 "positional: whole layers offloaded, usage-blind (cold experts per layer ÷ experts)"))


def _search_at(inputs: Inputs, lane: Lane, min_sequences: int) -> tuple[Candidate | None, list[Candidate],
                                                                          list[Refusal]]:
    judge = _Judge(inputs, lane, min_sequences)
    candidates: list[Candidate] = []
    refusals: list[Refusal] = []
    first = _all_in_hbm(judge)
    if isinstance(first, Candidate):
        return first, [first], []
    refusals.append(first)
    searches = [_positional] if lane.offload.adaptive is None else []
    searches.insert(0, _usage_aware)
    if lane.offload.adaptive is not None:
        refusals.append(Refusal(POSITIONAL, "the lane declares offload.adaptive (usage-aware only)"))
    for search in searches:
        found = search(judge)
        (candidates if isinstance(found, Candidate) else refusals).append(found)  # type: ignore[arg-type]
    if not candidates:
        return None, [], refusals
    if len({c.projection.kind for c in candidates}) > 1:  # one figure for all, or the ranking mixes units
        for c in candidates:
            shares = ([0.0] * judge.model.num_moe_layers if c.placement == ALL_HBM else
                      judge.cold_share(c.hot_per_layer)[0] if c.placement == USAGE_AWARE else
                      [x / judge.experts() for x in c.evaluation.ledger.active.cold_per_layer])
            c.projection = link_reads(judge.model, judge.machine, c.lane, shares, c.projection.basis)
    return choose(candidates), candidates, refusals


# ------------------------------------------------------------------ the fit

def fit_lane(inputs: Inputs, options: FitOptions) -> FitResult:
    """The fitted lane (as `result.chosen.lane`), or why nothing fits and the smallest change that would."""
    lane = inputs.lane
    if options.concurrency is not None:
        low = min(lane.concurrency.min, options.concurrency)
        lane = lane.model_copy(update={"concurrency": lane.concurrency.model_copy(
            update={"max": options.concurrency, "min": low})})
    limit = inputs.model.max_position_embeddings
    if options.auto_context:
        return _fit_auto_context(inputs, lane, options, limit)
    length = options.max_model_len or lane.max_model_len
    why = "as given (--max-model-len)" if options.max_model_len else "the lane's max_model_len"
    lane = lane.model_copy(update={"max_model_len": length})
    chosen, candidates, refusals = _search_at(inputs, lane, options.min_sequences)
    result = FitResult(lane.name, length, why, chosen, candidates, refusals)
    if chosen is None:
        result.suggestion = _smallest_change(inputs, lane, options, length)
    return result


def _fit_auto_context(inputs: Inputs, lane: Lane, options: FitOptions, limit: int | None) -> FitResult:
    top = limit or lane.max_model_len
    source = ("the model's max_position_embeddings" if limit else
              options.default_context or "the lane's max_model_len (the model declares no limit)")

    def at(length: int) -> tuple[Candidate | None, list[Candidate], list[Refusal]]:
        return _search_at(inputs, lane.model_copy(update={"max_model_len": length}), options.min_sequences)

    chosen, candidates, refusals = at(top)
    if chosen is not None:
        return FitResult(lane.name, top, f"{top:,} tokens: {source}, which fits", chosen, candidates, refusals)
    steps = (top - 1) // CONTEXT_STEP
    best = _last_true(1, steps, lambda n: at(n * CONTEXT_STEP)[0] is not None) if steps >= 1 else None
    if best is None:
        result = FitResult(lane.name, top, f"{source}: {top:,} tokens", None, [], refusals)
        result.suggestion = _smallest_change(inputs, lane.model_copy(update={"max_model_len": top}), options, top,
                                             context_tried=True)
        return result
    length = best * CONTEXT_STEP
    chosen, candidates, more = at(length)
    assert chosen is not None
    # what bounds the context: the chosen placement's reason one step longer, where nothing fits
    longer = min(length + CONTEXT_STEP, top)
    bound = [r for r in (refusals if longer == top else at(longer)[2]) if r.placement == chosen.placement]
    why = (f"{length:,} tokens: the longest multiple of {CONTEXT_STEP:,} that fits ({source} is {top:,}; at "
           f"{longer:,} tokens, " + "; ".join(f"{r.placement}: {r.reason}" for r in bound or refusals) + ")")
    return FitResult(lane.name, length, why, chosen, candidates, more)


def _smallest_change(inputs: Inputs, lane: Lane, options: FitOptions, length: int, *,
                     context_tried: bool = False) -> str:
    """Nothing fits: the one change that would make something fit, tried in this order — a
    reserve that cannot hold the model's dense weights, a shorter context, fewer sequences, more
    host memory, more host memory with a shorter context; else more GPU memory. First of all, a GPU
    count vLLM does not boot the model at ([parallel] in every placement, whatever the memory): the
    counts it boots at."""
    count = _gpu_count_change(inputs, lane, options)
    if count:
        return count
    reserve = _Judge(inputs, lane, options.min_sequences).evaluate(POSITIONAL, None, 0)
    if "reserve" in reserve.kinds():
        return ("re-measure the HBM reserve (reserves.hbm): it is smaller than the dense weights it holds — or "
                "let the ledger estimate it (reserves: {hbm: {estimated: true}})")
    if not context_tried and length > CONTEXT_STEP:
        steps = (length - 1) // CONTEXT_STEP
        best = _last_true(1, steps, lambda n: _search_at(
            inputs, lane.model_copy(update={"max_model_len": n * CONTEXT_STEP}), options.min_sequences)[0] is not None)
        if best is not None:
            return f"lower max_model_len to {best * CONTEXT_STEP:,} tokens (--max-model-len {best * CONTEXT_STEP})"
    # the smallest change is the most sequences that fit (fewer only ever fit too)
    most = _last_true(1, options.min_sequences - 1, lambda m: _search_at(inputs, lane, m)[0] is not None)
    if most is not None:
        return f"ask for fewer full-length sequences (--min-sequences {most} is the most that fits)"
    roomy = inputs.machine.model_copy(update={"host_memory": 1 << 60})
    wide = Inputs(inputs.model, roomy, lane, inputs.histogram, inputs.histogram_label, inputs.speed_context)
    found = _search_at(wide, lane, options.min_sequences)[0]
    if found is not None:
        return _host_needed(inputs, found)
    # A bigger host is not enough at this context, nor a shorter context on this host (tried above):
    # both together may be.
    steps = (length - 1) // CONTEXT_STEP
    best = _last_true(1, steps, lambda n: _search_at(
        wide, lane.model_copy(update={"max_model_len": n * CONTEXT_STEP}), options.min_sequences)[0] is not None)
    if best is not None:
        shorter = best * CONTEXT_STEP
        found = _search_at(wide, lane.model_copy(update={"max_model_len": shorter}), options.min_sequences)[0]
        assert found is not None
        return (f"both a shorter context and a bigger host (neither is enough alone): max_model_len "
                f"{shorter:,} tokens (--max-model-len {shorter}) and " + _host_needed(inputs, found))
    return (f"more GPU memory: even with every routed expert offloaded, HBM holds no full-length sequence, "
            f"down to {min(length, CONTEXT_STEP):,} tokens of context (a GPU with more memory, or more GPUs for tensor "
            "parallelism)")


def _gpu_count_change(inputs: Inputs, lane: Lane, options: FitOptions) -> str:
    """The GPU counts of the machine vLLM boots the model at, where the lane's is not one of them
    (`parallel_problems`, the ledger's [parallel] rule); "" where it is."""
    tp, ep = lane.tensor_parallel_size, expert_parallel(lane)
    if not parallel_problems(inputs.model, tp, expert_parallel=ep):
        return ""
    counts = booting_counts(inputs.model, inputs.machine.gpus.count, expert_parallel=ep)
    if options.gpus_option:
        said = " or ".join(f"{options.gpus_option} {n}" for n in counts)
    else:
        said = f"{' or '.join(map(str, counts))} of the machine's {inputs.machine.gpus.count} (the lane's gpus:)"
    return (f"a GPU count vLLM boots {inputs.model.name} at: {said}; on this lane's {tp} GPUs every placement fails "
            "on [parallel], which no memory changes")


def _host_needed(inputs: Inputs, found: Candidate) -> str:
    """The host memory the candidate (fitted on an unbounded host) needs, against this machine's."""
    need = max(found.evaluation.ledger.fig("host.total").value, found.evaluation.ledger.fig("load.host_peak").value)
    return (f"a host with at least {math.ceil(need / GiB)} GiB of memory ({found.placement}: "
            f"{format_bytes(need)} at its load-time peak; this machine has {format_bytes(inputs.machine.host_memory)})")


def cold_shares_for(inputs: Inputs, hot: int) -> Sequence[float]:
    """The per-layer cold shares a usage-aware map of `hot` per layer gives on the inputs' histogram."""
    return _Judge(inputs, inputs.lane, 1).cold_share(hot)[0]
