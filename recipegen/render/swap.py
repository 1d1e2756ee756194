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

The whole transaction runs under the recipe's lock (`recipegen.common.lock.recipe_lock`, an
flock the kernel drops when the process ends) and the output folder's: a second swap or render
of the recipe waits for it, or fails cleanly. Whether a journal belongs to a swap in progress is
the lock's answer, not a guess from a process id: a journal whose recipe lock can be taken was
left by a process that is gone, and is rolled back.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from recipegen.common.errors import InputError, RecipegenError
from recipegen.common.lock import LockBusy, output_lock, recipe_lock
from recipegen.load.document import display_path
from recipegen.load.recipe import RECIPE_TEMP_SUFFIX, read_recipe_bytes, recipe_temp_path, write_recipe_atomically

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
    from expert_residency.formats._records import MAX_RECORD_BYTES

    from recipegen.render.output import MANIFEST_NAME, read_generated, read_manifest

    manifest = read_manifest(out_dir)
    if manifest is None:
        return None
    files = {}
    for relative in manifest:
        path = out_dir / relative
        if path.is_file() and not path.is_symlink() and relative != MANIFEST_NAME:
            files[relative] = read_generated(path, limit=MAX_RECORD_BYTES)
    return files


def _journal_bytes(recipe_path: Path, old_text: bytes, folders: dict[Path, dict[str, bytes] | None],
                   swaps: list[tuple[str, str | None, str]], output_root: Path) -> bytes:
    def enc(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    doc = {
        "version": JOURNAL_VERSION,
        "pid": os.getpid(),  # for people reading the file; the recipe's lock says who is alive
        "output_root": str(output_root),
        "recipe": recipe_path.name,
        "recipe_bytes": enc(old_text),
        "swaps": [list(s) for s in swaps],
        "folders": {str(folder): None if files is None else {p: enc(d) for p, d in files.items()}
                    for folder, files in folders.items()},
    }
    return json.dumps(doc, indent=1, sort_keys=True).encode("utf-8")


def _restore(recipe_path: Path, journal: dict) -> None:
    """Put the recipe and every rendered folder back as the journal recorded them."""
    from recipegen.render.output import retire_output_dir, write_output_dir

    _write_atomically(recipe_path, base64.b64decode(journal["recipe_bytes"]),
                      recipe_temp_path(recipe_path))
    # the rendering's root (compose/<recipe>); a journal without one names its folders only
    root = Path(journal.get("output_root") or min(journal["folders"], default=str(recipe_path)))
    with output_lock(root):
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
    committed; remove their temp files. Returns one line per recovered swap.

    A journal is interrupted exactly when its recipe's lock can be taken (the swap holds it
    from before the journal is written until after it is removed); one whose lock is held
    belongs to a swap in progress and is left alone."""
    lines: list[str] = []
    if not folder.is_dir():
        return lines
    for journal_file in sorted(folder.glob(f".*{JOURNAL_SUFFIX}")):
        recipe_path = folder / journal_file.name[1:-len(JOURNAL_SUFFIX)]
        if journal_file in _ACTIVE:
            continue  # this process's own swap, under way
        try:
            with recipe_lock(recipe_path, wait_s=0):
                line = _roll_back(recipe_path, journal_file)
        except LockBusy:
            continue  # a live swap holds the recipe
        if line:
            lines.append(line)
    for temp in folder.glob(f".*{RECIPE_TEMP_SUFFIX}*"):
        recipe = folder / temp.name[1:temp.name.index(RECIPE_TEMP_SUFFIX)]
        try:
            with recipe_lock(recipe, wait_s=0):
                if not journal_path(recipe).exists():  # a journal's temps go with its rollback
                    temp.unlink(missing_ok=True)
        except (LockBusy, RecipegenError, OSError):
            continue  # a write of that recipe is in progress (or the folder is read-only)
    return lines


def _roll_back(recipe_path: Path, journal_file: Path) -> str | None:
    """Under the recipe's lock: restore from an interrupted swap's journal, then remove it."""
    if not journal_file.exists():
        return None  # committed or rolled back meanwhile
    try:
        from recipegen.render.output import read_generated

        journal = json.loads(read_generated(journal_file, limit=JOURNAL_LIMIT).decode("utf-8"))
        journal["recipe_bytes"], journal["folders"], journal["swaps"]  # noqa: B018
    except (OSError, RecipegenError, ValueError, KeyError, TypeError):
        # written atomically, so a journal that does not parse was never committed
        journal_file.unlink(missing_ok=True)
        recipe_temp_path(recipe_path).unlink(missing_ok=True)
        return None
    _restore(recipe_path, journal)
    journal_file.unlink(missing_ok=True)
    swaps = ", ".join(f"lane {lane} back on {old}" for lane, old, _ in journal["swaps"])
    return (f"{display_path(recipe_path)}: an interrupted class swap was rolled back ({swaps}); "
            "recipe and rendering are as before it")


# A journal holds the recipe and the previous rendering's files, base64: far below this.
JOURNAL_LIMIT = 256 << 20


_ACTIVE: set[Path] = set()


def swap_classes(recipe_path: Path, swaps: list[tuple[str, str]], *,
                 validate: bool = False,
                 apply: Callable[[], None] | None = None,
                 restore: Callable[[], None] | None = None,
                 echo: Echo = print) -> SwapOutcome:
    """Make each (lane, class) active in the recipe and re-render, as one transaction.

    `apply` runs after the new recipe and rendering are in place (the ops swap recreates the
    service there); if it or anything before it fails, the recipe and the rendering are put back
    and `restore` runs (the ops swap brings the previous service back). The original error is
    re-raised after the rollback. Returns what changed (nothing when every class was active).
    """
    with recipe_lock(recipe_path, echo=echo):
        if journal_path(recipe_path) in _ACTIVE:
            raise RecipegenError(f"{display_path(recipe_path)}: a class swap of this recipe is already under way "
                                 "in this process")
        # holding the lock: a journal here was left by a process that died mid-swap
        line = _roll_back(recipe_path, journal_path(recipe_path))
        if line:
            echo(line)
        return _swap_locked(recipe_path, swaps, validate=validate,
                            apply=apply, restore=restore, echo=echo)


def _swap_locked(recipe_path: Path, swaps: list[tuple[str, str]], *, validate: bool,
                 apply: Callable[[], None] | None,
                 restore: Callable[[], None] | None, echo: Echo) -> SwapOutcome:
    from recipegen.load.recipe import active_class_text, load_recipe
    from recipegen.render.render import check_rendering, render_recipe, validate_rendering, write_rendering

    before = load_recipe(recipe_path, read_maps=False)
    previous = {lane.name: lane.active_class for lane in before.recipe.lanes}
    unknown = [lane for lane, _ in swaps if lane not in previous]
    if unknown:
        raise before.no_lane_error(unknown, "--class")
    old_bytes = read_recipe_bytes(recipe_path)
    try:
        text = old_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text", file=display_path(recipe_path)) from None
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
    rendering = render_recipe(loaded)
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
        _write_atomically(journal, _journal_bytes(recipe_path, old_bytes, folders, changed,
                                                  rendering.root),
                          _journal_temp_path(recipe_path))
        try:
            if new_text != text:
                _write_atomically(recipe_path, new_text.encode("utf-8"),
                                  recipe_temp_path(recipe_path))
            for lane, old, cls in changed:
                echo(f"{display_path(recipe_path)}: lane {lane}: active_class {old} -> {cls}")
            outcome.written = write_rendering(rendering)
            if apply is not None:
                apply()
        except BaseException:
            _restore(recipe_path, json.loads(journal.read_text(encoding="utf-8")))
            journal.unlink(missing_ok=True)
            if changed:
                echo(f"{display_path(recipe_path)}: swap failed; recipe and rendering restored "
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
