"""Reading the rowmap commands' inputs: row maps, histogram files and raw/vLLM captures.

The only I/O of `recipegen.rowmap`: format errors become InputError (file, line, field),
big captures stream with a progress bar on stderr.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expert_residency.formats import (
    FormatError,
    Histogram,
    RowMap,
    histogram_from_captures,
    load_histogram,
    load_rowmap,
)
from expert_residency.formats.capture import capture_kind

from recipegen.common.errors import InputError
from recipegen.load.recipe import load_recipe_model


def input_error(exc: FormatError) -> InputError:
    return InputError(exc.reason, file=exc.path, line=exc.line, field=exc.field)


@dataclass(frozen=True)
class Geometry:
    """What a capture needs to become a histogram, and what `show` needs for bytes."""

    moe_layer_indices: tuple[int, ...]
    num_experts: int
    bytes_per_expert: int | None = None
    top_k: int | None = None
    model_revision: str = ""
    source: str = ""


def geometry_from_recipe(recipe: str) -> Geometry:
    """Model geometry of a recipe (name under recipes/ or a path). Only the model is read: a
    recipe whose row map is missing or disagrees with its budget — the map about to be built —
    still gives its geometry."""
    loaded = load_recipe_model(recipe)
    model = loaded.recipe.model
    return Geometry(tuple(model.moe_layers), int(model.routed_experts),
                    int(model.expert_bytes), int(model.top_k), model.revision or "",
                    f"recipe {loaded.name} (model {model.name})")


def read_rowmap(path: str | os.PathLike[str]) -> RowMap:
    try:
        return load_rowmap(path)
    except FormatError as exc:
        raise input_error(exc) from None


def is_histogram_file(path: str | os.PathLike[str]) -> bool:
    """True for our text histogram; False for `.npy` and vLLM capture files."""
    from expert_residency.formats._io import UnreadableFile, open_regular_file

    try:
        fd = open_regular_file(path)  # a FIFO or device is refused before any read blocks
    except FileNotFoundError:
        raise InputError("no such file", file=str(path)) from None
    except UnreadableFile as exc:
        raise InputError(f"{exc.strerror}: not a histogram or capture file", file=str(path)) from None
    with os.fdopen(fd, "rb") as handle:
        head = handle.read(4096)
    if head.startswith(b"\x93NUMPY"):
        return False
    # a histogram saved by an editor that adds a byte-order mark is still meant as one: its own
    # reader then names what is wrong, instead of the capture reader's "not valid base64"
    head = head.removeprefix(b"\xef\xbb\xbf")
    for line in head.split(b"\n"):
        stripped = line.strip()
        if not stripped or stripped.startswith(b"#"):
            continue
        return stripped.startswith(b"format: expert-residency-histogram")
    return False


@contextmanager
def progress_bar(description: str, enabled: bool | None = None
                 ) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr fed as `update(done, total)`: shown on a terminal by
    default; `enabled=True` forces it (also into a file or pipe), `False` hides it."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    console = Console(stderr=True, force_terminal=True if enabled else None)
    show = console.is_terminal if enabled is None else enabled
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), console=console,
                  disable=not show, transient=True) as progress:
        task = progress.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield update


def read_histograms(paths: Sequence[str | os.PathLike[str]], geometry: Geometry | None,
                    *, progress: bool | None = None, group_captures: bool = False,
                    decode_only: bool = False) -> list[tuple[str, Histogram]]:
    """Each input as (display name, histogram).

    Histogram files load as they are. Capture files (raw `.npy`, vLLM responses) reduce with
    `geometry`; with `group_captures` all captures pool into one histogram.
    """
    out: list[tuple[str, Histogram]] = []
    captures: list[str] = []
    for path in paths:
        p = str(path)
        if is_histogram_file(p):
            try:
                out.append((p, load_histogram(p)))
            except FormatError as exc:
                raise input_error(exc) from None
        else:
            captures.append(p)
    if captures:
        if geometry is None:
            raise InputError("capture files need the model geometry: give --recipe, or "
                             "--experts (and --layers)", file=captures[0], field="--recipe")
        batches = [captures] if group_captures else [[c] for c in captures]
        for batch in batches:
            label = batch[0] if len(batch) == 1 else f"{len(batch)} captures"
            kinds = sorted({"raw .npy" if capture_kind(c) == "npy" else "vLLM" for c in batch})
            try:
                with progress_bar(f"reducing {Path(label).name}", progress) as update:
                    hist = histogram_from_captures(
                        batch, moe_layer_indices=geometry.moe_layer_indices,
                        num_experts=geometry.num_experts, model_revision=geometry.model_revision,
                        progress=update, meta={"capture_kind": ", ".join(kinds)},
                        decode_only=decode_only)
            except FormatError as exc:
                raise input_error(exc) from None
            out.append((label, hist))
    return out


def parse_layers(text: str) -> tuple[int, ...]:
    from expert_residency.formats._io import parse_index_ranges
    try:
        layers = parse_index_ranges(text)
    except ValueError as exc:
        raise InputError(f"cannot read layer list {text!r} ({exc})", field="--layers") from None
    if not layers:
        raise InputError("empty layer list", field="--layers")
    return layers


def capture_layer_count(path: str) -> int:
    """Layer-axis length of a capture (to default --layers to 0..n-1), at most MAX_LAYERS:
    checked from the header before the layer list is built."""
    import numpy as np
    from expert_residency.formats._io import MAX_LAYERS
    from expert_residency.formats.capture import iter_vllm_capture

    count, line = None, None
    try:
        if capture_kind(path) == "npy":
            count = int(np.load(path, mmap_mode="r", allow_pickle=False).shape[1])
        else:
            first = next(iter_vllm_capture(path), None)
            if first is not None:
                count, line = int(first[0].shape[1]), first[2]
    except FormatError as exc:
        raise input_error(exc) from None
    except (ValueError, IndexError, OSError) as exc:
        raise InputError(f"cannot read capture ({exc})", file=path) from None
    if count is None:
        raise InputError("capture holds no routed_experts", file=path)
    if not 0 < count <= MAX_LAYERS:
        raise InputError(f"capture has {count:,} layers; a model has 1 to {MAX_LAYERS:,} (give "
                         "--layers for its MoE layers)", file=path, line=line, field="layers")
    return count


def short_names(names: Sequence[str]) -> list[str]:
    """File names without folders when that keeps them distinct, else the paths as given."""
    bases = [Path(n).name for n in names]
    return bases if len(set(bases)) == len(bases) else list(names)


def describe_meta(meta: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(meta.items()))
