"""Commands and the output lines a document quotes under them, read from its code blocks: a line
starting with `recipegen ` is a command (its words after `recipegen`), the non-blank lines after it
are what the document says it prints."""

from __future__ import annotations

import shlex


def commands_and_quotes(blocks: list[str]) -> list[tuple[list[str], list[str]]]:
    """(command argv, quoted output lines) over `blocks` (code blocks' text), in order."""
    out: list[tuple[list[str], list[str]]] = []
    for block in blocks:
        for line in block.strip("\n").splitlines():
            if line.startswith("recipegen "):
                out.append((shlex.split(line)[1:], []))
            elif line.strip():
                out[-1][1].append(line.rstrip())
    return out
