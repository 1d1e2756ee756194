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
6. **apply**: each accepted pair goes through ``core.swap`` (staging copies, then the map flip),
   layer by layer; nothing is allocated per swap (one staging buffer per distinct row layout).

Every step is one batched tensor op over all layers (``[L, E]``), never a loop over layers: the
device part is a fixed ~55 small kernels whatever the layer count (``tests/runtime/
test_adaptive_plan.py`` checks the batched ranking against a per-layer reference, ties included).

**Lookahead** (``AdaptivePolicy.lookahead``, on by default on a CUDA device): barrier ``k`` applies
the plan barrier ``k - 1`` computed, then enqueues the device part for plan ``k`` and its copy into
pinned host memory without waiting for it; the host never waits for the device at a barrier that
has nothing to swap, so the barrier costs the step only the device part's stream time. The plans
are the same as without lookahead — plan ``k`` ranks the same decayed counts against the same map
(the one after plan ``k - 1``'s swaps), because routing does not depend on the map — each applied
one interval later; a report carries the swaps it applied and the window of the plan that chose
them (cold picks under the map that served that window). ``tests/runtime/test_adaptive_policy.py``
checks both modes on the same traffic.

Bank shapes never change, so ``shape_hash`` is constant (checked) and captured graphs stay valid;
the live map's ``content_hash`` changes and is reported in every ``BarrierReport``.

The hysteresis is what stops thrash: under traffic that alternates between two classes faster
than the decay forgets, a cold expert and the hot one it would displace keep scores within a
factor ``1 + margin`` of each other and nothing moves (``tests/runtime/test_adaptive_plan.py``).

``plan_swaps`` is pure (scores + hot mask in, ``Swap`` list out) so the policy is unit-testable
without banks; ``AdaptivePolicy`` binds it to a counter and the resident layers. ``tick()`` is
the only call on the step path: host arithmetic on a Python int, no device op. ``live_rowmap()``
and ``status()`` serve other threads (dumps, status requests) under the policy's map lock, which
a barrier holds while it swaps. docs/adaptive.md has the parameters, figures and the vLLM hook.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from .adaptive_config import AdaptiveConfig
from .banks import ResidentLayer
from .counter import ExpertCounter
from .rehome import current_rowmap
from .swap import StagingBuffer, SwapStep, swap_steps


class Swap(NamedTuple):
    """One accepted exchange: ``promote`` (cold now) becomes hot, ``demote`` (hot now) goes cold."""

    layer: int
    promote: int
    demote: int


def decay_scores(scores: torch.Tensor, window: torch.Tensor, decay: float) -> torch.Tensor:
    """``decay * scores + window`` in the scores' dtype (in place on ``scores``; returned)."""
    return scores.mul_(float(decay)).add_(window.to(scores.dtype))


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
    """The one correct order: ``swap_steps`` lists the copies first and the map flip last."""
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
    window_picks: int
    """Picks counted in the window this barrier ranked (all layers); with lookahead, the window
    of the plan this barrier applied (0 at the first barrier: no plan yet)."""
    window_cold_picks: int
    """Of those, picks of experts that were cold during the window (the map that served it)."""
    host_link_bytes: int
    """Expert bytes this barrier's swaps moved over the host link (one row in, one row out each)."""
    content_hash: str
    """The live map's ``content_hash`` after the swaps."""
    shape_hash: str
    prior: str | None = None
    """The class profile (or ``"mixture"``) the window fitted best, when priors are in use;
    ``"observed"`` when the counts so far fitted it better than every profile (traffic of a class
    without a profile: the ranking then uses the counts alone)."""

    @property
    def window_cold_share(self) -> float | None:
        return self.window_cold_picks / self.window_picks if self.window_picks else None


@dataclass
class AdaptivePolicy:
    """The policy bound to a counter and the resident layers it may swap.

    ``layers`` must hold exactly the counter's MoE layers. Construct after re-homing; call
    ``tick()`` after every forward and ``barrier()`` when it returns True, with no forward in flight
    (on a GPU: after the step's outputs were consumed; the plan's read-back then drains the stream).
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
    ~55 small kernels, launch-bound) in a CUDA graph at the second barrier and replay it after;
    the plan's read-back and the swaps stay eager. Falls back to eager calls if capture fails."""
    lookahead: bool | None = None
    """Apply at each barrier the plan the previous barrier computed, and compute the next one
    without waiting for it (module docstring). ``None``: on when the counter is on a CUDA device
    (where the host would otherwise wait for the stream at every barrier), off on the CPU, where
    device ops run synchronously and there is nothing to hide."""

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
        counts = self.counter.counts
        self._seen = counts.detach().clone()
        self.scores = torch.zeros(counts.shape, dtype=torch.float64, device=counts.device)
        self._staging: dict[tuple, StagingBuffer] = {}
        self._expert_bytes = {i: _expert_bytes(self.layers[i]) for i in order}
        live = current_rowmap(self.layers)
        self.initial_content_hash = live.content_hash()
        self._live_content_hash = self.initial_content_hash
        self._live_dirty = False   # swaps applied since the hash was computed
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
        # lookahead: the map that served the current window (the map at the last plan's ranking)
        self._served_hot = self.hot_mask().clone()
        width = min(int(self.config.swaps_per_layer), self.counter.num_experts)
        size = 3 * len(self._order) * width + 3
        pinned = counts.is_cuda
        self._host_plan = torch.zeros(size, dtype=torch.int64, pin_memory=pinned)
        self._plan_ready = torch.cuda.Event() if pinned else None
        self._pending = False          # a plan waits in _host_plan for the next barrier
        self._map_changed = False      # apply() ran outside a barrier since the last plan
        self.discarded_plans = 0
        """Pending plans dropped because the map changed outside a barrier before they applied."""

    # -- the step path -------------------------------------------------------------------------
    def tick(self) -> bool:
        """Count one finished forward; True when a barrier is due. Host-only (no device op)."""
        if self._in_barrier:
            raise RuntimeError("adaptive residency: a forward ran inside a swap barrier "
                               "(between a swap's first copy and its map flip)")
        self.forwards += 1
        return self.forwards % self.config.interval == 0

    @property
    def in_barrier(self) -> bool:
        """True from a barrier's first device op to its last map flip: an engine's forward entry
        checks it (host-side proof that no forward runs between a swap's copies and its flip)."""
        return self._in_barrier

    # -- the barrier ---------------------------------------------------------------------------
    def staging_bytes(self) -> int:
        """Bytes of the staging buffers (one per distinct row layout among the layers)."""
        for index in self._order:
            self._staging_for(self.layers[index])
        return sum(t.numel() * t.element_size() for s in self._staging.values() for t in s.rows.values())

    def hot_mask(self) -> torch.Tensor:
        """``bool [L, E]`` from the device row maps (no host mirror, no sync)."""
        codes = torch.stack([self.layers[i].row_codes.to(self.scores.device) for i in self._order])
        return codes >= 0

    @property
    def lookahead_on(self) -> bool:
        """Whether this policy applies each plan one barrier after computing it."""
        return self._lookahead

    def barrier(self, *, run: StepRunner = run_in_order) -> BarrierReport:
        """Decay, rank, swap. The caller guarantees no forward is in flight; ``run`` executes each
        swap's ordered steps (tests inject a mis-ordered runner to show the check catches it).
        With lookahead: swap by the previous barrier's plan, then start the next plan."""
        with self._guard():
            if self._lookahead:
                swaps, picks_host = self._take_pending()
            else:
                packed = self._plan_on_device().to("cpu")   # the barrier's one read-back
                swaps, picks_host = self._parse(packed)
            with self._map_lock:
                moved = self._apply(swaps, run)
                if self._lookahead:
                    self._start_plan()
                if self._live_dirty:
                    # host-side hashing of the whole map costs milliseconds: only when it changed
                    self._live_dirty = False
                    live = current_rowmap(self.layers)
                    if live.shape_hash() != self.shape_hash:  # swaps exchange rows: shapes cannot change
                        raise RuntimeError("adaptive residency: bank shapes changed during a barrier")
                    self._live_content_hash = live.content_hash()
        self.barriers += 1
        chosen = int(picks_host[2])
        prior = None if chosen < 0 else (self._prior_names + ["observed"])[chosen]
        report = BarrierReport(self.barriers, self.forwards, swaps, int(picks_host[0]), int(picks_host[1]),
                               moved, self._live_content_hash, self.shape_hash, prior)
        self.reports.append(report)
        del self.reports[:-self.keep_reports]
        return report

    def _parse(self, packed: torch.Tensor) -> tuple[list[Swap], list[int]]:
        """The accepted swaps and ``[window picks, window cold picks, prior choice]`` from a read-back
        plan (host tensor): vectorised, no Python loop over layers and columns."""
        width = min(int(self.config.swaps_per_layer), self.counter.num_experts)
        n = len(self._order) * width
        flat = packed.numpy()
        promote, demote, accept = (flat[k * n:(k + 1) * n].reshape(len(self._order), width) for k in range(3))
        rows, cols = np.nonzero(accept)                 # row-major: layer order, strongest pair first
        layers = np.asarray(self._order, dtype=np.int64)[rows]
        swaps = [Swap(int(l), int(p), int(d)) for l, p, d in
                 zip(layers.tolist(), promote[rows, cols].tolist(), demote[rows, cols].tolist())]
        return swaps, flat[3 * n:].tolist()

    def _take_pending(self) -> tuple[list[Swap], list[int]]:
        """Lookahead: the plan the previous barrier started (its copy finished long ago: a whole
        interval of forwards ran after it on the same stream), or nothing at the first barrier or
        after the map changed outside a barrier (the plan ranked a map that no longer holds)."""
        if not self._pending or self._map_changed:
            if self._pending:
                self.discarded_plans += 1
            if self._map_changed:
                self._served_hot.copy_(self.hot_mask())
            self._pending = self._map_changed = False
            return [], [0, 0, -1]
        if self._plan_ready is not None:
            self._plan_ready.synchronize()
        self._pending = False
        return self._parse(self._host_plan)

    def _start_plan(self) -> None:
        """Lookahead: enqueue the device part and its copy into pinned host memory; no wait."""
        out = self._plan_on_device()
        self._host_plan.copy_(out, non_blocking=self._plan_ready is not None)
        if self._plan_ready is not None:
            self._plan_ready.record()
        self._pending = True

    def _plan_on_device(self) -> torch.Tensor:
        """The device part of a barrier, as one int64 vector ``[promote, demote, accept]`` (each
        ``[L, S]``, flattened) + ``[window picks, window cold picks, prior choice]``: eager calls,
        or from the second barrier on a CUDA device the replay of their captured graph (the first
        barrier runs them eagerly: it settles the prior-choice buffer and warms the kernels)."""
        if self._graph is not None:
            self._graph.replay()
            return self._graph_out
        use_priors = self._priors is not None and self.config.prior_weight > 0
        capture = (self.graph_decide and self.counter.counts.is_cuda and self.graph_state == "eager"
                   and self.barriers >= 1 and (self._prior_choice is not None or not use_priors))
        if capture:
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = self._decide()
                self._graph, self._graph_out, self.graph_state = graph, out, "captured"
                graph.replay()   # capture ran nothing: this barrier's decision
                return out
            except Exception as exc:  # keep serving: the eager calls compute the same plan
                self.graph_state = f"eager (capture failed: {type(exc).__name__}: {exc})"[:200]
                self._graph = self._graph_out = None
        return self._decide()

    def _decide(self) -> torch.Tensor:
        """Window, decay, prior choice, ranking: device ops only (no host-made tensor, no
        read-back), writing the policy's persistent buffers in place, so they can be captured."""
        counts = self.counter.counts
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
            total = window.sum()
            fresh = choose_prior(window, torch.cat([self._log_priors, observed_log.unsqueeze(0)]))
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
        # ranked (this plan's predecessor was applied since, at this barrier)
        served = self._served_hot if self._lookahead else hot
        picks = torch.stack([window.sum(), (window * (~served).to(window.dtype)).sum(),
                             choice.to(window.dtype)])
        if self._lookahead:
            self._served_hot.copy_(hot)
        promote, demote, accept = rank_swaps(ranked, hot, self.config.swaps_per_layer,
                                             self.config.margin, guard)
        plan = torch.stack([promote, demote, accept.to(promote.dtype)])
        return torch.cat([plan.reshape(-1), picks.to(plan.dtype)])

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
        """Run ``swaps`` through ``core.swap`` (copies before each map flip); bytes over the host link.
        Outside a barrier (an operator's swaps, a benchmark's reset) a pending lookahead plan is then
        dropped at the next barrier: it ranked a map that no longer holds."""
        if swaps:
            self._map_changed = True
        return self._apply(swaps, run)

    def _apply(self, swaps: Sequence[Swap], run: StepRunner) -> int:
        moved = 0
        for swap in swaps:
            layer = self.layers[swap.layer]
            run(swap_steps(layer, swap.demote, swap.promote, self._staging_for(layer)))
            moved += 2 * self._expert_bytes[swap.layer]
            self.swaps_done += 1
            self._live_dirty = True
        return moved

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        self._in_barrier = True
        try:
            yield
        finally:
            self._in_barrier = False

    def _staging_for(self, layer: ResidentLayer) -> StagingBuffer:
        key = tuple((name, tuple(t.shape[1:]), t.dtype, str(t.device)) for name, t in layer.hot.tensors.items())
        staging = self._staging.get(key)
        if staging is None:
            staging = self._staging[key] = StagingBuffer.for_layer(layer)
        return staging


def _expert_bytes(layer: ResidentLayer) -> int:
    bank = layer.hot if layer.hot.num_rows else layer.cold
    return sum(t[0].numel() * t.element_size() for t in bank.tensors.values()) if bank.num_rows else 0
