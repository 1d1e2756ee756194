"""Output for people: lines echoed as they come, then one line for each piece of shorthand they used.

A command that prints a report wraps its text output in `explained()` and echoes through what it
yields; at the end (also when the command exits 1) the shorthand the report used is explained
(recipegen.common.glossary). Machine output (`--json`) does not go through here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from recipegen.common.glossary import footnotes


class ExplainedEcho:
    """`click.echo` for stdout that remembers what it printed."""

    def __init__(self) -> None:
        self._printed: list[str] = []

    def __call__(self, message: Any = "", **kwargs: Any) -> None:
        click.echo(message, **kwargs)
        if not kwargs.get("err"):
            self._printed.append(str(message))

    def finish(self) -> None:
        """Print the explanation of the shorthand printed so far (nothing when there was none)."""
        lines = footnotes("\n".join(self._printed))
        self._printed.clear()
        if lines:
            click.echo("")
            click.echo("\n".join(lines))


@contextmanager
def explained() -> Iterator[Callable[..., None]]:
    """Yield an echo; on leaving, print the explanation of the shorthand it printed."""
    echo = ExplainedEcho()
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
