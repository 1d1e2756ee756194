"""Derive the `vllm serve` flag table from a vLLM source tree, statically.

vLLM builds its CLI from code: `make_arg_parser` (entrypoints/common/cli_args.py) adds a few
literal flags, then `FrontendArgs.add_cli_args` turns every field of the frontend dataclasses
into `--field-name`, then `AsyncEngineArgs.add_cli_args` / `EngineArgs.add_cli_args`
(engine/arg_utils.py) add one argument per config field with `**get_kwargs(SomeConfig)["field"]`.
`get_kwargs` (arg_utils `_compute_kwargs`) picks the argparse behaviour from the field's type
hint: bool → `--x/--no-x`, Literal → choices, dataclass → JSON, and so on.

We cannot import the 0.33 wheel here (its compiled parts are not unpacked, and importing vllm
needs CUDA torch), so this module reads the same source with `ast` and replays those rules.
`tests/test_render_vllm_flags.py` checks the replay against a real argparse parser built by an
installed vLLM (the CPU build) when one exists.

Usage: python -m recipegen.vllm_flags.generate /path/to/vllm [--out FILE]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

ARG_UTILS = "engine/arg_utils.py"


def find_cli_args_module(vllm_root: Path) -> str:
    """The module defining `make_arg_parser` + `FrontendArgs` (it moves between releases:
    `entrypoints/common/cli_args.py` in 0.33, `entrypoints/launchers/cli_args.py` in 0.32)."""
    for path in sorted((vllm_root / "entrypoints").rglob("cli_args.py")):
        text = path.read_text(encoding="utf-8")
        if "def make_arg_parser" in text and "class FrontendArgs" in text:
            return path.relative_to(vllm_root).as_posix()
    raise LookupError(f"no cli_args.py with make_arg_parser and FrontendArgs under {vllm_root}")


@dataclass
class FieldInfo:
    owner: str
    name: str
    annotation: ast.expr | None
    module: str


@dataclass
class ClassInfo:
    name: str
    module: str
    bases: list[str]
    fields: list[FieldInfo]
    is_config: bool
    methods: dict[str, ast.FunctionDef] = field(default_factory=dict)


class SourceIndex:
    """Classes and module-level `Literal` aliases of a vLLM source tree."""

    def __init__(self, vllm_root: Path) -> None:
        self.root = vllm_root
        self.classes: dict[str, list[ClassInfo]] = {}
        self.literal_aliases: dict[str, list[tuple[str, list[object]]]] = {}
        self.string_constants: dict[str, str] = {}  # module-level NAME = "text"
        self._parsed: set[Path] = set()
        for sub in ("config", "engine", "entrypoints"):
            for path in sorted((vllm_root / sub).rglob("*.py")):
                self._parse(path)

    def _parse(self, path: Path) -> None:
        if path in self._parsed:
            return
        self._parsed.add(path)
        module = path.relative_to(self.root).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                self.classes.setdefault(node.name, []).append(self._class_info(node, module))
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                value = node.value
                if isinstance(target, ast.Name) and value is not None:
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        self.string_constants.setdefault(target.id, value.value)
                    choices = _literal_choices(value)
                    if choices is not None:
                        self.literal_aliases.setdefault(target.id, []).append((module, choices))

    @staticmethod
    def _class_info(node: ast.ClassDef, module: str) -> ClassInfo:
        decorators = {ast.unparse(d).split("(")[0] for d in node.decorator_list}
        is_config = bool(decorators & {"config", "dataclass", "dataclasses.dataclass",
                                       "pydantic.dataclasses.dataclass"})
        fields: list[FieldInfo] = []
        methods: dict[str, ast.FunctionDef] = {}
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                text = ast.unparse(item.annotation)
                if text.startswith(("ClassVar", "typing.ClassVar", "InitVar")):
                    continue
                if item.value is not None and _is_init_false(item.value):
                    continue
                fields.append(FieldInfo(node.name, item.target.id, item.annotation, module))
            elif isinstance(item, ast.FunctionDef):
                methods[item.name] = item
        return ClassInfo(node.name, module, [ast.unparse(b) for b in node.bases], fields,
                         is_config, methods)

    def find_class(self, name: str, prefer_module: str | None = None) -> ClassInfo | None:
        candidates = self.classes.get(name)
        if not candidates:
            for path in sorted(self.root.rglob("*.py")):  # slow path: anywhere in the tree
                if f"class {name}" in path.read_text(encoding="utf-8", errors="replace"):
                    self._parse(path)
            candidates = self.classes.get(name)
        if not candidates:
            return None
        for info in candidates:
            if info.module == prefer_module:
                return info
        return candidates[0]

    def all_fields(self, name: str) -> list[FieldInfo]:
        """Dataclass fields in `dataclasses.fields` order: bases first, overrides in place."""
        info = self.find_class(name)
        if info is None:
            raise LookupError(f"class {name} not found under {self.root}")
        ordered: dict[str, FieldInfo] = {}
        for base in info.bases:
            base_name = base.split(".")[-1]
            if self.find_class(base_name) is not None and base_name not in ("object",):
                for f in self.all_fields(base_name):
                    ordered[f.name] = f
        for f in info.fields:
            ordered[f.name] = f
        return list(ordered.values())

    def field(self, class_name: str, field_name: str) -> FieldInfo:
        for f in self.all_fields(class_name):
            if f.name == field_name:
                return f
        raise LookupError(f"{class_name}.{field_name} not found")

    def literal_alias(self, name: str, prefer_module: str) -> list[object] | None:
        entries = self.literal_aliases.get(name)
        if not entries:
            return None
        for module, choices in entries:
            if module == prefer_module:
                return choices
        return entries[0][1]


def _is_init_false(value: ast.expr) -> bool:
    if isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in ("field", "Field"):
        for kw in value.keywords:
            if kw.arg == "init" and isinstance(kw.value, ast.Constant) and kw.value.value is False:
                return True
    return False


def _literal_choices(node: ast.expr) -> list[object] | None:
    """Values of `Literal[...]`, or None when `node` is not a Literal."""
    if isinstance(node, ast.Subscript) and ast.unparse(node.value).split(".")[-1] == "Literal":
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        values = [e.value for e in elts if isinstance(e, ast.Constant)]
        return values if len(values) == len(elts) else None
    return None


def _union_members(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union_members(node.left) + _union_members(node.right)
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value).split(".")[-1]
        if head in ("Optional", "Union"):
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            members = [e for elt in elts for e in _union_members(elt)]
            if head == "Optional":
                members.append(ast.Constant(None))
            return members
        if head == "Annotated":
            first = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) else node.slice
            return _union_members(first)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:  # a forward reference written as a string
            return _union_members(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return [node]
    return [node]


def classify(index: SourceIndex, info: FieldInfo) -> dict[str, object]:
    """The argparse behaviour `_compute_kwargs` gives this field: kind and, if any, choices."""
    if info.annotation is None:
        return {"kind": "value"}
    heads: set[str] = set()
    choices: list[object] | None = None
    json_fields: list[str] = []
    for member in _union_members(info.annotation):
        if isinstance(member, ast.Constant) and member.value is None:
            heads.add("None")
            continue
        literal = _literal_choices(member)
        if literal is not None:
            heads.add("Literal")
            choices = (choices or []) + literal
            continue
        text = ast.unparse(member.value if isinstance(member, ast.Subscript) else member)
        name = text.split(".")[-1]
        alias = index.literal_alias(name, info.module)
        if alias is not None:
            heads.add("Literal")
            choices = (choices or []) + alias
            continue
        if name in ("bool", "str", "int", "float", "dict", "list", "tuple", "set", "None"):
            heads.add(name)
            continue
        cls = index.find_class(name)
        if cls is not None and cls.is_config:
            heads.add("dataclass")
            json_fields = sorted(f.name for f in index.all_fields(name))
        else:
            heads.add("other")
    if "dataclass" in heads:
        # Keys a JSON value may carry: the dataclass's fields (pydantic validates them).
        return {"kind": "json", "fields": json_fields}
    if heads == {"bool", "str", "None"}:
        return {"kind": "optional_value"}
    if "bool" in heads:
        return {"kind": "bool"}
    if "Literal" in heads:
        return {"kind": "choice", "choices": sorted({str(c) for c in (choices or [])})}
    for kind in ("tuple", "list", "set"):
        if kind in heads:
            return {"kind": "list"}
    if "int" in heads:
        return {"kind": "int"}
    if "float" in heads:
        return {"kind": "float"}
    if "dict" in heads:
        return {"kind": "json"}
    return {"kind": "value"}


def _removed_choices(index: SourceIndex, func: ast.FunctionDef,
                     kwargs_vars: dict[str, str]) -> dict[tuple[str, ...], set[str]]:
    """Choices the function drops with `kw["field"]["choices"].remove(X)` before registering."""
    removed: dict[tuple[str, ...], set[str]] = {}
    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "remove" and len(node.args) == 1):
            continue
        target = node.func.value  # kw["field"]["choices"]
        if not (isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant)
                and target.slice.value == "choices"):
            continue
        ref = _field_ref(target.value, kwargs_vars)
        arg = node.args[0]
        value = arg.value if isinstance(arg, ast.Constant) else (
            index.string_constants.get(arg.id) if isinstance(arg, ast.Name) else None)
        if ref is not None and isinstance(value, str):
            removed.setdefault(ref, set()).add(value)
    return removed


def _field_ref(node: ast.expr, kwargs_vars: dict[str, str]) -> tuple[str, str] | None:
    """(class, field) when `node` is `kw["field"]` or `{**kw["field"], ...}` of a get_kwargs var."""
    if isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values):
            if key is None:
                ref = _field_ref(value, kwargs_vars)
                if ref is not None:
                    return ref
        return None
    if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
            and node.value.id in kwargs_vars and isinstance(node.slice, ast.Constant)):
        return kwargs_vars[node.value.id], str(node.slice.value)
    return None


def _explicit_kind(call: ast.Call, has_config: bool) -> dict[str, object] | None:
    """Kind from an add_argument call's own keywords (action=, choices=), if it says."""
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = kw.get("action")
    result: dict[str, object] | None = None
    if action is not None:
        text = ast.unparse(action)
        if text.endswith("BooleanOptionalAction"):
            result = {"kind": "bool"}
        elif text in ("'store_true'", "'store_false'", "'store_const'"):
            result = {"kind": "switch"}
        elif text in ("'append'",):
            result = {"kind": "value"}
        else:
            result = {"kind": "value"}
    if "choices" in kw and isinstance(kw["choices"], (ast.List, ast.Tuple)):
        values = [e.value for e in kw["choices"].elts if isinstance(e, ast.Constant)]
        result = {"kind": "choice", "choices": sorted({str(v) for v in values})}
    if result is None and "type" in kw and not has_config:
        text = ast.unparse(kw["type"])
        result = {"kind": {"int": "int", "float": "float"}.get(text, "value")}
    return result


def flags_from_function(index: SourceIndex, func: ast.FunctionDef, where: str) -> dict[str, dict]:
    """Every option string an `add_cli_args`-style function registers, with its behaviour."""
    kwargs_vars: dict[str, str] = {}  # local name -> config class given to get_kwargs
    field_vars: dict[str, tuple[str, str]] = {}  # local name -> (class, field) of kwargs[f]
    assigns = [n for n in ast.walk(func)
               if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)]
    for node in assigns:
        if (isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func).split(".")[-1] == "get_kwargs"
                and node.value.args):
            kwargs_vars[node.targets[0].id] = ast.unparse(node.value.args[0]).split(".")[-1]
    for node in assigns:
        ref = _field_ref(node.value, kwargs_vars)
        if ref is not None:
            field_vars[node.targets[0].id] = ref
    removed = _removed_choices(index, func, kwargs_vars)
    flags: dict[str, dict] = {}
    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        options = [a.value for a in node.args
                   if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        options = [o for o in options if o.startswith("-")]
        if not options:
            continue  # a positional such as model_tag
        entry: dict[str, object] = {"source": where}
        spec: dict[str, object] | None = None
        for kw in node.keywords:
            if kw.arg is not None:
                continue
            ref = _field_ref(kw.value, kwargs_vars)
            if ref is None and isinstance(kw.value, ast.Name):
                ref = field_vars.get(kw.value.id)
            if ref is not None:
                entry["config"] = f"{ref[0]}.{ref[1]}"
                spec = classify(index, index.field(*ref))
        explicit = _explicit_kind(node, has_config=spec is not None)
        entry.update(explicit or spec or {"kind": "value"})
        ref_key = tuple(str(entry.get("config", "")).split(".", 1))
        if "choices" in entry and ref_key in removed:
            entry["choices"] = [c for c in entry["choices"] if c not in removed[ref_key]]
        _register(flags, options, entry)
    return flags


def _register(flags: dict[str, dict], options: list[str], entry: dict[str, object]) -> None:
    canonical = next((o for o in options if o.startswith("--")), options[0])
    for option in options:
        flags[option] = dict(entry, canonical=canonical)
        # argparse.BooleanOptionalAction adds --no-X for every --X option string
        if entry["kind"] == "bool" and option.startswith("--"):
            flags["--no-" + option[2:]] = dict(entry, kind="bool_negated", canonical=canonical)


def frontend_flags(index: SourceIndex, cli_args: str) -> dict[str, dict]:
    """`FrontendArgs.add_cli_args`: one `--field-name` per dataclass field (bases included)."""
    flags: dict[str, dict] = {}
    for info in index.all_fields("FrontendArgs"):
        entry = {"source": f"{cli_args}:FrontendArgs",
                 "config": f"{info.owner}.{info.name}"}
        entry.update(classify(index, info))
        _register(flags, ["--" + info.name.replace("_", "-")], entry)
    return flags


def _function(index: SourceIndex, owner: str | None, name: str, module: str) -> ast.FunctionDef:
    if owner is not None:
        info = index.find_class(owner, prefer_module=module)
        if info is None or name not in info.methods:
            raise LookupError(f"{owner}.{name} not found in {module}")
        return info.methods[name]
    tree = ast.parse((index.root / module).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"{name} not found in {module}")


def read_version(vllm_root: Path) -> str:
    version_file = vllm_root / "_version.py"
    if version_file.exists():
        tree = ast.parse(version_file.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id in ("__version__", "version")
                    and isinstance(node.value, ast.Constant)):
                return str(node.value.value)
    return "unknown"


def derive_flags(vllm_root: Path) -> dict[str, object]:
    """The serve flag table of the vLLM tree at `vllm_root` (the `vllm/` package folder)."""
    index = SourceIndex(vllm_root)
    cli_args = find_cli_args_module(vllm_root)
    flags: dict[str, dict] = {}
    flags.update(flags_from_function(
        index, _function(index, None, "make_arg_parser", cli_args), f"{cli_args}:make_arg_parser"))
    flags.update(frontend_flags(index, cli_args))
    flags.update(flags_from_function(
        index, _function(index, "EngineArgs", "add_cli_args", ARG_UTILS),
        "engine/arg_utils.py:EngineArgs.add_cli_args"))
    flags.update(flags_from_function(
        index, _function(index, "AsyncEngineArgs", "add_cli_args", ARG_UTILS),
        "engine/arg_utils.py:AsyncEngineArgs.add_cli_args"))
    sources = {name: hashlib.sha256((vllm_root / name).read_bytes()).hexdigest()
               for name in (ARG_UTILS, cli_args)}
    return {
        "format": "recipegen.vllm_flags/1",
        "vllm_version": read_version(vllm_root),
        "generated_by": "python -m recipegen.vllm_flags.generate",
        "source_sha256": sources,
        "flags": dict(sorted(flags.items())),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vllm_root", type=Path, help="the vllm/ package folder of a source tree")
    parser.add_argument("--out", type=Path, help="write here (atomically) instead of stdout")
    args = parser.parse_args(argv)
    root: Path = args.vllm_root
    if not (root / "engine" / "arg_utils.py").exists():
        print(f"error: {root} does not look like a vllm package folder "
              "(no engine/arg_utils.py)", file=sys.stderr)
        return 2
    text = json.dumps(derive_flags(root), indent=1, sort_keys=False) + "\n"
    if args.out is None:
        sys.stdout.write(text)
        return 0
    tmp = args.out.with_name(args.out.name + ".tmp")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(args.out)
    print(f"wrote {len(json.loads(text)['flags'])} flags to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
