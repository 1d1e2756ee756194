"""A measured decode step is quoted as a lane's only where it was measured on that lane: the same
split of the experts (the hot experts per layer of a usage-aware lane, the --cpu-offload-gb of a
positional one) and the traffic the lane runs (its active class on its own map). Before, the
reference's 24 ms positional step was quoted for any --cpu-offload-gb (a copy at 130 GiB printed
"24.47 ms = 102.0% of the measured 24 ms step"), and the usage-aware 14.6 ms step for another
class's traffic on the agent map."""

from __future__ import annotations

from pathlib import Path

import yaml

from recipegen.common.units import GiB
from recipegen.costmodel.lane import fetch_summary
from recipegen.costmodel.steps import STEP_TIMES, measured_step
from recipegen.load.recipe import load_recipe

OFF60 = "dsv41-flash-gb300-off60"


def _copy(project: Path, name: str, change: dict) -> str:
    doc = yaml.safe_load((project / "recipes" / f"{OFF60}.yaml").read_text())
    doc["name"] = name
    doc["lanes"][0]["offload"].update(change)
    (project / "recipes" / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return name


def _c1(recipe: str, traffic_class: str | None = None):
    summary = fetch_summary(load_recipe(recipe), "agent")
    cls = next(c for c in summary.classes if traffic_class in (None, c.traffic_class))
    return cls, cls.points[0]


def test_the_positional_step_is_quoted_at_its_own_offload_only(project: Path) -> None:
    _, c1 = _c1(OFF60)
    assert (c1.streams, c1.k) == (1, 5)
    assert c1.tax.share is not None and abs(c1.tax.share - c1.tax.fetch_ms / 24.0) < 1e-9
    _, c1 = _c1(_copy(project, "off130", {"load_cpu_offload": "130 GiB"}))
    assert c1.tax.fetch_ms > 20 and c1.tax.share is None          # 24.47 ms of reads, no step of this lane
    _, c1 = _c1(_copy(project, "off61", {"load_cpu_offload": "61 GiB"}))
    assert c1.tax.share is None


def test_the_usage_aware_step_is_the_active_class_on_its_own_map_only() -> None:
    summary = fetch_summary(load_recipe("dsv41-flash-gb300"), "agent")
    by_name = {c.traffic_class: c for c in summary.classes}
    assert abs(by_name["agent"].points[0].tax.share - by_name["agent"].points[0].tax.fetch_ms / 14.6) < 1e-9
    prose = by_name["prose"]
    assert prose.points[0].tax.share is None                      # prose on its own map: never measured
    assert prose.under_active_points[0].tax.share is None          # prose traffic on the agent map: neither
    assert prose.under_active_points[0].tax.fetch_ms > 5 * by_name["agent"].points[0].tax.fetch_ms
    text = "\n".join(summary.lines())
    assert text.count("of the measured 14.6 ms step") == 1


def test_every_step_names_the_split_it_was_measured_at() -> None:
    for step in STEP_TIMES:
        if step.placement == "positional":
            assert step.split == 60 * GiB and "--cpu-offload-gb 60" in step.source
        elif step.placement == "usage-aware":
            assert step.split == 295 and "295 hot" in step.source
    assert measured_step("dsv41-flash-mxfp4", "gb300-station", "usage-aware", 296, 1, 5) is None
    assert measured_step("dsv41-flash-mxfp4", "gb300-station", "positional", 60 * GiB, 1, 0).seconds == 0.0111


def test_a_machine_that_overrides_the_catalogs_rates_is_another_machine(project: Path) -> None:
    # the reference's step was measured on the catalog's GB300 (340 GB/s over C2C); an entry that
    # names it and declares a 100 GB/s link printed "38.07 ms = 158.6% of the measured 24 ms step"
    doc = yaml.safe_load((project / "recipes" / f"{OFF60}.yaml").read_text())
    doc["name"] = "slow"
    doc["machines"]["station"]["pinned_read_bandwidth"] = "100 GB/s"
    (project / "recipes" / "slow.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    _, c1 = _c1("slow")
    assert c1.tax.fetch_ms > 24 and c1.tax.share is None
    _, same = _c1(OFF60)
    assert same.tax.share is not None   # the catalog's own figures: the measured step is this lane's
