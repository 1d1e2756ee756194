"""Catalogs of models and machines shipped with the package; every figure carries its source."""

from __future__ import annotations

import copy
from functools import cache
from importlib import resources
from typing import Any

import yaml

from recipegen.schema.sourced import is_sourced

KINDS = ("models", "machines")
# Keys whose values are names or coordinates, not figures: they need no source.
NON_FIGURE_KEYS = frozenset({"name", "description", "kind", "architecture", "checkpoint",
                             "revision", "address", "streams", "k", "dtype", "kv_dtype", "detected"})


@cache
def load_catalog(kind: str) -> dict[str, dict[str, Any]]:
    """The raw catalog (`{value, source}` figures intact), by entry name."""
    if kind not in KINDS:
        raise ValueError(f"unknown catalog {kind!r}")
    root = resources.files("recipegen.catalog")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = yaml.load(root.joinpath(f"{kind}.yaml").read_text(encoding="utf-8"), Loader=loader) or {}
    out = {name: {"name": name, **entry} for name, entry in data.items()}
    # One file per entry under <kind>/ (the imported models: `recipegen model import` output).
    folder = root.joinpath(kind)
    if folder.is_dir():
        for item in sorted(folder.iterdir(), key=lambda p: p.name):
            if not item.name.endswith(".yaml"):
                continue
            entry = yaml.load(item.read_text(encoding="utf-8"), Loader=loader) or {}
            name = entry.get("name")
            if name in out:
                raise ValueError(f"catalog {kind}: {name!r} is in {kind}.yaml and {kind}/{item.name}")
            out[name] = entry
    return out


def catalog_names(kind: str) -> list[str]:
    return sorted(load_catalog(kind))


def catalog_entry(kind: str, name: str) -> dict[str, Any]:
    """A deep copy of one entry; an unknown name is a ValueError listing the known ones."""
    entries = load_catalog(kind)
    if name not in entries:
        singular = kind[:-1]
        raise ValueError(f"unknown {singular} {name!r} in the {singular} catalog; "
                         f"known: {', '.join(sorted(entries)) or '(none)'}")
    return copy.deepcopy(entries[name])


def figures_without_source(kind: str) -> list[str]:
    """Field paths of catalog figures that are not written as `{value, source}` (should be none)."""
    missing: list[str] = []

    def walk(node: Any, path: str, key: str) -> None:
        if is_sourced(node):
            return
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}", str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]", key)
        elif key not in NON_FIGURE_KEYS:
            missing.append(path)

    for name, entry in load_catalog(kind).items():
        for k, v in entry.items():
            walk(v, f"{name}.{k}", k)
    return missing


def entry_lines(kind: str) -> list[tuple[str, str]]:
    """(catalog id, one line about it) for every entry of a catalog, by id: for a model its layers,
    routed experts, top-k, expert format, routed-expert bytes and context; for a machine its GPUs ×
    the memory the driver reports, host memory ("assumed" where no datasheet or measurement fixes
    it) and the GPU's read of pinned host memory; then the entry's description."""
    from recipegen.common.units import format_bandwidth, format_bytes
    from recipegen.schema import Machine, Model

    lines: list[tuple[str, str]] = []
    for name in catalog_names(kind):
        entry = catalog_entry(kind, name)
        if kind == "models":
            m = Model.model_validate(entry)
            context = f", context {m.max_position_embeddings:,}" if m.max_position_embeddings else ""
            text = (f"{m.decoder_layers} layers ({m.num_moe_layers} MoE) × {m.routed_experts} experts, "
                    f"top-{m.top_k}, {m.expert_format}, routed experts {format_bytes(m.routed_expert_bytes)}{context}")
        else:
            box = Machine.model_validate(entry)
            assumed = " (assumed)" if box.sources.get("host_memory", "").startswith("assumed") else ""
            # the driver's total, and what CUDA allocates of it where the catalog knows the reserve
            allocatable = (f" (CUDA allocates {format_bytes(box.gpus.usable)})" if box.gpus.driver_reserved
                           else "")
            text = (f"{box.gpus.count} × {box.gpus.kind}, {format_bytes(box.gpus.hbm)} GPU memory each{allocatable}, host "
                    f"{format_bytes(box.host_memory)}{assumed}, pinned read "
                    f"{format_bandwidth(box.pinned_read_bandwidth)}")
        description = str(entry.get("description") or "").strip()
        lines.append((name, f"{text} — {description}" if description else text))
    return lines
