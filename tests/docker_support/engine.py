"""A private dockerd for the tests: own data-root, exec-root, socket and pidfile; stopped by PID."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

START_TIMEOUT_S = 30.0
# Debian installs dockerd (and runc, docker-proxy) in /usr/sbin, which a clean environment's PATH
# (`env -i`: /usr/local/bin:/usr/bin:/bin) leaves out.
SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def daemon_path(path: str | None = None) -> str:
    """The PATH to find dockerd in and to start it with (it finds containerd, runc, docker-init
    and docker-proxy there): ``path`` (default: this process's PATH), then the ``SBIN_DIRS`` it
    lacks."""
    dirs = [d for d in (os.environ.get("PATH", os.defpath) if path is None else path).split(os.pathsep) if d]
    return os.pathsep.join(dirs + [d for d in SBIN_DIRS if d not in dirs])


class EngineUnavailable(RuntimeError):
    """The engine cannot run here; the reason becomes the tests' skip message."""


class PrivateDockerd:
    def __init__(self, workdir: Path | None = None) -> None:
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="rg-dockerd-"))
        self.socket = self.workdir / "docker.sock"
        self.pidfile = self.workdir / "dockerd.pid"
        self.log = self.workdir / "dockerd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    def env(self) -> dict[str, str]:
        """Environment for docker / compose / the SDK pointed at this engine only."""
        env = dict(os.environ)
        env["DOCKER_HOST"] = self.host
        env.pop("DOCKER_CONTEXT", None)
        env["DOCKER_CONFIG"] = str(self.workdir / "client-config")
        return env

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        path = daemon_path()
        dockerd = shutil.which("dockerd", path=path)
        if dockerd is None:
            raise EngineUnavailable("dockerd not installed (run scripts/setup-docker.sh as root)")
        if os.geteuid() != 0:
            raise EngineUnavailable("dockerd needs root here (no rootless setup)")
        (self.workdir / "client-config").mkdir(parents=True, exist_ok=True)
        cmd = [
            dockerd,
            "--iptables=false", "--ip-forward=false", "--ip-masq=false", "--bridge=none",
            "--data-root", str(self.workdir / "data"),
            "--exec-root", str(self.workdir / "exec"),
            "--pidfile", str(self.pidfile),
            "-H", self.host,
        ]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env=dict(os.environ, PATH=path))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineUnavailable(f"dockerd exited with {self.proc.returncode}: {self._log_tail()}")
            if self.socket.exists() and self._ping():
                return
            time.sleep(0.25)
        self.stop()
        raise EngineUnavailable(f"dockerd did not answer within {timeout_s:.0f} s: {self._log_tail()}")

    def _ping(self) -> bool:
        import docker  # the SDK the ops code uses

        try:
            client = docker.DockerClient(base_url=self.host, timeout=5)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:
            return False

    def _log_tail(self, lines: int = 8) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop the daemon we started, by its PID only (TERM, then KILL after 20 s)."""
        if self.proc is None:
            return
        pid = self.proc.pid
        if self.proc.poll() is None:
            os.kill(pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None
        # dockerd's overlay mounts are gone once it exits; what is left is plain files.
        shutil.rmtree(self.workdir, ignore_errors=True)
