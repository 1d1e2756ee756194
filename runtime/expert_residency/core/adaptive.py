"""Adaptive residency: the row map follows the traffic, one bounded set of swaps per barrier.

The step path is unchanged: ``residency_forward(..., counter=...)`` already counts every pick on
the device (``core.counter``). Everything else happens at a **barrier** — a point where no forward
is in flight, reached every ``interval`` forwards — and runs in this order:

1. **window**: ``counts - seen`` (device; ``seen`` is the counter's value at the last barrier, so
   the counter itself stays cumulative for the dump writer and drift);
2. **decay**: ``score = decay * score + window`` per (layer, expert), float64 on the device;
3. **prior** (optional, device ops): when the lane's class profiles are given, the one (or their
   mixture) under which the window is most likely is chosen and blended into the ranking
   (``choose_prior``, ``blend_prior``) — at one stream per step the counts alone are too thin to
   rank the experts near the hot/cold boundary for hundreds of steps. The smoothed counts before
   the window compete as one more candidate: when they explain the window better than every
   profile (a class nobody profiled), the ranking uses the counts alone;
4. **rank** (``rank_swaps``, device ops): per layer the ``S`` strongest cold experts against the
   ``S`` weakest hot ones, paired strongest-with-weakest; pair ``i`` is accepted only when
   ``cold > (1 + margin) * hot`` (hysteresis), ``cold - hot > evidence * sqrt(cold + hot)``
   (noise guard; ``counts_evidence`` when the ranking rests on counts alone) and every pair
   before it was accepted;
5. **read back** the plan (one small device-to-host copy);
6. **transfer**: each accepted pair becomes a ``core.slots.Transfer`` — the promoted expert copied
   into a spare HBM row, the demoted one into a spare host row unless the host still holds it — and
   a barrier flips the map entries of the transfers whose copies were issued, then recycles their
   old rows. Nothing is allocated per swap.

Every step is one batched tensor op over all layers (``[L, E]``), never a loop over layers: the
device part is a fixed ~55 small kernels whatever the layer count (``tests/runtime/
test_adaptive_plan.py`` checks the batched ranking against a per-layer reference, ties included).

**Lookahead** (``AdaptivePolicy.lookahead``, on by default on a CUDA device): the copies run beside
the steps. Barrier ``k`` flips the transfers whose copies were all issued (the step stream waits on
the device for the last of them; the host does not wait), then enqueues the device part for plan
``k`` and its copy into pinned host memory. One step later (``pump``, called after every ``tick``)
the host reads that plan, reserves spare rows for its swaps (strongest gain first, across layers)
and from then on issues ``copy_rows_per_layer`` × layers expert rows of copies per step on side streams
(``core.copies``); barrier ``k + 1`` flips what was issued by then and carries the rest over. The
plans are the same as without lookahead while the copies keep up — plan ``k`` ranks the same decayed
counts against the same map (the one after plan ``k - 1``'s swaps), because routing does not depend
on the map — each applied one interval later; a report carries the swaps it flipped and the window
of the last plan read (cold picks under the map that served that window).
``tests/runtime/test_adaptive_policy.py`` checks both modes on the same traffic, and the copies
against forwards running at the same time (``tests/runtime/test_adaptive_transfers.py``).

Without lookahead (the CPU default) a barrier reads its plan back at once and runs each transfer's
copies and flip before returning: the synchronous barrier of the simulation and the CPU engine.

Bank shapes never change, so ``shape_hash`` is constant (checked) and captured graphs stay valid;
the live map's ``content_hash`` changes and is reported in every ``BarrierReport``.

The hysteresis is what stops thrash: under traffic that alternates between two classes faster
than the decay forgets, a cold expert and the hot one it would displace keep scores within a
factor ``1 + margin`` of each other and nothing moves (``tests/runtime/test_adaptive_plan.py``).

``plan_swaps`` is pure (scores + hot mask in, ``Swap`` list out) so the policy is unit-testable
without banks; ``AdaptivePolicy`` binds it to a counter and the resident layers. ``tick()`` is
host arithmetic on a Python int, no device op; ``pump()`` issues the step's copies on the side
streams (never on the step's own stream, never inside a captured graph). ``live_rowmap()``
and ``status()`` serve other threads (dumps, status requests) under the policy's map lock, which
a barrier holds while it swaps. docs/adaptive.md has the parameters, figures and the vLLM hook.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .adaptive_config import AdaptiveConfig
from .banks import ResidentLayer
from .copies import CopyEngine, ImmediateCopies, default_engine
from .counter import ExpertCounter
from .livehash import LiveMapHash
from .rehome import current_rowmap
from .slots import CHUNKS_PER_ROW, LayerSlots, MapFlipper, Swap, Transfer, row_bytes
from .swap import SwapStep


def decay_scores(scores: torch.Tensor, window: torch.Tensor, decay: float) -> torch.Tensor:
    """``decay * scores + window`` in the scores' dtype (in place on ``scores``; returned)."""
    return scores.mul_(float(decay)).add_(window.to(scores.dtype))


COPY_LAND_STEPS = 2
"""``AdaptivePolicy.land_steps`` on a CUDA device: issued before forward ``f``'s replay, a
transfer's copies had that step on the link by the host's pump of ``f + 2`` (the host runs about
one step ahead); the copy budget is a fraction of a step's link time at the defaults."""

OBSERVED_PSEUDO_COUNT = 0.5
"""Pseudo-count per (layer, expert) smoothing the observed-counts candidate of the prior choice."""

PROBABILITY_FLOOR = 1e-9
"""Smallest per-pick probability a class profile is taken to give an expert (an expert a profile
never saw must not make one window's likelihood minus infinity)."""


def choose_prior(window: torch.Tensor, log_priors: torch.Tensor) -> torch.Tensor:
    """Index (0-dim device tensor) of the profile ``log_priors [C, L, E]`` under which the window's
    counts ``[L, E]`` are most likely (multinomial log-likelihood; ties go to the lower index)."""
    loglik = (window.to(log_priors.dtype).unsqueeze(0) * log_priors).sum(dim=(1, 2))
    return torch.argmax(loglik)


def blend_prior(scores: torch.Tensor, prior: torch.Tensor, weight: float | torch.Tensor) -> torch.Tensor:
    """``scores + weight * layer_total * prior`` (a new tensor): the profile counts as ``weight``
    times the layer's decayed picks, spread by the profile's per-layer probabilities ``[L, E]``.
    ``weight`` may be a 0-dim device tensor (chosen on the device, no sync)."""
    if not isinstance(weight, torch.Tensor):
        weight = float(weight)
    return scores + weight * scores.sum(dim=1, keepdim=True) * prior.to(scores.dtype)


def rank_swaps(scores: torch.Tensor, hot_mask: torch.Tensor, swaps_per_layer: int, margin: float,
               evidence: float | torch.Tensor = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Device-side ranking: ``(promote [L, S], demote [L, S], accept [L, S] bool)``.

    ``scores [L, E]`` float, ``hot_mask [L, E]`` bool. Column ``i`` pairs a layer's ``i``-th
    strongest cold expert with its ``i``-th weakest hot one; ties go to the lower expert id (stable
    sorts over ids in ascending order). ``accept`` is a prefix per layer: cold scores fall and hot
    scores rise along the columns, so the first refused pair ends the layer's swaps. Columns past a
    layer's hot or cold count are refused. No host synchronisation.
    """
    layers, experts = scores.shape
    width = min(int(swaps_per_layer), experts)
    # masked_fill with a Python scalar: no host-made tensor, so the ranking can be graph-captured
    cold_key = scores.masked_fill(hot_mask, float("-inf"))
    hot_key = scores.masked_fill(~hot_mask, float("inf"))
    cold_sorted, cold_idx = torch.sort(cold_key, dim=1, descending=True, stable=True)
    hot_sorted, hot_idx = torch.sort(hot_key, dim=1, descending=False, stable=True)
    cold_top, hot_low = cold_sorted[:, :width], hot_sorted[:, :width]
    accept = (cold_top > hot_low * (1.0 + float(margin))) & torch.isfinite(cold_top) & torch.isfinite(hot_low)
    if isinstance(evidence, torch.Tensor) or evidence:  # a device tensor is never read back here
        zero = torch.zeros_like(cold_top)  # refused columns hold +-inf: keep them out of the sqrt
        lead = torch.where(accept, cold_top - hot_low, zero)
        spread = torch.where(accept, cold_top + hot_low, zero)
        guard = evidence if isinstance(evidence, torch.Tensor) else float(evidence)
        accept = accept & (lead > guard * torch.sqrt(spread))
    accept = torch.cumprod(accept.to(torch.int32), dim=1).bool()
    return cold_idx[:, :width], hot_idx[:, :width], accept


def plan_swaps(scores: torch.Tensor, hot_mask: torch.Tensor, layer_indices: Sequence[int], *,
               swaps_per_layer: int, margin: float, evidence: float | torch.Tensor = 0.0) -> list[Swap]:
    """The accepted swaps, layer order then strongest pair first (reads the plan back: a sync)."""
    if scores.shape != hot_mask.shape or scores.dim() != 2 or scores.shape[0] != len(layer_indices):
        raise ValueError(f"scores {tuple(scores.shape)} / hot mask {tuple(hot_mask.shape)} do not match "
                         f"{len(layer_indices)} layers")
    promote, demote, accept = rank_swaps(scores, hot_mask, swaps_per_layer, margin, evidence)
    packed = torch.stack([promote, demote, accept.to(promote.dtype)]).to("cpu").tolist()
    return _accepted(packed, layer_indices)


def _accepted(packed: list, layer_indices: Sequence[int]) -> list[Swap]:
    """The ``Swap`` list from a read-back plan ``[promote, demote, accept]`` (each ``[L][S]``)."""
    swaps = []
    for row, layer in enumerate(layer_indices):
        for p, d, ok in zip(packed[0][row], packed[1][row], packed[2][row]):
            if ok:
                swaps.append(Swap(int(layer), int(p), int(d)))
    return swaps


StepRunner = Callable[[Sequence[SwapStep]], None]


def run_in_order(steps: Sequence[SwapStep]) -> None:
    """The one correct order: a transfer's copies (or the wait for them) first, the map flip last."""
    for step in steps:
        step.run()


@dataclass
class BarrierReport:
    """What one barrier did (the figures status/drift will show)."""

    barrier: int
    """1 for the first barrier."""
    forwards: int
    """Forwards counted (``tick``) since the policy started."""
    swaps: list[Swap]
    """The swaps whose map entries this barrier flipped."""
    window_picks: int
    """Picks counted in the window this barrier ranked (all layers); with lookahead, the window
    of the last plan read since the previous barrier (0 at the first barrier: no plan yet)."""
    window_cold_picks: int
    """Of those, picks of experts that were cold during the window (the map that served it)."""
    host_link_bytes: int
    """Expert bytes the flipped swaps moved over the host link (one row in each, one row out where
    the host did not hold the demoted expert already)."""
    content_hash: str
    """The live map's ``content_hash`` after the swaps."""
    shape_hash: str
    prior: str | None = None
    """The class profile (or ``"mixture"``) the window fitted best, when priors are in use;
    ``"observed"`` when the counts so far fitted it better than every profile (traffic of a class
    without a profile: the ranking then uses the counts alone)."""
    copied_out: int = 0
    """Of ``swaps``, those whose demoted expert was copied back to the host (the rest: a map change)."""
    in_flight: int = 0
    """Transfers still copying (or waiting for copy budget) after this barrier."""

    @property
    def window_cold_share(self) -> float | None:
        return self.window_cold_picks / self.window_picks if self.window_picks else None


@dataclass
class AdaptivePolicy:
    """The policy bound to a counter and the resident layers it may swap.

    ``layers`` must hold exactly the counter's MoE layers, each re-homed with spare rows
    (``rehome_layer(..., hot_spare=, cold_spare=)`` or ``slots.add_spare_rows``) when
    ``swaps_per_layer`` > 0. Construct after re-homing; call ``tick()`` then ``pump()`` after every
    forward is issued and ``barrier()`` when ``tick()`` returned True, before the next forward.
    """

    counter: ExpertCounter
    layers: Mapping[int, ResidentLayer]
    config: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    forwards: int = 0
    barriers: int = 0
    swaps_done: int = 0
    reports: list[BarrierReport] = field(default_factory=list)
    keep_reports: int = 64
    priors: Mapping[str, torch.Tensor] | None = None
    """Per-class per-pick probabilities ``[L, E]`` (each layer's row sums to 1, layers in the
    counter's order), e.g. the lane's class histograms normalised. Used when
    ``config.prior_weight > 0``; their mean is added as one more candidate, ``"mixture"``."""
    graph_decide: bool = True
    """On a CUDA device, capture the barrier's device part (window, decay, prior choice, ranking:
    ~55 small kernels, launch-bound) in a CUDA graph when the policy is made and replay it at every
    barrier; the plan's read-back and the flips stay eager. Falls back to eager calls if capture
    fails."""
    lookahead: bool | None = None
    """Copies beside the steps: each plan read one step after the barrier that computed it, its
    copies issued over the following steps, flipped at the next barrier (module docstring).
    ``None``: on when the counter is on a CUDA device, off on the CPU, where device ops run
    synchronously and a barrier applies its own plan at once."""
    copies: CopyEngine | None = None
    """Where the copies run (``core.copies``); None: side streams on a CUDA device with lookahead,
    else at once on the current stream."""
    reduce_fit: Callable[[torch.Tensor], torch.Tensor] | None = None
    """Pipeline parallel: sums a device vector over the lane's stages (e.g. an all-reduce over the
    pipeline group), applied to each window's fit of every class profile (and its picks) before
    the choice, so every stage ranks its own layers under the class the whole model's window
    fits best — the choice one process holding every layer would make. Its ranking then runs
    eagerly (no captured graph around a collective)."""
    land_steps: int | None = None
    """Lookahead: forwards between a transfer's last copy issued and the first flip that may take
    it (``_flip_copied``). None: ``COPY_LAND_STEPS`` (2) on a CUDA device, 0 elsewhere (the CPU
    build's copies have run, or a flip's wait runs them, before the flip)."""
    plan_delay: int | None = None
    """Lookahead: the plan a barrier started is read by the first ``pump`` at least this many
    ``tick`` s later. None: 2 on a CUDA device — an engine's step runs barrier, tick, pump, so the
    plan is read one step later, when its ~0.2 ms of device work has finished behind the forward
    enqueued after it (reading it at once would make the host wait for the previous step) — and 0
    elsewhere (read by the first pump after the barrier)."""

    def __post_init__(self) -> None:
        order = self.counter.moe_layer_indices
        if set(self.layers) != set(order):
            raise ValueError(f"adaptive policy: the resident layers {sorted(self.layers)[:4]}... are not "
                             f"the counter's MoE layers {list(order)[:4]}...")
        experts = {self.layers[i].num_experts for i in order}
        if experts != {self.counter.num_experts}:
            raise ValueError(f"adaptive policy: layers have {sorted(experts)} experts, the counter "
                             f"{self.counter.num_experts}")
        self._order = tuple(order)
        self._slots = {i: LayerSlots(self.layers[i]) for i in order}
        if self.config.swaps_per_layer > 0:
            short = [i for i in order if not self._slots[i].free_hot
                     or not (self._slots[i].free_host or self.layers[i].host_copies)]
            if short:
                raise ValueError(f"adaptive policy: layer(s) {short[:4]} have no spare HBM row or no spare host "
                                 "row: re-home them with spare rows (rehome_layer(..., hot_spare=, cold_spare=))")
        if self.config.rank_picks == "decode":
            self.counter.enable_decode_counts()
        counts = self._counts()
        self._seen = counts.detach().clone()
        self.scores = torch.zeros(counts.shape, dtype=torch.float64, device=counts.device)
        self._expert_bytes = {i: row_bytes(self.layers[i]) for i in order}
        live = current_rowmap(self.layers)
        self.initial_content_hash = live.content_hash()
        self._live_hash = LiveMapHash(self.layers)   # re-encodes only the layers a flip changed
        self._live_content_hash = self.initial_content_hash
        self.shape_hash = live.shape_hash()
        self._in_barrier = False
        # held while the banks and host mirrors change, so another thread (the dump writer, a
        # status request) never reads a map half-way through a swap
        self._map_lock = threading.Lock()
        self._prior_names: list[str] = []
        self._priors = self._log_priors = None
        if self.priors:
            stacked = []
            for name, table in self.priors.items():
                table = torch.as_tensor(table, dtype=torch.float64).to(counts.device)
                if tuple(table.shape) != tuple(counts.shape):
                    raise ValueError(f"adaptive policy: prior {name!r} has shape {tuple(table.shape)}, "
                                     f"the counter {tuple(counts.shape)}")
                stacked.append(table / table.sum(dim=1, keepdim=True).clamp_min(PROBABILITY_FLOOR))
                self._prior_names.append(str(name))
            if len(stacked) > 1:
                stacked.append(torch.stack(stacked).mean(dim=0))
                self._prior_names.append("mixture")
            self._priors = torch.stack(stacked)
            self._log_priors = torch.log(self._priors.clamp_min(PROBABILITY_FLOOR))
        self._prior_choice: torch.Tensor | None = None
        device = counts.device
        # device scalars made once, outside any capture
        self._no_choice = torch.full((), -1, dtype=torch.int64, device=device)
        self._prior_weight = torch.tensor(float(self.config.prior_weight), dtype=torch.float64, device=device)
        self._evidence = torch.tensor(float(self.config.evidence), dtype=torch.float64, device=device)
        self._counts_evidence = torch.tensor(float(self.config.counts_evidence), dtype=torch.float64,
                                             device=device)
        self._zero = torch.zeros((), dtype=torch.float64, device=device)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graph_out: torch.Tensor | None = None
        self.graph_state = "eager"   # "eager", "captured" or "eager (capture failed: ...)"
        self._lookahead = bool(counts.is_cuda if self.lookahead is None else self.lookahead)
        spare = sum(s.spare_hot for s in self._slots.values())
        self._flipper = MapFlipper([self.layers[i] for i in order], capacity=2 * max(spare, 1))
        if self.copies is None:
            self.copies = default_engine(counts.device, self._lookahead)
        self._now = ImmediateCopies()   # synchronous swaps: without lookahead, and apply()
        if self.plan_delay is None:
            self.plan_delay = 2 if counts.is_cuda else 0
        if self.land_steps is None:
            self.land_steps = COPY_LAND_STEPS if counts.is_cuda else 0
        # lookahead: the map that served the current window (the map at the last plan's ranking)
        self._served_hot = self.hot_mask().clone()
        width = min(int(self.config.swaps_per_layer), self.counter.num_experts)
        size = 4 * len(self._order) * width + 3
        pinned = counts.is_cuda
        self._host_plan = torch.zeros(size, dtype=torch.int64, pin_memory=pinned)
        self._plan_ready = torch.cuda.Event() if pinned else None
        if pinned:
            from ..gpu.pinned import device_view  # (here: gpu.pinned imports core.banks)

            self._plan_view = device_view(self._host_plan, counts.device)
        self._plan_at: int | None = None    # lookahead: forwards at which the pending plan is read
        self._window = [0, 0, -1]           # the last read plan's [picks, cold picks, prior choice]
        self._map_changed = False           # apply() ran outside a barrier since the last plan
        self._transfers: list[Transfer] = []   # reserved, copying or copied; not flipped yet
        self._issuing: deque[Transfer] = deque()   # of those, the ones with chunks not issued yet
        self._queue: list[tuple[Swap, float]] = []   # the last plan's swaps not started, by gain
        self._flipped: list[Transfer] = []     # flipped by a flip-only step since the last report
        self._late = False   # a flip step left transfers issued too recently to flip
        self._credit = 0.0
        self.discarded_plans = 0
        """Plans (or their transfers in flight) dropped because the map changed outside a barrier."""
        self.copied_bytes = {"in": 0, "out": 0}
        """Bytes of copies issued so far, per direction (host → HBM, HBM → host)."""
        if self.graph_decide and counts.is_cuda and self.reduce_fit is None:
            self._capture_at_start()

    def _capture_at_start(self) -> None:
        """Capture the barrier's device part now, while the lane starts: ``torch.cuda.graph``
        synchronises the device, collects garbage and empties the allocator's cache (~0.2 s
        measured on the H200), a stall a decode step must not take. One eager run first settles
        the prior-choice buffer and loads the kernels; on a window of zero picks (the counter's
        value was just taken as seen) it leaves the scores, the seen counts and the served map as
        they are, so the first barrier's plan is the one an eager first barrier would make."""
        self._decide()
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self._decide()
            self._graph, self._graph_out, self.graph_state = graph, out, "captured"
        except Exception as exc:  # keep serving: the eager calls compute the same plan
            self.graph_state = f"eager (capture failed: {type(exc).__name__}: {exc})"[:200]
            self._graph = self._graph_out = None

    # -- the step path -------------------------------------------------------------------------
    def tick(self) -> bool:
        """Count one finished forward; True when a barrier is due. Host-only (no device op)."""
        if self._in_barrier:
            raise RuntimeError("adaptive residency: a forward ran inside a swap barrier "
                               "(between a swap's first copy and its map flip)")
        self.forwards += 1
        return self.forwards % self.config.interval == 0

    def pump(self, *, run: StepRunner = run_in_order) -> int:
        """Lookahead, once per step after ``tick`` (before this step's forward is issued): every
        ``flip_interval`` forwards flip the transfers whose copies were issued (a flip-only
        barrier: the map entries and recycled rows, nothing else); read the pending plan when it is
        due; issue this step's share of copies on the copy engine (``copy_rows_per_layer`` ×
        layers expert rows, in chunks of ``1 / CHUNKS_PER_ROW``), starting transfers strongest gain
        first as their layers have spare rows. Never issues copies on the step's stream. Returns
        the chunks issued."""
        if not self._lookahead:
            return 0
        due = self.forwards % self.config.flip_interval == 0
        if (due or self._late) and len(self._issuing) < len(self._transfers):
            with self._guard(), self._map_lock:
                # the live map's hash is recomputed at the next barrier (its report carries it) or
                # when status() asks: hashing the whole map on the host costs milliseconds
                self._flipped.extend(self._flip_copied(run))
            # transfers issued too recently at a flip step flip at the first later step they may
            # (small flips) instead of holding their spare rows for another flip interval
            self._late = len(self._issuing) < len(self._transfers)
        if self._plan_at is not None and self.forwards >= self._plan_at:
            self._read_plan()
        if not self._copies_waiting():
            self._credit = 0.0
            return 0
        self._credit += self.config.copy_rows_per_layer * len(self._order) * CHUNKS_PER_ROW
        batch, completed, issued = [], [], 0
        while self._credit >= 1.0:
            while self._issuing and self._issuing[0].all_issued:   # issued by hand (a bench's guard)
                self._issuing.popleft()
            transfer = self._issuing[0] if self._issuing else self._start_transfer()
            if transfer is None:
                # every waiting swap's layer is out of spare rows: the budget of the steps spent
                # waiting is not banked (measured on the H200: banked credit came out as a burst
                # of 52 rows in one step, 18 ms of the link, behind which later steps waited)
                self._credit = min(self._credit, 1.0)
                break
            if transfer.issued == 0:
                self._slots[transfer.swap.layer].check_destination(transfer)
            batch.extend(transfer.chunks[transfer.issued])
            transfer.issued += 1
            issued += 1
            self._credit -= 1.0
            if transfer.all_issued:
                completed.append(transfer)
                self._issuing.popleft()
        if batch:
            self.copies.issue(batch)   # one call: the engine enters each side stream once a step
        if completed:
            marker = self.copies.marker()   # after the batch: covers each completed transfer's copies
            for transfer in completed:
                transfer.marker, transfer.issued_at = marker, self.forwards
                self.copied_bytes["in"] += transfer.bytes_in
                self.copied_bytes["out"] += transfer.bytes_out
        if not self._copies_waiting():
            self._credit = 0.0   # nothing waits: no credit banked for a later burst
        return issued

    def _copies_waiting(self) -> bool:
        """Swaps not started, or transfers with chunks not issued yet."""
        return bool(self._queue) or any(not t.all_issued for t in self._issuing)

    def _start_transfer(self) -> Transfer | None:
        """Reserve rows for the strongest waiting swap whose layer has a spare row now (the others
        keep their place until a flip recycles one); None when none can start."""
        for k, (swap, gain) in enumerate(self._queue):
            slots = self._slots[swap.layer]
            if not slots.free_hot or swap.promote in slots.busy or swap.demote in slots.busy:
                continue   # (a cheap test first: most waiting swaps wait for a row)
            transfer = slots.reserve(swap, gain=gain)
            if transfer is not None:
                del self._queue[k]
                self._transfers.append(transfer)
                self._issuing.append(transfer)
                return transfer
        return None

    @property
    def in_barrier(self) -> bool:
        """True from a barrier's first device op to its last map flip: an engine's forward entry
        checks it (host-side proof that no forward runs between a swap's copies and its flip)."""
        return self._in_barrier

    @property
    def in_flight(self) -> list[Transfer]:
        """Transfers reserved and not flipped yet (lookahead)."""
        return list(self._transfers)

    @property
    def waiting(self) -> list[Swap]:
        """The last plan's swaps not started yet, strongest gain first (lookahead)."""
        return [swap for swap, _ in self._queue]

    # -- the barrier ---------------------------------------------------------------------------
    def spare_bytes(self) -> dict[str, int]:
        """Bytes of the spare rows: ``hbm`` (spare hot rows) and ``host`` (host rows beyond the
        cold bank's experts: spare rows and host copies of hot experts)."""
        hbm = host = 0
        for i in self._order:
            layer, per = self.layers[i], self._expert_bytes[i]
            hbm += per * (len(layer.hot_ids) - len(layer.hot_experts))
            host += per * (len(layer.cold_ids) - len(layer.cold_experts))
        return {"hbm": hbm, "host": host}

    def hot_mask(self) -> torch.Tensor:
        """``bool [L, E]`` from the device row maps (no host mirror, no sync)."""
        if self._flipper.table is not None:
            return self._flipper.table.to(self.scores.device) >= 0
        codes = torch.stack([self.layers[i].row_codes.to(self.scores.device) for i in self._order])
        return codes >= 0

    @property
    def lookahead_on(self) -> bool:
        """Whether this policy applies each plan one barrier after computing it."""
        return self._lookahead

    def barrier(self, *, run: StepRunner = run_in_order) -> BarrierReport:
        """Rank and swap. The caller guarantees no forward is in flight between this call and the
        last issued one on the host side (on a GPU the step stream orders the rest). ``run``
        executes each flip's ordered steps (the wait for the copies, then the map flip; without
        lookahead each transfer's copies, then its flip); tests inject a mis-ordered runner to show
        the bit-exact check catches it. With lookahead: flip what was copied, start the next plan."""
        with self._guard():
            with self._map_lock:
                if self._lookahead:
                    if self._plan_at is not None:   # a plan not read yet (an interval of one step)
                        self._read_plan()
                    flipped = self._flipped + self._flip_copied(run)
                    self._flipped = []
                    window = self._window
                    if self._map_changed:           # swaps outside a barrier: the window's map is gone
                        self._served_hot.copy_(self.hot_mask())
                        self._map_changed = False
                        window = [0, 0, -1]
                    self._window = [0, 0, -1]
                    self._start_plan()
                else:
                    packed = self._plan_on_device().to("cpu")   # the barrier's one read-back
                    swaps, window, gains = self._parse(packed)
                    flipped = self._swap_now(swaps, run, gains)
                self._refresh_hash()
        self.barriers += 1
        chosen = int(window[2])
        prior = None if chosen < 0 else (self._prior_names + ["observed"])[chosen]
        report = BarrierReport(self.barriers, self.forwards, [t.swap for t in flipped], int(window[0]),
                               int(window[1]), sum(t.bytes_in + t.bytes_out for t in flipped),
                               self._live_content_hash, self.shape_hash, prior,
                               copied_out=sum(t.copy_back for t in flipped), in_flight=len(self._transfers))
        self.reports.append(report)
        del self.reports[:-self.keep_reports]
        return report

    def _refresh_hash(self) -> None:
        # only the layers flipped since the last report are encoded again (core.livehash)
        self._live_content_hash = self._live_hash.digest()

    def _parse(self, packed: torch.Tensor) -> tuple[list[Swap], list[int], list[float]]:
        """The accepted swaps, ``[window picks, window cold picks, prior choice]`` and each swap's
        gain from a read-back plan (host tensor): vectorised, no Python loop over layers."""
        width = min(int(self.config.swaps_per_layer), self.counter.num_experts)
        n = len(self._order) * width
        flat = packed.numpy()
        promote, demote, accept = (flat[k * n:(k + 1) * n].reshape(len(self._order), width) for k in range(3))
        gain = flat[3 * n:4 * n].view(np.float64).reshape(len(self._order), width)
        rows, cols = np.nonzero(accept)                 # row-major: layer order, strongest pair first
        layers = np.asarray(self._order, dtype=np.int64)[rows]
        swaps = [Swap(int(l), int(p), int(d)) for l, p, d in
                 zip(layers.tolist(), promote[rows, cols].tolist(), demote[rows, cols].tolist())]
        return swaps, flat[4 * n:].tolist(), gain[rows, cols].tolist()

    def _read_plan(self) -> None:
        """Lookahead: the plan the last barrier started (normally finished a step ago: the host
        waits only if it is not), its swaps reserved as transfers, strongest gain first."""
        self._plan_at = None
        if self._plan_ready is not None:
            self._plan_ready.synchronize()
        swaps, self._window, gains = self._parse(self._host_plan)
        self._schedule(swaps, gains)

    def _schedule(self, swaps: Sequence[Swap], gains: Sequence[float]) -> None:
        """The plan's swaps wait in order of gain (ties: layer order, then rank), replacing the
        previous plan's swaps that had not started (this plan ranked the map they would have
        changed); transfers already copying go on. A swap whose experts are in flight is left out."""
        busy = {(t.swap.layer, e) for t in self._transfers for e in (t.swap.promote, t.swap.demote)}
        order = sorted(range(len(swaps)), key=lambda k: -gains[k])   # stable: ties keep plan order
        self._queue = [(swaps[k], float(gains[k])) for k in order
                       if (swaps[k].layer, swaps[k].promote) not in busy and (swaps[k].layer, swaps[k].demote) not in busy
                       and self._applies(swaps[k])]

    def _applies(self, swap: Swap) -> bool:
        """Whether ``swap`` still fits the live map: a plan is ranked on the map of its barrier, and
        a transfer flipped between that ranking and the plan's read (a flip-only step) may already
        have moved one of its experts; such a swap is dropped, and the next plan ranks again."""
        layer = self.layers[swap.layer]
        return swap.promote in layer.cold_ids and swap.demote in layer.hot_ids

    def _flip_copied(self, run: StepRunner) -> list[Transfer]:
        """Lookahead: flip every transfer whose copies were all issued at least ``land_steps``
        forwards ago, then let later copies into the retired rows wait for the flip. The step
        stream waits (on the device) for each flipped transfer's copies; by then they have had a
        whole step on the link and the wait is normally free — flipping copies issued just before
        made flip steps take ~10 ms against ~4.5 ms static on the H200 (13 layers, T = 1). A tick
        count, not a query of the copies, so every tensor- and pipeline-parallel rank flips the
        same transfers at the same step and ranks its next plan against the same map."""
        ready = [t for t in self._transfers if t.all_issued and t.issued_at <= self.forwards - self.land_steps]
        if not ready:
            return []
        steps = [SwapStep("copy", f"step stream waits for {len(ready)} transfer(s)' copies",
                          lambda: self.copies.compute_waits([t.marker for t in ready])),
                 SwapStep("map", f"flip {2 * len(ready)} map entries", lambda: self._flip(ready))]
        run(steps)
        self.copies.copies_wait_compute()
        flipped = set(map(id, ready))
        self._transfers = [t for t in self._transfers if id(t) not in flipped]
        return ready

    def _flip(self, transfers: Sequence[Transfer]) -> None:
        """Write the transfers' map entries (one batched write) and update the host mirrors."""
        position = {index: pos for pos, index in enumerate(self._order)}
        for t in transfers:
            if not t.all_issued:
                raise RuntimeError(f"adaptive residency: layer {t.swap.layer}: map flip for expert "
                                   f"{t.swap.promote} before its copies were issued")
        self._flipper.flip([(position[t.swap.layer], e, code) for t in transfers for e, code in t.codes()])
        for t in transfers:
            self._slots[t.swap.layer].retire(t)
        self.swaps_done += len(transfers)
        self._live_hash.mark(t.swap.layer for t in transfers)

    def _swap_now(self, swaps: Sequence[Swap], run: StepRunner, gains: Sequence[float] | None = None) -> list[Transfer]:
        """Synchronous swaps (no lookahead, and ``apply``): each one's copies on the current
        stream, then its flip, before the next; a spare row retired by one is used by the next."""
        done = []
        for k, swap in enumerate(swaps):
            transfer = self._slots[swap.layer].reserve(swap, gain=0.0 if gains is None else float(gains[k]))
            if transfer is None:
                raise RuntimeError(f"adaptive residency: layer {swap.layer} has no spare row for a swap")
            self._slots[swap.layer].check_destination(transfer)
            transfer.issued = len(transfer.chunks)
            steps = [SwapStep("copy", f"layer {swap.layer}: chunk {j} of expert {swap.promote} in"
                                      + (f", {swap.demote} out" if transfer.copy_back else ""),
                              (lambda c=chunk: self._now.issue(c))) for j, chunk in enumerate(transfer.chunks)]
            steps.append(SwapStep("map", f"codes[{swap.promote}] = hot {transfer.hot_row}, "
                                         f"codes[{swap.demote}] = cold {transfer.host_row}",
                                  lambda t=transfer: self._flip([t])))
            run(steps)
            self.copied_bytes["in"] += transfer.bytes_in
            self.copied_bytes["out"] += transfer.bytes_out
            done.append(transfer)
        return done

    def _start_plan(self) -> None:
        """Lookahead: enqueue the device part and its copy into pinned host memory; no wait."""
        out = self._plan_on_device()
        if self._plan_ready is None:
            self._host_plan.copy_(out)
        else:
            # a kernel writes the plan into the pinned buffer through its device view (SM stores
            # over the link, no copy engine): a DMA copy queued behind the swaps' copies out, which
            # use the same direction, and the host waited up to 7.5 ms for the plan on the H200
            torch.add(out, 0, out=self._plan_view)
            self._plan_ready.record()
        self._plan_at = self.forwards + int(self.plan_delay)

    def _plan_on_device(self) -> torch.Tensor:
        """The device part of a barrier, as one int64 vector ``[promote, demote, accept, gain]``
        (each ``[L, S]``, flattened; the gains' float64 bits) + ``[window picks, window cold
        picks, prior choice]``: eager calls, or on a CUDA device the replay of their graph captured
        when the policy was made (``_capture_at_start``; with a pipeline-parallel ``reduce_fit``
        eager: no captured graph around a collective). A capture that failed there is not tried
        again on the step path."""
        if self._graph is not None:
            self._graph.replay()
            return self._graph_out
        return self._decide()

    def _counts(self) -> torch.Tensor:
        """What the ranking counts: every pick, or decode picks only (``config.rank_picks``)."""
        return self.counter.decode_counts if self.config.rank_picks == "decode" else self.counter.counts

    def _decide(self) -> torch.Tensor:
        """Window, decay, prior choice, ranking: device ops only (no host-made tensor, no
        read-back), writing the policy's persistent buffers in place, so they can be captured."""
        counts = self._counts()
        # a counter reset since the last barrier restarts the window at zero
        window = torch.where(counts >= self._seen, counts - self._seen, counts)
        self._seen.copy_(counts)
        use_priors = self._priors is not None and self.config.prior_weight > 0
        if use_priors:
            # the counts so far (before this window), smoothed: the candidate that wins when no
            # class profile explains the traffic better than its own recent past
            observed = self.scores + OBSERVED_PSEUDO_COUNT
            observed_log = torch.log(observed / observed.sum(dim=1, keepdim=True))
        decay_scores(self.scores, window, self.config.decay)
        hot = self.hot_mask()
        ranked = self.scores
        choice = self._no_choice
        guard: float | torch.Tensor = self.config.counts_evidence
        if use_priors:
            candidates = torch.cat([self._log_priors, observed_log.unsqueeze(0)])
            if self.reduce_fit is None:
                total = window.sum()
                fresh = choose_prior(window, candidates)
            else:   # the fit and the picks of every stage's layers (one collective)
                fit = (window.to(candidates.dtype).unsqueeze(0) * candidates).sum(dim=(1, 2))
                fit = self.reduce_fit(torch.cat([fit, window.sum().to(fit.dtype).view(1)]))
                total, fresh = fit[-1], torch.argmax(fit[:-1])
            if self._prior_choice is None:   # the first barrier: nothing earlier to keep
                self._prior_choice = fresh.clone()
            else:   # an empty window keeps the previous choice (nothing new to judge by)
                self._prior_choice.copy_(torch.where(total > 0, fresh, self._prior_choice))
            choice = self._prior_choice
            classes = self._priors.shape[0]
            profile = choice < classes
            weight = torch.where(profile, self._prior_weight, self._zero)
            guard = torch.where(profile, self._evidence, self._counts_evidence)
            # index_select, not tensor[choice]: a 0-dim index would be read back to the host
            table = torch.index_select(self._priors, 0, choice.clamp(max=classes - 1).view(1))[0]
            ranked = blend_prior(self.scores, table, weight)
        # the map that served the window: the live one, or with lookahead the one the last plan
        # ranked (the flips since were made at this barrier, before this plan)
        served = self._served_hot if self._lookahead else hot
        picks = torch.stack([window.sum(), (window * (~served).to(window.dtype)).sum(),
                             choice.to(window.dtype)])
        if self._lookahead:
            self._served_hot.copy_(hot)
        promote, demote, accept = rank_swaps(ranked, hot, self.config.swaps_per_layer,
                                             self.config.margin, guard)
        # each pair's lead on the ranked scores orders the copies across layers (refused columns
        # may hold inf - inf: never read)
        gain = (torch.gather(ranked, 1, promote) - torch.gather(ranked, 1, demote)).to(torch.float64)
        plan = torch.stack([promote, demote, accept.to(promote.dtype)])
        return torch.cat([plan.reshape(-1), gain.contiguous().view(torch.int64).reshape(-1),
                          picks.to(plan.dtype)])

    def live_rowmap(self, *, provenance: dict | None = None):
        """The map the banks hold now (an ``expert_residency.formats.RowMap``), consistent even
        while a barrier runs on another thread; provenance records that the policy built it."""
        base = {"builder": "adaptive", "barriers": self.barriers, "swaps": self.swaps_done,
                "boot_content_hash": self.initial_content_hash}
        with self._map_lock:
            return current_rowmap(self.layers, provenance=base | dict(provenance or {}))

    def status(self) -> dict:
        """JSON-ready figures for status/drift: live and boot hashes, barriers, swaps, the last
        window's cold share and chosen profile (None before the first barrier)."""
        last = self.reports[-1] if self.reports else None
        live = self.live_rowmap()
        return {"live_content_hash": live.content_hash(), "boot_content_hash": self.initial_content_hash,
                "shape_hash": self.shape_hash, "forwards": self.forwards, "barriers": self.barriers,
                "swaps": self.swaps_done,
                "window_cold_share": None if last is None else last.window_cold_share,
                "prior": None if last is None else last.prior}

    def apply(self, swaps: Sequence[Swap], *, run: StepRunner = run_in_order) -> int:
        """Swap now, synchronously (an operator's swaps, a benchmark's reset): transfers in flight
        are dropped first (their copies waited for; their rows returned) and a plan not read yet is
        dropped, since both ranked a map that no longer holds. Returns the bytes over the host link."""
        with self._map_lock:
            if swaps:
                self._map_changed = True
                self.cancel_transfers()
            done = self._swap_now(swaps, run)
            self._refresh_hash()
        return sum(t.bytes_in + t.bytes_out for t in done)

    def cancel_transfers(self) -> int:
        """Drop every transfer not flipped yet and the plan not read yet (waits for issued copies:
        their rows may be reused at once). Returns the transfers dropped."""
        dropped = len(self._transfers)
        if dropped or self._queue or self._plan_at is not None:
            self.discarded_plans += 1
        self.copies.drain()
        for t in reversed(self._transfers):
            self._slots[t.swap.layer].release(t)
        self._transfers = []
        self._issuing.clear()
        self._queue = []
        self._plan_at = None
        self._credit = 0.0
        return dropped

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        self._in_barrier = True
        try:
            yield
        finally:
            self._in_barrier = False


def spare_rows_needed(config: AdaptiveConfig, hot: int) -> tuple[int, int]:
    """(spare HBM rows, extra host rows) per layer for ``config`` with ``hot`` hot experts:
    ``spare_rows`` of each, or on the host a copy of every hot expert when ``host_copies`` is
    ``all``; none when the policy never swaps."""
    if config.swaps_per_layer == 0:
        return 0, 0
    spare = int(config.spare_rows)
    return spare, (hot if config.host_copies == "all" else spare)
