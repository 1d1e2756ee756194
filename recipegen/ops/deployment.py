"""A recipe's deployment as the ops commands see it: the recipe, its rendered compose folder,
the compose files to use (rendered file, the folder's `compose.override.yaml` if the operator
put one there — as plain `docker compose` would pick it up —, then `--override` files), and the
engine environment."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipegen.common.errors import InputError, RecipegenError
from recipegen.ops import labels
from recipegen.ops.compose import ComposeProject
from recipegen.ops.rendering import Rendering

USER_OVERRIDE = "compose.override.yaml"


@dataclass
class Deployment:
    rendering: Rendering
    overrides: list[Path] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    _client: Any = None

    @property
    def loaded(self) -> Any:
        return self.rendering.loaded

    @property
    def recipe_name(self) -> str:
        return str(self.loaded.name)

    def compose_files(self) -> list[Path]:
        files = [self.rendering.compose_file]
        user = self.rendering.out_dir / USER_OVERRIDE
        if user.is_file():
            files.append(user)
        for o in self.overrides:
            if not o.is_file():
                raise InputError("compose override file not found", file=str(o))
            files.append(o.resolve())
        return files

    def project(self) -> ComposeProject:
        self._require_rendered()
        return ComposeProject(self.rendering.out_dir, self.compose_files(), env=self.env)

    def _require_rendered(self) -> None:
        """Refuse before running Compose in a folder that is not there (its OS error names only
        the folder, not what to do)."""
        from recipegen.load.document import display_path

        out_dir, compose_file = self.rendering.out_dir, self.rendering.compose_file
        render = f"`recipegen render {shlex.quote(self.rendering.recipe_arg)}`"
        if out_dir.exists() and not out_dir.is_dir():
            raise RecipegenError(f"output folder {display_path(out_dir)} exists and is not a "
                                 f"folder: move that file away or delete it, then run {render}")
        if not compose_file.is_file():
            what = "has not been rendered yet" if not out_dir.exists() else \
                f"has no {compose_file.name} (not rendered, or the file was removed)"
            raise RecipegenError(f"the compose project {display_path(out_dir)}/ of recipe "
                                 f"{self.recipe_name} {what}: run {render} first")

    def client(self) -> Any:
        if self._client is None:
            from recipegen.ops.engine import connect

            self._client = connect(self.env)
        return self._client

    def lane(self, name: str, option: str = "LANE") -> Any:
        """The recipe's lane `name`; an unknown name is refused naming `option`, the argument that
        gave it (`LoadedRecipe.no_lane_error`)."""
        return self.loaded.lane_at(name, option=option)[1]

    def lane_names(self) -> list[str]:
        return [lane.name for lane in self.loaded.recipe.lanes]


def service_profiles(config: dict[str, Any], service: str) -> list[str]:
    svc = config.get("services", {}).get(service)
    if svc is None:
        raise RecipegenError(f"service {service} is not in the rendered compose file "
                             "(re-render with `recipegen render`)")
    return list(svc.get("profiles") or [])


def dependency_order(config: dict[str, Any], services: list[str]) -> list[str]:
    """`services` reordered so that a service comes after those it depends on (stable otherwise)."""
    deps = {name: set((config["services"].get(name, {}).get("depends_on") or {}).keys())
            for name in services}
    ordered: list[str] = []
    remaining = list(services)
    while remaining:
        for name in remaining:
            if not (deps[name] & set(remaining)) or deps[name] <= set(ordered):
                ordered.append(name)
                remaining.remove(name)
                break
        else:  # a cycle: compose itself would refuse; keep the given order
            ordered.extend(remaining)
            break
    return ordered


def lane_services(config: dict[str, Any], lane: str, *, profile_boot: bool = False) -> list[str]:
    """The services of `lane` in this machine's project: `lane-<lane>` on the head's machine,
    `lane-<lane>-worker-<n>` on the others (or their count-only profile boots)."""
    found = []
    for name, svc in (config.get("services") or {}).items():
        svc_labels = svc.get("labels") or {}
        if svc_labels.get(labels.LANE) != lane:
            continue
        if (svc_labels.get(labels.MODE) == "count") == profile_boot:
            found.append(name)
    return sorted(found)


def rendered_label(config: dict[str, Any], service: str, key: str) -> str | None:
    return (config.get("services", {}).get(service, {}).get("labels") or {}).get(key)


__all__ = ["Deployment", "dependency_order", "lane_services", "rendered_label", "service_profiles",
           "labels"]
