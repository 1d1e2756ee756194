"""The histogram dump folder: how counts leave the engine (DESIGN "How counts leave the engine").

A ``HistogramDumper`` owns a background thread that writes the counter as a histogram file into
the dump folder

* every ``interval_s`` seconds (0 disables the timer),
* on SIGUSR1 (the handler only wakes the thread; nothing is read on the signal path),
* once at shutdown (``stop()``, also registered with ``atexit``),

each atomically (``formats.save_histogram``: temp file + rename) and named::

    <lane>__<class>__<mode>__<UTC time YYYYmmddTHHMMSS.ffffffZ>__<seq>.hist

Counts are **cumulative** since the engine started (a later file supersedes earlier ones; a
drift window is the difference of two files). Each file's ``meta`` carries lane, class, mode,
reason (``interval`` | ``signal`` | ``shutdown`` | ``manual``), seq, pid, and the start time.

With adaptive residency on (``live_map=`` the ``AdaptivePolicy``), each snapshot also carries the
map the banks hold at that moment: ``meta.live_map`` (``LiveMap``: its ``content_hash``, the boot
map's, ``shape_hash``, barriers, swaps, the last window's cold share and chosen profile, and
``file``) and the map itself as a row-map file beside the histogram, same stem, ``.rowmap``
(``live_map_file_name``), written first so that a histogram naming it always finds it. Dumps
without ``meta.live_map`` (a static lane, an older runtime) read as before.

Standard library only at import time: ``dump_file_name``/``parse_dump_name``/``DumpConfig`` are the
one definition of the dump file names, and readers without torch (``recipegen profile``/``drift``)
import them from here.

Configuration from the environment (``DumpConfig.from_env``), set by the rendered compose service:

``EXPERT_RESIDENCY_DUMP_DIR`` (required to dump), ``_DUMP_INTERVAL_S`` (default 60; 0 = none),
``_LANE`` (default ``lane``), ``_CLASS`` (default ``none``), ``_MODE`` (``count`` or ``count-only``
| ``residency`` | ``unsplit``); the names and their meanings are defined in ``contract.env``.

Inside vLLM the plugin's settings module parses these variables (same names) and builds the
``DumpConfig`` itself; ``from_env`` is the same reading for standalone use. In file names and
histogram ``meta`` the count mode is spelled ``count-only``.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..contract import env

if TYPE_CHECKING:  # the name and config helpers stay importable without torch (recipegen reads dumps)
    from ..formats.rowmap import RowMap
    from .counter import ExpertCounter

ENV_DIR, ENV_INTERVAL, ENV_LANE, ENV_CLASS, ENV_MODE = (
    env.DUMP_DIR, env.DUMP_INTERVAL_S, env.LANE, env.CLASS, env.MODE)
MODES = ("count-only", "residency", "unsplit")
_MODE_ALIASES = {"count": "count-only"}
DEFAULT_INTERVAL_S = 60.0
# Each snapshot synchronises with the device and writes a file: more often than ten a second
# (`1e-300` asked for a busy loop) is refused, as is more than a week apart (a timer wait that
# long overflows the thread's timeout) and anything not a finite number (`nan`, `inf`).
MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 7 * 86_400.0

_NAME_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9.-])?$")
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9.-]|_(?!_))*"
_DUMP_NAME = re.compile(rf"^(?P<lane>{_PART})__(?P<cls>{_PART})__(?P<mode>count-only|residency|unsplit)__"
                        r"(?P<time>\d{8}T\d{6}\.\d{6}Z)__(?P<seq>\d+)\.hist$")
_TIME_FORMAT = "%Y%m%dT%H%M%S.%fZ"


def interval_from_env(env: Mapping[str, str]) -> float:
    """Seconds between snapshots, from ``EXPERT_RESIDENCY_DUMP_INTERVAL_S`` (default 60; 0 = none).

    The one parser of that variable (the runtime's dump thread and the vLLM plugin's settings).
    Raises ValueError naming the variable on a bad value.
    """
    raw = env.get(ENV_INTERVAL, "").strip()
    try:
        interval = float(raw) if raw else DEFAULT_INTERVAL_S
    except ValueError:
        raise ValueError(f"{ENV_INTERVAL}={raw[:40]!r}: not a number of seconds") from None
    check_interval(interval, f"{ENV_INTERVAL}={raw[:40]!r}")
    return interval


def check_interval(interval: float, what: str) -> None:
    """Refuse a snapshot interval other than 0 (off) or a finite number of seconds in
    [MIN_INTERVAL_S, MAX_INTERVAL_S] (ValueError naming `what`)."""
    if interval == 0:
        return
    if not MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S:  # False for nan as well
        raise ValueError(f"{what}: give 0 (no timer) or {MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g} seconds "
                         "between snapshots")


_FOLDER_FIX = "name a folder for the histogram dumps (created if missing), or unset it"


def check_dump_folder(folder: str | os.PathLike[str]) -> None:
    """Refuse a dump folder the writer could not use (ValueError naming ``EXPERT_RESIDENCY_DUMP_DIR``,
    the value and what to do): something other than a folder at that path, a folder this process
    cannot write, or a missing one whose nearest existing parent is not a writable folder (the
    writer creates it, ``HistogramDumper.start``). The one check of that variable's folder: the
    vLLM plugin runs it in the API server, before any engine process starts, and again in the worker
    before the writer starts. Nothing is created here."""
    shown = f"{ENV_DIR}={os.fspath(folder)!r}"
    path = Path(folder)
    if os.path.lexists(path) and not path.is_dir():   # a file, or a link to nothing / to a file
        raise ValueError(f"{shown} is not a folder: {_FOLDER_FIX}")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{shown} is not writable by this process: {_FOLDER_FIX}")
        return
    parent = path.absolute().parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{shown} cannot be created: {parent} is not a folder; {_FOLDER_FIX}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{shown} cannot be created: {parent} is not writable by this process; "
                         f"{_FOLDER_FIX}")


@dataclass(frozen=True)
class DumpConfig:
    folder: Path
    interval_s: float
    lane: str
    traffic_class: str
    mode: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DumpConfig | None:
        """The dump configuration, or None when ``EXPERT_RESIDENCY_DUMP_DIR`` is unset/empty.

        Raises ValueError naming the variable on a bad value.
        """
        env = os.environ if environ is None else environ
        folder = env.get(ENV_DIR, "").strip()
        if not folder:
            return None
        interval = interval_from_env(env)
        mode = env.get(ENV_MODE, "").strip() or "count-only"
        config = cls(Path(folder), interval, env.get(ENV_LANE, "lane").strip() or "lane",
                     env.get(ENV_CLASS, "none").strip() or "none", _MODE_ALIASES.get(mode, mode))
        config.check()
        return config

    def check(self) -> None:
        check_interval(float(self.interval_s), f"{ENV_INTERVAL}={self.interval_s!r}")
        for variable, value in ((ENV_LANE, self.lane), (ENV_CLASS, self.traffic_class)):
            if not _NAME_PART.match(value) or "__" in value:
                raise ValueError(f"{variable}={value!r}: use letters, digits, '.', '_' or '-' "
                                 f"(no '__', not starting with a symbol or ending in '_')")
        if self.mode not in MODES:
            raise ValueError(f"{ENV_MODE}={self.mode!r}: expected one of {', '.join(MODES)}")


@dataclass(frozen=True)
class DumpName:
    lane: str
    traffic_class: str
    mode: str
    time: datetime
    seq: int


def dump_file_name(lane: str, traffic_class: str, mode: str, when: datetime, seq: int) -> str:
    stamp = when.astimezone(timezone.utc).strftime(_TIME_FORMAT)
    return f"{lane}__{traffic_class}__{mode}__{stamp}__{seq:06d}.hist"


def parse_dump_name(name: str) -> DumpName | None:
    """Inverse of ``dump_file_name``; None for names that are not dump files (e.g. temp files)."""
    m = _DUMP_NAME.match(name)
    if not m:
        return None
    try:
        when = datetime.strptime(m.group("time"), _TIME_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:  # right shape, impossible date: not one of ours either
        return None
    return DumpName(m.group("lane"), m.group("cls"), m.group("mode"), when, int(m.group("seq")))


LIVE_MAP_META = "live_map"


def live_map_file_name(histogram_name: str) -> str:
    """The live map's file beside a dump: the histogram's name with ``.rowmap`` for ``.hist``."""
    stem = histogram_name[:-len(".hist")] if histogram_name.endswith(".hist") else histogram_name
    return stem + ".rowmap"


class LiveMapSource(Protocol):
    """What the dumper reads the live map from (``core.adaptive.AdaptivePolicy``)."""

    def live_rowmap(self) -> RowMap: ...

    def status(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class LiveMap:
    """``meta.live_map`` of a dump: the map an adaptive lane's banks held when it was written."""

    content_hash: str
    boot_content_hash: str
    shape_hash: str
    barriers: int
    swaps: int
    file: str
    window_cold_share: float | None = None
    prior: str | None = None

    def to_meta(self) -> dict[str, Any]:
        return {"content_hash": self.content_hash, "boot_content_hash": self.boot_content_hash,
                "shape_hash": self.shape_hash, "barriers": self.barriers, "swaps": self.swaps,
                "file": self.file, "window_cold_share": self.window_cold_share, "prior": self.prior}

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> LiveMap | None:
        """The live map a dump's ``meta`` describes; None when it has none (static lanes, older
        runtimes). ValueError naming the field when it is there but malformed."""
        value = meta.get(LIVE_MAP_META)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ValueError(f"meta.{LIVE_MAP_META} is not an object")
        try:
            live = cls(**{k: value[k] for k in ("content_hash", "boot_content_hash", "shape_hash",
                                                 "barriers", "swaps", "file")},
                       window_cold_share=value.get("window_cold_share"), prior=value.get("prior"))
        except KeyError as exc:
            raise ValueError(f"meta.{LIVE_MAP_META} lacks {exc.args[0]!r}") from None
        except TypeError as exc:
            raise ValueError(f"meta.{LIVE_MAP_META}: {exc}") from None
        for name in ("content_hash", "boot_content_hash", "shape_hash", "file"):
            if not isinstance(getattr(live, name), str):
                raise ValueError(f"meta.{LIVE_MAP_META}.{name} is not a string")
        for name in ("barriers", "swaps"):
            number = getattr(live, name)
            if not isinstance(number, int) or isinstance(number, bool) or number < 0:
                raise ValueError(f"meta.{LIVE_MAP_META}.{name} is not a count")
        share = live.window_cold_share
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                                  or not 0.0 <= share <= 1.0):
            raise ValueError(f"meta.{LIVE_MAP_META}.window_cold_share is not a share in [0, 1]")
        if not (live.file.endswith(".rowmap") and parse_dump_name(live.file[:-len(".rowmap")] + ".hist")):
            raise ValueError(f"meta.{LIVE_MAP_META}.file {live.file[:60]!r} is not a dump's live-map name")
        return live


class HistogramDumper:
    """Writes ``counter`` snapshots into ``config.folder`` (see the module docstring)."""

    def __init__(self, counter: ExpertCounter, config: DumpConfig, *, source: str = "",
                 model_revision: str = "", clock: Callable[[], datetime] | None = None,
                 live_map: LiveMapSource | None = None) -> None:
        config.check()
        self.counter = counter
        self.live_map = live_map
        self.config = config
        self.source = source or f"count dump of lane {config.lane} ({config.mode})"
        self.model_revision = model_revision
        self._clock = clock or (lambda: datetime.now(timezone.utc))
        self._started_at = self._clock()
        self._seq = 0
        self._write_lock = threading.Lock()
        self._wake = threading.Event()
        self._signalled = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._previous_handler: Any = None
        self.written: list[Path] = []

    def start(self, *, install_signal_handler: bool = True) -> HistogramDumper:
        self.config.folder.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="expert-residency-dump", daemon=True)
        self._thread.start()
        if install_signal_handler and threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGUSR1, self._on_signal)
        atexit.register(self.stop)
        return self

    def dump_now(self, reason: str = "manual") -> Path:
        """Write one snapshot now (synchronises with the device to read the counter)."""
        from ..formats.histogram import save_histogram

        with self._write_lock:
            self._seq += 1
            when = self._clock()
            meta = {"lane": self.config.lane, "class": self.config.traffic_class,
                    "mode": self.config.mode, "reason": reason, "seq": self._seq, "pid": os.getpid(),
                    "started_at": self._started_at.strftime(_TIME_FORMAT),
                    "written_at": when.astimezone(timezone.utc).strftime(_TIME_FORMAT)}
            path = self.config.folder / dump_file_name(self.config.lane, self.config.traffic_class,
                                                       self.config.mode, when, self._seq)
            if self.live_map is not None:
                meta[LIVE_MAP_META] = self._save_live_map(path).to_meta()
            histogram = self.counter.to_histogram(source=self.source, model_revision=self.model_revision,
                                                  meta=meta)
            save_histogram(histogram, path)
            self.written.append(path)
            return path

    def _save_live_map(self, histogram_path: Path) -> LiveMap:
        """Write the live map beside the histogram (before it) and describe it for ``meta``."""
        from ..formats.rowmap import save_rowmap

        assert self.live_map is not None
        rowmap = self.live_map.live_rowmap()   # one consistent read, under the policy's map lock
        window = self.live_map.status()        # the last barrier's window figures
        name = live_map_file_name(histogram_path.name)
        save_rowmap(rowmap, histogram_path.parent / name)
        prov = rowmap.provenance
        return LiveMap(content_hash=rowmap.content_hash(),
                       boot_content_hash=str(prov.get("boot_content_hash", "")),
                       shape_hash=rowmap.shape_hash(), barriers=int(prov.get("barriers", 0)),
                       swaps=int(prov.get("swaps", 0)), file=name,
                       window_cold_share=window.get("window_cold_share"), prior=window.get("prior"))

    def stop(self) -> None:
        """Write the shutdown snapshot once and stop the thread (idempotent)."""
        if self._stopping:
            return
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        if self._previous_handler is not None:
            try:
                signal.signal(signal.SIGUSR1, self._previous_handler)
            except ValueError:  # not on the main thread at interpreter exit
                pass
        atexit.unregister(self.stop)
        self.dump_now("shutdown")

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signalled = True
        self._wake.set()

    def _run(self) -> None:
        interval = self.config.interval_s
        next_due = time.monotonic() + interval if interval > 0 else None
        while True:
            timeout = None if next_due is None else max(0.0, next_due - time.monotonic())
            self._wake.wait(timeout)
            self._wake.clear()
            if self._stopping:
                return
            if self._signalled:
                self._signalled = False
                self._dump_logged("signal")
            if next_due is not None and time.monotonic() >= next_due:
                self._dump_logged("interval")
                next_due = time.monotonic() + interval

    def _dump_logged(self, reason: str) -> None:
        try:
            self.dump_now(reason)
        except Exception as exc:  # a failed snapshot must not kill serving; the next one retries
            import sys
            print(f"expert_residency: histogram dump ({reason}) failed: {exc}", file=sys.stderr)
