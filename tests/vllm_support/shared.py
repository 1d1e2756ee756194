"""One engine boot per server configuration, shared by every test module that reads it.

Several modules ask the same tiny-MoE server configuration for different things (the unsplit
reference: the parity module's prompts, `recipegen parity`'s recording, the adaptive test's two
phases). Booting it once for all of them saves a 40-60 s boot each. A module says what it asks
of a shared server at import, with ``@shared_job(boot, name)``; the boot's session fixture
(``shared_boot`` in tests/vllm/conftest.py) starts the server once, runs every registered job on
it (``first=True`` before the others: a job that needs the counters as the boot left them, at
most one per boot), stops it, and hands each module its jobs' results by name, with the server's
whole log. Only the jobs of the modules pytest imported run: a file run alone asks for its own
requests only.

The configurations (``BOOTS``) are the union of what their jobs need: every shared boot counts
alongside (a dump folder, lane ``tiny``, class ``mixed``): counting reads the router's picks and
changes no output, so a job that ignores the counts sees what a server without them would serve.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .server import REPO_ROOT, VllmServer


@dataclass(frozen=True)
class SharedContext:
    """What a job gets besides the server: its own scratch folder, the tiny model, the row maps
    built from the count-only profile (``hot5``, ``hot6``; residency boots only), the results of
    the boots it declared in ``needs``, and the server's dump folder."""

    work: Path
    model_dir: Path
    maps: dict[str, Path]
    earlier: dict[str, "SharedBoot"]
    dump_dir: Path


@dataclass
class SharedBoot:
    """A shared boot after its server stopped: each job's result (or what it raised), the
    server's log and exit status, its dump folder."""

    name: str
    results: dict[str, Any]
    errors: dict[str, BaseException]
    log: str
    returncode: int | None
    log_path: Path
    dump_dir: Path

    def result(self, job: str) -> Any:
        """The job's result; what it raised, raised again, for the tests that read it."""
        if job in self.errors:
            raise self.errors[job]
        if job not in self.results:
            raise KeyError(f"no job {job!r} ran on the shared boot {self.name!r}")
        return self.results[job]


@dataclass(frozen=True)
class Job:
    boot: str
    name: str
    run: Callable[[VllmServer, SharedContext], Any]
    first: bool = False
    needs: tuple[str, ...] = ()


@dataclass
class Registry:
    jobs: dict[str, list[Job]] = field(default_factory=dict)

    def add(self, job: Job) -> None:
        if job.boot not in BOOTS:
            raise ValueError(f"no shared boot {job.boot!r} (known: {sorted(BOOTS)})")
        jobs = self.jobs.setdefault(job.boot, [])
        if any(j.name == job.name for j in jobs):
            raise ValueError(f"two jobs named {job.name!r} on the shared boot {job.boot!r}")
        if job.first and any(j.first for j in jobs):
            raise ValueError(f"two jobs need the {job.boot!r} server's counters untouched")
        jobs.append(job)

    def ordered(self, boot: str) -> list[Job]:
        jobs = self.jobs.get(boot, [])
        return [j for j in jobs if j.first] + [j for j in jobs if not j.first]

    def needs(self, boot: str) -> list[str]:
        return sorted({n for j in self.jobs.get(boot, []) for n in j.needs})


REGISTRY = Registry()

# The shared boots: boot name -> (map name or None for unsplit, dump interval in seconds).
BOOTS: dict[str, tuple[str | None, str]] = {
    "unsplit": (None, "0"),
    "residency-hot5": ("hot5", "0"),
    # This one also snapshots its counts every second (drift on a live lane).
    "residency-hot6": ("hot6", "1"),
}


def shared_job(boot: str, name: str, *, first: bool = False,
               needs: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn(server, ctx)`` to run on the shared ``boot``; its return value is
    ``shared_boot(boot).results[name]``. ``needs``: shared boots whose results it reads
    (``ctx.earlier``), booted before this one."""
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        REGISTRY.add(Job(boot, name, fn, first, tuple(needs)))
        return fn
    return register


def build_map(histogram: Path, hot: int, out: Path) -> Path:
    """`recipegen rowmap build HIST --hot N -o OUT`, as a user builds a class's map."""
    proc = subprocess.run([sys.executable, "-m", "recipegen", "rowmap", "build", str(histogram),
                           "--hot", str(hot), "-o", str(out)], capture_output=True, text=True,
                          cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    return out


def residency_env(rowmap_path: Path) -> dict[str, str]:
    """Residency with this row map (the content hash the engine checks it against)."""
    from expert_residency.formats import load_rowmap

    return {"EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_ROWMAP": str(rowmap_path),
            "EXPERT_RESIDENCY_CONTENT_HASH": load_rowmap(rowmap_path).content_hash()}
