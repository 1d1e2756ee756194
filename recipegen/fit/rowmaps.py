"""The histograms a fit builds its row maps from, and the maps themselves at the fitted count.

Each class of a usage-aware lane gets its map rebuilt top-N from its own histogram (the same rule
as `recipegen rowmap build --hot N`). A class with no histogram yet gets the **synthetic default**:
the seeded exponential-tailed rank profile of `recipegen.rowmap.synthetic` (the field reports'
skew), written beside the recipe as `profiles/<recipe>/<class>.hist` and marked synthetic in the
file, the map's provenance and the class description; `recipegen profile RECIPE LANE --class C`
overwrites both files with the lane's own traffic. A map already holding what would be built is
left untouched, so a second fit writes nothing.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expert_residency.formats import FormatError, Histogram, RowMap, load_histogram, load_rowmap
from expert_residency.formats.histogram import format_histogram
from expert_residency.formats.rowmap import format_rowmap

from recipegen.common.errors import InputError
from recipegen.rowmap.build import build_top_n, provenance_for
from recipegen.rowmap.inputs import input_error
from recipegen.rowmap.synthetic import synthetic_histogram
from recipegen.schema import Lane, Model, TrafficClass

# The synthetic default: one seed for every recipe (the class name varies the permutation), and
# enough tokens that the counts follow the profile closely.
SYNTHETIC_SEED = 0
SYNTHETIC_TOKENS = 100_000
SYNTHETIC_DESCRIPTION = ("SYNTHETIC default histogram (no profile yet): `recipegen profile {recipe} {lane} "
                         "--class {cls}` replaces it with this lane's own traffic")


@dataclass
class ClassHistogram:
    """One class's histogram, where it lives (relative to the recipe), and whether fit made it."""

    name: str
    histogram: Histogram
    histogram_path: str
    rowmap_path: str
    created: bool            # the synthetic default, written by this fit

    @property
    def synthetic(self) -> bool:
        return bool(self.histogram.meta.get("synthetic"))

    def origin(self) -> str:
        """Where the histogram comes from, for people: the synthetic default this fit makes, or the
        class's own file (itself marked synthetic where it was generated, not measured)."""
        if self.created:
            return "SYNTHETIC default histogram (no profile yet; `recipegen profile` replaces it)"
        synthetic = ("; SYNTHETIC: generated, not measured traffic; `recipegen profile` replaces it"
                     if self.synthetic else "")
        return f"histogram {self.histogram_path} (the class's own file{synthetic})"


@dataclass(frozen=True)
class FileWrite:
    """A file the fit writes (relative to the recipe's folder), with its new bytes."""

    path: str
    data: bytes
    what: str


def default_paths(recipe_name: str, cls: str) -> tuple[str, str]:
    """Where `recipegen profile` looks for a class's histogram and map when the recipe names none."""
    return f"profiles/{recipe_name}/{cls}.hist", f"maps/{recipe_name}/{cls}.rowmap"


def lane_histograms(recipe_name: str, base: Path, model: Model, lane: Lane) -> list[ClassHistogram]:
    """Per class (or one class named after the lane when it declares none): its histogram, read
    from the recipe's path, or the synthetic default."""
    classes: dict[str, Any] = dict(lane.classes) or {lane.name: None}
    out = []
    for name, cls in classes.items():
        hist_default, map_default = default_paths(recipe_name, name)
        hist_rel = getattr(cls, "histogram", None) or hist_default
        map_rel = getattr(cls, "rowmap", None) or map_default
        path = base / hist_rel
        if getattr(cls, "histogram", None) and not path.is_file():
            raise InputError(f"class {name}'s histogram file is not there: {hist_rel} (run `recipegen profile`, or "
                             "drop `histogram:` to start from the synthetic default)", file=str(path))
        if path.is_file():
            try:
                hist = load_histogram(path)
            except FormatError as exc:
                raise input_error(exc) from None
            created = False
        else:
            hist = synthetic_histogram(SYNTHETIC_SEED, name, moe_layer_indices=model.moe_layers,
                                       num_experts=model.routed_experts, top_k=model.top_k, tokens=SYNTHETIC_TOKENS,
                                       model_revision=model.revision or "")
            created = True
        if hist.num_experts != model.routed_experts or list(hist.moe_layer_indices) != list(model.moe_layers):
            raise InputError(f"covers {len(hist.moe_layer_indices)} MoE layers × {hist.num_experts} experts; model "
                             f"{model.name} has {model.num_moe_layers} × {model.routed_experts}", file=str(path),
                             field="moe_layers")
        out.append(ClassHistogram(name, hist, hist_rel, map_rel, created))
    return out


def search_histogram(hists: list[ClassHistogram], lane: Lane) -> ClassHistogram:
    """The histogram the search projects with: the active class's, else the first."""
    for h in hists:
        if h.name == lane.active_class:
            return h
    return hists[0]


def _histogram_write(h: ClassHistogram) -> FileWrite:
    """The file of a synthetic default histogram the fit made."""
    comments = ["expert residency histogram, SYNTHETIC default written by `recipegen fit` (no profile yet)"]
    return FileWrite(h.histogram_path, format_histogram(h.histogram, comments=comments).encode(),
                     f"class {h.name}: synthetic default histogram")


@contextlib.contextmanager
def usage_aware_classes(lane: Lane, hists: list[ClassHistogram]) -> Iterator[tuple[dict[str, TrafficClass], str]]:
    """The lane's classes and active class as a usage-aware fit writes them (`writeback._classes`),
    for the decode estimate, which reads each class's histogram from its file: a synthetic default
    not written yet is read from a temporary copy of the very bytes the fit would write, so the
    figure is the one `plan` and `check budgets` print on the written recipe."""
    classes = dict(lane.classes or {})
    with tempfile.TemporaryDirectory(prefix="recipegen-fit-") as tmp:
        for h in hists:
            histogram = h.histogram_path
            if h.created:
                staged = Path(tmp) / f"{h.name}.hist"
                staged.write_bytes(_histogram_write(h).data)
                histogram = str(staged)   # absolute: read as is beside any recipe folder
            own = classes.get(h.name) or TrafficClass()
            classes[h.name] = own.model_copy(update={"rowmap": h.rowmap_path, "histogram": histogram})
        yield classes, lane.active_class or hists[0].name


def map_writes(base: Path, hists: list[ClassHistogram], hot: int) -> tuple[list[FileWrite], dict[str, RowMap]]:
    """The files a usage-aware fit writes: each class's map at `hot` per layer (unless the file
    already holds that map) and the synthetic histograms it created."""
    writes: list[FileWrite] = []
    maps: dict[str, RowMap] = {}
    for h in hists:
        if h.created:
            writes.append(_histogram_write(h))
        prov = provenance_for([h.histogram], [Path(h.histogram_path).name], "top-n", hot=hot, fitted="recipegen fit")
        prov["histogram_checksums"] = [h.histogram.checksum()]
        rowmap = build_top_n(h.histogram, hot, prov)
        maps[h.name] = rowmap
        if _same_map(base / h.rowmap_path, rowmap):
            continue
        comments = ["expert residency row map, written by `recipegen fit`"]
        if h.synthetic:
            comments.append("SYNTHETIC: built from a synthetic histogram, not measured traffic")
        writes.append(FileWrite(h.rowmap_path, format_rowmap(rowmap, comments=comments).encode(),
                                f"class {h.name}: row map, {hot} hot per layer"))
    return writes, maps


def _same_map(path: Path, rowmap: RowMap) -> bool:
    if not path.is_file():
        return False
    try:
        return load_rowmap(path).content_hash() == rowmap.content_hash()
    except (FormatError, OSError):
        return False
