"""Locate, read and validate recipe files; write `active_class` back without touching the layout.

Every problem becomes one `InputError` naming file, line and field path (all problems of a file are
listed in its message), never a traceback: YAML syntax, duplicate keys, unknown fields, wrong
types, missing units, unknown catalog names, cross-references, missing or mismatched row maps.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from recipegen.catalog import catalog_entry
from recipegen.common.errors import InputError
from recipegen.common.paths import escaping_link
from recipegen.load.checks import cross_reference_problems, inside_project, project_root_of
from recipegen.load.document import (
    MAX_RECIPE_CHARS,
    Loc,
    Problem,
    display_path,
    format_loc,
    line_of,
    parse_yaml,
    problems_error,
    read_yaml_file,
    round_trip_yaml,
    to_plain,
    validation_error,
)
from recipegen.load.model_file import load_model_file
from recipegen.load.rowmaps import read_lane_rowmaps
from recipegen.schema import Lane, Recipe
from recipegen.schema.patterns import FILE_NAME, NAME_MAX_LENGTH

RECIPES_DIRNAME = "recipes"
RECIPE_SUFFIX = ".yaml"   # a recipe is recipes/<name>.yaml
PACKAGE_ROOT = Path(__file__).resolve().parents[2]



@dataclass
class LoadedRecipe:
    """A validated recipe and where it came from."""

    recipe: Recipe
    path: Path
    document: Any = field(repr=False, default=None)  # ruamel round-trip tree, for line numbers
    rowmaps: dict[tuple[str, str], Any] = field(default_factory=dict, repr=False)
    """(lane, class) -> expert_residency.formats.RowMap, for every class whose map was read."""

    @property
    def name(self) -> str:
        return self.recipe.name

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def resolve(self, relative: str) -> Path:
        """A path written in the recipe (relative to the recipe file)."""
        return self.base_dir / relative

    def line_of(self, loc: Loc) -> int | None:
        return line_of(self.document, loc)

    def error(self, message: str, loc: Loc) -> InputError:
        """An InputError at a field of this recipe."""
        return InputError(message, file=display_path(self.path), line=self.line_of(loc),
                          field=format_loc(loc))

    def lane_at(self, name: str | None, what: str = "to use", *, option: str = "LANE") -> tuple[int, Lane]:
        """The lane called `name` and its index; with no name, the recipe's only lane (several: refused,
        naming them, as `what` needs one: "to fit", "to plan"). A name the recipe has no lane of is
        refused by `no_lane_error`, naming `option`, the argument or option that gave it."""
        lanes = self.recipe.lanes
        if name is None:
            if len(lanes) > 1:
                listed = ", ".join(lane.name for lane in lanes)
                raise InputError(f"the recipe has {len(lanes)} lanes ({listed}): name the one {what}",
                                 file=display_path(self.path), field="lanes")
            return 0, lanes[0]
        for index, lane in enumerate(lanes):
            if lane.name == name:
                return index, lane
        raise self.no_lane_error([name], option)

    def no_lane_error(self, names: list[str], option: str = "LANE") -> InputError:
        """The one refusal of lane names this recipe has no lane of, whichever command took them:
        the recipe's file, the argument or option that named them as the field (`LANE`, `--lane`,
        `--class`), and the recipe's lanes."""
        listed = ", ".join(lane.name for lane in self.recipe.lanes)
        unknown = ", ".join(repr(name) for name in names)
        return InputError(f"the recipe has no lane{'s' if len(names) > 1 else ''} {unknown} (lanes: {listed})",
                          file=display_path(self.path), field=option)


# ---------------------------------------------------------------- locating

def recipe_search_dirs() -> list[Path]:
    dirs = [Path.cwd() / RECIPES_DIRNAME, PACKAGE_ROOT / RECIPES_DIRNAME]
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def resolve_recipe_path(name_or_path: str | os.PathLike[str]) -> Path:
    """A path to a file, or a bare recipe name resolved as `recipes/<name>.yaml`."""
    text = os.fspath(name_or_path)
    candidate = Path(text)
    if candidate.is_file():
        return candidate
    if not candidate.suffix and candidate.with_suffix(".yaml").is_file():
        return candidate.with_suffix(".yaml")
    bare = os.sep not in text and "/" not in text
    if bare:
        stem = text[:-5] if text.endswith(".yaml") else text
        for folder in recipe_search_dirs():
            path = folder / f"{stem}.yaml"
            if path.is_file():
                return path
    if candidate.exists():
        raise InputError("not a file", file=text)
    known = sorted({p.stem for d in recipe_search_dirs() if d.is_dir() for p in d.glob("*.yaml")
                    if not p.name.startswith(".")})
    hint = f"; recipes under {RECIPES_DIRNAME}/: {', '.join(known)}" if bare and known else ""
    raise InputError(f"recipe not found{hint}", file=text)


def list_recipes(folder: Path | None = None) -> list[Path]:
    """Every recipe under `recipes/` (the first search folder that exists)."""
    folders = [folder] if folder is not None else recipe_search_dirs()
    for d in folders:
        if d.is_dir():
            # dot files are temp files of a write in progress (or of one a crash cut short)
            return sorted(p for p in d.glob("*.yaml") if not p.name.startswith("."))
    return []


# ---------------------------------------------------------------- loading

def read_recipe_bytes(path: Path) -> bytes:
    """A recipe file's bytes: a regular file of bounded size only (a FIFO, a device or a huge
    file is refused before reading, naming the file)."""
    from expert_residency.formats._io import UnreadableFile, read_regular_file

    file = display_path(path)
    try:
        return read_regular_file(path, limit=4 * MAX_RECIPE_CHARS)  # UTF-8: at most 4 bytes a character
    except UnreadableFile as exc:
        raise InputError(f"{exc.strerror}: not a recipe", file=file) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=file) from None


def read_recipe_text(path: Path) -> str:
    """`read_recipe_bytes` decoded; undecodable bytes are refused with the line they are on."""
    data = read_recipe_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - data.rfind(b"\n", 0, exc.start)
        raise InputError(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at column {column})",
                         file=display_path(path), line=line) from None


def _read_validated(path: Path, text: str | None = None) -> tuple[Recipe, Any]:
    """YAML + schema validation (no cross-references): the Recipe and its round-trip document.
    `text`: validate this as the content of `path` (a write not yet made)."""
    file = display_path(path)
    if text is not None:
        return _validated_document(path, parse_yaml(text, file))
    document = parse_yaml(read_recipe_text(path), file)
    return _validated_document(path, document)


def _validated_document(path: Path, document: Any) -> tuple[Recipe, Any]:
    file = display_path(path)
    if not isinstance(document, dict):
        # never echo the value: a mistyped path may name a secrets file
        kind = "empty" if document is None else "a list" if isinstance(document, list) \
            else f"a single {type(document).__name__} value"
        raise InputError(f"a recipe is a YAML mapping (version, name, model, machines, lanes); "
                         f"this file is {kind}", file=file,
                         line=document.lc.line + 1 if hasattr(document, "lc") else 1)
    try:
        # catalog names are looked up in recipegen.catalog; model: {file: ...} is read relative
        # to this recipe (recipegen.load.model_file)
        context = {"catalog": catalog_entry, "model_file": _model_file_loader(path)}
        recipe = Recipe.model_validate(to_plain(document), context=context)
    except ValidationError as exc:
        raise validation_error(path, document, exc) from None
    return recipe, document


def recipe_file_stem(path: Path) -> str:
    """The recipe name a file's name stands for: its name without `.yaml` (the whole name when it
    does not end so, which `file_name_problems` refuses)."""
    name = path.name
    if name.endswith(RECIPE_SUFFIX) and len(name) > len(RECIPE_SUFFIX):
        return name[:-len(RECIPE_SUFFIX)]
    return name


def file_name_problems(recipe: Recipe, path: Path) -> list[Problem]:
    """A recipe's file is `<name>.yaml`, its `name` that name: rendered output goes to
    `compose/<name>/`, while `render`, `check`, `up` and the generated files' headers name the recipe
    by its file (found as `recipes/<name>.yaml`), so a mismatch, or another suffix such as `.yml`,
    renders into a folder no command finds again."""
    if not path.name.endswith(RECIPE_SUFFIX):
        return [(("name",), f"the recipe's file name {path.name!r} does not end in {RECIPE_SUFFIX}: "
                 f"commands find a recipe by its name as recipes/<name>{RECIPE_SUFFIX} and render it into "
                 f"compose/<name>/; rename the file to {recipe.name}{RECIPE_SUFFIX}")]
    stem = recipe_file_stem(path)
    if recipe.name == stem:
        return []
    # the stem is quoted as shown by repr: a file name may hold anything
    fixes = [f"write `name: {stem}`"] if re.fullmatch(FILE_NAME.regex, stem) and \
        len(stem) <= NAME_MAX_LENGTH else []
    fixes.append(f"rename the file to {recipe.name}{RECIPE_SUFFIX}")
    return [(("name",), f"name {recipe.name!r} is not the file's name {stem!r} (the file name without "
             f"{RECIPE_SUFFIX}): rendered output goes to compose/<name>/ and commands name a recipe by its "
             f"file, so the two must agree; {' or '.join(fixes)}")]


def load_recipe(path_or_name: str | os.PathLike[str], *, read_maps: bool = True,
                text: str | None = None) -> LoadedRecipe:
    """Read, validate and cross-check a recipe. Raises InputError on any problem.

    `text`: take this as the file's content (to check a write before making it)."""
    path = resolve_recipe_path(path_or_name) if text is None else Path(path_or_name)
    recipe, document = _read_validated(path, text)
    # listed after the file's other problems, with them: each is worth fixing on its own
    misnamed = file_name_problems(recipe, path)
    cross = cross_reference_problems(recipe, path.parent) + local_checkpoint_problems(recipe, path, document)
    if cross:
        raise problems_error(path, document, cross + misnamed)
    loaded = LoadedRecipe(recipe=recipe, path=path, document=document)
    if read_maps:
        problems: list[Problem] = []
        for i, lane in enumerate(recipe.lanes):
            maps, lane_problems = read_lane_rowmaps(recipe, i, path.parent)
            problems.extend(lane_problems)
            for cls, rowmap in maps.items():
                loaded.rowmaps[(lane.name, cls)] = rowmap
        if problems:
            raise problems_error(path, document, problems + misnamed)
    if misnamed:
        raise problems_error(path, document, misnamed)
    return loaded


def load_recipe_model(path_or_name: str | os.PathLike[str], *, text: str | None = None) -> LoadedRecipe:
    """A recipe validated field by field, without the checks that read other files (row maps and
    histograms present and agreeing with the budget) or cross lanes: what a command needs that
    only reads the model (`rowmap build --recipe R`) or rewrites the maps (`recipegen fit`), so a
    recipe that is invalid only because of the very map being built does not block building it.
    `text`: take this as the file's content (a recipe not yet written)."""
    path = resolve_recipe_path(path_or_name) if text is None else Path(path_or_name)
    recipe, document = _read_validated(path, text)
    problems = local_checkpoint_problems(recipe, path, document) + file_name_problems(recipe, path)
    if problems:
        raise problems_error(path, document, problems)
    return LoadedRecipe(recipe=recipe, path=path, document=document)


def local_checkpoint_problems(recipe: Recipe, path: Path, document: Any) -> list[Problem]:
    """A `model.checkpoint` written as a relative path that names something on this disk.

    `org/name` is a Hugging Face repo id by the schema's one rule (`recipegen.schema.patterns`), and
    the rendering mounts it from the hub cache; but `checkpoints/gpt-oss-120b` is that shape too.
    Where a file or folder of that relative path exists beside the recipe or in its project (the
    folder holding `recipes/`), the text is refused at its line: it is a local checkpoint written
    without its absolute path. Not the current folder: a recipe means the same wherever a command
    runs (a hub download into ./Qwen/… must not make the shipped Qwen recipes fail there). A checkpoint the catalog gives is the
    catalog's repo id, not checked. Written in the recipe: a problem at its line (returned); in the
    recipe's model file (`model: {file: …}`): refused at that file's line (raised)."""
    checkpoint = recipe.model.checkpoint
    if not checkpoint or checkpoint.startswith("/"):
        return []
    node = document.get("model") if isinstance(document, dict) else None
    if not isinstance(node, dict):
        return []   # a catalog name: the catalog's repo id
    base = path.parent
    folders = {"in the recipe's folder": base, "in the project folder (the one holding recipes/)": project_root_of(base)}
    found, where = None, ""
    for what, folder in folders.items():
        candidate = os.path.abspath(os.path.join(folder, checkpoint))
        if os.path.lexists(candidate):
            found, where = candidate, what
            break
    if found is None:
        return []
    message = (f"{checkpoint!r} looks like a local path: it exists {where}, as {found}; write its "
               f"absolute path, `checkpoint: {found}` (as written it reads as a Hugging Face repo id "
               "org/name, which would be mounted from the hub cache instead)")
    if "checkpoint" in node:
        return [(("model", "checkpoint"), message)]
    if not isinstance(node.get("file"), str):
        return []   # `{catalog: name, …}`: the catalog's repo id
    from recipegen.load.model_file import MAX_MODEL_FILE_BYTES

    model_path = base / node["file"]
    model_document = read_yaml_file(model_path, limit=MAX_MODEL_FILE_BYTES, what="model file")
    raise InputError(message, file=display_path(model_path), line=line_of(model_document, ("checkpoint",)),
                     field="checkpoint")


# ---------------------------------------------------------------- write-back

_SCALAR_AT = re.compile(r"""("(?:[^"\\]|\\.)*"|'(?:[^']|'')*'|[^\s#]+)""")


def set_active_class(path: str | os.PathLike[str], lane: str, cls: str) -> bool:
    """Write `active_class: <cls>` for `lane` into the recipe, changing nothing else.

    Comments, quoting and layout are preserved (only the value token is replaced; a missing key is
    added with ruamel's round-trip writer). The result is re-validated before an atomic rename.
    Returns False when the class was already active (file untouched).
    """
    from recipegen.common.lock import recipe_lock

    target = resolve_recipe_path(path)
    with recipe_lock(target):  # read, change, write: one process at a time
        text = read_recipe_text(target)
        new_text = active_class_text(target, text, lane, cls)
        if new_text == text:
            return False
        _atomic_write_validated(target, new_text)
    return True


def active_class_text(target: Path, text: str, lane: str, cls: str) -> str:
    """The recipe text `text` (of file `target`) with `active_class: <cls>` for `lane`; the
    text unchanged when the class is already active. Pure: writes nothing."""
    file = display_path(target)
    document = parse_yaml(text, file)
    recipe, document = _validated_document(target, document)
    loaded = LoadedRecipe(recipe=recipe, path=target, document=document)
    index, lane_model = loaded.lane_at(lane, option="lanes")
    if cls not in lane_model.classes:
        raise loaded.error(f"class {cls!r} is not declared in lane {lane!r} (declared: "
                           f"{', '.join(lane_model.classes) or 'none'})", ("lanes", index, "classes"))
    if lane_model.active_class == cls:
        return text
    lane_node = document["lanes"][index]
    if "active_class" in lane_node and _own_key(lane_node, "active_class"):
        line, col = lane_node.lc.value("active_class")
        lines = text.splitlines(keepends=True)
        match = _SCALAR_AT.match(lines[line], col) if line < len(lines) else None
        if match is None or match.group(0).startswith(("*", "&", "!", "[", "{", "|", ">")):
            raise loaded.error("cannot find the active_class value to replace (write it as "
                               "a plain `active_class: <class>` line)",
                               ("lanes", index, "active_class"))
        lines[line] = lines[line][:match.start()] + cls + lines[line][match.end():]
        return "".join(lines)
    if "active_class" in lane_node:
        # inherited through a YAML merge key (`<<: *defaults`): writing it would change every
        # lane that shares the anchor
        line = _merged_line(lane_node, "active_class")
        raise InputError("active_class comes from a YAML merge key (`<<:`); write it in the lane "
                         "itself to swap classes", file=file,
                         line=line or loaded.line_of(("lanes", index, "active_class")),
                         field=format_loc(("lanes", index, "active_class")))
    import io

    lane_node["active_class"] = cls
    yaml = round_trip_yaml()
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    buffer = io.StringIO()
    yaml.dump(document, buffer)
    return buffer.getvalue()


def _merged_line(node: Any, key: str) -> int | None:
    """The 1-based line where `key` is written in the mapping a merge key brought it from (the
    anchored value, which is what to edit; the `<<:` line itself is not recorded by the parser)."""
    for merged in getattr(node, "merge", None) or []:
        source = merged[1] if isinstance(merged, tuple) else merged   # older ruamel: (position, map)
        if key in source and hasattr(source, "lc"):
            return int(source.lc.value(key)[0]) + 1
    return None


def _own_key(node: Any, key: str) -> bool:
    """True when `key` is written in `node` itself (not inherited through a merge key)."""
    merged = getattr(node, "merge", None) or []
    own = getattr(node, "_ok", None)
    if own is not None:
        return key in own
    return not any(key in m[1] for m in merged)


def _atomic_write_validated(target: Path, text: str) -> None:
    # never replace a good recipe with a broken one: validate the text before the rename
    load_recipe(target, read_maps=False, text=text)
    write_recipe_atomically(target, text.encode("utf-8"))


# The one temp name a recipe write uses: a dot file (never listed as a recipe) with a fixed
# name, so the next run knows what an interrupted write left (recipegen.render.swap removes it).
RECIPE_TEMP_SUFFIX = ".recipegen-swap.tmp"


def recipe_temp_path(recipe_path: Path, kind: str = "") -> Path:
    return recipe_path.parent / f".{recipe_path.name}{RECIPE_TEMP_SUFFIX}{kind}"


def write_recipe_atomically(target: Path, data: bytes, temp: Path | None = None) -> None:
    """`data` into `target` through a fixed-name temp, fsynced, renamed, the folder entry
    flushed. Keeps `target`'s mode."""
    temp = temp or recipe_temp_path(target)
    try:
        mode = os.stat(target).st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)
        os.replace(temp, target)
    except BaseException as exc:
        temp.unlink(missing_ok=True)
        if isinstance(exc, OSError):  # named by the recipe, not by our temp file
            raise OSError(exc.errno, exc.strerror, str(target)) from None
        raise
    folder = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)

def _model_file_loader(recipe_path: Path) -> Any:
    def load(relative: str) -> Any:
        # like row maps and histograms: relative to the recipe, and inside its project
        if Path(relative).is_absolute() or not inside_project(recipe_path.parent, relative):
            raise ValueError(f"{relative!r} must be relative to the recipe and stay inside the "
                             "project (the folder holding recipes/)")
        link = escaping_link(project_root_of(recipe_path.parent), recipe_path.parent / relative)
        if link is not None:
            raise ValueError(f"{relative!r} leaves the project through {link[0]}, a symlink to "
                             f"{link[1]}: keep model files inside the project")
        return load_model_file(relative, base=recipe_path.parent)
    return load
