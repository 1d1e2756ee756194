"""Output a person reads: what `render` wrote, `--diff` with nothing to change, `--plot` without
matplotlib failing before any arithmetic, and the shorthand every report prints explained in it.

The explanations asserted here are written out in this file (the words a reader needs), not read
from recipegen.common.glossary, so a term that loses its explanation, or one printed bare in a new
line, fails here.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.common import glossary

REPO = Path(__file__).resolve().parent.parent
REFERENCE = "dsv41-flash-gb300"
MAPS = REPO / "recipes" / "maps" / "dsv41-flash"
PROFILES = REPO / "recipes" / "profiles" / "dsv41-flash"


# ------------------------------------------------------------------ render says what it wrote


def test_render_names_every_file_and_service_it_wrote_and_no_ledger(project: Path) -> None:
    result = invoke("render", "dsv41-flash-gb300-off60")
    assert result.code == 0, result.stdout
    lines = result.stdout.splitlines()
    # a first render: both generated files are new (the positional lane mounts no row map and the
    # recipe has no monitoring block), and so are its services
    assert lines[:3] == ["wrote compose/dsv41-flash-gb300-off60/ from recipes/dsv41-flash-gb300-off60.yaml: "
                         "2 files, 2 new",
                         "  file compose.yaml: new",
                         "  file .gitignore: new"]
    assert lines[3].startswith("  service lane-agent: new — vLLM engine of lane agent: vLLM's positional "
                               "offload (--cpu-offload-gb 60), without the runtime, port 30006 (config hash ")
    assert lines[4].startswith("  service lane-agent-profile: new — count-only profiling boot of lane "
                               "agent, started by `recipegen profile`")
    assert "HBM / GPU:" not in result.stdout and "verdict" not in result.stdout     # the ledger only with --verbose
    # a second render: nothing changed, and it says so file by file
    result = invoke("render", "dsv41-flash-gb300-off60")
    assert "2 files, none changed" in result.stdout.splitlines()[0]
    assert "  file compose.yaml: unchanged" in result.stdout.splitlines()
    assert "apply:" not in result.stdout


def test_render_verbose_prints_the_ledger_first(project: Path) -> None:
    result = invoke("render", REFERENCE, "--verbose")
    assert result.code == 0, result.stdout
    ledger_at = result.stdout.index("HBM / GPU: 250.70 GiB × 0.97 = 243.18 GiB cap")
    assert ledger_at < result.stdout.index(f"wrote compose/{REFERENCE}/")
    assert "verdict: OK" in result.stdout


def test_render_diff_with_nothing_to_change_says_so(project: Path) -> None:
    assert invoke("render", REFERENCE).code == 0
    result = invoke("render", REFERENCE, "--diff")
    assert result.code == 0
    assert result.stdout.startswith(f"no change: compose/{REFERENCE}/ already holds what "
                                    f"recipes/{REFERENCE}.yaml renders")
    # and with a change it prints the change, not that line
    recipe = project / "recipes" / f"{REFERENCE}.yaml"
    recipe.write_text(recipe.read_text().replace("active_class: agent", "active_class: prose", 1))
    result = invoke("render", REFERENCE, "--diff")
    assert "no change" not in result.stdout and '+      io.recipegen.class: "prose"' in result.stdout


# ------------------------------------------------------------------ --plot without matplotlib


def _no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # `import matplotlib` raises ImportError


def test_plan_plot_without_matplotlib_fails_before_computing(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    _no_matplotlib(monkeypatch)
    import recipegen.load.recipe as recipe_module

    def must_not_load(*_args, **_kwargs):
        raise AssertionError("plan read the recipe before finding matplotlib missing")

    monkeypatch.setattr(recipe_module, "load_recipe", must_not_load)
    result = invoke("plan", REFERENCE, "agent", "--sweep", "hot=250..384", "--plot", str(tmp_path / "s.png"))
    assert result.code == 2, result.output
    assert "--plot needs matplotlib: pip install 'recipegen[plot]'" in result.output
    assert not (tmp_path / "s.png").exists()


def test_knee_plot_without_matplotlib_fails_before_measuring(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    _no_matplotlib(monkeypatch)
    # port 9 (discard) on loopback: had knee tried to measure, the error would be a connection's
    result = invoke("knee", "http://127.0.0.1:9", "--plot", str(tmp_path / "k.png"))
    assert result.code == 2, result.output
    assert "--plot needs matplotlib: pip install 'recipegen[plot]'" in result.output


def test_the_readme_names_the_plot_extra() -> None:
    assert "pip install 'recipegen[plot]'" in (REPO / "README.md").read_text(encoding="utf-8")


# ------------------------------------------------------------------ shorthand, explained where printed

# Shorthand a reader of these reports meets, and words that must then appear in the same output.
EXPLAINED = {
    r"\bC\d+\b": "concurrent",                        # C1, C16
    r"\bk=\d": "tokens per step",                     # k=5
    r"\bTP\b": "tensor parallel",
    r"\bEP\b": "expert parallel",
    r"\bPP\b": "pipeline parallel",
    r"\bMLA\b": "latent attention",
    r"\bUVA\b": "unified virtual addressing",
    r"\bEngram\b": "Engram embedding tables",
    r"\bhost tables\b": "tables a model keeps in pinned host memory",
    r"\bv1[1-5]\b": "revisions of the reference GB300 lane",
    r"\boff60\b": "--cpu-offload-gb 60",
    r"back-solved": "from a measured boot",
    r"\bDSpark\b": "drafter",
    r"\bGini\b": "how unevenly",
    r"\b\d+x\d+\b": "295 in each of 40 layers",
    r"content_hash|shape_hash": "bank shapes",
    r"\bconfig hash\b": "rendered configuration",
    r"\bNVML\b": "management library",
    r"\bNCCL\b": "communication between GPUs",
}
# Field-report jargon replaced by plain words in every output.
NEVER = ("hash-hit", "re-hom", "see the calibration table")


def _reports(root: Path) -> dict[str, str]:
    out = {}
    recipes = sorted(p.stem for p in (root / "recipes").glob("*.yaml"))
    for name in recipes:
        out[f"check budgets {name}"] = invoke("check", "budgets", name).stdout
        out[f"check budgets {name} --explain"] = invoke("check", "budgets", name, "--explain").stdout
    out["plan"] = invoke("plan", REFERENCE, "agent", "--explain", "--sweep", "hot=280..300:10").stdout
    out["rowmap show"] = invoke("rowmap", "show", str(MAPS / "agent.rowmap"), "--recipe", REFERENCE).stdout
    out["rowmap eval"] = invoke("rowmap", "eval", str(MAPS / "agent.rowmap"), str(PROFILES / "agent.hist"),
                                str(PROFILES / "prose.hist")).stdout
    out["rowmap diff"] = invoke("rowmap", "diff", "--summary", str(MAPS / "agent.rowmap"),
                                str(MAPS / "prose.rowmap")).stdout
    out["rowmap compare"] = invoke("rowmap", "compare", str(PROFILES / "agent.hist"),
                                   str(PROFILES / "prose.hist")).stdout
    out["render --verbose"] = invoke("render", "dsv41-flash-gb300x2-pp2", "--verbose").stdout
    out["new"] = invoke("new", "qwen3-30b-a3b", "--machine", "rtx-5090").stdout
    return out


def test_every_report_explains_its_shorthand(project: Path) -> None:
    reports = _reports(project)
    # The recipe names given on the command line are the user's names, not recipegen's shorthand
    # (dsv41-flash-gb300-off60's "off60"): the glossary leaves them out (recipegen.cli.output).
    names = sorted((p.stem for p in (project / "recipes").glob("*.yaml")), key=len, reverse=True)
    seen: set[str] = set()
    for what, text in reports.items():
        assert text.strip(), what
        for name in names:
            text = text.replace(name, "")
        for pattern, words in EXPLAINED.items():
            if re.search(pattern, text):
                seen.add(pattern)
                assert words in text, f"`recipegen {what}` prints {pattern} without explaining it ({words!r})"
        for jargon in NEVER:
            assert jargon not in text, f"`recipegen {what}` still prints {jargon!r}"
    # the reports above do meet most of these (the test would be empty otherwise); off60 they print
    # only inside the recipe name dsv41-flash-gb300-off60, left out above
    assert len(seen) >= 14, sorted(set(EXPLAINED) - seen)


def test_an_explained_term_gets_no_footnote_and_json_gets_none() -> None:
    text = ("fetch tax (cold expert reads over the link): C1 k=5: 1 ms\n"
            "note: C<n> k=<k>: n concurrent streams, k speculative (draft) tokens per step")
    names = [t.name for t in glossary.used_terms(text)]
    assert "C<n>" not in names and "k=<n>" not in names and "fetch tax" not in names
    assert "hot / cold" in names                            # "cold" is used and not explained
    assert glossary.footnotes("nothing to explain here") == []
    result = invoke("check", "budgets", REFERENCE, "--json")
    assert glossary.HEADING not in result.stdout


def test_the_docs_list_every_term_the_output_explains() -> None:
    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    table = design.split("## Shorthand in the output")[1].split("\n## ")[0]
    rows = {line.split("|")[1].strip().strip("`") for line in table.splitlines() if line.startswith("| ")}
    missing = [t.name for t in glossary.TERMS if t.name not in rows]
    assert not missing, f"docs/design.md 'Shorthand in the output' lacks {missing}"
