"""The machine: a box with GPUs, host memory and the links between them."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from recipegen.schema.base import Bandwidth, Bytes, PathError, PositiveBytes, StrictModel
from recipegen.schema.patterns import COMPUTE_CAPABILITY, FILE_NAME
from recipegen.schema.sourced import lift_sources

# GPUs one host can hold: HGX and DGX boards carry 8 (DGX-2 16); a rack such as GB200 NVL72 is 18
# hosts of 4, each its own machine. The bound keeps a typo (or a hostile file) from sizing lists of
# billions of GPU ids.
MAX_GPUS_PER_MACHINE = 64
# A host name as DNS writes it (RFC 1123: dot-separated labels of letters, digits and inner hyphens, each
# at most 63 characters, 253 in all).
_HOST_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def is_host_address(text: str) -> bool:
    """Whether `text` is an IPv4 / IPv6 address or a host name: what a network can reach."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    if re.fullmatch(r"[0-9.]+", text):   # all digits and dots but not an IPv4 address (999.1.1.1)
        return False
    return 0 < len(text) <= 253 and all(_HOST_LABEL.match(label) for label in text.rstrip(".").split("."))


def address_refusal(text: str) -> str | None:
    """Why `text` cannot be a machine's `address`, or None when other machines can reach it there.

    Beyond `is_host_address`: an unspecified address (`0.0.0.0`, `::`) names no machine; an IPv6
    link-local one (`fe80::/10`) is reached only through an interface each peer names by a zone id
    of its own, while the address is copied to the other machines (the head's is every node's
    `--master-addr`); a zone id on any other address names an interface of this machine only.
    (IPv4 link-local, 169.254.0.0/16, needs no zone: two directly cabled boxes may use it.) A bracketed IP address is judged as
    the address inside, so the first refusal is the last."""
    shown = repr(text[:80])
    inner = text[1:-1] if text.startswith("[") and text.endswith("]") else None
    if inner is not None and _ip(inner) is not None:
        problem = _ip_problem(repr(inner[:80]), inner)
        return (f"{shown}: write the address without brackets (recipegen adds them where a URL needs "
                f"them){'; and ' + problem if problem else f': {inner}'}")
    if not is_host_address(text):
        return f"{shown} is neither an IP address nor a host name (letters, digits, hyphens and dots)"
    return _ip_problem(shown, text) if _ip(text) is not None else None


def _ip_problem(shown: str, text: str) -> str | None:
    ip = _ip(text)
    assert ip is not None
    mapped = getattr(ip, "ipv4_mapped", None)
    if ip.is_unspecified or (mapped is not None and mapped.is_unspecified):
        return (f"{shown} is the unspecified address, which names no machine: other machines (the "
                "multi-node peers, Prometheus, recipegen's HTTP calls) reach this machine at its "
                "address; give its own IP address or host name")
    if ip.version == 6 and ip.is_link_local:
        return (f"{shown} is an IPv6 link-local address: another machine reaches it only through an "
                "interface it names by a zone id of its own (fe80::1%eth0 on one box may be %enp1s0 on "
                "the next), while this address is copied to every machine of the lane and to "
                "Prometheus; give a global or unique-local address (such as fd00::1) or a host name")
    if getattr(ip, "scope_id", None):
        return (f"{shown} carries a zone id (%{ip.scope_id}), which names a network interface of one "
                "machine, while the address is copied to the other machines (the head's is every "
                f"node's --master-addr); this address needs none: write {text.split('%', 1)[0]}")
    return None


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


class GpuSpec(StrictModel):
    """The machine's GPUs (all of one kind)."""

    kind: str
    """GPU product, e.g. `GB300`, `H200 PCIe`."""
    count: int = Field(ge=1, le=MAX_GPUS_PER_MACHINE)
    """Number of GPUs of one host (at most 64); lanes name GPU ids 0..count-1."""
    compute_capability: str | None = Field(default=None, pattern=COMPUTE_CAPABILITY.regex)
    """CUDA compute capability, e.g. `10.3`."""
    hbm: PositiveBytes
    """GPU memory per GPU as the driver reports it (`nvidia-smi --query-gpu=memory.total`, NVML's
    total)."""
    driver_reserved: Bytes = Field(default=0, validate_default=False)
    """Of `hbm`, what the driver reserves for itself (NVML's `reserved`, `nvidia-smi -q`'s "FB Memory
    Usage: Reserved"), where known: CUDA sees `hbm` less this, and it is CUDA's total that vLLM's
    `--gpu-memory-utilization` multiplies (`recipegen machine detect` reads both)."""
    hbm_bandwidth: Bandwidth
    """HBM read bandwidth per GPU."""

    @model_validator(mode="after")
    def _check_reserved(self) -> GpuSpec:
        if self.driver_reserved >= self.hbm:
            raise PathError(f"driver_reserved ({self.driver_reserved:,} B) is not below hbm ({self.hbm:,} B)",
                            ("driver_reserved",))
        return self

    @property
    def usable(self) -> int:
        """What CUDA reports as the GPU's total memory: `hbm` less the driver's reserved part."""
        return self.hbm - self.driver_reserved


class Nvme(StrictModel):
    """Local NVMe storage (model files)."""

    capacity: PositiveBytes | None = None
    """Usable capacity."""
    read_bandwidth: Bandwidth
    """Sequential read bandwidth (the low end where a range is quoted)."""
    read_bandwidth_max: Bandwidth | None = None
    """High end of a quoted read-bandwidth range."""


class Machine(StrictModel):
    """A box: GPUs, host memory, GPU↔host link, NVMe, address."""

    name: str = Field(pattern=FILE_NAME.regex)
    """Catalog name."""
    description: str = ""
    """Free text."""
    gpus: GpuSpec
    """The GPUs."""
    host_memory: PositiveBytes
    """Host (CPU) memory visible to the OS."""
    pinned_read_bandwidth: Bandwidth
    """GPU read bandwidth from pinned host memory, in place (UVA/ATS) — what a cold expert costs."""
    nvme: Nvme | None = None
    """Local NVMe, where known."""
    address: str | None = None
    """Host name or IP the machine is reached at (Docker host, multi-node peers): an IPv4 or IPv6
    address (without brackets), or a host name of letters, digits, hyphens and dots. Not an
    unspecified address (`0.0.0.0`, `::`), which names no machine, no IPv6 link-local address
    (`fe80::…`, reached only through an interface each peer names itself), and no IPv6 zone id
    (`%eth0`), which names an interface of this machine only."""
    detected: str | None = None
    """Where and when `recipegen machine detect` read this entry (host, date, driver); absent for
    catalog and hand-written machines."""
    sources: dict[str, str] = {}
    """Where each figure comes from, by field path."""

    @model_validator(mode="before")
    @classmethod
    def _split_sources(cls, data: Any) -> Any:
        return lift_sources(data)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        # it reaches --master-addr, Prometheus targets and the ops HTTP calls: only what a network can reach
        problem = address_refusal(value) if value is not None else None
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _check(self) -> Machine:
        if self.nvme and self.nvme.read_bandwidth_max is not None \
                and self.nvme.read_bandwidth_max < self.nvme.read_bandwidth:
            raise PathError("read_bandwidth_max is below read_bandwidth", ("nvme", "read_bandwidth_max"))
        return self
