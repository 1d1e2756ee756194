"""The rendered compose folder of a recipe, through `recipegen.render` (the render issue owns
how files are made; ops only asks "is it current?", "render it", and where it lives)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipegen.errors import RecipegenError


@dataclass
class Rendering:
    recipe_arg: str
    loaded: Any

    @classmethod
    def load(cls, recipe: str) -> "Rendering":
        from recipegen.recipe_io import load_recipe

        return cls(recipe, load_recipe(recipe))

    def reload(self) -> None:
        from recipegen.recipe_io import load_recipe

        self.loaded = load_recipe(self.loaded.path)

    def _render(self) -> Any:
        from recipegen.render.render import render_recipe

        rendering = render_recipe(self.loaded)
        if len(rendering.folders) != 1:
            raise RecipegenError(
                f"{self.loaded.name} spans {len(rendering.folders)} machines; the ops commands "
                "drive one machine's compose project at a time (multi-machine lanes: run "
                "`docker compose` in each machine's folder)")
        return rendering

    @property
    def out_dir(self) -> Path:
        from recipegen.render.render import output_root, project_root_for

        return output_root(project_root_for(self.loaded.path), self.loaded.name)

    @property
    def compose_file(self) -> Path:
        from recipegen.render.render import COMPOSE_FILE

        return self.out_dir / COMPOSE_FILE

    def stale_reasons(self) -> list[str]:
        """Why the folder on disk differs from a fresh render (empty when current)."""
        from recipegen.render.render import check_rendering

        return [line for s in check_rendering(self._render()) for line in s.describe()]

    def fresh_config_hashes(self) -> dict[str, str]:
        """service → config-hash label of a fresh render (what `up` would run now)."""
        import yaml

        from recipegen.render.compose import CONFIG_HASH_LABEL
        from recipegen.render.render import COMPOSE_FILE

        rendering = self._render()
        text = next(iter(rendering.folders.values()))[COMPOSE_FILE].decode("utf-8")
        services = (yaml.safe_load(text) or {}).get("services") or {}
        return {name: str((svc.get("labels") or {}).get(CONFIG_HASH_LABEL, ""))
                for name, svc in services.items()}

    def render(self) -> None:
        from recipegen.render.render import write_rendering

        write_rendering(self._render())
