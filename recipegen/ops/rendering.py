"""The rendered compose folder of a recipe, through `recipegen.render` (the render issue owns
how files are made; ops only asks "is it current?", "render it", and where it lives).

A recipe whose lanes span machines renders one folder per machine
(`compose/<recipe>/<machine>/`, DESIGN "Multi-node lanes"); the ops commands drive the folder of
the machine they run on, named with `--machine` (or `RECIPEGEN_MACHINE`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Rendering:
    recipe_arg: str
    loaded: Any
    machine: str | None = None

    @classmethod
    def load(cls, recipe: str, machine: str | None = None) -> Rendering:
        from recipegen.load.recipe import load_recipe

        rendering = cls(recipe, load_recipe(recipe), machine)
        rendering._check_machine()
        return rendering

    def reload(self) -> None:
        from recipegen.load.recipe import load_recipe

        self.loaded = load_recipe(self.loaded.path)

    def machines(self) -> list[str]:
        """The machines the renderer makes a folder for (empty: one folder, no machine level)."""
        rendering = self._render()
        if len(rendering.folders) == 1 and rendering.root in rendering.folders:
            return []
        return sorted(folder.name for folder in rendering.folders)

    def _check_machine(self) -> None:
        machines = self.machines()
        if self.machine is not None and not machines:
            self.machine = None  # one folder: --machine (e.g. from RECIPEGEN_MACHINE) is moot
            return
        if self.machine is not None and self.machine not in machines:
            raise self.loaded.error(f"{self.loaded.name} has no lanes on machine {self.machine!r} "
                                    f"(machines: {', '.join(machines)})", ("machines",))
        if self.machine is None and len(machines) > 1:
            raise self.loaded.error(f"{self.loaded.name} spans machines {', '.join(machines)}: name the "
                                    "one this engine runs on with --machine (or RECIPEGEN_MACHINE)", ("machines",))

    @property
    def out_dir(self) -> Path:
        from recipegen.render.render import output_root, project_root_for

        root = output_root(project_root_for(self.loaded.path), self.loaded.name)
        return root / self.machine if self.machine else root

    @property
    def compose_file(self) -> Path:
        from recipegen.render.render import COMPOSE_FILE

        return self.out_dir / COMPOSE_FILE

    def _render(self) -> Any:
        from recipegen.render.render import render_recipe

        return render_recipe(self.loaded)

    def stale_reasons(self) -> list[str]:
        """Why this machine's folder differs from a fresh render (empty when current)."""
        from recipegen.render.render import check_rendering

        return [line for s in check_rendering(self._render()) if s.out_dir == self.out_dir
                for line in s.describe()]

    def fresh_config_hashes(self) -> dict[str, str]:
        """service → config-hash label of a fresh render (what `up` would run now)."""
        import yaml

        from recipegen.render.compose import CONFIG_HASH_LABEL
        from recipegen.render.render import COMPOSE_FILE

        files = self._render().folders[self.out_dir]
        services = (yaml.safe_load(files[COMPOSE_FILE].decode("utf-8")) or {}).get("services") or {}
        return {name: str((svc.get("labels") or {}).get(CONFIG_HASH_LABEL, ""))
                for name, svc in services.items()}

    def render(self) -> None:
        """Write every folder of the recipe (all machines: one repository, one render)."""
        from recipegen.render.render import write_rendering

        write_rendering(self._render())
