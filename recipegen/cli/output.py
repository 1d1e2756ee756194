"""Output for people: lines echoed as they come, then one line for each piece of shorthand they used.

A command that prints a report wraps its text output in `explained()` and echoes through what it
yields; at the end (also when the command exits 1) the shorthand the report used is explained
(recipegen.common.glossary). Machine output (`--json`) does not go through here.

Only recipegen's own words are matched against the glossary, not what the user gave it: the
values given on the command line (paths, URLs, names: `command_line_values`) and any the command
names (`user_text=`, e.g. what a server or a recording said) are masked before matching
(`glossary.mask_user_text`), so a recording named v14.json gets no footnote about the reference
lane's v14.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import PurePath
from typing import Any

import click

from recipegen.common.glossary import footnotes


def command_line_values(ctx: click.Context | None = None) -> list[str]:
    """The text values the user gave the running command (and the groups above it) on the command
    line or through the environment: its arguments and options that read text or paths, as given
    and, for a path, its file name (reports often print a path resolved or shortened). Defaults
    are recipegen's own; choices (click.Choice) are recipegen's words the user picked from."""
    from click.core import ParameterSource

    ctx = ctx if ctx is not None else click.get_current_context(silent=True)
    values: list[str] = []
    while ctx is not None:
        for param in ctx.command.params:
            if param.name is None or isinstance(param.type, click.Choice):
                continue
            if ctx.get_parameter_source(param.name) in (None, ParameterSource.DEFAULT):
                continue
            given = ctx.params.get(param.name)
            for value in given if isinstance(given, (list, tuple)) else (given,):
                if isinstance(value, (str, PurePath)):
                    values.append(str(value))
                    if isinstance(value, PurePath) or isinstance(param.type, click.Path):
                        values.append(PurePath(value).name)
        ctx = ctx.parent
    return values


class ExplainedEcho:
    """`click.echo` for stdout that remembers what it printed.

    `user_text`: values the command printed that are not recipegen's words (what a server or a
    recording said, names from the user's files); with the command line's own values
    (`command_line_values`) they are left out when the shorthand is matched."""

    def __init__(self, user_text: Iterable[str] = ()) -> None:
        self._printed: list[str] = []
        self._user_text: list[str] = list(user_text)

    def __call__(self, message: Any = "", **kwargs: Any) -> None:
        click.echo(message, **kwargs)
        if not kwargs.get("err"):
            self._printed.append(str(message))

    def user_text(self, values: Iterable[str]) -> None:
        """Values the command prints (or printed) that are the user's, not recipegen's words."""
        self._user_text.extend(values)

    def finish(self) -> None:
        """Print the explanation of the shorthand printed so far (nothing when there was none)."""
        lines = footnotes("\n".join(self._printed), [*self._user_text, *command_line_values()])
        self._printed.clear()
        if lines:
            click.echo("")
            click.echo("\n".join(lines))


@contextmanager
def explained(user_text: Iterable[str] = ()) -> Iterator[ExplainedEcho]:
    """Yield an echo; on leaving, print the explanation of the shorthand it printed (the values
    in `user_text` and on the command line left out: `ExplainedEcho`)."""
    echo = ExplainedEcho(user_text)
    try:
        yield echo
    finally:
        echo.finish()


def echo_catalog_list(kind: str, as_json: bool) -> None:
    """`recipegen model list` / `machine list`: each catalog entry's id and its line
    (`recipegen.catalog.entry_lines`), in columns or as JSON."""
    import json

    from recipegen.catalog import entry_lines

    lines = entry_lines(kind)
    if as_json:
        click.echo(json.dumps([{"id": name, "summary": text} for name, text in lines], indent=2))
        return
    width = max(len(name) for name, _ in lines)
    for name, text in lines:
        click.echo(f"{name:<{width}}  {text}")
