"""The reference model and machine of the cost model's calibration, read from the catalog.

The measured unique-experts points and the model's geometry live once, in the catalog
(`dsv41-flash-mxfp4`, `gb300-station`, each figure with its source); the cost model reads them
from there instead of keeping its own copies.
"""

from __future__ import annotations

from functools import cache

from recipegen.catalog import catalog_entry
from recipegen.schema import Machine, Model

REFERENCE_MODEL = "dsv41-flash-mxfp4"
REFERENCE_MACHINE = "gb300-station"


@cache
def reference_model() -> Model:
    """DeepSeek-V4.1-Flash (MXFP4) as the catalog declares it."""
    return Model.model_validate(catalog_entry("models", REFERENCE_MODEL))


@cache
def reference_machine() -> Machine:
    """The DGX Station GB300 as the catalog declares it."""
    return Machine.model_validate(catalog_entry("machines", REFERENCE_MACHINE))
