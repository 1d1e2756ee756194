"""Reading vLLM flags out of a lane's `extra_args` (the ledger's one parser of them)."""

from __future__ import annotations


def flag_value(args: list[str], flag: str) -> str | None:
    """`--flag VALUE` or `--flag=VALUE` in a lane's extra_args; None when absent."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None
