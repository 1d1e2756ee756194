"""Refusing to serve: one clear log line, then a non-zero exit before the engine serves.

Every refusal logs exactly one line tagged ``EXPERT_RESIDENCY_REFUSED`` (on stderr and through
vLLM's logger) naming the reason and what to change, then raises ``ResidencyRefused``. In the API
server process (where the plugin first loads) that is a ``SystemExit`` with status 3, so
``vllm serve`` stops before spawning the engine; in the engine/worker processes it is an
exception that fails engine start-up, which makes ``vllm serve`` exit non-zero.
"""

from __future__ import annotations

import logging
import sys
from typing import NoReturn

REFUSAL_TAG = "EXPERT_RESIDENCY_REFUSED"
REFUSAL_EXIT_CODE = 3

logger = logging.getLogger("expert_residency.vllm_plugin")


class ResidencyRefused(RuntimeError):
    """The runtime refuses this configuration (message = the one-line reason)."""


def refusal_line(reason: str) -> str:
    return f"{REFUSAL_TAG}: {reason}"


def refuse(reason: str, *, exit_process: bool = False) -> NoReturn:
    """Log the refusal line once and stop: SystemExit(3) if ``exit_process``, else raise."""
    line = refusal_line(reason)
    print(line, file=sys.stderr, flush=True)
    if exit_process:
        raise SystemExit(REFUSAL_EXIT_CODE)
    raise ResidencyRefused(line)
