"""The recipe: schema version, name, model, machines and lanes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StringConstraints, ValidationInfo, field_validator, model_validator

from recipegen.schema.base import PathError, StrictModel
from recipegen.schema.lane import Lane
from recipegen.schema.machine import Machine
from recipegen.schema.model import Model
from recipegen.schema.monitoring import Monitoring
from recipegen.schema.patterns import FILE_NAME, NAME_MAX_LENGTH, SERVICE_NAME

SCHEMA_VERSION = 1


def _resolve(kind: str, value: Any, info: ValidationInfo) -> Any:
    """A catalog name, or `{catalog: name, <overrides>}`, becomes the catalog entry (+ overrides).

    The catalog sits above the schema: the recipe reader passes its lookup in the validation
    context (`catalog`: (kind, name) -> entry)."""
    if not isinstance(value, str) and not (isinstance(value, dict) and "catalog" in value):
        return value
    catalog_entry = (info.context or {}).get("catalog")
    if catalog_entry is None:
        raise ValueError("a catalog name is looked up in recipegen.catalog: load the recipe with "
                         "recipegen.load.recipe.load_recipe")
    if isinstance(value, str):
        return catalog_entry(kind, value)
    if isinstance(value, dict) and "catalog" in value:
        name = value["catalog"]
        if not isinstance(name, str):
            raise PathError("catalog must be a catalog name", ("catalog",))
        try:
            entry = dict(catalog_entry(kind, name))
        except ValueError as exc:  # unknown name: reported at the `catalog:` line
            raise PathError(str(exc), ("catalog",)) from None
        overrides = {k: v for k, v in value.items() if k != "catalog"}
        overrides.update(_same_gpu_overrides(entry, overrides))
        # An overridden figure no longer carries the catalog's source.
        sources = {k: v for k, v in (entry.get("sources") or {}).items()
                   if k.split(".")[0].split("[")[0] not in overrides}
        entry.update(overrides)
        entry["sources"] = {**sources, **(overrides.get("sources") or {})}
        return entry
    return value


def _same_gpu_overrides(entry: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A `gpus` override of the catalog's own GPU kind (or naming none) changes only the fields it
    names: the box's driver-reported `hbm` or its GPU count must not drop the catalog's compute
    capability, which picks the MoE backend and the runtime's bank kernel. The kind is compared
    without letter case (`h200` is the catalog's `H200`), and the catalog's spelling is kept.
    Another kind replaces the whole block."""
    base, given = entry.get("gpus"), overrides.get("gpus")
    if not isinstance(base, dict) or not isinstance(given, dict):
        return {}
    if "kind" in given and not same_gpu_kind(given["kind"], base.get("kind")):
        return {}
    return {"gpus": {**base, **given, **({"kind": base["kind"]} if "kind" in base else {})}}


def same_gpu_kind(a: Any, b: Any) -> bool:
    """Whether two `gpus.kind` values name one GPU: equal but for letter case and outer spaces."""
    return isinstance(a, str) and isinstance(b, str) and a.strip().casefold() == b.strip().casefold()


MachineEntry = Annotated[Machine, BeforeValidator(lambda v, info: _resolve("machines", v, info))]
"""A machine as a recipe's `machines:` and a machine file (`recipegen new --machine FILE`) both take
it: a catalog name, `{catalog: name, …overrides}`, or inline; the catalog lookup comes in the
validation context (`catalog`)."""


def _model_file(value: dict[str, Any], info: ValidationInfo) -> Any:
    """`{file: models/<name>.yaml, <overrides>}`: the model file (read by the loader the recipe
    reader passes in the validation context, relative to the recipe) plus overrides."""
    name = value["file"]
    if not isinstance(name, str) or not name:
        raise ValueError("file must be a path to a model file (relative to the recipe)")
    loader = (info.context or {}).get("model_file")
    if loader is None:
        raise ValueError("model.file is read relative to the recipe file: load the recipe with "
                         "recipegen.load.recipe.load_recipe")
    entry = dict(loader(name))
    overrides = {k: v for k, v in value.items() if k != "file"}
    sources = {k: v for k, v in (entry.get("sources") or {}).items()
               if k.split(".")[0].split("[")[0] not in overrides}
    entry.update(overrides)
    if sources or "sources" in overrides:
        entry["sources"] = {**sources, **(overrides.get("sources") or {})}
    return entry


class Recipe(StrictModel):
    """A serving recipe: one model on one or more machines, served by lanes."""

    version: Literal[1]
    """Schema version of this file (currently 1)."""
    name: str = Field(pattern=FILE_NAME.regex, max_length=NAME_MAX_LENGTH)
    """Recipe name, the recipe's file name without `.yaml` (`recipes/<name>.yaml`): rendered
    output goes to `compose/<name>/`, and commands name the recipe by its file."""
    description: str = ""
    """Free text."""
    model: Model
    """A model catalog name (`recipegen/catalog/models.yaml`, `recipegen/catalog/models/`),
    `{catalog: name, …overrides}`, `{file: models/<name>.yaml, …overrides}` (a model file written by
    `recipegen model import`, relative to the recipe), or an inline model."""
    machines: dict[Annotated[str, StringConstraints(pattern=SERVICE_NAME.regex, max_length=NAME_MAX_LENGTH)],
                   MachineEntry] = Field(min_length=1)
    """Machines by key: each a catalog name, `{catalog: name, address: …}`, or inline."""
    lanes: list[Lane] = Field(min_length=1)
    """The lanes (one vLLM engine and one compose service each)."""
    monitoring: Monitoring | None = None
    """Prometheus metrics of the residency runtime on each lane's `/metrics`, and the `monitoring`
    compose profile (Prometheus, Grafana with the expert-residency dashboard). Absent: off."""

    @field_validator("version", mode="before")
    @classmethod
    def _version_is_an_integer(cls, value: Any) -> Any:
        # YAML's `true` is Python's True, which equals 1: read as a version it would pass
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"the schema version is the integer 1 (got {str(value)[:20]!r}, a "
                             f"{type(value).__name__})")
        return value

    @model_validator(mode="before")
    @classmethod
    def _name_inline_machines(cls, data: Any) -> Any:
        """An inline machine without a `name` takes its key."""
        if isinstance(data, dict) and isinstance(data.get("machines"), dict):
            machines = {}
            for key, value in data["machines"].items():
                if isinstance(value, dict) and "catalog" not in value and "name" not in value:
                    value = {"name": key, **value}
                machines[key] = value
            data = {**data, "machines": machines}
        return data

    @field_validator("model", mode="before")
    @classmethod
    def _model_from_catalog(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, dict) and "file" in value:
            return _model_file(value, info)
        return _resolve("models", value, info)

    @model_validator(mode="after")
    def _context_fits_the_model(self) -> Recipe:
        limit = self.model.max_position_embeddings
        for i, lane in enumerate(self.lanes):
            if limit is None or lane.max_model_len <= limit or lane.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1":
                continue
            raise PathError(f"max_model_len {lane.max_model_len:,} exceeds the model's max_position_embeddings "
                            f"{limit:,}: vLLM refuses it (lower it, override the model's max_position_embeddings "
                            "for a rope-scaled context, or set env VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)",
                            ("lanes", i, "max_model_len"))
        return self

    @model_validator(mode="after")
    def _monitoring_fits(self) -> Recipe:
        """The monitoring services' host ports are their own, and the window holds two scrapes."""
        monitoring = self.monitoring
        if monitoring is None:
            return self
        if monitoring.window_s < 2 * monitoring.scrape_interval_s:
            raise PathError(f"window {monitoring.window} holds fewer than two scrapes of "
                            f"{monitoring.scrape_interval}", ("monitoring", "window"))
        if monitoring.prometheus_port == monitoring.grafana_port:
            raise PathError(f"grafana_port {monitoring.grafana_port} is prometheus_port too",
                            ("monitoring", "grafana_port"))
        for field in ("prometheus_port", "grafana_port"):
            port = getattr(monitoring, field)
            for lane in self.lanes:
                if lane.port == port:
                    raise PathError(f"{field} {port} is lane {lane.name}'s port", ("monitoring", field))
        # a multi-node lane's master_port against these ports: recipegen.multinode.checks
        return self

    def lane(self, name: str) -> Lane:
        for lane in self.lanes:
            if lane.name == name:
                return lane
        raise KeyError(name)
