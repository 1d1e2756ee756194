"""Ask a runtime on this host for a snapshot: SIGUSR1 to the processes of a process tree that
catch it (the host-side twin of `engine.request_snapshot` for lanes started outside Docker).

Only catchers are signalled: SIGUSR1's default action terminates a process, and in vLLM the
runtime's handler lives in the worker process, not in the API server.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

PROC = Path("/proc")


def catches(pid: int, signum: int = signal.SIGUSR1, proc: Path = PROC) -> bool:
    """True when `pid` has a handler for `signum` (its bit in SigCgt of /proc/<pid>/status)."""
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool((int(line.split()[1], 16) >> (signum - 1)) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False


def process_tree(root: int, proc: Path = PROC) -> list[int]:
    """`root` and all its descendants (from /proc/<pid>/stat parent links)."""
    parents: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # the command may contain spaces and parentheses: fields follow the last ')'
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents[int(entry.name)] = ppid
    tree, frontier = [root], [root]
    while frontier:
        children = [pid for pid, ppid in parents.items() if ppid in frontier and pid not in tree]
        tree += children
        frontier = children
    return tree


def signal_catchers(root: int, signum: int = signal.SIGUSR1) -> list[int]:
    """Send `signum` to every process of `root`'s tree that catches it; the PIDs signalled."""
    sent = []
    for pid in process_tree(root):
        if catches(pid, signum):
            try:
                os.kill(pid, signum)
                sent.append(pid)
            except ProcessLookupError:
                continue
    return sent
