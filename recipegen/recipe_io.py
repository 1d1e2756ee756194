"""Locate, read and validate recipe files; write `active_class` back without touching the layout.

Every problem becomes one `InputError` naming file, line and field path (all problems of a file are
listed in its message), never a traceback: YAML syntax, duplicate keys, unknown fields, wrong
types, missing units, unknown catalog names, cross-references, missing or mismatched row maps.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from pydantic import ValidationError

from recipegen.common.errors import InputError
from recipegen.schema import Recipe
from recipegen.schema.base import PathError, reachable_models
from recipegen.schema.checks import Problem, cross_reference_problems

RECIPES_DIRNAME = "recipes"
# Bounds on what a recipe file may be before anything walks it (the reference is ~5 KB).
MAX_RECIPE_CHARS = 1 << 20
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 64
PACKAGE_ROOT = Path(__file__).resolve().parent.parent

Loc = tuple[str | int, ...]


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


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------- YAML

def _yaml() -> Any:
    from ruamel.yaml import YAML

    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    yaml.preserve_quotes = True
    return yaml


def parse_yaml(text: str, file: str) -> Any:
    """Round-trip parse (keeps line numbers); syntax errors and duplicate keys are InputErrors."""
    from ruamel.yaml.constructor import DuplicateKeyError
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    if len(text) > MAX_RECIPE_CHARS:
        raise InputError(f"{len(text)} characters: larger than any recipe (at most "
                         f"{MAX_RECIPE_CHARS})", file=file)
    try:
        document = _yaml().load(text)
    except RecursionError:
        raise InputError(f"nested too deeply (at most {MAX_YAML_DEPTH} levels)",
                         file=file) from None
    except DuplicateKeyError as exc:
        mark = exc.problem_mark
        key = _duplicate_key_name(exc)
        raise InputError(f"duplicate key {key!r} (first defined on line "
                         f"{exc.context_mark.line + 1})" if exc.context_mark else
                         f"duplicate key {key!r}", file=file,
                         line=mark.line + 1 if mark else None, field=key) from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
        raise InputError(f"YAML syntax error: {problem}", file=file,
                         line=mark.line + 1 if mark else None) from None
    except YAMLError as exc:
        raise InputError(f"YAML error: {str(exc).splitlines()[0][:200]}", file=file) from None
    except (ValueError, OverflowError) as exc:  # e.g. a timestamp or number ruamel cannot build
        raise InputError(f"YAML value error: {type(exc).__name__}", file=file) from None
    check_expansion(document, file)
    return document


def check_expansion(document: Any, file: str) -> None:
    """Refuse a document whose aliases expand past `MAX_YAML_NODES` nodes (a few-KB alias bomb
    is a billion nodes once anything walks it) or that nests past `MAX_YAML_DEPTH` levels.

    Walks the expanded tree with an explicit stack, counting every visit, so it stops as soon
    as the budget is spent instead of expanding first.
    """
    visits = 0
    stack: list[tuple[Any, int, int | None]] = [(document, 0, None)]
    while stack:
        node, depth, line = stack.pop()
        visits += 1
        if visits > MAX_YAML_NODES or depth > MAX_YAML_DEPTH:
            what = (f"expands to more than {MAX_YAML_NODES} values (anchors and aliases "
                    "included)") if visits > MAX_YAML_NODES else \
                f"nested deeper than {MAX_YAML_DEPTH} levels"
            raise InputError(f"{what}: not a recipe", file=file, line=line)
        lc = getattr(node, "lc", None)
        here = lc.line + 1 if lc is not None and getattr(lc, "line", None) is not None else line
        if isinstance(node, dict):
            for key, value in node.items():
                stack.append((key, depth + 1, here))
                stack.append((value, depth + 1, here))
        elif isinstance(node, list):
            stack.extend((item, depth + 1, here) for item in node)


def _duplicate_key_name(exc: Exception) -> str:
    match = re.search(r'found duplicate key "([^"]*)"', str(exc))
    return match.group(1) if match else "?"


def to_plain(node: Any) -> Any:
    """ruamel's commented containers and scalar subclasses -> plain dict/list/str/int/float/bool."""
    if isinstance(node, dict):
        return {str(k) if not isinstance(k, (int, float, bool)) else k: to_plain(v)
                for k, v in node.items()}
    if isinstance(node, list):
        return [to_plain(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node


def line_of(document: Any, loc: Loc) -> int | None:
    """1-based line of the deepest part of `loc` present in the document."""
    line: int | None = None
    node = document
    for step in loc:
        lc = getattr(node, "lc", None)
        if isinstance(node, dict) and step in node:
            if lc is not None:
                try:
                    line = lc.key(step)[0] + 1
                except Exception:  # ruamel keeps no position for some keys
                    pass
            node = node[step]
        elif isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
            if lc is not None:
                try:
                    line = lc.item(step)[0] + 1
                except Exception:
                    pass
            node = node[step]
        else:
            break
    if line is None and document is not None and getattr(document, "lc", None) is not None:
        line = document.lc.line + 1
    return line


def format_loc(loc: Iterable[str | int]) -> str:
    out = ""
    for step in loc:
        if isinstance(step, int):
            out += f"[{step}]"
        else:
            out += f".{step}" if out else str(step)
    return out or "(top level)"


# ---------------------------------------------------------------- validation errors

_ALL_FIELDS: set[str] | None = None


def _all_field_names() -> set[str]:
    global _ALL_FIELDS
    if _ALL_FIELDS is None:
        _ALL_FIELDS = {name for model in reachable_models(Recipe) for name in model.model_fields}
    return _ALL_FIELDS


def _describe(error: dict[str, Any]) -> tuple[Loc, str]:
    loc: Loc = tuple(error["loc"])
    kind = error["type"]
    ctx = error.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, PathError):
        loc = loc + tuple(cause.path)
    value = error.get("input")
    if kind == "extra_forbidden":
        name = str(loc[-1]) if loc else "?"
        close = difflib.get_close_matches(name, sorted(_all_field_names()), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return loc, f"unknown field {name!r}{hint}"
    if kind == "missing":
        return loc, "missing required field"
    if loc == ("version",) and kind == "literal_error":
        return loc, f"unsupported schema version {value!r}: this recipegen reads version 1"
    is_key = bool(loc) and loc[-1] == "[key]"
    if is_key:
        loc = loc[:-1]
    if kind == "string_pattern_mismatch":
        what = "name" if is_key else "value"
        return loc, (f"{what} {value!r} is not allowed: use lowercase letters, digits and '-' "
                     f"(pattern {ctx.get('pattern')})")
    message = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix):]
    if kind not in ("value_error", "assertion_error") and isinstance(value, (str, int, float, bool)):
        message += f" (got {value!r})"
    return loc, message


def problems_error(path: Path, document: Any, problems: list[Problem]) -> InputError:
    """One InputError for all problems: the first sets file/line/field, the rest are listed."""
    file = display_path(path)
    (loc0, msg0), rest = problems[0], problems[1:]
    message = msg0
    if rest:
        lines = [f"  {file}:{line_of(document, loc) or '?'}: field '{format_loc(loc)}': {msg}"
                 for loc, msg in rest]
        message += f"\n  ({len(problems)} problems in this file; the others:)\n" + "\n".join(lines)
    return InputError(message, file=file, line=line_of(document, loc0), field=format_loc(loc0))


# ---------------------------------------------------------------- loading

def _read_validated(path: Path, text: str | None = None) -> tuple[Recipe, Any]:
    """YAML + schema validation (no cross-references): the Recipe and its round-trip document.
    `text`: validate this as the content of `path` (a write not yet made)."""
    file = display_path(path)
    if text is not None:
        return _validated_document(path, parse_yaml(text, file))
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text", file=file) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=file) from None
    document = parse_yaml(text, file)
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
        # model: {file: ...} is read relative to this recipe (recipegen.model_files)
        recipe = Recipe.model_validate(to_plain(document), context={"model_file": _model_file_loader(path)})
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # Unknown fields first: a misspelt key also shows up as a missing required one.
        errors.sort(key=lambda e: e["type"] != "extra_forbidden")
        problems = [_describe(e) for e in errors]
        raise problems_error(path, document, problems) from None
    return recipe, document


def load_recipe(path_or_name: str | os.PathLike[str], *, read_maps: bool = True,
                text: str | None = None) -> LoadedRecipe:
    """Read, validate and cross-check a recipe. Raises InputError on any problem.

    `text`: take this as the file's content (to check a write before making it)."""
    path = resolve_recipe_path(path_or_name) if text is None else Path(path_or_name)
    recipe, document = _read_validated(path, text)
    cross = cross_reference_problems(recipe, path.parent)
    if cross:
        raise problems_error(path, document, cross)
    loaded = LoadedRecipe(recipe=recipe, path=path, document=document)
    if read_maps:
        from recipegen.recipe_rowmaps import read_lane_rowmaps  # local: keeps numpy off the light path

        problems: list[Problem] = []
        for i, lane in enumerate(recipe.lanes):
            maps, lane_problems = read_lane_rowmaps(recipe, i, path.parent)
            problems.extend(lane_problems)
            for cls, rowmap in maps.items():
                loaded.rowmaps[(lane.name, cls)] = rowmap
        if problems:
            raise problems_error(path, document, problems)
    return loaded


# ---------------------------------------------------------------- write-back

_SCALAR_AT = re.compile(r"""("(?:[^"\\]|\\.)*"|'(?:[^']|'')*'|[^\s#]+)""")


def set_active_class(path: str | os.PathLike[str], lane: str, cls: str) -> bool:
    """Write `active_class: <cls>` for `lane` into the recipe, changing nothing else.

    Comments, quoting and layout are preserved (only the value token is replaced; a missing key is
    added with ruamel's round-trip writer). The result is re-validated before an atomic rename.
    Returns False when the class was already active (file untouched).
    """
    target = resolve_recipe_path(path)
    text = target.read_text(encoding="utf-8")
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
    index = next((i for i, item in enumerate(recipe.lanes) if item.name == lane), None)
    if index is None:
        raise InputError(f"no lane {lane!r} (lanes: {', '.join(l.name for l in recipe.lanes)})",
                         file=file, field="lanes")
    lane_model = recipe.lanes[index]
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
        raise loaded.error("active_class comes from a YAML merge key (`<<:`); write it in the "
                           "lane itself to swap classes", ("lanes", index, "active_class"))
    import io

    lane_node["active_class"] = cls
    yaml = _yaml()
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    buffer = io.StringIO()
    yaml.dump(document, buffer)
    return buffer.getvalue()


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
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    folder = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _model_file_loader(recipe_path: Path) -> Any:
    from recipegen.model_files import load_model_file
    from recipegen.schema.checks import inside_project

    def load(relative: str) -> Any:
        # like row maps and histograms: relative to the recipe, and inside its project
        if Path(relative).is_absolute() or not inside_project(recipe_path.parent, relative):
            raise ValueError(f"{relative!r} must be relative to the recipe and stay inside the "
                             "project (the folder holding recipes/)")
        return load_model_file(relative, base=recipe_path.parent)
    return load
