"""Swapping a lane's traffic class as one transaction: the recipe's `active_class`, the
rendered compose folder(s) and — for `recipegen swap` — the running service change together
or not at all. `recipegen render --class` and `recipegen swap` both go through `swap_classes`.

Everything that can be checked is checked before anything is written: the new recipe text is
validated with its row maps, the new rendering is computed in memory (and validated by Compose
when asked). Then, in this order:

1. a journal (`recipes/.<recipe>.recipegen-swap.json`) records the recipe's previous bytes and
   every file of the previous rendering, written atomically and fsynced: the commit record;
2. the recipe is replaced (temp file `.<recipe>.recipegen-swap.tmp`, rename);
3. the rendering is written (the output folder's own atomic write);
4. `apply` runs (the ops swap: recreate the service, wait for health);
5. the journal is removed: the swap is committed.

A failure in 2-4 restores the recipe and the rendering from the journal, then calls `restore`
(the ops swap: recreate the previous service). A process killed in 1-5 leaves the journal
behind; the next recipegen command that looks at the recipe folder (`recover_interrupted`)
rolls back to the previous state from it and removes every temp file, so recipe and rendering
never disagree and no temp file is ever read as a recipe or left for `render --check`.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from recipegen.common.errors import InputError, RecipegenError
from recipegen.load.recipe import RECIPE_TEMP_SUFFIX, recipe_temp_path, write_recipe_atomically
from recipegen.render.compose import TEMPLATES_DIR

JOURNAL_SUFFIX = ".recipegen-swap.json"
JOURNAL_VERSION = 1

Echo = Callable[[str], None]


def journal_path(recipe_path: Path) -> Path:
    return recipe_path.parent / f".{recipe_path.name}{JOURNAL_SUFFIX}"


def _journal_temp_path(recipe_path: Path) -> Path:
    return recipe_temp_path(recipe_path, "-journal")


def _write_atomically(target: Path, data: bytes, temp: Path) -> None:
    write_recipe_atomically(target, data, temp)


@dataclass
class SwapOutcome:
    """What `swap_classes` did."""

    previous: dict[str, str | None]          # lane -> active class before
    changed: list[tuple[str, str | None, str]] = field(default_factory=list)  # (lane, old, new)
    written: list[Path] = field(default_factory=list)   # compose files written
    old_hashes: dict[Path, dict[str, str]] = field(default_factory=dict)  # folder -> service hashes


def _folder_files(out_dir: Path) -> dict[str, bytes] | None:
    """The generated files of a rendered folder (per its manifest), None when it has none."""
    from recipegen.render.output import MANIFEST_NAME, read_manifest

    manifest = read_manifest(out_dir)
    if manifest is None:
        return None
    files = {}
    for relative in manifest:
        path = out_dir / relative
        if path.is_file() and relative != MANIFEST_NAME:
            files[relative] = path.read_bytes()
    return files


def _journal_bytes(recipe_path: Path, old_text: bytes, folders: dict[Path, dict[str, bytes] | None],
                   swaps: list[tuple[str, str | None, str]]) -> bytes:
    def enc(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    doc = {
        "version": JOURNAL_VERSION,
        "pid": os.getpid(),
        "recipe": recipe_path.name,
        "recipe_bytes": enc(old_text),
        "swaps": [list(s) for s in swaps],
        "folders": {str(folder): None if files is None else {p: enc(d) for p, d in files.items()}
                    for folder, files in folders.items()},
    }
    return json.dumps(doc, indent=1, sort_keys=True).encode("utf-8")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _restore(recipe_path: Path, journal: dict) -> None:
    """Put the recipe and every rendered folder back as the journal recorded them."""
    from recipegen.render.output import retire_output_dir, write_output_dir

    _write_atomically(recipe_path, base64.b64decode(journal["recipe_bytes"]),
                      recipe_temp_path(recipe_path))
    for folder, files in journal["folders"].items():
        out_dir = Path(folder)
        if files is None:
            retire_output_dir(out_dir)
        else:
            write_output_dir(out_dir, {p: base64.b64decode(d) for p, d in files.items()},
                             adopted=True)
    recipe_temp_path(recipe_path).unlink(missing_ok=True)


def recover_interrupted(folder: Path) -> list[str]:
    """Roll back every class swap in `folder` (a recipes folder) whose process died before it
    committed; remove their temp files. Returns one line per recovered swap."""
    lines: list[str] = []
    if not folder.is_dir():
        return lines
    for journal_file in sorted(folder.glob(f".*{JOURNAL_SUFFIX}")):
        recipe_path = folder / journal_file.name[1:-len(JOURNAL_SUFFIX)]
        try:
            journal = json.loads(journal_file.read_text(encoding="utf-8"))
            pid = int(journal["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            # written atomically, so a journal that does not parse was never committed
            journal_file.unlink(missing_ok=True)
            recipe_temp_path(recipe_path).unlink(missing_ok=True)
            continue
        if _pid_alive(pid) and pid != os.getpid():
            continue  # a swap in progress in another process
        if pid == os.getpid() and journal_file in _ACTIVE:
            continue  # our own swap in progress
        _restore(recipe_path, journal)
        journal_file.unlink(missing_ok=True)
        swaps = ", ".join(f"lane {lane} back on {old}" for lane, old, _ in journal["swaps"])
        lines.append(f"{recipe_path}: an interrupted class swap was rolled back ({swaps}); "
                     "recipe and rendering are as before it")
    for temp in folder.glob(f".*{RECIPE_TEMP_SUFFIX}*"):
        recipe = temp.name[1:temp.name.index(RECIPE_TEMP_SUFFIX)]
        if not journal_path(folder / recipe).exists():  # a journal of a live swap keeps them
            temp.unlink(missing_ok=True)
    return lines


_ACTIVE: set[Path] = set()


def swap_classes(recipe_path: Path, swaps: list[tuple[str, str]], *,
                 templates_dir: Path = TEMPLATES_DIR, validate: bool = False,
                 apply: Callable[[], None] | None = None,
                 restore: Callable[[], None] | None = None,
                 echo: Echo = print) -> SwapOutcome:
    """Make each (lane, class) active in the recipe and re-render, as one transaction.

    `apply` runs after the new recipe and rendering are in place (the ops swap recreates the
    service there); if it or anything before it fails, the recipe and the rendering are put back
    and `restore` runs (the ops swap brings the previous service back). The original error is
    re-raised after the rollback. Returns what changed (nothing when every class was active).
    """
    from recipegen.load.recipe import active_class_text, load_recipe
    from recipegen.render.render import check_rendering, render_recipe, validate_rendering, write_rendering

    for line in recover_interrupted(recipe_path.parent):
        echo(line)
    if journal_path(recipe_path).exists():  # left by a live process: its swap is under way
        raise RecipegenError(f"{recipe_path}: another class swap of this recipe is in progress "
                             f"({journal_path(recipe_path).name} exists); wait for it to finish")
    before = load_recipe(recipe_path, read_maps=False)
    previous = {lane.name: lane.active_class for lane in before.recipe.lanes}
    for lane, _ in swaps:
        if lane not in previous:
            raise InputError(f"no lane {lane!r} (lanes: {', '.join(previous)})",
                             file=str(recipe_path), field="--class")
    old_bytes = recipe_path.read_bytes()
    try:
        text = old_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text", file=str(recipe_path)) from None
    new_text = text
    changed: list[tuple[str, str | None, str]] = []
    for lane, cls in swaps:
        after = active_class_text(recipe_path, new_text, lane, cls)
        if after != new_text:
            changed.append((lane, previous[lane], cls))
        new_text = after
    outcome = SwapOutcome(previous, changed)

    # Everything is checked before anything is written: the new recipe with its row maps,
    # its rendering, and (when asked) Compose's verdict on it.
    loaded = load_recipe(recipe_path, text=new_text)
    rendering = render_recipe(loaded, templates_dir=templates_dir)
    if validate:
        for line in validate_rendering(rendering, prefer_docker_cli=True):
            echo(line)
    folders = {out_dir: _folder_files(out_dir) for out_dir in rendering.folders}
    for stale in check_rendering(rendering):
        folders.setdefault(stale.out_dir, _folder_files(stale.out_dir))
    outcome.old_hashes = {out_dir: _service_hashes(files) for out_dir, files in folders.items()}
    if not changed and not any(s.stale for s in check_rendering(rendering)):
        return outcome

    journal = journal_path(recipe_path)
    _ACTIVE.add(journal)
    try:
        _write_atomically(journal, _journal_bytes(recipe_path, old_bytes, folders, changed),
                          _journal_temp_path(recipe_path))
        try:
            if new_text != text:
                _write_atomically(recipe_path, new_text.encode("utf-8"),
                                  recipe_temp_path(recipe_path))
            for lane, old, cls in changed:
                echo(f"{recipe_path}: lane {lane}: active_class {old} -> {cls}")
            outcome.written = write_rendering(rendering)
            if apply is not None:
                apply()
        except BaseException:
            _restore(recipe_path, json.loads(journal.read_text(encoding="utf-8")))
            journal.unlink(missing_ok=True)
            if changed:
                echo(f"{recipe_path}: swap failed; recipe and rendering restored "
                     f"({', '.join(f'lane {lane} on {old}' for lane, old, _ in changed)})")
            if restore is not None:
                restore()
            raise
        journal.unlink(missing_ok=True)
    finally:
        _ACTIVE.discard(journal)
    return outcome


def _service_hashes(files: dict[str, bytes] | None) -> dict[str, str]:
    from recipegen.render.compose import service_hashes
    from recipegen.render.render import COMPOSE_FILE

    if not files or COMPOSE_FILE not in files:
        return {}
    return service_hashes(files[COMPOSE_FILE].decode("utf-8", errors="replace"))


__all__ = ["SwapOutcome", "journal_path", "recover_interrupted", "swap_classes", "RecipegenError"]
