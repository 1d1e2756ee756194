"""Machine files given as `recipegen new MODEL --machine FILE`: one machine mapping (what `recipegen
machine detect -o FILE` writes, or one written by hand).

Read like a recipe (the same YAML parser and the same error wording), so a mistake in it is
reported with the machine file's own line and field, as it would be inline under a recipe's
`machines:`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from recipegen.common.errors import InputError
from recipegen.load.document import display_path, read_yaml_file, to_plain, validation_error
from recipegen.schema import Machine

# A detected entry is about 2 KB; anything near this is not a machine file.
MAX_MACHINE_FILE_BYTES = 1 * 2**20


def load_machine_file(path: Path) -> tuple[dict[str, Any], Machine]:
    """The raw entry (sourced figures intact, what a recipe's `machines:` takes) and the validated
    machine of the file at `path`. Only a regular file of at most `MAX_MACHINE_FILE_BYTES` is read."""
    document = read_yaml_file(path, limit=MAX_MACHINE_FILE_BYTES, what="machine file")
    if not isinstance(document, dict):
        raise InputError("a machine file is one YAML mapping (name, gpus, host_memory, ...)",
                         file=display_path(path))
    plain = to_plain(document)
    try:
        machine = Machine.model_validate(plain)
    except ValidationError as exc:
        raise validation_error(path, document, exc) from None
    return plain, machine
