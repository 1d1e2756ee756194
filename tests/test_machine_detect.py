"""`recipegen machine detect`: the real parsing code driven through the NVML function-table seam by
a recorded reading (a DGX H100, transcribed from public `nvidia-smi -q` and deviceQuery recordings:
tests/fixtures/nvml/), every figure by hand; and doctor comparing the box with a recipe's machine."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from cli_support import invoke

from recipegen.catalog import catalog_entry
from recipegen.catalog.detect import RecordedNvml, detect, pcie_lane_bytes_per_s, read_mem_total, to_yaml
from recipegen.common.errors import InputError, RecipegenError
from recipegen.ops.doctor import FAIL, NVML_MODULE_FIX, OK, WARN, Facts, HostRequirement, evaluate
from recipegen.schema import Machine

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "nvml" / "dgx-h100-565.57.01.json"
MiB, GiB = 2**20, 2**30
MEMINFO = "MemTotal:       2113389552 kB\nMemFree:        2000000000 kB\nMemAvailable:   2050000000 kB\n"


def reading() -> dict:
    return json.loads(FIXTURE.read_text())


def test_dgx_h100_by_hand() -> None:
    found = detect(RecordedNvml(reading()), MEMINFO, host="dgx", date="2024-11-14")
    entry = found.entry
    machine = Machine.model_validate(entry)
    assert entry["detected"] == "dgx, 2024-11-14, NVML driver 565.57.01"
    assert machine.gpus.kind == "NVIDIA H100 80GB HBM3" and machine.gpus.count == 8
    assert machine.gpus.compute_capability == "9.0"
    assert machine.gpus.hbm == 81559 * MiB == 85_520_809_984            # nvidia-smi memory.total
    assert machine.gpus.usable == 85_045_477_376                         # CUDA's total (deviceQuery)
    assert machine.gpus.driver_reserved == 85_520_809_984 - 85_045_477_376
    # PCIe Gen5 x16: 16 lanes × 32 GT/s × 128/130 ÷ 8 bits, one direction
    assert machine.pinned_read_bandwidth == pytest.approx(16 * 32e9 * 128 / 130 / 8, rel=1e-4)
    assert entry["pinned_read_bandwidth"]["value"] == "63.02 GB/s"
    # HBM: 5,120-bit bus ÷ 8 × 2,619 MHz × 2 (double data rate) = 3.352 TB/s
    assert machine.gpus.hbm_bandwidth == pytest.approx(5120 / 8 * 2619e6 * 2, rel=1e-3)
    assert machine.host_memory == 2113389552 * 1024
    assert "detected on dgx, 2024-11-14" in entry["gpus"]["hbm"]["source"]
    # the file round-trips into a machine entry
    assert Machine.model_validate(yaml.safe_load(to_yaml(entry))) == machine


def test_without_cuda_the_v2_reserved_stands_in() -> None:
    data = reading()
    data["cuda_device_totals"] = None
    machine = Machine.model_validate(detect(RecordedNvml(data), MEMINFO, host="dgx").entry)
    assert machine.gpus.driver_reserved == 454 * MiB                     # nvmlDeviceGetMemoryInfo v2
    for dev in data["devices"]:
        dev["nvmlDeviceGetMemoryInfo_v2"] = None                         # a driver without the v2 call
    machine = Machine.model_validate(detect(RecordedNvml(data), MEMINFO, host="dgx").entry)
    assert machine.gpus.driver_reserved == 0 and machine.gpus.usable == 81559 * MiB


@pytest.mark.parametrize("gen, width, expect", [(4, 8, 8 * 16e9 * 128 / 130 / 8), (3, 16, 16 * 8e9 * 128 / 130 / 8),
                                                (2, 16, 16 * 5e9 * 0.8 / 8), (6, 16, 16 * 64e9 * 242 / 256 / 8)])
def test_pcie_generation_times_width(gen: int, width: int, expect: float) -> None:
    assert pcie_lane_bytes_per_s(gen) * width == pytest.approx(expect)
    data = reading()
    data["devices"] = [dict(d, nvmlDeviceGetMaxPcieLinkGeneration=gen, nvmlDeviceGetMaxPcieLinkWidth=width)
                       for d in data["devices"]]
    machine = Machine.model_validate(detect(RecordedNvml(data), MEMINFO, host="x").entry)
    assert machine.pinned_read_bandwidth == pytest.approx(expect, rel=1e-3)


def test_nvlink_c2c_instead_of_pcie() -> None:
    data = reading()
    data["devices"] = [dict(data["devices"][0], nvmlDeviceGetName="NVIDIA GH200 480GB",
                            nvmlDeviceGetC2cModeInfoV={"isC2cEnabled": 1})]
    data["cuda_device_totals"] = data["cuda_device_totals"][:1]
    found = detect(RecordedNvml(data), MEMINFO, host="gh")
    assert found.entry["pinned_read_bandwidth"]["value"] == "450 GB/s"
    assert "NVLink-C2C" in found.entry["pinned_read_bandwidth"]["source"]


def test_mixed_gpus_and_missing_figures() -> None:
    data = reading()
    data["devices"][7] = dict(data["devices"][7], nvmlDeviceGetName="NVIDIA A100-SXM4-80GB")
    found = detect(RecordedNvml(data), MEMINFO, host="x")
    assert found.entry["gpus"]["count"]["value"] == 7 and "A100" in found.notes[0]
    data = reading()
    data["devices"] = [dict(d, nvmlDeviceGetName="NVIDIA H200", nvmlDeviceGetMemoryBusWidth=None)
                       for d in data["devices"]]
    found = detect(RecordedNvml(data), MEMINFO, host="x")      # the catalog's H200 bandwidth stands in
    assert "not from NVML" in found.entry["gpus"]["hbm_bandwidth"]["source"]
    data["devices"] = [dict(d, nvmlDeviceGetMaxPcieLinkGeneration=None) for d in data["devices"]]
    found = detect(RecordedNvml(data), MEMINFO, host="x")      # no PCIe figures: the catalog's H200 link
    assert found.entry["pinned_read_bandwidth"]["value"] == "51 GB/s"
    assert "no PCIe generation / width from NVML" in found.entry["pinned_read_bandwidth"]["source"]
    data["devices"] = [dict(d, nvmlDeviceGetName="NVIDIA X9000") for d in data["devices"]]
    with pytest.raises(RecipegenError, match="write its HBM bandwidth"):
        detect(RecordedNvml(data), MEMINFO, host="x")


def test_meminfo() -> None:
    assert read_mem_total("MemTotal:       131981020 kB\n") == 131981020 * 1024
    with pytest.raises(InputError, match="MemTotal"):
        read_mem_total("nothing here\n")


def test_cli_without_nvidia_ml_py_says_how_to_get_it() -> None:
    try:
        import pynvml  # noqa: F401
        pytest.skip("nvidia-ml-py is installed here")
    except ImportError:
        pass
    result = invoke("machine", "detect")
    assert result.code == 2 and "pip install 'recipegen[nvml]'" in result.stderr


def test_a_detected_entry_serves_new_and_a_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = detect(RecordedNvml(reading()), MEMINFO, host="dgx", date="2024-11-14")
    machine_file = tmp_path / "dgx.yaml"
    machine_file.write_text(to_yaml(found.entry))
    monkeypatch.chdir(tmp_path)
    result = invoke("new", "deepseek-v3", "--machine", str(machine_file), "--name", "d")
    assert result.code == 0, result.output
    doc = yaml.safe_load((tmp_path / "recipes" / "d.yaml").read_text())
    assert doc["machines"]["dgx"]["detected"] == "dgx, 2024-11-14, NVML driver 565.57.01"
    result = invoke("check", "budgets", str(tmp_path / "recipes" / "d.yaml"))
    assert result.code == 0 and "79.20 GiB" in result.output        # 85,045,477,376 B: what CUDA sees


# ------------------------------------------------------------------ doctor

def _facts(detected: Machine | None, error: str = "") -> Facts:
    return Facts(daemon_ok=True, daemon_detail="engine", runtimes=["nvidia"], compose="2", memlock_soft=-1,
                 mem_available=400 * GiB, mem_total=494 * GiB, nvidia_smi=True, gpus=["0: H100"],
                 detected=detected, detected_summary="8 × NVIDIA H100 80GB HBM3", detect_error=error)


def _need(catalog: str) -> HostRequirement:
    return HostRequirement("r", host_bytes=GiB, pinned_bytes=GiB, gpus=1,
                           machine=Machine.model_validate(catalog_entry("machines", catalog)))


def _machine_check(facts: Facts, need: HostRequirement | None):
    return {c.name: c for c in evaluate(facts, need)}["machine"]


def test_doctor_compares_the_box_with_the_recipes_machine() -> None:
    box = Machine.model_validate(detect(RecordedNvml(reading()), MEMINFO, host="dgx").entry)
    assert _machine_check(_facts(box), _need("h100-sxm-x8")).status == OK
    # the catalog's H100 PCIe entry takes the SXM recording's 454 MiB reservation: HBM agrees, host memory not
    check = _machine_check(_facts(box), _need("h100-pcie"))
    assert check.status == WARN and "256.0 GiB of host memory" in check.detail
    # an entry without the driver's reservation overstates what CUDA sees: 81,559 MiB against 79.20 GiB
    entry = catalog_entry("machines", "h100-pcie")
    unreserved = {**entry, "gpus": {k: v for k, v in entry["gpus"].items() if k != "driver_reserved"}}
    need = HostRequirement("r", host_bytes=GiB, pinned_bytes=GiB, gpus=1, machine=Machine.model_validate(unreserved))
    check = _machine_check(_facts(box), need)
    assert check.status == FAIL and "CUDA sees 79.20 GiB here" in check.detail and "machine detect" in check.fix
    check = _machine_check(_facts(box), _need("rtx-4090"))
    assert check.status == FAIL and "RTX 4090" in check.detail and "compute capability 8.9" in check.detail
    assert _machine_check(_facts(box), None).status == OK
    unread = _facts(None, "reading the GPUs needs nvidia-ml-py")
    unread.detect_fix = NVML_MODULE_FIX       # what doctor sets when the import fails (tests/test_doctor_nvml_hint.py)
    check = _machine_check(unread, None)
    assert check.status == WARN and "recipegen[nvml]" in check.fix
    healthy = copy.copy(_facts(None))
    healthy.detect_error = ""
    assert "machine" not in {c.name for c in evaluate(healthy)}            # not attempted: no check


H200_FIXTURE = Path(__file__).resolve().parent / "fixtures" / "nvml" / "h200-580.159.04.json"
H200_MEMINFO = "MemTotal:       131961868 kB\nMemFree:        120000000 kB\n"


def test_an_h200_reading_recorded_by_detect_itself() -> None:
    """`recipegen machine detect --record` on one NVIDIA H200 (PCIe Gen5 x16, driver 580.159.04,
    2026-12-03): the same machine's torch reported `torch.cuda.mem_get_info()` total 150,109,880,320 B,
    and NVML v2 a reserved 644,939,776 B, beside the 143,771 MiB nvidia-smi shows."""
    machine = Machine.model_validate(detect(RecordedNvml(json.loads(H200_FIXTURE.read_text())), H200_MEMINFO,
                                            host="h200", date="2026-12-03").entry)
    assert machine.gpus.kind == "NVIDIA H200" and machine.gpus.count == 1
    assert machine.gpus.compute_capability == "9.0"
    assert machine.gpus.hbm == 143771 * MiB == 150_754_820_096
    assert machine.gpus.usable == 150_109_880_320                        # what torch saw on that machine
    assert machine.gpus.driver_reserved == 150_754_820_096 - 150_109_880_320 == 629_824 * 1024
    assert machine.pinned_read_bandwidth == pytest.approx(16 * 32e9 * 128 / 130 / 8, rel=1e-4)
    assert machine.gpus.hbm_bandwidth == pytest.approx(6016 / 8 * 3201e6 * 2, rel=1e-3)   # 4.814 TB/s
    assert machine.host_memory == 131961868 * 1024


# ------------------------------------------------------------------ NVML failures and the outputs

def test_a_required_call_that_fails_names_it() -> None:
    # NVML answers "not supported" (a raise) for the compute capability of GPU 3: no entry can be
    # written without it, and the refusal names the call and the GPU, exit 2
    broken = reading()
    broken["devices"][3]["nvmlDeviceGetCudaComputeCapability"] = None
    with pytest.raises(RecipegenError) as info:
        detect(RecordedNvml(broken), MEMINFO, host="dgx")
    assert info.value.exit_code == 2
    assert "nvmlDeviceGetCudaComputeCapability (GPU 3) failed" in str(info.value)


class _NoDriver(RecordedNvml):
    """NVML without the driver's library: pynvml raises NVMLError_LibraryNotFound from nvmlInit."""

    class LibraryNotFound(Exception):
        pass

    def nvmlInit(self) -> None:
        raise _NoDriver.LibraryNotFound("NVML Shared Library Not Found")


def _cli_with(monkeypatch: pytest.MonkeyPatch, table: RecordedNvml, *args: str):
    import recipegen.catalog.detect as module

    monkeypatch.setattr(module, "PynvmlTable", lambda: table)
    return invoke("machine", "detect", *args)


def test_cli_without_a_driver_is_a_clear_refusal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    result = _cli_with(monkeypatch, _NoDriver(reading()), "--record", str(tmp_path / "r.json"))
    assert result.code == 2, result.output
    assert "NVML: nvmlInit" in result.stderr and "NVML Shared Library Not Found" in result.stderr
    assert "Traceback" not in result.output and not (tmp_path / "r.json").exists()


def test_cli_outputs_are_checked_before_reading(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result = _cli_with(monkeypatch, RecordedNvml(reading()), "-o", str(fifo), "--force")
    assert result.code == 2 and "not a regular file" in result.stderr
    assert not fifo.is_file()
    # an existing machine file refused without --force: the recording is not written either
    existing = tmp_path / "box.yaml"
    existing.write_text("mine\n")
    result = _cli_with(monkeypatch, RecordedNvml(reading()), "-o", str(existing), "--record", str(tmp_path / "r.json"))
    assert result.code == 2 and "--force" in result.stderr
    assert existing.read_text() == "mine\n" and not (tmp_path / "r.json").exists()
    # with --force both are written
    result = _cli_with(monkeypatch, RecordedNvml(reading()), "-o", str(existing), "--record", str(tmp_path / "r.json"),
                       "--force")
    assert result.code == 0, result.output
    recorded = json.loads((tmp_path / "r.json").read_text())
    assert recorded["devices"] == reading()["devices"]           # the fixture's own _source note aside
    assert yaml.safe_load(existing.read_text())["gpus"]["count"]["value"] == 8


@pytest.mark.parametrize("name", ["H100\u0085x: y", "a\u0085\u0085b: c", "\u0085kind: x", "x\u2028y", "caf\u00e9"])
def test_a_gpu_name_reads_back_as_detected(name: str) -> None:
    # PyYAML folds a raw NEL inside a quoted scalar into a space or a line break on reading
    odd = reading()
    for device in odd["devices"]:
        device["nvmlDeviceGetName"] = name
    found = detect(RecordedNvml(odd), MEMINFO, host="dgx", date="2024-11-14")
    back = yaml.safe_load(to_yaml(found.entry))
    assert back == found.entry and back["gpus"]["kind"] == name
