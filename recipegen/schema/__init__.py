"""The recipe language: pydantic models (unknown fields rejected, every field documented)."""

from recipegen.schema.base import Bandwidth, Bytes, PathError, PositiveBytes, StrictModel, TokenCount
from recipegen.schema.lane import (
    Acceptance,
    Concurrency,
    HbmReserve,
    HbmReserveMeasurement,
    HostReserve,
    HostReserveMeasurement,
    Lane,
    Offload,
    Reserves,
    Speculative,
    TrafficClass,
)
from recipegen.schema.machine import GpuSpec, Machine, Nvme
from recipegen.schema.model import Drafter, ExpertTensor, HostTable, Model, UniqueExperts
from recipegen.schema.recipe import SCHEMA_VERSION, MachineEntry, Recipe

__all__ = [
    "Bandwidth", "Bytes", "PathError", "PositiveBytes", "StrictModel", "TokenCount",
    "Concurrency", "HbmReserve", "HbmReserveMeasurement", "HostReserve", "HostReserveMeasurement",
    "Acceptance", "Lane", "Offload", "Reserves", "Speculative", "TrafficClass",
    "GpuSpec", "Machine", "Nvme",
    "Drafter", "ExpertTensor", "HostTable", "Model", "UniqueExperts",
    "SCHEMA_VERSION", "MachineEntry", "Recipe",
]
