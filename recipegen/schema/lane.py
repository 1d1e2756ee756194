"""The lane: one vLLM engine on fixed GPUs, one port, one image, its traffic classes."""

from __future__ import annotations

from typing import Annotated, Literal

from expert_residency.formats._io import MAX_EXPERTS
from pydantic import Field, NonNegativeInt, PositiveInt, StringConstraints, field_validator, model_validator

from recipegen.schema.adaptive import Adaptive
from recipegen.schema.base import Bytes, PathError, PositiveBytes, StrictModel, TokenCount
from recipegen.schema.parallel import Parallel
from recipegen.schema.patterns import ENV_KEY, IMAGE, NAME_MAX_LENGTH, SERVICE_NAME

NAME_PATTERN = SERVICE_NAME.regex
# The parts of a lane's compose service names (`recipegen.render.lanes` builds the names from
# them, the lane's checks below bound them): `lane-<name>` is the engine that serves the API, and
# so its host name on the compose network (what Prometheus scrapes); stage r >= 1 of a multi-node
# lane is `lane-<name>-worker-<r>`; each of these engines has a count-only profile boot, the same
# name with `-profile` after it. Every one is a host name, one DNS label of at most 63 characters:
# the profile boot every lane has leaves 50 for the name, a multi-node lane's workers less.
LANE_SERVICE_PREFIX = "lane-"
LANE_WORKER_SUFFIX = "-worker-"  # followed by the stage's rank
LANE_PROFILE_SUFFIX = "-profile"
DNS_LABEL_MAX_LENGTH = 63
LANE_NAME_MAX_LENGTH = DNS_LABEL_MAX_LENGTH - len(LANE_SERVICE_PREFIX) - len(LANE_PROFILE_SUFFIX)
# Bounds far above any lane (the reference serves up to 16 streams, k=5), below what a per-batch-
# size table may expand to: checks walk every batch size up to concurrency.max.
MAX_STREAMS = 65_536
MAX_SPECULATIVE_K = 64
_Streams = Annotated[PositiveInt, Field(le=MAX_STREAMS)]
# What Compose and the container see as a variable name / an image reference; nothing that
# could start YAML structure or a Compose interpolation.
ENV_KEY_PATTERN = ENV_KEY.regex
IMAGE_PATTERN = IMAGE.regex

# vLLM 0.33 `SpeculativeMethod` (vllm/config/speculative.py), the values a recipe may name.
SPECULATIVE_METHODS = (
    "ngram", "ngram_gpu", "draft_model", "suffix", "custom_class", "eagle", "eagle3",
    "extract_hidden_states", "dflash", "dspark", "mtp", "deepseek_mtp",
)


# Methods whose drafter is a separate checkpoint (vLLM needs `speculative_config.model`).
SEPARATE_DRAFTER_METHODS = ("draft_model", "eagle", "eagle3", "dflash")


class Concurrency(StrictModel):
    """The range of concurrent requests the lane is expected to serve."""

    min: PositiveInt = Field(default=1, le=MAX_STREAMS)
    """Fewest concurrent streams expected (usually 1)."""
    max: PositiveInt = Field(le=MAX_STREAMS)
    """Most concurrent streams expected; renders as `--max-num-seqs` unless overridden."""

    @model_validator(mode="after")
    def _check(self) -> Concurrency:
        if self.min > self.max:
            raise PathError(f"min {self.min} is above max {self.max}", ("min",))
        return self


class Offload(StrictModel):
    """Where routed experts live: the budget, and how experts are chosen for the host.

    `usage-aware`: the row map decides; declare the budget as `hot_experts_per_layer` OR
    `cold_experts_budget` (GiB of experts in host) — the other is derived (a byte budget buys the
    largest whole count that fits). `positional`: plain vLLM `--cpu-offload-gb`, no row map.
    """

    placement: Literal["usage-aware", "positional"] = "usage-aware"
    """`usage-aware` (row map, expert residency runtime) or `positional` (plain `--cpu-offload-gb`)."""
    hot_experts_per_layer: NonNegativeInt | None = None
    """Routed experts per MoE layer kept in HBM (usage-aware only)."""
    cold_experts_budget: Bytes | None = None
    """Bytes of routed experts allowed in pinned host memory (usage-aware only)."""
    load_cpu_offload: Bytes | None = None
    """vLLM `--cpu-offload-gb` (GiB) the engine loads with, per GPU as vLLM reads it (with
    tensor parallelism each GPU offloads this much of its own shards). Usage-aware: the load-time
    placement the runtime re-homes from. Positional: the offload itself (required)."""
    prefetch_slots_per_layer: NonNegativeInt = Field(default=0, le=MAX_EXPERTS)
    """HBM slots per MoE layer reserved for a cold-expert prefetch bank. The ledger prices it out of
    the KV pool (3 slots per layer cost 43% of the v15 pool in the field report "Should a GB300
    Prefetch Its Cold Experts? Mostly No, and What to Build Instead", 2026-10-23); the residency
    runtime has no prefetch mode yet, so this is for what-if budgets."""
    adaptive: Adaptive | None = None
    """Adaptive residency (usage-aware only): the map follows the traffic inside the running
    engine; swaps are copied into spare rows beside the decode steps and go live by map flips.
    Absent: off (the boot map stays)."""

    @model_validator(mode="after")
    def _check(self) -> Offload:
        if self.placement == "usage-aware":
            if (self.hot_experts_per_layer is None) == (self.cold_experts_budget is None):
                raise PathError("usage-aware offload needs exactly one of hot_experts_per_layer and "
                                "cold_experts_budget (the other is derived)", ("hot_experts_per_layer",))
        else:
            for name in ("hot_experts_per_layer", "cold_experts_budget"):
                if getattr(self, name) is not None:
                    raise PathError(f"{name} applies to usage-aware placement; positional offload is "
                                    "set by load_cpu_offload alone", (name,))
            if self.load_cpu_offload is None:
                raise PathError("positional offload needs load_cpu_offload (vLLM --cpu-offload-gb; "
                                "0 GiB keeps every expert in HBM)", ("load_cpu_offload",))
        return self


class Acceptance(StrictModel):
    """The drafter's measured acceptance on the lane's own traffic; the decode estimate turns it into
    output tokens per step per stream, (1 − α^(k+1)) ÷ (1 − α) at the step's k.

    Give `rate` (α: the probability that a draft token is accepted when every draft token before it
    was), or `mean_length` with the `k` it was measured at — vLLM 0.33 logs it as "Mean acceptance
    length" and exports it as 1 + rate(vllm:spec_decode_num_accepted_tokens_total) ÷
    rate(vllm:spec_decode_num_drafts_total) (vllm/v1/spec_decode/metrics.py); α is solved from it.
    vLLM's "Avg Draft acceptance rate" (accepted ÷ drafted tokens) is not α: it averages over
    positions."""

    rate: float | None = Field(default=None, gt=0, lt=1)
    """α, the acceptance per draft token given the ones before it were accepted."""
    mean_length: float | None = Field(default=None, gt=1)
    """Output tokens per step per stream measured at `k` (accepted draft tokens + the bonus token)."""
    k: PositiveInt | None = Field(default=None, le=MAX_SPECULATIVE_K)
    """The k `mean_length` was measured at (required with it)."""
    source: str = Field(min_length=1)
    """Where it was measured: machine, date and command, or a public report by title and date."""

    @model_validator(mode="after")
    def _check(self) -> Acceptance:
        if (self.rate is None) == (self.mean_length is None):
            raise PathError("give exactly one of rate and mean_length", ("rate",))
        if self.mean_length is not None:
            if self.k is None:
                raise PathError("mean_length needs the k it was measured at", ("k",))
            if self.mean_length >= self.k + 1:
                raise PathError(f"mean_length {self.mean_length:g} at k={self.k}: at most k + 1 = {self.k + 1} "
                                "tokens per step, and exactly k + 1 only if every draft is accepted",
                                ("mean_length",))
        elif self.k is not None:
            raise PathError("k goes with mean_length (the k it was measured at); rate needs none", ("k",))
        return self


class Speculative(StrictModel):
    """Speculative decoding: a method and a constant k, or a k-per-batch-size schedule."""

    method: Literal[SPECULATIVE_METHODS]  # type: ignore[valid-type]
    """vLLM speculative method (`dspark`, `mtp`, `eagle3`, …)."""
    k: NonNegativeInt | None = Field(default=None, le=MAX_SPECULATIVE_K)
    """Speculative tokens per step (`num_speculative_tokens`); with a schedule, the maximum (sizes
    buffers and draft KV). Defaults to the schedule's largest k."""
    schedule: list[Annotated[tuple[_Streams, _Streams, Annotated[NonNegativeInt, Field(le=MAX_SPECULATIVE_K)]],
                             Field(strict=False)]] | None = Field(default=None, max_length=MAX_STREAMS)
    """vLLM 0.33 `num_speculative_tokens_per_batch_size`: `[start, end, k]` inclusive batch-size
    ranges, sorted, non-overlapping, the first starting at 1."""
    model: str | None = None
    """Drafter checkpoint, for methods that need one apart from the target (`draft_model`, `eagle`,
    `eagle3`, `dflash`)."""
    acceptance: Acceptance | None = None
    """The drafter's measured acceptance on this lane's traffic, with its source; the decode
    estimate (`recipegen plan`, `check budgets`, `fit`, `compare`) uses it. Absent: the estimate
    uses the reference lane's DSpark figure and says so (`recipegen plan --acceptance` overrides
    both)."""

    @model_validator(mode="after")
    def _check(self) -> Speculative:
        if self.method in SEPARATE_DRAFTER_METHODS and not self.model:
            raise PathError(f"method {self.method!r} drafts with a separate checkpoint: give its id in "
                            "`model`", ("model",))
        if self.schedule is None:
            if self.k is None or self.k == 0:
                raise PathError("give k >= 1 (speculative tokens per step) or a schedule", ("k",))
            return self
        if not self.schedule:
            raise PathError("schedule must not be empty", ("schedule",))
        previous_end = 0
        for i, (start, end, _k) in enumerate(self.schedule):
            if start > end:
                raise PathError(f"range [{start}, {end}] starts after it ends", ("schedule", i))
            if start <= previous_end:
                raise PathError("batch-size ranges must be sorted and non-overlapping "
                                f"([{start}, {end}] starts at or before {previous_end})", ("schedule", i))
            previous_end = end
        if self.schedule[0][0] != 1:
            raise PathError("the first batch-size range must start at 1 (vLLM requires every batch "
                            "size to have a k)", ("schedule", 0))
        top = max(k for _, _, k in self.schedule)
        if self.k is None:
            self.k = top
        elif any(k > self.k for _, _, k in self.schedule):
            raise PathError(f"schedule asks for k={top} but k (the maximum) is {self.k}; vLLM would "
                            "silently clamp it", ("schedule",))
        if self.k == 0:
            raise PathError("every k in the schedule is 0: drop `speculative` instead", ("schedule",))
        return self

    def k_at(self, batch_size: int) -> int:
        """The k vLLM uses at `batch_size` (gaps and the tail carry the previous range's k)."""
        assert self.k is not None
        if self.schedule is None:
            return self.k
        chosen = self.schedule[0][2]
        for start, _end, k in self.schedule:
            if start <= batch_size:
                chosen = k
        return min(chosen, self.k)


class HbmReserveMeasurement(StrictModel):
    """The boot a HBM reserve was back-solved from: its KV pool at its utilisation and hot count."""

    kv_pool: PositiveBytes
    """KV pool vLLM reported on that boot."""
    gpu_memory_utilization: float = Field(gt=0, le=1)
    """Utilisation of that boot."""
    hot_experts_per_layer: NonNegativeInt
    """Hot experts per MoE layer on that boot."""


class HbmReserve(StrictModel):
    """HBM for everything but routed experts and KV: dense weights, drafter, activations, CUDA graphs.

    Give `value` (with its `basis`), `back_solved_from` a measured boot (reserve = HBM ×
    utilisation − hot experts − KV pool, labelled back-solved), or `estimated: true` (the ledger
    estimates it from the model and machine, labelled estimated). Declared dense and drafter bytes
    are parts of it, never extra.
    """

    value: Bytes | None = None
    """The reserve, as a figure (say how it was obtained in `basis`)."""
    back_solved_from: HbmReserveMeasurement | None = None
    """A measured boot to back-solve the reserve from."""
    estimated: bool = False
    """Let the ledger estimate the reserve from the model and the machine (dense weights per GPU +
    vLLM's fused-MoE workspace at the lane's batched tokens + an allowance for CUDA graphs and the
    profile run's other activations; docs/ledger.md 'Estimated reserves'), for a lane that has not
    booted yet. Printed as estimated; replace it with a measured boot (`recipegen verify`)."""
    basis: Literal["measured", "assumed"] | None = None
    """How `value` was obtained: `measured` (on the box: a boot's log, `recipegen verify`) or
    `assumed`. Only a measured value is printed as measured."""
    source: str | None = Field(default=None, min_length=1)
    """Where the figure comes from (a field report and its section, 'measured on …', or why it is
    assumed); not needed with `estimated`, whose source is its formula."""

    @model_validator(mode="after")
    def _check(self) -> HbmReserve:
        _check_reserve(self)
        return self


def _check_reserve(spec: HbmReserve | HostReserve) -> None:
    """Exactly one way of giving a reserve; a source for every way but the estimate; `basis`
    belongs to `value`."""
    given = [n for n in ("value", "back_solved_from") if getattr(spec, n) is not None]
    if spec.estimated:
        given.append("estimated")
    if len(given) != 1:
        raise PathError("give exactly one of value, back_solved_from and estimated: true"
                        + (f" (got {', '.join(given)})" if given else ""), ("value",))
    if spec.basis is not None and spec.value is None:
        raise PathError("basis says how `value` was obtained: give it with value only", ("basis",))
    if spec.source is None and not spec.estimated:
        raise PathError("missing required field: where the figure comes from (an estimated reserve's source is "
                        "its formula)", ("source",))


class HostReserveMeasurement(StrictModel):
    """The boot a host reserve was back-solved from: host memory in use with some experts pinned."""

    host_used: PositiveBytes
    """Host memory in use on that boot (page cache included)."""
    pinned_experts: Bytes
    """Expert bytes that boot moved to host as vLLM logs them ("Total CPU offloaded parameters", its
    `--cpu-offload-gb` walk, exact sizes), for the whole box: on a tensor-parallel boot each worker
    logs its own shards (vllm/model_executor/offloader/uva.py:67-71), so give the sum over the
    workers. The ledger subtracts what its pinning model says those parameters held (each rounded up
    to a power of two), so the boot replays to its own measurement."""


class HostReserve(StrictModel):
    """Host memory for everything but host tables and pinned experts: page cache, processes, OS.

    Give `value` (with its `basis`), `back_solved_from` a measured boot (reserve = host used −
    pinned experts − the model's host tables), or `estimated: true` (the ledger's estimate of the
    vLLM processes and the OS, labelled estimated).
    """

    value: Bytes | None = None
    """The reserve, as a figure (say how it was obtained in `basis`)."""
    back_solved_from: HostReserveMeasurement | None = None
    """A measured boot to back-solve the reserve from."""
    estimated: bool = False
    """Let the ledger estimate the reserve: the operating system and vLLM's API-server and engine
    processes, plus one worker process per GPU (docs/ledger.md 'Estimated reserves'); page cache
    is reclaimable and not counted. Printed as estimated."""
    basis: Literal["measured", "assumed"] | None = None
    """How `value` was obtained: `measured` (the box's host memory in use) or `assumed`."""
    source: str | None = Field(default=None, min_length=1)
    """Where the figure comes from; not needed with `estimated`."""

    @model_validator(mode="after")
    def _check(self) -> HostReserve:
        _check_reserve(self)
        return self


class Reserves(StrictModel):
    """Measured reserves, each with its source."""

    hbm: HbmReserve
    """Per-GPU HBM not available to routed experts and KV."""
    host: HostReserve | None = None
    """Host memory not available to tables and pinned experts (page cache, processes)."""


class TrafficClass(StrictModel):
    """A kind of traffic with its own row map (and the histogram it was built from)."""

    rowmap: str | None = None
    """Row-map file, relative to the recipe file (required for usage-aware lanes)."""
    histogram: str | None = None
    """Histogram file the row map was built from, relative to the recipe file."""
    description: str = ""
    """Free text."""


class Lane(StrictModel):
    """One vLLM engine: fixed GPUs of one machine, one port, one image, one active traffic class."""

    name: str = Field(pattern=NAME_PATTERN, json_schema_extra={"maxLength": LANE_NAME_MAX_LENGTH})
    """Lane name, at most 50 characters: its compose service, and its host name on the compose
    network (the one Prometheus scrapes), is `lane-<name>`, its profile boot `lane-<name>-profile`,
    each one DNS label of at most 63; a multi-node lane's workers, `lane-<name>-worker-<r>-profile`
    at the longest, take `-worker-<r>` more."""
    machine: str
    """Key of the machine in the recipe's `machines` (multi-node lanes will add a placement list)."""
    gpus: list[NonNegativeInt] = Field(min_length=1)
    """GPU ids on that machine (tensor-parallel across them)."""
    port: int = Field(ge=1, le=65535)
    """Host port of the OpenAI-compatible API."""
    image: str = Field(min_length=1, pattern=IMAGE_PATTERN)
    """Container image, e.g. `vllm/vllm-openai:v0.33.0`."""
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    """vLLM `--gpu-memory-utilization` (give this or `kv_cache_bytes`)."""
    kv_cache_bytes: PositiveBytes | None = None
    """Fixed KV pool (`--kv-cache-memory-bytes`) instead of a utilisation."""
    max_model_len: TokenCount
    """vLLM `--max-model-len` (1M = 1048576, as vLLM reads it)."""
    concurrency: Concurrency
    """Expected concurrent streams."""
    offload: Offload = Field(default_factory=lambda: Offload(placement="positional", load_cpu_offload="0 GiB"))
    """Expert budget and placement. Omitted: every routed expert in HBM (plain vLLM, no
    `--cpu-offload-gb`), as `{placement: positional, load_cpu_offload: 0 GiB}`."""
    speculative: Speculative | None = None
    """Speculative decoding, if any."""
    reserves: Reserves
    """Measured reserves with their sources."""
    classes: dict[Annotated[str, StringConstraints(pattern=NAME_PATTERN, max_length=NAME_MAX_LENGTH)],
                  TrafficClass] = {}
    """Traffic classes by name (usage-aware lanes: each has a row map)."""
    active_class: str | None = None
    """The class whose row map the lane serves now (written back by `render --class`/`swap`)."""
    profile: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=NAME_MAX_LENGTH)
    """Compose profile for lanes that are not always on."""
    extra_args: list[str] = []
    """Further `vllm serve` arguments, passed through verbatim."""
    env: dict[Annotated[str, StringConstraints(pattern=ENV_KEY_PATTERN)], str] = {}
    """Further container environment variables."""
    parallel: Parallel | None = None
    """Span several machines: pipeline stages (one machine each, `machine`/`gpus` above are stage
    0, the head), their layer split and rendezvous port (see docs/multinode.md)."""

    @field_validator("name")
    @classmethod
    def _name_fits_a_dns_label(cls, value: str) -> str:
        problem = service_name_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _check(self) -> Lane:
        if (self.gpu_memory_utilization is None) == (self.kv_cache_bytes is None):
            raise PathError("give exactly one of gpu_memory_utilization and kv_cache_bytes",
                            ("gpu_memory_utilization",))
        if len(set(self.gpus)) != len(self.gpus):
            raise PathError(f"GPU ids repeat: {self.gpus}", ("gpus",))
        if self.parallel is not None:
            head = self.parallel.pipeline[0]
            if head.machine != self.machine or head.gpus != self.gpus:
                raise PathError(f"stage 0 runs on the lane's own machine and GPUs (the head serves "
                                f"the API): expected machine {self.machine!r} gpus {self.gpus}, got "
                                f"{head.machine!r} {head.gpus}", ("parallel", "pipeline", 0))
            problem = service_name_problem(self.name, len(self.parallel.pipeline))
            if problem:
                raise PathError(problem, ("name",))
        return self

    @property
    def tensor_parallel_size(self) -> int:
        return len(self.gpus)


def longest_service_name(name: str, stages: int = 1) -> str:
    """The longest compose service name a lane of `stages` engines renders (`recipegen.render.lanes`
    builds each): the profile boot of its last stage, `lane-<name>-profile` on one machine,
    `lane-<name>-worker-<stages - 1>-profile` on a multi-node lane."""
    worker = f"{LANE_WORKER_SUFFIX}{stages - 1}" if stages > 1 else ""
    return f"{LANE_SERVICE_PREFIX}{name}{worker}{LANE_PROFILE_SUFFIX}"


def service_name_problem(name: str, stages: int = 1) -> str | None:
    """Why a lane named `name` with `stages` engines cannot be rendered, or None: its longest
    compose service name (`longest_service_name`) must be one DNS label. The name itself is shown
    only while it is short enough to be a name at all (a 5,000-character one is not echoed)."""
    length = len(longest_service_name(name, stages))
    over = length - DNS_LABEL_MAX_LENGTH
    if over <= 0:
        return None
    room = len(name) - over
    what = ("its count-only profile boot" if stages == 1 else
            f"the count-only profile boot of stage {stages - 1}, the last of its {stages} pipeline stages,")
    shown = f" (here {longest_service_name(name, stages)})" if len(name) <= NAME_MAX_LENGTH else ""
    why = (f"a compose service's name is its host name on the compose network, one DNS label of at "
           f"most {DNS_LABEL_MAX_LENGTH} characters (a longer one does not resolve)" if stages == 1 else
           f"a multi-node lane's engines use each machine's own network, where a service's name is no "
           f"host name, but its services keep the compose-network limit of one DNS label "
           f"({DNS_LABEL_MAX_LENGTH} characters) so that the lane renders alike on one machine or several")
    return (f"lane name of {len(name):,} characters: at most {room}, because its longest compose "
            f"service, {what} `{longest_service_name('<name>', stages)}`{shown}, would have {length:,} "
            f"characters, {over:,} too many: {why}; shorten the lane name by {over:,} "
            f"character{'s' if over > 1 else ''}")


def prior_classes(lane: Lane) -> list[str]:
    """The classes whose histograms the lane's adaptive policy reads as priors, in declared order."""
    adaptive = lane.offload.adaptive
    if adaptive is None:
        return []
    if adaptive.priors is None:
        return [name for name, cls in lane.classes.items() if cls.histogram]
    return list(adaptive.priors)
