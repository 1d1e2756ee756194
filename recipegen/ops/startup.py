"""Start one compose service and show a person how its start is going.

`docker compose up -d --wait` alone is silent for as long as a lane takes to start (up to hours on
a first start). Here Compose runs with its output streamed (its pull progress passes through,
each layer's progress bar at most once per interval), while the service's container log is
followed through the Docker engine and read by `ops.startup_log`: each start-up phase is printed
once with the time since the wait began, a heartbeat names the current phase and the time in it
whenever nothing else was printed for an interval (30 s; `RECIPEGEN_HEARTBEAT_S`), and a known
fatal line (out of GPU memory, a CUDA error, a runtime refusal, vLLM's engine failing) or the
container's process exiting stops the wait within seconds: the log's last lines are printed and
`StartupFailed` is raised (a `ComposeError`, so callers that roll back on a Compose failure roll
back on it too).

Which log belongs to this start (`_Watch`): a container other than the one found before the wait
is Compose's, and its log is read from its beginning; the one found before counts once Compose has
said it starts it or waits for it (not "Recreate"), from the end of its previous run. Times come
from the Docker engine's own clock, so a remote engine's clock offset does not matter. A container
whose process exits and is started again by its restart policy has failed, whatever its log said.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from recipegen.common.errors import InputError
from recipegen.ops.compose import ComposeError, ComposeProject
from recipegen.ops.engine import COMPOSE_PROJECT, COMPOSE_SERVICE
from recipegen.ops.engine import _parse_time as _engine_time
from recipegen.ops.startup_log import classify, clean

Say = Callable[[str], None]

HEARTBEAT_ENV = "RECIPEGEN_HEARTBEAT_S"
DEFAULT_HEARTBEAT_S = 30.0
FATAL_GRACE_S = 3.0       # after a fatal line, the traceback that follows still reaches the tail
TAIL_LINES = 40
POLL_S = 1.0              # how often the engine is asked which container runs the service
# the time the engine puts before each log entry (`timestamps=True`), at the start of a line
_TS = re.compile(rb"(?m)^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) ")
# Compose's per-layer progress lines: `<layer> Downloading [==>   ] 1.2MB/3GB` (also Extracting)
_LAYER_PROGRESS = re.compile(r"^\s*(\S+)\s+(Downloading|Extracting)\b")
_COMPOSE_PULLING = re.compile(r"\bPulling\s*$")
_COMPOSE_PULLED = re.compile(r"\bPulled\s*$")


class StartupFailed(ComposeError):
    """The service's start failed: a fatal line in its log, or its process exited."""


def heartbeat_interval(env: Mapping[str, str] | None = None) -> float:
    """Seconds between heartbeat lines: `RECIPEGEN_HEARTBEAT_S`, default 30."""
    text = (os.environ if env is None else env).get(HEARTBEAT_ENV, "").strip()
    if not text:
        return DEFAULT_HEARTBEAT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise InputError(f"{HEARTBEAT_ENV}={text!r} is not a number of seconds between 0 and 3600",
                         field=HEARTBEAT_ENV)
    return value


def duration(seconds: float) -> str:
    """`7 s`, `4 min 05 s`, `2 h 03 min` (whole seconds; hours drop the seconds)."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _stamp(text: bytes) -> tuple[int, int]:
    """An RFC 3339 log timestamp as (epoch seconds, nanoseconds): exact, for ordering."""
    head, _, frac = text.decode().rstrip("Z").partition(".")
    base = datetime.fromisoformat(head).replace(tzinfo=timezone.utc)
    return int(base.timestamp()), int((frac[:9] or "0").ljust(9, "0"))


@dataclass(frozen=True)
class _Boot:
    """One run of the service's container: its id and when the engine started it."""

    container: str
    started_at: str
    since: float | None      # read the log from here (engine clock); None: from its beginning


class _LogFollower(threading.Thread):
    """Follows one boot's log through the engine; puts ("log", boot, line) on the queue and
    ("log_end", boot, None) once the stream ends while the boot is over. A stream the engine or a
    socket timeout cuts short is resumed after the last line seen (by its timestamp)."""

    def __init__(self, client: Any, boot: _Boot, out: queue.Queue) -> None:
        super().__init__(daemon=True, name=f"log-{boot.container[:12]}")
        self.client, self.boot, self.out = client, boot, out
        self.stopping = threading.Event()
        self._stream: Any = None

    def stop(self) -> None:
        self.stopping.set()
        stream = self._stream
        if stream is not None:
            try:
                stream.close()
            except Exception:
                pass

    def _running(self) -> bool:
        try:
            state = self.client.api.inspect_container(self.boot.container)["State"]
        except Exception:
            return False
        return bool(state.get("Running")) and state.get("StartedAt") == self.boot.started_at

    def run(self) -> None:
        newest: tuple[int, int] | None = None   # the newest entry's time seen so far
        since, resumed_after = self.boot.since, None
        while not self.stopping.is_set():
            try:
                kwargs: dict[str, Any] = {"stream": True, "follow": True, "timestamps": True}
                if since is not None:
                    kwargs["since"] = since
                self._stream = self.client.api.logs(self.boot.container, **kwargs)
                for chunk in self._stream:   # one log entry per chunk, as the engine sends them
                    if self.stopping.is_set():
                        return
                    for stamp, text in _entries(chunk):
                        if stamp is not None:
                            if resumed_after is not None and stamp <= resumed_after:
                                continue   # sent before the stream was cut: already read
                            newest = stamp if newest is None else max(newest, stamp)
                        for line in re.split(r"[\r\n]+", text):
                            if line.strip():
                                self.out.put(("log", self.boot, line))
            except Exception:  # a cut stream or a socket timeout: resume below, or end
                pass
            if self.stopping.is_set():
                return
            if not self._running():
                self.out.put(("log_end", self.boot, None))
                return
            if newest is not None:
                resumed_after = newest
                since = newest[0] + newest[1] / 1e9
            time.sleep(0.5)


def _entries(chunk: bytes) -> list[tuple[tuple[int, int] | None, str]]:
    """The (time, text) entries of a piece of a `timestamps=True` log stream; text before the
    first timestamp (a split entry) comes without a time."""
    out: list[tuple[tuple[int, int] | None, str]] = []
    starts = list(_TS.finditer(chunk))
    if not starts or starts[0].start() > 0:
        head = chunk[:starts[0].start()] if starts else chunk
        out.append((None, head.decode("utf-8", errors="replace")))
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(chunk)
        out.append((_stamp(m.group(1)), chunk[m.end():end].decode("utf-8", errors="replace")))
    return out


class _ComposeReader(threading.Thread):
    def __init__(self, stream: Any, out: queue.Queue) -> None:
        super().__init__(daemon=True, name="compose-output")
        self.stream, self.out = stream, out

    def run(self) -> None:
        try:
            for line in iter(self.stream.readline, ""):
                for part in re.split(r"[\r\n]+", line):
                    if part.strip():
                        self.out.put(("compose", None, part))
        finally:
            self.out.put(("compose_end", None, None))


@dataclass(frozen=True)
class StartOutcome:
    service: str
    seconds: float


class _Display:
    """What has been said so far, and the heartbeat's clock."""

    def __init__(self, service: str, say: Say, heartbeat_s: float, residency: bool) -> None:
        self.service, self.say, self.heartbeat_s, self.residency = service, say, heartbeat_s, residency
        self.t0 = time.monotonic()
        self.last_said = self.t0
        self.phase, self.phase_since, self.order = "asking Compose to start the service", self.t0, -1
        self.last_line = ""
        self.layer_said: dict[tuple[str, str], float] = {}

    def line(self, text: str) -> None:
        now = time.monotonic()
        self.say(f"{self.service} ({duration(now - self.t0)}): {text}")
        self.last_said = now

    def enter(self, phase: str, detail: str = "") -> None:
        self.phase, self.phase_since = phase, time.monotonic()
        self.line(phase + (f" ({detail})" if detail else ""))

    def compose(self, text: str) -> None:
        text = clean(text)
        if not text:
            return
        m = _LAYER_PROGRESS.match(text)
        if m and "[" in text:  # a progress bar: once per layer and step per interval
            key, now = (m.group(1), m.group(2)), time.monotonic()
            if now - self.layer_said.get(key, -1e9) < self.heartbeat_s:
                return
            self.layer_said[key] = now
        self.line(f"Compose: {text}")
        if _COMPOSE_PULLING.search(text) and self.order < 0:
            self.phase, self.phase_since = "pulling the image", time.monotonic()
        elif _COMPOSE_PULLED.search(text) and self.order < 0:
            self.phase, self.phase_since = "creating the container", time.monotonic()

    def boot(self, boot: _Boot) -> None:
        self.enter("container started; vLLM is starting", f"container {boot.container[:12]}")

    def log(self, raw: str) -> tuple[str, int, str] | None:
        """Handle one log line; a failure as (reason, rank, line) if it is one."""
        text = clean(raw, limit=1 << 20)   # whole: a report line is one long JSON object
        if not text:
            return None
        self.last_line = text
        verdict = classify(text, residency=self.residency)
        if verdict.fatal:
            return verdict.fatal, verdict.rank, clean(text)
        if verdict.key == "report":  # one per worker: each is worth a line
            self.line(verdict.detail)
            self.last_line = verdict.detail
        if not verdict.phase or verdict.order <= self.order:
            return None
        self.order = verdict.order
        if verdict.phase == self.phase:   # a later line of the same phase: its figures only
            if verdict.detail and verdict.key != "report":
                self.line(verdict.detail)
        else:
            self.enter(verdict.phase, "" if verdict.key == "report" else verdict.detail)
        return None

    def tick(self) -> None:
        now = time.monotonic()
        if now - self.last_said < self.heartbeat_s:
            return
        words = f"still {self.phase}: {duration(now - self.phase_since)} in this phase"
        if self.last_line:
            words += f"; last log line: {clean(self.last_line, 160)}"
        self.line(words)


# Compose's words for what it does with an existing container (its progress events); the line
# reads `Container <name>  <word>`. "Recreate": the container is replaced by a new one.
_COMPOSE_CONTAINER = re.compile(r"\bContainer (\S+)\s+(Recreate|Recreated|Running|Starting|Started|"
                                r"Waiting|Healthy|Stopping|Stopped|Removing|Removed|Creating|Created)\b")


@dataclass(frozen=True)
class _Baseline:
    """The service's container as it was before this wait."""

    container: str
    name: str
    started_at: str
    starting: bool       # running, its health check not passed yet: a start still under way


def start_service(project: ComposeProject, client: Any, project_name: str, service: str, *,
                  wait_timeout_s: int, profiles: Sequence[str] = (), force_recreate: bool = False,
                  say: Say, heartbeat_s: float = DEFAULT_HEARTBEAT_S,
                  residency: bool = False) -> StartOutcome:
    """`up -d --wait` exactly `service`, showing its progress through `say` (one line each).

    Raises StartupFailed on a fatal log line or an exited container (after printing the log's
    tail), ComposeError when Compose itself fails or exceeds its wait."""
    display = _Display(service, say, heartbeat_s, residency)
    events: queue.Queue = queue.Queue()
    watch = _Watch(display, client, events, project_name, service)
    args = project.up_args([service], wait_timeout_s=wait_timeout_s, force_recreate=force_recreate)
    proc = project.spawn(args, profiles=profiles)
    assert proc.stdout is not None
    _ComposeReader(proc.stdout, events).start()
    deadline = time.monotonic() + wait_timeout_s + 120
    next_poll = 0.0
    compose_done = False

    def stop_compose() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    try:
        while not (compose_done and proc.poll() is not None):
            now = time.monotonic()
            if now >= next_poll and watch.failure is None:
                next_poll = now + POLL_S
                watch.poll()
            try:
                kind, which, text = events.get(timeout=0.25)
            except queue.Empty:
                kind, which, text = "", None, None
            if kind == "compose":
                watch.compose(text)
            elif kind == "compose_end":
                compose_done = True
            else:
                watch.event(kind, which, text)
            if watch.failure is not None and time.monotonic() - watch.failed_at >= FATAL_GRACE_S:
                stop_compose()
                watch.fail()
            if time.monotonic() >= deadline:
                stop_compose()
                raise ComposeError(f"`docker compose up {service}` did not finish within "
                                   f"{wait_timeout_s + 120} s")
            if watch.failure is None:
                display.tick()
        rc = proc.wait()
        if rc != 0:
            if watch.boot is None:
                watch.poll()   # a container that failed before the first look
            watch.drain()      # the lines that explain it may still be on their way
            if watch.failure is not None:
                watch.fail()
            watch.say_tail()
            words = "\n  ".join(watch.compose_words) or "(no output)"
            raise ComposeError(f"`docker compose up {service}` failed (exit {rc}) after "
                               f"{duration(time.monotonic() - display.t0)}: {words}")
        display.line(watch.outcome())
        return StartOutcome(service, time.monotonic() - display.t0)
    finally:
        watch.stop()
        stop_compose()


class _Watch:
    """Which run of the service's container this wait is about, its log's tail, and the failure
    found in it (if any).

    A container other than the one found before the wait is Compose's (new or recreated): its
    runs count, its log read from the beginning. The one found before counts only once Compose has
    said what it does with it and that is not "Recreate" (it starts it, or leaves it running and
    waits for it): until then it may be a crash-looping old container Compose is about to replace,
    possibly after a long pull. A run of it that began before the wait counts when its health check
    has not passed yet (a start still under way, e.g. after an interrupted `up`)."""

    def __init__(self, display: _Display, client: Any, events: queue.Queue, project_name: str,
                 service: str) -> None:
        self.display, self.client, self.events = display, client, events
        self.filters = [f"{COMPOSE_PROJECT}={project_name}", f"{COMPOSE_SERVICE}={service}"]
        self.baseline = self._baseline()
        self.decided = False       # Compose said what it does with the baseline container
        self.replaced = False      # … and that is replacing it
        self.boot: _Boot | None = None
        self.follower: _LogFollower | None = None
        self.seen: set[tuple[str, str]] = set()
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.compose_words: deque[str] = deque(maxlen=15)
        self.failure: tuple[str, int, str] | None = None
        self.failed_at = 0.0

    def _containers(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(id, name, State) of the service's containers, the latest started last (never started:
        first). Containers come and go while Compose works: one removed between the listing and
        its inspection is left out."""
        found = []
        for entry in self.client.api.containers(all=True, filters={"label": self.filters}):
            state = self._state(entry["Id"])
            if state is None:
                continue
            name = (entry.get("Names") or [""])[0].lstrip("/")
            found.append((entry["Id"], name, state))
        never = datetime.min.replace(tzinfo=timezone.utc)
        return sorted(found, key=lambda c: _engine_time(str(c[2].get("StartedAt") or "")) or never)

    def _baseline(self) -> _Baseline | None:
        found = self._containers()
        if not found:
            return None
        container, name, state = found[-1]
        return _Baseline(container, name, str(state.get("StartedAt") or ""),
                         starting=bool(state.get("Running"))
                         and (state.get("Health") or {}).get("Status") == "starting")

    def _state(self, container: str) -> dict[str, Any] | None:
        try:
            return dict(self.client.api.inspect_container(container)["State"])
        except Exception:  # the docker SDK raises several types for a container that is gone
            return None

    def compose(self, text: str) -> None:
        self.compose_words.append(clean(text))
        self.display.compose(text)
        m = _COMPOSE_CONTAINER.search(clean(text))
        if m and self.baseline is not None and m.group(1) == self.baseline.name.lstrip("/"):
            self.decided = True
            self.replaced = self.replaced or m.group(2).startswith("Recreate")

    def poll(self) -> None:
        """Ask the engine which run of the container is current; follow a new one."""
        try:
            found = self._containers()
        except Exception:  # the engine busy or briefly unreachable: look again next time
            return
        base = self.baseline.container if self.baseline else None
        if any(c[0] != base for c in found):
            self.replaced = True      # Compose made a container of its own
        runs = [c for c in found if c[0] != base
                or (self.decided and not self.replaced)]
        runs = [c for c in runs if _engine_time(str(c[2].get("StartedAt") or "")) is not None]
        if not runs:
            return
        container, _, state = runs[-1]
        started = str(state.get("StartedAt"))
        key = (container, started)
        if key in self.seen:
            return
        if self.baseline is not None and key == (base, self.baseline.started_at) \
                and not self.baseline.starting:
            return                    # the run that was there before, already up: not ours
        self.seen.add(key)
        if self.boot is not None and self.boot.container == base and container != base:
            # the old container was followed before Compose said it replaces it
            self._switch(container, started, None)
            return
        if self.boot is not None:
            # the run being followed ended and the engine started the container again (its
            # restart policy): a start that fails, whatever the log said
            self._failed("the container's process exited and the engine started it again"
                         + _exit_words(self.client, self.boot.container), 0, "")
            return
        # a new container's log is all this run's; an existing one's begins where its previous
        # run finished
        since = None if container != base else _since(str(state.get("FinishedAt") or ""), started)
        self._switch(container, started, since)

    def _switch(self, container: str, started: str, since: float | None) -> None:
        if self.follower is not None:
            self.follower.stop()
        self.failure, self.failed_at = None, 0.0
        self.tail.clear()
        self.boot = _Boot(container, started, since)
        self.follower = _LogFollower(self.client, self.boot, self.events)
        self.follower.start()
        self.display.boot(self.boot)

    def _failed(self, reason: str, rank: int, line: str) -> None:
        if self.failure is None:
            self.failed_at = time.monotonic()
        if self.failure is None or rank > self.failure[1]:
            self.failure = (reason, rank, line)

    def event(self, kind: str, which: Any, text: Any) -> None:
        if self.boot is None or which != self.boot:
            return
        if kind == "log":
            self.tail.append(clean(text, 1000))
            found = self.display.log(text)
            if found is not None:
                self._failed(*found)
        elif kind == "log_end":
            self._failed("the container's process exited" + _exit_words(self.client, self.boot.container),
                         0, "")

    def drain(self, wait_s: float = 3.0) -> None:
        """Read what the boot's log still holds (until its end, at most `wait_s`)."""
        if self.boot is None:
            return
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            try:
                kind, which, text = self.events.get(timeout=0.2)
            except queue.Empty:
                continue
            self.event(kind, which, text)
            if kind == "log_end" and which == self.boot:
                return

    def fail(self) -> None:
        assert self.failure is not None
        reason, _, line = self.failure
        self.display.line(f"start-up failed: {reason}" + (f": {line}" if line else ""))
        self.say_tail()
        raise StartupFailed(
            f"{self.display.service} did not start: {reason}"
            + (f"; its log says: {clean(line, 240)}" if line else "")
            + f"; the wait stopped after {duration(time.monotonic() - self.display.t0)}")

    def say_tail(self) -> None:
        service = self.display.service
        if self.boot is None:
            return
        if not self.tail:
            self.display.say(f"{service}: the container wrote no log")
            return
        self.display.say(f"{service}: the last {len(self.tail)} lines of its log:")
        for line in self.tail:
            self.display.say(f"  | {line}")

    def outcome(self) -> str:
        """The last line of a start Compose reported done."""
        if self.boot is None:
            return "already running (nothing to change)"
        state = self._state(self.boot.container) or {}
        if not state.get("Health"):
            return "running (the service has no health check)"
        return str(state["Health"].get("Status") or "running")

    def stop(self) -> None:
        if self.follower is not None:
            self.follower.stop()


def _since(finished_at: str, started_at: str) -> float | None:
    """Where a restarted container's new run begins in its log: the end of its previous run."""
    finished, started = _engine_time(finished_at), _engine_time(started_at)
    if finished is not None and started is not None and finished <= started:
        return finished.timestamp()
    return started.timestamp() if started is not None else None


def _exit_words(client: Any, container: str) -> str:
    """How the container's process ended, for the failure message ("" when unknown)."""
    try:
        state = client.api.inspect_container(container)["State"]
    except Exception:
        return ""
    if state.get("OOMKilled"):
        return " (killed by the kernel: the host ran out of memory)"
    code = state.get("ExitCode")
    if code == 137:
        return " with code 137 (killed: out of host memory, or stopped by force)"
    return f" with code {code}" if isinstance(code, int) and code != 0 else ""


def start(dep: Any, service: str, config: dict[str, Any], *, wait_s: int, say: Say,
          force_recreate: bool = False) -> StartOutcome:
    """`start_service` for a service of a deployment (`ops.deployment.Deployment`) whose compose
    config is `config`: its profiles, its project name, its runtime mode, the heartbeat interval
    from the deployment's environment."""
    from recipegen.ops import labels
    from recipegen.ops.deployment import rendered_label, service_profiles

    return start_service(
        dep.project(), dep.client(), config.get("name") or dep.rendering.out_dir.name, service,
        wait_timeout_s=wait_s, profiles=service_profiles(config, service),
        force_recreate=force_recreate, say=say, heartbeat_s=heartbeat_interval(dep.env),
        residency=rendered_label(config, service, labels.MODE) == "residency")
