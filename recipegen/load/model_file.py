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
from recipegen.load.document import describe_error, display_path, parse_yaml, problems_error, to_plain
from recipegen.schema import Model


def load_model_file(relative: str, *, base: Path) -> dict[str, Any]:
    """The raw model document (sourced figures intact) of `base / relative`, validated once."""
    path = (base / relative)
    file = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text", file=file) from None
    except OSError as exc:
        raise InputError(f"model file: cannot read: {exc.strerror} (paths are relative to the recipe)",
                         file=file) from None
    document = parse_yaml(text, file)
    if not isinstance(document, dict):
        raise InputError("a model file is one YAML mapping (name, decoder_layers, moe_layers, ...)", file=file)
    plain = to_plain(document)
    try:
        Model.model_validate(plain)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        errors.sort(key=lambda e: e["type"] != "extra_forbidden")
        raise problems_error(path, document, [describe_error(e) for e in errors]) from None
    return plain
