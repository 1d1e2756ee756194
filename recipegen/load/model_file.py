"""Model files a recipe references as `model: {file: models/<name>.yaml}` (relative to the recipe).

A model file is one model mapping (what `recipegen model import` writes). It is read and
validated on its own first, so a mistake in it is reported with the model file's own line and
field, not the recipe's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from recipegen.common.errors import InputError
from recipegen.load.document import display_path, read_yaml_file, to_plain, validation_error
from recipegen.schema import Model

# A model file is a few KB (the largest catalog entry is 6 KB); anything near this is not one.
MAX_MODEL_FILE_BYTES = 4 * 2**20


def load_model_file(relative: str, *, base: Path) -> dict[str, Any]:
    """The raw model document (sourced figures intact) of `base / relative`, validated once.
    Only a regular file of at most `MAX_MODEL_FILE_BYTES` is read (no FIFO, no device)."""
    path = (base / relative)
    file = display_path(path)
    if not path.exists() and not path.is_symlink():
        raise InputError("model file: cannot read: No such file or directory (paths are relative to the recipe)",
                         file=file)
    document = read_yaml_file(path, limit=MAX_MODEL_FILE_BYTES, what="model file")
    if not isinstance(document, dict):
        raise InputError("a model file is one YAML mapping (name, decoder_layers, moe_layers, ...)", file=file)
    plain = to_plain(document)
    try:
        Model.model_validate(plain)
    except ValidationError as exc:
        raise validation_error(path, document, exc) from None
    return plain
