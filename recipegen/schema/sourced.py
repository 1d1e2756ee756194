"""`{value: ..., source: ...}` figures: catalogs (and inline models/machines) cite each figure.

A figure written as `{value: 250.7 GiB, source: "the field report 'vLLM: Pin Hot Experts' (2026-09-17), 'The idea'"}` validates as its value;
the source is kept in the owning object's `sources` map under the figure's field path
(`gpus.hbm`, `host_tables[0].bytes`), so `--explain` and the docs can cite it.
"""

from __future__ import annotations

from typing import Any

from recipegen.schema.base import PathError

SOURCED_KEYS = frozenset({"value", "source"})


def is_sourced(node: Any) -> bool:
    return isinstance(node, dict) and set(node) == SOURCED_KEYS


def figure_problem(node: Any) -> str | None:
    """What is wrong with a mapping meant as a `{value, source}` figure, or None. Left as a
    mapping, the field's own check would say only that it got one. Meant as a figure: `{source}`
    alone, or `value` with at most one key beside `source` (a misspelt `source`, a `basis`); a
    section with a stray `value` or `source` key is left to its unknown-field error."""
    if not isinstance(node, dict) or is_sourced(node):
        return None
    extra = sorted(str(k) for k in node if k not in SOURCED_KEYS)
    if not (set(node) == {"source"} or ("value" in node and len(extra) <= 1)):
        return None
    missing = sorted(SOURCED_KEYS - set(node))
    what = [f"{missing[0]!r} is missing"] if missing else []
    if extra:
        what.append(f"unknown key{'s' if len(extra) > 1 else ''} {', '.join(repr(k) for k in extra)}")
    return (f"{'; '.join(what)}: a figure written as a mapping takes exactly 'value' and 'source' "
            "(or write the value alone)")


def split_sources(node: Any, prefix: str = "") -> tuple[Any, dict[str, str]]:
    """Return (node with every sourced figure replaced by its value, {field path: source}).
    A malformed figure (`figure_problem`) is a `PathError` at its field."""
    sources: dict[str, str] = {}

    def walk(item: Any, path: str, loc: tuple[str | int, ...]) -> Any:
        if is_sourced(item):
            sources[path] = str(item["source"])
            return walk(item["value"], path, loc)
        problem = figure_problem(item)
        if problem is not None:
            raise PathError(problem, loc)
        if isinstance(item, dict):
            return {key: walk(value, f"{path}.{key}" if path else str(key), (*loc, key))
                    for key, value in item.items()}
        if isinstance(item, list):
            return [walk(value, f"{path}[{i}]", (*loc, i)) for i, value in enumerate(item)]
        return item

    plain = walk(node, prefix, ())
    return plain, sources


def lift_sources(data: Any) -> Any:
    """A model's raw input with its sourced figures replaced by their values and their sources
    merged into its `sources` map (an explicit `sources:` entry wins); for a `mode="before"`
    validator of a model with a `sources` field."""
    if not isinstance(data, dict):
        return data
    plain, sources = split_sources({k: v for k, v in data.items() if k != "sources"})
    if "sources" in data:
        plain["sources"] = {**sources, **(data["sources"] or {})}
    elif sources:
        plain["sources"] = sources
    return plain
