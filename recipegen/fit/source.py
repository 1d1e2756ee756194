"""`recipegen new MODEL`: what MODEL names — a catalog model, a model file (what `recipegen model
import` writes, and a recipe reads as `model: {file: …}`), a local `config.json` or checkpoint folder,
or a Hugging Face id (`org/name[@revision]`) — as a validated model and, for the last two, the model
file to write beside the recipe. A model file is read by the recipes' own loader
(`recipegen.load.model_file.load_model_file`); local checkpoints and hub ids go through the model
importer's public entry point (`recipegen.modelimport.import_model`), exactly as
`recipegen model import` does."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from recipegen.catalog import catalog_entry, catalog_names, load_catalog
from recipegen.common.errors import InputError, RecipegenError
from recipegen.fit.hub import parse_hub_id, staged_checkpoint
from recipegen.modelimport import import_model
from recipegen.schema import Model


@dataclass
class ModelSource:
    """The model a new recipe serves."""

    kind: str                      # catalog | file | checkpoint | hub
    name: str
    model: Model
    model_text: str | None = None  # the model file to write (models/<name>.yaml), when not a catalog model
    label: str = ""
    notes: list[str] = field(default_factory=list)
    file: Path | None = None       # kind `file`: the model file MODEL named, which the recipe references


def model_name_of(text: str) -> str:
    """A model / recipe name from a folder or repo name (`Qwen3-30B-A3B` -> `qwen3-30b-a3b`)."""
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._") or "model"


def resolve_model(arg: str) -> ModelSource:
    if arg in load_catalog("models"):
        return ModelSource("catalog", arg, _catalog_model(arg), label=f"catalog model {arg}")
    path = Path(arg).expanduser()
    if is_model_file(path):
        return _from_model_file(path, arg)
    if path.exists():
        folder = path if path.is_dir() else path.parent
        name = model_name_of(folder.resolve().name)
        model, text = import_model(path, name=name)
        return ModelSource("checkpoint", model.name, model, text, label=f"checkpoint {arg}")
    hub_id = parse_hub_id(arg)
    if hub_id is None:
        raise InputError("not a catalog model, a model file (models/<name>.yaml), a local config.json or "
                         "checkpoint folder, nor a Hugging Face id "
                         f"(org/name[@revision]); catalog models (`recipegen model list` describes them): "
                         f"{', '.join(catalog_names('models'))}",
                         field="MODEL")
    repo, revision = hub_id
    if revision is None:
        for name, entry in load_catalog("models").items():
            if str(entry.get("checkpoint", "")).lower() == repo.lower():
                source = ModelSource("catalog", name, _catalog_model(name), label=f"catalog model {name}")
                source.notes.append(f"{repo} is the catalog's {name} (imported from its config.json, with "
                                    f"provenance: docs/models.md); pass {repo}@main to read the hub instead")
                return source
    return _from_hub(repo, revision)


MODEL_FILE_SUFFIXES = (".yaml", ".yml")


def is_model_file(path: Path) -> bool:
    """Whether MODEL names a model file (one model mapping, what `recipegen model import` writes)
    rather than a `config.json`: a file whose name ends in .yaml / .yml."""
    return path.suffix.lower() in MODEL_FILE_SUFFIXES and path.is_file()


def _from_model_file(path: Path, arg: str) -> ModelSource:
    """A model file, read and validated by the loader recipes use for `model: {file: …}`."""
    from recipegen.load.model_file import load_model_file

    document = load_model_file(path.name, base=path.parent)
    try:
        model = Model.model_validate(document)
    except ValidationError as exc:  # load_model_file validated it: not expected
        raise InputError(f"model file does not validate: {exc.errors()[0]['msg']}", file=arg) from None
    return ModelSource("file", model.name, model, label=f"model file {arg}", file=path)


def _catalog_model(name: str) -> Model:
    try:
        return Model.model_validate(catalog_entry("models", name))
    except ValidationError as exc:  # a catalog bug, named
        raise RecipegenError(f"catalog model {name} does not validate: {exc.errors()[0]['msg']}") from None


def _from_hub(repo: str, revision: str | None) -> ModelSource:
    name = model_name_of(repo.split("/", 1)[1])
    with staged_checkpoint(repo, revision) as staged:
        here = str(staged.folder)
        try:
            model, text = import_model(staged.folder, name=name, checkpoint=repo)
        except RecipegenError as exc:  # name the checkpoint, not the temporary folder
            raise RecipegenError(str(exc).replace(here, staged.ref), exit_code=exc.exit_code) from None
        text = text.replace(here, staged.ref)
        # the commit the files came from, beside the checkpoint id
        text = re.sub(r"^(checkpoint: .*)$", lambda m: f"{m.group(1)}\nrevision: {staged.commit}", text, count=1,
                      flags=re.MULTILINE)
        model = model.model_copy(update={"revision": staged.commit})
        source = ModelSource("hub", name, model, text, label=f"{repo} at commit {staged.commit} (Hugging Face hub)")
        source.notes += [f"read {', '.join(staged.files)} from the hub (HF_TOKEN, HF_HUB_OFFLINE and the hub cache "
                         "honoured)"] + staged.notes
        return source
