"""Machine files given as `recipegen new MODEL --machine FILE`: one machine mapping (what `recipegen
machine detect -o FILE` writes, or one written by hand).

Read like a recipe (the same YAML parser and the same error wording), so a mistake in it is
reported with the machine file's own line and field, as it would be inline under a recipe's
`machines:`. Like a recipe's `machines:` entry it may start from a catalog machine and override
figures (`catalog: h200-pcie` with `host_memory: 144 GiB`), through the same resolver
(`recipegen.schema.MachineEntry`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from recipegen.catalog import catalog_entry
from recipegen.common.errors import InputError
from recipegen.load.document import display_path, read_yaml_file, to_plain, validation_error
from recipegen.schema import Machine, MachineEntry
from recipegen.schema.recipe import same_gpu_kind

# A detected entry is about 2 KB; anything near this is not a machine file.
MAX_MACHINE_FILE_BYTES = 1 * 2**20
_MACHINE_ENTRY: TypeAdapter[Machine] = TypeAdapter(MachineEntry)
WHOLE_ENTRY_HINT = ("to fix it: write the whole entry (`recipegen machine detect -o FILE` on the box writes "
                    "one), or start from a catalog machine and give only the figures that differ, e.g. "
                    "`catalog: h200-pcie` and `host_memory: 144 GiB` (`recipegen machine list` names them)")


def load_machine_file(path: Path) -> tuple[dict[str, Any], Machine]:
    """The raw entry (sourced figures intact, what a recipe's `machines:` takes: an inline machine or
    `{catalog: name, …overrides}`) and the validated machine of the file at `path`. Only a regular
    file of at most `MAX_MACHINE_FILE_BYTES` is read."""
    document = read_yaml_file(path, limit=MAX_MACHINE_FILE_BYTES, what="machine file")
    if not isinstance(document, dict):
        raise InputError("a machine file is one YAML mapping (name, gpus, host_memory, ...)",
                         file=display_path(path))
    plain = to_plain(document)
    try:
        machine = _MACHINE_ENTRY.validate_python(plain, context={"catalog": catalog_entry})
    except ValidationError as exc:
        error = validation_error(path, document, exc)
        missing = [e["loc"] for e in exc.errors() if e["type"] == "missing"]
        if "catalog" not in plain:
            hint = WHOLE_ENTRY_HINT if missing else None
        else:
            hint = _other_gpu_hint(plain) if any(loc[:1] == ("gpus",) for loc in missing) else None
        if hint is None:
            raise error from None
        raise InputError(f"{error.message}\n  {hint}", file=error.file, line=error.line,
                         field=error.field) from None
    return plain, machine


def _other_gpu_hint(plain: dict[str, Any]) -> str | None:
    """For a file that starts from a catalog machine and misses `gpus` fields: its `gpus.kind` is not
    the catalog machine's, so its `gpus` block replaced the catalog's whole (None otherwise)."""
    given = plain.get("gpus")
    if not isinstance(given, dict) or "kind" not in given or not isinstance(plain["catalog"], str):
        return None
    try:
        base = catalog_entry("machines", plain["catalog"]).get("gpus") or {}
    except ValueError:
        return None
    if same_gpu_kind(given["kind"], base.get("kind")):
        return None
    kind = base.get("kind")
    return (f"to fix it: `gpus.kind` {str(given['kind'])[:40]!r} is not the GPU of catalog machine "
            f"{plain['catalog']} ({kind!r}), and a `gpus` block of another kind replaces the catalog's whole "
            f"`gpus` block: leave `kind` out (or write {kind!r}) to keep the catalog's GPU figures and change "
            "only those given, or give the whole block (count, hbm, hbm_bandwidth and compute_capability)")
