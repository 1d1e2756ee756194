"""Every option of every command says what it does in --help (the help is the option's manual)."""

from __future__ import annotations

import click

from recipegen.cli import main


def _commands(group: click.Group, prefix: str = "recipegen"):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):       # the top-level group loads its commands lazily
        command = group.get_command(ctx, name)
        path = f"{prefix} {name}"
        yield path, command
        if isinstance(command, click.Group):
            yield from _commands(command, path)


def test_every_option_has_help_text():
    missing = [f"{path} {'/'.join(p.opts)}" for path, command in _commands(main) for p in command.params
               if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()]
    assert missing == []


def test_the_walk_reaches_nested_commands():
    paths = dict(_commands(main))
    assert {"recipegen plan", "recipegen check budgets", "recipegen rowmap synth", "recipegen parity"} <= set(paths)
