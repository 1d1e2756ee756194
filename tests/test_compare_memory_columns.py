"""`compare`'s GPU and host memory: the text column is the memory per GPU CUDA can allocate (the
driver's total less its reserve), now said under the table, and `--json` carries the same figures
(it had the GPU count and kind only); `machine list` gives both the driver's total and what CUDA
allocates, so the two lists no longer show two unlabelled figures for one card."""

from __future__ import annotations

import json

from cli_support import invoke

from recipegen.catalog import catalog_entry
from recipegen.common.units import GiB
from recipegen.schema import Machine


def test_compare_json_carries_the_memory_the_table_shows(project) -> None:
    result = invoke("compare", "qwen3-30b-a3b-rtx4090", "--machines", "h200-pcie,rtx-4090", "--json")
    assert result.code == 0, result.output
    rows = {r["machine"]: r for r in json.loads(result.stdout)["machines"]}
    for name in ("h200-pcie", "rtx-4090"):
        machine = Machine.model_validate(catalog_entry("machines", name))
        assert rows[name]["gpu_memory_bytes"] == machine.gpus.hbm
        assert rows[name]["gpu_memory_allocatable_bytes"] == machine.gpus.hbm - machine.gpus.driver_reserved
        assert rows[name]["host_memory_bytes"] == machine.host_memory
    text = invoke("compare", "qwen3-30b-a3b-rtx4090", "--machines", "h200-pcie,rtx-4090").stdout
    usable = rows["rtx-4090"]["gpu_memory_allocatable_bytes"] / GiB
    assert f"1 × RTX 4090 {usable:,.1f} GiB" in text
    assert "GPUs: count × kind and the memory per GPU CUDA can allocate" in text
    assert rows["rtx-4090"]["driver_reserve_known"] is True


def test_compare_marks_what_the_catalog_assumes(project) -> None:
    # the H200 NVL's host memory is the catalog's assumption and its reserve unknown (machine list
    # says "(assumed)" and gives no CUDA figure); compare said neither
    machine = Machine.model_validate(catalog_entry("machines", "h200-nvl"))
    assert machine.sources["host_memory"].startswith("assumed") and not machine.gpus.driver_reserved
    result = invoke("compare", "qwen3-30b-a3b-rtx4090", "--machines", "h200-nvl", "--json")
    (row,) = json.loads(result.stdout)["machines"]
    assert row["host_memory_assumed"] is True and row["driver_reserve_known"] is False
    text = invoke("compare", "qwen3-30b-a3b-rtx4090", "--machines", "h200-nvl").stdout
    assert f"{machine.host_memory / GiB:,.0f} GiB (assumed)" in text


def test_machine_list_names_both_figures_where_the_reserve_is_known() -> None:
    lines = {line.split()[0]: line for line in invoke("machine", "list").stdout.splitlines() if line.strip()}
    h100 = Machine.model_validate(catalog_entry("machines", "h100-sxm-x8"))
    assert h100.gpus.driver_reserved > 0
    assert (f"{h100.gpus.hbm / GiB:,.2f} GiB GPU memory each (CUDA allocates {h100.gpus.usable / GiB:,.2f} GiB)"
            in lines["h100-sxm-x8"])
    station = Machine.model_validate(catalog_entry("machines", "gb300-station"))
    assert station.gpus.driver_reserved == 0 and "CUDA allocates" not in lines["gb300-station"]
