"""The Docker engine through the docker SDK: connect, find lane containers, read health and logs."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from recipegen.common.errors import RecipegenError

COMPOSE_PROJECT = "com.docker.compose.project"
COMPOSE_SERVICE = "com.docker.compose.service"
COMPOSE_CONFIG_HASH = "com.docker.compose.config-hash"


class EngineError(RecipegenError):
    """The Docker engine could not be reached or refused a request."""


def connect(env: Mapping[str, str] | None = None, timeout_s: int = 30) -> Any:
    """A docker SDK client for DOCKER_HOST (or the default socket); a clear error if unreachable."""
    import docker  # heavy; only the ops commands need it

    env = dict(os.environ if env is None else env)
    try:
        client = docker.DockerClient.from_env(environment=env, timeout=timeout_s)
        client.ping()
    except Exception as exc:  # the SDK raises several types for "no daemon"
        where = env.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        raise EngineError(
            f"Docker engine not reachable at {where}: {_short(exc)} — start the daemon "
            "(`systemctl start docker` or `dockerd`) or point DOCKER_HOST at it; "
            "`recipegen doctor` checks the whole setup") from None
    return client


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1][:200] if text else type(exc).__name__


@dataclass(frozen=True)
class ContainerInfo:
    """What the ops commands need to know about one container."""

    id: str
    name: str
    service: str
    project: str
    state: str             # running, exited, restarting, …
    health: str            # healthy, unhealthy, starting, none
    started_at: datetime | None
    labels: dict[str, str]
    env: dict[str, str]
    mounts: list[dict[str, Any]]

    def uptime_s(self, now: datetime | None = None) -> float | None:
        if self.started_at is None or self.state != "running":
            return None
        now = now or datetime.now(timezone.utc)
        return max(0.0, (now - self.started_at).total_seconds())


def _parse_time(text: str | None) -> datetime | None:
    if not text or text.startswith("0001-"):
        return None
    # Docker gives RFC 3339 with nanoseconds; Python wants at most microseconds.
    head, _, frac = text.rstrip("Z").partition(".")
    frac = (frac[:6] if frac else "0").ljust(6, "0")
    try:
        return datetime.fromisoformat(f"{head}.{frac}").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def container_info(container: Any) -> ContainerInfo:
    attrs = container.attrs
    state = attrs.get("State", {})
    labels = dict(attrs.get("Config", {}).get("Labels") or {})
    env = {}
    for item in attrs.get("Config", {}).get("Env") or []:
        key, _, value = item.partition("=")
        env[key] = value
    health = (state.get("Health") or {}).get("Status", "none")
    return ContainerInfo(
        id=container.id, name=container.name, service=labels.get(COMPOSE_SERVICE, ""),
        project=labels.get(COMPOSE_PROJECT, ""), state=state.get("Status", "unknown"),
        health=health, started_at=_parse_time(state.get("StartedAt")), labels=labels, env=env,
        mounts=list(attrs.get("Mounts") or []))


def find_containers(client: Any, label_filters: list[str], *, all_states: bool = True
                    ) -> list[ContainerInfo]:
    """Containers carrying every label filter (`key` or `key=value`), sorted by name."""
    found = client.containers.list(all=all_states, filters={"label": label_filters})
    return sorted((container_info(c) for c in found), key=lambda c: c.name)


def service_container(client: Any, project: str, service: str) -> ContainerInfo | None:
    """The (newest) container of a compose service, running or not."""
    matches = find_containers(client, [f"{COMPOSE_PROJECT}={project}",
                                       f"{COMPOSE_SERVICE}={service}"])
    if not matches:
        return None
    return max(matches, key=lambda c: c.started_at or datetime.min.replace(tzinfo=timezone.utc))


def container_logs(client: Any, container_id: str, *, since: datetime | None = None) -> str:
    kwargs: dict[str, Any] = {"stdout": True, "stderr": True}
    if since is not None:
        kwargs["since"] = since
    data = client.containers.get(container_id).logs(**kwargs)
    return data.decode("utf-8", errors="replace")


# Signal every process of the container that *catches* SIGUSR1 (bit 9 of SigCgt in
# /proc/<pid>/status), and only those: in a vLLM container the runtime's snapshot handler lives in
# the worker process, not in PID 1 (the API server), and a process that does not catch SIGUSR1
# would be terminated by it. Plain POSIX sh, so it runs in the vLLM image and in busybox alike.
_SIGNAL_CATCHERS = r"""for s in /proc/[0-9]*/status; do
  p=${s#/proc/}; p=${p%/status}
  while read -r k v; do
    if [ "$k" = "SigCgt:" ]; then
      if [ $(( (0x$v >> 9) & 1 )) -eq 1 ]; then kill -USR1 "$p" && echo "$p"; fi
      break
    fi
  done < "$s" 2>/dev/null
done"""


def request_snapshot(client: Any, container_id: str) -> list[int]:
    """Send SIGUSR1 to the container's processes that handle it; the PIDs signalled (inside the
    container). Falls back to signalling PID 1 when the container has no shell."""
    container = client.containers.get(container_id)
    try:
        result = container.exec_run(["sh", "-c", _SIGNAL_CATCHERS])
        if result.exit_code == 0:
            out = result.output.decode("utf-8", errors="replace")
            return [int(x) for x in out.split() if x.isdigit()]
    except Exception:
        pass
    send_signal(client, container_id, "SIGUSR1")
    return [1]


def send_signal(client: Any, container_id: str, signal_name: str) -> None:
    try:
        client.containers.get(container_id).kill(signal=signal_name)
    except Exception as exc:
        raise EngineError(f"could not send {signal_name} to container {container_id[:12]}: "
                          f"{_short(exc)}") from None


DUMP_NAMES: Any = object()  # list_dir's default: the dump folder's file names


def list_dir(client: Any, container_id: str, path: str, *,
             keep: Callable[[str], bool] | None = DUMP_NAMES) -> dict[str, bytes]:
    """Files directly inside `path` in the container (read through the engine, so it works for
    bind mounts, volumes and remote daemons alike): name → bytes.

    By default only what the runtime writes into its dump folder is kept
    (`ops.dumps.is_dump_file_name`: histograms and their live maps; `keep=None`: every name).
    Only regular files, each at most `ops.dumps.DUMP_FILE_LIMIT` bytes; the archive is read as a
    stream, so an unrelated large file in the folder is skipped, never held in memory."""
    from recipegen.ops.dumps import DUMP_FILE_LIMIT, is_dump_file_name

    if keep is DUMP_NAMES:
        keep = is_dump_file_name
    try:
        stream, _ = client.containers.get(container_id).get_archive(path)
    except Exception as exc:
        raise EngineError(f"could not read {path} from container {container_id[:12]}: "
                          f"{_short(exc)}") from None
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=_ChunkReader(stream), mode="r|") as tar:
            for member in tar:
                parts = member.name.split("/")
                if not (member.isfile() and len(parts) == 2 and (keep is None or keep(parts[1]))):
                    continue  # "<dir>/<file>" only: not deeper, not links, only the names asked for
                if member.size > DUMP_FILE_LIMIT:
                    raise EngineError(f"{path}/{parts[1]} in container {container_id[:12]} is "
                                      f"{member.size:,} bytes, more than a dump file can be "
                                      f"({DUMP_FILE_LIMIT:,})")
                extracted = tar.extractfile(member)
                if extracted is not None:
                    files[parts[1]] = extracted.read(DUMP_FILE_LIMIT + 1)
    except tarfile.TarError as exc:
        raise EngineError(f"could not read {path} from container {container_id[:12]}: "
                          f"unreadable archive ({exc})") from None
    return files


class _ChunkReader(io.RawIOBase):
    """A read-only file over the engine's archive chunks, so tarfile can stream it."""

    def __init__(self, chunks: Any) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(target), len(self._buffer))
        target[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n
