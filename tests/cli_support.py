"""Run the ``recipegen`` CLI in-process for a test: ``invoke("render", "dsv41-flash-gb300")``.

One helper instead of a ``run(*args)`` wrapper per test file: it calls click's
``CliRunner().invoke(main, ...)`` and hands back a `CliResult` whose fields say which stream
a test reads (``stdout``, ``stderr``, or ``output``, the two as the user's terminal shows them).
A Python exception escaping the command (a traceback where the user should get an error
message) fails the test there, its traceback shown; ``SystemExit``, the CLI's ordinary way of
exiting with a code, does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from click.testing import CliRunner

from recipegen.cli import main


@dataclass(frozen=True)
class CliResult:
    """What one ``recipegen`` run left behind."""

    code: int
    """The exit code."""
    stdout: str
    stderr: str
    output: str
    """stdout and stderr interleaved in the order they were written."""


def invoke(*args: str, env: Mapping[str, str | None] | None = None) -> CliResult:
    """``recipegen ARGS`` in this process (the current folder, ``env`` added to the environment).

    Raises AssertionError, chained to the exception, if the command raised anything but SystemExit."""
    __tracebackhide__ = True   # pytest: a failure points at the test's call, the command's traceback below it
    result = CliRunner().invoke(main, list(args), env=env)
    exception = result.exception
    if exception is not None and not isinstance(exception, SystemExit):
        raise AssertionError(f"recipegen {' '.join(args)} raised {type(exception).__name__}: {exception}\n"
                             f"output:\n{result.output}") from exception
    return CliResult(code=result.exit_code, stdout=result.stdout, stderr=result.stderr, output=result.output)
