"""Import direction, read from the source with ``ast`` (nothing here imports the code it checks).

- recipegen: every import (module-level, function-level, under ``TYPE_CHECKING``; relative ones
  resolved) runs down the layer table in ``recipegen/LAYERS.md``; every package is in the table.
- runtime/: imports nothing from recipegen; ``expert_residency.formats`` and
  ``expert_residency.contract`` (what recipegen reads) reach no torch, triton, FlashInfer or
  vLLM, not even through another runtime module; vLLM is imported only by the plugin
  (``vllm_plugin/``) and the Blackwell files named in ``VLLM_OUTSIDE_PLUGIN``.
- No import cycle between the modules of either tree, function-level imports included.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RECIPEGEN = REPO / "recipegen"
RUNTIME = REPO / "runtime"
LAYERS_MD = RECIPEGEN / "LAYERS.md"

HEAVY = ("torch", "triton", "flashinfer", "vllm", "prometheus_client")
TORCH_FREE = ("expert_residency.formats", "expert_residency.contract")
# Outside vllm_plugin/, the runtime files that import vLLM, and why: both reproduce a vLLM 0.33
# step byte for byte on the SM100 family by calling it (docs/plugin.md, "Blackwell").
VLLM_OUTSIDE_PLUGIN = {
    "expert_residency/blackwell/layout.py": "convert_with_vllm: vLLM's own TRT-LLM weight conversion",
    "expert_residency/blackwell/trtllm.py": "vllm_mxfp8_quantize: vLLM's activation quantization",
}


@dataclass(frozen=True)
class Import:
    file: Path
    line: int
    module: str   # the importing module, dotted
    target: str   # the imported module (the submodule where `from pkg import sub` names one)

    def where(self) -> str:
        shown = self.file.relative_to(REPO) if self.file.is_relative_to(REPO) else self.file
        return f"{shown}:{self.line}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_module(name: str, root: Path) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path, root: Path) -> list[Import]:
    """Every import in `path` (a file under `root`, the folder holding the top package), at
    any depth, relative ones resolved against the file's package."""
    module = module_name(path, root)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.extend(Import(path, node.lineno, module, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package[:len(package) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if alias.name != "*" and _is_module(sub, root) else base
                found.append(Import(path, node.lineno, module, target))
    return found


def all_imports(top: Path) -> list[Import]:
    return [imp for path in sorted(top.rglob("*.py")) for imp in imports_of(path, top.parent)]


# ------------------------------------------------------------------ recipegen's layers

def read_layers(text: str) -> dict[str, int]:
    """package -> layer number, from the table's rows `| n | `pkg`, `pkg` | ... |`."""
    layers: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"^\|\s*(\d+)\s*\|([^|]*)\|", line)
        if match:
            for package in re.findall(r"`([a-z0-9_]+)`", match.group(2)):
                assert package not in layers, f"{package} is in two layers of {LAYERS_MD.name}"
                layers[package] = int(match.group(1))
    return layers


def package_of(module: str) -> str:
    """recipegen.<package>...: the layer-table key; the root's own modules map to `common`
    (`__init__`: the version) and `cli` (`__main__`)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__init__":
        return "common"
    return "cli" if parts[1] == "__main__" else parts[1]


def layer_violations(imports: list[Import], layers: dict[str, int]) -> list[str]:
    bad = []
    for imp in imports:
        if imp.target.split(".")[0] != "recipegen":
            continue
        src, dst = package_of(imp.module), package_of(imp.target)
        if layers[dst] > layers[src]:
            bad.append(f"{imp.where()}: {imp.module} (layer {layers[src]}, {src}) imports "
                       f"{imp.target} (layer {layers[dst]}, {dst})")
    return bad


def test_every_package_of_recipegen_has_a_layer() -> None:
    layers = read_layers(LAYERS_MD.read_text(encoding="utf-8"))
    assert "common" in layers and "cli" in layers
    packages = {p.name for p in RECIPEGEN.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(layers), ("packages without a layer / layers without a package: "
                                     f"{sorted(packages - set(layers))} / {sorted(set(layers) - packages)}")
    loose = sorted(p.name for p in RECIPEGEN.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"modules at the root of recipegen/, outside any layer: {loose}"


def test_recipegen_imports_run_down_the_layers() -> None:
    layers = read_layers(LAYERS_MD.read_text(encoding="utf-8"))
    imports = all_imports(RECIPEGEN)
    assert len(imports) > 500  # the walk found the package's imports
    bad = layer_violations(imports, layers)
    assert not bad, "imports against the layer order (recipegen/LAYERS.md):\n" + "\n".join(bad)


def test_an_import_against_the_layers_is_caught(tmp_path: Path) -> None:
    """The checker itself: a function-level relative import from the ledger up to render fails,
    the same import downwards does not."""
    root = tmp_path / "recipegen"
    for package in ("ledger", "render"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "ledger" / "lane.py").write_text("def f():\n    from ..render import output\n")
    (root / "render" / "output.py").write_text("from recipegen.ledger.lane import f\n")
    imports = all_imports(root)
    assert [(i.module, i.target) for i in imports] == [
        ("recipegen.ledger.lane", "recipegen.render.output"),
        ("recipegen.render.output", "recipegen.ledger.lane")]
    bad = layer_violations(imports, {"common": 1, "ledger": 5, "render": 9, "cli": 12})
    assert len(bad) == 1
    assert "ledger/lane.py:2: recipegen.ledger.lane (layer 5, ledger) imports recipegen.render.output" in bad[0]


# ------------------------------------------------------------------ the runtime's rules

def test_runtime_imports_nothing_from_recipegen() -> None:
    bad = [imp.where() for imp in all_imports(RUNTIME / "expert_residency")
           if imp.target.split(".")[0] == "recipegen"]
    assert not bad, f"runtime/ imports recipegen: {bad}"


def test_what_recipegen_reads_of_the_runtime_is_torch_free() -> None:
    imports = all_imports(RUNTIME / "expert_residency")
    by_module: dict[str, list[Import]] = {}
    for imp in imports:
        by_module.setdefault(imp.module, []).append(imp)
    assert all(m in by_module or _is_module(m, RUNTIME) for m in TORCH_FREE)
    seen: set[str] = set()
    stack = [m for m in by_module if m.startswith(TORCH_FREE)]
    assert len(stack) >= 5
    bad = []
    while stack:
        module = stack.pop()
        if module in seen:
            continue
        seen.add(module)
        for imp in by_module.get(module, []):
            top = imp.target.split(".")[0]
            if top in HEAVY:
                bad.append(f"{imp.where()}: {imp.module} imports {imp.target}")
            elif top == "expert_residency":
                stack.append(imp.target)
                # importing a.b.c runs a/__init__ and a/b/__init__ first
                parts = imp.target.split(".")
                stack.extend(".".join(parts[:i]) for i in range(1, len(parts)))
    assert not bad, "torch / triton / FlashInfer / vLLM reachable from " + ", ".join(TORCH_FREE) + \
        ":\n" + "\n".join(bad)


def test_vllm_is_imported_only_by_the_plugin_and_the_named_blackwell_files() -> None:
    importers = {str(imp.file.relative_to(RUNTIME)) for imp in all_imports(RUNTIME / "expert_residency")
                 if imp.target.split(".")[0] == "vllm"}
    outside = {f for f in importers if not f.startswith("expert_residency/vllm_plugin/")}
    assert outside == set(VLLM_OUTSIDE_PLUGIN), (
        f"runtime files outside vllm_plugin/ importing vLLM: {sorted(outside)}; allowed (and said "
        f"so in docs/plugin.md): {sorted(VLLM_OUTSIDE_PLUGIN)}")
    assert any(f.startswith("expert_residency/vllm_plugin/") for f in importers)


# ------------------------------------------------------------------ cycles

def cycles(imports: list[Import], prefix: str) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), own modules only."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.module, set())
        if imp.target.startswith(prefix) and imp.target != imp.module:
            graph[imp.module].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("top", [RECIPEGEN, RUNTIME / "expert_residency"], ids=["recipegen", "runtime"])
def test_no_import_cycles(top: Path) -> None:
    # a package's __init__ importing its own submodules is no cycle: drop package -> child edges
    imports = [imp for imp in all_imports(top) if not imp.target.startswith(imp.module + ".")]
    found = cycles(imports, top.name)
    assert not found, "import cycles (function-level imports included):\n" + \
        "\n".join(" <-> ".join(c) for c in found)
