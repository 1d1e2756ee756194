"""Decode step time and output tokens/s of one operating point (pure arithmetic; numpy).

One decode step of S streams with k draft tokens each runs T = S·(k + 1) target tokens through
every decoder layer once:

    step = Σ decoder layers ( small kernels + dense GEMMs + attention + routed experts )
           + the step's own kernels (embedding, final norm, LM head, sampling) + the drafter
    tokens/s = S · τ(k) ÷ step,      τ(k) = (1 − α^(k+1)) ÷ (1 − α)

* **dense weights**: each decoder layer's non-expert bytes (attention, norms, router, shared
  experts) and the LM head, streamed once per step: ``gemm.seconds(bytes, T, R)`` per launch
  (fixed time + bytes ÷ (R × efficiency), ``efficiency.GEMM_BF16``);
* **attention**: every sequence reads its KV cache once per layer (a sliding layer at most its
  window): ``attention.seconds(S × tokens held × KV bytes per token, T, R)``; a sparse-attention
  layer (DeepSeek-V3.2's indexer) reads every held token's indexer key once per sequence and, per
  query token, the latent KV of at most ``topk`` tokens;
* **state layers** (Gated DeltaNet, Mamba-2): every sequence's state is read once and written once
  per token of the step (vLLM 0.33's recurrent decode kernels update it in place; with draft tokens
  the kernel stores one state per token, third_party/flash_linear_attention/ops/fused_sigmoid_gating.py),
  at the HBM read rate — those kernels were never measured here, so their time is a lower bound
  (``StepTerms.unmeasured``);
* **non-routed weights in host memory** (what ``--cpu-offload-gb``'s walk moved besides experts):
  read over the host link once per step;
* **small kernels**: norms, rotary + cache write, top-k, softmax — ``SMALL_KERNEL_S`` each;
* **routed experts**, per MoE layer: the unique experts the step touches (``touched``), hot ones
  read from HBM at R × the runtime's measured efficiency for the format and T
  (``efficiency.EXPERT_EFFICIENCY``), cold ones over the host link at the in-place read rate P;
  see ``moe_layer_seconds`` for how hot and cold reads of one layer combine;
* R = the GPU's HBM read rate, P = its pinned host read rate (machine catalog).

Unique experts. Expert e of a layer takes a share p_e of the layer's routed picks (the traffic
class's histogram; without one, the default skew ``DEFAULT_SKEW``). One token picks top_k distinct
experts, so a histogram counts e once per token that picked it: e is among a token's picks with
probability q_e = top_k · p_e (``inclusion``). A step
of t effective independent tokens touches expert e with probability 1 − (1 − q_e)^t. One stream's
verify window of k + 1 tokens counts as t₁(k) effective tokens (consecutive tokens share experts):
t₁ is read back from the field reports' one-stream measurements (``ONE_STREAM_UNIQUE``) under the
default skew at their 384 experts, top-6, and reused for every model (no other router's verify
windows were measured); S streams are taken as independent: t = S · t₁(k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from recipegen.costmodel.efficiency import ATTENTION_DECODE, GEMM_BF16, SMALL_KERNEL_S, ExpertEfficiency, LaunchCost

# Kernels of one decoder layer besides its GEMMs, attention and experts (two fused add+RMSNorm,
# rotary + KV-cache write, top-k (two launches), the weights' cast and softmax), and GEMM launches
# (QKV, output projection, router), as the simulated step launches them (bench/decode_sim.py;
# counted with the profiler in the H200 run, BENCHMARKS.md). Shared experts add two GEMMs.
SMALL_KERNELS_PER_LAYER = 7
GEMMS_PER_LAYER = 3
# The step's own small kernels: embedding gather, residual reset, final norm, argmax.
SMALL_KERNELS_PER_STEP = 4

# Launches by block kind, so that a layer of any family adds up from its parts (an attention + MoE
# layer: 2 + 1 GEMMs and 2 + 1 + 4 small kernels, the counts above). Norms: one fused add + RMSNorm
# per block. Attention: QKV and output projections; rotary + KV write. MoE: the router (+ two
# GEMMs for shared experts); top-k (two launches), the weights' cast, softmax. Dense MLP:
# gate/up and down; the activation. Gated DeltaNet (vLLM 0.33 qwen_gdn_linear_attn.py): the qkvz,
# ba and output projections; conv update, recurrent update, gated RMSNorm. Mamba-2
# (mamba_mixer2.py): in and out projections; conv update, SSM update, gated RMSNorm. DeepSeek
# sparse-attention indexer (models/deepseek_v32/attention.py): wq_b and wk/weights projections;
# key norm + fp8 quantise and cache write, the logits, the top-k selection.
GEMMS = {"attention": 2, "moe": 1, "shared_experts": 2, "mlp": 2, "gdn": 3, "mamba2": 2, "indexer": 2}
SMALL = {"norm": 1, "attention": 1, "moe": 4, "mlp": 1, "gdn": 3, "mamba2": 3, "indexer": 3}

# Hot and cold reads of one usage-aware layer through the fused split launch (both banks in one
# launch, BENCHMARKS.md run F / AA): the longer stream plus this share of the shorter. 1/2 puts
# the usage-aware rows of run F within -3% (T=1) to +9% (T=96) of measured (by hand, from the
# rows' hot and cold bytes); 0 (pure overlap) is 7-13% fast, 1 (serial) 22-28% slow at T >= 16.
# Run F predates the cold-first launch order (run CF: the usage-aware step 7% shorter at T=6, 2% at
# T=16); not re-derived since (docs/costmodel.md): in the H200 simulation after it (run EC) the
# usage-aware Qwen3-30B step at T=32 is 1.21x faster than estimated, and no single share fits T=8
# and T=32 together.
FUSED_SHORTER_SHARE = 0.5

# The field reports' one-stream unique experts per MoE layer by k (DeepSeek-V4.1-Flash, 384
# experts, top-6; "vLLM: Pin Hot Experts", 2026-09-17) — the catalog's reference model holds them.
REFERENCE_EXPERTS, REFERENCE_TOP_K = 384, 6


def default_skew(num_experts: int) -> np.ndarray:
    """Pick shares by popularity rank, exp(−4.94·(r/E)^1.01), normalised: the profile of the
    synthetic histograms (``rowmap synth``), which gives the published skew of DeepSeek-V4.1-Flash's
    measured histogram (top 25 / 50 / 73% of experts: 71.4 / 91.8 / 98.7% of picks, the field
    report "Offload by Expert on GB300: The Skew Is Real, the Kernel Is Not")."""
    r = np.arange(num_experts) / num_experts
    p = np.exp(-4.94 * r ** 1.01)
    return p / p.sum()


def inclusion(p: np.ndarray, top_k: int) -> np.ndarray:
    """q_e: probability that expert e is among one token's top_k distinct picks, for pick shares p
    (a histogram's counts ÷ all its picks). A token's picks are distinct, so a histogram counts an
    expert once per token that picked it: q_e = top_k · p_e exactly. Shares that no histogram of
    distinct picks can have (top_k · p_e > 1: the default skew at 16 experts, top-4) are capped at 1,
    the rest scaled in proportion so that Σ q_e = top_k."""
    p = np.asarray(p, dtype=float)
    p = p / p.sum()
    if top_k >= np.count_nonzero(p):
        return (p > 0).astype(float)
    q = top_k * p
    capped = np.zeros(len(p), dtype=bool)
    while (over := (q > 1) & ~capped).any():
        capped |= over
        free = ~capped
        q[capped] = 1.0
        q[free] = p[free] / p[free].sum() * (top_k - capped.sum())
    return q


def successive_inclusion(weights: np.ndarray, top_k: int) -> np.ndarray:
    """q_e for tokens that draw top_k distinct experts one after another, each draw ∝ ``weights``
    among those not yet drawn (``torch.multinomial(..., replacement=False)``, as the H200 decode
    simulation routes): q_e = 1 − (1 − w_e)^m′ with m′ such that Σ q_e = top_k. The pick shares
    such tokens leave are q / top_k, flatter than the weights."""
    w = np.asarray(weights, dtype=float)
    w = w / w.sum()
    if top_k >= np.count_nonzero(w):
        return (w > 0).astype(float)
    lo, hi = float(top_k), float(top_k)
    while (1 - (1 - w) ** hi).sum() < top_k:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        if (1 - (1 - w) ** mid).sum() < top_k:
            lo = mid
        else:
            hi = mid
    return 1 - (1 - w) ** ((lo + hi) / 2)


def expected_unique(q: np.ndarray, tokens: float) -> float:
    return float((1 - (1 - q) ** tokens).sum())


@cache
def one_stream_tokens(k: int) -> float:
    """t₁(k): effective independent tokens of one stream's verify window of k + 1 tokens."""
    from recipegen.costmodel.unique_experts import ONE_STREAM_UNIQUE
    q = inclusion(default_skew(REFERENCE_EXPERTS), REFERENCE_TOP_K)
    points = {0: 1.0}
    for kk, u in ONE_STREAM_UNIQUE.items():
        if kk > 0:
            points[kk] = _invert(q, u)
    if k in points:
        return points[k]
    # between and beyond measured k: (1 + k)^γ, γ by least squares through the origin in log-log
    xs = [math.log(1 + kk) for kk in points if kk > 0]
    ys = [math.log(points[kk]) for kk in points if kk > 0]
    gamma = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return (1 + k) ** gamma


def _invert(q: np.ndarray, unique: float) -> float:
    lo, hi = 1.0, 1.0
    while expected_unique(q, hi) < unique:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        if expected_unique(q, mid) < unique:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class MoeLayer:
    """One MoE layer's routing and placement.

    ``shares``: each expert's share of the layer's picks. ``cold``: which experts sit in host
    memory (a usage-aware bank), or None. ``cold_bytes_share``: the share of *every* expert's
    bytes in host memory (a positional layer: 1 when vLLM's walk offloaded the whole layer, the
    offloaded tensors' share when it stopped inside it)."""

    shares: tuple[float, ...]
    cold: tuple[bool, ...] | None = None
    cold_bytes_share: float = 0.0


@dataclass(frozen=True)
class AttentionGroup:
    """Decoder layers of one attention kind: how many, KV bytes per token per layer, window.

    Sparse attention (DeepSeek-V3.2, GLM-5): ``topk`` tokens each query token attends to, and the
    indexer's key bytes per token per layer (``index_bytes_per_token``), read for every held token
    once per sequence."""

    layers: int
    kv_bytes_per_token: float
    window: int | None = None
    topk: int | None = None
    index_bytes_per_token: float = 0.0


@dataclass(frozen=True)
class StateGroup:
    """Decoder layers that keep a state per sequence (Gated DeltaNet, Mamba-2): how many, and per
    sequence per layer the convolution state's and the recurrent (SSM) state's bytes."""

    kind: str
    layers: int
    conv_bytes: float
    ssm_bytes: float


@dataclass(frozen=True)
class StepModel:
    """What the step-time formula needs of a model on a GPU (per GPU for a tensor-parallel lane)."""

    decoder_layers: int
    moe: tuple[MoeLayer, ...]
    top_k: int
    bytes_per_expert: float
    expert_efficiency: ExpertEfficiency | None
    dense_bytes_per_layer: float        # non-expert bytes streamed per decoder layer
    head_bytes: float                   # LM head (and anything else streamed once per step)
    attention: tuple[AttentionGroup, ...]
    hbm_read: float                     # B/s
    pinned_read: float                  # B/s
    fused_split: bool = True            # both banks in one launch (Triton); False: one launch per bank
    shared_expert_gemms: int = 0
    drafter_bytes: float = 0.0
    gemm: LaunchCost = GEMM_BF16
    attention_cost: LaunchCost = ATTENTION_DECODE
    small_kernel_s: float = SMALL_KERNEL_S
    state: tuple[StateGroup, ...] = ()
    host_dense_bytes: float = 0.0       # non-routed weights in host memory, read over the link each step
    gemm_launches: int | None = None    # GEMM launches of the decoder layers (None: GEMMS_PER_LAYER each)
    small_launches: int | None = None   # small kernels of the decoder layers (None: SMALL_KERNELS_PER_LAYER each)


@dataclass(frozen=True)
class OperatingPoint:
    streams: int
    k: int = 0                          # draft tokens per step
    context: int = 4096                 # KV tokens each sequence holds
    acceptance: float | None = None     # α: probability a draft token is accepted (k > 0)
    # Streams whose routing is independent, for the unique experts a step touches (default: all of
    # them). Fewer says the streams share experts beyond what their histogram implies (e.g. a
    # benchmark sending alike prompts); the validation tables show the estimate as a function of it.
    independent_streams: float | None = None

    @property
    def tokens(self) -> int:
        return self.streams * (self.k + 1)

    @property
    def tokens_per_step_per_stream(self) -> float:
        if self.k == 0:
            return 1.0
        if self.acceptance is None:
            raise ValueError("a speculative operating point needs the acceptance rate")
        return tokens_per_step(self.acceptance, self.k)


def tokens_per_step(acceptance: float, k: int) -> float:
    """Output tokens per step of one stream verifying k draft tokens: 1 + α + … + α^k."""
    if k == 0:
        return 1.0
    return float(k + 1) if acceptance >= 1 else (1 - acceptance ** (k + 1)) / (1 - acceptance)


def acceptance_from_mean_length(mean_length: float, k: int) -> float:
    """α such that ``tokens_per_step(α, k)`` equals a measured mean acceptance length (1 < L < k + 1;
    the sum rises with α, so bisection)."""
    if not 1 < mean_length < k + 1:
        raise ValueError(f"mean acceptance length {mean_length:g} is outside (1, {k + 1}) at k={k}")
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if tokens_per_step(mid, k) < mean_length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class StepTerms:
    """Seconds per step by term, and the expert counts behind them."""

    hot_experts: float
    cold_experts: float
    experts: float                      # the two combined as the split launch runs them
    dense: float
    attention: float
    small_kernels: float
    drafter: float
    unique_per_layer: float
    cold_per_step: float                # cold experts read per step (all MoE layers)
    hot_bytes: float
    cold_bytes: float
    kv_bytes: float
    dense_bytes: float
    state: float = 0.0                  # state layers' reads and writes (a lower bound: never measured)
    state_bytes: float = 0.0
    host_dense: float = 0.0             # non-routed weights read over the host link
    host_dense_bytes: float = 0.0
    unmeasured: float = 0.0             # seconds from kernels no table measured (state layers, indexer)
    # True where hot and cold reads of a layer overlap in one launch (``moe_layer_seconds``): then
    # ``experts`` is less than hot + cold; False where they run one after the other (experts = hot + cold).
    experts_overlapped: bool = False

    @property
    def total(self) -> float:
        return (self.experts + self.dense + self.attention + self.small_kernels + self.drafter + self.state
                + self.host_dense)

    def to_json(self) -> dict:
        return {"step_ms": self.total * 1e3, "experts_ms": self.experts * 1e3,
                "hot_experts_ms": self.hot_experts * 1e3, "cold_experts_ms": self.cold_experts * 1e3,
                "dense_ms": self.dense * 1e3, "attention_ms": self.attention * 1e3,
                "small_kernels_ms": self.small_kernels * 1e3, "drafter_ms": self.drafter * 1e3,
                "unique_experts_per_layer": self.unique_per_layer, "cold_experts_per_step": self.cold_per_step,
                "hot_expert_bytes": self.hot_bytes, "cold_expert_bytes": self.cold_bytes,
                "kv_bytes": self.kv_bytes, "dense_bytes": self.dense_bytes, "state_ms": self.state * 1e3,
                "state_bytes": self.state_bytes, "host_dense_ms": self.host_dense * 1e3,
                "host_dense_bytes": self.host_dense_bytes, "unmeasured_ms": self.unmeasured * 1e3,
                "experts_combined": ("overlapped" if self.experts_overlapped else
                                     "in sequence" if self.cold_experts else None)}


def step_terms(model: StepModel, point: OperatingPoint) -> StepTerms:
    """The step's time by term at one operating point."""
    t_tokens = point.tokens
    independent = point.streams if point.independent_streams is None else point.independent_streams
    eff_tokens = independent * one_stream_tokens(point.k)
    hot = cold = experts = 0.0
    unique = cold_n = hot_bytes = cold_bytes = 0.0
    overlapped = False
    eff = model.expert_efficiency.at(t_tokens) if model.expert_efficiency else 1.0
    hot_rate = model.hbm_read * eff
    for layer in model.moe:
        h, c, e, u, n = moe_layer_seconds(layer, model, eff_tokens, hot_rate)
        hot += h
        cold += c
        experts += e
        unique += u
        cold_n += n
        hot_bytes += h * hot_rate
        cold_bytes += c * model.pinned_read
        overlapped = overlapped or (model.fused_split and layer.cold is not None and c > 0)
    dense_bytes = model.decoder_layers * model.dense_bytes_per_layer + model.head_bytes
    gemms = (model.decoder_layers * (GEMMS_PER_LAYER + model.shared_expert_gemms)
             if model.gemm_launches is None else model.gemm_launches) + 1
    gemm_rate = model.hbm_read * model.gemm.efficiency(t_tokens)
    dense = gemms * model.gemm.fixed(t_tokens) + dense_bytes / gemm_rate
    drafter = model.drafter_bytes / gemm_rate   # one drafter pass streams its weights once
    kv_bytes = 0.0
    attention = 0.0
    unmeasured = 0.0
    for group in model.attention:
        held = point.context if group.window is None else min(point.context, group.window)
        if group.topk is None:
            per_layer = point.streams * held * group.kv_bytes_per_token
        else:   # each query token reads the latent KV of the tokens its indexer picked
            per_layer = t_tokens * min(held, group.topk) * group.kv_bytes_per_token
        index = point.streams * held * group.index_bytes_per_token   # the indexer scans every held key
        kv_bytes += group.layers * (per_layer + index)
        attention += group.layers * model.attention_cost.seconds(per_layer, t_tokens, model.hbm_read)
        if index:
            seconds = group.layers * index / model.hbm_read
            attention += seconds
            unmeasured += seconds
    # State layers: each sequence's state read once, then written once per token of its verify window.
    state_bytes = sum(g.layers * point.streams * (2 * g.conv_bytes + (2 + point.k) * g.ssm_bytes)
                      for g in model.state)
    state = state_bytes / model.hbm_read
    unmeasured += state
    host_dense = model.host_dense_bytes / model.pinned_read
    small_per_layers = (model.decoder_layers * SMALL_KERNELS_PER_LAYER if model.small_launches is None
                        else model.small_launches)
    small = (small_per_layers + SMALL_KERNELS_PER_STEP) * model.small_kernel_s
    return StepTerms(hot_experts=hot, cold_experts=cold, experts=experts, dense=dense, attention=attention,
                     small_kernels=small, drafter=drafter, unique_per_layer=unique / max(len(model.moe), 1),
                     cold_per_step=cold_n, hot_bytes=hot_bytes, cold_bytes=cold_bytes, kv_bytes=kv_bytes,
                     dense_bytes=dense_bytes, state=state, state_bytes=state_bytes, host_dense=host_dense,
                     host_dense_bytes=model.host_dense_bytes, unmeasured=unmeasured,
                     experts_overlapped=overlapped)


def moe_layer_seconds(layer: MoeLayer, model: StepModel, eff_tokens: float, hot_rate: float
                      ) -> tuple[float, float, float, float, float]:
    """(hot s, cold s, combined s, unique experts, cold experts) of one MoE layer, in expectation.

    A positional layer reads its offloaded share of every touched expert over the link (vLLM's
    kernel reads the offloaded tensors in place): hot + cold in sequence. A usage-aware layer
    touches a random number n of cold experts; through the fused split launch (one launch over
    both banks) it takes max(h, c) + ``FUSED_SHORTER_SHARE`` × min(h, c), through one launch per
    bank h + c; the expectation is over n's distribution (each cold expert touched independently).
    """
    b = model.bytes_per_expert
    q = inclusion(np.asarray(layer.shares), model.top_k)
    touch = 1 - (1 - q) ** eff_tokens
    unique = float(touch.sum())
    if layer.cold is None:
        h = unique * b * (1 - layer.cold_bytes_share) / hot_rate
        c = unique * b * layer.cold_bytes_share / model.pinned_read
        return h, c, h + c, unique, unique if layer.cold_bytes_share >= 1 else unique * layer.cold_bytes_share
    mask = np.asarray(layer.cold, dtype=bool)
    cold_touch = touch[mask]
    hot_unique = float(touch[~mask].sum())
    h = hot_unique * b / hot_rate
    per_cold = b / model.pinned_read
    dist = poisson_binomial(cold_touch)
    n = np.arange(len(dist))
    c_n = n * per_cold
    if model.fused_split:
        combined = np.maximum(h, c_n) + FUSED_SHORTER_SHARE * np.minimum(h, c_n)
    else:
        combined = h + c_n
    c = float((dist * c_n).sum())
    return h, c, float((dist * combined).sum()), unique, float(cold_touch.sum())


def poisson_binomial(probs: np.ndarray) -> np.ndarray:
    """P(n of these independent events happen), n = 0..len (dynamic programming)."""
    dist = np.zeros(len(probs) + 1)
    dist[0] = 1.0
    for i, p in enumerate(probs):
        dist[1:i + 2] = dist[1:i + 2] * (1 - p) + dist[:i + 1] * p
        dist[0] *= (1 - p)
    return dist
