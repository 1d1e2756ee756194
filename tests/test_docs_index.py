"""The documentation a newcomer starts from: docs/index.md lists every page of docs/, and the paths
DEVELOPMENT.md and the index name exist (a module that moves fails here, not in a reader's hands)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# A repository path in backticks: a top-level folder, then at least one more part.
PATH = re.compile(r"`((?:recipegen|runtime|tests|bench|scripts|docs|recipes|templates)/[^`*<>\s]+)`")


def test_the_index_lists_every_page_of_docs() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    linked = {(DOCS / target).resolve() for target in LINK.findall(index)}
    pages = {p.resolve() for p in DOCS.glob("*.md") if p.name != "index.md"}
    assert not pages - linked, f"docs/index.md does not list {sorted(p.name for p in pages - linked)}"
    for top in ("README.md", "DEVELOPMENT.md", "BENCHMARKS.md"):
        assert (REPO / top).resolve() in linked, top


# The pages a newcomer reads first; every repository path they name in backticks must exist.
GUIDES = ("index.md", "setup.md", "verification.md", "runtime.md", "hostile-input.md")


def test_links_in_the_readme_and_every_docs_page_resolve() -> None:
    """README.md sends each area to a docs page; a page renamed or removed fails here."""
    for doc in (REPO / "README.md", REPO / "DEVELOPMENT.md", *sorted(DOCS.glob("*.md"))):
        text = doc.read_text(encoding="utf-8")
        for target in LINK.findall(text):
            if "://" not in target:
                assert (doc.parent / target).exists(), f"{doc.name}: link to {target} resolves to nothing"


def test_links_and_paths_in_the_guides_exist() -> None:
    for doc in (REPO / "README.md", REPO / "DEVELOPMENT.md", *(DOCS / name for name in GUIDES)):
        text = doc.read_text(encoding="utf-8")
        for target in LINK.findall(text):
            if "://" not in target:
                assert (doc.parent / target).exists(), f"{doc.name}: link to {target} resolves to nothing"
        for path in PATH.findall(text):
            path = path.split(" ")[0].rstrip(".,;:)")
            matches = list(REPO.glob(path)) if "*" in path else [REPO / path] if (REPO / path).exists() else []
            assert matches, f"{doc.name} names {path}, which does not exist"


def test_development_names_every_layer_package() -> None:
    """The layout section points at LAYERS.md rather than copying it; what it does list of the
    runtime is every package there is."""
    text = (REPO / "DEVELOPMENT.md").read_text(encoding="utf-8")
    assert "recipegen/LAYERS.md" in text and "tests/test_layers.py" in text
    runtime = REPO / "runtime" / "expert_residency"
    packages = {p.name for p in runtime.iterdir() if (p / "__init__.py").is_file()}
    missing = [name for name in sorted(packages) if f"`{name}/`" not in text]
    assert not missing, f"DEVELOPMENT.md does not describe runtime packages {missing}"
