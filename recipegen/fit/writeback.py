"""Writing a fit back: the lane's offload, context and classes in the recipe, comments kept, and
the row maps and histograms beside it — all or nothing.

The recipe is edited as ruamel's round-trip document (`recipegen.load.document.round_trip_yaml`,
as `render --class` writes `active_class`): only the values the fit changes move; every comment
stays, except the end-of-line comment of a value the fit changed, which now says what the new
value is (the old one described the old value). Nothing is written when nothing changed.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from recipegen.common.errors import RecipegenError
from recipegen.common.units import GiB, format_bytes
from recipegen.fit.rowmaps import SYNTHETIC_DESCRIPTION, ClassHistogram, FileWrite
from recipegen.fit.search import ALL_HBM, USAGE_AWARE, Candidate
from recipegen.load.document import parse_yaml, round_trip_yaml, to_plain
from recipegen.load.recipe import load_recipe, write_recipe_atomically
from recipegen.schema.base import Bytes, TokenCount

OFFLOAD_PARAMS = ["--cpu-offload-params", "experts"]


def dump(document: Any) -> str:
    yaml = round_trip_yaml()
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    buffer = io.StringIO()
    yaml.dump(document, buffer)
    return buffer.getvalue()


# ------------------------------------------------------------------ editing the document

def _eol(node: Any, key: str, note: str) -> None:
    """`note` as the end-of-line comment of `key`, keeping the comment lines that follow it (a
    flow mapping `{a: 1}` becomes a block one: a comment cannot sit inside braces)."""
    if node.fa.flow_style():
        node.fa.set_block_style()
    items = node.ca.items
    token = items.get(key, [None, None, None, None])[2] if key in items else None
    if token is not None:
        first, newline, rest = token.value.partition("\n")
        tail = newline + rest if first.lstrip().startswith("#") else token.value
        token.value = f"# {note}" + (tail if tail.startswith("\n") else "\n" + tail if tail else "\n")
        return
    node.yaml_add_eol_comment(f"# {note}", key)


# The schema's own readers of a written value: `1M` and 1048576 are one max_model_len, `60 GiB`
# and `61440 MiB` one size, so an unchanged value keeps its spelling and its comment.
_TOKENS: TypeAdapter[int] = TypeAdapter(TokenCount)
_BYTES: TypeAdapter[int] = TypeAdapter(Bytes)


def _same(written: Any, value: Any, reader: TypeAdapter[Any] | None) -> bool:
    """Whether the document's `written` value means `value` (read as the schema reads it)."""
    written = to_plain(written)
    if reader is None:
        return bool(written == value)
    try:
        return bool(reader.validate_python(written) == reader.validate_python(value))
    except ValidationError:  # a value the schema cannot read is replaced
        return False


def _set(node: Any, key: str, value: Any, note: str | None = None, *, after: str | None = None,
         reader: TypeAdapter[Any] | None = None) -> bool:
    """Set `key` (keeping its place, or after `after`); True when the value changed. `reader`: the
    schema type the value is read as, so that another spelling of the same value is no change."""
    if key in node and _same(node[key], value, reader):
        return False
    if key in node:
        node[key] = value
    else:
        keys = list(node.keys())
        position = keys.index(after) + 1 if after in keys else len(keys)
        node.insert(position, key, value)
    if note:
        _eol(node, key, note)
    return True


def _drop(node: Any, key: str) -> bool:
    """Remove `key`, handing the comment lines that followed it to the key before it."""
    if key not in node:
        return False
    keys = list(node.keys())
    token = node.ca.items.get(key, [None, None, None, None])[2] if key in node.ca.items else None
    del node[key]
    if token is not None:
        _, newline, rest = token.value.partition("\n") if token.value.lstrip().startswith("#") else ("", "", token.value)
        following = rest if newline else ""
        index = keys.index(key)
        if following.strip() and index > 0:
            previous = keys[index - 1]
            prev_items = node.ca.items.setdefault(previous, [None, None, None, None])
            if prev_items[2] is None:
                from ruamel.yaml.tokens import CommentToken
                prev_items[2] = CommentToken("\n" + following, None, None)
            else:
                prev_items[2].value = prev_items[2].value.rstrip("\n") + "\n" + following
    return True


def _gib(value_bytes: int) -> str:
    return f"{value_bytes // GiB} GiB"


def apply_fit(document: Any, lane_index: int, recipe_name: str, candidate: Candidate,
              hists: list[ClassHistogram], max_model_len: int, concurrency: int | None) -> list[str]:
    """Edit the round-trip `document` to the fitted lane; returns what changed, in words."""
    lane_node = document["lanes"][lane_index]
    changed: list[str] = []
    ledger = candidate.evaluation.ledger
    if _set(lane_node, "max_model_len", max_model_len, "fitted: recipegen fit", reader=_TOKENS):
        changed.append(f"max_model_len {max_model_len:,}")
    if concurrency is not None:
        conc = lane_node["concurrency"]
        if _set(conc, "max", concurrency):
            changed.append(f"concurrency.max {concurrency}")
        if "min" in conc and int(conc["min"]) > concurrency and _set(conc, "min", concurrency):
            changed.append(f"concurrency.min {concurrency}")
    placement = "usage-aware" if candidate.placement == USAGE_AWARE else "positional"
    offload_bytes = candidate.load_offload_gib * GiB
    if "offload" not in lane_node:
        if candidate.placement == ALL_HBM:  # an absent offload section says just that
            return changed + _classes(lane_node, recipe_name, candidate, hists)
        from ruamel.yaml.comments import CommentedMap

        keys = list(lane_node.keys())
        lane_node.insert(keys.index("concurrency") + 1 if "concurrency" in keys else len(keys), "offload",
                         CommentedMap())
    offload = lane_node["offload"]
    if _set(offload, "placement", placement, after=None):
        changed.append(f"placement {placement}")
    if candidate.placement == USAGE_AWARE:
        hot = candidate.hot_per_layer
        assert hot is not None
        cold = ledger.usage_aware.cold_per_layer[0]
        note = (f"fitted: {cold} cold per layer = {format_bytes(ledger.fig('host.cold_experts').value)} pinned in "
                "host memory")
        after = "cold_experts_budget" if "cold_experts_budget" in offload else "placement"
        if _set(offload, "hot_experts_per_layer", hot, note, after=after):
            changed.append(f"hot_experts_per_layer {hot}")
        if _drop(offload, "cold_experts_budget"):
            changed.append("cold_experts_budget dropped (hot_experts_per_layer says it)")
        pinned = ledger.fig("load.host_pinned_initial").value
        note = (f"fitted: vLLM --cpu-offload-gb at load (pins {format_bytes(pinned)}), then moved where the row map says"
                if offload_bytes else "fitted: no --cpu-offload-gb at load")
        if _set(offload, "load_cpu_offload", _gib(offload_bytes), note, after="hot_experts_per_layer",
                reader=_BYTES):
            changed.append(f"load_cpu_offload {_gib(offload_bytes)}")
    else:
        for key in ("hot_experts_per_layer", "cold_experts_budget", "adaptive", "prefetch_slots_per_layer"):
            if _drop(offload, key):
                changed.append(f"{key} dropped ({candidate.placement})")
        note = ("fitted: every routed expert in HBM (no --cpu-offload-gb)" if candidate.placement == ALL_HBM else
                f"fitted: vLLM --cpu-offload-gb ({ledger.active.basis.split(':', 1)[-1].strip()})")
        if _set(offload, "load_cpu_offload", _gib(offload_bytes), note, after="placement", reader=_BYTES):
            changed.append(f"load_cpu_offload {_gib(offload_bytes)}")
    changed += _classes(lane_node, recipe_name, candidate, hists)
    return changed


def _classes(lane_node: Any, recipe_name: str, candidate: Candidate, hists: list[ClassHistogram]) -> list[str]:
    from ruamel.yaml.comments import CommentedMap

    changed: list[str] = []
    classes = lane_node.get("classes")
    if candidate.placement != USAGE_AWARE:
        for name in list(classes or {}):
            if _drop(classes[name], "rowmap"):
                changed.append(f"class {name}: row map reference dropped ({candidate.placement} lanes have none; "
                               "the file stays)")
        return changed
    if classes is None:
        classes = CommentedMap()
        lane_node.insert(list(lane_node.keys()).index("reserves") + 1 if "reserves" in lane_node
                         else len(lane_node), "classes", classes)
    for h in hists:
        if h.name not in classes:
            classes[h.name] = CommentedMap()
            changed.append(f"class {h.name} added")
        node = classes[h.name]
        if _set(node, "rowmap", h.rowmap_path):
            changed.append(f"class {h.name}: rowmap {h.rowmap_path}")
        if _set(node, "histogram", h.histogram_path, after="rowmap"):
            changed.append(f"class {h.name}: histogram {h.histogram_path}")
        if h.created and not node.get("description"):
            lane = str(lane_node["name"])
            _set(node, "description", SYNTHETIC_DESCRIPTION.format(recipe=recipe_name, lane=lane, cls=h.name))
    if lane_node.get("active_class") is None:
        first = hists[0].name
        _set(lane_node, "active_class", first, after="classes")
        changed.append(f"active_class {first}")
    return changed


# ------------------------------------------------------------------ committing

@contextlib.contextmanager
def recipe_lock(recipe_path: Path) -> Iterator[None]:
    """The one place `fit` and `new` take the recipe's lock, held from the read of the recipe to
    the write of it and its maps (`fit.run.fit_recipe`, `fit.new.new_recipe`): recipegen's lock
    per recipe (`recipegen.common.lock.recipe_lock`, the flock `render --class`, `swap` and
    `save-live` hold too), so a fit never interleaves with another writer of the recipe."""
    from recipegen.common.lock import recipe_lock as lock

    with lock(recipe_path):
        yield


def commit(recipe_path: Path, new_text: str, writes: list[FileWrite]) -> None:
    """Write the maps and histograms, then the recipe; on any failure put every file back as it
    was. The recipe text is validated before anything is written, and the written recipe (with
    its maps) is loaded again after."""
    base = recipe_path.parent
    parse_yaml(new_text, str(recipe_path))
    previous: dict[Path, bytes | None] = {}
    targets = [(base / w.path, w.data) for w in writes] + [(recipe_path, new_text.encode("utf-8"))]
    try:
        for path, data in targets:
            previous[path] = path.read_bytes() if path.is_file() else None
            path.parent.mkdir(parents=True, exist_ok=True)
            if path == recipe_path:
                write_recipe_atomically(path, data)
            else:
                _atomic_bytes(path, data)
        load_recipe(recipe_path)
    except BaseException:
        for path, data in previous.items():
            with contextlib.suppress(OSError):
                if data is None:
                    path.unlink(missing_ok=True)
                elif path == recipe_path:
                    write_recipe_atomically(path, data)
                else:
                    _atomic_bytes(path, data)
        raise


def _atomic_bytes(path: Path, data: bytes) -> None:
    from expert_residency.formats import atomic_write_bytes

    try:
        atomic_write_bytes(path, data)
    except OSError as exc:
        raise RecipegenError(f"{path}: cannot write ({exc.strerror or exc})") from None


def relative_to_cwd(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)
