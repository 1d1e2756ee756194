"""Histogram snapshots from the runtime's dump folder (DESIGN "How counts leave the engine").

File names are `<lane>__<class>__<mode>__<UTC YYYYmmddTHHMMSS.ffffffZ>__<seq>.hist`, defined
once by `expert_residency.core.dump` (its name and config helpers import without torch).
Counts are cumulative since the engine started; a window is the difference of
two snapshots. Files are read through the engine (`get_archive`, works for any mount type) or
straight from a host folder.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
from expert_residency.contract import env as runtime_env
from expert_residency.core.dump import DEFAULT_INTERVAL_S, LIVE_MAP_META, interval_from_env, parse_dump_name
from expert_residency.formats import FormatError, Histogram, parse_histogram
from expert_residency.formats._records import MAX_RECORD_BYTES

from recipegen.common.errors import InputError, RecipegenError

# How long past one dump interval a snapshot may take to appear in the folder.
SNAPSHOT_MARGIN_S = 30.0


@dataclass(frozen=True)
class Snapshot:
    name: str
    lane: str
    traffic_class: str
    mode: str
    time: datetime
    seq: int
    histogram: Histogram


def parse_name(name: str) -> tuple[str, str, str, datetime, int] | None:
    """(lane, class, mode, UTC time, seq) of a dump file name; None for other files."""
    parsed = parse_dump_name(name)
    if parsed is None:
        return None
    return parsed.lane, parsed.traffic_class, parsed.mode, parsed.time, parsed.seq


def env_dump_dir(env: Mapping[str, str]) -> str | None:
    """The runtime's dump folder from a container's environment (None: it is not dumping)."""
    return env.get(runtime_env.DUMP_DIR) or None


def snapshot_wait_s(env: Mapping[str, str]) -> float:
    """How long to wait for the next snapshot if no process answers SIGUSR1: the container's
    dump interval (the runtime's default when unset, unreadable or not positive) + a margin."""
    try:
        interval = interval_from_env(env)  # the runtime's own reading (nan, inf, 1e-300 refused)
    except ValueError:
        interval = DEFAULT_INTERVAL_S
    return (interval if interval > 0 else DEFAULT_INTERVAL_S) + SNAPSHOT_MARGIN_S


def snapshots(files: dict[str, bytes], *, where: str, lane: str | None = None,
              traffic_class: str | None = None) -> list[Snapshot]:
    """Parsed dump files (oldest first), optionally of one lane/class; others are ignored."""
    found = []
    for name, data in files.items():
        parsed = parse_name(name)
        if parsed is None:
            continue
        f_lane, f_cls, mode, when, seq = parsed
        if (lane and f_lane != lane) or (traffic_class and f_cls != traffic_class):
            continue
        try:
            hist = parse_histogram(data.decode("utf-8"), f"{where}/{name}")
        except FormatError as exc:
            raise InputError(f"dump file is not a valid histogram: {exc}",
                             file=f"{where}/{name}") from None
        except UnicodeDecodeError as exc:
            raise InputError(f"dump file is not UTF-8 text (byte {exc.start})",
                             file=f"{where}/{name}") from None
        snapshot = Snapshot(name, f_lane, f_cls, mode, when, seq, hist)
        problems = snapshot_problems(snapshot)
        if problems:
            raise InputError("dump file contradicts itself: " + "; ".join(problems),
                             file=f"{where}/{name}")
        found.append(snapshot)
    return sorted(found, key=lambda s: (s.time, s.seq))


def snapshot_problems(snapshot: Snapshot) -> list[str]:
    """What a snapshot's own figures contradict (empty when consistent). Checked, not trusted:
    the histogram's checksum (parse), its meta against the file's name (lane, class, mode, seq),
    and the counter's arithmetic — every MoE layer sees every counted token, each picking at most
    `top_k` experts, so no layer holds more than tokens × top_k selections (a snapshot may miss at
    most the step in flight in later layers, never add one)."""
    hist, meta = snapshot.histogram, snapshot.histogram.meta
    problems = []
    for key, expected in (("lane", snapshot.lane), ("class", snapshot.traffic_class),
                          ("mode", snapshot.mode)):
        if key in meta and meta[key] != expected:
            problems.append(f"meta.{key} {str(meta[key])[:40]!r} but the file name says {expected!r}")
    if "seq" in meta and (not isinstance(meta["seq"], int) or isinstance(meta["seq"], bool)
                          or meta["seq"] != snapshot.seq):
        problems.append(f"meta.seq {str(meta['seq'])[:24]} but the file name says {snapshot.seq}")
    if hist.top_k is not None:
        ceiling = hist.tokens * hist.top_k
        sums = [int(v) for v in hist.counts.sum(axis=1).tolist()]
        over = [(layer, n) for layer, n in zip(hist.moe_layer_indices, sums) if n > ceiling]
        if over:
            layer, n = over[0]
            problems.append(f"layer {layer} holds {n} selections, more than tokens × top_k = "
                            f"{hist.tokens} × {hist.top_k} = {ceiling}")
    if LIVE_MAP_META in meta and not isinstance(meta[LIVE_MAP_META], dict):
        problems.append(f"meta.{LIVE_MAP_META} is not an object")
    return problems


# What a dump folder read keeps: the files the runtime writes there (histograms and the live maps
# beside them), each a regular file of at most the record formats' size, and at most the newest
# `MAX_SNAPSHOTS` snapshots. Anything else in the folder (a 6 GiB file somebody left there, a
# FIFO, a link) is never opened.
DUMP_FILE_LIMIT = MAX_RECORD_BYTES
MAX_SNAPSHOTS = 4096


def is_dump_file_name(name: str) -> bool:
    """A histogram snapshot's name, or the live map's beside one (`<stem>.rowmap`)."""
    if name.endswith(".rowmap"):
        return parse_dump_name(name[:-len(".rowmap")] + ".hist") is not None
    return parse_dump_name(name) is not None


def _newest_first(names: list[str]) -> list[str]:
    def key(name: str) -> tuple:
        parsed = parse_dump_name(name if name.endswith(".hist") else name[:-len(".rowmap")] + ".hist")
        assert parsed is not None
        return (parsed.time, parsed.seq, name)
    return sorted(names, key=key, reverse=True)


def read_host_dir(folder: Path) -> dict[str, bytes]:
    """The dump files of a host folder (name → bytes): only names the runtime writes, only
    regular files (a symlink, FIFO or device in their place is refused, naming it), each
    bounded before it is read, the newest `MAX_SNAPSHOTS` snapshots at most."""
    from expert_residency.formats._io import UnreadableFile, read_regular_file

    if folder.is_symlink() or not folder.is_dir():
        raise InputError("dump folder not found (or not a folder)" if not folder.is_symlink() else
                         "dump folder is a symlink: refusing to follow it", file=str(folder))
    names = _newest_first([p.name for p in folder.iterdir() if is_dump_file_name(p.name)])
    kept = [n for n in names if n.endswith(".hist")][:MAX_SNAPSHOTS]
    wanted = set(kept) | {n[:-len(".hist")] + ".rowmap" for n in kept}
    files: dict[str, bytes] = {}
    for name in names:
        if name not in wanted:
            continue
        path = folder / name
        if path.is_symlink():
            raise InputError("a symlink where the runtime writes a dump file: refusing to follow it",
                             file=str(path))
        try:
            files[name] = read_regular_file(path, limit=DUMP_FILE_LIMIT)
        except UnreadableFile as exc:
            raise InputError(f"{exc.strerror}: not a dump file", file=str(path)) from None
        except FileNotFoundError:
            continue  # removed meanwhile
    return files


def _process(snapshot: Snapshot) -> tuple[str, str]:
    """Which engine process wrote a snapshot (its pid and start time, from the file's meta)."""
    meta = snapshot.histogram.meta
    return str(meta.get("pid", "")), str(meta.get("started_at", ""))


def begun_after_trigger(fresh: list[Snapshot]) -> list[Snapshot]:
    """The fresh snapshots whose counter read provably began after `seen` was read.

    The first fresh file of a process may have been in flight then: its counters read before the
    trigger (e.g. before the last reply of a prompt fixture left the engine), its file renamed
    after, so it can miss the last step. One process writes its snapshots one at a time, so every
    later snapshot of that process began after the first fresh one was renamed: after the trigger.
    """
    first: dict[tuple[str, str], int] = {}
    for s in fresh:
        first[_process(s)] = min(first.get(_process(s), s.seq), s.seq)
    return [s for s in fresh if s.seq > first[_process(s)]]


def wait_for_snapshot(read: Callable[[], dict[str, bytes]], *, where: str, lane: str | None,
                      traffic_class: str | None, seen: set[str], timeout_s: float,
                      poll_s: float = 1.0, nudge: Callable[[], None] | None = None,
                      nudge_every_s: float = 10.0, complete: bool = False) -> Snapshot:
    """The newest snapshot whose file was not in `seen` (names present before the trigger);
    polls until `timeout_s`. Names, not clocks: the engine's clock may differ from ours.

    `complete=True`: only a snapshot that holds every step finished before the trigger
    (`begun_after_trigger`); when the first fresh one appears, `nudge` asks for the next at once,
    and without a nudge the wait is up to two of the runtime's intervals."""
    deadline = time.monotonic() + timeout_s
    next_nudge = time.monotonic() + nudge_every_s
    nudged_for: set[str] = set()
    while True:
        if nudge is not None and time.monotonic() >= next_nudge:
            nudge()  # a signal can be lost (or arrive before the handler is installed): ask again
            next_nudge = time.monotonic() + nudge_every_s
        files = read()
        fresh = snapshots({n: d for n, d in files.items() if n not in seen},
                          where=where, lane=lane, traffic_class=traffic_class)
        usable = begun_after_trigger(fresh) if complete else fresh
        if usable:
            return usable[-1]
        if fresh and nudge is not None and fresh[-1].name not in nudged_for:
            nudged_for.add(fresh[-1].name)  # the next snapshot is the complete one: ask for it now
            nudge()
            next_nudge = time.monotonic() + nudge_every_s
            continue
        if time.monotonic() >= deadline:
            if fresh:
                raise RecipegenError(
                    f"only one new histogram snapshot appeared in {where} within {timeout_s:.0f} s; "
                    "it may have been taken during the last step, so the window needs the next one "
                    "(is EXPERT_RESIDENCY_DUMP_INTERVAL_S under half the wait?)")
            raise RecipegenError(
                f"no new histogram snapshot appeared in {where} within {timeout_s:.0f} s (is the "
                f"runtime counting, is its dump folder {where}, and is "
                "EXPERT_RESIDENCY_DUMP_INTERVAL_S shorter than the wait?)")
        time.sleep(poll_s)


def difference(after: Histogram, before: Histogram | None, *, source: str) -> Histogram:
    """The counts of the window between two cumulative snapshots of one engine."""
    if before is None:
        return after
    if before.counts.shape != after.counts.shape or \
            before.moe_layer_indices != after.moe_layer_indices:
        raise RecipegenError("snapshots of different geometry cannot be subtracted")
    counts = after.counts - before.counts
    if (counts < 0).any():
        raise RecipegenError("the later snapshot has fewer counts than the earlier one: the engine "
                             "restarted in between; profile again")
    for name in ("tokens", "decode_tokens", "prefill_tokens"):
        late, early = getattr(after, name), getattr(before, name)
        if late is not None and early is not None and late < early:
            raise RecipegenError(f"the window {source} has negative {name} ({late} - {early}): the "
                                 "snapshots are not of one engine run, or were edited; refused")

    def sub(a: int | None, b: int | None) -> int | None:
        return None if a is None or b is None else a - b
    return Histogram(after.moe_layer_indices, after.num_experts, np.asarray(counts),
                     tokens=after.tokens - before.tokens,
                     decode_tokens=sub(after.decode_tokens, before.decode_tokens),
                     prefill_tokens=sub(after.prefill_tokens, before.prefill_tokens),
                     source=source, model_revision=after.model_revision, top_k=after.top_k,
                     meta={k: v for k, v in after.meta.items()
                           if k in ("lane", "class", "mode", "synthetic")})
