"""The model: a MoE checkpoint's geometry and sizes."""

from __future__ import annotations

from fractions import Fraction
from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, field_validator, model_validator

from recipegen.schema.base import Bytes, PositiveBytes, ScaledNumber, StrictModel
from recipegen.schema.sourced import lift_sources
from recipegen.units import GiB

# Storage per logical element: (bits per value, values per scale block, bytes per scale).
DTYPE_STORAGE: dict[str, tuple[int, int, int]] = {
    "mxfp4": (4, 32, 1),   # OCP MX: fp4 e2m1 values packed 2 per byte, one ue8m0 scale per 32
    "nvfp4": (4, 16, 1),   # fp4 e2m1 values, one fp8 e4m3 scale per 16 (per-tensor scale ignored)
    "fp8": (8, 0, 0),
    "bf16": (16, 0, 0),
    "fp16": (16, 0, 0),
    "fp32": (32, 0, 0),
}
Dtype = Literal["mxfp4", "nvfp4", "fp8", "bf16", "fp16", "fp32"]


class ExpertTensor(StrictModel):
    """One weight tensor of a routed expert, as logical element counts."""

    name: str
    """Tensor name, e.g. `w13` (gate+up) or `w2` (down)."""
    shape: list[PositiveInt] = Field(min_length=1)
    """Logical element counts (values, not packed bytes), e.g. [4608, 5120]."""
    dtype: Dtype
    """Storage format; block-scaled formats add their scale bytes (mxfp4: 1 ue8m0 byte per 32 values)."""

    def num_bytes(self) -> Fraction:
        numel = 1
        for dim in self.shape:
            numel *= dim
        bits, block, scale_bytes = DTYPE_STORAGE[self.dtype]
        total = Fraction(numel * bits, 8)
        if block:
            total += -(-numel // block) * scale_bytes
        return total


class HostTable(StrictModel):
    """A table that lives in host memory for the whole run (e.g. an Engram table)."""

    name: str
    """What the table is."""
    bytes: PositiveBytes
    """Its size in host memory."""
    layer: NonNegativeInt | None = None
    """Decoder layer the table belongs to (DeepSeek-V4.1: `engram_layer_ids`); a pipeline stage holds
    the tables of its layers. Unknown: every stage of a multi-node lane counts it (conservative)."""


class Drafter(StrictModel):
    """The speculative-decoding drafter that ships with the checkpoint (DSpark, MTP, …)."""

    method: str
    """vLLM speculative method that runs it (e.g. `dspark`, `mtp`)."""
    weights: Bytes | None = None
    """Its weights in HBM, where known. Part of the measured HBM reserve, never added on top of it."""
    kv_bytes_per_token: Bytes | None = None
    """Its KV cache per token, where known (counted inside the measured KV rate otherwise)."""


class UniqueExperts(StrictModel):
    """Measured unique routed experts touched per layer per decode step."""

    streams: PositiveInt
    """Concurrent streams (batch size) the figure was measured at."""
    k: NonNegativeInt | None = None
    """Speculative tokens per step (None: not recorded / any)."""
    experts_per_layer: PositiveFloat
    """Unique experts touched per MoE layer per step."""


class PositionalOffloadMeasurement(StrictModel):
    """What vLLM's plain `--cpu-offload-gb` actually moved to host, measured on a boot."""

    cpu_offload: PositiveBytes
    """The `--cpu-offload-gb` budget of that boot (vLLM reads it as GiB)."""
    offloaded: PositiveBytes
    """Bytes the offloader reported moving (it walks dense parameters too)."""


class Model(StrictModel):
    """A MoE checkpoint: geometry, sizes, and the measured figures the ledger needs."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    """Catalog name (lowercase, `-`, `.`, `_`)."""
    description: str = ""
    """Free text."""
    architecture: str | None = None
    """vLLM architecture class (config.json `architectures[0]`)."""
    checkpoint: str | None = None
    """Checkpoint id (Hugging Face repo or path)."""
    revision: str | None = None
    """Checkpoint revision (commit); maps and histograms record it as provenance."""
    decoder_layers: PositiveInt
    """Total decoder layers."""
    moe_layers: list[NonNegativeInt] = Field(min_length=1)
    """Indices of the MoE decoder layers (`"0-39"` ranges accepted). DeepSeek-V4-style models may
    have hash-routed early layers that are not in this list."""
    routed_experts: PositiveInt
    """Routed experts per MoE layer."""
    top_k: PositiveInt
    """Routed experts picked per token per layer."""
    shared_experts: NonNegativeInt | None = None
    """Shared experts per MoE layer, where known (always in HBM; counted in the dense bytes)."""
    expert_tensors: list[ExpertTensor] | None = None
    """Per-expert tensors (logical shapes + dtype); bytes per expert is derived from them."""
    bytes_per_expert: PositiveBytes | None = None
    """Bytes of one routed expert (weights + scales). Derived from `expert_tensors` when omitted;
    when both are given they must agree."""
    dense_bytes: Bytes | None = None
    """Non-routed weights resident in HBM (attention, shared experts, embeddings)."""
    total_bytes: Bytes | None = None
    """Whole checkpoint size, for reference."""
    host_tables: list[HostTable] = []
    """Tables that always live in host memory (e.g. two Engram tables)."""
    kv_bytes_per_token: PositiveBytes | None = None
    """KV cache bytes per token (give this or `kv_tokens_per_gib`)."""
    kv_tokens_per_gib: ScaledNumber | None = None
    """KV tokens per GiB of pool, as measured (e.g. `0.518M`)."""
    drafter: Drafter | None = None
    """The bundled drafter, if any."""
    unique_experts: list[UniqueExperts] = []
    """Measured unique experts per layer per step, by streams and k."""
    positional_offload: list[PositionalOffloadMeasurement] = []
    """Measured results of vLLM's positional `--cpu-offload-gb` on this model."""
    positional_cold_pick_share: list[Annotated[float, Field(gt=0, lt=1)]] = []
    """Measured share of routed picks that land on host-resident experts under positional offload
    (each with its source; the seeds quote ~23% and 24%)."""
    sources: dict[str, str] = {}
    """Where each figure comes from, by field path (filled from `{value, source}` figures)."""

    @model_validator(mode="before")
    @classmethod
    def _split_sources(cls, data: Any) -> Any:
        return lift_sources(data)

    @field_validator("moe_layers", mode="before")
    @classmethod
    def _expand_ranges(cls, value: Any) -> Any:
        return expand_index_ranges(value)

    @model_validator(mode="after")
    def _check(self) -> "Model":
        from recipegen.schema.base import PathError
        if self.moe_layers != sorted(set(self.moe_layers)):
            raise PathError("MoE layer indices must be unique and ascending", ("moe_layers",))
        if self.moe_layers[-1] >= self.decoder_layers:
            raise PathError(f"MoE layer index {self.moe_layers[-1]} is outside the model's "
                            f"{self.decoder_layers} decoder layers", ("moe_layers",))
        if self.top_k > self.routed_experts:
            raise PathError(f"top_k {self.top_k} exceeds routed_experts {self.routed_experts}", ("top_k",))
        if self.expert_tensors is None and self.bytes_per_expert is None:
            raise PathError("give expert_tensors (shapes + dtype) or bytes_per_expert", ("bytes_per_expert",))
        if self.expert_tensors is not None:
            derived = sum((t.num_bytes() for t in self.expert_tensors), Fraction(0))
            if derived.denominator != 1:
                raise PathError(f"expert tensors give a fractional byte count ({float(derived)})",
                                ("expert_tensors",))
            if self.bytes_per_expert is not None and self.bytes_per_expert != int(derived):
                raise PathError(f"bytes_per_expert {self.bytes_per_expert} disagrees with the "
                                f"{int(derived)} bytes derived from expert_tensors", ("bytes_per_expert",))
            self.bytes_per_expert = int(derived)
        if (self.kv_bytes_per_token is None) == (self.kv_tokens_per_gib is None):
            raise PathError("give exactly one of kv_bytes_per_token and kv_tokens_per_gib",
                            ("kv_bytes_per_token",))
        return self

    # --- derived figures (the ledger cites these by name) ---
    @property
    def expert_bytes(self) -> int:
        """Bytes of one routed expert (declared or derived)."""
        assert self.bytes_per_expert is not None
        return self.bytes_per_expert

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layers)

    @property
    def kv_token_bytes(self) -> float:
        """KV bytes per token, from either declared form."""
        if self.kv_bytes_per_token is not None:
            return float(self.kv_bytes_per_token)
        assert self.kv_tokens_per_gib is not None
        return GiB / self.kv_tokens_per_gib

    @property
    def host_table_bytes(self) -> int:
        return sum(t.bytes for t in self.host_tables)


def expand_index_ranges(value: Any) -> Any:
    """`"0-39"`, `[0, "3-5"]` -> list of ints; other shapes pass through for pydantic to reject."""
    items = value if isinstance(value, list) else [value] if isinstance(value, str) else None
    if items is None:
        return value
    out: list[Any] = []
    for item in items:
        if isinstance(item, str):
            for part in item.split(","):
                part = part.strip()
                if "-" in part[1:]:
                    lo, hi = part.split("-", 1)
                    if not (lo.strip().isdigit() and hi.strip().isdigit()) or int(hi) < int(lo):
                        raise ValueError(f"cannot read layer range {part!r} (e.g. '0-39')")
                    out.extend(range(int(lo), int(hi) + 1))
                elif part.isdigit():
                    out.append(int(part))
                else:
                    raise ValueError(f"cannot read layer index {part!r}")
        else:
            out.append(item)
    return out
