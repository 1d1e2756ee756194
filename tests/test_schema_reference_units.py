"""docs/recipe-reference.md says what the loader does: a field's type cell names a unit (size,
bandwidth) exactly when the loader refuses a bare number there, as the JSON Schema does, and every
default is written as recipe YAML that the loader reads back as that default.

What the loader does is found by validating values through each model's own validator
(`validate_assignment` on the field), not from the code that writes the page."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import invoke
from pydantic import BaseModel, ValidationError

from recipegen.catalog import catalog_names
from recipegen.schema.base import reachable_models
from recipegen.schema.export import recipe_reference_markdown
from recipegen.schema.recipe import Recipe

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "recipe-reference.md"
MODELS = {m.__name__: m for m in reachable_models(Recipe)}
BARE_NUMBERS = (1, 64, 4096, 0.5, 2.5)
_MISSING = object()


def _validate(model: type[BaseModel], name: str, value: Any) -> tuple[bool, Any]:
    """(whether the model's validator refuses `value` for field `name`, the validated value).
    Cross-field checks of a half-built object may fail after the field itself passed; only errors
    located at the field count."""
    inst = model.model_construct()
    inst.__dict__.pop(name, None)
    try:
        model.__pydantic_validator__.validate_assignment(inst, name, value)
    except ValidationError as e:
        if any(err["loc"][:1] == (name,) for err in e.errors()):
            return True, _MISSING
    except Exception:  # noqa: BLE001 - a model-level check tripping over the half-built object
        pass
    return False, inst.__dict__.get(name, _MISSING)


def _loader_unit(model: type[BaseModel], name: str) -> str | None:
    """"size" / "bandwidth" where the loader refuses every bare number and any text but a
    quantity in that unit."""
    if not all(_validate(model, name, n)[0] for n in BARE_NUMBERS) or not _validate(model, name, "some words")[0]:
        return None
    takes = {unit for unit, example in (("size", "1 GiB"), ("bandwidth", "1 GB/s"))
             if not _validate(model, name, example)[0]}
    return takes.pop() if len(takes) == 1 else None


def _cell_unit(cell: str) -> str | None:
    for unit in ("size", "bandwidth"):
        if cell.startswith(f"{unit} (") or f" or {unit} (" in cell:
            return unit
    return None


def _rows(text: str) -> dict[tuple[str, str], tuple[str, str]]:
    """{(model, field): (type cell, required/default cell)} of the reference's tables."""
    rows: dict[tuple[str, str], tuple[str, str]] = {}
    model = ""
    for line in text.splitlines():
        if line.startswith("## "):
            model = line[3:].strip()
        elif line.startswith("| `") and model:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows[(model, cells[0].strip("`"))] = (cells[1], cells[2])
    return rows


@pytest.fixture(scope="module", params=["committed", "generated"])
def rows(request: pytest.FixtureRequest) -> dict[tuple[str, str], tuple[str, str]]:
    text = REFERENCE.read_text(encoding="utf-8") if request.param == "committed" else \
        recipe_reference_markdown(catalog_names)
    found = _rows(text)
    expected = {(m.__name__, f) for m in MODELS.values() for f in m.model_fields}
    assert set(found) == expected
    return found


def test_a_field_names_its_unit_exactly_when_the_loader_needs_one(rows: dict) -> None:
    wrong = []
    units = {}
    for (model, field), (type_cell, _) in rows.items():
        want = _loader_unit(MODELS[model], field)
        units[(model, field)] = want
        if _cell_unit(type_cell) != want:
            wrong.append(f"{model}.{field}: the reference says {type_cell!r}; the loader wants {want or 'a bare number or other'}")
    assert not wrong, "\n".join(wrong)
    # the check has teeth: the loader wants a unit on many fields, both kinds, optional or not
    assert sum(1 for u in units.values() if u == "size") >= 20
    assert sum(1 for u in units.values() if u == "bandwidth") >= 4
    for key in (("Machine", "host_memory"), ("GpuSpec", "hbm"), ("GpuSpec", "driver_reserved"),
                ("DenseTensorParallel", "kv_projections"), ("PositionalOffloadMeasurement", "cpu_offload"),
                ("Nvme", "capacity"), ("Offload", "load_cpu_offload")):
        assert units[key] == "size", key
    for key in (("GpuSpec", "hbm_bandwidth"), ("Machine", "pinned_read_bandwidth"), ("Nvme", "read_bandwidth")):
        assert units[key] == "bandwidth", key


def _json_unit(prop: dict[str, Any]) -> str | None:
    options = prop.get("anyOf", [prop])
    found = {("bandwidth" if ")/s" in o["pattern"] else "size")
             for o in options if o.get("type") == "string" and "GiB" in o.get("pattern", "")}
    return found.pop() if len(found) == 1 else None


def test_the_reference_and_the_json_schema_agree_on_units(rows: dict) -> None:
    result = invoke("schema")
    assert result.code == 0, result.output
    schema = json.loads(result.stdout)
    defs = {**schema.get("$defs", {}), "Recipe": schema}
    compared = 0
    for (model, field), (type_cell, _) in rows.items():
        prop = defs.get(model, {}).get("properties", {}).get(field)
        if prop is None or (model, field) in {("Recipe", "model"), ("Recipe", "machines")}:
            continue  # rewritten for catalog shorthands
        compared += 1
        assert _cell_unit(type_cell) == _json_unit(prop), (model, field, type_cell, prop)
    assert compared >= 150


_PYTHON_REPR = re.compile(r"\b(None|True|False)\b|'|=|<|\w+\(")


def test_every_default_is_recipe_yaml_the_loader_reads_back_as_the_default(rows: dict) -> None:
    seen = 0
    for (model, field), (_, cell) in rows.items():
        info = MODELS[model].model_fields[field]
        if info.is_required():
            assert cell == "required", (model, field, cell)
            continue
        default = info.get_default(call_default_factory=True)
        if cell == "optional":
            assert default in (None, [], {}, ""), (model, field, default)
            continue
        if isinstance(default, BaseModel) and cell.startswith("default: the defaults of "):
            assert cell == f"default: the defaults of [{type(default).__name__}](#{type(default).__name__.lower()})"
            assert default == type(default)(), (model, field)
            continue
        match = re.fullmatch(r"default `([^`]+)`", cell)
        assert match, (model, field, cell)
        written = match.group(1)
        assert not _PYTHON_REPR.search(written), f"{model}.{field}: default {written!r} reads as Python, not YAML"
        refused, value = _validate(MODELS[model], field, yaml.safe_load(written))
        assert not refused and value is not _MISSING, f"{model}.{field}: the loader refuses its default {written!r}"
        assert value == default, (model, field, written, value, default)
        seen += 1
    assert seen >= 30


def test_nested_and_size_defaults_read_as_a_recipe_writes_them() -> None:
    rows = _rows(REFERENCE.read_text(encoding="utf-8"))
    assert rows[("Lane", "offload")][1] == "default `{placement: positional, load_cpu_offload: 0 GiB}`"
    assert rows[("GpuSpec", "driver_reserved")][1] == "default `0 GiB`"
    assert rows[("HbmReserve", "estimated")][1] == "default `false`"
