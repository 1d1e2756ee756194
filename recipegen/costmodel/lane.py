"""The cost model applied to a recipe's lane: fetch tax per class, prefetch price, k checks, sweeps.

Budgets (hot/cold bytes, KV pool and tokens, host headroom) come from `recipegen.ledger`;
cold shares from `recipegen.rowmap` (row map + histogram); this module only feeds them to the
pure fetch, unique-experts and prefetch functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipegen.common.errors import InputError
from recipegen.common.units import format_count
from recipegen.costmodel.fetch import FetchTax, fetch_tax
from recipegen.costmodel.kschedule import KScheduleCheck, check_k_schedule
from recipegen.costmodel.parallel import ONE_LINK_PER_GPU, fullest_rank, gpu_reads, lane_ep_shares
from recipegen.costmodel.reference import REFERENCE_MACHINE, REFERENCE_MODEL
from recipegen.costmodel.steps import lane_split, measured_step
from recipegen.costmodel.unique_experts import UniqueExpertsModel, calibrated_model


def unique_model_for(model: Any) -> UniqueExpertsModel:
    """The unique-experts model from the catalog model's measured points; for a model that declares
    none, the field reports' one-stream effective tokens and independent streams (D = 1): their
    cross-stream diversity was calibrated on the 384-expert reference and says nothing of another router."""
    points = [(u.streams, u.k, u.experts_per_layer) for u in getattr(model, "unique_experts", [])]
    if any(s == 1 and (k or 0) > 0 for s, k, _ in points):
        return calibrated_model(model.routed_experts, model.top_k, points)
    return dataclasses.replace(calibrated_model(model.routed_experts, model.top_k), diversity=1.0)


@dataclass(frozen=True)
class ColdShare:
    """A class's cold share of routed picks, with where it came from."""

    overall: float
    per_layer: tuple[float, ...] | None
    basis: str
    synthetic: bool = False
    per_rank: tuple[tuple[float, ...], ...] | None = None
    """EP lanes: per rank, per layer, the share of picks on that rank's cold experts."""
    layer_picks: tuple[float, ...] | None = None
    """Per MoE layer, the class histogram's picks (the weights of `overall`); None: layers weigh alike."""

    def over_layers(self, rows: Sequence[int]) -> float:
        """The share over some MoE layers (rows of `per_layer`), weighted as `overall` is."""
        assert self.per_layer is not None and rows
        weights = [self.layer_picks[i] if self.layer_picks is not None else 1.0 for i in rows]
        total = sum(weights)
        return sum(w * self.per_layer[i] for w, i in zip(weights, rows)) / total if total else 0.0


@dataclass(frozen=True)
class FetchPoint:
    streams: int
    k: int
    unique_per_layer: float
    tax: FetchTax
    step_source: str | None

    def to_json(self) -> dict[str, Any]:
        return {"streams": self.streams, "k": self.k, "unique_experts_per_layer": self.unique_per_layer,
                "cold_bytes_per_step": self.tax.cold_bytes.value, "fetch_ms": self.tax.fetch_ms,
                "share_of_step": self.tax.share, "step_source": self.step_source,
                "hot_read_ms": None if self.tax.hot_read_time is None else self.tax.hot_read_time.value * 1e3}


@dataclass(frozen=True)
class ClassFetch:
    traffic_class: str
    active: bool
    cold_share: ColdShare | None
    points: tuple[FetchPoint, ...]
    missing: str | None = None     # why there is no projection
    # This class's traffic served by the *active* class's map (before a swap), for other classes.
    under_active: ColdShare | None = None
    under_active_points: tuple[FetchPoint, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"class": self.traffic_class, "active": self.active,
                "cold_share": _share_json(self.cold_share),
                "points": [p.to_json() for p in self.points], "missing": self.missing,
                "under_active_map": None if self.under_active is None else {
                    "cold_share": _share_json(self.under_active),
                    "points": [p.to_json() for p in self.under_active_points]}}


def _share_json(share: ColdShare | None) -> dict[str, Any] | None:
    if share is None:
        return None
    return {"overall": share.overall, "basis": share.basis, "synthetic": share.synthetic}


def _points_text(points: Sequence[FetchPoint]) -> str:
    parts = []
    for p in points:
        share = ""
        if p.tax.share is not None and p.tax.share_of_step is not None:
            step_ms = p.tax.share_of_step.operands[1].value
            share = f" = {p.tax.share:.1%} of the measured {step_ms:g} ms step"
        hot = "" if p.tax.hot_read_time is None else f" (hot experts from HBM: {p.tax.hot_read_time.value * 1e3:.2f} ms)"
        parts.append(f"C{p.streams} k={p.k}: {p.tax.fetch_ms:.2f} ms{share}{hot}")
    return "; ".join(parts)


def _positional_text(share: ColdShare, classes: Sequence[str]) -> str:
    """A positional lane's cold share in words: which layers sit in host memory and what share of
    every class's picks that makes (the same for every class: the router plays no part)."""
    per = share.per_layer or ()
    whole = sum(1 for x in per if x >= 1)
    partial = sum(1 for x in per if 0 < x < 1)
    where = (f"the experts of {whole} of {len(per)} MoE layers" if per else "experts")
    if partial:
        where += f" (and part of {partial} more)"
    who = "every traffic class" if len(classes) > 1 or (classes and classes[0] != "(all traffic)") else "all traffic"
    return (f"{where} sit in host memory (vLLM's --cpu-offload-gb walk takes whole layers in load order; "
            f"the router's choices play no part), so {who} reads {share.overall:.2%} of its routed picks over "
            "the link")


@dataclass
class LaneFetchSummary:
    """What `check budgets` shows per lane and class: projected fetch time and share of step."""

    lane: str
    placement: str
    link_bandwidth: float
    classes: list[ClassFetch]
    k_check: KScheduleCheck | None
    notes: list[str] = field(default_factory=list)
    per_gpu: str = ""
    """How a lane of several GPUs reads (`costmodel.parallel.GpuReads.header`); "" for one GPU."""
    label: str = ""
    """The placement as people read it (`ledger.result.placement_label`: "all in HBM" where nothing is cold)."""

    def to_json(self) -> dict[str, Any]:
        return {"lane": self.lane, "placement": self.placement, "placement_label": self.label or self.placement,
                "link_bandwidth_bytes_per_s": self.link_bandwidth,
                "per_gpu": self.per_gpu or None,
                "classes": [c.to_json() for c in self.classes],
                "k_schedule": None if self.k_check is None else {
                    "ok": self.k_check.ok, "boundaries": self.k_check.boundaries,
                    "findings": [{"level": f.level, "message": f.message, "field": f.field}
                                 for f in self.k_check.findings]},
                "notes": self.notes}

    def lines(self) -> list[str]:
        """Plain-text rows for `check budgets`."""
        out = [f"fetch tax (cold expert reads over the {self.link_bandwidth / 1e9:g} GB/s host link, "
               f"per decode step; {self.label or self.placement}):"]
        if self.per_gpu:
            out.append(f"  {self.per_gpu}; {ONE_LINK_PER_GPU}")
        if self.placement == "positional" and self.classes and self.classes[0].cold_share is not None:
            out.append("  " + _positional_text(self.classes[0].cold_share, [c.traffic_class for c in self.classes])
                       + "; " + _points_text(self.classes[0].points))
        for c in self.classes if self.placement != "positional" else ():
            tag = " (active)" if c.active else ""
            if c.missing:
                out.append(f"  {c.traffic_class}{tag}: {c.missing}")
                continue
            assert c.cold_share is not None
            synthetic = ", synthetic histogram" if c.cold_share.synthetic else ""
            mapped = "the active map" if c.active else "its own map (after a swap)"
            out.append(f"  {c.traffic_class}{tag} on {mapped}: cold share {c.cold_share.overall:.2%}{synthetic}; "
                       + _points_text(c.points))
            if c.under_active is not None:
                synthetic = ", synthetic histogram" if c.under_active.synthetic else ""
                out.append(f"  {c.traffic_class} traffic on the active map (before a swap): cold share "
                           f"{c.under_active.overall:.2%}{synthetic}; " + _points_text(c.under_active_points))
        if self.k_check is not None:
            for f in self.k_check.findings:
                if f.level != "note":
                    out.append(f"  speculative {f.level}: {f.message}")
        out += [f"  note: {n}" for n in self.notes]
        return out


def _k_at(lane: Any, streams: int) -> int:
    return 0 if lane.speculative is None else lane.speculative.k_at(streams)


def lane_cold_shares(loaded: Any, lane: Any, ledger_lane: Any, *, map_class: str | None = None
                     ) -> dict[str, ColdShare | str]:
    """Per class: its cold share (a row map on the class's histogram), or why none can be projected.

    The row map is the class's own, or `map_class`'s (e.g. the active class: its traffic before a swap).
    """
    from recipegen.rowmap import cold_share_per_layer
    from recipegen.rowmap.coldshare import check_same_geometry

    model = loaded.recipe.model
    out: dict[str, ColdShare | str] = {}
    if lane.offload.placement == "positional":
        cold = ledger_lane.active.cold_per_layer
        per_layer = tuple(c / model.routed_experts for c in cold)
        # The field's measurement is of the reference model on the reference machine only: printed
        # beside another lane's modelled share it would read as that lane's.
        machine = loaded.recipe.machines.get(lane.machine)
        measured = ("; the field reports measured ~23% / 24% of picks on the positional --cpu-offload-gb 60 lane"
                    if model.name == REFERENCE_MODEL and getattr(machine, "name", None) == REFERENCE_MACHINE else "")
        share = ColdShare(sum(per_layer) / len(per_layer), per_layer,
                          "positional: whole layers' experts offloaded, usage-blind (cold experts per layer ÷ "
                          f"{model.routed_experts}){measured}")
        return {name: share for name in (lane.classes or {"(all traffic)": None})}
    for name, cls in lane.classes.items():
        map_name = map_class or name
        rowmap = loaded.rowmaps.get((lane.name, map_name))
        if rowmap is None:
            out[name] = f"no row map read for class {map_name}"
            continue
        if not cls.histogram:
            out[name] = "no histogram declared for this class: cold share unknown (declare `histogram:`)"
            continue
        histogram = _load_histogram(Path(loaded.path).parent / cls.histogram)
        map_file = lane.classes[map_name].rowmap
        check_same_geometry(rowmap, histogram, map_name=map_file, hist_name=cls.histogram)
        per_layer = tuple(float(x) for x in cold_share_per_layer(rowmap, histogram))
        total = float(histogram.counts.sum())
        overall = float((histogram.counts.sum(axis=1) * per_layer).sum() / total) if total else 0.0
        per_rank = lane_ep_shares(model, lane, rowmap, histogram)
        out[name] = ColdShare(overall, per_layer, f"row map {map_file} on histogram {cls.histogram}",
                              bool(getattr(histogram, "meta", {}).get("synthetic")),
                              None if per_rank is None else tuple(per_rank),
                              tuple(float(x) for x in histogram.counts.sum(axis=1)))
    return out


def _load_histogram(path: Path) -> Any:
    from expert_residency.formats import FormatError, load_histogram

    from recipegen.rowmap.inputs import input_error
    try:
        return load_histogram(path)
    except FileNotFoundError:
        raise InputError("histogram file not found", file=str(path)) from None
    except FormatError as exc:
        raise input_error(exc) from None


def fetch_points(loaded: Any, lane: Any, share: ColdShare, streams: Sequence[int],
                 unique: UniqueExpertsModel, *, as_measured: bool = True) -> tuple[FetchPoint, ...]:
    """`as_measured`: this is the traffic and map the lane runs (its active class on its own map; any
    class of a positional lane, whose cold experts no map chooses), so a step measured for the lane
    is this case's step; another class's traffic, or a map after a swap, has a step never measured."""
    model = loaded.recipe.model
    machine = loaded.recipe.machines[lane.machine]
    reads = gpu_reads(model, lane)
    cold: float | Sequence[float] = share.per_layer if share.per_layer is not None else share.overall
    basis = share.basis
    hbm: float | None = machine.gpus.hbm_bandwidth
    if reads.mode == "tp":
        basis += f"; per GPU: each rank's 1/{reads.gpus} shard of every cold pick"
    elif reads.mode == "ep":
        hbm = None  # a rank's hot reads depend on its own experts' picks: not projected
        if share.per_rank is not None:
            rank, cold = fullest_rank(share.per_rank)
            basis += f"; per GPU: EP rank {rank}'s cold experts (the largest cold share of {reads.gpus} ranks)"
        else:
            cold = ([c / reads.gpus for c in share.per_layer] if share.per_layer is not None
                    else share.overall / reads.gpus)
            basis += f"; per GPU: assumed split evenly over {reads.gpus} EP ranks (no per-expert histogram)"
    measured_here = as_measured and _as_catalogued(machine)   # once: a catalog look-up and a validation
    points = []
    for s in streams:
        k = _k_at(lane, s)
        u = unique.unique(k, s)
        step = (measured_step(model.name, machine.name, lane.offload.placement, lane_split(lane.offload), s, k)
                if measured_here else None)
        tax = fetch_tax(moe_layers=model.num_moe_layers, unique_per_layer=u, cold_share=cold,
                        bytes_per_expert=reads.bytes_per_expert, link_bandwidth=machine.pinned_read_bandwidth,
                        step_time=step.seconds if step else None, cold_share_source=basis,
                        unique_source=f"unique-experts model at {format_count(s, 'stream')}, k={k}",
                        bandwidth_source=machine.sources.get("pinned_read_bandwidth", ""),
                        step_source=step.source if step else "", hbm_bandwidth=hbm)
        points.append(FetchPoint(s, k, u, tax, step.source if step else None))
    return tuple(points)


def _as_catalogued(machine: Any) -> bool:
    """Whether the lane's machine has its catalog entry's rates and GPUs (a measured step belongs to
    the machine it was measured on: one that overrides the link or the GPUs is another machine)."""
    from recipegen.catalog import catalog_entry
    from recipegen.schema import Machine

    try:
        catalogued = Machine.model_validate(catalog_entry("machines", machine.name))
    except Exception:  # noqa: BLE001 - not a catalog machine: no measured step is keyed to it anyway
        return False
    return (catalogued.pinned_read_bandwidth, catalogued.gpus.hbm_bandwidth, catalogued.gpus.kind,
            catalogued.gpus.count) == (machine.pinned_read_bandwidth, machine.gpus.hbm_bandwidth,
                                       machine.gpus.kind, machine.gpus.count)


def fetch_summary(loaded: Any, lane_name: str, *, streams: Sequence[int] | None = None,
                  ledger: Any = None) -> LaneFetchSummary:
    """Projected fetch time (and share of a measured step) per class of one lane.

    `streams`: the concurrencies to project (default: the lane's expected min and max).
    `ledger`: a `RecipeLedger` already computed for `loaded` (computed here otherwise).
    """
    from recipegen.ledger import compute_ledger
    from recipegen.ledger.result import placement_label

    recipe = loaded.recipe
    lane = recipe.lane(lane_name)
    ledger = ledger or compute_ledger(loaded)
    ledger_lane = ledger.lane(lane_name)
    label = placement_label(ledger_lane)
    machine = recipe.machines[lane.machine]
    points = sorted({lane.concurrency.min, lane.concurrency.max}) if streams is None else list(streams)
    unique = unique_model_for(recipe.model)
    if sum(ledger_lane.active.cold_per_layer) == 0:
        return LaneFetchSummary(lane.name, lane.offload.placement, machine.pinned_read_bandwidth, [],
                                lane_k_check(lane), ["every routed expert is in HBM: no cold reads, fetch tax 0"],
                                label=label)
    classes = []
    under_active: dict[str, ColdShare | str] = {}
    if lane.offload.placement != "positional" and lane.active_class is not None:
        under_active = lane_cold_shares(loaded, lane, ledger_lane, map_class=lane.active_class)
    for name, share in lane_cold_shares(loaded, lane, ledger_lane).items():
        active = name == lane.active_class or lane.offload.placement == "positional"
        if isinstance(share, str):
            classes.append(ClassFetch(name, active, None, (), missing=share))
            continue
        other = under_active.get(name)
        other_share = other if isinstance(other, ColdShare) and not active else None
        classes.append(ClassFetch(
            name, active, share, fetch_points(loaded, lane, share, points, unique, as_measured=active),
            under_active=other_share,
            under_active_points=fetch_points(loaded, lane, other_share, points, unique, as_measured=False)
            if other_share else ()))
    notes = ["C<n> k=<k>: n concurrent streams, k speculative (draft) tokens per step, k=0 without "
             "speculation (docs/design.md, 'Shorthand in the output')",
             "fetch = MoE layers × unique experts per layer (calibrated model) × cold share × bytes per "
             "expert ÷ link bandwidth; no overlap with compute (an upper bound); share of step only where "
             "a step time was measured (docs/costmodel.md); hot experts from HBM at the full HBM read rate "
             "(a floor: the decode estimate's hot and cold terms use the kernels' measured efficiency and "
             "its own unique-expert count, so they differ)"]
    if unique.diversity != 1.0 and max(points) > 1:
        notes.append(f"unique experts at >1 stream use the cross-stream diversity D={unique.diversity:.2f} "
                     "calibrated to ~300 of 384 at sixteen streams, which overstates bytes under skewed "
                     "routing (docs/costmodel.md, 'Unique experts per layer per step')")
    elif max(points) > 1:
        notes.append("unique experts at >1 stream: streams taken as independent (no concurrent routing was "
                     f"measured for {recipe.model.name}; recipegen plan's decode estimate counts them under the histogram)")
    if not classes:
        notes.insert(0, "the lane declares no traffic class with a row map and histogram: cold share unknown, "
                        "no fetch projection")
    return LaneFetchSummary(lane.name, lane.offload.placement, machine.pinned_read_bandwidth, classes,
                            lane_k_check(lane), notes,
                            gpu_reads(recipe.model, lane).header(machine.pinned_read_bandwidth / 1e9), label)


def lane_k_check(lane: Any) -> KScheduleCheck | None:
    spec = lane.speculative
    if spec is None:
        return None
    schedule: Any = spec.schedule if spec.schedule is not None else spec.k
    return check_k_schedule(schedule, max_num_seqs=lane.concurrency.max, num_speculative_tokens=spec.k,
                            expected_concurrency=(lane.concurrency.min, lane.concurrency.max))
