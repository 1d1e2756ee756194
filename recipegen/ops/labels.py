"""Labels `recipegen render` puts on every lane service (render.services, render.compose), read back by
status/swap/verify, and the compose service names of docs/design.md "Lanes, classes and services"."""

from __future__ import annotations

PREFIX = "io.recipegen."
RECIPE = PREFIX + "recipe"
LANE = PREFIX + "lane"
CLASS = PREFIX + "class"
CONTENT_HASH = PREFIX + "content-hash"
SHAPE_HASH = PREFIX + "shape-hash"
CONFIG_HASH = PREFIX + "config-hash"
MODE = PREFIX + "mode"


def lane_service(lane: str) -> str:
    """The lane's API-serving engine service (`render.lanes.lane_service_name`, its one builder)."""
    from recipegen.render.lanes import lane_service_name

    return lane_service_name(lane)


def profile_service(lane: str) -> str:
    """The lane's count-only profile-boot service (compose profile `profile`;
    `render.lanes.profile_service_name`, its one builder)."""
    from recipegen.render.lanes import profile_service_name

    return profile_service_name(lane)


PROFILE_BOOT_PROFILE = "profile"
