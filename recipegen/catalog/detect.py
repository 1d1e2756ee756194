"""`recipegen machine detect`: this box as a machine entry, read from the driver and the kernel.

- GPUs from NVML (`nvidia-ml-py`, the optional extra `nvml`): name, memory as the driver reports
  it (`nvmlDeviceGetMemoryInfo`: total, and the v2 call's `reserved`, which CUDA does not see),
  compute capability, the PCIe link's generation × width (the most the device and the slot
  negotiate, `nvmlDeviceGetMaxPcieLinkGeneration` / `...Width`), HBM bandwidth from the memory bus
  width and its maximum clock; where NVML says the GPU reaches the host over NVLink-C2C
  (`nvmlDeviceGetC2cModeInfoV`), the C2C link instead of PCIe.
- CUDA's own total per GPU (`cuDeviceTotalMem_v2` of the driver library, no context created),
  where libcuda loads: the figure vLLM's `--gpu-memory-utilization` multiplies.
- Host memory from `/proc/meminfo` (MemTotal).

Everything NVML and libcuda return passes through one seam, the function table `nvml` (the
`pynvml` module itself, or a recorded reading in the tests), so the parsing below is the code that
runs on the box. The entry is marked detected (`detected:` and every figure's source say where and
when) and validates as a `Machine` before it is written.
"""

from __future__ import annotations

import datetime as _dt
import re
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from recipegen.common.errors import InputError, RecipegenError, one_line
from recipegen.common.units import GiB, MiB
from recipegen.schema import Machine
from recipegen.schema.sourced import split_sources

# PCIe per-lane data rate, one direction, by generation: transfer rate (GT/s) × encoding
# efficiency ÷ 8 bits — 8b/10b for Gen1-2, 128b/130b for Gen3-5, and Gen6's FLIT mode (242
# payload bytes of every 256) — as the PCI Express Base Specification revisions 1.0-6.0 (PCI-SIG)
# define the generations: 2.5, 5, 8, 16, 32, 64 GT/s per lane.
PCIE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
PCIE_ENCODING = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}
PCIE_SOURCE = ("PCI Express Base Specification (PCI-SIG), revisions 1.0-6.0: 2.5/5/8/16/32/64 GT/s per lane, "
               "8b/10b encoding (Gen1-2), 128b/130b (Gen3-5), 242/256 FLIT payload (Gen6)")
# NVLink-C2C between a Grace CPU and its GPU: 900 GB/s both directions ("NVIDIA GH200 Grace Hopper
# Superchip" datasheet), 450 GB/s each way.
C2C_BYTES_PER_S = 450e9
C2C_SOURCE = "\"NVIDIA GH200 Grace Hopper Superchip\" datasheet: NVLink-C2C 900 GB/s both directions"
NVML_CLOCK_MEM = 2          # nvmlClockType_t NVML_CLOCK_MEM
NVML_MEMORY_V2 = 0x02000028  # nvmlMemory_v2: (sizeof(nvmlMemory_v2_t) = 40) | (2 << 24)


def pcie_lane_bytes_per_s(generation: int) -> float:
    """One lane, one direction, in bytes per second."""
    return PCIE_GTS[generation] * 1e9 * PCIE_ENCODING[generation] / 8


@dataclass
class GpuReading:
    """What the driver says about one GPU."""

    index: int
    name: str
    total: int                   # NVML total (nvidia-smi memory.total), bytes
    reserved: int | None         # NVML v2 reserved, bytes (None: the v1 call only)
    cuda_total: int | None       # cuDeviceTotalMem_v2, bytes
    compute_capability: str
    pcie_generation: int | None
    pcie_width: int | None
    c2c: bool
    memory_bus_width: int | None  # bits
    max_memory_clock_mhz: int | None


@dataclass
class Detection:
    """The readings and the machine entry built from them."""

    host: str
    date: str
    driver: str
    gpus: list[GpuReading]
    mem_total: int
    entry: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        gpus = self.entry["gpus"]
        return (f"{gpus['count']['value']} × {gpus['kind']}, {gpus['hbm']['value']} each"
                + (f" ({gpus['driver_reserved']['value']} reserved by the driver)" if "driver_reserved" in gpus else "")
                + f", host {self.entry['host_memory']['value']}, link {self.entry['pinned_read_bandwidth']['value']}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception:  # NVML_ERROR_NOT_SUPPORTED and friends: the figure is not known
        return None


class NvmlCallError(RecipegenError):
    """An NVML call failed (nvmlInit first of all): the driver's library is missing, not loaded or
    answers nothing. Its other refusals (no GPU listed, a figure NVML does not give) come from a
    working NVML and are `RecipegenError`s."""


def _required(what: str, call: Callable[[], Any]) -> Any:
    """A call whose figure the entry cannot do without: its failure (pynvml's NVMLError, which is no
    OSError) becomes a refusal naming the call, not a traceback."""
    try:
        return call()
    except Exception as exc:
        reason = one_line(str(exc)) or type(exc).__name__
        raise NvmlCallError(f"NVML: {what} failed ({reason}). `nvidia-smi` should work on this host first: "
                             "is the NVIDIA driver installed and loaded? Or write the machine file by hand "
                             "(docs/fit.md, `recipegen machine detect`)", exit_code=2) from None


@contextmanager
def _nvml_session(nvml: Any) -> Iterator[None]:
    """nvmlInit, then nvmlShutdown however the reading ends (its own failure does not hide the first)."""
    _required("nvmlInit (loading the driver's NVML library)", nvml.nvmlInit)
    try:
        yield
    finally:
        _optional(nvml.nvmlShutdown)


def read_gpus(nvml: Any) -> tuple[str, list[GpuReading]]:
    """The driver version and every GPU, through the NVML function table `nvml`."""
    with _nvml_session(nvml):
        driver = _text(_required("nvmlSystemGetDriverVersion", nvml.nvmlSystemGetDriverVersion))
        cuda = _optional(lambda: nvml.cuda_device_totals())
        out = []
        for i in range(int(_required("nvmlDeviceGetCount", nvml.nvmlDeviceGetCount))):
            h = _required(f"nvmlDeviceGetHandleByIndex({i})", lambda i=i: nvml.nvmlDeviceGetHandleByIndex(i))
            v1 = _required(f"nvmlDeviceGetMemoryInfo (GPU {i})", lambda h=h: nvml.nvmlDeviceGetMemoryInfo(h))
            v2 = _optional(lambda h=h: nvml.nvmlDeviceGetMemoryInfo(h, version=NVML_MEMORY_V2))
            major, minor = _required(f"nvmlDeviceGetCudaComputeCapability (GPU {i})",
                                     lambda h=h: nvml.nvmlDeviceGetCudaComputeCapability(h))
            c2c = _optional(lambda h=h: nvml.nvmlDeviceGetC2cModeInfoV(h))
            out.append(GpuReading(
                i, _text(_required(f"nvmlDeviceGetName (GPU {i})", lambda h=h: nvml.nvmlDeviceGetName(h))), int(v1.total), int(v2.reserved) if v2 is not None else None,
                int(cuda[i]) if cuda is not None and i < len(cuda) else None, f"{major}.{minor}",
                _optional(lambda h=h: int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(h))),
                _optional(lambda h=h: int(nvml.nvmlDeviceGetMaxPcieLinkWidth(h))),
                bool(getattr(c2c, "isC2cEnabled", 0)),
                _optional(lambda h=h: int(nvml.nvmlDeviceGetMemoryBusWidth(h))),
                _optional(lambda h=h: int(nvml.nvmlDeviceGetMaxClockInfo(h, NVML_CLOCK_MEM)))))
        return driver, out


def read_mem_total(text: str) -> int:
    """MemTotal of a /proc/meminfo text, in bytes."""
    match = re.search(r"^MemTotal:\s+(\d+) kB$", text, flags=re.MULTILINE)
    if match is None:
        raise InputError("no `MemTotal: N kB` line", file="/proc/meminfo")
    return int(match.group(1)) * 1024


def _size(n: int) -> str:
    """A byte count as the shortest exact unit."""
    for unit, factor in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n % factor == 0:
            return f"{n // factor} {unit}"
    return f"{n} B"


def machine_entry(name: str, host: str, date: str, driver: str, gpus: list[GpuReading], mem_total: int,
                  *, fallback_bandwidth: Callable[[str], tuple[str, str] | None] | None = None,
                  fallback_link: Callable[[str], tuple[str, str] | None] | None = None
                  ) -> tuple[dict[str, Any], list[str]]:
    """The catalog-style entry (every figure `{value, source}`) for GPUs of the first GPU's kind."""
    if not gpus:
        raise RecipegenError("NVML lists no GPU on this machine")
    notes: list[str] = []
    first = gpus[0]
    same = [g for g in gpus if g.name == first.name]
    if len(same) < len(gpus):
        others = sorted({g.name for g in gpus if g.name != first.name})
        notes.append(f"GPUs of another kind left out (a machine entry has one kind): {', '.join(others)}")
    where = f"detected on {host}, {date}"
    nv = f"{where}, NVML (driver {driver})"
    total = min(g.total for g in same)
    gpu: dict[str, Any] = {
        "kind": first.name,
        "count": {"value": len(same), "source": f"{nv}: nvmlDeviceGetCount / nvmlDeviceGetName"},
        "compute_capability": {"value": first.compute_capability,
                               "source": f"{nv}: nvmlDeviceGetCudaComputeCapability"},
        "hbm": {"value": _size(total), "source": f"{nv}: nvmlDeviceGetMemoryInfo total (nvidia-smi memory.total)"},
    }
    reserved = _reserved(same)
    if reserved is not None and reserved[0] > 0:
        value, how = reserved
        gpu["driver_reserved"] = {"value": _size(value), "source": f"{where}, {how}"}
    bandwidth = _hbm_bandwidth(first)
    if bandwidth is None and fallback_bandwidth is not None:
        bandwidth = fallback_bandwidth(first.name)
    if bandwidth is None:
        raise RecipegenError(f"NVML gives no memory bus width or clock for {first.name}: write its HBM bandwidth "
                             "into the entry by hand (gpus.hbm_bandwidth)")
    gpu["hbm_bandwidth"] = {"value": bandwidth[0], "source": f"{nv}: {bandwidth[1]}"}
    entry: dict[str, Any] = {
        "name": name,
        "description": f"{len(same)} × {first.name}, detected by `recipegen machine detect` on {host}, {date}",
        "detected": f"{host}, {date}, NVML driver {driver}",
        "gpus": gpu,
        "host_memory": {"value": _size(mem_total), "source": f"{where}, /proc/meminfo MemTotal "
                                                              f"({mem_total // 1024} kB = {mem_total / GiB:.1f} GiB)"},
        "pinned_read_bandwidth": _link(first, nv, fallback_link),
    }
    return entry, notes


def _reserved(gpus: list[GpuReading]) -> tuple[int, str] | None:
    """The driver's reserved part: CUDA's view where libcuda answered, else NVML's v2 `reserved`."""
    if all(g.cuda_total is not None for g in gpus):
        diff = max(g.total - int(g.cuda_total or 0) for g in gpus)
        return diff, ("NVML total less CUDA's total (cuDeviceTotalMem_v2: "
                      f"{min(int(g.cuda_total or 0) for g in gpus):,} B, what vLLM's --gpu-memory-utilization multiplies)")
    if all(g.reserved is not None for g in gpus):
        return max(int(g.reserved or 0) for g in gpus), "NVML nvmlDeviceGetMemoryInfo v2 reserved"
    return None


def _hbm_bandwidth(g: GpuReading) -> tuple[str, str] | None:
    if not g.memory_bus_width or not g.max_memory_clock_mhz:
        return None
    bps = g.memory_bus_width / 8 * g.max_memory_clock_mhz * 1e6 * 2
    return (f"{bps / 1e9:.0f} GB/s", f"memory bus {g.memory_bus_width} bits / 8 × max memory clock "
            f"{g.max_memory_clock_mhz} MHz × 2 (double data rate) = {bps / 1e12:.3f} TB/s "
            "(nvmlDeviceGetMemoryBusWidth, nvmlDeviceGetMaxClockInfo NVML_CLOCK_MEM)")


def _link(g: GpuReading, nv: str, fallback: Callable[[str], tuple[str, str] | None] | None = None) -> dict[str, Any]:
    if g.c2c:
        return {"value": f"{C2C_BYTES_PER_S / 1e9:.0f} GB/s",
                "source": f"{nv}: nvmlDeviceGetC2cModeInfoV: NVLink-C2C enabled; {C2C_SOURCE}, 450 GB/s each way; "
                          "reads in place achieve less"}
    if not g.pcie_generation or not g.pcie_width or g.pcie_generation not in PCIE_GTS:
        known = fallback(g.name) if fallback is not None else None
        if known is not None:
            return {"value": known[0], "source": f"{nv}: no PCIe generation / width from NVML; {known[1]}"}
        raise RecipegenError(f"NVML gives no PCIe link generation / width for {g.name}: write the host link's "
                             "read bandwidth into the entry by hand (pinned_read_bandwidth)")
    lane = pcie_lane_bytes_per_s(g.pcie_generation)
    total = lane * g.pcie_width
    return {"value": f"{total / 1e9:.2f} GB/s",
            "source": f"{nv}: PCIe Gen{g.pcie_generation} x{g.pcie_width} (nvmlDeviceGetMaxPcieLinkGeneration / Width: "
                      f"the most device and slot negotiate) × {lane / 1e9:.4f} GB/s per lane per direction "
                      f"({PCIE_GTS[g.pcie_generation]:g} GT/s × {PCIE_ENCODING[g.pcie_generation]:.4f} ÷ 8; "
                      f"{PCIE_SOURCE}); reads in place achieve less (51.2 GB/s of 63.0 measured on one NVIDIA H200 "
                      "over PCIe Gen5 x16, 2026-11-29, `python3 bench/gpu_residency.py`)"}


def _catalog_figure(kind: str, pick: Callable[[dict[str, Any]], Any]) -> tuple[str, str] | None:
    """A figure of the first catalog machine whose GPU kind names this GPU."""
    from recipegen.catalog import load_catalog

    wanted = kind.lower().replace("nvidia", "").replace("geforce", "").strip()
    for entry in load_catalog("machines").values():
        their = str((entry.get("gpus") or {}).get("kind", "")).lower()
        if their and (their in wanted or wanted in their):
            figure = pick(entry) or {}
            return (str(figure.get("value")),
                    f"not from NVML: the catalog's {entry['name']} figure ({figure.get('source')})")
    return None


def catalog_bandwidth(kind: str) -> tuple[str, str] | None:
    """A catalog machine's HBM bandwidth for a GPU of this name, when NVML gives none."""
    return _catalog_figure(kind, lambda e: (e.get("gpus") or {}).get("hbm_bandwidth"))


def catalog_link(kind: str) -> tuple[str, str] | None:
    """A catalog machine's host-link read bandwidth for a GPU of this name, when NVML gives no
    PCIe generation or width (a virtualised driver may not answer)."""
    return _catalog_figure(kind, lambda e: e.get("pinned_read_bandwidth"))


def entry_name(host: str) -> str:
    base = re.sub(r"[^a-z0-9._-]+", "-", host.lower()).strip("-._")
    return base or "this-machine"


def detect(nvml: Any, meminfo: str, *, host: str | None = None, date: str | None = None,
           name: str | None = None) -> Detection:
    """Read the box through `nvml` and the /proc/meminfo text; the validated entry."""
    host = host or socket.gethostname()
    date = date or _dt.date.today().isoformat()
    driver, gpus = read_gpus(nvml)
    mem_total = read_mem_total(meminfo)
    entry, notes = machine_entry(name or entry_name(host), host, date, driver, gpus, mem_total,
                                 fallback_bandwidth=catalog_bandwidth, fallback_link=catalog_link)
    validate_entry(entry, "the detected entry")
    return Detection(host, date, driver, gpus, mem_total, entry, notes)


def validate_entry(entry: dict[str, Any], where: str) -> Machine:
    try:
        return Machine.model_validate(entry)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise InputError(f"{first['msg']}", file=where, field=".".join(str(p) for p in first["loc"])) from None


def to_yaml(entry: dict[str, Any]) -> str:
    head = ("# A machine entry written by `recipegen machine detect`: every figure says where and when it was\n"
            "# read. A recipe takes it inline under `machines:`, or `recipegen new MODEL --machine THIS_FILE`.\n")
    return head + yaml.dump(entry, Dumper=_EntryDumper, sort_keys=False, allow_unicode=True, width=110)


class _EntryDumper(yaml.SafeDumper):
    """PyYAML writes NEL (U+0085) raw inside a plain or single-quoted scalar and reads it back as a
    line break or a space, so a GPU or host name holding one would not read back as detected: such
    strings (and U+2028 / U+2029) are written double-quoted, where they are escapes."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = '"' if any(c in text for c in "\x85\u2028\u2029") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_EntryDumper.add_representer(str, _represent_str)


def plain_figures(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry with `{value, source}` figures as their values."""
    return split_sources(entry)[0]


class PynvmlTable:
    """The real function table: the `pynvml` module (nvidia-ml-py) plus CUDA's per-device totals
    from the driver library through ctypes (cuInit, cuDeviceGetCount, cuDeviceGet,
    cuDeviceTotalMem_v2: no context is created). Device order: CUDA_DEVICE_ORDER=PCI_BUS_ID is
    set so CUDA numbers the GPUs as NVML does."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise RecipegenError("reading the GPUs needs nvidia-ml-py: pip install 'recipegen[nvml]'",
                                 exit_code=2) from None
        self._nvml = pynvml

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nvml, name)

    def cuda_device_totals(self) -> list[int] | None:
        import ctypes
        import os

        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        try:
            cuda = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return None
        if cuda.cuInit(0) != 0:
            return None
        count = ctypes.c_int()
        if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return None
        totals = []
        for i in range(count.value):
            dev, size = ctypes.c_int(), ctypes.c_size_t()
            if cuda.cuDeviceGet(ctypes.byref(dev), i) != 0 or \
                    cuda.cuDeviceTotalMem_v2(ctypes.byref(size), dev) != 0:
                return None
            totals.append(int(size.value))
        return totals


def record(nvml: Any) -> dict[str, Any]:
    """The raw values of every NVML call `read_gpus` makes, as a fixture (`--record FILE`)."""
    with _nvml_session(nvml):
        out: dict[str, Any] = {
            "nvmlSystemGetDriverVersion": _text(_required("nvmlSystemGetDriverVersion",
                                                          nvml.nvmlSystemGetDriverVersion)),
            "cuda_device_totals": _optional(lambda: nvml.cuda_device_totals()), "devices": []}
        for i in range(int(_required("nvmlDeviceGetCount", nvml.nvmlDeviceGetCount))):
            h = _required(f"nvmlDeviceGetHandleByIndex({i})", lambda i=i: nvml.nvmlDeviceGetHandleByIndex(i))
            v1 = _required(f"nvmlDeviceGetMemoryInfo (GPU {i})", lambda h=h: nvml.nvmlDeviceGetMemoryInfo(h))
            v2 = _optional(lambda h=h: nvml.nvmlDeviceGetMemoryInfo(h, version=NVML_MEMORY_V2))
            c2c = _optional(lambda h=h: nvml.nvmlDeviceGetC2cModeInfoV(h))
            out["devices"].append({
                "nvmlDeviceGetName": _text(_required(f"nvmlDeviceGetName (GPU {i})",
                                                     lambda h=h: nvml.nvmlDeviceGetName(h))),
                "nvmlDeviceGetMemoryInfo": {"total": int(v1.total), "free": int(v1.free), "used": int(v1.used)},
                "nvmlDeviceGetMemoryInfo_v2": (None if v2 is None else {
                    "total": int(v2.total), "reserved": int(v2.reserved), "free": int(v2.free), "used": int(v2.used)}),
                "nvmlDeviceGetCudaComputeCapability": list(_required(
                    f"nvmlDeviceGetCudaComputeCapability (GPU {i})", lambda h=h: nvml.nvmlDeviceGetCudaComputeCapability(h))),
                "nvmlDeviceGetMaxPcieLinkGeneration": _optional(lambda h=h: int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(h))),
                "nvmlDeviceGetMaxPcieLinkWidth": _optional(lambda h=h: int(nvml.nvmlDeviceGetMaxPcieLinkWidth(h))),
                "nvmlDeviceGetC2cModeInfoV": None if c2c is None else {"isC2cEnabled": int(c2c.isC2cEnabled)},
                "nvmlDeviceGetMemoryBusWidth": _optional(lambda h=h: int(nvml.nvmlDeviceGetMemoryBusWidth(h))),
                "nvmlDeviceGetMaxClockInfo_mem": _optional(lambda h=h: int(nvml.nvmlDeviceGetMaxClockInfo(h, NVML_CLOCK_MEM))),
            })
        return out


class RecordedNvml:
    """An NVML function table that answers from a recorded reading (`record`'s output): the
    calls `read_gpus` makes, with the values the driver gave. A call the reading has no value
    for raises, as NVML does for what a GPU does not support."""

    class NotSupported(Exception):
        pass

    def __init__(self, reading: dict[str, Any]) -> None:
        self.reading = reading

    @staticmethod
    def _struct(values: dict[str, Any] | None) -> Any:
        if values is None:
            raise RecordedNvml.NotSupported()
        return type("Struct", (), dict(values))()

    def _dev(self, handle: int) -> dict[str, Any]:
        return self.reading["devices"][handle]

    def _value(self, handle: int, key: str) -> Any:
        value = self._dev(handle).get(key)
        if value is None:
            raise RecordedNvml.NotSupported(key)
        return value

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.reading["nvmlSystemGetDriverVersion"]

    def cuda_device_totals(self) -> list[int] | None:
        return self.reading.get("cuda_device_totals")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.reading["devices"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, h: int) -> str:
        return self._value(h, "nvmlDeviceGetName")

    def nvmlDeviceGetMemoryInfo(self, h: int, version: int | None = None) -> Any:
        return self._struct(self._dev(h).get("nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo"))

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        major, minor = self._value(h, "nvmlDeviceGetCudaComputeCapability")
        return int(major), int(minor)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._value(h, "nvmlDeviceGetMaxPcieLinkGeneration")

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._value(h, "nvmlDeviceGetMaxPcieLinkWidth")

    def nvmlDeviceGetC2cModeInfoV(self, h: int) -> Any:
        return self._struct(self._dev(h).get("nvmlDeviceGetC2cModeInfoV"))

    def nvmlDeviceGetMemoryBusWidth(self, h: int) -> int:
        return self._value(h, "nvmlDeviceGetMemoryBusWidth")

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        assert clock == NVML_CLOCK_MEM
        return self._value(h, "nvmlDeviceGetMaxClockInfo_mem")


def gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


__all__ = ["Detection", "GpuReading", "PynvmlTable", "RecordedNvml", "detect", "machine_entry",
           "pcie_lane_bytes_per_s", "record", "to_yaml"]
