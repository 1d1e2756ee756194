"""The header comment of every committed compose file names services that file really has: the
lane it starts and the count-only profile boot (a multi-node worker's carries its rank, so a
placeholder built from the lane name alone named a service the worker's file does not have)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
COMPOSE_FILES = sorted((REPO / "compose").rglob("compose.yaml"))
COMMAND = re.compile(r"`docker compose (?:--profile (\S+) )?up -d (\S+)`")


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: str(p.relative_to(REPO / "compose")))
def test_header_commands_name_services_of_this_file(path: Path) -> None:
    text = path.read_text()
    header = [line for line in text.splitlines() if line.startswith("# ")][:4]
    services = yaml.safe_load(text)["services"]
    started = [COMMAND.search(line) for line in header if "up -d" in line]
    assert len(started) == 2, header   # the lane, then its profile boot
    lane, profile = started
    assert lane.group(1) is None and lane.group(2) in services and "profiles" not in services[lane.group(2)]
    assert profile.group(1) == "profile" and profile.group(2) in services
    assert services[profile.group(2)]["profiles"] == ["profile"]
    assert "<" not in profile.group(2)   # a real name, not a placeholder


def test_a_worker_machine_names_its_own_profile_boot() -> None:
    worker = REPO / "compose" / "dsv41-flash-gb300x2-pp2" / "station-b" / "compose.yaml"
    assert "up -d lane-agent-worker-1-profile`" in worker.read_text().splitlines()[3]


def test_a_lane_named_like_a_profile_boot_is_not_taken_for_one(project: Path) -> None:
    """A lane may be called `chat-profile`: its engine `lane-chat-profile` must not be named as
    the count-only boot (that is `lane-chat-profile-profile`, behind the compose profile)."""
    from cli_support import invoke

    recipe = project / "recipes" / "dsv41-flash-gb300.yaml"
    text = recipe.read_text()
    assert text.count("  - name: agent ") == 1
    recipe.write_text(text.replace("  - name: agent ", "  - name: chat-profile ", 1))
    result = invoke("render", "dsv41-flash-gb300")
    assert result.code == 0, result.output
    header = (project / "compose" / "dsv41-flash-gb300" / "compose.yaml").read_text().splitlines()[:4]
    assert header[2].endswith("`docker compose up -d lane-chat-profile` (from this folder).")
    assert header[3].endswith("`docker compose --profile profile up -d lane-chat-profile-profile`.")
