"""`{value: ..., source: ...}` figures: catalogs (and inline models/machines) cite each figure.

A figure written as `{value: 250.7 GiB, source: "the field report 'vLLM: Pin Hot Experts' (2026-09-17), 'The idea'"}` validates as its value;
the source is kept in the owning object's `sources` map under the figure's field path
(`gpus.hbm`, `host_tables[0].bytes`), so `--explain` and the docs can cite it.
"""

from __future__ import annotations

from typing import Any

SOURCED_KEYS = frozenset({"value", "source"})


def is_sourced(node: Any) -> bool:
    return isinstance(node, dict) and set(node) == SOURCED_KEYS


def split_sources(node: Any, prefix: str = "") -> tuple[Any, dict[str, str]]:
    """Return (node with every sourced figure replaced by its value, {field path: source})."""
    sources: dict[str, str] = {}

    def walk(item: Any, path: str) -> Any:
        if is_sourced(item):
            sources[path] = str(item["source"])
            return walk(item["value"], path)
        if isinstance(item, dict):
            return {key: walk(value, f"{path}.{key}" if path else str(key))
                    for key, value in item.items()}
        if isinstance(item, list):
            return [walk(value, f"{path}[{i}]") for i, value in enumerate(item)]
        return item

    plain = walk(node, prefix)
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
