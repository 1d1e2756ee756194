"""Shared plumbing of the PNG plots (`plan --plot`, `knee --plot`): matplotlib on the Agg
backend with a clear error when it is absent, and an atomic PNG write."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from expert_residency.formats import atomic_write_bytes

from recipegen.common.errors import RecipegenError


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
    atomic_write_bytes(path, buffer.getvalue())
