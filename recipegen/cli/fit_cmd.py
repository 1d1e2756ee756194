"""`recipegen fit RECIPE [LANE]`: fit a lane to its machine and write it back (thin layer over
`recipegen.fit`). Exit 0 fitted, 1 nothing fits (the reason and the smallest change that would),
2 bad input."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from recipegen.cli.types import FileNameText
from recipegen.common.errors import InputError


def parse_context(value: str | None) -> tuple[int | None, bool]:
    """`--max-model-len`: a token count (vLLM's k/K/m/M suffixes) or `auto`."""
    if value is None:
        return None, False
    if value.strip().lower() == "auto":
        return None, True
    from recipegen.common.units import UnitError, parse_positive_count

    try:
        n = parse_positive_count(value)
    except UnitError as exc:
        raise InputError(f"{exc} (a token count such as 32768 or 32K, or auto)", field="--max-model-len") from None
    return n, False


def fit_options(min_sequences: int, max_model_len: str | None, concurrency: int | None):
    from recipegen.fit.search import FitOptions

    if min_sequences < 1:
        raise InputError("must be at least 1", field="--min-sequences")
    if concurrency is not None and not 1 <= concurrency <= 65_536:
        raise InputError("must be between 1 and 65,536", field="--concurrency")
    length, auto = parse_context(max_model_len)
    return FitOptions(min_sequences=min_sequences, max_model_len=length, auto_context=auto, concurrency=concurrency)


WRITTEN_CONCURRENCY = "Most concurrent streams expected (written as the lane's concurrency.max)."


def context_options(func: Callable[..., Any] | None = None, *, concurrency_help: str = WRITTEN_CONCURRENCY) -> Any:
    """--concurrency and --max-model-len; `concurrency_help` for a command that writes no recipe."""
    if func is None:
        return lambda f: context_options(f, concurrency_help=concurrency_help)
    func = click.option("--concurrency", type=int, help=concurrency_help)(func)
    func = click.option("--max-model-len", "max_model_len",
                        help="Context in tokens, read as vLLM reads --max-model-len: 32768, 32K (= 32,768), "
                             "32k (= 32,000), 1M (= 1,048,576), 1m (= 1,000,000); or `auto`: the model's full "
                             "context if some placement fits it, else the longest multiple of 1,024 that does.")(func)
    return func


@click.command()
@click.argument("recipe")
@click.argument("lane", required=False)
@click.option("--min-sequences", default=1, show_default=True, type=int,
              help="Full-length (max_model_len) sequences the KV pool must hold.")
@context_options
@click.option("--dry-run", is_flag=True, help="Print the fit; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def fit(recipe: str, lane: str | None, min_sequences: int, max_model_len: str | None, concurrency: int | None,
        dry_run: bool, as_json: bool) -> None:
    """Fit LANE of RECIPE to its machine: the placement (all in HBM, usage-aware, positional), hot
    experts per layer, the load-time --cpu-offload-gb and (with --max-model-len auto) the context,
    at the boundary where every budget holds; build the class row maps at that count; write back.

    Exit 0 fitted (a second fit changes nothing), 1 nothing fits, 2 bad input.
    """
    from recipegen.fit.run import fit_recipe

    outcome = fit_recipe(recipe, lane, fit_options(min_sequences, max_model_len, concurrency), dry_run=dry_run)
    if as_json:
        click.echo(json.dumps(outcome.to_json(), indent=2))
    else:
        _explained("\n".join(outcome.lines()))
    sys.exit(outcome.exit_code)


@click.command()
@click.argument("model_arg", metavar="MODEL")
@click.option("--machine", "machine_arg", required=True,
              help="A catalog machine (`recipegen machine list` names them) or a machine file: one written by "
                   "`recipegen machine detect -o FILE`, or `catalog: <id>` plus the figures that differ "
                   "(e.g. `host_memory: 144 GiB`).")
@click.option("--lane", default="chat", show_default=True, help="The lane's name.")
@context_options
@click.option("--min-sequences", default=1, show_default=True, type=int,
              help="Full-length (max_model_len) sequences the KV pool must hold.")
@click.option("--gpus", "gpu_count", type=int, default=None,
              help="How many of the machine's GPUs the lane runs on, as one tensor-parallel engine on GPUs "
                   "0..N-1 (default: all of them). Fewer leaves the rest for other lanes; the estimate counts "
                   "no all-reduces between GPUs, so it flatters a model split over many.")
@click.option("--name", type=FileNameText("recipe", bounded=True),
              help="Recipe name (default: <model>-<machine>; for a machine file, <machine> is its own `name:`, "
                   "else its file name without .yaml).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Recipe file to write (default: recipes/<name>.yaml).")
@click.option("--force", is_flag=True, help="Overwrite an existing recipe (and model file).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def new(model_arg: str, machine_arg: str, lane: str, max_model_len: str | None, concurrency: int | None,
        min_sequences: int, gpu_count: int | None, name: str | None, output, force: bool, as_json: bool) -> None:
    """A one-lane recipe for MODEL on a machine, fitted like `recipegen fit` (default context: the
    model's full context if it fits, else the longest that does; 32,768 tokens where the model
    declares no max_position_embeddings) and written only when every budget holds.

    MODEL is a catalog model (qwen3-30b-a3b; `recipegen model list` names them), a model file
    (models/<name>.yaml, as `recipegen model import` writes it; the recipe reads it as
    `model: {file: …}`, where it is or, outside the recipe's project, copied beside it), a local
    config.json or checkpoint folder, or a Hugging Face id (Qwen/Qwen3-30B-A3B[@revision]:
    config.json, hf_quant_config.json, the safetensors index and shard headers, no weights;
    HF_TOKEN, HF_HUB_OFFLINE and the hub cache honoured; pip install 'recipegen[hf]'). Exit 0
    written, 1 nothing fits, 2 bad input.
    """
    import shlex

    from recipegen.fit.new import new_recipe

    options = fit_options(min_sequences, max_model_len, concurrency)
    options_len = None if options.auto_context else options.max_model_len
    # the command as far as it shapes the file (not where it goes, --force or --json), so the recipe's
    # header comment reproduces it
    shaping = [("--lane", lane if lane != "chat" else None), ("--max-model-len", max_model_len),
               ("--concurrency", concurrency), ("--min-sequences", min_sequences if min_sequences != 1 else None),
               ("--gpus", gpu_count), ("--name", name)]
    command = " ".join([f"recipegen new {shlex.quote(model_arg)} --machine {shlex.quote(machine_arg)}",
                        *(f"{flag} {shlex.quote(str(value))}" for flag, value in shaping if value is not None)])
    outcome = new_recipe(model_arg, machine_arg, lane=lane, max_model_len=options_len, concurrency=concurrency,
                         min_sequences=min_sequences, gpu_count=gpu_count, output=output, name=name, force=force,
                         command=command)
    if as_json:
        payload = outcome.fit.to_json() if outcome.fit is not None else {}
        payload.update(recipe_path=str(outcome.recipe_path), written=outcome.written,
                       model=outcome.model.label, model_notes=outcome.model.notes + outcome.notes,
                       model_file=str(outcome.model_file) if outcome.model_file else None,
                       model_reference=outcome.model_ref)
        click.echo(json.dumps(payload, indent=2))
    else:
        _explained("\n".join(outcome.lines()))
    sys.exit(0 if outcome.written else 1)


@click.command()
@click.argument("recipe")
@click.argument("lane", required=False)
@click.option("--machines", required=True,
              help="Comma-separated catalog machines (`recipegen machine list`) and/or machine files "
                   "(`recipegen machine detect -o FILE`, or `catalog: <id>` plus the figures that differ).")
@click.option("--min-sequences", default=1, show_default=True, type=int,
              help="Full-length (max_model_len) sequences the KV pool must hold.")
@context_options(concurrency_help="Most concurrent streams expected: every machine is fitted as if the lane's "
                                  "concurrency.max were this (nothing is written).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable table.")
def compare(recipe: str, lane: str | None, machines: str, min_sequences: int, max_model_len: str | None,
            concurrency: int | None, as_json: bool) -> None:
    """Fit RECIPE's lane onto each machine (all of its GPUs) and tabulate: fits, placement, hot
    experts per layer, KV tokens and full-length sequences, pinned host memory, speed figure.
    Writes nothing. Exit 0 when the lane fits some machine, 1 when it fits none."""
    from recipegen.fit.compare import compare as run_compare
    from recipegen.fit.compare import rows_json, table_lines
    from recipegen.fit.new import machine_key, resolve_machine

    names = [m.strip() for m in machines.split(",") if m.strip()]
    if not names:
        raise InputError("name at least one machine", field="--machines")
    entries = [(n, resolve_machine(n, "--machines")) for n in names]
    resolved = [(n, machine) for n, (_, machine, _) in entries]
    keys = [machine_key(n, entry) for n, (entry, _, _) in entries]
    rows = run_compare(recipe, lane, resolved, fit_options(min_sequences, max_model_len, concurrency), keys)
    first = rows[0].outcome
    if as_json:
        click.echo(json.dumps({"recipe": first.recipe, "lane": first.lane, "machines": rows_json(rows)}, indent=2))
    else:
        _explained("\n".join(table_lines(rows, first.recipe, first.lane, first.result.max_model_len)))
    sys.exit(0 if any(r.outcome.fitted for r in rows) else 1)


def _explained(text: str) -> None:
    """A report for people, its shorthand explained after it."""
    from recipegen.cli.output import explained

    with explained() as say:
        say(text)
