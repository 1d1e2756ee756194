"""The URL the ops commands reach a lane at (`recipegen profile` drives prompts there; live
status / drift read its /metrics): an IPv6 machine address in brackets, as a URL needs it."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest

from recipegen.load.recipe import load_recipe
from recipegen.ops import live, profile
from recipegen.ops.deployment import Deployment

REFERENCE = "dsv41-flash-gb300"


def deployment_at(address: str | None) -> Deployment:
    loaded = load_recipe(REFERENCE)
    recipe = loaded.recipe
    machines = {key: machine.model_copy(update={"address": address}) for key, machine in recipe.machines.items()}
    loaded = dataclasses.replace(loaded, recipe=recipe.model_copy(update={"machines": machines}))
    return Deployment(SimpleNamespace(loaded=loaded))  # type: ignore[arg-type]


@pytest.mark.parametrize("address, host, netloc", [
    ("fd00::2", "fd00::2", "[fd00::2]:{port}"),
    ("2001:db8::10:1", "2001:db8::10:1", "[2001:db8::10:1]:{port}"),
    ("10.0.0.1", "10.0.0.1", "10.0.0.1:{port}"),
    ("station-a.lan", "station-a.lan", "station-a.lan:{port}"),
    (None, "127.0.0.1", "127.0.0.1:{port}"),     # no address: the lane on this machine
])
def test_the_lane_endpoint_is_a_url_for_every_address(address: str | None, host: str, netloc: str) -> None:
    dep = deployment_at(address)
    (lane,) = dep.loaded.recipe.lanes
    endpoint = live.lane_endpoint(dep, lane.name)
    parts = urlsplit(f"{endpoint}/v1/models")
    assert parts.scheme == "http"
    assert parts.hostname == host
    assert parts.port == lane.port
    assert parts.netloc == netloc.format(port=lane.port)
    assert parts.path == "/v1/models"


def test_profile_drives_prompts_at_the_same_endpoint() -> None:
    # `recipegen profile` builds no URL of its own: one owner of the lane's address and port.
    assert profile.lane_endpoint is live.lane_endpoint
