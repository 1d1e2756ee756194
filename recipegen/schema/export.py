"""The recipe language, exported: JSON Schema and a Markdown field reference (from docstrings)."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from recipegen.schema.base import (
    _bandwidth_positive,
    _bytes_any,
    _bytes_positive,
    _count,
    _scaled_positive,
    reachable_models,
)
from recipegen.schema.patterns import pattern_hint
from recipegen.schema.recipe import SCHEMA_VERSION, Recipe


def recipe_json_schema(catalog_names: Callable[[str], list[str]]) -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a recipe file, including catalog-name shorthands
    (`catalog_names(kind)`: the names of the catalog's "models" or "machines")."""
    schema = Recipe.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://recipegen.invalid/schema/recipe-v{SCHEMA_VERSION}.json"
    props = schema["properties"]
    model_ref = props["model"].get("$ref") or props["model"]
    props["model"] = {
        "description": props["model"].get("description", ""),
        "anyOf": [
            {"type": "string", "enum": catalog_names("models"), "description": "model catalog name"},
            {"type": "object", "required": ["catalog"], "properties": {"catalog": {
                "type": "string", "enum": catalog_names("models")}},
             "description": "catalog entry with overridden fields"},
            {"type": "object", "required": ["file"], "properties": {"file": {"type": "string"}},
             "description": "model file (what `recipegen model import` writes), relative to the recipe, with "
                            "overridden fields"},
            {"$ref": model_ref} if isinstance(model_ref, str) else model_ref,
        ]}
    machines = props["machines"]
    choices = lambda inner: {"anyOf": [  # noqa: E731
        {"type": "string", "enum": catalog_names("machines"), "description": "machine catalog name"},
        {"type": "object", "required": ["catalog"], "properties": {
            "catalog": {"type": "string", "enum": catalog_names("machines")},
            "address": {"type": ["string", "null"]}},
         "description": "catalog entry with overridden fields (e.g. address)"},
        inner]}
    if "patternProperties" in machines:  # keys are constrained: patternProperties, nothing else
        machines["patternProperties"] = {k: choices(v) for k, v in machines["patternProperties"].items()}
        machines["additionalProperties"] = False
    else:
        machines["additionalProperties"] = choices(machines["additionalProperties"])
    return schema


# ------------------------------------------------------------------------ Markdown reference

def _field_annotation(info: FieldInfo) -> Any:
    """The annotation a field is validated with: for a field that is not Optional pydantic moves
    the `Annotated` metadata of its type (unit validators, bounds) off the annotation into
    `FieldInfo.metadata`; put it back so the field reads as the loader checks it."""
    if info.metadata:
        return Annotated[(info.annotation, *info.metadata)]  # type: ignore[return-value]
    return info.annotation


def _unit_func(annotation: Any) -> Callable[[Any], Any] | None:
    """The unit-parsing validator of a unit-carrying annotation (Bytes, Bandwidth, ...), or None."""
    for item in getattr(annotation, "__metadata__", ()):
        func = getattr(item, "func", None)
        if func in _UNIT_TYPES:
            return func
    return None


def _pattern_of(annotation: Any) -> str | None:
    """The text pattern an annotated field is checked against (`Field(pattern=…)`,
    `StringConstraints(pattern=…)`), or None."""
    for item in getattr(annotation, "__metadata__", ()):
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            return pattern
    return None


def _type_name(annotation: Any) -> str:
    metadata = getattr(annotation, "__metadata__", None)
    if metadata is not None:
        func = _unit_func(annotation)
        if func is not None:
            return _UNIT_TYPES[func]
        inner = _type_name(get_args(annotation)[0])
        hint = pattern_hint(_pattern_of(annotation))
        # the hint a refusal prints (recipegen.schema.patterns), so the page and the error agree
        return f"{inner} ({hint.replace('|', chr(92) + '|')})" if hint else inner
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in get_args(annotation))
    if origin in (list, tuple):
        args = get_args(annotation)
        if origin is tuple:
            return "[" + ", ".join(_type_name(a) for a in args) + "]"
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        key, value = get_args(annotation)
        return f"mapping {_type_name(key)} → {_type_name(value)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    return {int: "integer", float: "number", str: "string", bool: "boolean"}.get(annotation, str(annotation))


_UNIT_TYPES: dict[Callable[[Any], Any], str] = {
    _bytes_any: "size (`60 GiB`, `141 GB`; ≥ 0)",
    _bytes_positive: "size (`60 GiB`, `141 GB`; > 0)",
    _bandwidth_positive: "bandwidth (`340 GB/s`)",
    _count: "count (`1048576`, `1M`, `128k`)",
    _scaled_positive: "number (`518000`, `0.518M`)",
}


def _unit_of(annotation: Any) -> str | None:
    """"size" or "bandwidth" where the field's value (or an Optional one) needs that unit, else None."""
    func = _unit_func(annotation)
    if func in (_bytes_any, _bytes_positive):
        return "size"
    if func is _bandwidth_positive:
        return "bandwidth"
    if get_origin(annotation) in (typing.Union, types.UnionType):
        units = {_unit_of(a) for a in get_args(annotation) if a is not type(None)}
        return units.pop() if len(units) == 1 else None
    return None


def _format_size(n_bytes: int) -> str:
    """A byte count as the loader reads it back exactly: `0 GiB`, `64 GiB`, `18800640 B`."""
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes % factor == 0:
            return f"{n_bytes // factor} {unit}"
    return f"{n_bytes} B"


def _format_bandwidth(bytes_per_s: float) -> str:
    for unit, factor in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if bytes_per_s >= factor and (bytes_per_s / factor) == round(bytes_per_s / factor, 6):
            return f"{bytes_per_s / factor:g} {unit}/s"
    return f"{bytes_per_s:g} B/s"


def _yaml_scalar(text: str) -> str:
    """A string as a YAML scalar: plain where YAML reads it back as that string, else quoted."""
    try:
        plain = yaml.safe_load(text) == text and ":" not in text and "#" not in text
    except yaml.YAMLError:
        plain = False
    return text if plain and text.strip() == text and text else json.dumps(text)


def _yaml_value(value: Any, annotation: Any) -> str:
    """`value` written as recipe YAML (flow style), sizes and bandwidths with their units."""
    unit = _unit_of(annotation)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if unit == "size" and isinstance(value, int):
        return _format_size(value)
    if unit == "bandwidth" and isinstance(value, (int, float)):
        return _format_bandwidth(value)
    if isinstance(value, BaseModel):
        return "{" + ", ".join(f"{name}: {_yaml_value(v, _field_annotation(info))}"
                               for name, info, v in _set_fields(value)) + "}"
    if isinstance(value, (list, tuple)):
        args = [a for a in get_args(annotation) if a is not type(None)]
        inner = args[0] if len(args) == 1 else Any
        return "[" + ", ".join(_yaml_value(v, inner) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_yaml_scalar(str(k))}: {_yaml_value(v, Any)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return _yaml_scalar(value)
    return repr(value) if isinstance(value, float) else str(value)


def _set_fields(value: BaseModel) -> list[tuple[str, FieldInfo, Any]]:
    """The fields of a nested default that differ from that object's own defaults (what a recipe
    would write to get it)."""
    out = []
    for name, info in type(value).model_fields.items():
        current = getattr(value, name)
        if info.is_required() or current != info.get_default(call_default_factory=True):
            out.append((name, info, current))
    return out


def _default_cell(info: FieldInfo) -> str:
    """The "required / default" cell: `required`, `optional` (absent means none), or the default
    as recipe YAML."""
    if info.is_required():
        return "required"
    default = info.get_default(call_default_factory=True)
    if default in (None, [], {}, ""):
        return "optional"
    if isinstance(default, BaseModel) and not _set_fields(default):
        name = type(default).__name__
        return f"default: the defaults of [{name}](#{name.lower()})"
    return f"default `{_yaml_value(default, _field_annotation(info))}`"


def recipe_reference_markdown(catalog_names: Callable[[str], list[str]]) -> str:
    """docs/recipe-reference.md: every object and field of the recipe language, from docstrings
    (`catalog_names(kind)` as for `recipe_json_schema`)."""
    lines = [
        "# Recipe reference",
        "",
        "<!-- Generated by `recipegen schema --markdown -o docs/recipe-reference.md`; do not edit. -->",
        "",
        f"Schema version {SCHEMA_VERSION}. Unknown fields are errors. Sizes carry units (GiB = 2^30 "
        "bytes, GB = 10^9); a bare number where a unit is needed is an error. Paths are relative to "
        "the recipe file, except `model.checkpoint` (an absolute path on the machine that runs the "
        "lane, or a Hugging Face repo id). Inside `model` and `machines` any figure may be written as "
        "`{value: …, source: \"…\"}` to cite where it comes from.",
        "",
        "Check a recipe with `recipegen check recipe RECIPE` (every problem with file, line and "
        "field) and its budgets with `recipegen check budgets RECIPE` (see `docs/ledger.md`); "
        "`recipegen schema` prints the JSON Schema.",
        "",
        f"Catalog models: {', '.join(f'`{n}`' for n in catalog_names('models'))}. "
        f"Catalog machines: {', '.join(f'`{n}`' for n in catalog_names('machines'))}.",
        "",
    ]
    for model in reachable_models(Recipe):
        lines.append(f"## {model.__name__}")
        lines.append("")
        doc = (model.__doc__ or "").strip()
        if doc:
            lines.extend([" ".join(part.split()) for part in doc.split("\n\n")])
            lines.append("")
        lines.append("| field | type | required / default | description |")
        lines.append("|---|---|---|---|")
        for name, info in model.model_fields.items():
            desc = " ".join((info.description or "").split()).replace("|", "\\|")
            lines.append(f"| `{name}` | {_type_name(_field_annotation(info))} | {_default_cell(info)} | {desc} |")
        lines.append("")
    return "\n".join(lines)
