"""Shared plumbing of the PNG plots (`plan --plot`, `knee --plot`): matplotlib on the Agg
backend with a clear error when it is absent, and an atomic PNG write."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from expert_residency.formats import atomic_write_bytes

from recipegen.common.errors import InputError, RecipegenError
from recipegen.common.files import output_target


def plot_target(path: Path, option: str = "--plot") -> None:
    """Refuse a PNG path the write would misuse: a folder that does not exist (never created), or
    something there that is not a regular file (`common.files.output_target`)."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"the folder {str(parent)!r} does not exist (it is never created)", file=str(path),
                         field=option)
    output_target(path, option)


def pyplot() -> Any:
    """`matplotlib.pyplot` on the non-interactive Agg backend."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RecipegenError("--plot needs matplotlib: pip install 'recipegen[plot]'") from None
    return plt


def save_png(fig: Any, path: Path, *, dpi: int = 110) -> None:
    """Write `fig` to `path` as PNG (temp file + rename) and close it."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, dpi=dpi, format="png")
    finally:
        pyplot().close(fig)
    plot_target(path)     # checked again at the write: the path may have changed since the command began
    atomic_write_bytes(path, buffer.getvalue())
