"""The `recipegen` command: a thin layer over the library.

Subcommands live in their own modules and are imported lazily, so `recipegen check budgets`
does not pay for importing docker, httpx or matplotlib.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import NoReturn

import click

from recipegen import __version__
from recipegen.common.errors import RecipegenError

# command name -> "module:attribute"; each module owns its command(s).
COMMANDS: dict[str, str] = {
    "check": "recipegen.cli.check_cmd:check",
    "schema": "recipegen.cli.schema_cmd:schema",
    "render": "recipegen.cli.render_cmd:render",
    "rowmap": "recipegen.cli.rowmap_cmd:rowmap",
    "plan": "recipegen.cli.plan_cmd:plan",
    "up": "recipegen.cli.ops_cmd:up",
    "swap": "recipegen.cli.ops_cmd:swap",
    "status": "recipegen.cli.ops_cmd:status",
    "verify": "recipegen.cli.ops_cmd:verify",
    "doctor": "recipegen.cli.ops_cmd:doctor",
    "profile": "recipegen.cli.ops_cmd:profile",
    "drift": "recipegen.cli.ops_cmd:drift",
    "parity": "recipegen.cli.acceptance_cmd:parity",
    "knee": "recipegen.cli.acceptance_cmd:knee",
    "k8s": "recipegen.cli.k8s_cmd:k8s",
    "model": "recipegen.cli.model_cmd:model",
    "fit": "recipegen.cli.fit_cmd:fit",
    "new": "recipegen.cli.fit_cmd:new",
    "compare": "recipegen.cli.fit_cmd:compare",
    "machine": "recipegen.cli.machine_cmd:machine",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if self._load(name) is not None)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._load(cmd_name)

    @staticmethod
    def _load(name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:  # command not built yet
                return None
            raise
        return getattr(module, attr, None)

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        # tokens after the program name (click >= 8.2 keeps the subcommand's name among them)
        args = list(ctx.args)
        json_out = "--json" in (args[:args.index("--")] if "--" in args else args)

        def fail(message: str, exit_code: int) -> NoReturn:
            click.echo(f"error: {message}", err=True)
            if json_out:   # a script reading --json's stdout gets a document on failure too
                click.echo(json.dumps({"ok": False, "error": message, "exit_code": exit_code}))
            sys.exit(exit_code)

        try:
            _recover_interrupted_swaps()
            return super().invoke(ctx)
        except BrokenPipeError:
            _reader_left()
        except RecipegenError as exc:
            fail(str(exc), exc.exit_code)
        except click.ClickException as exc:
            if not json_out:
                raise   # click prints its usage error as always
            exc.show()
            click.echo(json.dumps({"ok": False, "error": exc.format_message(), "exit_code": exc.exit_code}))
            sys.exit(exc.exit_code)
        except OSError as exc:
            # A folder that is read-only, full, or blocked by a file: the path and the reason,
            # not a traceback (exit 2 like any other bad input).
            where = f"{exc.filename}" if exc.filename is not None else ""
            where += f" -> {exc.filename2}" if exc.filename2 is not None else ""
            fail(f"{where + ': ' if where else ''}{exc.strerror or exc}", 2)
        except RecursionError:
            fail("input nested too deeply", 2)
        except ValueError as exc:
            # a row map / histogram / capture problem (file, line, field in its message) that
            # reached the boundary without a command-specific wrapper
            from expert_residency.formats.errors import FormatError

            if not isinstance(exc, FormatError):
                raise
            fail(str(exc), 2)


# How shells report a process killed by SIGPIPE (128 + 13).
SIGPIPE_EXIT = 141


def _reader_left() -> NoReturn:
    """Whoever read stdout stopped (`recipegen check budgets X | head -1`): no message, and the
    status a process killed by SIGPIPE reports, not 2, which means bad input. Point stdout at
    os.devnull first, so the interpreter's last flush of what is still buffered has nowhere to
    fail ("Exception ignored ... BrokenPipeError")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, ValueError, OSError):  # a stdout without a file descriptor (a test's capture)
        sys.stdout = os.fdopen(devnull, "w")
    else:
        os.close(devnull)
    sys.exit(SIGPIPE_EXIT)


def _recover_interrupted_swaps(folders: list | None = None) -> None:
    """Roll back a class swap a killed process left half done (recipegen.render.swap), before
    any command reads the recipes (of `recipes/`, or of `folders`). Costs one directory listing
    when there is none."""
    from recipegen.load.recipe import recipe_search_dirs

    for folder in folders if folders is not None else recipe_search_dirs():
        if folder.is_dir() and any(p.name.startswith(".") and ".recipegen-" in p.name
                                   for p in folder.iterdir()):
            from recipegen.common.lock import sweep_locks, sweep_temps
            from recipegen.render.swap import recover_interrupted

            for line in recover_interrupted(folder):
                click.echo(line, err=True)
            # what a process killed while writing here left: temps and lock files nobody holds
            sweep_temps(folder)
            sweep_locks(folder)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="recipegen")
def main() -> None:
    """Serving recipes for MoE models on memory-tiered GPU boxes.

    Workflow: check → render → up → status → profile → swap → verify.
    """
