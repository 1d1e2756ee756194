"""The decode-speed estimate of a recipe's lane: tokens/s per concurrency, both placements, the band.

This is the one entry point other commands call (``plan``, ``check budgets``; ``fit`` and
``compare``): ``estimate_lane(loaded, lane_name, ...) -> LaneEstimate``. It reads the lane's
budgets from ``recipegen.ledger`` (hot and cold experts per layer, both placements), the traffic
class's histogram and row map (which experts are cold, how picks spread), the model and machine
catalogs, and hands them to the pure formula in ``recipegen.costmodel.estimate``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recipegen.common.errors import InputError
from recipegen.common.units import GiB, format_tokens
from recipegen.costmodel.efficiency import expert_efficiency
from recipegen.costmodel.estimate import (
    FUSED_SHORTER_SHARE,
    GEMMS,
    SMALL,
    AttentionGroup,
    MoeLayer,
    OperatingPoint,
    StateGroup,
    StepModel,
    StepTerms,
    acceptance_from_mean_length,
    default_skew,
    step_terms,
)
from recipegen.costmodel.reports import PIN_REPORT

# Tokens of KV cache each sequence holds while decoding, unless asked (--context): a short chat
# turn. At the lane's max_model_len the attention term grows with it (recipegen plan --context).
DEFAULT_CONTEXT = 4096

# Acceptance α of a draft token when the recipe declares none: the reference lane's DSpark
# drafter, from 88.74 tok/s × ~24 ms = 2.13 tokens per step at k = 5 and one stream (v14, the
# field report "vLLM: Pin Hot Experts", 2026-09-17): (1 − α⁶)/(1 − α) = 2.13 gives α = 0.5425.
DEFAULT_ACCEPTANCE = 0.5425
DEFAULT_ACCEPTANCE_SOURCE = (f"the reference lane's DSpark acceptance: 88.74 tok/s x ~24 ms = 2.13 tokens per "
                             f"step at k=5, one stream, on the positional --cpu-offload-gb 60 lane of {PIN_REPORT}); pass "
                             "--acceptance for your drafter")

# What the validation found (docs/costmodel.md, "Decode speed: validation"): measured tok/s ÷
# estimated tok/s over every compared point, with today's tables (the MXFP4 rows of run ER). On the
# H200, whose kernels the estimate's efficiencies were measured on (bench/decode_sim.py at T = 1,
# 8, 32, four runs): 0.908 to 1.136 in run EB, 0.937 to 1.208 in run EC (its 1.208 is the
# usage-aware Qwen3-30B step at T = 32, whose hot and cold reads overlap more than
# FUSED_SHORTER_SHARE assumes), 0.905 to 1.189 in run ED, 0.880 to 1.188 in run EE (the grouped
# warp-MMA MXFP4 kernels; its 0.880 is gpt-oss-120b at T = 1); gpt-oss's steps of 8 tokens in runs
# EB-ED and of 32 in all four ran kernels no longer the default there and are left out. On the GB300 (another GPU and kernel;
# the field reports), whose estimate borrows the H200's efficiencies: 0.839 / 0.870 at one stream
# (usage-aware / positional; 0.875 / 0.887 with the MXFP4 rows before run ER, which the GB300's own
# kernel has no reason to follow), and 1.34 to 1.57 at eight and sixteen streams (the estimate reads
# more expert bytes than those runs did).
BAND_MEASURED_GPU = (0.88, 1.21)
BAND_ONE_STREAM = (0.83, 1.21)
BAND_OTHER_GPU_STREAMS = (0.83, 1.58)
MEASURED_GPU_KINDS = ("H200",)        # GPU kinds the efficiency tables were measured on
MEASURED_MAX_TOKENS = 32              # largest tokens per step the H200 validation covered


def band_text(lo: float, hi: float) -> str:
    """A tokens/s band for people, rounded outwards (down at the low end, up at the high end) so the
    printed band always holds the computed one; one decimal below 100 tok/s."""
    step = 0.1 if hi < 100 else 1.0
    low, high = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
    return f"{low:,.1f}–{high:,.1f}" if step < 1 else f"{low:,.0f}–{high:,.0f}"


def tp_caveat(tensor_parallel_size: int) -> str:
    """What a tensor-parallel lane's figure leaves out, "" on one GPU: the step adds no all-reduce, and
    every validation point behind the band is a one-GPU lane (docs/costmodel.md 'Validation')."""
    if tensor_parallel_size <= 1:
        return ""
    return (f"the all-reduces between the {tensor_parallel_size} GPUs are not counted and the band was "
            "measured on one-GPU lanes")


def validation_band_text(lo: float, hi: float, tensor_parallel_size: int = 1) -> str:
    """The band as a speed line prints it (the one wording); on a tensor-parallel lane it says, briefly, what
    `tp_caveat` says in full: short enough for a table row."""
    if tensor_parallel_size <= 1:
        return f"validation band {band_text(lo, hi)}"
    return (f"band {band_text(lo, hi)} validated on one-GPU lanes; all-reduces between the {tensor_parallel_size} "
            "GPUs not counted")


@dataclass(frozen=True)
class EstimatePoint:
    """One concurrency: the step, its terms, output tokens/s and the band around it."""

    streams: int
    k: int
    tokens_per_step: float            # output tokens per step, all streams
    terms: StepTerms
    band: tuple[float, float]         # multipliers of tokens_per_s the validation justifies

    @property
    def step_s(self) -> float:
        return self.terms.total

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.terms.total

    @property
    def tokens_per_s_band(self) -> tuple[float, float]:
        return self.tokens_per_s * self.band[0], self.tokens_per_s * self.band[1]

    def to_json(self) -> dict[str, Any]:
        lo, hi = self.tokens_per_s_band
        return {"streams": self.streams, "k": self.k, "tokens_per_step": self.tokens_per_step,
                "tokens_per_s": self.tokens_per_s, "tokens_per_s_band": [lo, hi],
                "terms": self.terms.to_json()}


@dataclass
class LaneEstimate:
    """The estimate of one lane at one placement (what ``fit`` and ``compare`` consume)."""

    lane: str
    placement: str                    # usage-aware | positional | all-in-hbm
    hot_per_layer: str                # e.g. "295" or "0–384"
    context: int
    points: list[EstimatePoint]
    acceptance: float | None
    acceptance_source: str | None
    expert_efficiency_source: str
    notes: list[str] = field(default_factory=list)
    label: str = ""                   # the placement as people read it ("all in HBM" where nothing is cold)
    tensor_parallel_size: int = 1     # >1: the figures leave the all-reduces out (tp_caveat)
    warnings: list[str] = field(default_factory=list)   # what `plan` prints as warnings, not notes
    hot_counts: tuple[int, ...] = ()  # hot experts of each MoE layer (positional: 0 or all, a part for one)
    routed_experts: int = 0           # routed experts per MoE layer

    def point(self, streams: int) -> EstimatePoint:
        for p in self.points:
            if p.streams == streams:
                return p
        raise KeyError(streams)

    @property
    def tokens_per_s(self) -> dict[int, float]:
        return {p.streams: p.tokens_per_s for p in self.points}

    @property
    def tensor_parallel_caveat(self) -> str | None:
        """What this estimate leaves out on a tensor-parallel lane (`tp_caveat`), None on one GPU: the
        one owner of the JSON field, so every command that prints an estimate says the same."""
        return tp_caveat(self.tensor_parallel_size) or None

    def band_text(self, point: EstimatePoint) -> str:
        """`point`'s validation band as a speed line prints it (`validation_band_text`): on a
        tensor-parallel lane, the short form of `tensor_parallel_caveat`."""
        return validation_band_text(*point.tokens_per_s_band, self.tensor_parallel_size)

    @property
    def hot_experts_per_layer(self) -> int | None:
        """The hot experts of every MoE layer where one count holds for all of them (usage-aware, all in
        HBM), None where it does not (a positional lane: whole layers are in host memory, the others
        in HBM; a usage-aware lane with per-layer counts). ``hot_per_layer`` is the same as text."""
        if not self.hot_counts or len(set(self.hot_counts)) != 1:
            return None
        if self.placement == "positional" and 0 < self.hot_counts[0] < self.routed_experts:
            return None
        return self.hot_counts[0]

    @property
    def host_layers(self) -> tuple[int, int, int] | None:
        """A positional estimate with experts in host memory: (MoE layers whose experts are all in host
        memory, layers with a part of them there, MoE layers); None otherwise."""
        if self.placement != "positional" or not self.hot_counts or not self.routed_experts:
            return None
        whole = sum(1 for h in self.hot_counts if h == 0)
        partial = sum(1 for h in self.hot_counts if 0 < h < self.routed_experts)
        if not whole and not partial:
            return None
        return whole, partial, len(self.hot_counts)

    @property
    def residency(self) -> str:
        """Where the routed experts sit, in words: "295 hot experts per layer", or for a positional
        lane the layers vLLM's --cpu-offload-gb walk put in host memory (the fetch tax's wording)."""
        layers = self.host_layers
        if layers is not None:
            whole, partial, total = layers
            more = f" (and part of {partial} more)" if partial else ""
            return f"whole MoE layers: the experts of {whole} of {total} MoE layers{more} in host memory"
        if self.placement == "positional" and not self.hot_counts:
            return "vLLM's --cpu-offload-gb: whole layers' experts in host memory"
        return f"{self.hot_per_layer} hot experts per layer"

    def to_json(self) -> dict[str, Any]:
        layers = self.host_layers
        return {"lane": self.lane, "placement": self.placement, "placement_label": self.label or self.placement,
                "hot_per_layer": self.hot_per_layer, "hot_experts_per_layer": self.hot_experts_per_layer,
                "residency": self.residency,
                "moe_layers_in_host_memory": None if layers is None else {
                    "whole": layers[0], "partial": layers[1], "moe_layers": layers[2]},
                "context": self.context, "acceptance": self.acceptance, "acceptance_source": self.acceptance_source,
                "expert_efficiency_source": self.expert_efficiency_source,
                "tokens_per_s": {str(p.streams): p.tokens_per_s for p in self.points},
                "tokens_per_s_band": {str(p.streams): list(p.tokens_per_s_band) for p in self.points},
                "points": [p.to_json() for p in self.points], "notes": self.notes, "warnings": self.warnings,
                "tensor_parallel_caveat": self.tensor_parallel_caveat}

    def lines(self) -> list[str]:
        caveat = self.tensor_parallel_caveat
        # on a tensor-parallel lane the bands below do not hold what they hold on one GPU: said where they are
        out = [f"{self.label or self.placement} ({self.residency}), {self.context:,} tokens of KV per sequence"
               + (f"; {caveat}:" if caveat else ":")]
        for p in self.points:
            lo, hi = p.tokens_per_s_band
            t = p.terms
            extra = (f" + state layers {t.state * 1e3:.2f}" if t.state else "") + (
                f" + weights in host memory {t.host_dense * 1e3:.2f}" if t.host_dense else "") + (
                f" + drafter {t.drafter * 1e3:.2f}" if t.drafter else "")
            out.append(f"  C{p.streams} k={p.k}: {p.tokens_per_s:,.1f} tok/s ({band_text(lo, hi)}); step "
                       f"{t.total * 1e3:.2f} ms = {experts_text(t)} "
                       f"+ dense {t.dense * 1e3:.2f} + attention {t.attention * 1e3:.2f}{extra} + small kernels "
                       f"{t.small_kernels * 1e3:.2f}; {t.unique_per_layer:.1f} unique experts per layer")
        return out


# The rule by which a usage-aware layer's hot and cold reads combine (estimate.moe_layer_seconds),
# in the words the step line and its note print.
OVERLAP_RULE = f"per layer the longer read + {FUSED_SHORTER_SHARE:g} × the shorter"


def experts_text(t: StepTerms) -> str:
    """The routed-experts term of a step for people: its hot and cold parts and how they combine —
    "+" only where they run one after the other (so the printed sum holds), else the overlap rule."""
    total, hot, cold = t.experts * 1e3, t.hot_experts * 1e3, t.cold_experts * 1e3
    if not t.cold_experts:
        return f"experts {total:.2f} (hot {hot:.2f})"
    if t.experts_overlapped:
        return f"experts {total:.2f} (hot {hot:.2f} and cold {cold:.2f} overlapped: {OVERLAP_RULE})"
    return f"experts {total:.2f} (hot {hot:.2f} + cold {cold:.2f})"


def _experts_note(points: Sequence[EstimatePoint], placement: str) -> str | None:
    """How the step line's hot and cold expert terms combine, for the note under it."""
    if any(p.terms.experts_overlapped for p in points):
        return ("experts: a layer's hot and cold experts are read in one launch and overlap: each MoE layer "
                f"takes its longer read + {FUSED_SHORTER_SHARE:g} × its shorter, averaged over how many cold experts "
                f"a step touches, so the experts term lies between the longer total + {FUSED_SHORTER_SHARE:g} × the "
                "shorter and hot + cold (docs/costmodel.md, 'hot + cold of one layer')")
    if any(p.terms.cold_experts for p in points):
        how = ("each touched expert's offloaded part over the host link, then the rest from HBM"
               if placement == "positional" else "one launch per bank on this GPU, compute capability 10.x")
        return f"experts: hot + cold, one after the other ({how})"
    return None


def _format(model: Any) -> str:
    return model.expert_format or "bf16"


def _shares(loaded: Any, lane: Any, traffic_class: str | None) -> tuple[np.ndarray, str, Any]:
    """Per MoE layer, each expert's share of picks: the class's histogram, else the default skew."""
    model = loaded.recipe.model
    cls = traffic_class or lane.active_class or next((n for n, c in (lane.classes or {}).items() if c.histogram),
                                                    None)
    if cls is not None and cls in (lane.classes or {}) and lane.classes[cls].histogram:
        from recipegen.costmodel.lane import _load_histogram
        hist_file = lane.classes[cls].histogram
        histogram = _load_histogram(Path(loaded.path).parent / hist_file)
        counts = np.asarray(histogram.counts, dtype=float)
        if counts.shape == (model.num_moe_layers, model.routed_experts) and (counts.sum(axis=1) > 0).all():
            synthetic = " (synthetic)" if getattr(histogram, "meta", {}).get("synthetic") else ""
            return counts / counts.sum(axis=1, keepdims=True), f"histogram {hist_file}{synthetic}", histogram
    skew = default_skew(model.routed_experts)
    return (np.tile(skew, (model.num_moe_layers, 1)),
            f"default skew (no histogram for the class): pick share ∝ exp(-4.94 (r/E)^1.01), r = an expert's "
            f"popularity rank (0 = the most picked), E = {model.routed_experts:,}, the layer's routed experts", None)


def _cold_masks(loaded: Any, lane: Any, shares: np.ndarray, hot: Sequence[int], traffic_class: str | None,
                use_rowmap: bool) -> list[np.ndarray]:
    """Per MoE layer, which experts are cold: the row map's, else the least-used under the shares."""
    model = loaded.recipe.model
    cls = traffic_class or lane.active_class
    rowmap = loaded.rowmaps.get((lane.name, cls)) if use_rowmap and cls else None
    if rowmap is not None:
        mask = np.asarray(rowmap.cold_mask() if callable(rowmap.cold_mask) else rowmap.cold_mask, dtype=bool)
        if mask.shape == shares.shape:
            return list(mask)
    masks = []
    for layer, h in zip(shares, hot):
        order = np.argsort(-layer, kind="stable")
        m = np.zeros(model.routed_experts, dtype=bool)
        m[order[int(h):]] = True
        masks.append(m)
    return masks


def _lane_attention(model: Any, machine: Any, lane: Any, notes: list[str]) -> list[tuple[Any, int]]:
    """Each attention group with the KV bytes per token per layer the lane caches: its
    `--kv-cache-dtype` (or vLLM's per-model default), the DeepSeek layouts where the GPU's backend
    stores them and the packed caches' layouts — the ledger's bytes (`ledger.kv.lane_attention`), so
    the pool and the read agree."""
    from recipegen.ledger.kv import kv_dtype, lane_attention

    dtype = kv_dtype(model, machine, lane, notes)
    own = sorted({g.kv_dtype for g in model.attention})
    if dtype is not None and own != [dtype]:
        notes.append(f"KV read at the lane's {dtype} cache (the model's own: {', '.join(own)})")
    return [(g, rate) for g, rate, _ in lane_attention(model, machine, lane, dtype, notes)]


def _attention_groups(model: Any, tp: int, cached: list[tuple[Any, int]] | None = None) -> tuple[AttentionGroup, ...]:
    """The estimate's attention groups: per group its layers, latent / KV bytes per token per layer
    (`cached`'s where given, else the model's dtype at `tp`), window or chunk, and the sparse
    indexer's top-k and key bytes."""
    if model.attention:
        out = []
        pairs = cached if cached is not None else [(g, g.bytes_per_token_per_layer(tp)) for g in model.attention]
        for g, rate in pairs:
            index = float(g.indexer_bytes_per_token())
            topk = getattr(g, "index_topk", None) if index else None
            out.append(AttentionGroup(len(g.layers), float(rate) - index,
                                      g.window if g.kind == "sliding" else g.chunk if g.kind == "chunked" else None,
                                      topk, index))
        return tuple(out)
    return (AttentionGroup(model.decoder_layers, model.kv_token_bytes / model.decoder_layers / tp),)


def _state_groups(model: Any, lane: Any, tp: int) -> tuple[StateGroup, ...]:
    """Per state group, the state one sequence keeps per layer on one GPU (the lane's cache dtypes;
    the convolution state holds k more columns with speculative decoding, as vLLM sizes it)."""
    from recipegen.ledger.kv_state import lane_state_groups

    spec = lane.speculative.k if lane.speculative is not None and lane.speculative.k else 0
    out = []
    for g in lane_state_groups(model, lane):
        total = g.bytes_per_sequence_per_layer(tp, spec)
        ssm = total - g.model_copy(update={"conv_kernel": 1}).bytes_per_sequence_per_layer(tp, 0)
        out.append(StateGroup(g.kind, len(g.layers), float(total - ssm), float(ssm)))
    return tuple(out)


def _launches(model: Any) -> tuple[int, int, str]:
    """(GEMM launches, small kernels, how) of the decoder layers, added up from each layer's blocks
    (``estimate.GEMMS`` / ``estimate.SMALL``). A model with layers that have neither attention nor
    state (Nemotron-H's pattern: vLLM 0.33 models/nemotron_h.py builds one block per layer — a
    Mamba-2 mixer, an attention mixer, an MoE or an MLP) has one block per layer; every other model
    has a mixer and an MLP (MoE or dense) per layer."""
    moe = set(model.moe_layers)
    attention = {i: g for g in model.attention for i in g.layers}
    state = {i: g.kind for g in model.state for i in g.layers}
    single = bool(model.cacheless_layers)
    shared = GEMMS["shared_experts"] if model.shared_experts else 0
    gemms = small = 0
    for i in range(model.decoder_layers):
        mixer = state.get(i) or ("attention" if i in attention or not model.attention else None)
        blocks = [] if mixer is None else [mixer]
        if i in attention and attention[i].index_head_dim is not None:
            blocks.append("indexer")
        if not (single and mixer is not None):
            blocks.append("moe" if i in moe else "mlp")
        gemms += sum(GEMMS[b] for b in blocks) + (shared if i in moe else 0)
        small += sum(SMALL[b] for b in blocks) + SMALL["norm"] * (1 if single else 2)
    how = ("one block per layer (" + ", ".join(f"{n} {k}" for k, n in _kinds(model, single).items()) + ")"
           if single else "a mixer and an MLP per layer")
    return gemms, small, how


def _kinds(model: Any, single: bool) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in model.state:
        out[g.kind] = out.get(g.kind, 0) + len(g.layers)
    n_attn = sum(len(g.layers) for g in model.attention)
    if n_attn:
        out["attention"] = n_attn
    if single:
        out["MoE"] = len(model.moe_layers)
        mlp = len(set(model.cacheless_layers) - set(model.moe_layers))
        if mlp:
            out["MLP"] = mlp
    return out


def _dense(model: Any, tp: int) -> tuple[float, float, str]:
    """(bytes streamed per decoder layer, bytes streamed once per step, how) on one GPU."""
    layers = model.decoder_layers
    dlb = model.decoder_layer_bytes
    if dlb is not None and model.dense_bytes is not None:
        moe_n = model.num_moe_layers
        per = (sum(dlb.layers) if dlb.layers is not None
               else dlb.moe_layer * moe_n + (dlb.dense_layer or 0) * (layers - moe_n))
        head = max(0.0, (model.dense_bytes - per) / 2)   # untied embeddings: the LM head is half the rest
        return per / layers / tp, head / tp, ("decoder layers' bytes + the LM head (half of the rest of "
                                              "dense_bytes: untied embeddings)")
    if model.dense_bytes is not None:
        return model.dense_bytes / layers / tp, 0.0, "all of dense_bytes streamed every step (an upper bound)"
    return 0.0, 0.0, "no dense_bytes in the catalog: dense weights not counted"


def _host_dense(model: Any, lane: Any, placement: str) -> float:
    """Non-routed bytes the lane's load-time ``--cpu-offload-gb`` walk leaves in host memory (all GPUs
    of the lane), as the ledger counts them: the lane's own placement and its positional column
    keep them; usage-aware residency offered to a positional lane loads without the walk."""
    from recipegen.ledger.placement import experts_only, positional_walk

    budget = lane.offload.load_cpu_offload
    if not budget or placement == "all-in-hbm":
        return 0.0
    if placement == "usage-aware" and lane.offload.placement != "usage-aware":
        return 0.0
    return float(positional_walk(model, budget, experts_only=experts_only(lane)).dense_offloaded)


def step_model(loaded: Any, lane: Any, *, placement: str, hot: Sequence[int], cold: Sequence[int],
               traffic_class: str | None = None, use_rowmap: bool = True) -> tuple[StepModel, list[str]]:
    """The pure formula's inputs for this lane at one placement and hot count per layer."""
    model = loaded.recipe.model
    machine = loaded.recipe.machines[lane.machine]
    tp = lane.tensor_parallel_size
    notes: list[str] = []
    shares, shares_how, _ = _shares(loaded, lane, traffic_class)
    notes.append(f"routing: {shares_how}")
    layers = []
    n = model.routed_experts
    if placement == "positional":
        for layer, c in zip(shares, cold):
            layers.append(MoeLayer(tuple(layer), None, c / n))
    elif placement == "all-in-hbm" or not any(cold):
        layers = [MoeLayer(tuple(layer)) for layer in shares]
    else:
        masks = _cold_masks(loaded, lane, shares, hot, traffic_class, use_rowmap)
        layers = [MoeLayer(tuple(layer), tuple(bool(x) for x in m)) for layer, m in zip(shares, masks)]
    per_layer, head, dense_how = _dense(model, tp)
    notes.append(f"dense weights: {dense_how}")
    fmt = _format(model)
    # the Hopper rows measured the warp-specialized launches: SiLU-gated experts without biases only
    silu = model.activation is None or model.activation.kind == "silu"
    row = expert_efficiency(fmt, model.name, model.expert_bytes,
                            str(getattr(machine.gpus, "compute_capability", "") or "") or None,
                            warp_specialized=silu and not model.expert_biases)
    if row is None:
        notes.append(f"no measured efficiency for {fmt} experts: hot experts read at the full HBM rate "
                     "(a lower bound on their time)")
    elif row.model != model.name:
        notes.append(f"expert efficiency: the {fmt} row measured on {row.model}'s geometry (nearest bytes per expert)")
    if model.activation is not None and model.activation.kind == "relu2_no_mul":
        notes.append("relu2 experts without a gate (up and down only): their bytes are their own, the efficiency "
                     "was measured on gated experts (an assumption)")
    cc = str(getattr(machine.gpus, "compute_capability", "") or "")
    fused = not cc.startswith("10.")
    drafter = model.drafter.weights if model.drafter is not None and model.drafter.weights else 0.0
    gemms, small, launches_how = _launches(model)
    host_dense = _host_dense(model, lane, placement)
    state = _state_groups(model, lane, tp)
    attention = _attention_groups(model, tp, _lane_attention(model, machine, lane, notes) if model.attention else None)
    sm = StepModel(decoder_layers=model.decoder_layers, moe=tuple(layers), top_k=model.top_k,
                   bytes_per_expert=model.expert_bytes / tp, expert_efficiency=row,
                   dense_bytes_per_layer=per_layer, head_bytes=head, attention=attention,
                   hbm_read=float(machine.gpus.hbm_bandwidth), pinned_read=float(machine.pinned_read_bandwidth),
                   fused_split=fused, shared_expert_gemms=2 if model.shared_experts else 0,
                   drafter_bytes=float(drafter) / tp, state=state, host_dense_bytes=host_dense / tp,
                   gemm_launches=gemms, small_launches=small)
    if model.state or model.cacheless_layers:
        notes.append(f"layers: {launches_how}")
    for g in state:
        notes.append(f"{g.layers} {_STATE_NAMES.get(g.kind, g.kind)} layers: each sequence's state "
                     f"({(g.conv_bytes + g.ssm_bytes) / 2**20:.2f} MiB per layer) read once and written once per "
                     "token of the step, at the HBM read rate — those kernels were never measured, so this "
                     "time is a lower bound and the band's low end allows twice it")
    for g in attention:
        if g.index_bytes_per_token:
            notes.append(f"sparse attention: {g.layers} layers read every held token's indexer key "
                         f"({g.index_bytes_per_token:.0f} B) per sequence at the HBM read rate (never measured: a "
                         "lower bound, the band's low end allows twice it) and, per query token, the latent KV of "
                         + (f"at most {g.topk:,} tokens (index_topk)" if g.topk else
                            "every held token (the model file names no index_topk: an upper bound)"))
    if host_dense:
        notes.append(f"non-routed weights in host memory: {host_dense / 2**30:.2f} GiB that the load's "
                     "--cpu-offload-gb walk moved besides experts, read over the host link on every step")
    if lane.speculative is not None and not drafter:
        notes.append("the drafter's own forward pass is not counted (the catalog declares no drafter weights)")
    return sm, notes


_STATE_NAMES = {"gdn": "Gated DeltaNet", "mamba2": "Mamba-2"}


def _band(machine: Any, point: OperatingPoint, terms: StepTerms | None = None) -> tuple[float, float]:
    """The validated band; where part of the step comes from kernels no table measured (state
    layers, the sparse-attention indexer: counted at the HBM read rate, a lower bound on their
    time), the low end also allows those kernels twice their time."""
    kind = str(getattr(machine.gpus, "kind", ""))
    measured = any(k in kind for k in MEASURED_GPU_KINDS)
    if measured and point.tokens <= MEASURED_MAX_TOKENS:
        band = BAND_MEASURED_GPU
    elif point.streams == 1:
        band = BAND_ONE_STREAM
    else:
        band = BAND_OTHER_GPU_STREAMS
    if terms is not None and terms.unmeasured > 0:
        band = (band[0] / (1 + terms.unmeasured / terms.total), band[1])
    return band


def estimate_lane(loaded: Any, lane_name: str, *, ledger: Any = None, placement: str | None = None,
                  hot_per_layer: int | Sequence[int] | None = None, streams: Sequence[int] | None = None,
                  context: int | None = None, acceptance: float | None = None,
                  traffic_class: str | None = None, k: int | None = None,
                  independent_streams: float | None = None) -> LaneEstimate:
    """Estimated decode tokens/s of one lane of a loaded recipe.

    ``placement``: the lane's own (default), the other one ("usage-aware" / "positional", as the
    ledger computes both at the lane's byte budget) or "all-in-hbm". ``hot_per_layer``: a
    usage-aware what-if (the least-used experts of the class's histogram go cold; the row map is
    ignored). ``streams``: concurrencies (default 1 .. the lane's max, powers of two and the max).
    ``context``: KV tokens per sequence (default ``DEFAULT_CONTEXT``, at most max_model_len).
    ``acceptance``: α per draft token (default: the lane's ``speculative.acceptance``, else
    ``DEFAULT_ACCEPTANCE``). ``k``: draft tokens per step at every concurrency instead of the lane's
    k or schedule (a what-if; 0 turns speculation off). ``independent_streams``: how many of the
    streams route independently, for the unique experts a step touches (default: all; at most the
    streams of each point) — the what-if the validation shows its eight- and sixteen-stream gap with.
    """
    from recipegen.ledger import compute_ledger

    recipe = loaded.recipe
    try:
        lane = recipe.lane(lane_name)
    except (KeyError, ValueError, LookupError):
        raise InputError(f"no lane {lane_name!r} (lanes: {', '.join(l.name for l in recipe.lanes)})",
                         file=str(loaded.path), field="lanes") from None
    model, machine = recipe.model, recipe.machines[lane.machine]
    require_class(loaded, lane, traffic_class)
    n = model.routed_experts
    kv_pool_tokens: float | None = None    # the placement's KV pool, where the ledger sizes it
    label = ""                             # the lane's own placement as the ledger's report names it
    placement = placement or lane.offload.placement
    use_rowmap = hot_per_layer is None and placement == lane.offload.placement
    if hot_per_layer is not None:
        hots = ([int(hot_per_layer)] * model.num_moe_layers if isinstance(hot_per_layer, int)
                else [int(h) for h in hot_per_layer])
        if len(hots) != model.num_moe_layers or any(not 0 <= h <= n for h in hots):
            raise InputError(f"hot experts per layer must be 0..{n} for each of {model.num_moe_layers} MoE layers",
                             field="hot_per_layer")
        colds = [n - h for h in hots]
        placement = "usage-aware" if placement != "all-in-hbm" else placement
    elif placement == "all-in-hbm":
        hots, colds = [n] * model.num_moe_layers, [0] * model.num_moe_layers
    else:
        ledger = ledger or compute_ledger(loaded)
        lane_ledger = ledger.lane(lane_name)
        chosen = lane_ledger.positional if placement == "positional" else lane_ledger.usage_aware
        if chosen is None:
            raise InputError(f"the ledger has no {placement} placement for lane {lane_name}", field="placement")
        hots, colds = list(chosen.hot_per_layer), list(chosen.cold_per_layer)
        if chosen is lane_ledger.active:
            from recipegen.ledger.result import placement_label
            label = placement_label(lane_ledger)
        kv_pool_tokens = chosen.figures["kv.tokens"].value if "kv.tokens" in chosen.figures else None
    sm, notes = step_model(loaded, lane, placement=placement, hot=hots, cold=colds, traffic_class=traffic_class,
                           use_rowmap=use_rowmap)
    ctx = min(context or DEFAULT_CONTEXT, lane.max_model_len)
    points = sorted(set(streams)) if streams else default_streams(lane.concurrency.max)
    alpha, alpha_source = lane_acceptance(lane, acceptance)
    out = []
    if k is not None and k < 0:
        raise InputError(f"k {k}: draft tokens per step cannot be negative", field="k")
    speculative = lane.speculative is not None or bool(k)
    for s in points:
        k_s = k if k is not None else 0 if lane.speculative is None else lane.speculative.k_at(s)
        independent = None if independent_streams is None else min(float(independent_streams), s)
        op = OperatingPoint(s, k_s, ctx, alpha if k_s else None, independent)
        terms = step_terms(sm, op)
        out.append(EstimatePoint(s, k_s, s * op.tokens_per_step_per_stream, terms, _band(machine, op, terms)))
    experts_note = _experts_note(out, placement)
    if experts_note:
        notes.append(experts_note)
    warnings = []
    over = [p.streams for p in out if kv_pool_tokens is not None and p.streams * ctx > kv_pool_tokens]
    if over:
        warnings.append(f"at C{', C'.join(map(str, over))} the streams' KV ({ctx:,} tokens each) exceeds the "
                        f"KV pool of {format_tokens(kv_pool_tokens)} tokens: vLLM would queue or preempt some of "
                        "them; the estimate assumes all of them decode")
    if k is not None:
        notes.append(f"k={k} at every concurrency (a what-if, not the lane's k)")
    if independent_streams is not None:
        notes.append(f"unique experts counted as for {independent_streams:g} independent streams (a what-if: the "
                     "other streams repeat their routing)")
    if lane.tensor_parallel_size > 1:
        notes.append(f"per GPU of {lane.tensor_parallel_size} (tensor parallel): bytes split evenly; the "
                     "all-reduces between ranks are not counted")
    if lane.parallel is not None:
        notes.append("a lane over several machines: every layer's time is added as if on one machine of "
                     "this kind; the hand-off between pipeline stages is not counted")
    from recipegen.ledger.parallel import expert_parallel
    if expert_parallel(lane):
        notes.append("expert parallel: estimated as if every rank held every expert's 1/TP shard (each "
                     "rank's own experts, and the slowest rank, are not estimated separately)")
    notes.append("band: measured ÷ estimated tok/s over the validation (docs/costmodel.md, 'Decode speed'); "
                 "GPUs other than the H200 use the H200's measured kernel efficiencies (an assumption)")
    lo, hi = min(hots), max(hots)
    return LaneEstimate(lane.name, placement, str(lo) if lo == hi else f"{lo}–{hi}", ctx, out,
                        alpha if speculative else None, alpha_source if speculative else None,
                        sm.expert_efficiency.source if sm.expert_efficiency else "none measured", notes, label,
                        lane.tensor_parallel_size, warnings, tuple(int(h) for h in hots), n)


def require_class(loaded: Any, lane: Any, traffic_class: str | None) -> None:
    """Refuse a traffic class the lane does not have (``recipegen plan --class``)."""
    classes = lane.classes or {}
    if traffic_class is not None and traffic_class not in classes:
        raise InputError(f"lane {lane.name} has no class {traffic_class!r} (classes: {', '.join(classes) or 'none'})",
                         file=str(loaded.path), field="--class")


def lane_acceptance(lane: Any, given: float | None = None) -> tuple[float, str]:
    """(α, where it came from): the one given (``recipegen plan --acceptance``), else the lane's
    ``speculative.acceptance`` (a rate, or a mean acceptance length at its k), else the default."""
    if given is not None:
        return given, "given on the command line (--acceptance)"
    measured = lane.speculative.acceptance if lane.speculative is not None else None
    if measured is None:
        return DEFAULT_ACCEPTANCE, DEFAULT_ACCEPTANCE_SOURCE
    if measured.rate is not None:
        return measured.rate, f"the recipe's speculative.acceptance: {measured.source}"
    alpha = acceptance_from_mean_length(measured.mean_length, measured.k)
    return alpha, (f"the recipe's speculative.acceptance: mean length {measured.mean_length:g} at k={measured.k} "
                   f"({measured.source})")


def default_streams(max_streams: int) -> list[int]:
    """1, 2, 4, … up to and including the lane's maximum concurrency."""
    out, s = [], 1
    while s < max_streams:
        out.append(s)
        s *= 2
    return out + [max_streams]


# check budgets warns when an alternative it can compute is at least this many times faster
# (at one stream or at the lane's largest concurrency).
FAR_BELOW = 1.5
_IGNORED_FOR_ALTERNATIVES = ("runtime",)   # the all-HBM alternative needs no split layer


@dataclass(frozen=True)
class Alternative:
    """Another way to serve the lane that the ledger says fits, with its estimate."""

    name: str                 # "usage-aware" | "positional" | "all-in-hbm"
    description: str
    estimate: LaneEstimate

    def to_json(self) -> dict[str, Any]:
        est = self.estimate
        return {"name": self.name, "description": self.description, "tokens_per_s":
                {str(p.streams): p.tokens_per_s for p in est.points},
                "tokens_per_s_band": {str(p.streams): list(p.tokens_per_s_band) for p in est.points},
                "tensor_parallel_caveat": est.tensor_parallel_caveat}

    def per_concurrency_text(self) -> str:
        """Its tokens/s per concurrency with each band, as the lane's own step lines print them:
        "C1 183.5 (152–223), C2 256.6 (…)"."""
        return ", ".join(f"C{p.streams} {p.tokens_per_s:,.1f} ({band_text(*p.tokens_per_s_band)})"
                         for p in self.estimate.points)


def all_hbm_context(loaded: Any, lane_name: str) -> int | None:
    """The longest max_model_len (the lane's, halved until it fits, at least 4,096) at which every
    routed expert fits in HBM with the lane's reserve and utilisation; None when none does."""
    from recipegen.ledger import compute_lane

    recipe = loaded.recipe
    lane = recipe.lane(lane_name)
    model, machine = recipe.model, recipe.machines[lane.machine]
    offload = lane.offload.model_copy(update={"placement": "usage-aware",
                                              "hot_experts_per_layer": model.routed_experts,
                                              "cold_experts_budget": None})
    length = lane.max_model_len
    while length >= 4096:
        candidate = lane.model_copy(update={"offload": offload, "max_model_len": length})
        try:
            ledger = compute_lane(model, machine, candidate)
        except Exception:  # noqa: BLE001 - a what-if the ledger cannot compute is not offered
            return None
        if all(v.kind in _IGNORED_FOR_ALTERNATIVES for v in ledger.violations):
            return length
        length //= 2
    return None


def alternatives(loaded: Any, lane_name: str, *, ledger: Any = None, streams: Sequence[int] | None = None,
                 traffic_class: str | None = None, context: int | None = None, acceptance: float | None = None
                 ) -> list[Alternative]:
    """The other placement as the ledger lays it out (a positional lane's byte budget for the
    usage-aware one; a usage-aware lane's load-time ``--cpu-offload-gb`` for the positional one),
    where its KV pool holds one max_model_len sequence, and every expert in HBM at the longest
    context that fits (when shorter than the lane's, or the lane offloads). Estimated for the same
    class, context and acceptance as the lane."""
    from recipegen.ledger import compute_ledger

    ledger = ledger or compute_ledger(loaded)
    lane = loaded.recipe.lane(lane_name)
    out: list[Alternative] = []
    same = {"streams": streams, "traffic_class": traffic_class, "context": context, "acceptance": acceptance}
    other = "usage-aware" if lane.offload.placement == "positional" else "positional"
    lane_ledger = ledger.lane(lane_name)
    laid_out = lane_ledger.usage_aware if other == "usage-aware" else lane_ledger.positional
    if laid_out is not None and sum(lane_ledger.active.cold_per_layer) > 0 and _holds_a_sequence(laid_out) \
            and _runtime_serves(loaded, lane, other, lane_ledger):
        est = estimate_lane(loaded, lane_name, ledger=ledger, placement=other, **same)
        budget = (lane.offload.load_cpu_offload or 0) / GiB
        what = ("usage-aware residency at the same host budget" if other == "usage-aware"
                else f"positional, vLLM's --cpu-offload-gb {budget:g} alone (the lane's load_cpu_offload, "
                     "no row map)")
        out.append(Alternative(other, what, est))
    if sum(lane_ledger.active.cold_per_layer) > 0:
        length = all_hbm_context(loaded, lane_name)
        if length is not None:
            est = estimate_lane(loaded, lane_name, ledger=ledger, placement="all-in-hbm", **same)
            out.append(Alternative("all-in-hbm", f"every expert in HBM with max_model_len {length:,}", est))
    return out


def _holds_a_sequence(placement: Any) -> bool:
    """Whether a placement's KV pool holds one max_model_len sequence (else it does not fit)."""
    seqs = placement.figures.get("kv.full_sequences")
    return seqs is None or seqs.value >= 1


def _runtime_serves(loaded: Any, lane: Any, placement: str, lane_ledger: Any) -> bool:
    """Whether the lane at `placement` passes the runtime's capability checks (a usage-aware split
    the runtime refuses is not offered)."""
    if placement != "usage-aware" or lane.offload.placement == "usage-aware":
        return True
    from recipegen.ledger import compute_lane

    recipe = loaded.recipe
    offload = lane.offload.model_copy(update={"placement": "usage-aware", "cold_experts_budget": None,
                                              "hot_experts_per_layer": min(lane_ledger.usage_aware.hot_per_layer)})
    ledger = compute_lane(recipe.model, recipe.machines[lane.machine], lane.model_copy(update={"offload": offload}))
    return not any(v.kind == "runtime" for v in ledger.violations)


def bands_overlap(a: EstimatePoint, b: EstimatePoint) -> bool:
    """Whether two points' validation bands (unrounded) share any speed: where they do, the
    validation cannot tell the two figures apart."""
    (lo_a, hi_a), (lo_b, hi_b) = a.tokens_per_s_band, b.tokens_per_s_band
    return lo_a <= hi_b and lo_b <= hi_a


def _bands_verdict(ours: EstimatePoint, theirs: EstimatePoint) -> str:
    """The two bands as printed and whether they overlap, for a line that compares two estimates."""
    both = f"validation bands {band_text(*ours.tokens_per_s_band)} and {band_text(*theirs.tokens_per_s_band)} tok/s"
    if bands_overlap(ours, theirs):
        ratio = theirs.tokens_per_s / ours.tokens_per_s
        return (f"{both} overlap, so the validation does not support the {ratio:.1f}x: the two may run at the "
                "same speed")
    return f"{both} do not overlap"


def speed_warnings(base: LaneEstimate, options: Sequence[Alternative]) -> list[str]:
    """A line per alternative estimated at least FAR_BELOW times faster at one stream or at the
    lane's largest concurrency, with both validation bands and whether they overlap."""
    out = []
    for alt in options:
        for s in sorted({base.points[0].streams, base.points[-1].streams}):
            ours, theirs = _point_or_none(base, s), _point_or_none(alt.estimate, s)
            if ours is None or theirs is None or not ours.tokens_per_s or not theirs.tokens_per_s:
                continue
            if theirs.tokens_per_s >= FAR_BELOW * ours.tokens_per_s:
                out.append(f"estimated {ours.tokens_per_s:,.1f} tok/s at C{s}, "
                           f"{theirs.tokens_per_s / ours.tokens_per_s:.1f}x below {alt.description} "
                           f"({theirs.tokens_per_s:,.1f} tok/s); {_bands_verdict(ours, theirs)}")
                break
    return out


def _point_or_none(estimate: LaneEstimate, streams: int) -> EstimatePoint | None:
    try:
        return estimate.point(streams)
    except KeyError:
        return None


def speculation_findings(loaded: Any, lane_name: str, estimate: LaneEstimate, *, ledger: Any = None,
                         traffic_class: str | None = None, context: int | None = None,
                         acceptance: float | None = None) -> list[str]:
    """A warning where the lane's speculation is estimated slower than none (k=0: the same lane,
    placement, class, context and concurrencies) at the acceptance `estimate` assumes, naming each such
    concurrency with both figures and bands; said only where at one of them at least the two bands do
    not overlap (where they overlap everywhere, the validation cannot tell the two apart: nothing to
    say). The estimate itself is not changed."""
    spec = [p for p in estimate.points if p.k > 0]
    if not spec or estimate.acceptance is None:
        return []
    plain = estimate_lane(loaded, lane_name, ledger=ledger, placement=estimate.placement,
                          streams=[p.streams for p in spec], traffic_class=traffic_class, context=context,
                          acceptance=acceptance, k=0)
    slower, apart = [], False
    for p in spec:
        q = plain.point(p.streams)
        if q.tokens_per_s > p.tokens_per_s:
            overlap = bands_overlap(p, q)
            apart = apart or not overlap
            slower.append(f"C{p.streams} k={p.k} {p.tokens_per_s:,.1f} tok/s ({band_text(*p.tokens_per_s_band)}) "
                          f"against k=0 {q.tokens_per_s:,.1f} ({band_text(*q.tokens_per_s_band)})"
                          + (", bands overlap" if overlap else ""))
    if not apart:
        return []
    return [f"speculation is estimated slower than none (k=0) at acceptance {estimate.acceptance:.4f}: "
            f"{'; '.join(slower)}; without speculation (k=0) it is faster at that acceptance"]
