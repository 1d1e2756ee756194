"""`recipegen render`: recipe + ledger → the compose project folder, written atomically.

render_recipe()  - everything in memory: {output folder: {relative path: bytes}}
write_rendering() - atomic swap of each output folder (optionally validated first)
check_renderings() - staleness of committed output against the recipes, byte for byte
"""

from __future__ import annotations

import configparser
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from recipegen.common.errors import InputError, RecipegenError
from recipegen.load.document import display_path
from recipegen.render.compose import lane_service, render_compose
from recipegen.render.compose_validate import ComposeValidationError, validate_compose_file
from recipegen.render.monitoring import monitoring_project
from recipegen.render.output import (
    RenderedFiles,
    Staleness,
    compare_output_dir,
    read_manifest,
    refuse_symlinks,
    retire_output_dir,
    write_output_dir,
)
from recipegen.render.services import (
    DEFAULT_PLUGIN_ENTRY_POINT,
    LaneMemory,
    RenderInputs,
    build_services,
    lane_stages,
    recipe_machines,
    relative_posix,
)
from recipegen.vllm_flags import TARGET_VLLM_VERSION, load_flag_table

if TYPE_CHECKING:
    from recipegen.ledger import RecipeLedger
    from recipegen.load.recipe import LoadedRecipe

COMPOSE_DIRNAME = "compose"
COMPOSE_FILE = "compose.yaml"
# Generated beside compose.yaml: runtime data, secrets and host-specific settings (`.env`:
# compose interpolation, e.g. RECIPEGEN_MODELS_DIR) never belong in git.
GITIGNORE = b"# written by recipegen render\ndumps/\nsecrets.env\n.env\n"


@dataclass(frozen=True)
class Rendering:
    """One recipe's output: per output folder (one per machine), its files."""

    recipe_name: str
    recipe_path: Path
    folders: dict[Path, RenderedFiles]
    root: Path  # compose/<recipe>


def project_root_for(recipe_path: Path) -> Path:
    """The folder holding `recipes/` and `compose/`: the recipe's `recipes/` parent, else cwd."""
    # abspath, not resolve: a symlinked recipe belongs to the project it sits in, and never
    # sends the render into the tree its link points to.
    parent = Path(os.path.abspath(recipe_path)).parent
    while parent != parent.parent:
        if parent.name == "recipes":
            return parent.parent
        parent = parent.parent
    return Path(os.path.abspath(Path.cwd()))


def runtime_dir_for(project_root: Path) -> Path:
    """The runtime/ folder to mount: the project's own, else the installed package's parent."""
    local = project_root / "runtime"
    if (local / "expert_residency").is_dir():
        return local
    import expert_residency

    return Path(expert_residency.__file__).resolve().parent.parent


def runtime_version(runtime_dir: Path) -> str:
    """The runtime's version from its dist-info METADATA ("" when it has none)."""
    for dist_info in sorted(runtime_dir.glob("expert_residency-*.dist-info")):
        metadata = dist_info / "METADATA"
        if metadata.is_file():
            for line in metadata.read_text(encoding="utf-8").splitlines():
                if line.startswith("Version:"):
                    return line.partition(":")[2].strip()
    return ""


def plugin_entry_point(runtime_dir: Path) -> str:
    """The `vllm.general_plugins` entry-point name the runtime's dist-info declares."""
    for dist_info in sorted(runtime_dir.glob("expert_residency-*.dist-info")):
        entry_points = dist_info / "entry_points.txt"
        if entry_points.is_file():
            parser = configparser.ConfigParser()
            parser.read_string(entry_points.read_text(encoding="utf-8"))
            if parser.has_section("vllm.general_plugins"):
                names = list(parser["vllm.general_plugins"])
                if names:
                    return names[0]
    return DEFAULT_PLUGIN_ENTRY_POINT


def lane_memory(loaded: LoadedRecipe, ledger: RecipeLedger) -> dict[str, LaneMemory]:
    """How each lane sizes its KV pool: a declared `kv_cache_bytes` is fixed; a lane that shares
    a GPU is always fixed (the ledger's `hbm.kv_pool` bytes), so engines starting one after
    another do not each measure the whole GPU; otherwise the declared utilisation."""
    recipe = loaded.recipe
    memory: dict[str, LaneMemory] = {}
    for lane in recipe.lanes:
        sharing = [o for o in recipe.lanes if o is not lane and any(
            a.machine == b.machine and set(a.gpus) & set(b.gpus)
            for a in lane_stages(lane) for b in lane_stages(o))]
        if lane.kv_cache_bytes is not None:
            memory[lane.name] = LaneMemory(kv_cache_memory_bytes=lane.kv_cache_bytes)
        elif sharing:
            pool = ledger.lane(lane.name).fig("hbm.kv_pool").value
            memory[lane.name] = LaneMemory(kv_cache_memory_bytes=int(pool))
        else:
            memory[lane.name] = LaneMemory(gpu_memory_utilization=lane.gpu_memory_utilization)
    return memory


def checked_ledger(loaded: LoadedRecipe) -> RecipeLedger:
    """The recipe's ledger; refuses (rather than ship an engine that OOMs) when a budget fails."""
    from recipegen.ledger import compute_ledger

    ledger = compute_ledger(loaded)
    if not ledger.ok:
        lines = []
        for violation in ledger.violations:
            where = f"lane {violation.lane}: " if violation.lane else (
                f"machine {violation.machine}: " if violation.machine else "")
            lines.append(f"{where}{violation.message} ({violation.suggestion})")
        raise RecipegenError(f"{display_path(loaded.path)}: budgets fail, not rendering "
                             f"(details: recipegen check budgets {loaded.name} --explain):\n  "
                             + "\n  ".join(lines))
    return ledger


def output_root(project_root: Path, recipe_name: str) -> Path:
    return project_root / COMPOSE_DIRNAME / recipe_name


def _declared_name(path: Path, containing: str | None = None) -> tuple[str, int | None] | None:
    """A recipe file's top-level `name` and its line, read without loading the recipe (None where
    the file cannot be read or parsed, or, given `containing`, does not hold that text at all: a
    render must not parse every recipe beside it)."""
    from recipegen.load.document import line_of, parse_yaml
    from recipegen.load.recipe import read_recipe_bytes

    try:
        data = read_recipe_bytes(path)
        if containing is not None and containing.encode("utf-8") not in data:
            return None
        document = parse_yaml(data.decode("utf-8"), display_path(path))
    except (InputError, UnicodeDecodeError):
        return None  # unreadable: its own load says why
    if not isinstance(document, dict) or not isinstance(document.get("name"), str):
        return None
    return document["name"], line_of(document, ("name",))


def _shared_name_error(name: str, path: Path, line: int | None, other: Path, other_line: int | None) -> InputError:
    folder = f"{COMPOSE_DIRNAME}/{name}/"
    return InputError(
        f"{display_path(other)}{f':{other_line}' if other_line else ''} has the same name {name}: both "
        f"would render into {folder}, each overwriting the other; give each recipe its own "
        f"name ({folder} was not written)", file=display_path(path), line=line, field="name")


def refuse_shared_name(loaded: LoadedRecipe) -> None:
    """Refuse a recipe whose `name` another recipe beside it also has: both would render into
    compose/<name>/, each overwriting the other, and `render --check` could never pass."""
    from recipegen.load.recipe import list_recipes

    here = Path(os.path.abspath(loaded.path))
    for other in list_recipes(here.parent):
        if Path(os.path.abspath(other)) == here:
            continue
        found = _declared_name(other, containing=loaded.name)
        if found is not None and found[0] == loaded.name:
            raise _shared_name_error(loaded.name, loaded.path, loaded.line_of(("name",)), other, found[1])


def refuse_shared_names(paths: list[Path]) -> None:
    """Before rendering several recipes: refuse when two of one folder have the same `name` (else
    the ones before the clash would be written and the clash found only then)."""
    seen: dict[tuple[str, str], tuple[Path, int | None]] = {}
    for path in paths:
        found = _declared_name(path)
        if found is None:
            continue
        name, line = found
        key = (os.path.abspath(path.parent), name)   # one folder of recipes renders into one compose/
        if key in seen:
            first, first_line = seen[key]
            raise _shared_name_error(name, path, line, first, first_line)
        seen[key] = (path, line)


def render_recipe(loaded: LoadedRecipe, *, project_root: Path | None = None) -> Rendering:
    """Render every output file of a loaded recipe, in memory. Raises on any problem."""
    recipe = loaded.recipe
    root_dir = project_root or project_root_for(loaded.path)
    refuse_shared_name(loaded)
    ledger = checked_ledger(loaded)
    table = load_flag_table(TARGET_VLLM_VERSION)
    runtime_dir = runtime_dir_for(root_dir)
    memory = lane_memory(loaded, ledger)
    root = output_root(root_dir, recipe.name)
    machines = recipe_machines(recipe)
    folders: dict[Path, RenderedFiles] = {}
    for machine in machines:
        out_dir = root if len(machines) == 1 else root / machine
        inputs = RenderInputs(out_dir=out_dir, runtime_dir=runtime_dir,
                              plugin_entry_point=plugin_entry_point(runtime_dir),
                              runtime_version=runtime_version(runtime_dir),
                              memory=memory, flag_table=table)
        specs, volumes, extra = build_services(loaded, machine, inputs)
        # The `monitoring` profile (Prometheus, Grafana): services as data beside the engines'.
        monitoring, monitoring_volumes, monitoring_files = monitoring_project(loaded, machine)
        project = recipe.name if len(machines) == 1 else f"{recipe.name}-{machine}"
        services = [lane_service(spec, table.vllm_version) for spec in specs] + monitoring
        text = render_compose(project_name=_project_name(project), recipe_name=recipe.name,
                              recipe_file=relative_posix(loaded.path, out_dir),
                              vllm_version=table.vllm_version, services=services,
                              volumes=volumes + monitoring_volumes)
        files: RenderedFiles = {COMPOSE_FILE: text.encode("utf-8"), ".gitignore": GITIGNORE}
        files.update(extra)
        files.update(monitoring_files)
        folders[out_dir] = files
    return Rendering(recipe.name, loaded.path, folders, root)


def _project_name(name: str) -> str:
    """Compose project names: lowercase letters, digits, dashes and underscores."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name.lower())


def validate_rendering(rendering: Rendering, *, prefer_docker_cli: bool) -> list[str]:
    """Validate each compose file with a real Compose v2 before anything is written.

    The text is validated from a scratch folder at the same depth below a `compose/` folder,
    so relative paths resolve the same way; `config` does not need the bind sources to exist.
    """
    reports = []
    with tempfile.TemporaryDirectory(prefix="recipegen-validate-") as scratch:
        for out_dir, files in rendering.folders.items():
            relative = out_dir.relative_to(rendering.root.parent.parent)
            staged = Path(scratch) / relative
            staged.mkdir(parents=True, exist_ok=True)
            (staged / COMPOSE_FILE).write_bytes(files[COMPOSE_FILE])
            target = display_path(out_dir / COMPOSE_FILE)
            try:
                version = validate_compose_file(staged / COMPOSE_FILE, prefer_docker_cli=prefer_docker_cli)
            except ComposeValidationError as err:  # name the file the user will have, not the copy
                raise ComposeValidationError(str(err).replace(str(staged / COMPOSE_FILE), target)
                                             + " (checked before writing: nothing was written)") from None
            reports.append(f"{target}: valid (Docker Compose {version})")
    return reports


def write_rendering(rendering: Rendering) -> list[Path]:
    """Write each output folder atomically; returns the compose files written.

    One machine: `compose/<recipe>/` is the output folder. Several machines: one folder per
    machine below it (DESIGN "Multi-node lanes"), each swapped atomically; what an earlier render
    left in the other layout is removed.
    """
    from recipegen.common.lock import output_lock, sweep_locks

    root = rendering.root
    refuse_unusable_folders(rendering)
    with output_lock(root):  # one writer of compose/<recipe>/ at a time
        written = _write_rendering_locked(rendering)
    sweep_locks(root.parent)  # lock files of renders killed while holding them
    return written


def _write_rendering_locked(rendering: Rendering) -> list[Path]:
    root = rendering.root
    single = list(rendering.folders) == [root]
    # A folder this recipe rendered before, in either layout, is ours even once retired.
    owned = read_manifest(root) is not None or bool(_machine_folders(root))
    # Retire what an earlier render wrote in the other layout (its generated files only: the
    # user's files, e.g. dumps/ and secrets.env, stay where they are).
    if single:
        for child in _machine_folders(root):
            retire_output_dir(child)
    else:
        retire_output_dir(root)  # an earlier single-machine render
        for child in _machine_folders(root):
            if child not in rendering.folders:
                retire_output_dir(child)
    written = []
    for out_dir, files in sorted(rendering.folders.items()):
        write_output_dir(out_dir, files, adopted=owned and out_dir == root)
        written.append(out_dir / COMPOSE_FILE)
    return written


def _machine_folders(root: Path) -> list[Path]:
    """Sub-folders of an output root that a render wrote (they carry a manifest)."""
    if not root.is_dir():
        return []
    return [c for c in sorted(root.iterdir())
            if c.is_dir() and not c.name.startswith(".") and read_manifest(c) is not None]


def refuse_unusable_folders(rendering: Rendering) -> None:
    """Refuse output folders that are symlinks or files (compose/, compose/<recipe>, machines):
    before a write, and before --check or --diff compares against them."""
    root = rendering.root
    for out_dir in [root, *rendering.folders]:
        refuse_symlinks(out_dir, root.parent.parent)


def check_rendering(rendering: Rendering) -> list[Staleness]:
    """Byte-for-byte comparison of every output folder, plus folders a render would not write."""
    refuse_unusable_folders(rendering)
    results = [compare_output_dir(out_dir, files)
               for out_dir, files in sorted(rendering.folders.items())]
    root = rendering.root
    for child in _machine_folders(root):
        if child not in rendering.folders:
            results.append(Staleness(child, extra=(COMPOSE_FILE,)))
    if root not in rendering.folders and read_manifest(root) is not None:
        results.append(Staleness(root, extra=(COMPOSE_FILE,)))
    return results


def orphan_outputs(project_root: Path, recipe_names: set[str]) -> list[Path]:
    """Rendered folders under compose/ whose recipe no longer exists."""
    compose_dir = project_root / COMPOSE_DIRNAME
    if not compose_dir.is_dir():
        return []
    orphans = []
    for child in sorted(compose_dir.iterdir()):
        if not child.is_dir() or child.name.startswith(".") or child.name in recipe_names:
            continue
        if read_manifest(child) is not None or any(read_manifest(c) is not None
                                                   for c in child.iterdir() if c.is_dir()):
            orphans.append(child)
    return orphans
