"""The one resolver for paths recipegen reads or writes inside a project.

A project is the folder holding `recipes/` (and `compose/`, `k8s/`, `recipes/models/`,
`recipes/maps/`, …). Every path recipegen derives from it or from a recipe — a row map, a
histogram, a model file, a dump folder, an output folder, the model file `model import` writes —
goes through `project_path` before it is opened: the path must stay inside the project written as
it is (no `../` out of it), and every symlink on the way must resolve inside the project too. A
link that leaves it (`recipes/models -> /etc`, `compose/x/dumps/agent -> /`) is refused with exit
2 naming the path and the link, instead of reading or writing in another tree. Links that stay
inside the project are followed as usual.
"""

from __future__ import annotations

import os
from pathlib import Path

from recipegen.common.errors import InputError


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def escaping_link(root: Path, path: Path) -> tuple[Path, str] | None:
    """The first symlink between `root` and `path` (both included) that resolves outside
    `root`, with where it points; None when there is none. `path` is absolute or relative to
    the working folder; components that do not exist yet are fine."""
    lexical_root = os.path.abspath(root)
    real_root = os.path.realpath(lexical_root)
    target = os.path.abspath(path)
    if not _inside(target, lexical_root):
        return None  # not a project path: the caller decides (see project_path)
    current = lexical_root
    for part in Path(os.path.relpath(target, lexical_root)).parts:
        if part in ("", "."):
            continue
        current = os.path.join(current, part)
        if os.path.islink(current):
            resolved = os.path.realpath(current)
            if not _inside(resolved, real_root):
                return Path(current), resolved
    return None


def project_path(root: Path, path: Path | str, *, what: str, field: str | None = None,
                 file: str | None = None, line: int | None = None) -> Path:
    """`path` (absolute, or relative to the working folder) when it stays inside the project
    `root`, links included; InputError (exit 2) naming the path, and the link that leaves the
    project, otherwise. Returns the path as given (absolute), not its resolution."""
    absolute = Path(os.path.abspath(path))
    lexical_root = os.path.abspath(root)
    if not _inside(str(absolute), lexical_root):
        raise InputError(f"{what} {absolute} is outside the project {lexical_root}", file=file,
                         line=line, field=field)
    found = escaping_link(root, absolute)
    if found is not None:
        link, points_to = found
        shown = "" if link == absolute else f" through {link}, a symlink"
        raise InputError(f"{what} {absolute} leaves the project{shown or ' (a symlink)'} to "
                         f"{points_to}: recipegen reads and writes only inside {lexical_root}; "
                         "replace the link by the folder or file itself", file=file, line=line,
                         field=field)
    return absolute

