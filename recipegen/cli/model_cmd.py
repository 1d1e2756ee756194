"""`recipegen model import PATH`: write a model file from a Hugging Face config.json;
`recipegen model list`: the catalog models."""

from __future__ import annotations

import os
from pathlib import Path

import click

from recipegen.cli.types import FileNameText
from recipegen.common.errors import InputError
from recipegen.common.files import output_target


@click.group()
def model() -> None:
    """Models: list the catalog's, or import a Hugging Face config.json as a model file."""


@model.command("import")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Model file to write (default: recipes/models/<name>.yaml; '-' for stdout).")
@click.option("--name", type=FileNameText("model"), help="Model name (default: the folder's name, lowercased).")
@click.option("--checkpoint", help="Checkpoint to record as model.checkpoint: an absolute path on the serving "
              "machine or a Hugging Face repo id org/name, e.g. openai/gpt-oss-120b.")
@click.option("--force", is_flag=True, help="Overwrite an existing model file.")
def import_(path: Path, output: Path | None, name: str | None, checkpoint: str | None, force: bool) -> None:
    """PATH: a config.json, or a folder with config.json (and model.safetensors.index.json).

    Every figure in the written file names the config field, tensor or vLLM source line it came
    from; a recipe references it as `model: {file: models/<name>.yaml}`.
    """
    from recipegen.common.lock import locked, sweep_temps, write_atomically
    from recipegen.common.paths import project_path
    from recipegen.modelimport import import_model, import_summary
    from recipegen.schema.patterns import checkpoint_refusal

    # the option's value, named as the option (not as a field of config.json), before any reading
    problem = checkpoint_refusal(checkpoint) if checkpoint is not None else None
    if problem is not None:
        raise InputError(problem, field="--checkpoint")
    m, text = import_model(path, name=name, checkpoint=checkpoint)
    if output is not None and str(output) == "-":
        click.echo(text, nl=False)
        return
    target = output or Path("recipes") / "models" / f"{m.name}.yaml"
    if output is None or Path(os.path.abspath(output)).is_relative_to(Path.cwd()):
        # a project path: no link on the way may lead out of the project (recipes/models -> /etc)
        project_path(Path.cwd(), target, what="the model file")
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target, what=f"model file {target}", echo=click.echo):  # one import per target at a time
        if (target.exists() or target.is_symlink()) and not force:
            raise InputError("exists; pass --force to overwrite", file=str(target))
        output_target(target, "--output")   # --force replaces a regular file, never a device or a link
        sweep_temps(target.parent)  # what an import killed at its rename left
        write_atomically(target, text.encode("utf-8"))
    click.echo(f"wrote {target}: {import_summary(m)}")


@model.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the ids and their lines as JSON.")
def list_(as_json: bool) -> None:
    """The catalog models, one a line: the id `recipegen new` and a recipe's `model:` take,
    its layers, routed experts, top-k, expert format, routed-expert bytes and context."""
    from recipegen.cli.output import echo_catalog_list

    echo_catalog_list("models", as_json)
