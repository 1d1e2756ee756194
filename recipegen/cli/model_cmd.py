"""`recipegen model import PATH`: write a model file from a Hugging Face config.json;
`recipegen model list`: the catalog models."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from recipegen.cli.types import FileNameText
from recipegen.common.errors import InputError
from recipegen.common.files import output_target

if TYPE_CHECKING:
    from recipegen.schema import Model


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
    from recipegen.modelimport import import_model
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
    experts = m.routed_expert_bytes
    click.echo(f"wrote {target}: {m.decoder_layers} layers ({m.num_moe_layers} MoE) × {m.routed_experts} experts, "
               f"top-{m.top_k}, {m.expert_bytes:,} B per expert ({experts / 2**30:,.2f} GiB of routed experts), "
               f"KV {m.kv_token_bytes:,.0f} B per token{kv_caps(m)}"
               + (f", state {m.state_bytes_per_sequence:,} B per sequence ({sum(len(g.layers) for g in m.state)} "
                  "state layers, one GPU)" if m.state_bytes_per_sequence else ""))


def kv_caps(m: Model) -> str:
    """"" when every layer keeps the whole sequence; else what the per-token KV figure assumes (every layer at full
    length) and which layers keep less: "at full length; 18 sliding layers hold at most 128 tokens". The ledger
    caps them per sequence at each lane's max_model_len (docs/ledger.md)."""
    caps = []
    for g in m.attention:
        if g.kind == "sliding" and g.window:
            caps.append(f"{len(g.layers)} sliding layer{'s' if len(g.layers) != 1 else ''} hold"
                        f"{'' if len(g.layers) != 1 else 's'} at most {g.window:,} tokens")
        elif g.kind == "chunked" and g.chunk:
            caps.append(f"{len(g.layers)} chunked-attention layer{'s' if len(g.layers) != 1 else ''} hold"
                        f"{'' if len(g.layers) != 1 else 's'} at most their {g.chunk:,}-token chunk plus the tokens "
                        "in flight")
    return f" at full length; {', '.join(caps)}" if caps else ""


@model.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the ids and their lines as JSON.")
def list_(as_json: bool) -> None:
    """The catalog models, one a line: the id `recipegen new` and a recipe's `model:` take,
    its layers, routed experts, top-k, expert format, routed-expert bytes and context."""
    from recipegen.cli.output import echo_catalog_list

    echo_catalog_list("models", as_json)
