"""The real-engine tests' servers: one boot per server configuration, two boots at a time.

Booting a vLLM CPU server (three Python processes, each importing vLLM and torch one after the
other: 40-60 s on two cores) costs far more than anything the tests then ask of it, and while one
process imports, the other core idles. So:

* **One boot per configuration.** A module says what it asks of a server with
  ``@shared_job(boot, name)`` at import; the server is booted once for every module that
  registered a job on it, and each module gets its jobs' results by name. Several modules read
  the same configuration (the unsplit reference: the parity module's prompts, `recipegen
  parity`'s recording, the adaptive test's two phases): ``BOOTS`` holds those; a module adds its
  own configurations with ``register_boot``.
* **The next boot starts while the current server serves.** ``run_plan`` boots the registered
  configurations in order and launches the next one as soon as what its environment needs is
  known, so at most two servers are alive (one serving, one booting; ~3 GiB each). A job whose
  figures depend on the machine's load (``Boot.alone``) gets its server to itself.

Only the jobs of modules with a selected test run (tests/vllm/conftest.py narrows them after
collection): a file run alone boots what it asks for, no more. A job that raises fails the tests
that read its result (``SharedBoot.result``); the others' run on. ``first=True``: the job needs the
server's counters as the boot left them (at most one per boot; it runs before the others).

Every shared tiny-MoE boot counts alongside (a dump folder, lane ``tiny``, class ``mixed``):
counting reads the router's picks and changes no output, so a job that ignores the counts sees
what a server without them would serve.
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
    """What an environment builder or a job gets besides the server: a scratch folder, the tiny
    model, the row maps built from the count-only profile (``maps()``: ``hot5``, ``hot6``), the
    finished boots (``earlier``), the server's dump folder, and a folder all boots share
    (``scratch``: a checkpoint several boots serve)."""

    work: Path
    model_dir: Path
    maps: Callable[[], dict[str, Path]]
    earlier: dict[str, SharedBoot]
    dump_dir: Path
    scratch: Path


@dataclass
class SharedBoot:
    """A boot after its server stopped: each job's result (or what it raised), the server's log,
    exit status, dump folder and runtime environment."""

    name: str
    results: dict[str, Any]
    errors: dict[str, BaseException]
    log: str
    returncode: int | None
    log_path: Path
    dump_dir: Path
    env: dict[str, str] = field(default_factory=dict)

    def result(self, job: str) -> Any:
        """The job's result; what it raised, raised again, for the tests that read it."""
        if job in self.errors:
            raise self.errors[job]
        if job not in self.results:
            raise KeyError(f"no job {job!r} ran on the boot {self.name!r} (its module's tests "
                           "were not selected?)")
        return self.results[job]


Env = Callable[[SharedContext], dict[str, str]]


@dataclass(frozen=True)
class Boot:
    """A server configuration. ``env``: its runtime environment, from the context (``maps()``
    may be called: the count-only profile is then booted before it); ``after``: boots whose
    results ``env`` reads; ``model``: another checkpoint than the tiny MoE; ``alone``: no other
    server boots while its jobs run (their figures depend on the machine's load); ``refused``:
    the server is expected to exit before it is ready (its jobs run after the exit, on its log
    and exit status)."""

    name: str
    env: Env
    extra_args: tuple[str, ...] = ()
    extra_pythonpath: tuple[Path, ...] = ()
    model: Callable[[SharedContext], Path] | None = None
    after: tuple[str, ...] = ()
    uses_maps: bool = False
    alone: bool = False
    refused: bool = False


@dataclass(frozen=True)
class Job:
    boot: str
    name: str
    run: Callable[[VllmServer, SharedContext], Any]
    module: str
    first: bool = False
    needs: tuple[str, ...] = ()
    alone: bool = False


@dataclass
class Registry:
    boots: dict[str, Boot] = field(default_factory=dict)
    jobs: dict[str, list[Job]] = field(default_factory=dict)

    def add_boot(self, boot: Boot) -> None:
        if boot.name in self.boots:
            raise ValueError(f"two boots named {boot.name!r}")
        unknown = [b for b in boot.after if b not in self.boots]
        if unknown:
            raise ValueError(f"boot {boot.name!r} comes after unknown boots {unknown}")
        self.boots[boot.name] = boot

    def add(self, job: Job) -> None:
        if job.boot not in self.boots:
            raise ValueError(f"no boot {job.boot!r} (known: {sorted(self.boots)})")
        jobs = self.jobs.setdefault(job.boot, [])
        if any(j.name == job.name for j in jobs):
            raise ValueError(f"two jobs named {job.name!r} on the boot {job.boot!r}")
        if job.first and any(j.first for j in jobs):
            raise ValueError(f"two jobs need the {job.boot!r} server's counters untouched")
        jobs.append(job)

    def plan(self, modules: set[str] | None) -> list[tuple[Boot, list[Job]]]:
        """The boots with a job of a selected module (all modules: None), in registration order
        (``after`` and ``needs`` point backwards), each with its jobs, ``first`` first."""
        out = []
        for name, boot in self.boots.items():
            jobs = [j for j in self.jobs.get(name, []) if modules is None or j.module in modules]
            if jobs:
                out.append((boot, [j for j in jobs if j.first] + [j for j in jobs if not j.first]))
        order = [boot.name for boot, _ in out]
        for i, (boot, jobs) in enumerate(out):
            wanted = [*boot.after, *(n for j in jobs for n in j.needs)]
            missing = [n for n in wanted if n not in order]
            if missing:
                raise ValueError(f"boot {boot.name!r} needs {missing}, which no selected module "
                                 "asks for")
            late = [n for n in wanted if order.index(n) >= i]
            if late:
                raise ValueError(f"boot {boot.name!r} needs {late}, registered after it")
        return out


REGISTRY = Registry()


def register_boot(boot: Boot) -> Boot:
    REGISTRY.add_boot(boot)
    return boot


def shared_job(boot: str, name: str, *, first: bool = False, needs: tuple[str, ...] = (),
               alone: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn(server, ctx)`` to run on ``boot``; its return value is
    ``SharedBoot.result(name)``. ``needs``: boots whose results it reads (``ctx.earlier``);
    ``alone``: no other server boots meanwhile."""
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        REGISTRY.add(Job(boot, name, fn, fn.__module__, first, tuple(needs), alone))
        return fn
    return register


# -- the shared tiny-MoE configurations ----------------------------------------------------------


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


def _counting(ctx: SharedContext, interval_s: str) -> dict[str, str]:
    # A dump folder turns the counter on alongside (drift on a live lane).
    return {"EXPERT_RESIDENCY_DUMP_DIR": str(ctx.dump_dir),
            "EXPERT_RESIDENCY_DUMP_INTERVAL_S": interval_s,
            "EXPERT_RESIDENCY_LANE": "tiny", "EXPERT_RESIDENCY_CLASS": "mixed"}


register_boot(Boot("unsplit", lambda ctx: {"EXPERT_RESIDENCY_MODE": "unsplit",
                                           **_counting(ctx, "0")}))
register_boot(Boot("residency-hot5", lambda ctx: {**residency_env(ctx.maps()["hot5"]),
                                                  **_counting(ctx, "0")}, uses_maps=True))
# This one also snapshots its counts every second.
register_boot(Boot("residency-hot6", lambda ctx: {**residency_env(ctx.maps()["hot6"]),
                                                  **_counting(ctx, "1")}, uses_maps=True))


# -- running the plan ----------------------------------------------------------------------------


@dataclass
class _Launched:
    boot: Boot
    server: VllmServer | None
    ctx: SharedContext
    failed: BaseException | None = None


def run_plan(plan: list[tuple[Boot, list[Job]]], *, launch: Callable[..., VllmServer],
             model_dir: Path, maps: Callable[[], dict[str, Path]],
             folder: Callable[[str], Path], scratch: Path) -> dict[str, SharedBoot]:
    """Boot each configuration of ``plan`` once and run its jobs, the next boot launched while
    the current server serves (at most two alive). ``launch(name, env, extra_args,
    extra_pythonpath, model)`` starts a server without waiting; ``maps()`` computes the row maps
    (boots the count-only profile) and is called before any server that needs them is launched,
    while no other server than the first is booting."""
    done: dict[str, SharedBoot] = {}

    def start(boot: Boot) -> _Launched:
        work = folder(boot.name)
        ctx = SharedContext(work / "jobs", model_dir, maps,
                            {n: done[n] for n in boot.after}, work / "dumps", scratch)
        try:
            model = boot.model(ctx) if boot.model is not None else model_dir
            server = launch(boot.name, boot.env(ctx), list(boot.extra_args),
                            list(boot.extra_pythonpath), model)
        except Exception as exc:  # its jobs fail with it (an earlier boot's job failed, ...)
            return _Launched(boot, None, ctx, exc)
        return _Launched(boot, server, ctx)

    def can_start(boot: Boot) -> bool:
        return all(n in done for n in boot.after)

    if any(boot.uses_maps for boot, _ in plan):
        first = plan[0][0]
        ahead = start(first) if not first.uses_maps and can_start(first) else None
        maps()      # the count-only profile boots now, beside the first server at most
    else:
        ahead = None
    for i, (boot, jobs) in enumerate(plan):
        current = ahead if ahead is not None and ahead.boot is boot else start(boot)
        ahead = None
        following = plan[i + 1][0] if i + 1 < len(plan) else None
        alone = boot.alone or any(j.alone for j in jobs)
        if following is not None and not alone and can_start(following):
            ahead = start(following)
        done[boot.name] = _serve(current, jobs, done)
    return done


def _serve(launched: _Launched, jobs: list[Job], done: dict[str, SharedBoot]) -> SharedBoot:
    server, ctx = launched.server, launched.ctx
    results: dict[str, Any] = {}
    errors: dict[str, BaseException] = {}
    if server is None:
        assert launched.failed is not None
        return SharedBoot(launched.boot.name, results, {job.name: launched.failed for job in jobs},
                          "", None, ctx.work.parent / "serve.log", ctx.dump_dir)
    try:
        try:
            if launched.boot.refused:
                server.wait_until_exit()
            else:
                server.wait_ready()
        except Exception as exc:  # every job of a server that did not come up fails with it
            errors.update({job.name: exc for job in jobs})
        for job in jobs if not errors else []:
            job_ctx = SharedContext(ctx.work / job.name, ctx.model_dir, ctx.maps,
                                    {**ctx.earlier, **{n: done[n] for n in job.needs}},
                                    ctx.dump_dir, ctx.scratch)
            job_ctx.work.mkdir(parents=True)
            try:
                results[job.name] = job.run(server, job_ctx)
            except Exception as exc:  # the job's own tests fail with it, the others' run on
                errors[job.name] = exc
    finally:
        rc = server.stop()
    return SharedBoot(launched.boot.name, results, errors, server.log_text(), rc, server.log_path,
                      ctx.dump_dir, dict(server.runtime_env))
